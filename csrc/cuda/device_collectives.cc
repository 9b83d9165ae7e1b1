#include "device_collectives.h"

#include <algorithm>

#include "core/algorithms/op.h"
#include "core/error.h"
#include "reduce_kernels.cuh"

namespace pycomm::cuda {
namespace {

int mod(int a, int p) { return ((a % p) + p) % p; }

uint8_t* at(void* base, size_t byteOffset) { return static_cast<uint8_t*>(base) + byteOffset; }

using Kind = NcclComm::Transfer::Kind;

}  // namespace

size_t ringAllreduceScratchBytes(size_t count, int size, DataType dtype) {
  return std::max<size_t>(algorithms::Segments(count, size).maxLength(), 1) * elementSize(dtype);
}

void ringAllreduce(NcclComm& comm, void* data, void* scratch, size_t count, DataType dtype, ReduceOp op,
                   cudaStream_t stream) {
  const int p = comm.size();
  if (p == 1 || count == 0) return;
  const int r = comm.rank();
  const int left = mod(r - 1, p), right = mod(r + 1, p);
  const size_t esize = elementSize(dtype);
  const algorithms::Segments segments(count, p);
  auto bytesOf = [&](int seg) { return segments.length(seg) * esize; };
  auto segment = [&](int seg) { return at(data, segments.offset(seg) * esize); };

  // Reduce-scatter: at step s, send segment r-1-s (reduced at step s-1) and add segment r-2-s from
  // the left into our own. After p-1 steps rank r holds segment r, reduced over every rank.
  for (int s = 0; s < p - 1; ++s) {
    const int out = mod(r - 1 - s, p), in = mod(r - 2 - s, p);
    comm.post({{Kind::kSend, right, segment(out), bytesOf(out)}, {Kind::kRecv, left, scratch, bytesOf(in)}}, stream,
              "ring all-reduce (reduce-scatter)");
    reduceInto(segment(in), scratch, segments.length(in), dtype, op, stream);
  }
  // All-gather: pass the reduced segments round, each received straight into place.
  for (int s = 0; s < p - 1; ++s) {
    const int out = mod(r - s, p), in = mod(r - 1 - s, p);
    comm.post({{Kind::kSend, right, segment(out), bytesOf(out)}, {Kind::kRecv, left, segment(in), bytesOf(in)}},
              stream, "ring all-reduce (all-gather)");
  }
}

void chainBroadcast(NcclComm& comm, void* data, size_t bytes, int root, size_t chunkBytes, cudaStream_t stream) {
  const int p = comm.size();
  PYCOMM_CHECK(root >= 0 && root < p, InvalidUsageError, "broadcast root ", root, " outside a group of ", p);
  if (p == 1 || bytes == 0) return;
  PYCOMM_CHECK(chunkBytes > 0, InvalidUsageError, "broadcast chunk size must be positive");
  const int position = mod(comm.rank() - root, p);  // place in the chain root, root+1, ...
  const int prev = mod(comm.rank() - 1, p), next = mod(comm.rank() + 1, p);
  const bool receives = position > 0, forwards = position < p - 1;
  const size_t chunks = (bytes + chunkBytes - 1) / chunkBytes;
  auto chunk = [&](size_t c) { return at(data, c * chunkBytes); };
  auto length = [&](size_t c) { return std::min(chunkBytes, bytes - c * chunkBytes); };
  // Step c receives chunk c and forwards chunk c-1 (received at step c-1), in one group.
  for (size_t c = 0; c <= chunks; ++c) {
    std::vector<NcclComm::Transfer> transfers;
    if (receives && c < chunks) transfers.push_back({Kind::kRecv, prev, chunk(c), length(c)});
    if (forwards && c > 0) {
      // The root has every chunk already: it sends chunk c-1 without waiting for a receive.
      transfers.push_back({Kind::kSend, next, chunk(c - 1), length(c - 1)});
    }
    if (!transfers.empty()) comm.post(transfers, stream, "chain broadcast");
  }
}

}  // namespace pycomm::cuda
