#include "shm_collectives.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <thread>

#include "../codecs/reduce.h"
#include "../error.h"
#include "op.h"

namespace pycomm::algorithms {
namespace {

// Parts [offsets[q], offsets[q+1]) of a buffer moved `stretch` bytes at a time, one stretch of every
// part a step: as many steps as the longest part needs (at least one, so every rank takes a step).
struct PartStretches {
  const std::vector<size_t>& offsets;
  size_t stretch;
  size_t steps() const {
    size_t largest = 0;
    for (size_t q = 0; q + 1 < offsets.size(); ++q) largest = std::max(largest, offsets[q + 1] - offsets[q]);
    return std::max<size_t>(1, (largest + stretch - 1) / stretch);
  }
  // Part q's stretch of step k: (first byte, length), the length 0 once the part is done.
  std::pair<size_t, size_t> at(int q, size_t k) const {
    const size_t length = offsets[q + 1] - offsets[q];
    const size_t begin = std::min(length, k * stretch);
    return {offsets[q] + begin, std::min(length, begin + stretch) - begin};
  }
};

}  // namespace

namespace {

size_t alignUp(size_t n) { return (n + 4095) & ~size_t{4095}; }

}  // namespace

ShmGroup::ShmGroup(int rank, int size, size_t slotBytes, size_t ringBytes, const std::string& name,
                   const std::function<void(bool)>& published, const std::function<bool()>& awaitCreated,
                   const std::function<bool(bool, const std::string&)>& agree,
                   const std::function<void(const ShmGroup&)>& mapped, const std::function<void()>& allMapped,
                   std::vector<int> members)
    : rank_(rank),
      size_(size),
      slotBytes_(alignUp(slotBytes)),
      // p * p rings: larger groups get smaller rings, so that they take 16 MiB at most.
      ringBytes_(std::min(ringBytes, std::max<size_t>(256 * 1024, (16u << 20) / (static_cast<size_t>(size) * size)))),
      // Polling only pays while every rank has a core: with more ranks than cores the peer we wait
      // for may need this very core, and a sleeping wait hands it over at once.
      spin_(static_cast<unsigned>(size) <= std::thread::hardware_concurrency() ? kSpin : std::chrono::microseconds(0)),
      members_(std::move(members)) {
  // Controls, then four slots per rank, then one ring per ordered pair (the diagonal unused). A
  // fresh segment is zero-filled, which is a ring's initial state; only touched pages take memory.
  const size_t bytes = alignUp(kControlsOffset + sizeof(Control) * size) + size * 4 * slotBytes_ +
                       size * size * alignUp(transport::shm::Ring::bytesFor(ringBytes_));
  try {
    std::string why;  // why this rank has no mapping
    if (rank == 0) {
      try {
        segment_ = std::make_shared<transport::shm::Segment>(transport::shm::Segment::create(name, bytes));
        new (segment_->data()) GroupState();
        for (int q = 0; q < size; ++q) new (segment_->data() + kControlsOffset + q * sizeof(Control)) Control();
      } catch (const RemoteError& e) {
        why = e.what();
      }
      published(why.empty());
    } else if (!awaitCreated()) {
      why = "the group's first rank on this host could not create the segment";
    } else {
      try {
        segment_ = std::make_shared<transport::shm::Segment>(transport::shm::Segment::open(name, bytes));
      } catch (const RemoteError& e) {
        why = e.what();  // another /dev/shm than the creator's, say (a container of its own)
      }
    }
    if (!agree(why.empty(), why)) {
      throw SharedMemoryUnavailable(strCat("shared memory ", name, " is not mapped on every rank",
                                           why.empty() ? "" : " (here: " + why + ")"));
    }
    mapped(*this);
    allMapped();
  } catch (...) {
    transport::shm::Segment::unlinkName(name);
    throw;
  }
  segment_->unlink();
}

ShmGroup::GroupState& ShmGroup::state() const { return *reinterpret_cast<GroupState*>(segment_->data()); }

ShmGroup::Control& ShmGroup::control(int q) const {
  return *reinterpret_cast<Control*>(segment_->data() + kControlsOffset + q * sizeof(Control));
}

uint8_t* ShmGroup::input(int q, uint32_t epoch) const {
  return segment_->data() + alignUp(kControlsOffset + sizeof(Control) * size_) + (q * 4 + (epoch % 2)) * slotBytes_;
}

uint8_t* ShmGroup::result(int q, uint32_t epoch) const {
  return segment_->data() + alignUp(kControlsOffset + sizeof(Control) * size_) + (q * 4 + 2 + (epoch % 2)) * slotBytes_;
}

transport::shm::Ring ShmGroup::ring(int from, int to) const {
  const size_t stride = alignUp(transport::shm::Ring::bytesFor(ringBytes_));
  uint8_t* base = segment_->data() + alignUp(kControlsOffset + sizeof(Control) * size_) + size_ * 4 * slotBytes_ +
                  (static_cast<size_t>(from) * size_ + to) * stride;
  return transport::shm::Ring(base, ringBytes_);
}

namespace {

uint64_t packHead(const OpSignature& s) {
  return uint64_t{static_cast<uint8_t>(s.kind)} | uint64_t{s.dtype} << 8 | uint64_t{s.reduceOp} << 16 |
         uint64_t{s.codec} << 24 | uint64_t{static_cast<uint32_t>(s.root)} << 32;
}

OpSignature unpack(uint64_t head, uint64_t count) {
  OpSignature s;
  s.kind = static_cast<transport::OpKind>(head & 0xff);
  s.dtype = static_cast<uint8_t>(head >> 8);
  s.reduceOp = static_cast<uint8_t>(head >> 16);
  s.codec = static_cast<uint8_t>(head >> 24);
  s.root = static_cast<int32_t>(static_cast<uint32_t>(head >> 32));
  s.count = count;
  return s;
}

}  // namespace

void ShmGroup::announce(uint64_t seq, const OpSignature& sig) {
  Announcement& a = control(rank_).announced;
  a.seq.store(0);
  a.head.store(packHead(sig));
  a.count.store(sig.count);
  a.seq.store(seq);  // seq_cst, then the caller reads the peers': one of two such ranks sees the other
}

std::string ShmGroup::conflict(uint64_t seq, const OpSignature& sig, const std::string& context) const {
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    const Announcement& a = control(q).announced;
    if (a.seq.load() != seq) continue;
    const OpSignature theirs = unpack(a.head.load(), a.count.load());
    if (a.seq.load() != seq || theirs == sig) continue;  // rewritten meanwhile, or the same op
    return strCat(context, ": mismatched collectives across ranks: rank ", member(rank_), " runs ", sig.describe(),
                  " but rank ", member(q), " runs ", theirs.describe());
  }
  return {};
}

void ShmGroup::abandon(uint64_t fromSeq) {
  GroupState& s = state();
  uint64_t current = s.abandonFrom.load();
  while ((current == 0 || fromSeq < current) && !s.abandonFrom.compare_exchange_weak(current, fromSeq)) {
  }
  int32_t none = -1;
  s.abandonedBy.compare_exchange_strong(none, member(rank_));
}

bool ShmGroup::abandonedAt(uint64_t seq) const {
  const uint64_t from = state().abandonFrom.load(std::memory_order_acquire);
  return from != 0 && from <= seq;
}

void ShmGroup::checkWhileWaiting(int q, const ShmWait& wait) const {
  if (q != rank_) {
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

void ShmGroup::waitAll(Flag flag, uint32_t target, const ShmWait& wait, const char* what) {
  for (int q = 0; q < size_; ++q) {
    Control& c = control(q);
    transport::shm::SharedFlag& f = flag == Flag::kReady ? c.ready : flag == Flag::kReduced ? c.reduced : c.consumed;
    while (!transport::shm::waitAtLeast(f, target, std::chrono::milliseconds(2), spin_)) {
      checkWhileWaiting(q, wait);
      PYCOMM_CHECK(Clock::now() < wait.deadline, TimeoutError, wait.context, ": timed out waiting for peer ", member(q),
                   " (shared memory, ", what, ")");
    }
  }
}

uint32_t ShmGroup::begin(const OpSignature& sig, const ShmWait& wait) {
  const uint32_t epoch = ++epoch_;
  // This parity's slots were last used two steps ago; every rank must be done reading them.
  current_ = sig;
  waitAll(Flag::kConsumed, epoch - 2, wait, "slots to be free");
  // Only now: a peer may still compare this parity's step of two steps ago.
  control(rank_).step[epoch % 2] = Step{sig, wait.seq};
  return epoch;
}

void ShmGroup::arrive(uint32_t epoch, const ShmWait& wait) {
  transport::shm::publish(control(rank_).ready, epoch);
  waitAll(Flag::kReady, epoch, wait, "inputs");
  const Step& mine = control(rank_).step[epoch % 2];
  for (int q = 0; q < size_; ++q) {
    const Step& theirs = control(q).step[epoch % 2];
    PYCOMM_CHECK(theirs.signature == mine.signature, InvalidUsageError, wait.context,
                 ": mismatched collectives across ranks: rank ", member(rank_), " runs ", mine.signature.describe(),
                 " but rank ", member(q), " runs ", theirs.signature.describe());
    PYCOMM_CHECK(theirs.seq == mine.seq, InvalidUsageError, wait.context, ": mismatched collectives across ranks: rank ",
                 member(rank_), " runs its op #", mine.seq, " (", mine.signature.describe(), ") where rank ", member(q),
                 " runs its op #", theirs.seq, " (an op ran on some ranks only)");
  }
}

void ShmGroup::finish(uint32_t epoch) { transport::shm::publish(control(rank_).consumed, epoch); }

void ShmGroup::allreduce(void* data, size_t count, DataType dtype, ReduceOp op, const OpSignature& sig,
                         const ShmWait& wait) {
  allreduce(BufferList::single(data, count * elementSize(dtype)), count, dtype, op, sig, wait);
}

void ShmGroup::allreduce(const BufferList& data, size_t count, DataType dtype, ReduceOp op, const OpSignature& sig,
                         const ShmWait& wait) {
  const size_t esize = elementSize(dtype);
  const size_t chunkElems = std::max<size_t>(1, slotBytes_ / esize);
  const size_t chunks = std::max<size_t>(1, (count + chunkElems - 1) / chunkElems);
  const bool shortMessage = count * esize <= kShortAllreduceBytes;
  std::vector<const void*> sources(size_);
  for (size_t k = 0; k < chunks; ++k) {
    const size_t offset = k * chunkElems;
    const size_t n = std::min(chunkElems, count - std::min(count, offset));
    const size_t at = offset * esize;  // this chunk's first byte in `data`
    const uint32_t e = begin(sig, wait);
    Segments slices(n, size_);
    const size_t so = slices.offset(rank_) * esize, sl = slices.length(rank_) * esize;
    // This rank's slice, read in place when it lies inside one piece of `data`.
    const uint8_t* own = shortMessage ? nullptr : data.contiguous(at + so, sl);
    if (own == nullptr) {
      data.copyOut(at, n * esize, input(rank_, e));
    } else {
      // Only the slices other ranks reduce.
      data.copyOut(at, so, input(rank_, e));
      data.copyOut(at + so + sl, n * esize - so - sl, input(rank_, e) + so + sl);
    }
    arrive(e, wait);
    if (shortMessage) {
      // Every rank reduces all inputs in rank order: identical bits everywhere, one sync. Straight
      // into `data` when the chunk is one piece, else through this rank's result slot.
      for (int q = 0; q < size_; ++q) sources[q] = input(q, e);
      uint8_t* mine = data.contiguous(at, n * esize);
      codecs::reduceMany(mine != nullptr ? mine : result(rank_, e), sources.data(), size_, n, dtype, op);
      if (mine == nullptr) data.copyIn(at, n * esize, result(rank_, e));
    } else {
      for (int q = 0; q < size_; ++q) sources[q] = q == rank_ && own != nullptr ? own : input(q, e) + so;
      codecs::reduceMany(result(rank_, e) + so, sources.data(), size_, slices.length(rank_), dtype, op);
      transport::shm::publish(control(rank_).reduced, e);
      waitAll(Flag::kReduced, e, wait, "reduced slices");
      for (int q = 0; q < size_; ++q) {
        const size_t qo = slices.offset(q) * esize;
        data.copyIn(at + qo, slices.length(q) * esize, result(q, e) + qo);
      }
    }
    finish(e);
  }
}

void ShmGroup::broadcast(void* data, size_t nbytes, int root, const OpSignature& sig, const ShmWait& wait) {
  auto* bytes = static_cast<uint8_t*>(data);
  const size_t chunks = std::max<size_t>(1, (nbytes + slotBytes_ - 1) / slotBytes_);
  for (size_t k = 0; k < chunks; ++k) {
    const size_t offset = k * slotBytes_;
    const size_t n = std::min(slotBytes_, nbytes - std::min(nbytes, offset));
    const uint32_t e = begin(sig, wait);
    if (rank_ == root && n > 0) std::memcpy(input(root, e), bytes + offset, n);
    arrive(e, wait);
    if (rank_ != root && n > 0) std::memcpy(bytes + offset, input(root, e), n);
    finish(e);
  }
}

void ShmGroup::allgather(const void* in, void* out, size_t nbytes, const OpSignature& sig, const ShmWait& wait) {
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  const size_t chunks = std::max<size_t>(1, (nbytes + slotBytes_ - 1) / slotBytes_);
  for (size_t k = 0; k < chunks; ++k) {
    const size_t offset = k * slotBytes_;
    const size_t n = std::min(slotBytes_, nbytes - std::min(nbytes, offset));
    const uint32_t e = begin(sig, wait);
    if (n > 0) std::memcpy(input(rank_, e), src + offset, n);
    arrive(e, wait);
    for (int q = 0; q < size_ && n > 0; ++q) std::memcpy(dst + q * nbytes + offset, input(q, e), n);
    finish(e);
  }
}

void ShmGroup::reduceScatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                             const OpSignature& sig, const ShmWait& wait) {
  const size_t esize = elementSize(dtype);
  // A step carries one chunk of every rank's block: the slot holds p of them.
  const size_t chunkElems = std::max<size_t>(1, slotBytes_ / (esize * size_));
  const size_t chunks = std::max<size_t>(1, (count + chunkElems - 1) / chunkElems);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  const auto in0 = reinterpret_cast<uintptr_t>(src);
  const auto out0 = reinterpret_cast<uintptr_t>(dst);
  const bool ownFromInput = out0 + count * esize <= in0 || in0 + size_ * count * esize <= out0;
  std::vector<const void*> sources(size_);
  for (size_t k = 0; k < chunks; ++k) {
    const size_t offset = k * chunkElems;
    const size_t n = std::min(chunkElems, count - std::min(count, offset));
    const uint32_t e = begin(sig, wait);
    // Every block but this rank's own, which it reads from its input directly (unless the output
    // overlaps the input: the reduction would then overwrite a source it still has to read).
    for (int j = 0; j < size_ && n > 0; ++j) {
      if (j != rank_ || !ownFromInput) {
        std::memcpy(input(rank_, e) + j * chunkElems * esize, src + (j * count + offset) * esize, n * esize);
      }
    }
    arrive(e, wait);
    for (int q = 0; q < size_; ++q) {
      sources[q] = q == rank_ && ownFromInput ? src + (rank_ * count + offset) * esize
                                              : input(q, e) + rank_ * chunkElems * esize;
    }
    codecs::reduceMany(dst + offset * esize, sources.data(), size_, n, dtype, op);
    finish(e);
  }
}

void ShmGroup::reduceScatterParts(void* data, const std::vector<size_t>& offsets, DataType dtype, ReduceOp op,
                                  const OpSignature& sig, const ShmWait& wait) {
  auto* bytes = static_cast<uint8_t*>(data);
  const size_t esize = elementSize(dtype);
  // A step carries one stretch of every part: the slot holds p of them, each on its own cache lines.
  const size_t stretch = std::max<size_t>(64, slotBytes_ / size_ / 64 * 64);
  const PartStretches parts{offsets, stretch};
  const size_t steps = parts.steps();
  auto part = [&](int q, size_t k) { return parts.at(q, k); };
  std::vector<const void*> sources(size_);
  for (size_t k = 0; k < steps; ++k) {
    const uint32_t e = begin(sig, wait);
    for (int q = 0; q < size_; ++q) {
      auto [offset, n] = part(q, k);
      if (q != rank_ && n > 0) std::memcpy(input(rank_, e) + q * stretch, bytes + offset, n);
    }
    arrive(e, wait);
    auto [offset, n] = part(rank_, k);
    if (n > 0) {
      for (int q = 0; q < size_; ++q) sources[q] = q == rank_ ? bytes + offset : input(q, e) + rank_ * stretch;
      // Through the result slot: the reduction may not overwrite a source it still reads.
      codecs::reduceMany(result(rank_, e), sources.data(), size_, n / esize, dtype, op);
      std::memcpy(bytes + offset, result(rank_, e), n);
    }
    finish(e);
  }
}

void ShmGroup::allgatherParts(void* data, const std::vector<size_t>& offsets, const OpSignature& sig,
                              const ShmWait& wait) {
  auto* bytes = static_cast<uint8_t*>(data);
  const PartStretches parts{offsets, slotBytes_};
  const size_t chunks = parts.steps();
  auto part = [&](int q, size_t k) { return parts.at(q, k); };
  for (size_t k = 0; k < chunks; ++k) {
    const uint32_t e = begin(sig, wait);
    auto [offset, n] = part(rank_, k);
    if (n > 0) std::memcpy(input(rank_, e), bytes + offset, n);
    arrive(e, wait);
    for (int q = 0; q < size_; ++q) {
      auto [qOffset, qn] = part(q, k);
      if (q != rank_ && qn > 0) std::memcpy(bytes + qOffset, input(q, e), qn);
    }
    finish(e);
  }
}

void ShmGroup::barrier(const OpSignature& sig, const ShmWait& wait) {
  const uint32_t e = begin(sig, wait);
  arrive(e, wait);
  finish(e);
}

}  // namespace pycomm::algorithms
