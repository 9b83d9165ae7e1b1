// The key-value store the ranks rendezvous through. The torch adapter implements it over the
// c10d::Store torch hands the backend's creator; native tests use MemoryStore. No second rendezvous
// service exists.
#pragma once

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
};

}  // namespace pycomm
