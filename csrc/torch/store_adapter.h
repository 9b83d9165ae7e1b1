// The core's Store, implemented over the c10d::Store torch hands the backend's creator.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/store.h"

namespace pycomm::torch_adapter {

class C10dStore final : public Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<::c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override { store_->set(key, value); }

  bool check(const std::string& key) override { return store_->check({key}); }

  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    waitFor({key}, timeout);
    return store_->get(key);
  }

  std::vector<std::vector<uint8_t>> getAll(const std::vector<std::string>& keys,
                                           std::chrono::milliseconds timeout) override {
    if (keys.empty()) return {};
    waitFor(keys, timeout);
    auto values = store_->multiGet(keys);  // one round trip on a TCPStore; a get per key elsewhere
    PYCOMM_CHECK(values.size() == keys.size(), RemoteError, "the rendezvous store returned ", values.size(),
                 " values for ", keys.size(), " keys");
    return values;
  }

 private:
  void waitFor(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
    // torch's stores wait in poll(), whose int milliseconds a timeout of weeks overflows (a wait
    // of timedelta.max ends after 1 ms): long waits go in slices. Only a slice that ran its whole
    // course is followed by another; any earlier error is the store's answer.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      const auto slice = std::max(std::chrono::milliseconds(1), std::min(left, kSlice));
      const auto sliceStart = std::chrono::steady_clock::now();
      try {
        store_->wait(keys, slice);
        return;
      } catch (const std::exception& e) {
        // A store may wake a little early: most of the slice gone counts as run out.
        const bool sliceRanOut = std::chrono::steady_clock::now() - sliceStart >= slice * 9 / 10;
        if (!sliceRanOut || left <= kSlice) {
          throw TimeoutError(strCat("waiting for ", describeMissing(keys), " in the rendezvous store: ", e.what()));
        }
      }
    }
  }

  // The keys of `keys` that are still missing, for the error (all of them if the store cannot say).
  std::string describeMissing(const std::vector<std::string>& keys) {
    std::string missing;
    size_t count = 0;
    for (const auto& key : keys) {
      bool present = false;
      try {
        present = store_->check({key});
      } catch (const std::exception&) {
        present = false;  // a store that fails here has failed the wait too: name the key
      }
      if (present) continue;
      if (++count <= 4) missing += strCat(count == 1 ? "" : ", ", "'", key, "'");
    }
    if (count > 4) missing += strCat(" and ", count - 4, " more");
    return strCat(count == 1 ? "key " : "keys ", missing.empty() ? "(none missing now)" : missing);
  }

  static constexpr std::chrono::milliseconds kSlice{std::chrono::hours(1)};
  c10::intrusive_ptr<::c10d::Store> store_;
};

}  // namespace pycomm::torch_adapter
