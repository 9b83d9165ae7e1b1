#include "ring.h"

#include <algorithm>
#include <vector>

#include "../codecs/reduce.h"

namespace pycomm::algorithms {
namespace {

int mod(int a, int p) { return ((a % p) + p) % p; }

// Chunk c of segment `seg`: an element offset into the buffer and a length (possibly 0).
struct Chunk {
  size_t offset;
  size_t length;
};

Chunk chunkOf(const Segments& segments, int seg, size_t c, size_t chunkElems) {
  const size_t begin = std::min(segments.length(seg), c * chunkElems);
  const size_t end = std::min(segments.length(seg), (c + 1) * chunkElems);
  return {segments.offset(seg) + begin, end - begin};
}

// Receives and forwards the all-gather steps; the step-0 sends were issued by the caller.
void allgatherSteps(Op& op, uint8_t* data, const Segments& segments, size_t esize, size_t chunkElems,
                    size_t chunks, uint32_t slotBase,
                    const std::vector<std::shared_ptr<Request>>& recvs) {
  const int p = op.size();
  const int r = op.rank();
  const int right = mod(r + 1, p);
  for (int s = 0; s < p - 1; ++s) {
    const int seg = mod(r - 1 - s, p);
    for (size_t c = 0; c < chunks; ++c) {
      op.wait(recvs[s * chunks + c]);
      if (s + 1 < p - 1) {
        Chunk ch = chunkOf(segments, seg, c, chunkElems);
        op.send(right, slotBase + static_cast<uint32_t>((s + 1) * chunks + c),
                data + ch.offset * esize, ch.length * esize);
      }
    }
  }
}

// Posts every all-gather receive up front, straight into the caller's buffer. Safe although the
// same bytes are still being sent in the reduce-scatter: a segment's final value can only come back
// after this rank's contribution to it left, so the send has already read it.
std::vector<std::shared_ptr<Request>> postAllgatherRecvs(Op& op, uint8_t* data,
                                                         const Segments& segments, size_t esize,
                                                         size_t chunkElems, size_t chunks,
                                                         uint32_t slotBase) {
  const int p = op.size();
  const int r = op.rank();
  const int left = mod(r - 1, p);
  std::vector<std::shared_ptr<Request>> recvs;
  recvs.reserve((p - 1) * chunks);
  for (int s = 0; s < p - 1; ++s) {
    const int seg = mod(r - 1 - s, p);
    for (size_t c = 0; c < chunks; ++c) {
      Chunk ch = chunkOf(segments, seg, c, chunkElems);
      recvs.push_back(op.recv(left, slotBase + static_cast<uint32_t>(s * chunks + c),
                              data + ch.offset * esize, ch.length * esize));
    }
  }
  return recvs;
}

}  // namespace

size_t ringChunkCount(const Segments& segments, size_t chunkElems) {
  return std::max<size_t>(1, (segments.maxLength() + chunkElems - 1) / chunkElems);
}

size_t ringScratchBytes(const Segments& segments, size_t chunkElems, DataType dtype) {
  chunkElems = chunkWithin(chunkElems, segments.maxLength());
  // Two steps' worth of chunks, so the receive for step s+2 can be posted while step s+1 lands.
  return 2 * ringChunkCount(segments, chunkElems) * chunkElems * elementSize(dtype);
}

void ringAllreduce(Op& op, const RingBuffers& buffers, const Segments& segments, DataType dtype,
                   ReduceOp reduceOp, size_t chunkElems, bool allgather) {
  chunkElems = chunkWithin(chunkElems, segments.maxLength());
  const int p = op.size();
  if (p == 1) return;
  const int r = op.rank();
  const int left = mod(r - 1, p);
  const int right = mod(r + 1, p);
  const size_t esize = elementSize(dtype);
  const size_t chunks = ringChunkCount(segments, chunkElems);
  const uint32_t agBase = static_cast<uint32_t>((p - 1) * chunks);
  uint8_t* data = buffers.data;
  auto tmp = [&](int s, size_t c) { return buffers.scratch + ((s % 2) * chunks + c) * chunkElems * esize; };
  auto slot = [&](int s, size_t c) { return static_cast<uint32_t>(s * chunks + c); };

  // Receives for the first two steps; later ones are posted as scratch frees up.
  std::vector<std::shared_ptr<Request>> rsRecvs((p - 1) * chunks);
  for (int s = 0; s < std::min(2, p - 1); ++s) {
    const int seg = mod(r - 2 - s, p);
    for (size_t c = 0; c < chunks; ++c) {
      rsRecvs[slot(s, c)] = op.recv(left, slot(s, c), tmp(s, c), chunkOf(segments, seg, c, chunkElems).length * esize);
    }
  }
  std::vector<std::shared_ptr<Request>> agRecvs;
  if (allgather) agRecvs = postAllgatherRecvs(op, data, segments, esize, chunkElems, chunks, agBase);

  const int firstSeg = mod(r - 1, p);
  for (size_t c = 0; c < chunks; ++c) {
    Chunk ch = chunkOf(segments, firstSeg, c, chunkElems);
    op.send(right, slot(0, c), data + ch.offset * esize, ch.length * esize);
  }
  for (int s = 0; s < p - 1; ++s) {
    const int seg = mod(r - 2 - s, p);
    for (size_t c = 0; c < chunks; ++c) {
      op.wait(rsRecvs[slot(s, c)]);
      Chunk ch = chunkOf(segments, seg, c, chunkElems);
      uint8_t* mine = data + ch.offset * esize;
      codecs::reduceInto(mine, tmp(s, c), ch.length, dtype, reduceOp);
      if (s + 1 < p - 1) {
        op.send(right, slot(s + 1, c), mine, ch.length * esize);
      } else if (allgather) {
        op.send(right, agBase + static_cast<uint32_t>(c), mine, ch.length * esize);
      }
      if (s + 2 < p - 1) {
        const int nextSeg = mod(r - 2 - (s + 2), p);
        rsRecvs[slot(s + 2, c)] = op.recv(left, slot(s + 2, c), tmp(s + 2, c),
                                          chunkOf(segments, nextSeg, c, chunkElems).length * esize);
      }
    }
  }
  if (allgather) allgatherSteps(op, data, segments, esize, chunkElems, chunks, agBase, agRecvs);
  op.waitAll();
}

void ringAllgather(Op& op, uint8_t* data, const Segments& segments, size_t esize, size_t chunkElems) {
  const int p = op.size();
  if (p == 1) return;
  const int r = op.rank();
  const int right = mod(r + 1, p);
  const size_t chunks = ringChunkCount(segments, chunkElems);
  auto recvs = postAllgatherRecvs(op, data, segments, esize, chunkElems, chunks, 0);
  for (size_t c = 0; c < chunks; ++c) {
    Chunk ch = chunkOf(segments, r, c, chunkElems);
    op.send(right, static_cast<uint32_t>(c), data + ch.offset * esize, ch.length * esize);
  }
  allgatherSteps(op, data, segments, esize, chunkElems, chunks, 0, recvs);
  op.waitAll();
}

}  // namespace pycomm::algorithms
