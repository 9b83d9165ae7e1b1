// An in-memory QueuedLink for checking the stream-ordered schedules on the CPU: its groups behave as
// NCCL's do at their strictest (a send completes only once its receive is posted and the whole group
// has matched), its kernels are the CPU core's, and it checks what the CUDA kernels and NCCL would
// need (paired byte counts, no receive overlapping its group, reductions aligned modulo 16).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/algorithms/queued_collectives.h"
#include "core/codecs/block_codec.h"
#include "core/codecs/reduce.h"
#include "core/error.h"
#include "harness.h"

namespace pycomm::testing {

using algorithms::QueuedLink;
using algorithms::QueuedTransfer;

// Pairs the ranks' transfers: the k-th send from a to b with the k-th receive at b from a.
class HostFabric {
 public:
  explicit HostFabric(std::chrono::milliseconds deadline) : deadline_(deadline) {}

  void runGroup(int rank, const std::vector<QueuedTransfer>& transfers, const char* what) {
    checkNoOverlap(rank, transfers, what);
    auto group = std::make_shared<Group>();
    std::unique_lock<std::mutex> lock(mutex_);
    for (const auto& t : transfers) {
      if (t.bytes == 0) continue;
      const bool send = t.kind == QueuedTransfer::Kind::kSend;
      const auto key = send ? std::make_pair(rank, t.peer) : std::make_pair(t.peer, rank);
      (send ? sends_ : recvs_)[key].push_back(Entry{t.data, t.bytes, group, what});
      ++group->pending;
      match(key);
    }
    cv_.notify_all();
    if (!cv_.wait_for(lock, deadline_, [&] { return group->pending == 0; })) {
      throw TimeoutError(strCat("rank ", rank, " ", what, ": group not matched after ", deadline_.count(),
                                " ms (the schedule would hang on NCCL)"));
    }
    ++groups_;
  }

  size_t groups() const { return groups_; }

 private:
  struct Group {
    int pending = 0;
  };
  struct Entry {
    void* data;
    size_t bytes;
    std::shared_ptr<Group> group;
    const char* what;
  };

  void match(const std::pair<int, int>& key) {
    auto& sends = sends_[key];
    auto& recvs = recvs_[key];
    while (!sends.empty() && !recvs.empty()) {
      Entry send = sends.front(), recv = recvs.front();
      sends.pop_front();
      recvs.pop_front();
      EXPECT_TRUE(send.bytes == recv.bytes, "rank ", key.first, " -> ", key.second, ": a send of ", send.bytes,
                  " bytes (", send.what, ") paired with a receive of ", recv.bytes, " (", recv.what, ")");
      std::memcpy(recv.data, send.data, std::min(send.bytes, recv.bytes));
      --send.group->pending;
      --recv.group->pending;
    }
  }

  static void checkNoOverlap(int rank, const std::vector<QueuedTransfer>& transfers, const char* what) {
    for (size_t i = 0; i < transfers.size(); ++i) {
      const auto& a = transfers[i];
      if (a.kind != QueuedTransfer::Kind::kRecv || a.bytes == 0) continue;
      const auto* begin = static_cast<const uint8_t*>(a.data);
      for (size_t j = 0; j < transfers.size(); ++j) {
        const auto& b = transfers[j];
        if (j == i || b.bytes == 0) continue;
        const auto* other = static_cast<const uint8_t*>(b.data);
        EXPECT_TRUE(begin + a.bytes <= other || other + b.bytes <= begin, "rank ", rank, " ", what,
                    ": a receive overlaps another transfer of its group");
      }
    }
  }

  const std::chrono::milliseconds deadline_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::pair<int, int>, std::deque<Entry>> sends_, recvs_;
  size_t groups_ = 0;
};

// The link: transfers through the fabric, kernels by the CPU core.
class HostLink final : public QueuedLink {
 public:
  HostLink(HostFabric& fabric, int rank, int size) : fabric_(fabric), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void post(const std::vector<QueuedTransfer>& transfers, const char* what) override {
    for (const auto& t : transfers) {
      EXPECT_TRUE(t.peer >= 0 && t.peer < size_ && t.peer != rank_, "rank ", rank_, " ", what, ": peer ", t.peer);
    }
    fabric_.runGroup(rank_, transfers, what);
  }
  void reduce(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) override {
    // The CUDA kernel's vector path needs this; the schedules place their receives to give it.
    EXPECT_TRUE(count == 0 || (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) % 16 == 0,
                "rank ", rank_, ": reduce of ", count, " elements with dst and src apart modulo 16");
    codecs::reduceInto(dst, src, count, dtype, op);
  }
  void encode(codecs::Codec codec, const float* in, size_t count, uint8_t* out) override {
    codecs::encode(codec, in, count, out);
  }
  void decode(codecs::Codec codec, const uint8_t* in, size_t count, float* out) override {
    codecs::decode(codec, in, count, out);
  }
  void decodeAdd(codecs::Codec codec, const uint8_t* in, size_t count, float* acc) override {
    codecs::decodeAdd(codec, in, count, acc);
  }
  void scale(float* data, size_t count, float factor) override {
    for (size_t i = 0; i < count; ++i) data[i] *= factor;
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    const auto* from = static_cast<const uint8_t*>(src);
    const auto* to = static_cast<const uint8_t*>(dst);
    EXPECT_TRUE(bytes == 0 || from + bytes <= to || to + bytes <= from, "rank ", rank_, ": copy between overlapping buffers");
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  // The CPU sequence the CUDA kernel is specified by (csrc/cuda/codec_kernels.cuh).
  void decodeAddEncode(codecs::Codec codec, const uint8_t* in, const float* acc, size_t count, uint8_t* out,
                       float scale) override {
    std::vector<float> tmp(acc, acc + count);
    codecs::decodeAdd(codec, in, count, tmp.data());
    if (scale != 1.0f) this->scale(tmp.data(), count, scale);
    codecs::encode(codec, tmp.data(), count, out);
  }

 private:
  HostFabric& fabric_;
  const int rank_;
  const int size_;
};

}  // namespace pycomm::testing
