// What a stream-ordered schedule runs on: transfers posted in groups and kernels queued between
// them, nothing blocking the host. NCCL's point-to-point on one CUDA stream is such a link
// (csrc/cuda/nccl_link.h); the native tests drive the same schedules over an in-memory one.
//
// The contract is NCCL's:
//   * the transfers of one group progress together: a rank's send never waits for its own receive
//     of the same group, and the group ends when all of them have;
//   * groups and kernels run in the order they were posted, each after the one before;
//   * a send pairs with the peer's next unmatched receive from this rank, which must be of the same
//     byte count (nothing checks it on the wire: a schedule must agree with itself across ranks,
//     and the op stamps of queued_stamp.h check that the ranks run the same op);
//   * a send may wait until its receive is posted, so a schedule is deadlock-free only when the
//     groups that pair with each other can all be in flight at once. The schedules here pair
//     groups of the same step index on every rank.
// Buffers in one group must not overlap where one of them is received into.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../codecs/block_codec.h"
#include "../dtype.h"

namespace pycomm::algorithms {

struct QueuedTransfer {
  enum class Kind { kSend, kRecv };
  Kind kind;
  int peer;
  void* data;
  size_t bytes;  // 0: skipped on both sides
};

class QueuedLink {
 public:
  virtual ~QueuedLink() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // One group. `what` names the step in errors.
  virtual void post(const std::vector<QueuedTransfer>& transfers, const char* what) = 0;

  // Kernels, with the semantics and bits of their CPU counterparts (codecs/reduce.h and
  // codecs/block_codec.h): dst = dst op src elementwise, and the codecs.
  virtual void reduce(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) = 0;
  virtual void encode(codecs::Codec codec, const float* in, size_t count, uint8_t* out) = 0;
  virtual void decode(codecs::Codec codec, const uint8_t* in, size_t count, float* out) = 0;
  virtual void decodeAdd(codecs::Codec codec, const uint8_t* in, size_t count, float* acc) = 0;
  // data[i] *= factor in fp32, as the CPU's scaling loops do.
  virtual void scale(float* data, size_t count, float factor) = 0;
  // dst = src, `bytes` of them; the two do not overlap.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // out = encode((acc + decode(in)) * scale), acc unchanged; the product is skipped when scale == 1.
  virtual void decodeAddEncode(codecs::Codec codec, const uint8_t* in, const float* acc, size_t count,
                               uint8_t* out, float scale) = 0;
};

}  // namespace pycomm::algorithms
