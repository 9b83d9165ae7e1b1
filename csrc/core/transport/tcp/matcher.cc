#include "matcher.h"

#include <algorithm>
#include <cstring>

#include "../../error.h"

namespace pycomm::transport::tcp {
namespace {

bool isCollective(const FrameHeader& header) { return header.channel == static_cast<uint8_t>(Channel::kCollective); }

}  // namespace

Matcher::Matcher(int rank, int size, std::string context, uint64_t unexpectedBudget, OpLedger& ledger)
    : rank_(rank), context_(std::move(context)), unexpectedBudget_(unexpectedBudget), ledger_(ledger), sources_(size) {
  ledger_.setFrameHolder(this);
}

Matcher::~Matcher() { ledger_.setFrameHolder(nullptr); }

// ---------------------------------------------------------------------------------------------
// Receives

bool Matcher::post(int peer, const FrameInfo& info, const std::shared_ptr<Request>& request, Completions& completions) {
  const bool anyPeer = peer == kAnyPeer;
  const size_t nbytes = request->capacity();
  std::lock_guard<std::mutex> lock(mutex_);
  // A message that already arrived is delivered even if its sender has gone since: a peer may
  // finish its part of an op and leave before this rank gets round to receiving.
  if (aborted_) {
    completions.push_back({request, peer, aborted_});
    return false;
  }
  if (info.channel == Channel::kCollective) {
    CollectiveKey key{peer, info.seq, info.slot};
    auto arrived = arrivedCollective_.find(key);
    std::string failed;
    if (arrived != arrivedCollective_.end()) {
      const FrameHeader& h = arrived->second.header;
      deliver(request, peer, h, arrived->second.payload, check(peer, h, info.signature, nbytes), completions);
      releaseLocked(arrived->second);
      arrivedCollective_.erase(arrived);
    } else if (ledger_.failed(info.seq, &failed)) {
      completions.push_back({request, peer, remoteError(failed)});
    } else if (sources_[peer].failure) {
      completions.push_back({request, peer, sources_[peer].failure});
    } else {
      auto inserted = postedCollective_.emplace(key, PostedCollective{request, info.signature});
      PYCOMM_CHECK(inserted.second, InternalError, context_, " duplicate receive for seq ", info.seq, " slot ",
                   info.slot, " from peer ", peer);
    }
    return false;
  }
  auto match = std::find_if(arrivedP2P_.begin(), arrivedP2P_.end(), [&](const Arrived& a) {
    return (anyPeer || a.peer == peer) && a.header.seq == info.seq;
  });
  if (match != arrivedP2P_.end()) {
    deliver(request, match->peer, match->header, match->payload, check(match->peer, match->header, {}, nbytes),
            completions);
    releaseLocked(*match);
    arrivedP2P_.erase(match);
    return false;
  }
  if (!anyPeer && sources_[peer].failure) {
    completions.push_back({request, peer, sources_[peer].failure});
    return false;
  }
  postedP2P_.push_back({peer, info.seq, request});
  return true;
}

bool Matcher::unpostLocked(const std::shared_ptr<Request>& request) {
  for (auto it = postedCollective_.begin(); it != postedCollective_.end(); ++it) {
    if (it->second.request == request) {
      postedCollective_.erase(it);
      return true;
    }
  }
  for (auto it = postedP2P_.begin(); it != postedP2P_.end(); ++it) {
    if (it->request == request) {
      postedP2P_.erase(it);
      return true;
    }
  }
  return false;
}

bool Matcher::receivePostedForLoop(int peer, size_t callerReadMaxBytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::any_of(postedP2P_.begin(), postedP2P_.end(),
                  [&](const PostedP2P& posted) { return posted.peer == peer || posted.peer == kAnyPeer; })) {
    return true;
  }
  // The next chunks of a pipelined op, which the loop receives while the op reduces this one.
  for (auto it = postedCollective_.lower_bound(CollectiveKey{peer, 0, 0});
       it != postedCollective_.end() && std::get<0>(it->first) == peer; ++it) {
    if (it->second.request->capacity() > callerReadMaxBytes) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Frames arriving

std::string Matcher::claim(Connection& connection, Completions& completions) {
  const FrameHeader& h = connection.header;
  const int peer = connection.rank;
  std::lock_guard<std::mutex> lock(mutex_);
  connection.target = ReadTarget::kBuffer;
  if (isCollective(h)) {
    OpSignature ours;
    switch (ledger_.judge(h.seq, signatureOf(h), &ours)) {
      case OpLedger::Fate::kOver:
        connection.target = ReadTarget::kDiscard;
        break;
      case OpLedger::Fate::kMismatch:
        failMismatchLocked(peer, h, ours, completions);
        connection.target = ReadTarget::kDiscard;
        break;
      case OpLedger::Fate::kLive:
        break;
    }
  }
  if (connection.target == ReadTarget::kBuffer) {
    std::string why;
    if (auto request = takePostedLocked(peer, h, &why)) {
      if (why.empty()) {
        connection.target = ReadTarget::kRequest;
        connection.request = std::move(request);
      } else {
        connection.target = ReadTarget::kDiscard;
        completions.push_back({request, peer, std::make_exception_ptr(InvalidUsageError(why))});
      }
    }
  }
  if (connection.target != ReadTarget::kBuffer) return {};
  // Each slot of an op carries one frame from a peer: a second one while the first is held would be
  // dropped (one held frame per key), its bytes counted against the peer for good.
  if (isCollective(h) && arrivedCollective_.count(CollectiveKey{peer, h.seq, h.slot}) != 0) {
    return strCat(context_, " peer ", peer, " sent ", describeFrame(h),
                  " twice before this rank posted its receive; connection closed");
  }
  // What a peer may make this rank hold for receives not posted yet. Counted from the header on,
  // so a frame announcing more than the budget is refused before a byte of it is allocated.
  Source& source = sources_[peer];
  const uint64_t cost = unexpectedCost(h);
  if (cost > unexpectedBudget_ || source.unexpectedBytes > unexpectedBudget_ - cost) {
    return strCat(context_, " peer ", peer, " sent ", describeFrame(h), " that no receive was posted for, ", "with ",
                  source.unexpectedBytes, " B of such data held already: more than the budget of ", unexpectedBudget_,
                  " B per peer (Options(unexpected_bytes=...), PYCOMM_UNEXPECTED_BYTES); connection closed");
  }
  source.unexpectedBytes += cost;
  return {};
}

std::shared_ptr<Request> Matcher::takeClaimed(Connection& connection) {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::move(connection.request);
}

void Matcher::arrived(int peer, const FrameHeader& h, FrameBytes payload, Completions& completions) {
  Arrived arrived{h, std::move(payload), peer};
  std::lock_guard<std::mutex> lock(mutex_);
  const bool collective = isCollective(h);
  if (collective) {
    // Judged again: the op may have begun here while the payload was read (claim judged the header
    // before), after opBegun looked at the frames held, so only this look sees the mismatch.
    OpSignature ours;
    switch (ledger_.judge(h.seq, signatureOf(h), &ours)) {
      case OpLedger::Fate::kMismatch:
        failMismatchLocked(peer, h, ours, completions);
        [[fallthrough]];
      case OpLedger::Fate::kOver:
        releaseLocked(arrived);
        return;
      case OpLedger::Fate::kLive:
        break;
    }
  }
  std::string why;
  if (auto request = takePostedLocked(peer, h, &why)) {
    deliver(request, peer, h, arrived.payload, why, completions);
    releaseLocked(arrived);
    return;
  }
  if (collective) {
    arrivedCollective_.emplace(CollectiveKey{peer, h.seq, h.slot}, std::move(arrived));
  } else {
    arrivedP2P_.push_back(std::move(arrived));
  }
}

std::string Matcher::errorReport(int peer, const FrameHeader& h, const std::string& text, Completions& completions) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Recorded and applied under one hold of the lock: a receive posted meanwhile either sees the
  // failure or is failed here.
  // The reporter names the rank it lost, if any, in the header's root (TcpTransport::reportFailure).
  const int lost = h.root >= 0 && static_cast<size_t>(h.root) < sources_.size() ? h.root : -1;
  OpLedger::PeerReport report = ledger_.recordPeerReport(h.seq, peer, lost, text);
  for (uint64_t seq : report.failedActive) failPostedSeqLocked(seq, remoteError(ledger_.failure(seq)), completions);
  switch (report.outcome) {
    case OpLedger::PeerReport::Outcome::kLate:
      return {};
    case OpLedger::PeerReport::Outcome::kTooMany:
      return strCat(context_, " peer ", peer, " reported failures of ", report.held,
                    " ops this rank has not finished; connection closed");
    case OpLedger::PeerReport::Outcome::kRecorded:
      failPostedSeqLocked(h.seq, remoteError(report.message), completions);
      return {};
  }
  return {};
}

std::shared_ptr<Request> Matcher::takePostedLocked(int peer, const FrameHeader& h, std::string* why) {
  std::shared_ptr<Request> request;
  if (isCollective(h)) {
    auto posted = postedCollective_.find(CollectiveKey{peer, h.seq, h.slot});
    if (posted == postedCollective_.end()) return nullptr;
    request = posted->second.request;
    *why = check(peer, h, posted->second.signature, request->capacity());
    postedCollective_.erase(posted);
    return request;
  }
  auto posted = std::find_if(postedP2P_.begin(), postedP2P_.end(), [&](const PostedP2P& p) {
    return (p.peer == kAnyPeer || p.peer == peer) && p.tag == h.seq;
  });
  if (posted == postedP2P_.end()) return nullptr;
  request = posted->request;
  postedP2P_.erase(posted);
  *why = check(peer, h, {}, request->capacity());
  return request;
}

// ---------------------------------------------------------------------------------------------
// Checks and deliveries

std::string Matcher::mismatch(int peer, const FrameHeader& header, const OpSignature& ours) const {
  return strCat(context_, " ", opKindName(ours.kind), " seq=", header.seq,
                ": mismatched collectives across ranks: rank ", rank_, " runs ", ours.describe(), " but rank ", peer,
                " runs ", signatureOf(header).describe());
}

std::string Matcher::check(int peer, const FrameHeader& header, const OpSignature& ours, size_t expectedBytes) const {
  if (!isCollective(header)) {
    if (header.nbytes == expectedBytes) return {};
    return strCat(context_, " recv from peer ", peer, " (tag ", header.seq, "): rank ", rank_, " posted a buffer of ",
                  expectedBytes, " bytes but rank ", peer, " sent ", header.nbytes, " bytes");
  }
  if (signatureOf(header) != ours) return mismatch(peer, header, ours);
  if (header.nbytes != expectedBytes) {
    return strCat(context_, " ", opKindName(ours.kind), " seq=", header.seq,
                  ": mismatched sizes across ranks: rank ", rank_, " expects ", expectedBytes, " bytes from rank ",
                  peer, " but rank ", peer, " sent ", header.nbytes, " bytes");
  }
  return {};
}

uint64_t Matcher::unexpectedCost(const FrameHeader& header) {
  // Bookkeeping counts too, so that a flood of empty frames for far-future ops is bounded as well.
  return header.nbytes + sizeof(Arrived) + 64;
}

void Matcher::releaseLocked(const Arrived& arrived) {
  Source& source = sources_[arrived.peer];
  source.unexpectedBytes -= std::min(source.unexpectedBytes, unexpectedCost(arrived.header));
}

void Matcher::deliver(const std::shared_ptr<Request>& request, int peer, const FrameHeader& header,
                      const FrameBytes& payload, const std::string& why, Completions& completions) {
  if (!why.empty()) {
    completions.push_back({request, peer, std::make_exception_ptr(InvalidUsageError(why))});
    return;
  }
  if (header.nbytes > 0) std::memcpy(request->data(), payload.data(), header.nbytes);
  completions.push_back({request, peer, nullptr});
}

void Matcher::failPostedSeqLocked(uint64_t seq, const std::exception_ptr& error, Completions& completions) {
  for (auto it = postedCollective_.begin(); it != postedCollective_.end();) {
    if (std::get<1>(it->first) == seq) {
      completions.push_back({it->second.request, std::get<0>(it->first), error});
      it = postedCollective_.erase(it);
    } else {
      ++it;
    }
  }
}

void Matcher::failMismatchLocked(int peer, const FrameHeader& header, const OpSignature& ours,
                                 Completions& completions) {
  const std::string message = mismatch(peer, header, ours);
  ledger_.recordFailure(header.seq, message);
  failPostedSeqLocked(header.seq, std::make_exception_ptr(InvalidUsageError(message)), completions);
}

// ---------------------------------------------------------------------------------------------
// Failures

bool Matcher::failed(int peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  return sources_[peer].failure != nullptr;
}

std::exception_ptr Matcher::failure(int peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (aborted_) return aborted_;
  return peer >= 0 && peer < static_cast<int>(sources_.size()) ? sources_[peer].failure : nullptr;
}

bool Matcher::failPeer(Connection& connection, std::exception_ptr& error, Completions& completions) {
  const int peer = connection.rank;
  std::lock_guard<std::mutex> lock(mutex_);
  if (sources_[peer].failure) return false;
  if (std::string late = ledger_.lateFailure(); !late.empty()) {
    // Say why the peer left, if it told us: its failure is the news, the closed socket the echo.
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      error = remoteError(strCat(e.what(), "; before that: ", late));
    }
  }
  sources_[peer].failure = error;
  // After this rank's own abort, a closing socket is the abort's echo, not a lost peer.
  if (!aborted_) ledger_.noteFault(OpLedger::Fault::kConnection, peer);
  for (auto it = postedCollective_.begin(); it != postedCollective_.end();) {
    if (std::get<0>(it->first) == peer) {
      completions.push_back({it->second.request, peer, error});
      it = postedCollective_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = postedP2P_.begin(); it != postedP2P_.end();) {
    if (it->peer == peer) {
      completions.push_back({it->request, peer, error});
      it = postedP2P_.erase(it);
    } else {
      ++it;
    }
  }
  if (connection.request) completions.push_back({std::move(connection.request), peer, error});
  return true;
}

void Matcher::abort(const std::exception_ptr& error, Completions& completions) {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = error;
  for (auto& entry : postedCollective_) completions.push_back({entry.second.request, -1, error});
  for (auto& entry : postedP2P_) completions.push_back({entry.request, entry.peer, error});
  postedCollective_.clear();
  postedP2P_.clear();
  arrivedCollective_.clear();
  arrivedP2P_.clear();
  for (auto& source : sources_) source.unexpectedBytes = 0;
}

void Matcher::failClaimed(Connection& connection, const std::exception_ptr& error, Completions& completions) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (connection.request) completions.push_back({std::move(connection.request), connection.rank, error});
}

// ---------------------------------------------------------------------------------------------
// The op ledger's news

bool Matcher::opBegun(uint64_t seq, const OpSignature& signature) {
  Completions completions;
  bool mismatched = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [key, arrived] : arrivedCollective_) {
      if (std::get<1>(key) == seq && signatureOf(arrived.header) != signature) {
        failMismatchLocked(arrived.peer, arrived.header, signature, completions);
        mismatched = true;
        break;
      }
    }
  }
  finish(completions);
  return mismatched;
}

void Matcher::opsRetired(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = arrivedCollective_.begin(); it != arrivedCollective_.end();) {
    if (std::get<1>(it->first) > seq) {
      ++it;
      continue;
    }
    releaseLocked(it->second);
    it = arrivedCollective_.erase(it);
  }
}

}  // namespace pycomm::transport::tcp
