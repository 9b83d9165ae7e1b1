// A small native test harness: CHECK macros that count failures, and helpers that run the ranks of a
// group as threads over an in-memory store.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/store.h"

namespace pycomm::testing {

inline int& failures() {
  static int count = 0;
  return count;
}
inline std::mutex& failureMutex() {
  static std::mutex m;
  return m;
}

#define EXPECT_TRUE(cond, ...)                                                            \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::lock_guard<std::mutex> lock_(::pycomm::testing::failureMutex());               \
      ++::pycomm::testing::failures();                                                    \
      std::fprintf(stderr, "%s:%d: FAILED %s %s\n", __FILE__, __LINE__, #cond,            \
                   ::pycomm::strCat(__VA_ARGS__).c_str());                                \
    }                                                                                     \
  } while (0)

class MemoryStore : public Store {
 public:
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      data_[key] = value;
    }
    cv_.notify_all();
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return data_.count(key) != 0; })) {
      throw TimeoutError("store get timed out: " + key);
    }
    return data_[key];
  }
  bool check(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return data_.count(key) != 0;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<uint8_t>> data_;
};

// Runs fn(rank) on `size` threads; an exception in a rank is a test failure.
inline void runRanks(int size, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        EXPECT_TRUE(false, "rank ", r, " threw: ", e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
}

inline int finish(const char* name) {
  if (failures() == 0) {
    std::printf("%s: all checks passed\n", name);
    return 0;
  }
  std::printf("%s: %d checks failed\n", name, failures());
  return 1;
}

}  // namespace pycomm::testing
