#include "segment_group.h"

#include <sched.h>

#include <algorithm>
#include <new>
#include <thread>

#include "../../dtype.h"

namespace pycomm::transport::shm {
namespace {

size_t alignUp(size_t n) { return (n + 4095) & ~size_t{4095}; }

// The cores this process may run on (taskset, a container's cpuset), not the machine's: ranks
// pinned to fewer cores than they are outnumber them.
unsigned usableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return static_cast<unsigned>(std::max(1, CPU_COUNT(&set)));
  return std::max(1u, std::thread::hardware_concurrency());
}

uint64_t packHead(const OpSignature& s) {
  return uint64_t{static_cast<uint8_t>(s.kind)} | uint64_t{s.dtype} << 8 | uint64_t{s.reduceOp} << 16 |
         uint64_t{s.codec} << 24 | uint64_t{static_cast<uint32_t>(s.root)} << 32;
}

OpSignature unpack(uint64_t head, uint64_t count) {
  OpSignature s;
  s.kind = static_cast<OpKind>(head & 0xff);
  s.dtype = static_cast<uint8_t>(head >> 8);
  s.reduceOp = static_cast<uint8_t>(head >> 16);
  s.codec = static_cast<uint8_t>(head >> 24);
  s.root = static_cast<int32_t>(static_cast<uint32_t>(head >> 32));
  s.count = count;
  return s;
}

}  // namespace

SegmentGroup::SegmentGroup(int rank, int size, size_t slotBytes, size_t ringBytes, const std::string& name,
                           const std::function<void(const SegmentGroup&)>& mapped,
                           const std::function<std::string(bool, bool, const std::string&)>& agree, std::vector<int> members)
    : Group(rank, size, alignUp(slotBytes)),
      // p * p rings: larger groups get smaller rings, so that they take 16 MiB at most.
      ringBytes_(std::min(ringBytes, std::max<size_t>(256 * 1024, (16u << 20) / (static_cast<size_t>(size) * size)))),
      // Polling only pays while every rank has a core: with more ranks than cores the peer we wait
      // for may need this very core, and a sleeping wait hands it over at once.
      spin_(static_cast<unsigned>(size) <= usableCores() ? kSpin : std::chrono::microseconds(0)),
      // There, the peer we wait for is most often runnable and waiting for a core: yielding hands
      // it ours at once, where a futex sleep would add the wake-up of this rank to every step.
      yield_(spin_.count() == 0 ? kYield : std::chrono::microseconds(0)),
      members_(std::move(members)) {
  // Controls, then four slots per rank, then one ring per ordered pair (the diagonal unused). A
  // fresh segment is zero-filled, which is a ring's initial state; only touched pages take memory.
  const size_t bytes =
      slotsOffset() + size * 4 * this->slotBytes() + size * size * alignUp(Ring::bytesFor(ringBytes_));
  try {
    std::string why;  // why this rank has no mapping
    bool created = false;
    try {
      segment_ = std::make_shared<Segment>(Segment::createOrOpen(name, bytes, &created));
      // What every rank touches before anyone writes to it: the controls. Nobody writes to them
      // before `agree` returns, so the creator lays them out in the meantime.
      const std::string failed = reservePages(segment_->data(), slotsOffset());
      PYCOMM_CHECK(failed.empty(), RemoteError, failed, " (the controls of ", name, ")");
      if (created) {
        new (segment_->data()) GroupState();
        for (int q = 0; q < size; ++q) new (segment_->data() + kControlsOffset + q * sizeof(Control)) Control();
      }
    } catch (const RemoteError& e) {
      why = e.what();  // /dev/shm full, say
    }
    // Each rank reserves the start of every ring it writes (the header its consumer polls, and
    // room for the first frames); the rest as it writes (Ring::reserveFor), and its slots as its
    // ops first write them (reserveSlots). Reserving the rings whole here cost 8-13 ms of a 15-20
    // ms group setup at world 4 on two cores.
    for (int q = 0; q < size && why.empty(); ++q) {
      if (q != rank) why = reservePages(ringBase(rank, q), std::min(Ring::bytesFor(ringBytes_), kReserveGrain));
    }
    if (why.empty()) {
      setSlots(segment_->data() + slotsOffset());
      mapped(*this);
    }
    if (const std::string disagreement = agree(why.empty(), created, why); !disagreement.empty()) {
      throw SharedMemoryUnavailable(strCat("shared memory ", name, " is not shared by every rank: ", disagreement));
    }
  } catch (...) {
    Segment::unlinkName(name);
    throw;
  }
  // Every rank has opened it (each voted after it had): any rank may remove the name now, and each
  // does, so that a creator killed right after the vote leaves nothing behind.
  Segment::unlinkName(name);
  segment_->unlink();
}

SegmentGroup::GroupState& SegmentGroup::state() const { return *reinterpret_cast<GroupState*>(segment_->data()); }

SegmentGroup::Control& SegmentGroup::control(int q) const {
  return *reinterpret_cast<Control*>(segment_->data() + kControlsOffset + q * sizeof(Control));
}

size_t SegmentGroup::slotsOffset() const { return alignUp(kControlsOffset + sizeof(Control) * size()); }

uint8_t* SegmentGroup::ringBase(int from, int to) const {
  const size_t stride = alignUp(Ring::bytesFor(ringBytes_));
  return segment_->data() + slotsOffset() + size() * 4 * slotBytes() + (static_cast<size_t>(from) * size() + to) * stride;
}

Ring SegmentGroup::ring(int from, int to) const { return Ring(ringBase(from, to), ringBytes_); }

void SegmentGroup::reserveSlots(const OpSignature& sig, const StepWait& wait) {
  // A step writes at most a slot into each of this rank's slots. Plain all-reduces, all-gathers
  // and broadcasts write no more of them than the op's count (per rank) of elements; other
  // schedules lay their parts out across the slot (a reduce-scatter's j-th part at j/size of it,
  // a codec's blocks), so they reserve it whole.
  const bool byCount = sig.codec == 0 && sig.count > 0 &&
                       (sig.kind == OpKind::kAllreduce || sig.kind == OpKind::kAllgather || sig.kind == OpKind::kBroadcast);
  size_t need = slotBytes();
  if (sig.kind == OpKind::kBarrier) {
    need = 0;
  } else if (byCount) {
    const size_t esize = std::max<size_t>(elementSize(static_cast<DataType>(sig.dtype)), 1);
    need = sig.count > slotBytes() / esize ? slotBytes() : sig.count * esize;
  }
  if (need <= slotsReserved_) return;
  const size_t wanted = grownReservation(slotsReserved_, need, slotBytes());
  for (int slot = 0; slot < 4; ++slot) {
    uint8_t* base = slot < 2 ? input(rank(), slot) : result(rank(), slot);
    if (std::string failed = reservePages(base + slotsReserved_, wanted - slotsReserved_); !failed.empty()) {
      abandon(wait.seq);
      throw RemoteError(strCat(wait.context, ": ", failed, " (rank ", member(rank()),
                               "'s slots); this op fails, and the group's next ones run over its connections"));
    }
  }
  slotsReserved_ = wanted;
}

void SegmentGroup::announce(uint64_t seq, const OpSignature& sig) {
  Announcement& a = control(rank()).announced;
  a.seq.store(0);
  a.head.store(packHead(sig));
  a.count.store(sig.count);
  a.seq.store(seq);  // seq_cst, then the caller reads the peers': one of two such ranks sees the other
}

std::string SegmentGroup::conflict(uint64_t seq, const OpSignature& sig, std::string_view context) const {
  for (int q = 0; q < size(); ++q) {
    if (q == rank()) continue;
    const Announcement& a = control(q).announced;
    if (a.seq.load() != seq) continue;
    const OpSignature theirs = unpack(a.head.load(), a.count.load());
    if (a.seq.load() != seq || theirs == sig) continue;  // rewritten meanwhile, or the same op
    return strCat(context, ": mismatched collectives across ranks: rank ", member(rank()), " runs ", sig.describe(),
                  " but rank ", member(q), " runs ", theirs.describe());
  }
  return {};
}

void SegmentGroup::abandon(uint64_t fromSeq) {
  GroupState& s = state();
  uint64_t current = s.abandonFrom.load();
  while ((current == 0 || fromSeq < current) && !s.abandonFrom.compare_exchange_weak(current, fromSeq)) {
  }
  int32_t none = -1;
  s.abandonedBy.compare_exchange_strong(none, member(rank()));
}

bool SegmentGroup::abandonedAt(uint64_t seq) const {
  const uint64_t from = state().abandonFrom.load(std::memory_order_acquire);
  return from != 0 && from <= seq;
}

void SegmentGroup::checkWhileWaiting(int q, const StepWait& wait) const {
  if (q != rank()) {
    if (auto failure = wait.peerFailure(member(q))) std::rethrow_exception(failure);
  }
  if (wait.reportedFailure) {
    if (std::string failure = wait.reportedFailure(wait.seq); !failure.empty()) throw RemoteError(failure);
  }
  if (std::string mismatch = conflict(wait.seq, current_, wait.context);
      !mismatch.empty()) {
    throw InvalidUsageError(mismatch);
  }
  PYCOMM_CHECK(!abandonedAt(wait.seq), RemoteError, wait.context, ": rank ", state().abandonedBy.load(),
               " gave shared memory up after a failure; this op fails, and the group's next ones run over its "
               "connections");
}

void SegmentGroup::waitAll(Flag flag, uint32_t target, const StepWait& wait, const char* what) {
  for (int q = 0; q < size(); ++q) {
    Control& c = control(q);
    SharedFlag& f = flag == Flag::kReady ? c.ready : c.reduced;
    // Spinning and yielding on the first try only: a wait that then sleeps is a long one.
    for (bool first = true; !waitAtLeast(f, target, std::chrono::milliseconds(2), first ? spin_ : kNoWait,
                                         first ? yield_ : kNoWait);
         first = false) {
      checkWhileWaiting(q, wait);
      if (std::chrono::steady_clock::now() < wait.deadline) continue;
      const std::string lost = wait.timedOut ? wait.timedOut(member(q)) : std::string();
      throw TimeoutError(strCat(wait.context, ": timed out waiting for peer ", member(q), " (shared memory, ", what, ")",
                                lost));
    }
  }
}

uint32_t SegmentGroup::beginStep(const OpSignature& sig, const StepWait& wait) {
  reserveSlots(sig, wait);
  const uint32_t epoch = ++epoch_;
  current_ = sig;
  // This parity's slots and step record were last used two steps ago, and every rank is done with
  // them: each published its inputs of the last step (this rank waited for that) only after it
  // finished the step before, the one of this parity (group.h).
  control(rank()).step[epoch % 2] = Step{sig, wait.seq};
  return epoch;
}

void SegmentGroup::publishInputs(uint32_t epoch, const StepWait& wait) {
  publish(control(rank()).ready, epoch);
  waitAll(Flag::kReady, epoch, wait, "inputs");
  const Step& mine = control(rank()).step[epoch % 2];
  for (int q = 0; q < size(); ++q) {
    const Step& theirs = control(q).step[epoch % 2];
    PYCOMM_CHECK(theirs.signature == mine.signature, InvalidUsageError, wait.context,
                 ": mismatched collectives across ranks: rank ", member(rank()), " runs ", mine.signature.describe(),
                 " but rank ", member(q), " runs ", theirs.signature.describe());
    PYCOMM_CHECK(theirs.seq == mine.seq, InvalidUsageError, wait.context,
                 ": mismatched collectives across ranks: rank ", member(rank()), " runs its op #", mine.seq, " (",
                 mine.signature.describe(), ") where rank ", member(q), " runs its op #", theirs.seq,
                 " (an op ran on some ranks only)");
  }
}

void SegmentGroup::publishResults(uint32_t epoch, const StepWait& wait) {
  publish(control(rank()).reduced, epoch);
  waitAll(Flag::kReduced, epoch, wait, "reduced slices");
}

}  // namespace pycomm::transport::shm
