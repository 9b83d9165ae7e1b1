// A buffer made of pieces laid end to end: a bucket of tensors all-reduced without packing them
// into one flat copy first. Offsets are in bytes of the whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pycomm {

class BufferList {
 public:
  struct Piece {
    uint8_t* data;
    size_t bytes;
  };

  explicit BufferList(const std::vector<Piece>& pieces);
  static BufferList single(void* data, size_t bytes) { return BufferList({{static_cast<uint8_t*>(data), bytes}}); }

  size_t bytes() const { return starts_.back(); }
  // [offset, offset + n) as one pointer when it lies inside one piece, else null (and null for n == 0).
  uint8_t* contiguous(size_t offset, size_t n) const;
  // Copies [offset, offset + n) of the whole to `dst`, or `src` into it.
  void copyOut(size_t offset, size_t n, uint8_t* dst) const;
  void copyIn(size_t offset, size_t n, const uint8_t* src) const;

 private:
  // Calls `f(piecePointer, bytes, positionInRange)` for each piece's share of [offset, offset + n).
  template <typename F>
  void forEachPart(size_t offset, size_t n, F f) const;

  std::vector<Piece> pieces_;   // empty pieces dropped
  std::vector<size_t> starts_;  // starts_[i] = offset of piece i; the last entry is the total
};

}  // namespace pycomm
