// FP8 scalar conversions and the block codecs of block_codec.h.
//
// The fp8 conversions are checked against an independent reference (nearest value by exact
// arithmetic over a table built with ldexp); the block codecs against a scalar restatement of the
// format documented in block_codec.h, plus round-trip error bounds, special values and every block
// boundary. Encode/decode throughput for 64 MiB of fp32 is printed for every kernel table this CPU
// runs, not asserted.
#include <algorithm>
#include <chrono>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <limits>
#include <utility>
#include <random>
#include <vector>

#include "core/codecs/block_codec.h"
#include "core/codecs/codec_kernels.h"
#include "core/codecs/fp8.h"
#include "core/codecs/half.h"
#include "harness.h"

using namespace pycomm;
using namespace pycomm::codecs;

namespace {

constexpr Codec kAllCodecs[] = {Codec::kFp16, Codec::kBf16, Codec::kFp8E4M3, Codec::kFp8E5M2};
constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

bool isFp8(Codec c) { return c == Codec::kFp8E4M3 || c == Codec::kFp8E5M2; }

bool sameFloat(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return floatToBits(a) == floatToBits(b);
}

// ---- independent fp8 reference ------------------------------------------------------------------

struct Fp8Format {
  const char* name;
  int expBits, mantBits, bias;
  bool hasInf;  // E5M2: exponent all ones is Inf/NaN; E4M3FN: only S.1111.111 is NaN
  uint8_t (*encode)(float);
  float (*decode)(uint8_t);
  bool (*isNan)(uint8_t);
};

const Fp8Format kE4M3{"e4m3", 4, 3, 7, false, floatToFp8E4M3, fp8E4M3ToFloat, fp8E4M3IsNan};
const Fp8Format kE5M2{"e5m2", 5, 2, 15, true, floatToFp8E5M2, fp8E5M2ToFloat, fp8E5M2IsNan};

// Value of a code by the textbook formula, in double; NaN for NaN codes, +-Inf for E5M2's.
double refDecode(const Fp8Format& f, uint8_t code) {
  const int sign = code >> 7;
  const int exp = (code >> f.mantBits) & ((1 << f.expBits) - 1);
  const int mant = code & ((1 << f.mantBits) - 1);
  const int expMax = (1 << f.expBits) - 1;
  double v;
  if (f.hasInf && exp == expMax) {
    v = mant == 0 ? INFINITY : NAN;
  } else if (!f.hasInf && exp == expMax && mant == (1 << f.mantBits) - 1) {
    v = NAN;
  } else if (exp == 0) {
    v = std::ldexp(mant, 1 - f.bias - f.mantBits);
  } else {
    v = std::ldexp((1 << f.mantBits) + mant, exp - f.bias - f.mantBits);
  }
  return sign ? -v : v;
}

// Round to nearest, ties to the even code, over the finite non-negative codes 0..maxCode (whose
// values increase with the code). Above the largest finite value: E4M3FN saturates to 448 (torch's
// behaviour), E5M2 goes to Inf from the midpoint 61440 on (the tie rounds to the even code 0x7c).
uint8_t refEncode(const Fp8Format& f, float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7f;
  const uint8_t maxCode = f.hasInf ? 0x7b : 0x7e;
  const double a = std::fabs(static_cast<double>(x));
  const double top = refDecode(f, maxCode);
  if (a >= top) {
    if (!f.hasInf) return sign | maxCode;
    const double mid = (top + std::ldexp(1.0, 16)) / 2;  // 61440
    return sign | (a >= mid ? 0x7c : maxCode);
  }
  static std::vector<double> tables[2];  // values of the codes 0..0x7f, increasing up to maxCode
  std::vector<double>& values = tables[f.hasInf];
  if (values.empty()) {
    for (int c = 0; c < 0x80; ++c) values.push_back(refDecode(f, static_cast<uint8_t>(c)));
  }
  // Largest code with value <= a.
  const uint8_t lo = static_cast<uint8_t>(
      std::upper_bound(values.begin(), values.begin() + maxCode + 1, a) - values.begin() - 1);
  const double vlo = values[lo], vhi = values[lo + 1];
  const double mid = (vlo + vhi) / 2;  // exact: both are short dyadic numbers
  uint8_t c = lo;
  if (a > mid || (a == mid && (lo & 1))) c = lo + 1;
  return sign | c;
}

void checkFp8Scalar(const Fp8Format& f, std::mt19937& rng) {
  // Every code decodes like the formula and re-encodes to itself (NaN codes to a NaN code).
  for (int code = 0; code < 256; ++code) {
    const uint8_t c = static_cast<uint8_t>(code);
    const float v = f.decode(c);
    const double ref = refDecode(f, c);
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(v) && f.isNan(c), f.name, " NaN code 0x", std::hex, code);
      EXPECT_TRUE(f.isNan(f.encode(v)), f.name, " NaN re-encodes to NaN, code 0x", std::hex, code);
    } else {
      EXPECT_TRUE(!f.isNan(c), f.name, " isNan 0x", std::hex, code);
      EXPECT_TRUE(sameFloat(v, static_cast<float>(ref)), f.name, " decode of 0x", std::hex, code);
      EXPECT_TRUE(f.encode(v) == c, f.name, " round trip of 0x", std::hex, code);
    }
  }
  // Midpoints between neighbouring codes and their fp32 neighbours: every rounding decision.
  std::vector<float> probes = {0.0f, -0.0f, kInf, -kInf, kNan, -kNan, FLT_MAX, FLT_MIN,
                               FLT_TRUE_MIN, 464.0f, 480.0f, 61440.0f, 65536.0f};
  for (int code = 0; code < 0x7f; ++code) {
    const double lo = refDecode(f, static_cast<uint8_t>(code));
    const double hi = refDecode(f, static_cast<uint8_t>(code + 1));
    if (std::isnan(lo) || std::isnan(hi) || std::isinf(hi)) continue;
    const float mid = static_cast<float>((lo + hi) / 2);
    for (float p : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kInf), static_cast<float>(lo)}) {
      probes.push_back(p);
      probes.push_back(-p);
    }
  }
  for (float p : probes) {
    EXPECT_TRUE(f.encode(p) == refEncode(f, p), f.name, " encode of ", p, ": ", int(f.encode(p)),
                " vs ", int(refEncode(f, p)));
  }
  // Random fp32 bit patterns, and random values near the fp8 range.
  std::uniform_int_distribution<uint32_t> anyBits;
  std::uniform_real_distribution<float> logMag(-20.0f, 17.0f);
  std::vector<float> xs(1 << 20);
  for (size_t i = 0; i < xs.size(); ++i) {
    xs[i] = (i & 1) ? bitsToFloat(anyBits(rng)) : std::exp2(logMag(rng)) * ((i & 2) ? -1.0f : 1.0f);
  }
  std::vector<uint8_t> bulk(xs.size());
  if (&f == &kE4M3) {
    floatToFp8E4M3(xs.data(), xs.size(), bulk.data());
  } else {
    floatToFp8E5M2(xs.data(), xs.size(), bulk.data());
  }
  int bad = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const uint8_t ref = refEncode(f, xs[i]);
    if (f.encode(xs[i]) != ref || bulk[i] != ref) ++bad;
  }
  EXPECT_TRUE(bad == 0, f.name, " random encodes: ", bad, " mismatches");
  std::vector<uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[i] = static_cast<uint8_t>(i);
  std::vector<float> decoded(256);
  if (&f == &kE4M3) {
    fp8E4M3ToFloat(codes.data(), 256, decoded.data());
  } else {
    fp8E5M2ToFloat(codes.data(), 256, decoded.data());
  }
  for (int i = 0; i < 256; ++i) {
    EXPECT_TRUE(sameFloat(decoded[i], f.decode(codes[i])), f.name, " bulk decode ", i);
  }
}

// ---- reference of the block format (block_codec.h), element by element ----------------------------

std::vector<uint8_t> refEncodeBlocks(Codec codec, const std::vector<float>& x) {
  std::vector<uint8_t> out;
  if (codec == Codec::kFp16 || codec == Codec::kBf16) {
    for (float v : x) {
      const uint16_t h = codec == Codec::kFp16 ? floatToFp16(v) : floatToBf16(v);
      out.push_back(static_cast<uint8_t>(h & 0xff));
      out.push_back(static_cast<uint8_t>(h >> 8));
    }
    return out;
  }
  const bool e4m3 = codec == Codec::kFp8E4M3;
  const float maxFinite = e4m3 ? 448.0f : 57344.0f;
  for (size_t start = 0; start < x.size(); start += 256) {
    const size_t n = std::min<size_t>(256, x.size() - start);
    float amax = 0;
    bool nonFinite = false, hasInf = false;
    for (size_t i = 0; i < n; ++i) {
      const float v = x[start + i];
      if (std::isfinite(v)) {
        amax = std::max(amax, std::fabs(v));
      } else {
        nonFinite = true;
        hasInf |= std::isinf(v);
      }
    }
    const float s = amax / maxFinite;
    const float d = s > 0 ? s : 1.0f;
    const bool infBlock = e4m3 && hasInf;
    const float stored = !nonFinite ? s : infBlock ? -d : d;
    uint8_t scaleBytes[4];
    std::memcpy(scaleBytes, &stored, 4);
    out.insert(out.end(), scaleBytes, scaleBytes + 4);
    for (size_t i = 0; i < n; ++i) {
      const float v = x[start + i];
      uint8_t c;
      if (std::isfinite(v)) {
        float q = v / d;
        if (!e4m3) q = std::max(-maxFinite, std::min(maxFinite, q));  // saturate (subnormal d only)
        c = e4m3 ? floatToFp8E4M3(q) : floatToFp8E5M2(q);
        if (infBlock && (c & 0x7f) == 0) c = 0;
      } else if (infBlock) {
        c = std::isnan(v) ? 0x80 : v > 0 ? 0x7f : 0xff;
      } else {
        c = e4m3 ? floatToFp8E4M3(v) : floatToFp8E5M2(v);
      }
      out.push_back(c);
    }
  }
  return out;
}

std::vector<uint8_t> encodeVec(Codec codec, const std::vector<float>& x) {
  std::vector<uint8_t> out(encodedBytes(codec, x.size()) + 16, 0xa5);  // guard bytes after the end
  encode(codec, x.data(), x.size(), out.data());
  for (size_t i = out.size() - 16; i < out.size(); ++i) {
    EXPECT_TRUE(out[i] == 0xa5, codecName(codec), " wrote past encodedBytes, count ", x.size());
  }
  out.resize(out.size() - 16);
  return out;
}

std::vector<float> decodeVec(Codec codec, const std::vector<uint8_t>& enc, size_t count) {
  std::vector<float> out(count + 4, 12345.0f);
  decode(codec, enc.data(), count, out.data());
  for (size_t i = count; i < count + 4; ++i) {
    EXPECT_TRUE(out[i] == 12345.0f, codecName(codec), " decode wrote past count ", count);
  }
  out.resize(count);
  return out;
}

// Encodes, compares with the reference bytes, decodes, and checks decodeAdd == decode + add.
std::vector<float> roundTrip(Codec codec, const std::vector<float>& x, std::mt19937& rng,
                             const char* what) {
  const std::vector<uint8_t> enc = encodeVec(codec, x);
  const std::vector<uint8_t> ref = refEncodeBlocks(codec, x);
  size_t firstBad = enc.size();
  for (size_t i = 0; i < enc.size() && firstBad == enc.size(); ++i) {
    if (enc[i] != ref[i]) firstBad = i;
  }
  EXPECT_TRUE(enc.size() == ref.size() && firstBad == enc.size(), codecName(codec), " ", what,
              ": encoding differs from the reference at byte ", firstBad, " of ", enc.size());
  const std::vector<float> dec = decodeVec(codec, enc, x.size());
  std::normal_distribution<float> normal;
  std::vector<float> acc(x.size());
  for (float& a : acc) a = normal(rng);
  std::vector<float> expect = acc;
  for (size_t i = 0; i < x.size(); ++i) expect[i] += dec[i];
  decodeAdd(codec, enc.data(), x.size(), acc.data());
  size_t addBad = 0;
  for (size_t i = 0; i < x.size(); ++i) addBad += !sameFloat(acc[i], expect[i]);
  EXPECT_TRUE(addBad == 0, codecName(codec), " ", what, ": decodeAdd != decode + add at ", addBad,
              " elements");
  return dec;
}

float scaleOf(const std::vector<uint8_t>& enc, size_t block) {
  float s;
  std::memcpy(&s, enc.data() + block * 260, 4);
  return s;
}

// Relative L2 error of the round trip of N(0,1) blocks times 10^U(-3, 3): whole buffer, worst block.
void checkErrorBounds(Codec codec, double bound, std::mt19937& rng) {
  const size_t blocks = 4096, n = blocks * 256 + 77;
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> exponent(-3.0f, 3.0f);
  std::vector<float> x(n);
  for (size_t b = 0; b * 256 < n; ++b) {
    const float scale = std::pow(10.0f, exponent(rng));
    for (size_t i = b * 256; i < std::min(n, (b + 1) * 256); ++i) x[i] = normal(rng) * scale;
  }
  const std::vector<float> dec = roundTrip(codec, x, rng, "N(0,1) with scales 1e-3..1e3");
  double errAll = 0, normAll = 0, worst = 0;
  for (size_t b = 0; b * 256 < n; ++b) {
    double err = 0, norm = 0;
    for (size_t i = b * 256; i < std::min(n, (b + 1) * 256); ++i) {
      const double e = static_cast<double>(dec[i]) - x[i];
      err += e * e;
      norm += static_cast<double>(x[i]) * x[i];
    }
    errAll += err;
    normAll += norm;
    worst = std::max(worst, std::sqrt(err / norm));
  }
  const double rel = std::sqrt(errAll / normAll);
  std::printf("  %-9s relative L2 error %.3e (worst block %.3e, bound %.0e)\n", codecName(codec), rel,
              worst, bound);
  EXPECT_TRUE(rel <= bound && worst <= bound, codecName(codec), " relative L2 error ", rel,
              " / worst block ", worst, " above ", bound);
}

void checkSpecialValues(Codec codec, std::mt19937& rng) {
  const bool e4m3 = codec == Codec::kFp8E4M3;
  std::normal_distribution<float> normal;
  // Zero blocks, signed zeros kept; and a zero block next to a normal one.
  {
    std::vector<float> x(600, 0.0f);
    for (size_t i = 0; i < 256; i += 3) x[i] = -0.0f;
    for (size_t i = 256; i < 512; ++i) x[i] = normal(rng);
    const std::vector<float> dec = roundTrip(codec, x, rng, "zero blocks");
    for (size_t i : {size_t(0), size_t(1), size_t(512), size_t(599)}) {
      EXPECT_TRUE(sameFloat(dec[i], x[i]), codecName(codec), " zero at ", i, " decodes to ", dec[i]);
    }
    if (isFp8(codec)) {
      const std::vector<uint8_t> enc = encodeVec(codec, x);
      EXPECT_TRUE(scaleOf(enc, 0) == 0.0f && scaleOf(enc, 2) == 0.0f, codecName(codec),
                  " all-zero blocks store scale 0");
    }
  }
  // NaN, +Inf, -Inf: alone, with zeros, and among finite values; every position of a block.
  const float specials[] = {kNan, kInf, -kInf};
  for (int pattern = 0; pattern < 7; ++pattern) {
    std::vector<float> x(300);
    for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * 3.0f;
    for (size_t i = 0; i < 256; i += 2) x[i] = (i % 4 == 0) ? -0.0f : 0.0f;  // signed zeros
    std::vector<float> clean = x;
    bool hasInf = false;
    for (int k = 0; k < 3; ++k) {
      if (!(pattern & (1 << k))) continue;
      hasInf |= k > 0;
      for (size_t i = 1 + 2 * k; i < x.size(); i += 37) x[i] = specials[k];
    }
    for (size_t i = 0; i < x.size(); ++i) {
      if (!std::isfinite(x[i])) clean[i] = 0.0f;
    }
    const std::vector<float> dec = roundTrip(codec, x, rng, "NaN/Inf blocks");
    const std::vector<float> decClean = decodeVec(codec, encodeVec(codec, clean), clean.size());
    for (size_t i = 0; i < x.size(); ++i) {
      if (!std::isfinite(x[i])) {
        EXPECT_TRUE(sameFloat(dec[i], x[i]), codecName(codec), " special ", x[i], " at ", i,
                    " decodes to ", dec[i]);
      } else if (e4m3 && hasInf && i < 256 && x[i] == 0.0f) {
        EXPECT_TRUE(dec[i] == 0.0f, codecName(codec), " zero in an Inf block");  // sign not kept
      } else {
        // Finite values decode exactly as in the same block without its NaN/Inf.
        EXPECT_TRUE(sameFloat(dec[i], decClean[i]), codecName(codec), " finite value at ", i,
                    " in a block with NaN/Inf: ", dec[i], " vs ", decClean[i]);
      }
    }
  }
  // Blocks of only NaN/Inf (no finite amax), and only specials plus zeros.
  {
    std::vector<float> x = {kNan, kInf, -kInf, 0.0f, -0.0f, kInf};
    const std::vector<float> dec = roundTrip(codec, x, rng, "only NaN/Inf");
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(sameFloat(dec[i], x[i]), codecName(codec), " only specials ", i);
    EXPECT_TRUE(dec[3] == 0.0f && dec[4] == 0.0f && dec[5] == kInf, codecName(codec), " only specials");
  }
  // Extreme magnitudes (fp8): tiny blocks (subnormal or zero scale) and the top of the fp32 range
  // never produce NaN/Inf from finite values. (fp16 overflows to Inf above 65504 by design.)
  if (!isFp8(codec)) return;
  for (float amax : {FLT_MAX, 3.0e38f, 1.0e30f, 1.0e-30f, 1.0e-36f, 1.0e-38f, 1.0e-40f, 1.0e-43f,
                     FLT_TRUE_MIN}) {
    std::vector<float> x(256);
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = std::max(-amax, std::min(amax, normal(rng) * amax / 3));
    }
    x[7] = amax;
    x[8] = -amax;
    const std::vector<float> dec = roundTrip(codec, x, rng, "extreme magnitudes");
    bool finite = true;
    for (float v : dec) finite &= std::isfinite(v);
    EXPECT_TRUE(finite, codecName(codec), " finite values decode finite at amax ", amax);
    if (amax >= FLT_MIN * 57344 * 2) {  // a normal scale: amax decodes to itself
      EXPECT_TRUE(std::fabs(dec[7] - amax) <= amax * 1e-6, codecName(codec), " amax ", amax,
                  " decodes to ", dec[7]);
    }
  }
}

void checkBlockCodecs(std::mt19937& rng) {
  // Sizes and names.
  for (Codec c : kAllCodecs) {
    EXPECT_TRUE(codecFromName(codecName(c)) == c, "codec name round trip ", codecName(c));
    for (size_t n : {0, 1, 255, 256, 257, 512, 1000003}) {
      const size_t expect = isFp8(c) ? n + 4 * ((n + 255) / 256) : 2 * n;
      EXPECT_TRUE(encodedBytes(c, n) == expect, codecName(c), " encodedBytes(", n, ")");
    }
  }
  bool threw = false;
  try {
    codecFromName("fp8");
  } catch (const InvalidUsageError&) {
    threw = true;
  }
  EXPECT_TRUE(threw, "unknown codec name rejected");

  // fp16/bf16: every 16-bit pattern as input decodes to itself; half.h's conversions on random bits.
  {
    std::vector<float> xh(65536), xb(65536);
    for (uint32_t i = 0; i < 65536; ++i) {
      xh[i] = fp16ToFloat(static_cast<uint16_t>(i));
      xb[i] = bf16ToFloat(static_cast<uint16_t>(i));
    }
    const std::vector<uint8_t> eh = encodeVec(Codec::kFp16, xh), eb = encodeVec(Codec::kBf16, xb);
    const std::vector<float> dh = decodeVec(Codec::kFp16, eh, 65536), db = decodeVec(Codec::kBf16, eb, 65536);
    int bad = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
      uint16_t h, b;
      std::memcpy(&h, &eh[2 * i], 2);
      std::memcpy(&b, &eb[2 * i], 2);
      if (!std::isnan(xh[i]) && (h != i || !sameFloat(dh[i], xh[i]))) ++bad;
      if (!std::isnan(xb[i]) && (b != i || !sameFloat(db[i], xb[i]))) ++bad;
      if (std::isnan(xh[i]) && !std::isnan(dh[i])) ++bad;
      if (std::isnan(xb[i]) && !std::isnan(db[i])) ++bad;
    }
    EXPECT_TRUE(bad == 0, "fp16/bf16 every 16-bit pattern: ", bad, " mismatches");
    // Decode of every code against half.h (bit for bit, NaN payloads included).
    std::vector<uint8_t> all(2 * 65536);
    for (uint32_t i = 0; i < 65536; ++i) {
      const uint16_t h = static_cast<uint16_t>(i);
      std::memcpy(&all[2 * i], &h, 2);
    }
    const std::vector<float> ah = decodeVec(Codec::kFp16, all, 65536), ab = decodeVec(Codec::kBf16, all, 65536);
    bad = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
      bad += floatToBits(ah[i]) != floatToBits(fp16ToFloat(static_cast<uint16_t>(i)));
      bad += floatToBits(ab[i]) != floatToBits(bf16ToFloat(static_cast<uint16_t>(i)));
    }
    EXPECT_TRUE(bad == 0, "fp16/bf16 decode of every code vs half.h: ", bad, " mismatches");
    // Every rounding boundary: midpoints of consecutive finite values (up to the overflow threshold)
    // and their fp32 neighbours, both signs.
    for (Codec c : {Codec::kFp16, Codec::kBf16}) {
      const bool fp16 = c == Codec::kFp16;
      const uint32_t top = fp16 ? 0x7bff : 0x7f7f;
      std::vector<float> ties;
      for (uint32_t h = 0; h <= top; ++h) {
        const double a = fp16 ? fp16ToFloat(static_cast<uint16_t>(h)) : bf16ToFloat(static_cast<uint16_t>(h));
        const double b = h < top ? (fp16 ? fp16ToFloat(static_cast<uint16_t>(h + 1))
                                         : bf16ToFloat(static_cast<uint16_t>(h + 1)))
                                 : std::ldexp(1.0, fp16 ? 16 : 128);
        const float mid = static_cast<float>((a + b) / 2);
        for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kInf)}) {
          ties.push_back(v);
          ties.push_back(-v);
        }
      }
      roundTrip(c, ties, rng, "rounding ties");
    }
    std::uniform_int_distribution<uint32_t> anyBits;
    std::vector<float> r(1 << 20);
    for (float& v : r) v = bitsToFloat(anyBits(rng));
    roundTrip(Codec::kFp16, r, rng, "random fp32 bits");  // byte-exact vs half.h, NaNs included
    roundTrip(Codec::kBf16, r, rng, "random fp32 bits");
  }

  // fp8: every code point's value, through a block whose scale is exactly 1 (amax = max finite).
  for (const Fp8Format* f : {&kE4M3, &kE5M2}) {
    const Codec codec = f == &kE4M3 ? Codec::kFp8E4M3 : Codec::kFp8E5M2;
    std::vector<float> values(256), finiteOnly(256);
    for (int i = 0; i < 256; ++i) {
      values[i] = f->decode(static_cast<uint8_t>(i));
      finiteOnly[i] = std::isfinite(values[i]) ? values[i] : 0.0f;
    }
    const std::vector<uint8_t> enc = encodeVec(codec, finiteOnly);
    EXPECT_TRUE(scaleOf(enc, 0) == 1.0f, f->name, " code-point block scale ", scaleOf(enc, 0));
    for (int i = 0; i < 256; ++i) {
      if (std::isfinite(values[i])) {
        EXPECT_TRUE(enc[4 + i] == i, f->name, " block code point 0x", std::hex, i);
      }
    }
    const std::vector<uint8_t> encAll = encodeVec(codec, values);  // NaN (and E5M2 Inf) included
    const std::vector<float> decAll = roundTrip(codec, values, rng, "every code point");
    for (int i = 0; i < 256; ++i) {
      const uint8_t c = encAll[4 + i];
      if (std::isnan(values[i])) {
        EXPECT_TRUE(f->isNan(c) && std::isnan(decAll[i]), f->name, " NaN code point 0x", std::hex, i);
      } else {
        EXPECT_TRUE(c == i && sameFloat(decAll[i], values[i]), f->name, " code point 0x", std::hex, i);
      }
    }
  }

  std::printf("round-trip error, N(0,1) x per-block scale 10^U(-3,3):\n");
  checkErrorBounds(Codec::kFp16, 1e-3, rng);
  checkErrorBounds(Codec::kBf16, 8e-3, rng);
  checkErrorBounds(Codec::kFp8E4M3, 4e-2, rng);
  checkErrorBounds(Codec::kFp8E5M2, 8e-2, rng);

  for (Codec c : kAllCodecs) {
    checkSpecialValues(c, rng);
    // Partial last blocks and every count around a block boundary; denormal inputs mixed in.
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int> pick(0, 9);
    for (size_t n : {0, 1, 2, 255, 256, 257, 511, 513, 1000003}) {
      std::vector<float> x(n);
      for (float& v : x) {
        const int k = pick(rng);
        v = k == 0 ? normal(rng) * 1e-39f : k == 1 ? normal(rng) * 1e-6f : normal(rng);
      }
      const std::vector<float> dec = roundTrip(c, x, rng, "partial blocks");
      EXPECT_TRUE(dec.size() == n, codecName(c), " count ", n);
    }
  }
}

// Every table this CPU runs, called directly (the public entry points take only the active one), so
// one run compares the instruction sets on the same host; memcpy of the fp32 data is the yardstick.
void benchmark() {
  const size_t n = (64u << 20) / sizeof(float);  // 64 MiB of fp32
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> x(n), out(n), acc(n, 0.0f);
  for (float& v : x) v = normal(rng);
  // Best of 3 by wall clock, and by this thread's CPU time (steadier on a loaded machine).
  auto best = [&](auto&& fn) {
    double wall = 1e30, cpu = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      timespec c0, c1;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      const auto t1 = std::chrono::steady_clock::now();
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
      wall = std::min(wall, std::chrono::duration<double>(t1 - t0).count());
      cpu = std::min(cpu, (c1.tv_sec - c0.tv_sec) + 1e-9 * (c1.tv_nsec - c0.tv_nsec));
    }
    const double bytes = static_cast<double>(n * sizeof(float));
    return std::pair<double, double>(bytes / wall / 1e9, bytes / cpu / 1e9);
  };
  std::printf("throughput, 64 MiB of fp32, one thread (GB/s of fp32 data, best of 3; active table %s):\n",
              activeKernels().isa);
  const auto copy = best([&] { std::memcpy(out.data(), x.data(), n * sizeof(float)); });
  std::printf("  memcpy    %6.2f (cpu %6.2f)\n", copy.first, copy.second);
  for (const char* isa : knownCodecIsas()) {
    const CodecKernels* table = kernelsForIsa(isa);
    if (table == nullptr) continue;
    for (Codec c : kAllCodecs) {
      const size_t k = static_cast<size_t>(c);
      std::vector<uint8_t> enc(encodedBytes(c, n));
      const auto e = best([&] { table->encode[k](x.data(), n, enc.data()); });
      const auto d = best([&] { table->decode[k](enc.data(), n, out.data()); });
      const auto a = best([&] { table->decodeAdd[k](enc.data(), n, acc.data()); });
      std::printf("  %-6s %-9s encode %6.2f (cpu %6.2f)  decode %6.2f (cpu %6.2f)  decodeAdd %6.2f (cpu %6.2f)\n",
                  isa, codecName(c), e.first, e.second, d.first, d.second, a.first, a.second);
    }
  }
}

}  // namespace

int main() {
  std::mt19937 rng(20240611);
  checkFp8Scalar(kE4M3, rng);
  checkFp8Scalar(kE5M2, rng);
  checkBlockCodecs(rng);
  benchmark();
  return pycomm::testing::finish("test_block_codec");
}
