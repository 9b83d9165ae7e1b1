// Collectives among ranks that share a host, through one shared-memory segment.
//
// Every rank owns a control block (flags it advances, each on its own cache line) and, per buffer
// parity, an input slot and a result slot of `slotBytes`. An op runs in steps ("epochs"), one per
// chunk; two parities let step e+1 fill its slots while peers still read those of step e.
//  - all-reduce, short: each rank copies its chunk in once, and every rank reduces all inputs itself
//    (one synchronization per chunk, no second pass);
//  - all-reduce, long: each rank reduces its 1/p slice of the chunk into its result slot, then all
//    copy every slice out (reduce-scatter then all-gather, pipelined chunk by chunk);
//  - broadcast, all-gather, reduce-scatter and barrier follow the same pattern.
// The segment also holds a byte ring for every ordered pair of ranks, through which the TCP
// transport moves the frames of every other op (all-to-all, gather, scatter, reduce, send/recv).
// Each step publishes the op's signature, so ranks running different ops fail on the first step.
// Waits spin briefly and then sleep on a futex; every wait has the op's deadline and notices a
// peer whose connection died.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../buffer_list.h"
#include "../dtype.h"
#include "../transport/frame.h"
#include "../transport/request.h"
#include "../transport/shm/futex.h"
#include "../transport/shm/ring.h"
#include "../transport/shm/segment.h"

namespace pycomm::algorithms {

using transport::Clock;
using transport::OpSignature;

struct ShmWait {
  Clock::time_point deadline;
  std::string context;
  std::function<std::exception_ptr(int)> peerFailure;
};

class ShmGroup {
 public:
  // Rank 0 creates the segment `name` and says so through `published`; the others wait in `awaitCreated`
  // and map it, then call `mapped` (to attach the rings). `allMapped` must return once every rank has;
  // then the name is unlinked. If setup fails anywhere, every rank removes the name, so a creator that
  // died leaves no file behind.
  ShmGroup(int rank, int size, size_t slotBytes, size_t ringBytes, const std::string& name,
           const std::function<void()>& published, const std::function<void()>& awaitCreated,
           const std::function<void(const ShmGroup&)>& mapped, const std::function<void()>& allMapped);

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The ring that carries bytes from group rank `from` to group rank `to`.
  transport::shm::Ring ring(int from, int to) const;
  // Keeps the mapping alive for whoever holds rings into it.
  std::shared_ptr<void> memory() const { return segment_; }

  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op, const OpSignature& sig, const ShmWait& wait);
  // The same over a buffer in pieces (`count` elements in all), with no packing copy.
  void allreduce(const BufferList& data, size_t count, DataType dtype, ReduceOp op, const OpSignature& sig,
                 const ShmWait& wait);
  void broadcast(void* data, size_t nbytes, int root, const OpSignature& sig, const ShmWait& wait);
  void allgather(const void* in, void* out, size_t nbytes, const OpSignature& sig, const ShmWait& wait);
  void reduceScatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op, const OpSignature& sig,
                     const ShmWait& wait);
  void barrier(const OpSignature& sig, const ShmWait& wait);
  // Every rank contributes data[offsets[r], offsets[r+1]) and receives everyone's part, in place.
  void allgatherParts(void* data, const std::vector<size_t>& offsets, const OpSignature& sig, const ShmWait& wait);

  // Below this many bytes an all-reduce has every rank reduce all inputs (one sync per chunk).
  static constexpr size_t kShortAllreduceBytes = 64 * 1024;

 private:
  struct alignas(64) Control {
    transport::shm::SharedFlag ready;
    transport::shm::SharedFlag reduced;
    transport::shm::SharedFlag consumed;
    OpSignature signature[2];  // per buffer parity, so a peer's next step cannot overwrite it early
  };

  Control& control(int q) const;
  uint8_t* input(int q, uint32_t epoch) const;
  uint8_t* result(int q, uint32_t epoch) const;

  // Starts a step: waits until every rank is done with this parity's slots, publishes `sig`.
  uint32_t begin(const OpSignature& sig, const ShmWait& wait);
  void arrive(uint32_t epoch, const ShmWait& wait);  // publish ready, wait for everyone's, check sigs
  void finish(uint32_t epoch);
  enum class Flag { kReady, kReduced, kConsumed };
  void waitAll(Flag flag, uint32_t target, const ShmWait& wait, const char* what);

  const int rank_;
  const int size_;
  const size_t slotBytes_;
  const size_t ringBytes_;
  // How long a wait polls before it sleeps on the futex.
  static constexpr std::chrono::microseconds kSpin{50};
  const std::chrono::microseconds spin_;
  std::shared_ptr<transport::shm::Segment> segment_;
  uint32_t epoch_ = 0;
};

}  // namespace pycomm::algorithms
