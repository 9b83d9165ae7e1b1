#include "tree.h"

#include <algorithm>
#include <vector>

#include "../codecs/reduce.h"

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

size_t treeScratchBytes(size_t count, size_t chunkElems, DataType dtype) {
  // One receive area per child per chunk of the larger half.
  const size_t half = (count + 1) / 2;
  chunkElems = chunkWithin(chunkElems, half);
  const size_t chunks = std::max<size_t>(1, (half + chunkElems - 1) / chunkElems);
  return 2 * 2 * chunks * chunkElems * elementSize(dtype);
}

void treeAllreduce(Op& op, uint8_t* data, uint8_t* scratch, size_t count, DataType dtype,
                   ReduceOp reduceOp, size_t chunkElems) {
  const int p = op.size();
  if (p == 1) return;
  const size_t esize = elementSize(dtype);
  const size_t halves[2] = {(count + 1) / 2, count / 2};
  const size_t base[2] = {0, (count + 1) / 2};
  chunkElems = chunkWithin(chunkElems, halves[0]);
  const size_t chunks = std::max<size_t>(1, (halves[0] + chunkElems - 1) / chunkElems);
  TreeNode nodes[2] = {doubleTreeNode(op.rank(), p, 0), doubleTreeNode(op.rank(), p, 1)};
  auto chunk = [&](int t, size_t c) {
    const size_t begin = std::min(halves[t], c * chunkElems);
    const size_t end = std::min(halves[t], begin + chunkElems);
    return std::make_pair(base[t] + begin, end - begin);
  };
  auto tmp = [&](int t, int child, size_t c) {
    return scratch + (((t * 2 + child) * chunks) + c) * chunkElems * esize;
  };
  // Slots: tree t, phase 0 (up) or 1 (down), chunk c.
  auto slot = [&](int t, int phase, size_t c) { return static_cast<uint32_t>((t * 2 + phase) * chunks + c); };

  // Post every receive first: children's partial sums into scratch, the parent's result in place
  // (safe: the result can only arrive after this rank's partial sum went up).
  std::vector<std::shared_ptr<Request>> up[2][2], down[2];
  for (int t = 0; t < 2; ++t) {
    for (int k = 0; k < 2; ++k) {
      const int child = nodes[t].children[k];
      if (child < 0) continue;
      for (size_t c = 0; c < chunks; ++c) {
        up[t][k].push_back(op.recv(child, slot(t, 0, c), tmp(t, k, c), chunk(t, c).second * esize));
      }
    }
    if (nodes[t].parent >= 0) {
      for (size_t c = 0; c < chunks; ++c) {
        auto [offset, length] = chunk(t, c);
        down[t].push_back(op.recv(nodes[t].parent, slot(t, 1, c), data + offset * esize, length * esize));
      }
    }
  }
  // Up: reduce the children's chunks into ours and pass them on; a root starts the way down.
  for (size_t c = 0; c < chunks; ++c) {
    for (int t = 0; t < 2; ++t) {
      auto [offset, length] = chunk(t, c);
      uint8_t* mine = data + offset * esize;
      for (int k = 0; k < 2; ++k) {
        if (nodes[t].children[k] < 0) continue;
        op.wait(up[t][k][c]);
        codecs::reduceInto(mine, tmp(t, k, c), length, dtype, reduceOp);
      }
      if (nodes[t].parent >= 0) {
        op.send(nodes[t].parent, slot(t, 0, c), mine, length * esize);
      } else {
        for (int k = 0; k < 2; ++k) {
          if (nodes[t].children[k] >= 0) op.send(nodes[t].children[k], slot(t, 1, c), mine, length * esize);
        }
      }
    }
  }
  // Down: forward each chunk of the result to the children as it arrives.
  for (size_t c = 0; c < chunks; ++c) {
    for (int t = 0; t < 2; ++t) {
      if (nodes[t].parent < 0) continue;
      op.wait(down[t][c]);
      auto [offset, length] = chunk(t, c);
      for (int k = 0; k < 2; ++k) {
        if (nodes[t].children[k] >= 0) {
          op.send(nodes[t].children[k], slot(t, 1, c), data + offset * esize, length * esize);
        }
      }
    }
  }
  op.waitAll();
}

}  // namespace pycomm::algorithms
