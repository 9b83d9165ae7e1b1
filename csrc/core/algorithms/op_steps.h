// The CPU executor of the step interface (steps.h): each step is the Op's own call, inline. A
// receive is posted on the transport when the schedule posts it and waited for when the schedule
// reads it, so the early receives and the chunk pipelining a schedule states happen as written.
// Per step this adds nothing to what a schedule written against Op directly would do: the handle
// is the transport's request, returned as Op::send and Op::recv return it.
#pragma once

#include <cstring>
#include <memory>

#include "../codecs/block_codec.h"
#include "../codecs/reduce.h"
#include "compressed.h"
#include "op.h"
#include "steps.h"

namespace pycomm::algorithms {

class OpSteps {
 public:
  using Handle = std::shared_ptr<Request>;
  // Two steps' receives in flight: step s+1's chunks land while step s is reduced.
  static constexpr size_t kReceiveAhead = 2;
  static constexpr bool kPipelinesChunks = true;
  // Transfers match by (peer, slot): a receive may be posted any number of steps early.
  static constexpr bool kTaggedTransfers = true;

  explicit OpSteps(Op& op) : op_(op) {}

  int rank() const { return op_.rank(); }
  int size() const { return op_.size(); }

  Handle recv(int peer, uint32_t slot, void* data, size_t bytes) { return op_.recv(peer, slot, data, bytes); }
  Handle send(int peer, uint32_t slot, const void* data, size_t bytes) { return op_.send(peer, slot, data, bytes); }
  void arrived(const Handle& h) { op_.wait(h); }
  void left(const Handle& h) { op_.wait(h); }
  void step() {}
  void drain() { op_.waitAll(); }
  void phase(const char*) {}

  void reduce(void* dst, const void* src, size_t count, DataType dtype, ReduceOp reduceOp) {
    codecs::reduceInto(dst, src, count, dtype, reduceOp);
  }
  void copy(void* dst, const void* src, size_t bytes) {
    if (bytes > 0) std::memmove(dst, src, bytes);
  }
  void encode(codecs::Codec codec, const float* in, size_t count, uint8_t* out) { codecs::encode(codec, in, count, out); }
  void decode(codecs::Codec codec, const uint8_t* in, size_t count, float* out) { codecs::decode(codec, in, count, out); }
  void decodeAdd(codecs::Codec codec, const uint8_t* in, size_t count, float* acc) {
    codecs::decodeAdd(codec, in, count, acc);
  }
  void scale(float* data, size_t count, float factor) {
    for (size_t i = 0; i < count; ++i) data[i] *= factor;
  }
  void decodeAddEncode(codecs::Codec codec, const uint8_t* in, float* acc, size_t count, uint8_t* out, float factor) {
    codecs::decodeAdd(codec, in, count, acc);
    if (factor != 1.0f) scale(acc, count, factor);
    codecs::encode(codec, acc, count, out);
  }
  void encodeWithFeedback(codecs::Codec codec, float* data, float* residual, size_t count, uint8_t* out,
                          float* decoded) {
    algorithms::encodeWithFeedback(codec, data, residual, count, out, decoded);
  }

 private:
  Op& op_;
};

}  // namespace pycomm::algorithms
