// One posted send or receive. The transport completes or fails it from its I/O thread; the op that
// posted it waits with a deadline.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <string>

namespace pycomm::transport {

using Clock = std::chrono::steady_clock;

class Request {
 public:
  enum class Direction { kSend, kRecv };

  Request(Direction direction, int peer, void* data, size_t nbytes)
      : direction_(direction), peer_(peer), data_(data), nbytes_(nbytes) {}

  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  bool done() const { return state_.load(std::memory_order_acquire) != kPending; }

  // Waits until the request completes or `deadline` passes. Rethrows the request's error; on a
  // timeout throws TimeoutError with `context` and the peer and size it waited for.
  void wait(Clock::time_point deadline, const std::string& context);

  // Runs `callback` once the request is done (at once if it already is), on the completing thread:
  // a transport's event loop, or any thread that posts, waits or aborts. No transport lock is held.
  void onDone(std::function<void()> callback);

  // While set, completing the request also writes to eventfd `fd`, so a thread about to wait in
  // poll() on the request's socket learns that another thread finished it. Returns false, setting
  // nothing, if the request is already done or another thread's fd is set (one poller at a time).
  // -1 clears it; once cleared, the fd is never touched.
  bool setWakeFd(int fd);

  std::exception_ptr error() const;
  Direction direction() const { return direction_; }
  // For a receive from any peer, the peer that matched; otherwise the peer it was posted for.
  int peer() const { return peer_.load(std::memory_order_relaxed); }
  void* data() const { return data_; }
  size_t capacity() const { return nbytes_; }

  // Called by the transport only.
  void complete(int peer);
  void fail(std::exception_ptr error);

 private:
  static constexpr int kPending = 0;
  static constexpr int kDone = 1;
  static constexpr int kFailed = 2;

  void finish(int state);

  const Direction direction_;
  std::atomic<int> peer_;  // set again on completion (a receive from any peer); read by waiters
  void* const data_;
  const size_t nbytes_;

  std::atomic<int> state_{kPending};
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::exception_ptr error_;
  std::function<void()> callback_;
  int wakeFd_ = -1;
};

}  // namespace pycomm::transport
