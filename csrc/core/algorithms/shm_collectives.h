// Collectives among ranks that share a host, as schedules of steps over a shared-memory group
// (transport/shm/group.h: every rank's slots, and the steps that order their use). One step per
// chunk of at most a slot:
//  - all-reduce, short: each rank copies its chunk in once, and every rank reduces all inputs itself
//    (one synchronization per chunk, no second pass);
//  - all-reduce, long: each rank reduces its 1/p slice of the chunk into its result slot, then all
//    copy every slice out (reduce-scatter then all-gather, pipelined chunk by chunk);
//  - broadcast, all-gather, reduce-scatter and barrier follow the same pattern, and the parts
//    variants (reduce-scatter and all-gather of uneven parts, in place) serve the hierarchical
//    schedules, whose slices follow the codec's blocks.
// `sig` is the op's signature, which every step carries, so ranks running different ops fail on the
// first step; `wait` bounds every step's waits.
#pragma once

#include <cstddef>
#include <vector>

#include "../buffer_list.h"
#include "../dtype.h"
#include "../transport/frame.h"
#include "../transport/shm/group.h"

namespace pycomm::algorithms {

// Up to this many bytes an all-reduce has every rank reduce all inputs (one sync per chunk).
constexpr size_t kShmShortAllreduceBytes = 64 * 1024;

void shmAllreduce(transport::shm::Group& group, void* data, size_t count, DataType dtype, ReduceOp op,
                  const transport::OpSignature& sig, const transport::shm::StepWait& wait);
// The same over a buffer in pieces (`count` elements in all), with no packing copy.
void shmAllreduce(transport::shm::Group& group, const BufferList& data, size_t count, DataType dtype, ReduceOp op,
                  const transport::OpSignature& sig, const transport::shm::StepWait& wait);
void shmBroadcast(transport::shm::Group& group, void* data, size_t nbytes, int root, const transport::OpSignature& sig,
                  const transport::shm::StepWait& wait);
// out holds size() * nbytes, rank q's at q * nbytes. in may overlap out anywhere: it is read as it was
// at the call.
void shmAllgather(transport::shm::Group& group, const void* in, void* out, size_t nbytes,
                  const transport::OpSignature& sig, const transport::shm::StepWait& wait);
// in holds size() * count elements; this rank's reduced block lands in out, which may overlap in
// anywhere (in is read as it was at the call).
void shmReduceScatter(transport::shm::Group& group, const void* in, void* out, size_t count, DataType dtype,
                      ReduceOp op, const transport::OpSignature& sig, const transport::shm::StepWait& wait);
void shmBarrier(transport::shm::Group& group, const transport::OpSignature& sig, const transport::shm::StepWait& wait);
// In place: rank r's part, bytes [offsets[r], offsets[r+1]) of `data`, becomes the reduction of
// every rank's bytes there; the other parts are left as they were.
void shmReduceScatterParts(transport::shm::Group& group, void* data, const std::vector<size_t>& offsets,
                           DataType dtype, ReduceOp op, const transport::OpSignature& sig,
                           const transport::shm::StepWait& wait);
// Every rank contributes data[offsets[r], offsets[r+1]) and receives everyone's part, in place.
void shmAllgatherParts(transport::shm::Group& group, void* data, const std::vector<size_t>& offsets,
                       const transport::OpSignature& sig, const transport::shm::StepWait& wait);

}  // namespace pycomm::algorithms
