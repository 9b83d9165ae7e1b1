// fp16/bf16 conversions checked on every 16-bit code point and on random fp32 values, against the
// compiler's own _Float16 conversion and a bit-exact bf16 reference; reductions against scalar math.
#include <cmath>
#include <cstring>
#include <random>

#include "core/codecs/half.h"
#include "core/codecs/reduce.h"
#include "harness.h"

using namespace pycomm;
using namespace pycomm::codecs;

namespace {

uint16_t referenceFp16(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

float referenceFp16ToFloat(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return static_cast<float>(h);
}

// Round to nearest even by exact arithmetic on doubles: bf16 keeps 8 significant bits.
uint16_t referenceBf16(float f) {
  if (std::isnan(f)) return 0x7fc0 | (floatToBits(f) >> 16 & 0x8000);
  uint32_t bits = floatToBits(f);
  uint32_t lower = bits & 0xffff;
  uint32_t upper = bits >> 16;
  if (lower > 0x8000 || (lower == 0x8000 && (upper & 1))) ++upper;
  return static_cast<uint16_t>(upper);
}

bool sameFloat(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return floatToBits(a) == floatToBits(b);
}

// reduceMany (the shared-memory all-reduce's reduction: the first two sources combined out of
// place, the rest in place) against scalar math in source order, for one to four sources of odd
// lengths: float32 and float64 exactly (the same operations in the same order), integers exactly,
// bool as logical or/and.
template <typename T>
void checkManyOf(std::mt19937& rng, DataType dtype, ReduceOp op, size_t nsrcs, size_t n) {
  std::uniform_int_distribution<int> small(-9, 9);
  std::vector<std::vector<T>> srcs(nsrcs, std::vector<T>(n));
  for (auto& v : srcs) {
    for (auto& x : v) x = dtype == DataType::kBool ? static_cast<T>(small(rng) > 0) : static_cast<T>(small(rng)) / 2;
  }
  std::vector<const void*> ptrs;
  for (const auto& v : srcs) ptrs.push_back(v.data());
  std::vector<T> dst(n, static_cast<T>(77));
  reduceMany(dst.data(), ptrs.data(), nsrcs, n, dtype, op);
  for (size_t i = 0; i < n; ++i) {
    T expect = srcs[0][i];
    for (size_t s = 1; s < nsrcs; ++s) {
      const T y = srcs[s][i];
      if (dtype == DataType::kBool) {
        const bool orLike = op == ReduceOp::kSum || op == ReduceOp::kMax;
        expect = static_cast<T>(orLike ? (expect != 0 || y != 0) : (expect != 0 && y != 0));
        continue;
      }
      switch (op) {
        case ReduceOp::kSum: expect = static_cast<T>(expect + y); break;
        case ReduceOp::kProduct: expect = static_cast<T>(expect * y); break;
        case ReduceOp::kMin: expect = std::min(expect, y); break;
        default: expect = std::max(expect, y); break;
      }
    }
    if (dst[i] != expect) {
      EXPECT_TRUE(false, "reduceMany ", dtypeName(dtype), " ", reduceOpName(op), " of ", nsrcs, " sources, ", n,
                  " elements: element ", i);
      return;
    }
  }
}

void checkReduceMany(std::mt19937& rng) {
  for (size_t nsrcs : {1, 2, 3, 4}) {
    for (size_t n : {0, 1, 7, 1031}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
        checkManyOf<float>(rng, DataType::kFloat32, op, nsrcs, n);
        checkManyOf<double>(rng, DataType::kFloat64, op, nsrcs, n);
        checkManyOf<int32_t>(rng, DataType::kInt32, op, nsrcs, n);
        checkManyOf<int64_t>(rng, DataType::kInt64, op, nsrcs, n);
        checkManyOf<uint8_t>(rng, DataType::kBool, op, nsrcs, n);
      }
    }
  }
}

}  // namespace

int main() {
  for (uint32_t code = 0; code < 65536; ++code) {
    const uint16_t h = static_cast<uint16_t>(code);
    const float f = fp16ToFloat(h);
    EXPECT_TRUE(sameFloat(f, referenceFp16ToFloat(h)), "fp16 decode of 0x", std::hex, code);
    if (!std::isnan(f)) EXPECT_TRUE(floatToFp16(f) == h, "fp16 round trip of 0x", std::hex, code);
    const float b = bf16ToFloat(h);
    if (!std::isnan(b)) EXPECT_TRUE(floatToBf16(b) == h, "bf16 round trip of 0x", std::hex, code);
  }
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> anyBits;
  for (int i = 0; i < 2000000; ++i) {
    const float f = bitsToFloat(anyBits(rng));
    const uint16_t ours = floatToFp16(f);
    const uint16_t ref = referenceFp16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE((ours & 0x7c00) == 0x7c00 && (ours & 0x3ff) != 0, "fp16 of NaN");
    } else {
      EXPECT_TRUE(ours == ref, "fp16 encode of ", f, ": ", ours, " vs ", ref);
    }
    const uint16_t bf = floatToBf16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16ToFloat(bf)), "bf16 of NaN");
    } else {
      EXPECT_TRUE(bf == referenceBf16(f), "bf16 encode of ", f);
    }
  }

  // Reductions: every dtype and op against scalar arithmetic in double.
  const size_t n = 1009;
  std::uniform_real_distribution<float> real(-4.f, 4.f);
  std::uniform_int_distribution<int> small(-9, 9);
  std::vector<float> a(n), b(n), ref(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = real(rng);
    b[i] = real(rng);
  }
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
    std::vector<float> dst = a;
    reduceInto(dst.data(), b.data(), n, DataType::kFloat32, op);
    std::vector<uint16_t> ha(n), hb(n);
    for (size_t i = 0; i < n; ++i) {
      ha[i] = floatToFp16(a[i]);
      hb[i] = floatToFp16(b[i]);
    }
    reduceInto(ha.data(), hb.data(), n, DataType::kFloat16, op);
    for (size_t i = 0; i < n; ++i) {
      double x = a[i], y = b[i], expect = 0;
      switch (op) {
        case ReduceOp::kSum: expect = x + y; break;
        case ReduceOp::kProduct: expect = x * y; break;
        case ReduceOp::kMin: expect = std::min(x, y); break;
        default: expect = std::max(x, y); break;
      }
      EXPECT_TRUE(std::fabs(dst[i] - expect) <= 1e-6 * (1 + std::fabs(expect)), "float32 ", reduceOpName(op));
      const float hx = fp16ToFloat(floatToFp16(a[i])), hy = fp16ToFloat(floatToFp16(b[i]));
      float hexpect = op == ReduceOp::kSum ? hx + hy : op == ReduceOp::kProduct ? hx * hy
                      : op == ReduceOp::kMin ? std::min(hx, hy) : std::max(hx, hy);
      EXPECT_TRUE(ha[i] == floatToFp16(hexpect), "float16 ", reduceOpName(op), " rounds once");
    }
  }
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
                      ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
    std::vector<int8_t> x(n), y(n);
    std::vector<int64_t> wx(n), wy(n);
    for (size_t i = 0; i < n; ++i) {
      x[i] = static_cast<int8_t>(small(rng));
      y[i] = static_cast<int8_t>(small(rng));
      wx[i] = x[i];
      wy[i] = y[i];
    }
    reduceInto(x.data(), y.data(), n, DataType::kInt8, op);
    reduceInto(wx.data(), wy.data(), n, DataType::kInt64, op);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_TRUE(x[i] == static_cast<int8_t>(wx[i]), "int8 vs int64 ", reduceOpName(op));
    }
  }
  std::vector<uint8_t> p = {0, 0, 1, 1}, q = {0, 1, 0, 1};
  auto sumBool = p;
  reduceInto(sumBool.data(), q.data(), 4, DataType::kBool, ReduceOp::kSum);
  EXPECT_TRUE((sumBool == std::vector<uint8_t>{0, 1, 1, 1}), "bool sum is or");
  auto andBool = p;
  reduceInto(andBool.data(), q.data(), 4, DataType::kBool, ReduceOp::kBand);
  EXPECT_TRUE((andBool == std::vector<uint8_t>{0, 0, 0, 1}), "bool band");
  bool threw = false;
  try {
    reduceInto(a.data(), b.data(), n, DataType::kFloat32, ReduceOp::kBxor);
  } catch (const InvalidUsageError&) {
    threw = true;
  }
  EXPECT_TRUE(threw, "bitwise op on floats is rejected");
  checkReduceMany(rng);
  return pycomm::testing::finish("test_codecs");
}
