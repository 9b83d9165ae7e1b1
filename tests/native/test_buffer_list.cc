// A buffer in pieces against the same bytes laid out flat: random piece sizes (empty ones too) and
// random ranges, copied out and in, and contiguous() exactly when a range lies inside one piece.
#include <cstring>
#include <random>
#include <vector>

#include "core/buffer_list.h"
#include "harness.h"

namespace {

using pycomm::BufferList;

void checkLayout(unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<size_t> sizes(1 + rng() % 12);
  for (auto& n : sizes) n = rng() % 4 == 0 ? 0 : 1 + rng() % 100;
  std::vector<std::vector<uint8_t>> storage;
  std::vector<BufferList::Piece> pieces;
  std::vector<size_t> pieceOf;  // flat byte -> piece index
  for (size_t i = 0; i < sizes.size(); ++i) {
    storage.emplace_back(sizes[i]);
    for (auto& b : storage.back()) b = static_cast<uint8_t>(rng());
    pieces.push_back({storage.back().data(), sizes[i]});
    pieceOf.insert(pieceOf.end(), sizes[i], i);
  }
  std::vector<uint8_t> flat;
  for (const auto& s : storage) flat.insert(flat.end(), s.begin(), s.end());
  BufferList list(pieces);
  EXPECT_TRUE(list.bytes() == flat.size(), "seed ", seed);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t offset = flat.empty() ? 0 : rng() % (flat.size() + 1);
    const size_t n = rng() % (flat.size() - offset + 1);
    std::vector<uint8_t> out(n + 1, 0xab);
    list.copyOut(offset, n, out.data());
    EXPECT_TRUE((n == 0 || std::memcmp(out.data(), flat.data() + offset, n) == 0) && out[n] == 0xab, "seed ", seed,
                " copyOut [", offset, ", +", n, ")");
    std::vector<uint8_t> in(n);
    for (auto& b : in) b = static_cast<uint8_t>(rng());
    list.copyIn(offset, n, in.data());
    if (n > 0) std::memcpy(flat.data() + offset, in.data(), n);
    std::vector<uint8_t> now;
    for (const auto& s : storage) now.insert(now.end(), s.begin(), s.end());
    EXPECT_TRUE(now == flat, "seed ", seed, " copyIn [", offset, ", +", n, ")");
    const bool onePiece = n > 0 && pieceOf[offset] == pieceOf[offset + n - 1];
    uint8_t* p = list.contiguous(offset, n);
    EXPECT_TRUE((p != nullptr) == onePiece, "seed ", seed, " contiguous [", offset, ", +", n, ")");
    if (p != nullptr) {
      const size_t piece = pieceOf[offset];
      size_t start = 0;
      for (size_t i = 0; i < piece; ++i) start += sizes[i];
      EXPECT_TRUE(p == storage[piece].data() + (offset - start), "seed ", seed, " contiguous pointer");
    }
  }
  bool threw = false;
  try {
    list.copyOut(flat.size(), 1, nullptr);
  } catch (const pycomm::InternalError&) {
    threw = true;
  }
  EXPECT_TRUE(threw, "seed ", seed, ": a range past the end must throw");
}

}  // namespace

int main() {
  for (unsigned seed = 0; seed < 500; ++seed) checkLayout(seed);
  const int failed = pycomm::testing::failures();
  std::printf("%s: %d failure(s)\n", failed ? "FAILED" : "ok", failed);
  return failed ? 1 : 0;
}
