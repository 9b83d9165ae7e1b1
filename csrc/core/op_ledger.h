// What this rank knows about the fate of each collective: the ops begun here and their signatures,
// the ops that failed (here, on a peer, or by a mismatch a frame revealed) with their messages, the
// recent ops that succeeded here (for a peer's failure report that comes after them), the last op
// retired, and the last fault with the ranks it lost (what getError() and failed_ranks() answer). The communicator owns it; Op and the communicator record into it, and the transport
// reads it to judge the collective frames it receives and records into it the failure reports and
// mismatches those frames carry.
//
// The transport holds frames that arrived before their receive was posted; the ledger tells it
// (FrameHolder) when an op begins, so that such a frame of another signature fails the op at once,
// and when ops retire, so that their frames are dropped. It calls out with no lock of its own held:
// the transport calls into the ledger with its own matching lock held (matcher -> ledger is the only
// lock order between the two).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "transport/frame.h"

namespace pycomm {

class OpLedger {
 public:
  // The part of a transport that holds frames for ops; set once, before the first op begins, and
  // cleared (null) by the transport before it goes.
  class FrameHolder {
   public:
    virtual ~FrameHolder() = default;
    // Op `seq` began with `signature`. If a frame of it that already arrived disagrees, records the
    // mismatch (recordFailure), fails the op's posted receives and returns true.
    virtual bool opBegun(uint64_t seq, const transport::OpSignature& signature) = 0;
    // Every op up to `seq` is over on this rank: frames held for them are dropped.
    virtual void opsRetired(uint64_t seq) = 0;
  };

  // `context` starts the messages the ledger writes: "[rank r/p]".
  OpLedger(int rank, std::string context) : rank_(rank), context_(std::move(context)) {}
  OpLedger(const OpLedger&) = delete;
  OpLedger& operator=(const OpLedger&) = delete;

  void setFrameHolder(FrameHolder* holder);

  // --- The op's side (Op, Communicator)

  // Collective `seq` starts here with `signature`: from now on a frame of that seq that says
  // otherwise fails it at once, whatever slot it is for. Throws InvalidUsageError if a frame that
  // already arrived disagrees.
  void begin(uint64_t seq, const transport::OpSignature& signature);
  // Collective `seq` is over on this rank (and every one before it): late frames for it are dropped.
  void retire(uint64_t seq, bool succeeded);
  // This rank failed collective `seq` with `message` (kept unless the op is retired already): its
  // later frames are dropped and receives posted for it fail at once.
  void recordOwnFailure(uint64_t seq, const std::string& message);
  // Why collective `seq` failed (a peer's report, a mismatch, this rank's own failure), or empty. An
  // op whose own transfers all completed still fails when a peer says so (it may have been the only
  // rank that saw a mismatch).
  std::string failure(uint64_t seq) const;
  // The same, for whether one was recorded at all (a message may be empty); *message gets it.
  bool failed(uint64_t seq, std::string* message) const;
  // A peer's report that an op which had already completed on this rank failed there (a rank whose
  // part was only to send, say); empty if none. Taken once.
  std::string takeLateFailure();

  // --- The transport's side

  // What becomes of an arriving collective frame of `seq` whose sender runs `theirs`.
  enum class Fate {
    kLive,      // an op not over here: deliver it
    kOver,      // retired or failed here: drop it
    kMismatch,  // this rank runs op `seq` with another signature, stored in *ours
  };
  Fate judge(uint64_t seq, const transport::OpSignature& theirs, transport::OpSignature* ours) const;
  // Collective `seq` failed with `message` (a mismatch the transport found); an earlier message for
  // it is kept.
  void recordFailure(uint64_t seq, const std::string& message);
  // Peer `peer` reported that collective `seq` failed there with `text`; `lost`: the rank the peer
  // lost (-1 if none; any other value out of the group is the caller's to drop). A lost rank ends
  // the group's collectives here: those begun fail (PeerReport::failedActive), later ones in begin().
  struct PeerReport {
    enum class Outcome {
      kLate,      // the op is retired here: kept for takeLateFailure if it succeeded here
      kRecorded,  // `message` is the op's failure now: fail its posted receives with it
      kTooMany,   // `held` failures of unfinished ops held already: the peer has gone wrong
    } outcome;
    std::string message;
    size_t held = 0;
    // Once the group lost a rank: the ops begun here that failed with it now (OpLedger::failure
    // says how): fail their posted receives.
    std::vector<uint64_t> failedActive;
  };
  PeerReport recordPeerReport(uint64_t seq, int peer, int lost, const std::string& text);
  // The late failure takeLateFailure would take, left in place.
  std::string lateFailure() const;

  // --- Faults, for Backend::getError() and pycomm.failed_ranks()

  enum class Fault {
    kNone,
    kTimeout,     // a wait ran past the group's timeout (on `peer`)
    kConnection,  // the connection to `peer` closed, reset or carried garbage
    kRemote,      // a peer reported a failure (`peer`: the rank it lost, if it named one)
  };
  // Remembers the fault, the latest one winning, and `peer` (when >= 0 and not this rank) as lost.
  void noteFault(Fault fault, int peer);
  Fault lastFault() const;
  // The ranks this rank lost or waited for past the timeout, and those its peers reported lost;
  // ascending.
  std::vector<int> lostRanks() const;

 private:
  const int rank_;
  const std::string context_;
  FrameHolder* holder_ = nullptr;  // written before the first op and after the last only

  mutable std::mutex mutex_;
  std::map<uint64_t, std::string> failedSeqs_;
  std::map<uint64_t, transport::OpSignature> activeOps_;  // begun here, not yet retired
  std::deque<uint64_t> succeeded_;                        // recent ops that completed here, for late errors
  std::string lateFailure_;                               // a peer failed an op that succeeded here
  std::atomic<bool> hasLateFailure_{false};               // lateFailure_ is set: read per op without the lock
  uint64_t retiredSeq_ = 0;
  Fault lastFault_ = Fault::kNone;
  std::set<int> lostRanks_;
  std::string groupLost_;  // set once a peer reported a lost rank: every op from then on fails with it

  // Once the group lost a rank: records that as the failure of every op begun and not retired yet
  // (not failed already), listed in report.failedActive.
  PeerReport withActiveFailedLocked(PeerReport report);
};

}  // namespace pycomm
