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
    // torch's stores wait in poll(), whose int milliseconds a timeout of weeks overflows (a wait
    // of timedelta.max ends after 1 ms): long waits go in slices. Only a slice that ran its whole
    // course is followed by another; any earlier error is the store's answer.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      const auto slice = std::max(std::chrono::milliseconds(1), std::min(left, kSlice));
      const auto sliceStart = std::chrono::steady_clock::now();
      try {
        store_->wait({key}, slice);
        break;
      } catch (const std::exception& e) {
        // A store may wake a little early: most of the slice gone counts as run out.
        const bool sliceRanOut = std::chrono::steady_clock::now() - sliceStart >= slice * 9 / 10;
        if (!sliceRanOut || left <= kSlice) {
          throw TimeoutError(strCat("waiting for key '", key, "' in the rendezvous store: ", e.what()));
        }
      }
    }
    return store_->get(key);
  }

 private:
  static constexpr std::chrono::milliseconds kSlice{std::chrono::hours(1)};
  c10::intrusive_ptr<::c10d::Store> store_;
};

}  // namespace pycomm::torch_adapter
