#include "tree.h"

namespace pycomm::algorithms {
namespace {

// In-order binary tree over ranks 0..size-1 by bit position: a rank whose lowest set bit is 2^k
// has children rank -/+ 2^(k-1) and its parent differs in bit k+1. Rank 0 is the root and its one
// child is the highest power of two below size. Odd ranks are leaves.
TreeNode binaryTreeNode(int rank, int size) {
  TreeNode node;
  int bit = 1;
  while (bit < size && !(bit & rank)) bit <<= 1;
  if (rank == 0) {
    if (size > 1) node.children[0] = bit >> 1;
    return node;
  }
  int up = (rank ^ bit) | (bit << 1);
  if (up >= size) up = rank ^ bit;
  node.parent = up;
  int low = bit >> 1;
  if (low > 0) node.children[0] = rank - low;
  while (low > 0 && rank + low >= size) low >>= 1;
  if (low > 0) node.children[1] = rank + low;
  return node;
}

}  // namespace

TreeNode doubleTreeNode(int rank, int size, int tree) {
  if (tree == 0) return binaryTreeNode(rank, size);
  // Tree 1: the same shape over relabelled ranks, so that its leaves are tree 0's inner nodes.
  const bool mirror = size % 2 == 1;
  auto toVirtual = [&](int r) { return mirror ? size - 1 - r : (r - 1 + size) % size; };
  auto toReal = [&](int v) { return v < 0 ? -1 : (mirror ? size - 1 - v : (v + 1) % size); };
  TreeNode virtualNode = binaryTreeNode(toVirtual(rank), size);
  TreeNode node;
  node.parent = toReal(virtualNode.parent);
  node.children[0] = toReal(virtualNode.children[0]);
  node.children[1] = toReal(virtualNode.children[1]);
  return node;
}

int treeDepth(int rank, int size, int tree) {
  int depth = 0;
  for (int at = doubleTreeNode(rank, size, tree).parent; at >= 0; at = doubleTreeNode(at, size, tree).parent) ++depth;
  return depth;
}

int treeHeight(int size) { return size > 1 ? treeDepth(1, size, 0) : 0; }

}  // namespace pycomm::algorithms
