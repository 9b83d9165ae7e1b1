#include "futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>
#include <thread>

namespace pycomm::transport::shm {
namespace {

// Not FUTEX_PRIVATE: the word is shared between processes.
long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

void publish(SharedFlag& flag, uint32_t value) {
  flag.value.store(value, std::memory_order_seq_cst);
  if (flag.waiters.load(std::memory_order_seq_cst) != 0) futex(&flag.value, FUTEX_WAKE, INT_MAX, nullptr);
}

bool waitAtLeast(SharedFlag& flag, uint32_t target, std::chrono::microseconds slice,
                 std::chrono::microseconds spin, std::chrono::microseconds yieldFor) {
  for (int i = 0; i < 64; ++i) {
    if (reached(flag.value.load(std::memory_order_acquire), target)) return true;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  if (spin.count() > 0) {
    const auto until = std::chrono::steady_clock::now() + spin;
    do {
      for (int i = 0; i < 32; ++i) {
        if (reached(flag.value.load(std::memory_order_acquire), target)) return true;
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
      }
    } while (std::chrono::steady_clock::now() < until);
  }
  const auto yieldUntil = std::chrono::steady_clock::now() + yieldFor;
  for (int i = 0; i < 4 || std::chrono::steady_clock::now() < yieldUntil; ++i) {
    if (reached(flag.value.load(std::memory_order_acquire), target)) return true;
    std::this_thread::yield();
  }
  const timespec timeout{static_cast<time_t>(slice.count() / 1000000),
                         static_cast<long>((slice.count() % 1000000) * 1000)};
  flag.waiters.fetch_add(1, std::memory_order_seq_cst);
  uint32_t seen = flag.value.load(std::memory_order_seq_cst);
  if (!reached(seen, target)) futex(&flag.value, FUTEX_WAIT, seen, &timeout);
  flag.waiters.fetch_sub(1, std::memory_order_seq_cst);
  return reached(flag.value.load(std::memory_order_acquire), target);
}

}  // namespace pycomm::transport::shm
