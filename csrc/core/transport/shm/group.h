// What a schedule sees of the ranks that share a host's memory: their number, every rank's slots,
// and the steps that order the ranks' reads and writes of them. The schedules written over it
// (algorithms/shm_collectives.h) never see the segment, the flags or the waits underneath;
// segment_group.h is the one group there is, over a POSIX shared-memory segment.
//
// Slots: every rank q owns, per buffer parity, an input slot and a result slot of slotBytes()
// bytes, which every rank can read. An op runs in steps ("epochs"), one per chunk; two parities
// let step e+1 fill its slots while peers still read those of step e. A step is
//   e = beginStep(sig, wait)     the step is this op's
//   ... write input(rank(), e) ...
//   publishInputs(e, wait)       every rank's input slot is written (and every rank runs this op)
//   ... read input(q, e), write result(rank(), e) ...
//   publishResults(e, wait)      (optional) every rank's result slot is written
//   ... read result(q, e) ...
// and a rank's next step starts once it read all it reads of this one. Every step publishes its
// inputs, so no step needs to wait for its slots to be free: a rank writes step e+2's slots (this
// parity's) after step e+1's publishInputs, which every rank reached only once done with step e.
// A small op is then one flag write and one wait per rank. Each wait has the op's deadline and
// notices a dead peer, a peer that runs another op or reported a failure of this one, and the group
// leaving shared memory (abandon()).
//
// The steps are virtual (a few calls per chunk); the slots' addresses are not, as schedules take
// them in their loops over ranks.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <string_view>

#include "../frame.h"

namespace pycomm::transport::shm {

// How a step waits: until when, for which op, and what ends the wait early.
struct StepWait {
  std::chrono::steady_clock::time_point deadline;
  // The op's, which outlives its steps: viewed, not copied (a copy is an allocation per op).
  std::string_view context;
  // The error that ended the connection to communicator rank r, or null.
  std::function<std::exception_ptr(int)> peerFailure;
  uint64_t seq = 0;  // the op's sequence number, the same on every rank
  // A peer's report that op `seq` failed there (the transport hears it), or empty.
  std::function<std::string(uint64_t)> reportedFailure;
  // Told the communicator rank a step waited for past the deadline, before the TimeoutError; returns
  // what the error's message adds (Transport::judgeTimeout).
  std::function<std::string(int)> timedOut;
};

class Group {
 public:
  virtual ~Group() = default;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The bytes of one slot: a step moves at most this much per rank and slot.
  size_t slotBytes() const { return slotBytes_; }
  // Rank q's input and result slots for step `epoch`.
  uint8_t* input(int q, uint32_t epoch) const { return slots_ + (q * 4 + (epoch % 2)) * slotBytes_; }
  uint8_t* result(int q, uint32_t epoch) const { return slots_ + (q * 4 + 2 + (epoch % 2)) * slotBytes_; }

  // Starts a step of the op `sig` (this rank read all it reads of its previous step).
  virtual uint32_t beginStep(const OpSignature& sig, const StepWait& wait) = 0;
  // Publishes this rank's input slot and waits for every rank's; fails if a rank runs another op.
  virtual void publishInputs(uint32_t epoch, const StepWait& wait) = 0;
  // Publishes this rank's result slot and waits for every rank's.
  virtual void publishResults(uint32_t epoch, const StepWait& wait) = 0;

  // Every op of the communicator, whichever path it takes, is announced first: a rank in an op
  // carried by frames (reduce, gather, a compressed all-reduce...) compares the announcements at
  // once (conflict()), and a rank stuck in a step compares them while it waits, so when some ranks
  // run a step here and others an op of another path, whichever comes second sees it, and every
  // rank fails within milliseconds naming both ops instead of waiting for the timeout.
  virtual void announce(uint64_t seq, const OpSignature& sig) = 0;
  // A mismatch message if a peer announced op `seq` with another signature, else empty.
  virtual std::string conflict(uint64_t seq, const OpSignature& sig, std::string_view context) const = 0;
  // After a failure inside a step the ranks' epochs may disagree, so the group gives shared memory
  // up: from op `fromSeq` on, no rank runs a step here (the lowest such seq announced by any rank
  // wins). A rank already in a step of such an op fails it (one op at most), so no rank waits here
  // for a peer that went to the sockets.
  virtual void abandon(uint64_t fromSeq) = 0;
  // Whether op `seq` must keep off shared memory.
  virtual bool abandonedAt(uint64_t seq) const = 0;

 protected:
  Group(int rank, int size, size_t slotBytes) : rank_(rank), size_(size), slotBytes_(slotBytes) {}
  // Where rank 0's first slot lies; the slots follow one another, four per rank, each slotBytes().
  void setSlots(uint8_t* slots) { slots_ = slots; }

 private:
  const int rank_;
  const int size_;
  const size_t slotBytes_;
  uint8_t* slots_ = nullptr;
};

}  // namespace pycomm::transport::shm
