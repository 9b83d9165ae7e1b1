#include "queued_collectives.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../error.h"
#include "compressed.h"
#include "rhd.h"
#include "tree.h"

namespace pycomm::algorithms::queued {
namespace {

using Kind = QueuedTransfer::Kind;

int mod(int a, int p) { return ((a % p) + p) % p; }

size_t alignUp(size_t n) { return (n + 63) & ~size_t{63}; }

// Where in `area` (15 bytes to spare) to receive elements that will be reduced into `target`: at the
// same address modulo 16, since the reduce kernels use 16-byte vector accesses only when dst and
// src share it. Element alignment follows, as 16 is a multiple of every element size.
uint8_t* alignedLike(uint8_t* area, const uint8_t* target) {
  return area + ((reinterpret_cast<uintptr_t>(target) - reinterpret_cast<uintptr_t>(area)) & 15);
}

// Bytes of one receive area of the tree: a chunk, rounded up and with room for alignedLike().
size_t treeAreaBytes(size_t count, size_t chunkElems, size_t esize) {
  return ((std::max<size_t>(1, std::min(chunkElems, (count + 1) / 2)) * esize + 15) & ~size_t{15}) + 16;
}

// Every rank's hops to the root of tree t of the double binary tree over `size` ranks: each parent
// chain is walked once (O(size) per op, not O(size log size) per rank).
std::vector<int> treeDepths(int size, int tree) {
  std::vector<int> depth(size, -1);
  std::vector<int> path;
  for (int q = 0; q < size; ++q) {
    int at = q;
    while (at >= 0 && depth[at] < 0) {
      path.push_back(at);
      at = doubleTreeNode(at, size, tree).parent;
    }
    int d = at < 0 ? -1 : depth[at];
    for (; !path.empty(); path.pop_back()) depth[path.back()] = ++d;
  }
  return depth;
}

}  // namespace

size_t ringScratchBytes(const Segments& segments, DataType dtype) {
  return std::max<size_t>(segments.maxLength(), 1) * elementSize(dtype) + 16;  // + alignedLike()'s room
}

void ringReduceScatter(QueuedLink& link, uint8_t* data, uint8_t* scratch, const Segments& segments, DataType dtype,
                       ReduceOp op) {
  const int p = link.size();
  const int r = link.rank();
  const int left = mod(r - 1, p), right = mod(r + 1, p);
  const size_t esize = elementSize(dtype);
  auto segment = [&](int seg) { return data + segments.offset(seg) * esize; };
  // Step s sends segment r-1-s (reduced at step s-1) and adds segment r-2-s from the left into ours,
  // as dst = dst op incoming: the CPU ring's order. After p-1 steps segment r is complete.
  for (int s = 0; s < p - 1; ++s) {
    const int out = mod(r - 1 - s, p), in = mod(r - 2 - s, p);
    uint8_t* incoming = alignedLike(scratch, segment(in));
    link.post({{Kind::kSend, right, segment(out), segments.length(out) * esize},
               {Kind::kRecv, left, incoming, segments.length(in) * esize}},
              "ring reduce-scatter");
    link.reduce(segment(in), incoming, segments.length(in), dtype, op);
  }
}

void ringAllgather(QueuedLink& link, uint8_t* data, const Segments& segments, size_t elementBytes) {
  const int p = link.size();
  const int r = link.rank();
  const int left = mod(r - 1, p), right = mod(r + 1, p);
  auto segment = [&](int seg) { return data + segments.offset(seg) * elementBytes; };
  for (int s = 0; s < p - 1; ++s) {
    const int out = mod(r - s, p), in = mod(r - 1 - s, p);
    link.post({{Kind::kSend, right, segment(out), segments.length(out) * elementBytes},
               {Kind::kRecv, left, segment(in), segments.length(in) * elementBytes}},
              "ring all-gather");
  }
}

void ringAllreduce(QueuedLink& link, uint8_t* data, uint8_t* scratch, size_t count, DataType dtype, ReduceOp op) {
  if (link.size() == 1 || count == 0) return;
  const Segments segments(count, link.size());
  ringReduceScatter(link, data, scratch, segments, dtype, op);
  ringAllgather(link, data, segments, elementSize(dtype));
}

size_t rhdScratchBytes(size_t count, DataType dtype) {
  return std::max<size_t>(count, 1) * elementSize(dtype) + 16;  // + alignedLike()'s room
}

void rhdAllreduce(QueuedLink& link, uint8_t* data, uint8_t* scratch, size_t count, DataType dtype, ReduceOp op,
                  bool halving) {
  const int p = link.size();
  if (p == 1 || count == 0) return;
  const int r = link.rank();
  const size_t esize = elementSize(dtype);
  const RhdRanks ranks(r, p);
  const int q = ranks.q, vrank = ranks.vrank;
  uint8_t* incoming = alignedLike(scratch, data);

  // Fold-in: of each pair that folds (RhdRanks), the even rank hands its vector to the odd one.
  if (ranks.folds(r)) {
    if (vrank < 0) {
      link.post({{Kind::kSend, r + 1, data, count * esize}}, "rhd fold-in");
    } else {
      link.post({{Kind::kRecv, r - 1, incoming, count * esize}}, "rhd fold-in");
      link.reduce(data, incoming, count, dtype, op);
    }
  }

  if (vrank >= 0 && !halving) {
    for (int mask = 1; mask < q; mask <<= 1) {
      const int partner = ranks.realRank(vrank ^ mask);
      link.post({{Kind::kRecv, partner, incoming, count * esize}, {Kind::kSend, partner, data, count * esize}},
                "rhd exchange");
      // The lower virtual rank's vector first, so both partners get the same bits.
      if ((vrank & mask) == 0) {
        link.reduce(data, incoming, count, dtype, op);
      } else {
        link.reduce(incoming, data, count, dtype, op);
        link.copy(data, incoming, count * esize);
      }
    }
  } else if (vrank >= 0) {
    const Segments segments(count, q);
    int lo = 0, hi = q;  // the window of segments this rank is responsible for
    for (int mask = q / 2; mask >= 1; mask >>= 1) {  // recursive halving: keep our own segment's half
      const int partner = ranks.realRank(vrank ^ mask);
      const RhdHalves h = rhdHalve(lo, hi, (vrank & mask) != 0);
      const size_t keepOff = segments.offset(h.keepLo), keepLen = segments.offset(h.keepHi) - keepOff;
      const size_t sendOff = segments.offset(h.sendLo), sendLen = segments.offset(h.sendHi) - sendOff;
      uint8_t* kept = data + keepOff * esize;
      uint8_t* got = alignedLike(scratch, kept);
      link.post({{Kind::kRecv, partner, got, keepLen * esize},
                 {Kind::kSend, partner, data + sendOff * esize, sendLen * esize}},
                "rhd halving");
      link.reduce(kept, got, keepLen, dtype, op);
      lo = h.keepLo;
      hi = h.keepHi;
    }
    for (int mask = 1; mask < q; mask <<= 1) {  // recursive doubling: swap windows with the partner
      const int partner = ranks.realRank(vrank ^ mask);
      const auto [otherLo, otherHi] = rhdPartnerWindow(lo, hi, (vrank & mask) != 0);
      const size_t myOff = segments.offset(lo), myLen = segments.offset(hi) - myOff;
      const size_t otherOff = segments.offset(otherLo), otherLen = segments.offset(otherHi) - otherOff;
      link.post({{Kind::kRecv, partner, data + otherOff * esize, otherLen * esize},
                 {Kind::kSend, partner, data + myOff * esize, myLen * esize}},
                "rhd doubling");
      lo = std::min(lo, otherLo);
      hi = std::max(hi, otherHi);
    }
  }
  // Fold-out: the result back to the ranks that sat out.
  if (ranks.folds(r)) {
    if (vrank < 0) {
      link.post({{Kind::kRecv, r + 1, data, count * esize}}, "rhd fold-out");
    } else {
      link.post({{Kind::kSend, r - 1, data, count * esize}}, "rhd fold-out");
    }
  }
}

void directAlltoall(QueuedLink& link, const uint8_t* in, const std::vector<size_t>& sendOffsets,
                    const std::vector<size_t>& sendBytes, uint8_t* out, const std::vector<size_t>& recvOffsets,
                    const std::vector<size_t>& recvBytes) {
  const int p = link.size();
  const int r = link.rank();
  std::vector<QueuedTransfer> group;
  group.reserve(2 * static_cast<size_t>(p));
  for (int i = 1; i < p; ++i) {  // peers in the order r+1, r+2, ...: each rank starts with a different one
    const int q = mod(r + i, p);
    group.push_back({Kind::kRecv, q, out + recvOffsets[q], recvBytes[q]});
    group.push_back({Kind::kSend, q, const_cast<uint8_t*>(in + sendOffsets[q]), sendBytes[q]});
  }
  if (!group.empty()) link.post(group, "all-to-all");
  link.copy(out + recvOffsets[r], in + sendOffsets[r], recvBytes[r]);
}

size_t treeScratchBytes(size_t count, size_t chunkElems, DataType dtype) {
  // One chunk per child per tree: a chunk is reduced before the next group can receive over it.
  return 4 * treeAreaBytes(count, chunkElems, elementSize(dtype));
}

void treeAllreduce(QueuedLink& link, uint8_t* data, uint8_t* scratch, size_t count, DataType dtype, ReduceOp op,
                   size_t chunkElems) {
  const int p = link.size();
  if (p == 1 || count == 0) return;
  PYCOMM_CHECK(chunkElems > 0, InvalidUsageError, "tree all-reduce: chunk of 0 elements");
  const int r = link.rank();
  const size_t esize = elementSize(dtype);
  const size_t halves[2] = {(count + 1) / 2, count / 2};
  const size_t base[2] = {0, (count + 1) / 2};
  const size_t chunks = std::max<size_t>(1, (halves[0] + chunkElems - 1) / chunkElems);
  const size_t areaBytes = treeAreaBytes(count, chunkElems, esize);
  const TreeNode nodes[2] = {doubleTreeNode(r, p, 0), doubleTreeNode(r, p, 1)};
  int depth[2], height[2];  // this rank's depth; the deepest rank's
  for (int t = 0; t < 2; ++t) {
    const std::vector<int> depths = treeDepths(p, t);
    depth[t] = depths[r];
    height[t] = *std::max_element(depths.begin(), depths.end());
  }
  auto chunkAt = [&](int t, size_t c) { return data + (base[t] + std::min(halves[t], c * chunkElems)) * esize; };
  auto chunkLength = [&](int t, size_t c) {
    const size_t begin = std::min(halves[t], c * chunkElems);
    return std::min(halves[t], begin + chunkElems) - begin;
  };
  auto tmp = [&](int t, int k, size_t c) { return alignedLike(scratch + (t * 2 + k) * areaBytes, chunkAt(t, c)); };
  // Step s of a phase moves chunk c between depth d and d+1 of tree t when s = (height - d - 1) + c
  // going up and s = d + c going down: every pair posts a transfer at the same step on both sides,
  // and while one level works on chunk c the level below already moves chunk c+1.
  const size_t steps = static_cast<size_t>(std::max(height[0], height[1])) + chunks - 1;
  auto chunkOfStep = [&](size_t s, long offset) {
    const long c = static_cast<long>(s) - offset;
    return c >= 0 && static_cast<size_t>(c) < chunks ? c : -1L;
  };

  for (size_t s = 0; s < steps; ++s) {
    std::vector<QueuedTransfer> group;
    long received[2] = {-1, -1};
    for (int t = 0; t < 2; ++t) {
      const long in = chunkOfStep(s, height[t] - depth[t] - 1);
      if (in >= 0) {
        for (int k = 0; k < 2; ++k) {
          if (nodes[t].children[k] >= 0) {
            group.push_back({Kind::kRecv, nodes[t].children[k], tmp(t, k, in), chunkLength(t, in) * esize});
            received[t] = in;
          }
        }
      }
      const long out = chunkOfStep(s, height[t] - depth[t]);
      if (out >= 0 && nodes[t].parent >= 0) {
        group.push_back({Kind::kSend, nodes[t].parent, chunkAt(t, out), chunkLength(t, out) * esize});
      }
    }
    if (!group.empty()) link.post(group, "tree all-reduce (up)");
    for (int t = 0; t < 2; ++t) {
      if (received[t] < 0) continue;
      for (int k = 0; k < 2; ++k) {
        if (nodes[t].children[k] < 0) continue;
        const size_t c = static_cast<size_t>(received[t]);
        link.reduce(chunkAt(t, c), tmp(t, k, c), chunkLength(t, c), dtype, op);
      }
    }
  }
  // Down: the roots hold the result; each level receives chunk c from its parent at step d-1+c, in
  // place, and forwards it at step d+c.
  for (size_t s = 0; s < steps; ++s) {
    std::vector<QueuedTransfer> group;
    for (int t = 0; t < 2; ++t) {
      const long in = chunkOfStep(s, depth[t] - 1);
      if (in >= 0 && nodes[t].parent >= 0) {
        group.push_back({Kind::kRecv, nodes[t].parent, chunkAt(t, in), chunkLength(t, in) * esize});
      }
      const long out = chunkOfStep(s, depth[t]);
      if (out >= 0) {
        for (int k = 0; k < 2; ++k) {
          if (nodes[t].children[k] >= 0) {
            group.push_back({Kind::kSend, nodes[t].children[k], chunkAt(t, out), chunkLength(t, out) * esize});
          }
        }
      }
    }
    if (!group.empty()) link.post(group, "tree all-reduce (down)");
  }
}

void chainBroadcast(QueuedLink& link, uint8_t* data, size_t bytes, int root, size_t chunkBytes) {
  const int p = link.size();
  PYCOMM_CHECK(root >= 0 && root < p, InvalidUsageError, "broadcast root ", root, " outside a group of ", p);
  if (p == 1 || bytes == 0) return;
  PYCOMM_CHECK(chunkBytes > 0, InvalidUsageError, "broadcast chunk size must be positive");
  const int position = mod(link.rank() - root, p);  // place in the chain root, root+1, ...
  const int prev = mod(link.rank() - 1, p), next = mod(link.rank() + 1, p);
  const bool receives = position > 0, forwards = position < p - 1;
  const size_t chunks = (bytes + chunkBytes - 1) / chunkBytes;
  auto chunk = [&](size_t c) { return data + c * chunkBytes; };
  auto length = [&](size_t c) { return std::min(chunkBytes, bytes - c * chunkBytes); };
  // Step `position + c` receives chunk c and forwards chunk c-1, so that the previous rank's step,
  // which forwards chunk c, has the same index.
  for (size_t step = 0; step < chunks + p - 1; ++step) {
    const long c = static_cast<long>(step) - position;
    std::vector<QueuedTransfer> group;
    if (receives && c >= 0 && static_cast<size_t>(c) < chunks) group.push_back({Kind::kRecv, prev, chunk(c), length(c)});
    if (forwards && c >= 1 && static_cast<size_t>(c) <= chunks) {
      group.push_back({Kind::kSend, next, chunk(c - 1), length(c - 1)});
    }
    if (!group.empty()) link.post(group, "chain broadcast");
  }
}

namespace {

// The scratch areas of a compressed all-reduce, each sized for the largest piece (pieces run one
// after another on the link, so each reuses them): encoded inputs, gathered sums, this rank's
// segment from every rank, and its fp32 sum.
struct CompressedAreas {
  size_t encoded = 0;   // bytes, also the size of the gathered area
  size_t received = 0;  // bytes
  size_t accElems = 0;  // floats

  CompressedAreas(const std::vector<CompressedPiece>& pieces, int size, int rank) {
    for (const auto& piece : pieces) {
      encoded = std::max(encoded, piece.layout.offset(size));
      received = std::max(received, size * piece.layout.length(rank));
      accElems = std::max(accElems, piece.segments.length(rank));
    }
  }
  size_t bytes() const { return 2 * alignUp(encoded) + alignUp(received) + alignUp(accElems * sizeof(float)); }
};

}  // namespace

size_t compressedScratchBytes(size_t count, int size, int rank, codecs::Codec codec, size_t chunkBytes) {
  if (size == 1) return alignUp(codecs::encodedBytes(codec, count));
  return CompressedAreas(compressedPieces(count, size, codec, chunkBytes), size, rank).bytes();
}

void compressedAllreduce(QueuedLink& link, float* data, uint8_t* scratch, size_t count, codecs::Codec codec,
                         bool average, size_t chunkBytes) {
  const int p = link.size();
  const int r = link.rank();
  if (p == 1) {
    // One rounding, as the CPU path rounds at world 1.
    link.encode(codec, data, count, scratch);
    link.decode(codec, scratch, count, data);
    return;
  }
  const auto pieces = compressedPieces(count, p, codec, chunkBytes);
  const CompressedAreas areas(pieces, p, r);
  uint8_t* encoded = scratch;
  uint8_t* gathered = encoded + alignUp(areas.encoded);
  uint8_t* received = gathered + alignUp(areas.encoded);
  auto* acc = reinterpret_cast<float*>(received + alignUp(areas.received));
  std::vector<int> others;  // the order of addition after this rank's own part
  for (int q = 0; q < p; ++q) {
    if (q != r) others.push_back(q);
  }
  const float scale = average ? 1.0f / static_cast<float>(p) : 1.0f;

  for (const auto& piece : pieces) {
    const size_t n = piece.segments.length(r);
    const size_t mine = piece.layout.length(r);
    for (int i = 0; i < p; ++i) {
      link.encode(codec, data + piece.begin + piece.segments.offset(i), piece.segments.length(i),
                  encoded + piece.layout.offset(i));
    }
    std::vector<QueuedTransfer> exchange;
    for (int q : others) {
      exchange.push_back({Kind::kSend, q, encoded + piece.layout.offset(q), piece.layout.length(q)});
      exchange.push_back({Kind::kRecv, q, received + q * mine, mine});
    }
    link.post(exchange, "compressed all-reduce (all-to-all)");
    link.decode(codec, encoded + piece.layout.offset(r), n, acc);
    for (size_t i = 0; i + 1 < others.size(); ++i) link.decodeAdd(codec, received + others[i] * mine, n, acc);
    uint8_t* sum = gathered + piece.layout.offset(r);
    link.decodeAddEncode(codec, received + others.back() * mine, acc, n, sum, scale);
    std::vector<QueuedTransfer> gather;
    for (int q : others) {
      gather.push_back({Kind::kSend, q, sum, mine});
      gather.push_back({Kind::kRecv, q, gathered + piece.layout.offset(q), piece.layout.length(q)});
    }
    link.post(gather, "compressed all-reduce (all-gather)");
    for (int i = 0; i < p; ++i) {
      link.decode(codec, gathered + piece.layout.offset(i), piece.segments.length(i),
                  data + piece.begin + piece.segments.offset(i));
    }
  }
}

size_t compressedReduceScatterScratchBytes(size_t count, int size, codecs::Codec codec) {
  return 2 * alignUp(size * codecs::encodedBytes(codec, count));
}

void compressedReduceScatter(QueuedLink& link, const float* in, float* out, uint8_t* scratch, size_t count,
                             codecs::Codec codec, bool average) {
  const int p = link.size();
  const int r = link.rank();
  const size_t each = codecs::encodedBytes(codec, count);
  uint8_t* encoded = scratch;                       // block i's encoding at i * each
  uint8_t* received = scratch + alignUp(p * each);  // rank q's encoding of block r at q * each
  for (int i = 0; i < p; ++i) link.encode(codec, in + i * count, count, encoded + i * each);
  std::vector<QueuedTransfer> exchange;
  for (int q = 0; q < p; ++q) {
    if (q == r) continue;
    exchange.push_back({Kind::kSend, q, encoded + q * each, each});
    exchange.push_back({Kind::kRecv, q, received + q * each, each});
  }
  if (!exchange.empty()) link.post(exchange, "compressed reduce-scatter (all-to-all)");
  link.decode(codec, encoded + r * each, count, out);
  for (int q = 0; q < p; ++q) {
    if (q != r) link.decodeAdd(codec, received + q * each, count, out);
  }
  if (average) link.scale(out, count, 1.0f / static_cast<float>(p));
}

size_t compressedAllgatherScratchBytes(size_t count, int size, codecs::Codec codec) {
  return alignUp(size * codecs::encodedBytes(codec, count));
}

void compressedAllgather(QueuedLink& link, const float* in, float* out, uint8_t* scratch, size_t count,
                         codecs::Codec codec) {
  const int p = link.size();
  const size_t each = codecs::encodedBytes(codec, count);
  link.encode(codec, in, count, scratch + link.rank() * each);
  ringAllgather(link, scratch, Segments(each, p, true), 1);
  for (int i = 0; i < p; ++i) link.decode(codec, scratch + i * each, count, out + i * count);
}

}  // namespace pycomm::algorithms::queued
