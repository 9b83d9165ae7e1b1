// Collectives among ranks that share a host, through one shared-memory segment.
//
// Every rank owns a control block (flags it advances, each on its own cache line) and, per buffer
// parity, an input slot and a result slot of `slotBytes`. An op runs in steps ("epochs"), one per
// chunk; two parities let step e+1 fill its slots while peers still read those of step e.
//  - all-reduce, short: each rank copies its chunk in once, and every rank reduces all inputs itself
//    (one synchronization per chunk, no second pass);
//  - all-reduce, long: each rank reduces its 1/p slice of the chunk into its result slot, then all
//    copy every slice out (reduce-scatter then all-gather, pipelined chunk by chunk);
//  - broadcast, all-gather, reduce-scatter and barrier follow the same pattern.
// The segment also holds a byte ring for every ordered pair of ranks, through which the TCP
// transport moves the frames of every other op (all-to-all, gather, scatter, reduce, send/recv).
// Each step publishes the op's signature and sequence number, so ranks running different ops fail
// on the first step. Waits spin briefly and then sleep on a futex; every wait has the op's deadline
// and notices a peer whose connection died.
//
// Every op of the group, whichever path it takes, is announced first (announce()): a rank in an op
// carried by frames (reduce, gather, a compressed all-reduce...) compares the announcements at once
// (conflict()), and a rank stuck in a step here compares them while it waits, so when some ranks
// run a step here and others an op of another path, whichever comes second sees it, and every rank
// fails within milliseconds naming both ops instead of waiting for the timeout.
//
// After a failure inside a step the ranks' epochs may disagree, so the group gives shared memory
// up (abandon()): from a sequence number on, every rank runs these ops over the transport. A rank
// already in a step of such an op fails it (one op at most), so no rank waits here for a peer that
// went to the sockets.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../buffer_list.h"
#include "../dtype.h"
#include "../error.h"
#include "../transport/frame.h"
#include "../transport/request.h"
#include "../transport/shm/futex.h"
#include "../transport/shm/ring.h"
#include "../transport/shm/segment.h"

namespace pycomm::algorithms {

using transport::Clock;
using transport::OpSignature;

// Some rank of the group could not create or map the segment (a /dev/shm of its own, a full one):
// every rank learns it at the same point of setup, and the group goes without shared memory.
class SharedMemoryUnavailable : public RemoteError {
 public:
  using RemoteError::RemoteError;
};

struct ShmWait {
  Clock::time_point deadline;
  std::string context;
  // The error that ended the connection to communicator rank r, or null.
  std::function<std::exception_ptr(int)> peerFailure;
  uint64_t seq = 0;                                   // the op's sequence number, the same on every rank
  // A peer's report that op `seq` failed there (the transport hears it), or empty.
  std::function<std::string(uint64_t)> reportedFailure;
};

class ShmGroup {
 public:
  // Rank 0 creates the segment `name` and says whether it could through `published`; the others
  // learn it in `awaitCreated` and map it. Each then tells `agree` whether it has the mapping, which
  // returns whether every rank of the communicator has one (otherwise SharedMemoryUnavailable is
  // thrown on every rank); then `mapped` (to attach the rings). `allMapped` must return once every
  // rank has; then the name is unlinked. If setup fails anywhere, every rank removes the name, so
  // a creator that died leaves no file behind. `members` names each group rank's rank in the
  // communicator, for messages.
  ShmGroup(int rank, int size, size_t slotBytes, size_t ringBytes, const std::string& name,
           const std::function<void(bool created)>& published, const std::function<bool()>& awaitCreated,
           const std::function<bool(bool mappedHere, const std::string& why)>& agree,
           const std::function<void(const ShmGroup&)>& mapped, const std::function<void()>& allMapped,
           std::vector<int> members = {});

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The ring that carries bytes from group rank `from` to group rank `to`.
  transport::shm::Ring ring(int from, int to) const;
  // Keeps the mapping alive for whoever holds rings into it.
  std::shared_ptr<void> memory() const { return segment_; }

  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op, const OpSignature& sig, const ShmWait& wait);
  // The same over a buffer in pieces (`count` elements in all), with no packing copy.
  void allreduce(const BufferList& data, size_t count, DataType dtype, ReduceOp op, const OpSignature& sig,
                 const ShmWait& wait);
  void broadcast(void* data, size_t nbytes, int root, const OpSignature& sig, const ShmWait& wait);
  void allgather(const void* in, void* out, size_t nbytes, const OpSignature& sig, const ShmWait& wait);
  void reduceScatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op, const OpSignature& sig,
                     const ShmWait& wait);
  void barrier(const OpSignature& sig, const ShmWait& wait);
  // In place: rank r's part, bytes [offsets[r], offsets[r+1]) of `data`, becomes the reduction of
  // every rank's bytes there; the other parts are left as they were.
  void reduceScatterParts(void* data, const std::vector<size_t>& offsets, DataType dtype, ReduceOp op,
                          const OpSignature& sig, const ShmWait& wait);
  // Every rank contributes data[offsets[r], offsets[r+1]) and receives everyone's part, in place.
  void allgatherParts(void* data, const std::vector<size_t>& offsets, const OpSignature& sig, const ShmWait& wait);

  // Op `seq` starts on this rank with `sig`, whatever path it takes (see the top of this file).
  void announce(uint64_t seq, const OpSignature& sig);
  // A mismatch message if a peer announced op `seq` with another signature, else empty.
  std::string conflict(uint64_t seq, const OpSignature& sig, const std::string& context) const;
  // From op `fromSeq` on, no rank runs a step here. The lowest such seq announced by any rank wins.
  void abandon(uint64_t fromSeq);
  // Whether op `seq` must keep off shared memory.
  bool abandonedAt(uint64_t seq) const;

  // Below this many bytes an all-reduce has every rank reduce all inputs (one sync per chunk).
  static constexpr size_t kShortAllreduceBytes = 64 * 1024;

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
    transport::shm::SharedFlag ready;
    transport::shm::SharedFlag reduced;
    transport::shm::SharedFlag consumed;
    Step step[2];  // per buffer parity, so a peer's next step cannot overwrite it early
    Announcement announced;
  };
  // At the start of the segment: whether the group gave shared memory up, and from which op.
  struct alignas(64) GroupState {
    std::atomic<uint64_t> abandonFrom{0};  // 0: never
    std::atomic<int32_t> abandonedBy{-1};
  };
  static constexpr size_t kControlsOffset = 64;
  static_assert(sizeof(GroupState) <= kControlsOffset, "the group state fits before the controls");

  GroupState& state() const;
  Control& control(int q) const;
  // A waiting step's look around, each time a futex wait times out: a dead peer, a peer that
  // runs another op or reported a failure of this one, or the group leaving shared memory.
  void checkWhileWaiting(int q, const ShmWait& wait) const;
  int member(int q) const { return members_.empty() ? q : members_[q]; }
  uint8_t* input(int q, uint32_t epoch) const;
  uint8_t* result(int q, uint32_t epoch) const;

  // Starts a step: waits until every rank is done with this parity's slots, publishes `sig`.
  uint32_t begin(const OpSignature& sig, const ShmWait& wait);
  void arrive(uint32_t epoch, const ShmWait& wait);  // publish ready, wait for everyone's, check sigs
  void finish(uint32_t epoch);
  enum class Flag { kReady, kReduced, kConsumed };
  void waitAll(Flag flag, uint32_t target, const ShmWait& wait, const char* what);

  const int rank_;
  const int size_;
  const size_t slotBytes_;
  const size_t ringBytes_;
  // How long a wait polls before it sleeps on the futex.
  static constexpr std::chrono::microseconds kSpin{50};
  const std::chrono::microseconds spin_;
  const std::vector<int> members_;
  std::shared_ptr<transport::shm::Segment> segment_;
  uint32_t epoch_ = 0;
  OpSignature current_;  // the signature of the op this rank's steps are in
};

}  // namespace pycomm::algorithms
