// A QueuedLink that counts the bytes another one carries: what pycomm.stats() reports for the ops
// of a stream-ordered route (the NCCL link keeps no counters of its own). Transfers are counted
// when posted, the sizes the schedule asked for; a group that later fails still counted, as the
// op then fails and records nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "queued_link.h"

namespace pycomm::algorithms {

class CountingLink final : public QueuedLink {
 public:
  explicit CountingLink(QueuedLink& inner) : inner_(inner) {}

  uint64_t bytesSent() const { return sent_; }
  uint64_t bytesReceived() const { return received_; }
  uint64_t sendsPosted() const { return sends_; }

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void post(const std::vector<QueuedTransfer>& transfers, const char* what) override {
    inner_.post(transfers, what);
    for (const auto& t : transfers) {
      const bool send = t.kind == QueuedTransfer::Kind::kSend;
      (send ? sent_ : received_) += t.bytes;
      sends_ += send ? 1 : 0;
    }
  }
  void reduce(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) override {
    inner_.reduce(dst, src, count, dtype, op);
  }
  void encode(codecs::Codec codec, const float* in, size_t count, uint8_t* out) override {
    inner_.encode(codec, in, count, out);
  }
  void decode(codecs::Codec codec, const uint8_t* in, size_t count, float* out) override {
    inner_.decode(codec, in, count, out);
  }
  void decodeAdd(codecs::Codec codec, const uint8_t* in, size_t count, float* acc) override {
    inner_.decodeAdd(codec, in, count, acc);
  }
  void scale(float* data, size_t count, float factor) override { inner_.scale(data, count, factor); }
  void copy(void* dst, const void* src, size_t bytes) override { inner_.copy(dst, src, bytes); }
  void decodeAddEncode(codecs::Codec codec, const uint8_t* in, const float* acc, size_t count, uint8_t* out,
                       float scale) override {
    inner_.decodeAddEncode(codec, in, acc, count, out, scale);
  }

 private:
  QueuedLink& inner_;
  uint64_t sent_ = 0;
  uint64_t received_ = 0;
  uint64_t sends_ = 0;
};

}  // namespace pycomm::algorithms
