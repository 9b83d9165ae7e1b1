// Double binary tree all-reduce (the scheme NCCL uses for small and medium messages): the shape of
// the two trees. The schedule over them is tree_schedule.h's, written once for both executors.
//
// Two binary trees span the ranks; each carries half of the buffer. In the first, odd ranks are
// leaves; the second is the first shifted by one rank (mirrored when the world size is odd), so
// with an even world size every rank is a leaf in one tree and an inner node in the other, and every
// link carries traffic both ways. About 2 log2(p) hops instead of the ring's 2(p-1).
#pragma once

namespace pycomm::algorithms {

struct TreeNode {
  int parent = -1;
  int children[2] = {-1, -1};
};

// This rank's place in tree 0 or 1 of a double binary tree over `size` ranks.
TreeNode doubleTreeNode(int rank, int size, int tree);

// Hops from `rank` to the root of tree `tree` (O(log size)).
int treeDepth(int rank, int size, int tree);
// The deepest rank's depth, the same in both trees (tree 1 is tree 0 relabelled): rank 1's in
// tree 0, whose parents climb one bit at a time, ceil(log2 size). 0 for one rank.
int treeHeight(int size);

}  // namespace pycomm::algorithms
