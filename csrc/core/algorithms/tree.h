// Double binary tree all-reduce (the scheme NCCL uses for small and medium messages).
//
// Two binary trees span the ranks; each carries half of the buffer. In the first, odd ranks are
// leaves; the second is the first shifted by one rank (mirrored when the world size is odd), so
// with an even world size every rank is a leaf in one tree and an inner node in the other, and every
// link carries traffic both ways. Each half is reduced up its tree and broadcast back down, in
// pipelined chunks: a chunk moves up as soon as the children's copies of it are summed, and moves
// down as soon as it arrives. About 2 log2(p) hops instead of the ring's 2(p-1).
#pragma once

#include "../dtype.h"
#include "op.h"

namespace pycomm::algorithms {

struct TreeNode {
  int parent = -1;
  int children[2] = {-1, -1};
};

// This rank's place in tree 0 or 1 of a double binary tree over `size` ranks.
TreeNode doubleTreeNode(int rank, int size, int tree);

size_t treeScratchBytes(size_t count, size_t chunkElems, DataType dtype);

void treeAllreduce(Op& op, uint8_t* data, uint8_t* scratch, size_t count, DataType dtype,
                   ReduceOp reduceOp, size_t chunkElems);

}  // namespace pycomm::algorithms
