// The one place where messages meet their receives, for every kind of receive: collective ones,
// matched by (peer, seq, slot), and point-to-point ones, matched in arrival order per (peer, tag) as
// MPI does, from one peer or from any. The posting thread (post), the event loop and the threads that
// read a socket themselves (claim, arrived) all match here, the same way.
//
// A message whose receive is posted is read straight into the receive's buffer (claim); one that
// arrives first is held until its receive is posted, within a budget per peer. Collective frames are
// judged by the communicator's op ledger first: frames of an op that is over here are dropped, and
// one whose signature differs from the op this rank runs fails that op. Error reports from peers
// are recorded in the ledger and fail the op's posted receives.
//
// One lock (the matcher's) guards all of it, and each peer's failure. It is taken after a
// connection's locks when nested, and before the ledger's.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "../../op_ledger.h"
#include "../frame.h"
#include "../request.h"
#include "completion.h"
#include "connection.h"

namespace pycomm::transport::tcp {

class Matcher final : public OpLedger::FrameHolder {
 public:
  static constexpr int kAnyPeer = -1;

  // `context`: "[rank r/p]"; `unexpectedBudget`: bytes of unposted messages held per peer at most
  // (TcpOptions::unexpectedBytes).
  Matcher(int rank, int size, std::string context, uint64_t unexpectedBudget, OpLedger& ledger);
  ~Matcher() override;

  // --- Receives

  // A receive is posted: it takes a message that already arrived, fails at once (aborted, op failed,
  // peer gone) or waits. True if it waits for the loop to read it (a point-to-point one).
  bool post(int peer, const FrameInfo& info, const std::shared_ptr<Request>& request, Completions& completions);
  // Takes back a receive that is still posted; false if it is not (done, or being read: then
  // `reading(request)` said whether a connection reads into it now, and *reading is that).
  template <typename IsReading>
  bool unpost(const std::shared_ptr<Request>& request, IsReading&& isReading, bool* reading) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (unpostLocked(request)) return true;
    *reading = isReading(request);
    return false;
  }
  // Whether a receive from `peer` that the loop is to read is posted: a point-to-point one (from it
  // or from any peer), or a collective one longer than a waiter reads (`callerReadMaxBytes`).
  bool receivePostedForLoop(int peer, size_t callerReadMaxBytes);

  // --- Frames arriving, with the connection's recvMutex held

  // A data frame's header from `connection` is complete: sets where its payload goes
  // (connection.target, and connection.request when a posted receive takes it). Returns why the
  // peer must be failed instead (its budget for unposted messages is spent), or empty.
  std::string claim(Connection& connection, Completions& completions);
  // The payload read into the claimed receive is complete: returns that receive.
  std::shared_ptr<Request> takeClaimed(Connection& connection);
  // A message read into a buffer (no receive was posted for it) is complete: delivered to a receive
  // posted meanwhile, dropped if its op is over, or held.
  void arrived(int peer, const FrameHeader& header, FrameBytes payload, Completions& completions);
  // Peer `peer` reports that collective header.seq failed there with `text`. Returns why the peer
  // must be failed instead (reports without end), or empty.
  std::string errorReport(int peer, const FrameHeader& header, const std::string& text, Completions& completions);

  // --- Failures

  // Whether `peer` failed (its frames are no longer read).
  bool failed(int peer);
  // The error that ended `peer`'s connection (or the abort's), or null.
  std::exception_ptr failure(int peer);
  // Records `peer`'s failure and fails its receives, the claimed one too (the caller holds the
  // connection's recvMutex). False if it had failed already. `error` gains the late failure, if
  // any: the peer's report is the news, the closed socket the echo.
  bool failPeer(Connection& connection, std::exception_ptr& error, Completions& completions);
  // Fails every posted receive and drops every held message; later posts fail at once.
  void abort(const std::exception_ptr& error, Completions& completions);
  // Fails the receive `connection` reads into, if any (the caller holds its recvMutex).
  void failClaimed(Connection& connection, const std::exception_ptr& error, Completions& completions);

  // --- OpLedger::FrameHolder
  bool opBegun(uint64_t seq, const OpSignature& signature) override;
  void opsRetired(uint64_t seq) override;

 private:
  struct PostedCollective {
    std::shared_ptr<Request> request;
    OpSignature signature;
  };
  struct PostedP2P {
    int peer;  // or kAnyPeer
    uint64_t tag;
    std::shared_ptr<Request> request;
  };
  struct Arrived {  // a message that came before its receive was posted
    FrameHeader header;
    FrameBytes payload;
    int peer;
  };
  using CollectiveKey = std::tuple<int, uint64_t, uint32_t>;  // peer, seq, slot
  struct Source {                 // per peer
    std::exception_ptr failure;   // the error that ended its connection
    uint64_t unexpectedBytes = 0;  // held in arrived*_ (and being read into a buffer) for it
  };

  // Why a message from `peer` with `header` cannot go into a receive of `expectedBytes` posted by an
  // op with signature `ours` (collective) or by a point-to-point receive, or empty.
  std::string check(int peer, const FrameHeader& header, const OpSignature& ours, size_t expectedBytes) const;
  std::string mismatch(int peer, const FrameHeader& header, const OpSignature& ours) const;
  // Removes and returns the posted receive a message from `peer` with `header` goes to, with why it
  // cannot take it (or empty); null if none is posted.
  std::shared_ptr<Request> takePostedLocked(int peer, const FrameHeader& header, std::string* why);
  bool unpostLocked(const std::shared_ptr<Request>& request);
  // What an unexpected frame counts against its peer's budget; and the release of an arrived one.
  static uint64_t unexpectedCost(const FrameHeader& header);
  void releaseLocked(const Arrived& arrived);
  // Copies an arrived payload into a receive and completes it, or fails it with `why`.
  static void deliver(const std::shared_ptr<Request>& request, int peer, const FrameHeader& header,
                      const FrameBytes& payload, const std::string& why, Completions& completions);
  void failPostedSeqLocked(uint64_t seq, const std::exception_ptr& error, Completions& completions);
  // A collective frame whose op this rank runs with another signature: records the failure and
  // fails that op's posted receives.
  void failMismatchLocked(int peer, const FrameHeader& header, const OpSignature& ours, Completions& completions);

  const int rank_;
  const std::string context_;
  const uint64_t unexpectedBudget_;
  OpLedger& ledger_;

  std::mutex mutex_;
  std::map<CollectiveKey, PostedCollective> postedCollective_;
  std::map<CollectiveKey, Arrived> arrivedCollective_;
  std::deque<PostedP2P> postedP2P_;
  std::deque<Arrived> arrivedP2P_;
  std::vector<Source> sources_;  // by rank
  std::exception_ptr aborted_;
};

}  // namespace pycomm::transport::tcp
