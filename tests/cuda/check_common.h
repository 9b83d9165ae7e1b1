// Test data and comparisons shared by tests/cuda/test_kernels.cu (GPU) and
// tests/cuda/test_element_ops_host.cc (CPU only). Plain C++17.
//
// NaN payloads: the CPU core's results carry x86's NaN bits, and so do the kernels (element_ops.cuh),
// except where both operands of one operation are NaN with different bits: x86 then returns the
// first operand, and which one is first in the CPU's vectorized loops is the compiler's choice. The
// generated data therefore never pairs two different NaNs in one operation (fixBothNan, and
// accumulators without NaN), and every comparison is then bit for bit.
#pragma once

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cuda/element_ops.cuh"

namespace pycomm::cuda_test {

inline uint32_t fbits(float f) { return cuda::ops::floatToBits(f); }
inline float bitsf(uint32_t b) { return cuda::ops::bitsToFloat(b); }
inline uint64_t dbits(double d) { return cuda::ops::doubleToBits(d); }
inline double bitsd(uint64_t b) { return cuda::ops::bitsToDouble(b); }

constexpr uint32_t kCanonicalNan = 0x7fc00000u;

struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint32_t u32() { return static_cast<uint32_t>(next() >> 32); }
  uint32_t below(uint32_t n) { return static_cast<uint32_t>((next() >> 32) % n); }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  double normal() {  // Box-Muller
    const double u1 = uniform() + 1e-300;
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

inline float randomNan(Rng& rng) {
  // Any NaN: random sign and payload, quiet or signalling.
  uint32_t payload = rng.u32() & 0x7fffffu;
  if (payload == 0) payload = 1;
  return bitsf((rng.u32() & 0x80000000u) | 0x7f800000u | payload);
}

inline float signedInf(Rng& rng) { return bitsf((rng.u32() & 0x80000000u) | 0x7f800000u); }

// Midpoint of two adjacent representable values of a format with `mantBits` explicit mantissa bits
// and exponent `e` (value (m + 0.5) * 2^(e - mantBits)): an exact fp32 tie of the conversion.
inline float tie(Rng& rng, int mantBits, int e) {
  const uint32_t m = (1u << mantBits) + rng.below(1u << mantBits);
  return std::ldexp(static_cast<float>(m) + 0.5f, e - mantBits) * ((rng.u32() & 1) ? -1.0f : 1.0f);
}

// fp32 input of the codecs, built block by block (256 elements) from the cases block_codec.h
// distinguishes: ordinary magnitudes, all zeros, NaN / +-Inf blocks, subnormal and huge scales,
// exact ties of every format, fp16 range edges and raw bit patterns.
inline std::vector<float> codecInput(size_t count, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(count);
  for (size_t start = 0; start < count; start += 256) {
    const size_t n = count - start < 256 ? count - start : 256;
    float* b = x.data() + start;
    const uint32_t kind = rng.below(16);
    const double mag = std::pow(10.0, rng.uniform() * 12.0 - 6.0);
    for (size_t i = 0; i < n; ++i) b[i] = static_cast<float>(rng.normal() * mag);
    switch (kind) {
      case 0: case 1: case 2: case 3:  // ordinary
        break;
      case 4:  // zeros of both signs
        for (size_t i = 0; i < n; ++i) b[i] = (rng.u32() & 1) ? -0.0f : 0.0f;
        break;
      case 5:  // NaN (any payload) among ordinary values, some zeros
        for (size_t i = 0; i < n; ++i) {
          if (rng.below(8) == 0) b[i] = randomNan(rng);
          else if (rng.below(16) == 0) b[i] = (rng.u32() & 1) ? -0.0f : 0.0f;
        }
        break;
      case 6:  // +-Inf and zeros of both signs (E4M3 Inf block: zero signs are dropped)
        for (size_t i = 0; i < n; ++i) {
          const uint32_t r = rng.below(8);
          if (r == 0) b[i] = signedInf(rng);
          else if (r == 1) b[i] = (rng.u32() & 1) ? -0.0f : 0.0f;
          else if (r == 2) b[i] = static_cast<float>(mag * 1e-30);  // underflows to a zero code
        }
        break;
      case 7:  // everything special at once; possibly no finite value at all
        for (size_t i = 0; i < n; ++i) {
          const uint32_t r = rng.below(4);
          if (r == 0) b[i] = signedInf(rng);
          else if (r == 1) b[i] = randomNan(rng);
          else if (r == 2 && (kind & 1)) b[i] = -0.0f;
          else if (rng.below(64) == 0) b[i] = signedInf(rng);
        }
        break;
      case 8:  // tiny: subnormal scales (amax ~ 2^-149 .. 2^-110)
        for (size_t i = 0; i < n; ++i) {
          b[i] = std::ldexp(static_cast<float>(rng.normal()), -110 - static_cast<int>(rng.below(40)));
        }
        if (rng.below(2)) {
          // amax = (k + f) * 2^-149 * MAX, f in [0.3, 0.49]: s rounds down to k * 2^-149, so amax / s
          // lands above MAX (the saturation rules of block_codec.h for subnormal scales).
          const float max = rng.below(2) ? 448.0f : 57344.0f;
          const float k = static_cast<float>(1 + rng.below(12)) + 0.3f + 0.19f * static_cast<float>(rng.uniform());
          const float amax = std::ldexp(k * max, -149);
          for (size_t i = 0; i < n; ++i) b[i] = amax * static_cast<float>(rng.uniform() * 2 - 1);
          b[rng.below(static_cast<uint32_t>(n))] = (rng.u32() & 1) ? -amax : amax;
        }
        break;
      case 9:  // huge, up to FLT_MAX
        for (size_t i = 0; i < n; ++i) b[i] = std::ldexp(static_cast<float>(rng.uniform() * 2 - 1), 128);
        b[0] = 3.4028234663852886e38f;
        break;
      case 10: {  // E4M3 ties: amax = 448 * 2^e makes the scale 2^e, x / s exact
        const int e = static_cast<int>(rng.below(40)) - 20;
        for (size_t i = 0; i < n; ++i) b[i] = std::ldexp(tie(rng, 3, static_cast<int>(rng.below(15)) - 6), e);
        b[rng.below(static_cast<uint32_t>(n))] = std::ldexp(448.0f, e);
        break;
      }
      case 11: {  // E5M2 ties
        const int e = static_cast<int>(rng.below(40)) - 20;
        for (size_t i = 0; i < n; ++i) b[i] = std::ldexp(tie(rng, 2, static_cast<int>(rng.below(30)) - 14), e);
        b[rng.below(static_cast<uint32_t>(n))] = std::ldexp(57344.0f, e);
        break;
      }
      case 12:  // fp16 and bf16 ties
        for (size_t i = 0; i < n; ++i) {
          b[i] = (i & 1) ? tie(rng, 10, static_cast<int>(rng.below(30)) - 14)
                         : tie(rng, 7, static_cast<int>(rng.below(200)) - 100);
        }
        break;
      case 13: {  // fp16 range edges
        static const float kEdges[] = {65504.0f, 65519.99609375f, 65520.0f, 65536.0f, 6.103515625e-05f,
                                       6.0975551605224609375e-05f, 5.9604644775390625e-08f,
                                       2.98023223876953125e-08f, 2.98023259404089301e-08f, 1e-9f};
        for (size_t i = 0; i < n; ++i) {
          if (rng.below(2)) b[i] = kEdges[rng.below(10)] * ((rng.u32() & 1) ? -1.0f : 1.0f);
        }
        break;
      }
      default:  // 14, 15: raw bit patterns, NaN included
        for (size_t i = 0; i < n; ++i) b[i] = bitsf(rng.u32());
        break;
    }
  }
  return x;
}

// fp32 accumulators: ordinary values, zeros and +-Inf, no NaN (see the header comment).
inline std::vector<float> accInput(size_t count, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> a(count);
  for (size_t i = 0; i < count; ++i) {
    const uint32_t r = rng.below(64);
    if (r == 0) a[i] = signedInf(rng);
    else if (r == 1) a[i] = (rng.u32() & 1) ? -0.0f : 0.0f;
    else a[i] = static_cast<float>(rng.normal() * std::pow(10.0, rng.uniform() * 8.0 - 4.0));
  }
  return a;
}

// Input of reduceInto for one dtype, count elements as raw bytes.
inline std::vector<uint8_t> reduceInput(DataType dtype, size_t count, uint64_t seed) {
  Rng rng(seed);
  const size_t es = elementSize(dtype);
  std::vector<uint8_t> out(count * es);
  for (size_t i = 0; i < count; ++i) {
    uint8_t* p = out.data() + i * es;
    switch (dtype) {
      case DataType::kFloat32: {
        const uint32_t r = rng.below(32);
        float v;
        if (r == 0) v = randomNan(rng);
        else if (r == 1) v = signedInf(rng);
        else if (r == 2) v = (rng.u32() & 1) ? -0.0f : 0.0f;
        else if (r == 3) v = bitsf(rng.u32() & 0x807fffffu);  // subnormal
        else if (r == 4) v = bitsf(rng.u32());
        else if (r == 5) v = std::ldexp(static_cast<float>(rng.uniform() * 2 - 1), 128);
        else v = static_cast<float>(rng.normal() * std::pow(10.0, rng.uniform() * 10.0 - 5.0));
        std::memcpy(p, &v, 4);
        break;
      }
      case DataType::kFloat64: {
        const uint32_t r = rng.below(32);
        double v;
        if (r == 0) v = bitsd((rng.next() & 0x800fffffffffffffull) | 0x7ff0000000000001ull);  // NaN
        else if (r == 1) v = (rng.u32() & 1) ? -INFINITY : INFINITY;
        else if (r == 2) v = (rng.u32() & 1) ? -0.0 : 0.0;
        else if (r == 3) v = bitsd(rng.next() & 0x800fffffffffffffull);  // subnormal
        else if (r == 4) v = bitsd(rng.next());
        else v = rng.normal() * std::pow(10.0, rng.uniform() * 20.0 - 10.0);
        std::memcpy(p, &v, 8);
        break;
      }
      case DataType::kBool: {
        const uint8_t v = rng.below(2) ? 0 : static_cast<uint8_t>(1 + rng.below(255));
        *p = v;
        break;
      }
      default: {  // integers and fp16/bf16 codes: raw bits, extremes often
        uint64_t v = rng.next();
        if (rng.below(16) == 0) v = (rng.u32() & 1) ? ~uint64_t{0} >> 1 : uint64_t{1} << (8 * es - 1);
        if (rng.below(16) == 0) v = rng.below(5);
        std::memcpy(p, &v, es);
        break;
      }
    }
  }
  return out;
}

// A NaN of a floating dtype: its magnitude bits above those of Inf (the element read little-endian).
inline bool isNanOf(DataType dtype, const uint8_t* p) {
  uint64_t inf;
  switch (dtype) {
    case DataType::kFloat32: inf = 0x7f800000u; break;
    case DataType::kFloat64: inf = 0x7ff0000000000000ull; break;
    case DataType::kFloat16: inf = 0x7c00u; break;
    case DataType::kBFloat16: inf = 0x7f80u; break;
    default: return false;
  }
  const size_t es = elementSize(dtype);
  uint64_t bits = 0;
  std::memcpy(&bits, p, es);
  return (bits & ~(uint64_t{1} << (8 * es - 1))) > inf;
}

// Where dst and src are both NaN, make both the same canonical NaN (see the header comment).
inline void fixBothNan(DataType dtype, std::vector<uint8_t>& dst, const std::vector<uint8_t>& src) {
  const size_t es = elementSize(dtype);
  for (size_t i = 0; i * es < dst.size(); ++i) {
    if (!isNanOf(dtype, dst.data() + i * es) || !isNanOf(dtype, src.data() + i * es)) continue;
    uint8_t* d = dst.data() + i * es;
    const uint8_t* s = src.data() + i * es;
    std::memcpy(d, s, es);  // the same NaN on both sides: x86 returns it, quieted, whatever the order
  }
}

// Compares n elements of es bytes; prints the first few differences under `what`. Returns the
// number of differing elements.
inline size_t compareElements(const char* what, const void* got, const void* want, size_t n, size_t es,
                              size_t offsetForPrint = 0) {
  const auto* g = static_cast<const uint8_t*>(got);
  const auto* w = static_cast<const uint8_t*>(want);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(g + i * es, w + i * es, es) == 0) continue;
    if (bad < 5) {
      std::string gs, ws;
      char buf[4];
      for (size_t k = es; k-- > 0;) {
        std::snprintf(buf, sizeof buf, "%02x", g[i * es + k]);
        gs += buf;
        std::snprintf(buf, sizeof buf, "%02x", w[i * es + k]);
        ws += buf;
      }
      std::printf("  MISMATCH %s: element %zu: got 0x%s want 0x%s\n", what, i + offsetForPrint, gs.c_str(), ws.c_str());
    }
    ++bad;
  }
  if (bad > 5) std::printf("  MISMATCH %s: %zu elements differ in all\n", what, bad);
  return bad;
}

struct ReduceCase {
  DataType dtype;
  ReduceOp op;
};

// Every (dtype, op) pair the CPU's reduceInto accepts.
inline std::vector<ReduceCase> supportedReduceCases() {
  std::vector<ReduceCase> cases;
  for (int d = 0; d < static_cast<int>(DataType::kCount); ++d) {
    for (int o = 0; o < static_cast<int>(ReduceOp::kCount); ++o) {
      const auto dtype = static_cast<DataType>(d);
      const auto op = static_cast<ReduceOp>(o);
      if (supportsReduce(dtype, op)) cases.push_back({dtype, op});
    }
  }
  return cases;
}

}  // namespace pycomm::cuda_test
