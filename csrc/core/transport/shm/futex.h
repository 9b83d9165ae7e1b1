// Waiting on a 32-bit word in shared memory: spin briefly, then sleep in the kernel (futex), so that
// more ranks than cores do not burn the cores they need to make progress.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace pycomm::transport::shm {

// A flag one rank advances and others wait on; lives in shared memory (trivially copyable layout).
// Its owner aligns it: what the readers of the flag read next may share its cache line.
struct SharedFlag {
  std::atomic<uint32_t> value{0};
  std::atomic<uint32_t> waiters{0};
};

// Stores `value` and wakes the waiters, if any.
void publish(SharedFlag& flag, uint32_t value);

// Waits until (int32_t)(flag - target) >= 0, or `slice` passes; returns whether it got there.
// Polls for up to `spin` first (a futex wake-up costs tens of microseconds, more than a short op
// takes), then yields the core for up to `yieldFor` (at least a few times), then sleeps.
// Wrap-around safe, so epochs may overflow.
bool waitAtLeast(SharedFlag& flag, uint32_t target, std::chrono::microseconds slice,
                 std::chrono::microseconds spin = std::chrono::microseconds(0),
                 std::chrono::microseconds yieldFor = std::chrono::microseconds(0));

inline bool reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

}  // namespace pycomm::transport::shm
