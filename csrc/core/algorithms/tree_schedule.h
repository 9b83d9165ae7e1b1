// The double binary tree's all-reduce (tree.h), written once against the step interface (steps.h)
// and run by both executors through allreduce_plan.h.
//
// Each half of the buffer is reduced up its tree in chunks and sent back down, as a wavefront of
// steps: at step s chunk c of tree t moves up from depth d+1 to d when s = (H - d - 1) + c, and down
// from depth d to d+1 when s = H + d + c (H: the tree's height). The two ends of every transfer
// post it at the same step, so the steps pair rank for rank on a link that pairs by order; while
// one level works on chunk c the level below already moves chunk c+1, and a chunk starts down from
// the root the step after its last sum, while later chunks still climb.
//
// Receives: on an executor that matches transfers by slot (the CPU) every receive is posted up
// front, children's partial sums into one scratch area per chunk, the parent's result in place
// (safe: it can only arrive after this rank's partial sum of that chunk went up). On a link each is
// posted at its step and needs one area per child.
//
// Slots: tree t, phase 0 (up) or 1 (down), chunk c is (2t + phase) * chunks + c. Every rank reduces
// its own chunk with child 0's, then child 1's: the bits do not depend on the chunking.
#pragma once

#include <algorithm>
#include <vector>

#include "../dtype.h"
#include "op.h"
#include "steps.h"
#include "tree.h"

namespace pycomm::algorithms {

// The chunk length and count of a tree all-reduce of `count` elements (each tree moves a half).
struct TreeChunks {
  size_t elems;
  size_t count;
  TreeChunks(size_t countElems, size_t chunkElems)
      : elems(chunkWithin(chunkElems, (countElems + 1) / 2)),
        count(std::max<size_t>(1, ((countElems + 1) / 2 + elems - 1) / elems)) {}
};

template <class Steps>
size_t treeScratchFor(size_t count, size_t chunkElems, DataType dtype) {
  const TreeChunks chunks(count, chunkElems);
  return ReceiveAreas::bytes(4, Steps::kTaggedTransfers ? chunks.count : 1, chunks.elems * elementSize(dtype));
}

template <class Steps>
void treeAllreduceSchedule(Steps& x, uint8_t* data, uint8_t* scratch, size_t count, DataType dtype,
                           ReduceOp reduceOp, size_t chunkElems) {
  using Handle = typename Steps::Handle;
  constexpr bool kEarly = Steps::kTaggedTransfers;
  const int p = x.size();
  if (p == 1) return;
  const size_t esize = elementSize(dtype);
  const size_t halves[2] = {(count + 1) / 2, count / 2};
  const size_t base[2] = {0, halves[0]};
  const TreeChunks chunk(count, chunkElems);
  const size_t chunks = chunk.count;
  const TreeNode nodes[2] = {doubleTreeNode(x.rank(), p, 0), doubleTreeNode(x.rank(), p, 1)};
  const long depth[2] = {treeDepth(x.rank(), p, 0), treeDepth(x.rank(), p, 1)};
  const long height = treeHeight(p);
  const ReceiveAreas areas{scratch, kEarly ? chunks : 1, ReceiveAreas::stride(chunk.elems * esize)};
  auto begin = [&](int t, size_t c) { return std::min(halves[t], c * chunk.elems); };
  auto bytes = [&](int t, size_t c) { return (std::min(halves[t], begin(t, c) + chunk.elems) - begin(t, c)) * esize; };
  auto at = [&](int t, size_t c) { return data + (base[t] + begin(t, c)) * esize; };
  auto area = [&](int t, int k, size_t c) { return areas.at(2 * t + k, kEarly ? c : 0, at(t, c)); };
  auto slot = [&](int t, int phase, size_t c) { return static_cast<uint32_t>((2 * t + phase) * chunks + c); };

  std::vector<Handle> up[2][2], down[2];
  auto postUp = [&](int t, size_t c) {
    for (int k = 0; k < 2; ++k) {
      if (nodes[t].children[k] >= 0) up[t][k][c] = x.recv(nodes[t].children[k], slot(t, 0, c), area(t, k, c), bytes(t, c));
    }
  };
  auto postDown = [&](int t, size_t c) {
    if (nodes[t].parent >= 0) down[t][c] = x.recv(nodes[t].parent, slot(t, 1, c), at(t, c), bytes(t, c));
  };
  for (int t = 0; t < 2; ++t) {
    up[t][0].resize(chunks);
    up[t][1].resize(chunks);
    down[t].resize(chunks);
    for (size_t c = 0; kEarly && c < chunks; ++c) {
      postUp(t, c);
      postDown(t, c);
    }
  }
  // The chunk of tree t that a transfer timed `offset` steps late moves at step s, or -1.
  auto chunkAt = [&](long s, long offset) {
    const long c = s - offset;
    return c >= 0 && static_cast<size_t>(c) < chunks ? c : -1L;
  };
  const long steps = 2 * height + static_cast<long>(chunks) - 1;
  for (long s = 0; s < steps; ++s) {
    long upIn[2], upOut[2], downIn[2], downOut[2];
    for (int t = 0; t < 2; ++t) {
      const bool inner = nodes[t].children[0] >= 0 || nodes[t].children[1] >= 0;
      upIn[t] = inner ? chunkAt(s, height - depth[t] - 1) : -1;
      upOut[t] = nodes[t].parent >= 0 ? chunkAt(s, height - depth[t]) : -1;
      downIn[t] = nodes[t].parent >= 0 ? chunkAt(s, height + depth[t] - 1) : -1;
      downOut[t] = inner ? chunkAt(s, height + depth[t]) : -1;
      // What a rank forwards down arrived from its parent a step ago.
      if (downOut[t] >= 0 && nodes[t].parent >= 0) x.arrived(down[t][downOut[t]]);
    }
    for (int t = 0; t < 2; ++t) {
      if (!kEarly && upIn[t] >= 0) postUp(t, upIn[t]);
      if (!kEarly && downIn[t] >= 0) postDown(t, downIn[t]);
      if (upOut[t] >= 0) x.send(nodes[t].parent, slot(t, 0, upOut[t]), at(t, upOut[t]), bytes(t, upOut[t]));
      for (int k = 0; k < 2 && downOut[t] >= 0; ++k) {
        if (nodes[t].children[k] >= 0) {
          x.send(nodes[t].children[k], slot(t, 1, downOut[t]), at(t, downOut[t]), bytes(t, downOut[t]));
        }
      }
    }
    x.step();
    for (int t = 0; t < 2; ++t) {
      for (int k = 0; k < 2 && upIn[t] >= 0; ++k) {
        if (nodes[t].children[k] < 0) continue;
        const size_t c = static_cast<size_t>(upIn[t]);
        x.arrived(up[t][k][c]);
        x.reduce(at(t, c), area(t, k, c), bytes(t, c) / esize, dtype, reduceOp);
      }
    }
  }
  x.drain();
}

}  // namespace pycomm::algorithms
