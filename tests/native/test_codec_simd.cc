// Every SIMD codec table (codec_kernels.h) against the scalar reference table, bit for bit.
//
// Each table this CPU can run is forced through kernelsForIsa, whatever activeKernels picked, and
// compared with "scalar" (the code the codecs ran before the SIMD tables; test_block_codec and
// test_codec_exactness.py check that one against independent references and torch):
//   (a) the element conversions, fp32 -> fp16, bf16, E4M3, E5M2: a strided sweep over all 2^32 bit
//       patterns, every pattern with exponent field 0 or 255 (zeros, subnormals, Inf, every NaN
//       payload, both signs), 2^17 patterns around every threshold of the conversions, and the
//       rounding midpoints of every code with their neighbours. With PYCOMM_FULL_SWEEP=1: all 2^32
//       patterns instead of the strided sweep (about a minute on two cores; run by hand, see
//       docs/PERFORMANCE.md).
//   (b) decode of every code: all 2^16 fp16/bf16 codes, all 256 fp8 codes unscaled and inside blocks
//       under many scale words (0, subnormal, huge, negative, E4M3 Inf blocks, Inf, NaN);
//   (c) block encode / decode / decodeAdd on random data: counts around every vector and block
//       boundary (0, 1, 255, 256, 257, primes), unaligned input and output pointers, blocks with NaN,
//       Inf, signed zeros, and amax so small that the scale is subnormal or zero.
// Both sides of every comparison run on the same machine, so bits must agree exactly; the one
// allowance: where both operands of a multiplication or addition are NaN, which NaN's payload comes
// out is the compiler's choice of operand order in either table, so there any NaN is accepted.
// Output guard bytes catch writes past the end; the ASan build catches reads past it.
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
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
constexpr uint8_t kGuard = 0xa5;

size_t index(Codec c) { return static_cast<size_t>(c); }
bool isNan(float f) { return std::isnan(f); }

// Bits equal, or both NaN where the operation had two NaN operands (see the header).
bool sameResult(float got, float want, bool twoNanOperands) {
  if (floatToBits(got) == floatToBits(want)) return true;
  return twoNanOperands && isNan(got) && isNan(want);
}

// ---- (a) element conversions ---------------------------------------------------------------------

// The four conversions of one batch of fp32 patterns, through one table, outputs side by side. The
// input and the outputs start one element / one byte past an aligned address, and batches have odd
// lengths, so every path runs with unaligned pointers and a scalar tail.
struct Conversions {
  std::vector<float> in;
  std::vector<uint8_t> fp16, bf16, e4m3, e5m2;

  void run(const CodecKernels& k, const std::vector<uint32_t>& patterns) {
    const size_t n = patterns.size();
    in.assign(n + 1, 0.0f);
    for (size_t i = 0; i < n; ++i) in[i + 1] = bitsToFloat(patterns[i]);
    for (auto* out : {&fp16, &bf16}) out->assign(2 * n + 2, kGuard);
    for (auto* out : {&e4m3, &e5m2}) out->assign(n + 2, kGuard);
    k.encode[index(Codec::kFp16)](in.data() + 1, n, fp16.data() + 1);
    k.encode[index(Codec::kBf16)](in.data() + 1, n, bf16.data() + 1);
    k.toFp8[0](in.data() + 1, n, e4m3.data() + 1);
    k.toFp8[1](in.data() + 1, n, e5m2.data() + 1);
  }
};

struct SweepStats {
  size_t patterns = 0;
  size_t mismatches = 0;
};

void compareConversions(const CodecKernels& simd, const std::vector<uint32_t>& patterns, const char* what,
                        SweepStats& stats) {
  static Conversions ref, got;  // reused: the sweeps call this thousands of times
  ref.run(scalarKernels(), patterns);
  got.run(simd, patterns);
  const std::pair<const std::vector<uint8_t>*, const std::vector<uint8_t>*> outputs[] = {
      {&ref.fp16, &got.fp16}, {&ref.bf16, &got.bf16}, {&ref.e4m3, &got.e4m3}, {&ref.e5m2, &got.e5m2}};
  const char* names[] = {"fp16", "bf16", "e4m3", "e5m2"};
  for (int c = 0; c < 4; ++c) {
    const std::vector<uint8_t>& want = *outputs[c].first;
    const std::vector<uint8_t>& have = *outputs[c].second;
    const size_t width = c < 2 ? 2 : 1;
    EXPECT_TRUE(have.front() == kGuard && have.back() == kGuard, simd.isa, " ", names[c], " wrote outside its output");
    if (std::memcmp(want.data(), have.data(), want.size()) == 0) continue;
    for (size_t i = 0; i < patterns.size(); ++i) {
      if (std::memcmp(&want[1 + width * i], &have[1 + width * i], width) == 0) continue;
      if (++stats.mismatches <= 8) {
        uint32_t w = 0, h = 0;
        std::memcpy(&w, &want[1 + width * i], width);
        std::memcpy(&h, &have[1 + width * i], width);
        EXPECT_TRUE(false, simd.isa, " ", names[c], " of 0x", std::hex, patterns[i], " (", what, "): 0x", h,
                    ", scalar 0x", w);
      }
    }
  }
  stats.patterns += patterns.size();
}

// The patterns p, p + stride, ... below 2^32 (as 64-bit to stop at the end), in batches.
void sweepStrided(const CodecKernels& simd, uint64_t stride, uint64_t offset, SweepStats& stats) {
  constexpr size_t kBatch = (1u << 16) + 3;
  std::vector<uint32_t> batch;
  batch.reserve(kBatch);
  for (uint64_t p = offset; p < (uint64_t{1} << 32); p += stride) {
    batch.push_back(static_cast<uint32_t>(p));
    if (batch.size() == kBatch) {
      compareConversions(simd, batch, "sweep", stats);
      batch.clear();
    }
  }
  if (!batch.empty()) compareConversions(simd, batch, "sweep", stats);
}

// Every pattern in [first, last], both signs.
void sweepRange(const CodecKernels& simd, uint32_t first, uint32_t last, const char* what, SweepStats& stats) {
  constexpr uint32_t kBatch = (1u << 16) + 1;
  std::vector<uint32_t> batch;
  for (uint64_t lo = first; lo <= last; lo += kBatch) {
    const uint64_t hi = std::min<uint64_t>(last, lo + kBatch - 1);
    batch.clear();
    for (uint64_t p = lo; p <= hi; ++p) {
      batch.push_back(static_cast<uint32_t>(p));
      batch.push_back(static_cast<uint32_t>(p) | 0x80000000u);
    }
    compareConversions(simd, batch, what, stats);
  }
}

void checkElementConversions(const CodecKernels& simd, bool exhaustive) {
  SweepStats stats;
  if (exhaustive) {
    sweepStrided(simd, 1, 0, stats);
  } else {
    sweepStrided(simd, 61, 17, stats);  // 70.4M patterns, every residue of the low bits over the run
  }
  // Exponent field 0 (zeros, subnormals) and 255 (Inf, every NaN payload), both signs.
  sweepRange(simd, 0x00000000u, 0x007fffffu, "exponent 0", stats);
  sweepRange(simd, 0x7f800000u, 0x7fffffffu, "exponent 255", stats);
  // 2^17 patterns around every threshold the conversions compare against (half.h, fp8.h).
  const uint32_t thresholds[] = {
      0x33000000u, 0x38800000u, 0x477ff000u, 0x47800000u,  // fp16: subnormal rounding, smallest normal, overflow
      0x3a800000u, 121u << 23, 1087u << 20, 0x43e00000u,   // e4m3: 2^-10, 2^-6 (smallest normal), 480, 448
      0x37000000u, 113u << 23, 143u << 23, 0x47600000u,    // e5m2: 2^-17, 2^-14, 65536, 57344
      0x47700000u, 0x7f7fffffu, 0x3f800000u,               // 61440, FLT_MAX, 1.0
  };
  for (uint32_t t : thresholds) sweepRange(simd, t - (1u << 16), std::min(t + (1u << 16), 0x7fffffffu), "threshold", stats);
  // The rounding midpoints of every fp16, bf16 and fp8 code and their fp32 neighbours.
  std::vector<uint32_t> ties;
  auto addMidpoints = [&ties](double lo, double hi) {
    const float mid = static_cast<float>((lo + hi) / 2);
    for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kInf)}) {
      ties.push_back(floatToBits(v));
      ties.push_back(floatToBits(-v));
    }
  };
  for (uint32_t h = 0; h < 0x7c00; ++h) addMidpoints(fp16ToFloat(h), fp16ToFloat(static_cast<uint16_t>(h + 1)));
  for (uint32_t h = 0; h < 0x7f80; ++h) addMidpoints(bf16ToFloat(h), bf16ToFloat(static_cast<uint16_t>(h + 1)));
  for (uint32_t c = 0; c < 0x7e; ++c) addMidpoints(fp8E4M3ToFloat(c), fp8E4M3ToFloat(static_cast<uint8_t>(c + 1)));
  for (uint32_t c = 0; c < 0x7c; ++c) addMidpoints(fp8E5M2ToFloat(c), fp8E5M2ToFloat(static_cast<uint8_t>(c + 1)));
  compareConversions(simd, ties, "rounding midpoints", stats);
  std::printf("  %s: element conversions, %zu fp32 patterns x 4 formats%s: %zu mismatches\n", simd.isa,
              stats.patterns, exhaustive ? " (all 2^32 + specials)" : "", stats.mismatches);
}

// ---- (b) decode of every code --------------------------------------------------------------------

// decode and decodeAdd of `count` elements from `encoded` through both tables; acc holds the
// accumulator's start values. twoNans(i) says where an operation had two NaN operands.
template <typename TwoNans>
void compareDecode(const CodecKernels& simd, Codec codec, const std::vector<uint8_t>& encoded, size_t count,
                   const std::vector<float>& acc, const std::string& what, TwoNans twoNans) {
  std::vector<float> want(count + 2, 7.0f), have(count + 2, 7.0f);
  scalarKernels().decode[index(codec)](encoded.data(), count, want.data() + 1);
  simd.decode[index(codec)](encoded.data(), count, have.data() + 1);
  EXPECT_TRUE(have.front() == 7.0f && have.back() == 7.0f, simd.isa, " ", codecName(codec), " decode wrote outside ", what);
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) bad += !sameResult(have[i + 1], want[i + 1], twoNans(i));
  EXPECT_TRUE(bad == 0, simd.isa, " ", codecName(codec), " decode ", what, ": ", bad, " of ", count, " differ");
  std::vector<float> accWant(count + 2, 7.0f), accHave(count + 2, 7.0f);
  std::copy(acc.begin(), acc.begin() + count, accWant.begin() + 1);
  std::copy(acc.begin(), acc.begin() + count, accHave.begin() + 1);
  scalarKernels().decodeAdd[index(codec)](encoded.data(), count, accWant.data() + 1);
  simd.decodeAdd[index(codec)](encoded.data(), count, accHave.data() + 1);
  EXPECT_TRUE(accHave.front() == 7.0f && accHave.back() == 7.0f, simd.isa, " ", codecName(codec), " decodeAdd wrote outside ", what);
  bad = 0;
  for (size_t i = 0; i < count; ++i) {
    const bool nans = twoNans(i) || (isNan(acc[i]) && isNan(want[i + 1]));
    bad += !sameResult(accHave[i + 1], accWant[i + 1], nans);
  }
  EXPECT_TRUE(bad == 0, simd.isa, " ", codecName(codec), " decodeAdd ", what, ": ", bad, " of ", count, " differ");
}

// Accumulator start values: random normals with NaN, Inf, -0 and subnormals sprinkled in.
std::vector<float> accumulator(size_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), -kInf, kInf, -0.0f, 1e-40f, -FLT_MAX};
  std::vector<float> acc(count);
  for (size_t i = 0; i < count; ++i) acc[i] = i % 97 == 5 ? specials[(i / 97) % 6] : normal(rng);
  return acc;
}

void checkDecodeEveryCode(const CodecKernels& simd, std::mt19937& rng) {
  // fp16 / bf16: the 2^16 codes, twice over with an odd count (a tail), from an odd address.
  std::vector<uint8_t> codes16(2 * 2 * 65536 + 1);
  for (uint32_t i = 0; i < 2 * 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i * 40503u);  // odd multiplier: a permutation of the codes
    std::memcpy(&codes16[1 + 2 * i], &h, 2);
  }
  const std::vector<uint8_t> shifted(codes16.begin() + 1, codes16.end());
  const size_t count16 = 2 * 65536 - 3;
  const std::vector<float> acc16 = accumulator(count16, rng);
  for (Codec c : {Codec::kFp16, Codec::kBf16}) {
    compareDecode(simd, c, shifted, count16, acc16, "every 16-bit code", [](size_t) { return false; });
  }
  // fp8 unscaled: every code, exactly.
  std::vector<uint8_t> all(256 + 9);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint8_t>(i * 7);
  for (size_t f = 0; f < kFp8FormatCount; ++f) {
    std::vector<float> want(all.size()), have(all.size());
    scalarKernels().fromFp8[f](all.data(), all.size(), want.data());
    simd.fromFp8[f](all.data(), all.size(), have.data());
    EXPECT_TRUE(std::memcmp(want.data(), have.data(), 4 * want.size()) == 0, simd.isa, " unscaled fp8 decode, format ", f);
  }
  // fp8 blocks: every code in every block, under each scale word; the last block partial.
  const float scales[] = {1.0f, 0.0f, -0.0f, 0.5f, 3.0e-39f, 1.4e-45f, FLT_MIN, FLT_MAX, 1.2345e-3f, 448.0f,
                          -1.0f, -2.5e-3f, -3.0e-39f, -FLT_MAX, kInf, -kInf,
                          std::numeric_limits<float>::quiet_NaN(), bitsToFloat(0xffc01234u), bitsToFloat(0x7f800001u)};
  const size_t blocks = sizeof scales / sizeof scales[0];
  for (Codec codec : {Codec::kFp8E4M3, Codec::kFp8E5M2}) {
    const size_t count = blocks * 256 - 13;
    std::vector<uint8_t> encoded(encodedBytes(codec, count));
    std::vector<uint8_t> codeOf(count);
    for (size_t b = 0; b < blocks; ++b) {
      std::memcpy(&encoded[260 * b], &scales[b], 4);
      for (size_t j = 0; j < 256 && 256 * b + j < count; ++j) {
        const uint8_t c = static_cast<uint8_t>((j * 167 + b * 31) & 0xff);  // every code, shuffled per block
        encoded[260 * b + 4 + j] = c;
        codeOf[256 * b + j] = c;
      }
    }
    const bool e4m3 = codec == Codec::kFp8E4M3;
    auto twoNans = [&](size_t i) {
      const float scale = scales[i / 256];
      const float value = e4m3 ? fp8E4M3ToFloat(codeOf[i]) : fp8E5M2ToFloat(codeOf[i]);
      return isNan(scale) && isNan(value);
    };
    compareDecode(simd, codec, encoded, count, accumulator(count, rng), "every code x scale words", twoNans);
  }
}

// ---- (c) blocks on random data -------------------------------------------------------------------

// One kind of input, as a function of the element index and a random source.
std::vector<float> makeInput(int kind, size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> exponent(-3.0f, 3.0f);
  std::uniform_int_distribution<uint32_t> anyBits;
  std::vector<float> x(n);
  std::uniform_real_distribution<float> tinyExponent(-44.0f, -39.0f);
  float blockScale = 1.0f, tinyScale = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    if (i % 256 == 0) {
      blockScale = std::pow(10.0f, exponent(rng));
      tinyScale = std::pow(10.0f, tinyExponent(rng));
    }
    float v = normal(rng) * blockScale;
    switch (kind) {
      case 0: break;                                                         // N(0,1) x 10^U(-3,3) per block
      case 1: v = bitsToFloat(anyBits(rng)); break;                          // any bits: NaN/Inf in most blocks
      case 2: v = normal(rng) * 1e-38f; break;                               // subnormal scales
      // amax 1e-44..1e-39: scales of 0 or a few subnormal steps, so x / d exceeds MAX by up to ~1/k
      // for a scale of k steps and the E5M2 clamp matters (x / d >= 61440 would round to Inf).
      case 3: v = normal(rng) * tinyScale; break;
      case 4: v = (i % 3 == 0) ? -0.0f : 0.0f; break;                        // zero blocks, signed
      case 5: if (i % 251 == 7) v = (i / 251) % 2 ? kInf : -kInf; break;     // Inf blocks (E4M3 S < 0)
      case 6: if (i % 263 == 11) v = bitsToFloat(0x7fc00000u | static_cast<uint32_t>(i)); break;  // NaN payloads
      case 7: v = normal(rng) * 1e30f; if (i % 300 == 1) v = FLT_MAX; break;  // amax near FLT_MAX
      case 8: v = normal(rng) * 3e4f; break;                                 // fp16 overflow to Inf
      default: v = (i % 5 == 0) ? normal(rng) * 1e-41f : normal(rng); break;  // subnormal elements mixed in
    }
    x[i] = v;
  }
  return x;
}

constexpr int kInputKinds = 10;

void checkBlocks(const CodecKernels& simd, std::mt19937& rng) {
  const size_t counts[] = {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 255, 256, 257,
                           509, 511, 512, 513, 1021, 4099, 65537, 250007};
  size_t cases = 0;
  for (Codec codec : kAllCodecs) {
    for (size_t n : counts) {
      for (int kind = 0; kind < kInputKinds; ++kind) {
        if (n > 5000 && kind % 3 != 0) continue;  // the long counts with a few kinds only
        const size_t inOffset = 1 + (n + kind) % 3, outOffset = 1 + 2 * (kind % 2);  // unaligned both
        const std::vector<float> x = makeInput(kind, n, rng);
        std::vector<float> in(n + inOffset);
        std::copy(x.begin(), x.end(), in.begin() + inOffset);
        const size_t bytes = encodedBytes(codec, n);
        std::vector<uint8_t> want(bytes + outOffset + 16, kGuard), have(bytes + outOffset + 16, kGuard);
        scalarKernels().encode[index(codec)](in.data() + inOffset, n, want.data() + outOffset);
        simd.encode[index(codec)](in.data() + inOffset, n, have.data() + outOffset);
        size_t firstBad = have.size();
        for (size_t i = 0; i < have.size() && firstBad == have.size(); ++i) firstBad = want[i] != have[i] ? i : firstBad;
        EXPECT_TRUE(firstBad == have.size(), simd.isa, " ", codecName(codec), " encode n=", n, " kind ", kind,
                    ": differs at byte ", firstBad, " (guard bytes included)");
        const std::vector<uint8_t> encoded(want.begin() + outOffset, want.begin() + outOffset + bytes);
        compareDecode(simd, codec, encoded, n, accumulator(n, rng),
                      "n=" + std::to_string(n) + " kind " + std::to_string(kind), [](size_t) { return false; });
        ++cases;
      }
    }
  }
  std::printf("  %s: %zu block cases (4 codecs x counts x input kinds) encode/decode/decodeAdd\n", simd.isa, cases);
}

// The public entry points go through the table picked for this CPU: the fastest it runs.
void checkSelection() {
  const char* best = "scalar";
  for (const char* isa : knownCodecIsas()) {
    if (kernelsForIsa(isa) != nullptr) best = isa;
  }
  EXPECT_TRUE(std::strcmp(activeKernels().isa, best) == 0, "active table ", activeKernels().isa, ", expected ", best);
  EXPECT_TRUE(kernelsForIsa("scalar") == &scalarKernels(), "scalar table always available");
  EXPECT_TRUE(kernelsForIsa("sse9") == nullptr, "unknown ISA name");
  std::printf("active codec table: %s\n", activeKernels().isa);
}

}  // namespace

int main() {
  const char* fullSweep = std::getenv("PYCOMM_FULL_SWEEP");
  const bool exhaustive = fullSweep != nullptr && std::strcmp(fullSweep, "1") == 0;
  checkSelection();
  std::string tested, skipped;
  for (const char* isa : knownCodecIsas()) {
    if (std::strcmp(isa, "scalar") == 0) continue;  // the reference itself
    const CodecKernels* simd = kernelsForIsa(isa);
    if (simd == nullptr) {
      const bool compiled = std::strcmp(isa, "avx2") == 0 ? avx2Kernels() != nullptr : avx512Kernels() != nullptr;
      skipped += strCat(" ", isa, compiled ? " (compiled in; this CPU cannot run it)" : " (not compiled in)");
      continue;
    }
    std::printf("%s against scalar:\n", isa);
    std::mt19937 rng(20250101);
    checkElementConversions(*simd, exhaustive);
    checkDecodeEveryCode(*simd, rng);
    checkBlocks(*simd, rng);
    tested += strCat(" ", isa);
  }
  std::printf("tested against scalar:%s\n", tested.empty() ? " none" : tested.c_str());
  std::printf("skipped:%s\n", skipped.empty() ? " none" : skipped.c_str());
  return pycomm::testing::finish("test_codec_simd");
}
