// The shared-memory group (group.h) of the ranks that share a host, over one POSIX segment.
//
// The segment holds, in order: the group's state (whether it gave shared memory up, and from which
// op); one control block per rank (the flags it advances, each on its own cache line, the op of its
// steps per parity, and its announcement); four slots per rank (input and result, per parity); and
// a byte ring for every ordered pair of ranks, through which the TCP transport moves the frames of
// every op that takes no step here (all-to-all, gather, scatter, reduce, send/recv).
// Each step publishes the op's signature and sequence number, so ranks running different ops fail
// on the first step. Waits spin briefly and then sleep on a futex (futex.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../../error.h"
#include "futex.h"
#include "group.h"
#include "ring.h"
#include "segment.h"

namespace pycomm::transport::shm {

// Some rank of the group could not create or map the segment (a /dev/shm of its own, a full one):
// every rank learns it at the same point of setup, and the group goes without shared memory.
class SharedMemoryUnavailable : public RemoteError {
 public:
  using RemoteError::RemoteError;
};

class SegmentGroup final : public Group {
 public:
  // Every rank creates the segment `name` or, where another came first, opens it: no rank waits
  // for another here. A rank that has it attaches its rings (`mapped`). Then each tells `agree`
  // whether it has the mapping, why not, and whether it created the segment; `agree` returns once
  // every rank of the communicator has told it: empty if every rank has a mapping and each host's
  // ranks had exactly one creator (two: their /dev/shm differ), otherwise why not, and
  // SharedMemoryUnavailable is thrown on every rank. Every rank then unlinks the name (all have
  // opened it). If setup fails anywhere, every rank removes the name, so a creator that died leaves
  // no file behind. `members` names each group rank's rank in the communicator, for messages.
  SegmentGroup(int rank, int size, size_t slotBytes, size_t ringBytes, const std::string& name,
               const std::function<void(const SegmentGroup&)>& mapped,
               const std::function<std::string(bool mappedHere, bool createdHere, const std::string& why)>& agree,
               std::vector<int> members = {});

  // The ring that carries bytes from group rank `from` to group rank `to`.
  Ring ring(int from, int to) const;
  // Keeps the mapping alive for whoever holds rings into it.
  std::shared_ptr<void> memory() const { return segment_; }

  uint32_t beginStep(const OpSignature& sig, const StepWait& wait) override;
  void publishInputs(uint32_t epoch, const StepWait& wait) override;
  void publishResults(uint32_t epoch, const StepWait& wait) override;

  void announce(uint64_t seq, const OpSignature& sig) override;
  std::string conflict(uint64_t seq, const OpSignature& sig, std::string_view context) const override;
  void abandon(uint64_t fromSeq) override;
  bool abandonedAt(uint64_t seq) const override;

 private:
  // The op a step belongs to, as each rank publishes it.
  struct Step {
    OpSignature signature;
    uint64_t seq;
  };
  // The op a rank runs (announce()): a seqlock whose version is the op's sequence number, which a
  // rank never announces twice. Atomics throughout, as other processes read it while it is written.
  struct alignas(64) Announcement {
    std::atomic<uint64_t> seq{0};  // 0 while being written
    std::atomic<uint64_t> head{0};  // kind, dtype, reduce op, codec, root
    std::atomic<uint64_t> count{0};
  };
  struct alignas(64) Control {
    // One cache line: what every peer reads of this rank at each step, the flag and then its op.
    alignas(64) SharedFlag ready;
    Step step[2];  // per buffer parity, so a peer's next step cannot overwrite it early
    alignas(64) SharedFlag reduced;
    alignas(64) Announcement announced;
  };
  static_assert(offsetof(Control, reduced) == 64, "the ready flag and the step records share one line");
  // At the start of the segment: whether the group gave shared memory up, and from which op.
  struct alignas(64) GroupState {
    std::atomic<uint64_t> abandonFrom{0};  // 0: never
    std::atomic<int32_t> abandonedBy{-1};
  };
  static constexpr size_t kControlsOffset = 64;
  static_assert(sizeof(GroupState) <= kControlsOffset, "the group state fits before the controls");

  GroupState& state() const;
  Control& control(int q) const;
  // The first byte after the controls, where the slots start.
  size_t slotsOffset() const;
  // Where the ring from group rank `from` to `to` lies (its header first).
  uint8_t* ringBase(int from, int to) const;
  // A waiting step's look around, each time a futex wait times out: a dead peer, a peer that
  // runs another op or reported a failure of this one, or the group leaving shared memory.
  void checkWhileWaiting(int q, const StepWait& wait) const;
  int member(int q) const { return members_.empty() ? q : members_[q]; }

  // Reserves this rank's four slots as far as op `sig` writes them (segment.h), before its first
  // step writes there; a failure gives shared memory up from this op on.
  void reserveSlots(const OpSignature& sig, const StepWait& wait);

  enum class Flag { kReady, kReduced };
  void waitAll(Flag flag, uint32_t target, const StepWait& wait, const char* what);

  const size_t ringBytes_;
  // How long a wait polls before it sleeps on the futex while the ranks have a core each, and how
  // long it yields the core instead when they outnumber the cores.
  static constexpr std::chrono::microseconds kSpin{50};
  static constexpr std::chrono::microseconds kYield{200};
  static constexpr std::chrono::microseconds kNoWait{0};
  const std::chrono::microseconds spin_;
  const std::chrono::microseconds yield_;
  const std::vector<int> members_;
  std::shared_ptr<Segment> segment_;
  uint32_t epoch_ = 0;
  size_t slotsReserved_ = 0;  // bytes of each of this rank's slots reserved so far
  OpSignature current_;  // the signature of the op this rank's steps are in
};

}  // namespace pycomm::transport::shm
