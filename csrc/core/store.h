// The key-value store the ranks rendezvous through. The torch adapter implements it over the
// c10d::Store torch hands the backend's creator; native tests use MemoryStore. No second rendezvous
// service exists.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace pycomm {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Blocks until the key exists or the timeout passes (then throws TimeoutError).
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Whether the key exists now, without waiting.
  virtual bool check(const std::string& key) = 0;
  // Blocks until every key exists or the timeout passes, then returns their values in order. A
  // store that can waits and reads them all at once: a TCPStore does it in two round trips, where
  // a get per key costs two each, and at setup every rank reads every rank's keys.
  virtual std::vector<std::vector<uint8_t>> getAll(const std::vector<std::string>& keys,
                                                   std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<std::vector<uint8_t>> values;
    values.reserve(keys.size());
    for (const auto& key : keys) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      values.push_back(get(key, std::max(left, std::chrono::milliseconds(1))));
    }
    return values;
  }
};

}  // namespace pycomm
