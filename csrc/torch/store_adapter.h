// The core's Store, implemented over the c10d::Store torch hands the backend's creator.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "core/error.h"
#include "core/store.h"

namespace pycomm::torch_adapter {

class C10dStore final : public Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<::c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override { store_->set(key, value); }

  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    try {
      store_->wait({key}, timeout);
    } catch (const std::exception& e) {
      throw TimeoutError(strCat("waiting for key '", key, "' in the rendezvous store: ", e.what()));
    }
    return store_->get(key);
  }

 private:
  c10::intrusive_ptr<::c10d::Store> store_;
};

}  // namespace pycomm::torch_adapter
