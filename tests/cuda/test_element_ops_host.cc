// CPU-only check of the CUDA kernels' per-element code (csrc/cuda/element_ops.cuh, peel.cuh) against
// the CPU core, for machines without a GPU. It proves the restated conversions and reduce operations
// bit-identical to the core's (the conversions exhaustively over all 2^32 fp32 inputs), runs the fp8
// block algorithm of the kernels (amax over bit patterns, NaN/Inf rules, scale words) serially
// against codecs::encode/decode/decodeAdd, and checks that the peeled grid-stride loop of the
// elementwise kernels covers every element exactly once with aligned vectors.
//
// What it cannot check: the device compilation of the same code, the warp reductions and the
// kernels' indexing. tests/cuda/test_kernels.cu (benchmarks/gpu_check.sh) does that on a GPU.
//
// Build and run (from the repository root; -ffp-contract=off as the core is built):
//   g++ -std=c++17 -O3 -ffp-contract=off -pthread -Icsrc -Itests/cuda tests/cuda/test_element_ops_host.cc
//       csrc/core/dtype.cc csrc/core/codecs/*.cc -o build/test_element_ops_host
//   build/test_element_ops_host
// Flags: --quick samples 1/64 of the fp32 inputs instead of all of them.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "check_common.h"
#include "core/codecs/block_codec.h"
#include "core/codecs/fp8.h"
#include "core/codecs/half.h"
#include "core/codecs/reduce.h"
#include "cuda/element_ops.cuh"
#include "cuda/peel.cuh"
#include "cuda/reducer_dispatch.cuh"

using namespace pycomm;
using namespace pycomm::cuda_test;
namespace ops = pycomm::cuda::ops;

namespace {

size_t failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    ++failures;
    std::printf("FAILED: %s\n", what);
  }
}

// ---- conversions, exhaustively ---------------------------------------------------------------------

void checkConversionsExhaustive(bool quick) {
  const unsigned nthreads = std::max(1u, std::thread::hardware_concurrency());
  constexpr uint64_t kChunk = 1u << 20;
  const uint64_t step = quick ? 64 : 1;  // quick: every 64th chunk
  std::atomic<uint64_t> next{0};
  std::atomic<uint64_t> bad[5] = {};
  auto work = [&] {
    std::vector<float> in(kChunk);
    std::vector<uint8_t> cpu16(2 * kChunk), cpuE4(kChunk), cpuE5(kChunk);
    std::vector<uint8_t> cpuB16(2 * kChunk);
    for (;;) {
      const uint64_t c = next.fetch_add(step);
      if (c >= (uint64_t{1} << 32) / kChunk) break;
      const uint64_t base = c * kChunk;
      for (uint64_t i = 0; i < kChunk; ++i) in[i] = bitsf(static_cast<uint32_t>(base + i));
      codecs::encode(codecs::Codec::kFp16, in.data(), kChunk, cpu16.data());
      codecs::encode(codecs::Codec::kBf16, in.data(), kChunk, cpuB16.data());
      codecs::floatToFp8E4M3(in.data(), kChunk, cpuE4.data());
      codecs::floatToFp8E5M2(in.data(), kChunk, cpuE5.data());
      uint64_t b[5] = {};
      for (uint64_t i = 0; i < kChunk; ++i) {
        uint16_t h, hb;
        std::memcpy(&h, &cpu16[2 * i], 2);
        std::memcpy(&hb, &cpuB16[2 * i], 2);
        b[0] += ops::floatToFp16(in[i]) != h;
        b[1] += ops::floatToFp16(in[i]) != codecs::floatToFp16(in[i]);  // half.h, the scalar reference
        b[2] += ops::floatToBf16(in[i]) != hb;
        b[3] += ops::floatToFp8E4M3(in[i]) != cpuE4[i];
        b[4] += ops::floatToFp8E5M2(in[i]) != cpuE5[i];
      }
      for (int k = 0; k < 5; ++k) bad[k] += b[k];
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < nthreads; ++t) threads.emplace_back(work);
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const char* names[5] = {"fp16 vs codecs::encode", "fp16 vs half.h", "bf16 vs codecs::encode", "fp8 e4m3", "fp8 e5m2"};
  for (int k = 0; k < 5; ++k) {
    std::printf("  float -> %-24s %s over %s fp32 inputs: %llu differ\n", names[k], bad[k] ? "FAIL" : "ok",
                quick ? "1/64 of the" : "all 2^32", static_cast<unsigned long long>(bad[k].load()));
    expect(bad[k] == 0, names[k]);
  }
  std::printf("  (%.1f s on %u threads)\n", secs, nthreads);
}

void checkDecodeTables() {
  // fp16 / bf16: every code.
  std::vector<uint8_t> codes(2 * 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t v = static_cast<uint16_t>(h);
    std::memcpy(&codes[2 * h], &v, 2);
  }
  std::vector<float> cpu(65536), mine(65536);
  for (auto [codec, name] : {std::pair{codecs::Codec::kFp16, "fp16"}, std::pair{codecs::Codec::kBf16, "bf16"}}) {
    codecs::decode(codec, codes.data(), 65536, cpu.data());
    for (uint32_t h = 0; h < 65536; ++h) {
      mine[h] = codec == codecs::Codec::kFp16 ? ops::fp16ToFloat(static_cast<uint16_t>(h))
                                              : ops::bf16ToFloat(static_cast<uint16_t>(h));
    }
    const std::string what = std::string(name) + " decode, every code";
    expect(compareElements(what.c_str(), mine.data(), cpu.data(), 65536, 4) == 0, what.c_str());
  }
  // fp8: every code.
  std::vector<uint8_t> all(256);
  for (int c = 0; c < 256; ++c) all[c] = static_cast<uint8_t>(c);
  std::vector<float> e4(256), e5(256), m4(256), m5(256);
  codecs::fp8E4M3ToFloat(all.data(), 256, e4.data());
  codecs::fp8E5M2ToFloat(all.data(), 256, e5.data());
  for (int c = 0; c < 256; ++c) {
    m4[c] = ops::fp8E4M3ToFloat(static_cast<uint8_t>(c));
    m5[c] = ops::fp8E5M2ToFloat(static_cast<uint8_t>(c));
  }
  expect(compareElements("e4m3 decode, every code", m4.data(), e4.data(), 256, 4) == 0, "e4m3 decode");
  expect(compareElements("e5m2 decode, every code", m5.data(), e5.data(), 256, 4) == 0, "e5m2 decode");
}

// ---- the fp8 block algorithm of codec_kernels.cu, serially -------------------------------------------

struct Stats {
  float s, d;
  bool nonFinite, infBlock;
};

template <typename F>
Stats blockStats(const float* x, size_t n) {
  uint32_t top = 0;
  for (size_t i = 0; i < n; ++i) top = std::max(top, fbits(x[i]) & 0x7fffffffu);
  Stats st{};
  st.nonFinite = top >= 0x7f800000u;
  uint32_t amax = top;
  if (st.nonFinite) {
    amax = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t a = fbits(x[i]) & 0x7fffffffu;
      amax = std::max(amax, a < 0x7f800000u ? a : 0u);
      if (F::kHasInfBlocks) st.infBlock = st.infBlock || a == 0x7f800000u;
    }
  }
  st.s = ops::blockScale<F>(bitsf(amax));
  st.d = ops::blockDivisor(st.s);
  return st;
}

template <typename F>
void emuEncode(const float* in, size_t count, uint8_t* out) {
  for (size_t start = 0; start < count; start += 256) {
    const size_t n = std::min<size_t>(256, count - start);
    uint8_t* block = out + (start / 256) * 260;
    const Stats st = blockStats<F>(in + start, n);
    for (size_t i = 0; i < n; ++i) block[4 + i] = ops::encodeElement<F>(in[start + i], st.d, st.infBlock);
    const float w = ops::blockScaleWord(st.s, st.d, st.nonFinite, st.infBlock);
    std::memcpy(block, &w, 4);
  }
}

template <typename F>
void emuDecode(const uint8_t* in, size_t count, float* out, const float* acc) {
  for (size_t start = 0; start < count; start += 256) {
    const size_t n = std::min<size_t>(256, count - start);
    const uint8_t* block = in + (start / 256) * 260;
    float scale;
    std::memcpy(&scale, block, 4);
    const bool inf = F::kHasInfBlocks && ops::isInfBlockScale(scale);
    for (size_t i = 0; i < n; ++i) {
      const float v = ops::decodeElement<F>(block[4 + i], scale, inf);
      out[start + i] = acc ? ops::add(acc[start + i], v) : v;
    }
  }
}

template <typename F>
void checkFp8Blocks(codecs::Codec codec, const char* name) {
  for (size_t count : {size_t{1}, size_t{255}, size_t{256}, size_t{257}, size_t{100000}, size_t{1} << 20}) {
    const std::vector<float> x = codecInput(count, count * 7 + static_cast<int>(codec));
    const std::vector<float> acc = accInput(count, count * 11 + 3);
    const size_t bytes = codecs::encodedBytes(codec, count);
    std::vector<uint8_t> cpu(bytes), mine(bytes, 0xff);
    codecs::encode(codec, x.data(), count, cpu.data());
    emuEncode<F>(x.data(), count, mine.data());
    std::string what = std::string(name) + " encode n=" + std::to_string(count);
    expect(compareElements(what.c_str(), mine.data(), cpu.data(), bytes, 1) == 0, what.c_str());

    std::vector<float> cpuOut(count), myOut(count, bitsf(0xffffffffu));
    codecs::decode(codec, cpu.data(), count, cpuOut.data());
    emuDecode<F>(cpu.data(), count, myOut.data(), nullptr);
    what = std::string(name) + " decode n=" + std::to_string(count);
    expect(compareElements(what.c_str(), myOut.data(), cpuOut.data(), count, 4) == 0, what.c_str());

    std::vector<float> cpuAcc = acc;
    codecs::decodeAdd(codec, cpu.data(), count, cpuAcc.data());
    emuDecode<F>(cpu.data(), count, myOut.data(), acc.data());
    what = std::string(name) + " decodeAdd n=" + std::to_string(count);
    expect(compareElements(what.c_str(), myOut.data(), cpuAcc.data(), count, 4) == 0, what.c_str());

    // decodeAddEncode = decodeAdd, optional scale, encode.
    for (float scale : {1.0f, 0.125f, 1.0f / 3.0f}) {
      std::vector<float> tmp = cpuAcc;
      if (scale != 1.0f) {
        for (float& t : tmp) t *= scale;
      }
      codecs::encode(codec, tmp.data(), count, cpu.data());
      std::vector<float> sums(count);
      for (size_t i = 0; i < count; ++i) sums[i] = scale != 1.0f ? ops::mul(myOut[i], scale) : myOut[i];
      emuEncode<F>(sums.data(), count, mine.data());
      what = std::string(name) + " decodeAddEncode n=" + std::to_string(count) + " scale=" + std::to_string(scale);
      expect(compareElements(what.c_str(), mine.data(), cpu.data(), bytes, 1) == 0, what.c_str());
    }
  }
}

// fp16/bf16 codec paths over the generated data (decodeAdd: acc + value, x86 NaN rule).
void checkHalfCodecs() {
  for (auto codec : {codecs::Codec::kFp16, codecs::Codec::kBf16}) {
    const size_t count = size_t{1} << 20;
    const std::vector<float> x = codecInput(count, 99 + static_cast<int>(codec));
    std::vector<float> acc = accInput(count, 5);
    std::vector<uint8_t> enc(2 * count);
    codecs::encode(codec, x.data(), count, enc.data());
    std::vector<float> cpuAcc = acc;
    codecs::decodeAdd(codec, enc.data(), count, cpuAcc.data());
    std::vector<float> mine(count);
    for (size_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, &enc[2 * i], 2);
      mine[i] = ops::add(acc[i], codec == codecs::Codec::kFp16 ? ops::fp16ToFloat(h) : ops::bf16ToFloat(h));
    }
    const std::string what = std::string(codecs::codecName(codec)) + " decodeAdd";
    expect(compareElements(what.c_str(), mine.data(), cpuAcc.data(), count, 4) == 0, what.c_str());
  }
}

// ---- reduce ----------------------------------------------------------------------------------------

template <typename R>
void applyReducer(void* dst, const void* src, size_t count) {
  using T = typename R::T;
  auto* d = static_cast<T*>(dst);
  const auto* s = static_cast<const T*>(src);
  for (size_t i = 0; i < count; ++i) d[i] = R::apply(d[i], s[i]);
}

// The kernels' own (dtype, op) -> reducer mapping (reducer_dispatch.cuh), each reducer run serially.
void emuReduce(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) {
  cuda::withReducer(dtype, op, [&](auto reducer) { applyReducer<decltype(reducer)>(dst, src, count); });
}

void checkReduce() {
  const size_t count = 1 << 18;
  size_t cases = 0;
  for (const ReduceCase& c : supportedReduceCases()) {
    const uint64_t seed = static_cast<uint64_t>(c.dtype) * 100 + static_cast<uint64_t>(c.op);
    std::vector<uint8_t> dst = reduceInput(c.dtype, count, seed);
    const std::vector<uint8_t> src = reduceInput(c.dtype, count, seed + 7777);
    fixBothNan(c.dtype, dst, src);
    std::vector<uint8_t> cpu = dst, mine = dst;
    codecs::reduceInto(cpu.data(), src.data(), count, c.dtype, c.op);
    emuReduce(mine.data(), src.data(), count, c.dtype, c.op);
    const std::string what = std::string("reduce ") + dtypeName(c.dtype) + " " + reduceOpName(c.op);
    expect(compareElements(what.c_str(), mine.data(), cpu.data(), count, elementSize(c.dtype)) == 0, what.c_str());
    ++cases;
  }
  std::printf("  reduce: %zu (dtype, op) pairs x %zu elements compared\n", cases, count);
}

// Informational: which operand x86 returns, in the CPU's reduce loop, when both are NaN.
void reportNanOrder() {
  const float a[4] = {bitsf(0x7fc00001u), bitsf(0x7fc00001u), bitsf(0x7fc00001u), bitsf(0x7fc00001u)};
  const float b[4] = {bitsf(0xffc00002u), bitsf(0xffc00002u), bitsf(0xffc00002u), bitsf(0xffc00002u)};
  float d[4];
  std::memcpy(d, a, sizeof d);
  codecs::reduceInto(d, b, 4, DataType::kFloat32, ReduceOp::kSum);
  std::printf("  (info) CPU float32 SUM of NaN 0x7fc00001 (dst) and 0xffc00002 (src) gives 0x%08x; the kernels give 0x%08x\n",
              fbits(d[0]), fbits(ops::add(a[0], b[0])));
}

// ---- the peeled loop -------------------------------------------------------------------------------

template <size_t ES>
size_t checkPeelFor() {
  constexpr size_t V = 16 / ES;
  alignas(64) static uint8_t arena[64];
  size_t runs = 0;
  for (size_t offA = 0; offA < 16; offA += ES) {
    for (size_t offB = 0; offB < 16; offB += ES) {
      for (size_t count = 0; count < 3 * V + 7; ++count) {
        for (size_t nthreads : {size_t{1}, size_t{3}, size_t{64}}) {
          const uint8_t* a = arena + offA;
          const uint8_t* b = arena + offB;
          const auto peel = pycomm::cuda::detail::peelFor(count, V, {{a, ES}, {b, ES}});
          std::vector<int> seen(count, 0);
          bool aligned = true;
          for (size_t t = 0; t < nthreads; ++t) {
            pycomm::cuda::detail::peeledLoop<V>(
                t, nthreads, count, peel,
                [&](size_t i) {
                  aligned = aligned && reinterpret_cast<uintptr_t>(a + i * ES) % 16 == 0 &&
                            reinterpret_cast<uintptr_t>(b + i * ES) % 16 == 0;
                  for (size_t k = 0; k < V; ++k) ++seen.at(i + k);
                },
                [&](size_t i) { ++seen.at(i); });
          }
          const bool once = std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; });
          // With equal offsets modulo 16 the body must be vectorized once the count allows it.
          const bool vectorized = offA != offB || peel.nvec > 0 || count < 2 * V;
          expect(once && aligned && vectorized, "peeled loop coverage");
          ++runs;
        }
      }
    }
  }
  return runs;
}

void checkPeel() {
  const size_t runs = checkPeelFor<1>() + checkPeelFor<2>() + checkPeelFor<4>() + checkPeelFor<8>();
  std::printf("  peeled loop: %zu layouts, every element once, every vector aligned\n", runs);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  std::printf("conversions (element_ops.cuh vs the CPU core)\n");
  checkConversionsExhaustive(quick);
  checkDecodeTables();
  std::printf("fp8 block algorithm\n");
  checkFp8Blocks<ops::E4M3>(codecs::Codec::kFp8E4M3, "fp8_e4m3");
  checkFp8Blocks<ops::E5M2>(codecs::Codec::kFp8E5M2, "fp8_e5m2");
  checkHalfCodecs();
  std::printf("reduce\n");
  checkReduce();
  reportNanOrder();
  checkPeel();
  std::printf("%s: %zu failure(s)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
