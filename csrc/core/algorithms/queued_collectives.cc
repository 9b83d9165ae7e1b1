#include "queued_collectives.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../error.h"
#include "allreduce_plan.h"
#include "alltoall_schedule.h"
#include "chain_schedule.h"
#include "compressed.h"
#include "compressed_schedule.h"
#include "queued_steps.h"
#include "rhd_schedule.h"
#include "ring_schedule.h"
#include "tree.h"

namespace pycomm::algorithms::queued {
namespace {

using Kind = QueuedTransfer::Kind;

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
  return ringScratchFor<QueuedSteps>(segments, 0, dtype);
}

void ringReduceScatter(QueuedLink& link, uint8_t* data, uint8_t* scratch, const Segments& segments, DataType dtype,
                       ReduceOp op) {
  QueuedSteps steps(link, "ring reduce-scatter");
  ringAllreduceSchedule(steps, data, scratch, segments, dtype, op, 0, false);
}

void ringAllgather(QueuedLink& link, uint8_t* data, const Segments& segments, size_t elementBytes) {
  QueuedSteps steps(link, "ring all-gather");
  ringAllgatherSchedule(steps, data, segments, elementBytes, ringChunkFor<QueuedSteps>(segments, 0));
}

void ringAllreduce(QueuedLink& link, uint8_t* data, uint8_t* scratch, size_t count, DataType dtype, ReduceOp op) {
  if (link.size() == 1 || count == 0) return;
  const Segments segments(count, link.size());
  QueuedSteps steps(link, "ring all-reduce");
  ringAllreduceSchedule(steps, data, scratch, segments, dtype, op, 0, true);
}

size_t rhdScratchBytes(size_t count, DataType dtype) { return rhdScratchFor(count, dtype); }

void rhdAllreduce(QueuedLink& link, uint8_t* data, uint8_t* scratch, size_t count, DataType dtype, ReduceOp op,
                  bool halving) {
  if (link.size() == 1 || count == 0) return;
  QueuedSteps steps(link, "rhd all-reduce");
  rhdAllreduceSchedule(steps, data, scratch, count, dtype, op, halving);
}

void directAlltoall(QueuedLink& link, const uint8_t* in, const std::vector<size_t>& sendOffsets,
                    const std::vector<size_t>& sendBytes, uint8_t* out, const std::vector<size_t>& recvOffsets,
                    const std::vector<size_t>& recvBytes) {
  QueuedSteps steps(link, "all-to-all");
  directAlltoallSchedule(steps, in, sendOffsets, sendBytes, out, recvOffsets, recvBytes);
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

size_t allreduceScratchBytes(const AllreducePlan& plan, size_t count, int size, DataType dtype) {
  return algorithms::allreduceScratchBytes<QueuedSteps>(plan, count, size, dtype);
}

void allreduce(QueuedLink& link, const AllreducePlan& plan, uint8_t* data, uint8_t* scratch, size_t count,
               DataType dtype, ReduceOp op) {
  if (link.size() == 1 || count == 0) return;
  QueuedSteps steps(link, "all-reduce");
  runAllreduce(steps, plan, data, scratch, count, dtype, op);
}

void chainBroadcast(QueuedLink& link, uint8_t* data, size_t bytes, int root, size_t chunkBytes) {
  const int p = link.size();
  PYCOMM_CHECK(root >= 0 && root < p, InvalidUsageError, "broadcast root ", root, " outside a group of ", p);
  if (p == 1 || bytes == 0) return;
  PYCOMM_CHECK(chunkBytes > 0, InvalidUsageError, "broadcast chunk size must be positive");
  QueuedSteps steps(link, "chain broadcast");
  chainBroadcastSchedule(steps, data, bytes, root, chunkBytes);
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
  return compressedReduceScatterScratchFor(count, size, codec);
}

void compressedReduceScatter(QueuedLink& link, const float* in, float* out, uint8_t* scratch, size_t count,
                             codecs::Codec codec, bool average) {
  QueuedSteps steps(link, "compressed reduce-scatter");
  compressedReduceScatterSchedule(steps, in, out, scratch, count, codec, average, 1.0f / static_cast<float>(link.size()));
}

size_t compressedAllgatherScratchBytes(size_t count, int size, codecs::Codec codec) {
  return compressedAllgatherScratchFor(count, size, codec);
}

void compressedAllgather(QueuedLink& link, const float* in, float* out, uint8_t* scratch, size_t count,
                         codecs::Codec codec) {
  QueuedSteps steps(link, "compressed all-gather");
  compressedAllgatherSchedule(steps, in, out, scratch, count, codec, 0);
}

}  // namespace pycomm::algorithms::queued

namespace pycomm::algorithms {

size_t TreeOn<QueuedSteps>::scratchBytes(size_t count, size_t chunkElems, DataType dtype) {
  return queued::treeScratchBytes(count, chunkElems, dtype);
}

void TreeOn<QueuedSteps>::run(QueuedSteps& x, uint8_t* data, uint8_t* scratch, size_t count, DataType dtype,
                              ReduceOp op, size_t chunkElems) {
  queued::treeAllreduce(x.link(), data, scratch, count, dtype, op, chunkElems);
}

}  // namespace pycomm::algorithms
