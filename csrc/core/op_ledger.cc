#include "op_ledger.h"

#include <algorithm>

#include "error.h"

namespace pycomm {
namespace {

// Failure reports held for ops this rank has not retired yet; a few per op in flight is the most a
// sane peer sends.
constexpr size_t kMaxFailedSeqs = 4096;
// Ops that succeeded here and are remembered for a peer's late report of their failure.
constexpr size_t kRecentSuccesses = 64;

}  // namespace

void OpLedger::setFrameHolder(FrameHolder* holder) {
  std::lock_guard<std::mutex> lock(mutex_);
  holder_ = holder;
}

void OpLedger::begin(uint64_t seq, const transport::OpSignature& signature) {
  FrameHolder* holder;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    activeOps_[seq] = signature;
    holder = holder_;
    if (!groupLost_.empty()) {
      failedSeqs_.emplace(seq, groupLost_);
      throw RemoteError(groupLost_);
    }
  }
  // From here on the transport judges new frames of `seq` against `signature`; the holder checks
  // those that came before.
  if (holder != nullptr && holder->opBegun(seq, signature)) throw InvalidUsageError(failure(seq));
}

void OpLedger::retire(uint64_t seq, bool succeeded) {
  FrameHolder* holder;
  uint64_t retired;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    retiredSeq_ = std::max(retiredSeq_, seq);
    retired = retiredSeq_;
    failedSeqs_.erase(failedSeqs_.begin(), failedSeqs_.upper_bound(retiredSeq_));
    activeOps_.erase(activeOps_.begin(), activeOps_.upper_bound(retiredSeq_));
    if (succeeded) {
      succeeded_.push_back(seq);
      if (succeeded_.size() > kRecentSuccesses) succeeded_.pop_front();
    }
    holder = holder_;
  }
  // A frame of a retired op that arrives meanwhile is judged kOver; one held already goes here.
  if (holder != nullptr) holder->opsRetired(retired);
}

void OpLedger::recordOwnFailure(uint64_t seq, const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (seq > retiredSeq_) failedSeqs_.emplace(seq, message);
}

std::string OpLedger::failure(uint64_t seq) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto failed = failedSeqs_.find(seq);
  return failed == failedSeqs_.end() ? std::string() : failed->second;
}

bool OpLedger::failed(uint64_t seq, std::string* message) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto failed = failedSeqs_.find(seq);
  if (failed == failedSeqs_.end()) return false;
  *message = failed->second;
  return true;
}

std::string OpLedger::takeLateFailure() {
  if (!hasLateFailure_.load()) return {};
  std::lock_guard<std::mutex> lock(mutex_);
  std::string taken;
  taken.swap(lateFailure_);
  hasLateFailure_.store(false);
  return taken;
}

std::string OpLedger::lateFailure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lateFailure_;
}

OpLedger::Fate OpLedger::judge(uint64_t seq, const transport::OpSignature& theirs, transport::OpSignature* ours) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (seq <= retiredSeq_ || failedSeqs_.count(seq) != 0) return Fate::kOver;
  auto active = activeOps_.find(seq);
  if (active != activeOps_.end() && theirs != active->second) {
    *ours = active->second;
    return Fate::kMismatch;
  }
  return Fate::kLive;
}

void OpLedger::recordFailure(uint64_t seq, const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  failedSeqs_.emplace(seq, message);
}

OpLedger::PeerReport OpLedger::recordPeerReport(uint64_t seq, int peer, int lost, const std::string& text) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (lost == peer) lost = -1;  // a rank cannot report itself lost
  if (lost >= 0 && lost != rank_) {
    // The group lost a rank: no collective of it can complete any more. The ops begun here fail
    // now and every later one at its start, instead of each waiting for the timeout on a peer that
    // gave the group up (it reported, and will shrink or leave).
    lostRanks_.insert(lost);
    lastFault_ = Fault::kRemote;
    if (groupLost_.empty()) {
      groupLost_ = strCat(context_, " the group lost rank ", lost, " (peer ", peer, " reported op seq=", seq,
                          " failed there: ", text, "); shrink the group (dist.shrink_group) or start again");
    }
  }
  if (seq <= retiredSeq_) {
    // An op that completed here failed elsewhere (a rank that only sent, say): raise it on this
    // rank's next collective rather than let the ranks drift apart silently.
    if (std::find(succeeded_.begin(), succeeded_.end(), seq) != succeeded_.end() && lateFailure_.empty()) {
      lateFailure_ = strCat(context_, " collective seq=", seq, " completed on this rank but failed on peer ", peer,
                            ": ", text);
      hasLateFailure_.store(true);
    }
    return withActiveFailedLocked({PeerReport::Outcome::kLate, {}, 0, {}});
  }
  if (failedSeqs_.size() >= kMaxFailedSeqs) {
    // Reports for ops far ahead of this rank, without end: a peer gone wrong, not a failure.
    return {PeerReport::Outcome::kTooMany, {}, failedSeqs_.size(), {}};
  }
  std::string message = strCat(context_, " peer ", peer, " reported a failure: ", text);
  failedSeqs_.emplace(seq, message);
  lastFault_ = Fault::kRemote;
  return withActiveFailedLocked({PeerReport::Outcome::kRecorded, std::move(message), 0, {}});
}

OpLedger::PeerReport OpLedger::withActiveFailedLocked(PeerReport report) {
  if (groupLost_.empty()) return report;
  for (const auto& [seq, signature] : activeOps_) {
    if (seq > retiredSeq_ && failedSeqs_.emplace(seq, groupLost_).second) report.failedActive.push_back(seq);
  }
  return report;
}

void OpLedger::noteFault(Fault fault, int peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  lastFault_ = fault;
  if (peer >= 0 && peer != rank_) lostRanks_.insert(peer);
}

OpLedger::Fault OpLedger::lastFault() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lastFault_;
}

std::vector<int> OpLedger::lostRanks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::vector<int>(lostRanks_.begin(), lostRanks_.end());
}

}  // namespace pycomm
