// A view of a transport restricted to some of its ranks, renumbered 0..k-1, so that any algorithm can
// run among a subset of a group (for example the ranks with the same local index on every host)
// over the group's own connections. Errors still name the real ranks.
#pragma once

#include <vector>

#include "transport.h"

namespace pycomm::transport {

class SubsetTransport final : public Transport {
 public:
  // `members` lists real ranks; the base's own rank must be among them.
  SubsetTransport(Transport& base, std::vector<int> members);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const char* name() const override { return base_.name(); }

  std::shared_ptr<Request> isend(int peer, const FrameInfo& info, const void* data, size_t nbytes) override {
    return base_.isend(members_.at(peer), info, data, nbytes);
  }
  std::shared_ptr<Request> irecv(int peer, const FrameInfo& info, void* data, size_t nbytes) override {
    return base_.irecv(peer == kAnyPeer ? kAnyPeer : members_.at(peer), info, data, nbytes);
  }
  void wait(const std::shared_ptr<Request>& request, Clock::time_point deadline, const std::string& context) override {
    base_.wait(request, deadline, context);
  }
  bool onIoThread() const override { return base_.onIoThread(); }
  bool cancel(const std::shared_ptr<Request>& request, Clock::time_point deadline) override {
    return base_.cancel(request, deadline);
  }
  void reportFailure(uint64_t seq, const std::string& message, const std::vector<int>& lostRanks) override {
    base_.reportFailure(seq, message, lostRanks);
  }
  std::exception_ptr peerFailure(int peer) override { return base_.peerFailure(members_.at(peer)); }
  // `peer` as the request names it: the base transport's rank.
  std::string judgeTimeout(int peer) override { return base_.judgeTimeout(peer); }
  void abort(const std::string& reason) override { base_.abort(reason); }

 private:
  Transport& base_;
  std::vector<int> members_;
  int rank_ = -1;
};

}  // namespace pycomm::transport
