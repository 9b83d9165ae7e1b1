#include "shm_collectives.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "../codecs/reduce.h"
#include "op.h"

namespace pycomm::algorithms {

using transport::OpSignature;
using transport::shm::Group;
using transport::shm::StepWait;

namespace {

// `nbytes` moved a slot at a time, one step a slot (at least one step, so every rank takes one):
// `move(step, offset, n, published)` fills this rank's input slot before the step's inputs are
// published (published false) and reads the peers' after (true).
template <typename Move>
void forEachSlot(Group& group, size_t nbytes, const OpSignature& sig, const StepWait& wait, Move&& move) {
  const size_t slotBytes = group.slotBytes();
  const size_t steps = std::max<size_t>(1, (nbytes + slotBytes - 1) / slotBytes);
  for (size_t k = 0; k < steps; ++k) {
    const size_t offset = k * slotBytes;
    const size_t n = std::min(slotBytes, nbytes - std::min(nbytes, offset));
    const uint32_t e = group.beginStep(sig, wait);
    move(e, offset, n, false);
    group.publishInputs(e, wait);
    move(e, offset, n, true);
  }
}

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

// Whether [a, a + an) and [b, b + bn) share a byte.
bool overlap(const void* a, size_t an, const void* b, size_t bn) {
  const auto a0 = reinterpret_cast<uintptr_t>(a);
  const auto b0 = reinterpret_cast<uintptr_t>(b);
  return an > 0 && bn > 0 && a0 < b0 + bn && b0 < a0 + an;
}

}  // namespace

void shmAllreduce(Group& group, void* data, size_t count, DataType dtype, ReduceOp op, const OpSignature& sig,
                  const StepWait& wait) {
  shmAllreduce(group, BufferList::single(data, count * elementSize(dtype)), count, dtype, op, sig, wait);
}

void shmAllreduce(Group& group, const BufferList& data, size_t count, DataType dtype, ReduceOp op,
                  const OpSignature& sig, const StepWait& wait) {
  const int rank = group.rank();
  const int size = group.size();
  const size_t esize = elementSize(dtype);
  const size_t chunkElems = std::max<size_t>(1, group.slotBytes() / esize);
  const size_t chunks = std::max<size_t>(1, (count + chunkElems - 1) / chunkElems);
  const bool shortMessage = count * esize <= kShmShortAllreduceBytes;
  std::vector<const void*> sources(size);
  for (size_t k = 0; k < chunks; ++k) {
    const size_t offset = k * chunkElems;
    const size_t n = std::min(chunkElems, count - std::min(count, offset));
    const size_t at = offset * esize;  // this chunk's first byte in `data`
    const uint32_t e = group.beginStep(sig, wait);
    Segments slices(n, size);
    const size_t so = slices.offset(rank) * esize, sl = slices.length(rank) * esize;
    // This rank's slice, read in place when it lies inside one piece of `data`.
    const uint8_t* own = shortMessage ? nullptr : data.contiguous(at + so, sl);
    if (own == nullptr) {
      data.copyOut(at, n * esize, group.input(rank, e));
    } else {
      // Only the slices other ranks reduce.
      data.copyOut(at, so, group.input(rank, e));
      data.copyOut(at + so + sl, n * esize - so - sl, group.input(rank, e) + so + sl);
    }
    group.publishInputs(e, wait);
    if (shortMessage) {
      // Every rank reduces all inputs in rank order: identical bits everywhere, one sync. Straight
      // into `data` when the chunk is one piece, else through this rank's result slot.
      for (int q = 0; q < size; ++q) sources[q] = group.input(q, e);
      uint8_t* mine = data.contiguous(at, n * esize);
      codecs::reduceMany(mine != nullptr ? mine : group.result(rank, e), sources.data(), size, n, dtype, op);
      if (mine == nullptr) data.copyIn(at, n * esize, group.result(rank, e));
    } else {
      for (int q = 0; q < size; ++q) sources[q] = q == rank && own != nullptr ? own : group.input(q, e) + so;
      codecs::reduceMany(group.result(rank, e) + so, sources.data(), size, slices.length(rank), dtype, op);
      group.publishResults(e, wait);
      for (int q = 0; q < size; ++q) {
        const size_t qo = slices.offset(q) * esize;
        data.copyIn(at + qo, slices.length(q) * esize, group.result(q, e) + qo);
      }
    }
  }
}

void shmBroadcast(Group& group, void* data, size_t nbytes, int root, const OpSignature& sig, const StepWait& wait) {
  auto* bytes = static_cast<uint8_t*>(data);
  forEachSlot(group, nbytes, sig, wait, [&](uint32_t e, size_t offset, size_t n, bool published) {
    if (n == 0 || (group.rank() == root) == published) return;
    if (published) {
      std::memcpy(bytes + offset, group.input(root, e), n);
    } else {
      std::memcpy(group.input(root, e), bytes + offset, n);
    }
  });
}

void shmAllgather(Group& group, const void* in, void* out, size_t nbytes, const OpSignature& sig,
                  const StepWait& wait) {
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  uint8_t* own = dst + group.rank() * nbytes;
  // An input elsewhere in the output would be overwritten by a peer's block before its last slot
  // is sent: it moves into this rank's block first, from where the steps send it as they write it.
  if (src != own && overlap(src, nbytes, dst, group.size() * nbytes)) {
    std::memmove(own, src, nbytes);
    src = own;
  }
  forEachSlot(group, nbytes, sig, wait, [&](uint32_t e, size_t offset, size_t n, bool published) {
    if (n == 0) return;
    if (!published) {
      std::memcpy(group.input(group.rank(), e), src + offset, n);
      return;
    }
    for (int q = 0; q < group.size(); ++q) std::memcpy(dst + q * nbytes + offset, group.input(q, e), n);
  });
}

void shmReduceScatter(Group& group, const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                      const OpSignature& sig, const StepWait& wait) {
  const int rank = group.rank();
  const int size = group.size();
  const size_t esize = elementSize(dtype);
  // A step carries one chunk of every rank's block: the slot holds p of them.
  const size_t chunkElems = std::max<size_t>(1, group.slotBytes() / (esize * size));
  const size_t chunks = std::max<size_t>(1, (count + chunkElems - 1) / chunkElems);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  // An output that is this rank's block of the input is written only where the step has read it
  // already. Anywhere else inside the input, a chunk's result would overwrite what a later step
  // still reads: the steps read a copy of the input taken first.
  std::vector<uint8_t> snapshot;
  if (dst != src + rank * count * esize && overlap(dst, count * esize, src, size * count * esize)) {
    snapshot.assign(src, src + size * count * esize);
    src = snapshot.data();
  }
  const bool ownFromInput = !overlap(dst, count * esize, src, size * count * esize);
  std::vector<const void*> sources(size);
  for (size_t k = 0; k < chunks; ++k) {
    const size_t offset = k * chunkElems;
    const size_t n = std::min(chunkElems, count - std::min(count, offset));
    const uint32_t e = group.beginStep(sig, wait);
    // Every block but this rank's own, which it reads from its input directly (unless the output
    // overlaps the input: the reduction would then overwrite a source it still has to read).
    for (int j = 0; j < size && n > 0; ++j) {
      if (j != rank || !ownFromInput) {
        std::memcpy(group.input(rank, e) + j * chunkElems * esize, src + (j * count + offset) * esize, n * esize);
      }
    }
    group.publishInputs(e, wait);
    for (int q = 0; q < size; ++q) {
      sources[q] = q == rank && ownFromInput ? src + (rank * count + offset) * esize
                                             : group.input(q, e) + rank * chunkElems * esize;
    }
    codecs::reduceMany(dst + offset * esize, sources.data(), size, n, dtype, op);
  }
}

void shmReduceScatterParts(Group& group, void* data, const std::vector<size_t>& offsets, DataType dtype, ReduceOp op,
                           const OpSignature& sig, const StepWait& wait) {
  const int rank = group.rank();
  const int size = group.size();
  auto* bytes = static_cast<uint8_t*>(data);
  const size_t esize = elementSize(dtype);
  // A step carries one stretch of every part: the slot holds p of them, each on its own cache lines.
  const size_t stretch = std::max<size_t>(64, group.slotBytes() / size / 64 * 64);
  const PartStretches parts{offsets, stretch};
  const size_t steps = parts.steps();
  std::vector<const void*> sources(size);
  for (size_t k = 0; k < steps; ++k) {
    const uint32_t e = group.beginStep(sig, wait);
    for (int q = 0; q < size; ++q) {
      auto [offset, n] = parts.at(q, k);
      if (q != rank && n > 0) std::memcpy(group.input(rank, e) + q * stretch, bytes + offset, n);
    }
    group.publishInputs(e, wait);
    auto [offset, n] = parts.at(rank, k);
    if (n > 0) {
      for (int q = 0; q < size; ++q) sources[q] = q == rank ? bytes + offset : group.input(q, e) + rank * stretch;
      // Through the result slot: the reduction may not overwrite a source it still reads.
      codecs::reduceMany(group.result(rank, e), sources.data(), size, n / esize, dtype, op);
      std::memcpy(bytes + offset, group.result(rank, e), n);
    }
  }
}

void shmAllgatherParts(Group& group, void* data, const std::vector<size_t>& offsets, const OpSignature& sig,
                       const StepWait& wait) {
  const int rank = group.rank();
  auto* bytes = static_cast<uint8_t*>(data);
  const PartStretches parts{offsets, group.slotBytes()};
  const size_t chunks = parts.steps();
  for (size_t k = 0; k < chunks; ++k) {
    const uint32_t e = group.beginStep(sig, wait);
    auto [offset, n] = parts.at(rank, k);
    if (n > 0) std::memcpy(group.input(rank, e), bytes + offset, n);
    group.publishInputs(e, wait);
    for (int q = 0; q < group.size(); ++q) {
      auto [qOffset, qn] = parts.at(q, k);
      if (q != rank && qn > 0) std::memcpy(bytes + qOffset, group.input(q, e), qn);
    }
  }
}

void shmBarrier(Group& group, const OpSignature& sig, const StepWait& wait) {
  const uint32_t e = group.beginStep(sig, wait);
  group.publishInputs(e, wait);
}

}  // namespace pycomm::algorithms
