#include "request.h"

#include <unistd.h>

#include <cstdint>
#include <thread>

#include "../error.h"

namespace pycomm::transport {

void Request::wait(Clock::time_point deadline, const std::string& context) {
  // Small messages complete within microseconds; a short spin saves the futex round trip of a
  // blocking wait. It is bounded, so ranks outnumbering cores still make progress.
  for (int i = 0; i < 200 && !done(); ++i) std::this_thread::yield();
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_until(lock, deadline, [&] { return state_.load() != kPending; })) {
    const char* what = direction_ == Direction::kSend ? "sending " : "receiving ";
    const char* preposition = direction_ == Direction::kSend ? " to peer " : " from peer ";
    throw TimeoutError(strCat(context, ": timed out waiting for peer ", peer(), " (", what, nbytes_,
                              " B", preposition, peer(), ")"));
  }
  if (state_.load() == kFailed) std::rethrow_exception(error_);
}

void Request::onDone(std::function<void()> callback) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_.load() == kPending) {
      callback_ = std::move(callback);
      return;
    }
  }
  callback();
}

std::exception_ptr Request::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

void Request::complete(int peer) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_.load() != kPending) return;
    peer_.store(peer, std::memory_order_relaxed);
  }
  finish(kDone);
}

void Request::fail(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_.load() != kPending) return;
    error_ = std::move(error);
  }
  finish(kFailed);
}

bool Request::setWakeFd(int fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd >= 0 && (state_.load() != kPending || wakeFd_ >= 0)) return false;
  wakeFd_ = fd;
  return true;
}

void Request::finish(int state) {
  std::function<void()> callback;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    state_.store(state, std::memory_order_release);
    callback = std::move(callback_);
    // Under the lock, so a waiter that cleared the fd can reuse or close it.
    if (wakeFd_ >= 0) {
      const uint64_t one = 1;
      (void)!::write(wakeFd_, &one, sizeof one);
    }
  }
  cv_.notify_all();
  if (callback) callback();
}

}  // namespace pycomm::transport
