// The stream-ordered executor of the step interface (steps.h), over a QueuedLink (queued_link.h).
//
// Sends join the open group at once. Receives are held back (`held_`) until the schedule needs
// them: arrived(h) adds that receive to the open group and posts the group, because the next
// kernel reads it; step() and drain() add every held receive and post. A kernel (reduce, copy, codec)
// posts the open group first, so it runs after the transfers before it, as the schedule wrote.
//
// Why receives wait: a CPU schedule posts receives steps ahead of their sends' partners, which is
// free on a tagged transport but would put, on a link whose groups complete as a whole, a receive
// of step s+1 in the group of step s, waiting for a send its peer only posts after its own step s
// completed. Held back to the moment they are read, the groups pair step for step on every rank
// (the schedules post the same sequence everywhere), and the link's order of receives from a peer
// is the order of that peer's sends to us, which is how the link pairs them.
//
// The executor allocates only its two vectors, not per step: the open group's (reserved once per op)
// and held_, one entry per receive of the op, each visited once by step() (firstHeld_).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../error.h"
#include "queued_link.h"
#include "steps.h"

namespace pycomm::algorithms {

class QueuedSteps {
 public:
  // A held receive's index in held_, or kNone for a send or a transfer of no bytes.
  struct Handle {
    size_t index;
  };
  // Receives land only when read, so one area per chunk is enough.
  static constexpr size_t kReceiveAhead = 1;
  // Groups and kernels run one after another on the link: chunks would not overlap.
  static constexpr bool kPipelinesChunks = false;
  // The link pairs transfers by order: a receive is posted in the step it pairs in.
  static constexpr bool kTaggedTransfers = false;

  QueuedSteps(QueuedLink& link, const char* what) : link_(link), what_(what) {
    open_.reserve(2 * static_cast<size_t>(link.size()));
  }

  int rank() const { return link_.rank(); }
  int size() const { return link_.size(); }

  Handle recv(int peer, uint32_t /*slot*/, void* data, size_t bytes) {
    if (bytes == 0) return {kNone};
    held_.push_back({QueuedTransfer::Kind::kRecv, peer, data, bytes});
    return {held_.size() - 1};
  }
  Handle send(int peer, uint32_t /*slot*/, const void* data, size_t bytes) {
    if (bytes > 0) open_.push_back({QueuedTransfer::Kind::kSend, peer, const_cast<void*>(data), bytes});
    return {kNone};
  }
  void arrived(Handle h) {
    if (h.index == kNone) return;
    release(held_[h.index]);
    post();
  }
  void left(Handle) { post(); }
  void step() {
    // Receives before firstHeld_ went out at an earlier step (or arrived() let them out).
    for (size_t i = firstHeld_; i < held_.size(); ++i) release(held_[i]);
    firstHeld_ = held_.size();
    post();
  }
  void drain() { step(); }
  void phase(const char* what) { what_ = what; }

  void reduce(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) {
    post();
    link_.reduce(dst, src, count, dtype, op);
  }
  void copy(void* dst, const void* src, size_t bytes) {
    post();
    if (bytes > 0) link_.copy(dst, src, bytes);
  }
  void encode(codecs::Codec codec, const float* in, size_t count, uint8_t* out) {
    post();
    link_.encode(codec, in, count, out);
  }
  void decode(codecs::Codec codec, const uint8_t* in, size_t count, float* out) {
    post();
    link_.decode(codec, in, count, out);
  }
  void decodeAdd(codecs::Codec codec, const uint8_t* in, size_t count, float* acc) {
    post();
    link_.decodeAdd(codec, in, count, acc);
  }
  void scale(float* data, size_t count, float factor) {
    post();
    link_.scale(data, count, factor);
  }
  void decodeAddEncode(codecs::Codec codec, const uint8_t* in, float* acc, size_t count, uint8_t* out, float factor) {
    post();
    link_.decodeAddEncode(codec, in, acc, count, out, factor);
  }
  // Error feedback keeps its residuals on the CPU (the DDP hooks' CUDA path keeps them in Python).
  void encodeWithFeedback(codecs::Codec, float*, float*, size_t, uint8_t*, float*) {
    PYCOMM_CHECK(false, InvalidUsageError, what_, ": error feedback is not available on a stream-ordered link");
  }

 private:
  static constexpr size_t kNone = ~size_t{0};

  // Moves a held receive into the open group (once: a released one has no bytes left).
  void release(QueuedTransfer& t) {
    if (t.bytes == 0) return;
    open_.push_back(t);
    t.bytes = 0;
  }
  void post() {
    if (open_.empty()) return;
    link_.post(open_, what_);
    open_.clear();
  }

  QueuedLink& link_;
  const char* what_;
  std::vector<QueuedTransfer> open_;
  std::vector<QueuedTransfer> held_;
  size_t firstHeld_ = 0;
};

}  // namespace pycomm::algorithms
