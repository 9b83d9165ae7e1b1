#include "buffer_list.h"

#include <algorithm>
#include <cstring>

#include "error.h"

namespace pycomm {

BufferList::BufferList(const std::vector<Piece>& pieces) {
  starts_.push_back(0);
  for (const Piece& piece : pieces) {
    if (piece.bytes == 0) continue;
    pieces_.push_back(piece);
    starts_.push_back(starts_.back() + piece.bytes);
  }
}

template <typename F>
void BufferList::forEachPart(size_t offset, size_t n, F f) const {
  PYCOMM_CHECK(offset + n <= bytes(), InternalError, "range [", offset, ", ", offset + n,
               ") outside a buffer of ", bytes(), " bytes");
  if (n == 0) return;
  // The piece holding `offset`: the last start at or before it.
  size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin()) - 1;
  size_t done = 0;
  while (done < n) {
    const size_t within = offset + done - starts_[i];
    const size_t take = std::min(n - done, pieces_[i].bytes - within);
    f(pieces_[i].data + within, take, done);
    done += take;
    ++i;
  }
}

uint8_t* BufferList::contiguous(size_t offset, size_t n) const {
  if (n == 0) return nullptr;
  uint8_t* found = nullptr;
  size_t parts = 0;
  forEachPart(offset, n, [&](uint8_t* p, size_t, size_t) {
    found = p;
    ++parts;
  });
  return parts == 1 ? found : nullptr;
}

void BufferList::copyOut(size_t offset, size_t n, uint8_t* dst) const {
  forEachPart(offset, n, [&](const uint8_t* p, size_t take, size_t at) { std::memcpy(dst + at, p, take); });
}

void BufferList::copyIn(size_t offset, size_t n, const uint8_t* src) const {
  forEachPart(offset, n, [&](uint8_t* p, size_t take, size_t at) { std::memcpy(p, src + at, take); });
}

}  // namespace pycomm
