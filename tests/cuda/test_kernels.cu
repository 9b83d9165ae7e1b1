// GPU test of csrc/cuda against the CPU core: every kernel, every element, bit for bit; then the
// kernels' bandwidth against cudaMemcpy device-to-device measured in the same run.
//
// Built and run by benchmarks/gpu_check.sh (nvcc; the core's codec sources compiled by g++ and
// linked in), not by CMake. Exit status: 0 all checks passed, 1 a mismatch, 2 a CUDA error.
//
// Every output region lies between 64 poisoned (0xff) bytes on each side, in a buffer poisoned
// before the kernel runs: a kernel that skips an element leaves 0xff bytes, which no expected value
// here equals in full, and one that writes out of bounds changes the slack, which is checked too.
// Inputs are placed at several offsets, so the aligned vector paths, the peeled heads and tails and
// the unaligned scalar paths all run. The data (check_common.h) covers the special cases of every
// format; NaN payloads are compared bit for bit (see check_common.h for the one exclusion).
//
// Flags: --quick skips the exhaustive conversion sweep over all 2^32 fp32 inputs;
//        --bench-mib N sets the fp32 buffer size of the timing section (default 256).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "check_common.h"
#include "core/codecs/block_codec.h"
#include "core/codecs/fp8.h"
#include "core/codecs/reduce.h"
#include "core/error.h"
#include "cuda/codec_kernels.cuh"
#include "cuda/element_ops.cuh"
#include "cuda/reduce_kernels.cuh"

using namespace pycomm;
using namespace pycomm::cuda_test;
using codecs::Codec;

#define CUDA_CHECK(expr)                                                                          \
  do {                                                                                            \
    const cudaError_t err_ = (expr);                                                              \
    if (err_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(err_)); \
      std::exit(2);                                                                               \
    }                                                                                             \
  } while (0)

namespace {

constexpr size_t kSlack = 64;
constexpr uint8_t kPoison = 0xff;

size_t failures = 0;
size_t checks = 0;

void expect(bool ok, const std::string& what) {
  ++checks;
  if (!ok) {
    ++failures;
    std::printf("FAILED: %s\n", what.c_str());
  }
}

// ---- poisoned device buffers -------------------------------------------------------------------------

// `bytes` bytes at byte offset `offset` (mod 16 after the 64-byte slack) inside a buffer whose every
// other byte is 0xff; cudaMalloc returns 256-byte aligned memory, so offset sets the alignment.
class DevRegion {
 public:
  DevRegion(size_t bytes, size_t offset) : bytes_(bytes), offset_(offset), total_(2 * kSlack + offset + bytes) {
    CUDA_CHECK(cudaMalloc(&base_, total_));
    CUDA_CHECK(cudaMemset(base_, kPoison, total_));
  }
  DevRegion(const DevRegion&) = delete;
  DevRegion& operator=(const DevRegion&) = delete;
  ~DevRegion() { cudaFree(base_); }

  uint8_t* ptr() { return base_ + kSlack + offset_; }
  template <typename T>
  T* as() { return reinterpret_cast<T*>(ptr()); }

  void upload(const void* data) {
    if (bytes_) CUDA_CHECK(cudaMemcpy(ptr(), data, bytes_, cudaMemcpyHostToDevice));
  }
  // The region's bytes; records a failure if any slack byte changed.
  std::vector<uint8_t> download(const std::string& what) {
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint8_t> all(total_);
    CUDA_CHECK(cudaMemcpy(all.data(), base_, total_, cudaMemcpyDeviceToHost));
    size_t touched = 0;
    for (size_t i = 0; i < kSlack + offset_; ++i) touched += all[i] != kPoison;
    for (size_t i = kSlack + offset_ + bytes_; i < total_; ++i) touched += all[i] != kPoison;
    expect(touched == 0, what + ": " + std::to_string(touched) + " bytes written outside the region");
    return std::vector<uint8_t>(all.begin() + kSlack + offset_, all.begin() + kSlack + offset_ + bytes_);
  }

 private:
  uint8_t* base_ = nullptr;
  size_t bytes_, offset_, total_;
};

bool sameBytes(const std::string& what, const std::vector<uint8_t>& got, const void* want, size_t n, size_t es) {
  return compareElements(what.c_str(), got.data(), want, n, es) == 0;
}

// ---- reduce ------------------------------------------------------------------------------------------

void checkReduce() {
  const size_t counts[] = {1, 2, 15, 16, 17, 31, 255, 4099, 100003};
  const size_t offsets[][2] = {{0, 0}, {1, 1}, {0, 1}, {3, 3}, {5, 2}};  // (dst, src) in elements
  size_t runs = 0;
  for (const ReduceCase& c : supportedReduceCases()) {
    const size_t es = elementSize(c.dtype);
    auto run = [&](size_t count, size_t dOff, size_t sOff) {
      const uint64_t seed = count * 1000003 + static_cast<uint64_t>(c.dtype) * 101 + static_cast<uint64_t>(c.op) * 7;
      std::vector<uint8_t> dst = reduceInput(c.dtype, count, seed);
      const std::vector<uint8_t> src = reduceInput(c.dtype, count, seed + 1);
      fixBothNan(c.dtype, dst, src);
      std::vector<uint8_t> want = dst;
      codecs::reduceInto(want.data(), src.data(), count, c.dtype, c.op);
      DevRegion d(count * es, dOff * es), s(count * es, sOff * es);
      d.upload(dst.data());
      s.upload(src.data());
      cuda::reduceInto(d.ptr(), s.ptr(), count, c.dtype, c.op, nullptr);
      CUDA_CHECK(cudaGetLastError());
      const std::string what = std::string("reduce ") + dtypeName(c.dtype) + " " + reduceOpName(c.op) +
                               " n=" + std::to_string(count) + " off=" + std::to_string(dOff) + "," + std::to_string(sOff);
      expect(sameBytes(what, d.download(what), want.data(), count, es), what);
      expect(sameBytes(what + " (src untouched)", s.download(what + " src"), src.data(), count, es), what + " src");
      ++runs;
    };
    for (size_t count : counts) {
      for (const auto& off : offsets) run(count, off[0], off[1]);
    }
    run((size_t{1} << 20) + 13, 0, 0);
  }
  // The CPU's rejections, and count == 0.
  bool threw = false;
  try {
    cuda::reduceInto(nullptr, nullptr, 4, DataType::kFloat32, ReduceOp::kBxor, nullptr);
  } catch (const InvalidUsageError&) {
    threw = true;
  }
  expect(threw, "reduce: bitwise op on float32 throws InvalidUsageError");
  cuda::reduceInto(nullptr, nullptr, 0, DataType::kFloat32, ReduceOp::kSum, nullptr);
  expect(cudaGetLastError() == cudaSuccess, "reduce: count 0 launches nothing");
  std::printf("  reduce: %zu runs over %zu (dtype, op) pairs\n", runs, supportedReduceCases().size());
}

// ---- codecs ------------------------------------------------------------------------------------------

const Codec kCodecs[] = {Codec::kFp16, Codec::kBf16, Codec::kFp8E4M3, Codec::kFp8E5M2};

// scale(): every bit pattern class (NaNs with payloads and signs, infinities, subnormals, zeros)
// times several factors, against the CPU's `x *= factor`, at an odd offset.
void checkScale() {
  const size_t n = 100003;
  std::vector<float> host(n);
  uint32_t state = 12345u;
  for (size_t i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    uint32_t bits = state;
    if (i % 7 == 0) bits = (bits & 0x807fffffu) | 0x7f800000u;  // NaN or infinity
    if (i % 11 == 0) bits &= 0x807fffffu;                       // subnormal or zero
    std::memcpy(&host[i], &bits, 4);
  }
  for (float factor : {1.0f / 3.0f, 0.5f, 1.0f / 7.0f, 1.0f, -2.0f}) {
    std::vector<float> want = host;
    for (float& x : want) x *= factor;
    DevRegion d(n * 4, 4);
    d.upload(host.data());
    cuda::scale(d.as<float>(), n, factor, nullptr);
    const std::string what = "scale by " + std::to_string(factor);
    expect(sameBytes(what, d.download(what), want.data(), n, 4), what);
  }
}

void checkCodecCase(Codec codec, size_t count, size_t fOff, size_t eOff) {
  const std::string tag = std::string(codecs::codecName(codec)) + " n=" + std::to_string(count) + " off=" +
                          std::to_string(fOff) + "f," + std::to_string(eOff) + "b";
  const uint64_t seed = count * 31 + fOff * 7 + eOff + static_cast<uint64_t>(codec) * 1000;
  const std::vector<float> x = codecInput(count, seed);
  const std::vector<float> acc = accInput(count, seed + 1);
  const size_t eb = codecs::encodedBytes(codec, count);
  const size_t fb = count * sizeof(float);

  // CPU references.
  std::vector<uint8_t> enc(eb);
  codecs::encode(codec, x.data(), count, enc.data());
  std::vector<float> dec(count);
  codecs::decode(codec, enc.data(), count, dec.data());
  std::vector<float> sum = acc;
  codecs::decodeAdd(codec, enc.data(), count, sum.data());

  // encode
  {
    DevRegion in(fb, fOff * 4), out(eb, eOff);
    in.upload(x.data());
    cuda::encode(codec, in.as<float>(), count, out.ptr(), nullptr);
    expect(sameBytes("encode " + tag, out.download("encode " + tag), enc.data(), eb, 1), "encode " + tag);
  }
  // decode
  {
    DevRegion in(eb, eOff), out(fb, fOff * 4);
    in.upload(enc.data());
    cuda::decode(codec, in.ptr(), count, out.as<float>(), nullptr);
    expect(sameBytes("decode " + tag, out.download("decode " + tag), dec.data(), count, 4), "decode " + tag);
  }
  // decodeAdd
  {
    DevRegion in(eb, eOff), io(fb, fOff * 4);
    in.upload(enc.data());
    io.upload(acc.data());
    cuda::decodeAdd(codec, in.ptr(), count, io.as<float>(), nullptr);
    expect(sameBytes("decodeAdd " + tag, io.download("decodeAdd " + tag), sum.data(), count, 4), "decodeAdd " + tag);
  }
  // decodeAddEncode, out of place (with and without the AVG scale) and in place
  for (float scale : {1.0f, 0.25f, 1.0f / 3.0f}) {
    std::vector<float> tmp = sum;
    if (scale != 1.0f) {
      for (float& t : tmp) t *= scale;
    }
    std::vector<uint8_t> want(eb);
    codecs::encode(codec, tmp.data(), count, want.data());
    const std::string what = "decodeAddEncode " + tag + " scale=" + std::to_string(scale);
    DevRegion in(eb, eOff), a(fb, fOff * 4), out(eb, scale == 1.0f ? eOff : (eOff + 3) % 16);
    in.upload(enc.data());
    a.upload(acc.data());
    cuda::decodeAddEncode(codec, in.ptr(), a.as<float>(), count, out.ptr(), nullptr, scale);
    expect(sameBytes(what, out.download(what), want.data(), eb, 1), what);
    expect(sameBytes(what + " (acc untouched)", a.download(what + " acc"), acc.data(), count, 4), what + " acc");
    expect(sameBytes(what + " (in untouched)", in.download(what + " in"), enc.data(), eb, 1), what + " in");
    if (scale == 1.0f) {
      DevRegion io(eb, eOff);
      io.upload(enc.data());
      cuda::decodeAddEncode(codec, io.ptr(), a.as<float>(), count, io.ptr(), nullptr, scale);
      expect(sameBytes(what + " in place", io.download(what + " in place"), want.data(), eb, 1), what + " in place");
    }
  }
}

void checkCodecs() {
  const size_t counts[] = {1, 7, 8, 9, 255, 256, 257, 511, 513, 1000, 4097, 100001};
  const size_t offsets[][2] = {{0, 0}, {1, 2}, {3, 6}, {0, 1}, {4, 4}, {2, 12}};  // (floats, encoded bytes)
  size_t runs = 0;
  for (Codec codec : kCodecs) {
    for (size_t count : counts) {
      for (const auto& off : offsets) {
        checkCodecCase(codec, count, off[0], off[1]);
        ++runs;
      }
    }
    checkCodecCase(codec, (size_t{1} << 22) + 77, 0, 0);
    ++runs;
    // count == 0: nothing launched, nothing thrown.
    cuda::encode(codec, nullptr, 0, nullptr, nullptr);
    cuda::decode(codec, nullptr, 0, nullptr, nullptr);
    cuda::decodeAdd(codec, nullptr, 0, nullptr, nullptr);
    cuda::decodeAddEncode(codec, nullptr, nullptr, 0, nullptr, nullptr);
  }
  bool threw = false;
  try {
    cuda::encode(static_cast<Codec>(9), nullptr, 4, nullptr, nullptr);
  } catch (const InvalidUsageError&) {
    threw = true;
  }
  expect(threw, "encode: unknown codec throws InvalidUsageError");
  expect(cudaGetLastError() == cudaSuccess, "codecs: count 0 launches nothing");
  std::printf("  codecs: %zu (codec, count, offsets) cases x encode, decode, decodeAdd, decodeAddEncode\n", runs);
}

// fp8 decode of every code under assorted scale words (E4M3 Inf blocks: the negative ones), and
// fp16/bf16 decode of every code, through the API.
void checkDecodeEveryCode() {
  for (Codec codec : {Codec::kFp8E4M3, Codec::kFp8E5M2}) {
    const float scales[] = {1.0f, 0.5f, 3.0f, 1e30f, std::ldexp(1.0f, -130), std::ldexp(3.0f, -149), 0.0f,
                            -1.0f, -0.0f, -std::ldexp(1.0f, -140), -7.5f, INFINITY};
    const size_t nblocks = sizeof(scales) / sizeof(scales[0]);
    const size_t count = 256 * nblocks;
    std::vector<uint8_t> enc(codecs::encodedBytes(codec, count));
    for (size_t b = 0; b < nblocks; ++b) {
      std::memcpy(&enc[b * 260], &scales[b], 4);
      for (int c = 0; c < 256; ++c) enc[b * 260 + 4 + c] = static_cast<uint8_t>(c);
    }
    std::vector<float> want(count);
    codecs::decode(codec, enc.data(), count, want.data());
    const std::vector<float> acc = accInput(count, 4242);
    std::vector<float> wantSum = acc;
    codecs::decodeAdd(codec, enc.data(), count, wantSum.data());
    for (size_t eOff : {size_t{0}, size_t{1}}) {
      const std::string what = std::string(codecs::codecName(codec)) + " decode every code x scales, off=" + std::to_string(eOff);
      DevRegion in(enc.size(), eOff), out(count * 4, 0), io(count * 4, 0);
      in.upload(enc.data());
      io.upload(acc.data());
      cuda::decode(codec, in.ptr(), count, out.as<float>(), nullptr);
      cuda::decodeAdd(codec, in.ptr(), count, io.as<float>(), nullptr);
      expect(sameBytes(what, out.download(what), want.data(), count, 4), what);
      expect(sameBytes(what + " (decodeAdd)", io.download(what + " add"), wantSum.data(), count, 4), what + " add");
    }
  }
  for (Codec codec : {Codec::kFp16, Codec::kBf16}) {
    std::vector<uint8_t> enc(2 * 65536);
    for (uint32_t h = 0; h < 65536; ++h) {
      enc[2 * h] = static_cast<uint8_t>(h);
      enc[2 * h + 1] = static_cast<uint8_t>(h >> 8);
    }
    std::vector<float> want(65536);
    codecs::decode(codec, enc.data(), 65536, want.data());
    const std::string what = std::string(codecs::codecName(codec)) + " decode every code";
    DevRegion in(enc.size(), 0), out(65536 * 4, 0);
    in.upload(enc.data());
    cuda::decode(codec, in.ptr(), 65536, out.as<float>(), nullptr);
    expect(sameBytes(what, out.download(what), want.data(), 65536, 4), what);
  }
}

// ---- every fp32 input: fp16/bf16 encode through the API, raw fp8 conversions by a test kernel -------

__global__ void iotaBits(uint64_t base, size_t n, float* out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = __uint_as_float(static_cast<uint32_t>(base + i));
  }
}

__global__ void fp8All(const float* in, size_t n, uint8_t* e4, uint8_t* e5) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    e4[i] = cuda::ops::floatToFp8E4M3(in[i]);
    e5[i] = cuda::ops::floatToFp8E5M2(in[i]);
  }
}

void parallelFor(size_t n, const std::function<void(size_t, size_t)>& fn) {
  const size_t t = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (size_t k = 0; k < t; ++k) {
    const size_t b = n * k / t, e = n * (k + 1) / t;
    threads.emplace_back([&fn, b, e] { fn(b, e); });
  }
  for (auto& th : threads) th.join();
}

void checkAllInputs() {
  constexpr size_t kChunk = size_t{1} << 26;
  float* dIn;
  uint8_t *dF16, *dB16, *dE4, *dE5;
  CUDA_CHECK(cudaMalloc(&dIn, kChunk * 4));
  CUDA_CHECK(cudaMalloc(&dF16, kChunk * 2));
  CUDA_CHECK(cudaMalloc(&dB16, kChunk * 2));
  CUDA_CHECK(cudaMalloc(&dE4, kChunk));
  CUDA_CHECK(cudaMalloc(&dE5, kChunk));
  uint8_t* host;
  CUDA_CHECK(cudaMallocHost(&host, kChunk * 6));
  uint8_t *hF16 = host, *hB16 = host + 2 * kChunk, *hE4 = host + 4 * kChunk, *hE5 = host + 5 * kChunk;
  std::atomic<size_t> bad[4] = {};
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t base = 0; base < (uint64_t{1} << 32); base += kChunk) {
    iotaBits<<<1024, 256>>>(base, kChunk, dIn);
    cuda::encode(Codec::kFp16, dIn, kChunk, dF16, nullptr);
    cuda::encode(Codec::kBf16, dIn, kChunk, dB16, nullptr);
    fp8All<<<1024, 256>>>(dIn, kChunk, dE4, dE5);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpy(hF16, dF16, kChunk * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hB16, dB16, kChunk * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hE4, dE4, kChunk, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hE5, dE5, kChunk, cudaMemcpyDeviceToHost));
    parallelFor(kChunk / 4096, [&](size_t b, size_t e) {
      std::vector<float> in(4096);
      std::vector<uint8_t> f16(8192), b16(8192), e4(4096), e5(4096);
      size_t local[4] = {};
      for (size_t piece = b; piece < e; ++piece) {
        const size_t at = piece * 4096;
        for (size_t i = 0; i < 4096; ++i) in[i] = bitsf(static_cast<uint32_t>(base + at + i));
        codecs::encode(Codec::kFp16, in.data(), 4096, f16.data());
        codecs::encode(Codec::kBf16, in.data(), 4096, b16.data());
        codecs::floatToFp8E4M3(in.data(), 4096, e4.data());
        codecs::floatToFp8E5M2(in.data(), 4096, e5.data());
        local[0] += std::memcmp(f16.data(), hF16 + 2 * at, 8192) != 0;
        local[1] += std::memcmp(b16.data(), hB16 + 2 * at, 8192) != 0;
        local[2] += std::memcmp(e4.data(), hE4 + at, 4096) != 0;
        local[3] += std::memcmp(e5.data(), hE5 + at, 4096) != 0;
      }
      for (int k = 0; k < 4; ++k) bad[k] += local[k];
    });
  }
  const char* names[4] = {"fp16 encode (API)", "bf16 encode (API)", "fp8 e4m3 conversion", "fp8 e5m2 conversion"};
  for (int k = 0; k < 4; ++k) {
    expect(bad[k] == 0, std::string(names[k]) + " over all 2^32 fp32 inputs: " + std::to_string(bad[k].load()) +
                            " runs of 4096 inputs differ");
  }
  std::printf("  every fp32 input: fp16, bf16 (kernels), e4m3, e5m2 (device conversions) in %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  cudaFreeHost(host);
  cudaFree(dIn);
  cudaFree(dF16);
  cudaFree(dB16);
  cudaFree(dE4);
  cudaFree(dE5);
}

// ---- bandwidth ---------------------------------------------------------------------------------------

// Deterministic finite test values, |x| < 2^8, with some zeros: as fast to produce as to copy.
__global__ void fillFloats(float* out, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9e3779b1u + seed;
    h ^= h >> 15;
    h *= 0x85ebca77u;
    h ^= h >> 13;
    const uint32_t exp = 119u + (h >> 28);         // 2^-8 .. 2^7
    out[i] = (h & 0xf) == 0 ? 0.0f : __uint_as_float((h & 0x80000000u) | (exp << 23) | (h & 0x7fffffu) >> 4);
  }
}

struct Row {
  std::string name;
  double gbps;
};

// Seconds per call of fn, median of 5 timed loops of `iters` calls after a warm-up.
double timeIt(const std::function<void()>& fn, int iters = 10) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> times;
  for (int r = 0; r < 5; ++r) {
    CUDA_CHECK(cudaEventRecord(a));
    for (int i = 0; i < iters; ++i) fn();
    CUDA_CHECK(cudaEventRecord(b));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    times.push_back(ms / 1e3 / iters);
  }
  CUDA_CHECK(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::vector<Row> bandwidth(size_t mib) {
  const size_t bytes = mib << 20;
  const size_t n = bytes / 4;  // fp32 elements
  uint8_t *a, *b, *e1, *e2;
  CUDA_CHECK(cudaMalloc(&a, bytes));
  CUDA_CHECK(cudaMalloc(&b, bytes));
  CUDA_CHECK(cudaMalloc(&e1, codecs::encodedBytes(Codec::kFp16, n)));
  CUDA_CHECK(cudaMalloc(&e2, codecs::encodedBytes(Codec::kFp16, n)));
  auto* fa = reinterpret_cast<float*>(a);
  auto* fb = reinterpret_cast<float*>(b);
  fillFloats<<<2048, 256>>>(fa, n, 1);
  fillFloats<<<2048, 256>>>(fb, n, 2);
  CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<Row> rows;
  auto add = [&](const std::string& name, double moved, const std::function<void()>& fn) {
    rows.push_back({name, moved / timeIt(fn) / 1e9});
  };
  add("cudaMemcpy D2D", 2.0 * bytes, [&] { CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); });
  // The copy overwrote b; restore distinct data.
  fillFloats<<<2048, 256>>>(fb, n, 2);

  const std::pair<DataType, ReduceOp> reduces[] = {
      {DataType::kFloat32, ReduceOp::kSum},  {DataType::kFloat32, ReduceOp::kMax},  {DataType::kFloat16, ReduceOp::kSum},
      {DataType::kBFloat16, ReduceOp::kSum}, {DataType::kFloat64, ReduceOp::kSum},  {DataType::kInt32, ReduceOp::kSum},
      {DataType::kInt8, ReduceOp::kSum},     {DataType::kInt64, ReduceOp::kBxor},   {DataType::kBool, ReduceOp::kSum}};
  for (const auto& [dtype, op] : reduces) {
    const size_t count = bytes / elementSize(dtype);
    add(std::string("reduce ") + dtypeName(dtype) + " " + reduceOpName(op), 3.0 * bytes,
        [&, dtype = dtype, op = op] { cuda::reduceInto(a, b, count, dtype, op, nullptr); });
  }
  fillFloats<<<2048, 256>>>(fa, n, 1);
  for (Codec codec : kCodecs) {
    const double eb = static_cast<double>(codecs::encodedBytes(codec, n));
    const std::string name = codecs::codecName(codec);
    cuda::encode(codec, fa, n, e1, nullptr);
    add("encode " + name, 4.0 * n + eb, [&] { cuda::encode(codec, fa, n, e1, nullptr); });
    add("decode " + name, eb + 4.0 * n, [&] { cuda::decode(codec, e1, n, fb, nullptr); });
    add("decodeAdd " + name, eb + 8.0 * n, [&] { cuda::decodeAdd(codec, e1, n, fb, nullptr); });
    add("decodeAddEncode " + name, 2 * eb + 4.0 * n, [&] { cuda::decodeAddEncode(codec, e1, fa, n, e2, nullptr); });
  }
  cudaFree(a);
  cudaFree(b);
  cudaFree(e1);
  cudaFree(e2);
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  size_t benchMib = 256;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (std::strcmp(argv[i], "--bench-mib") == 0 && i + 1 < argc) benchMib = std::strtoull(argv[++i], nullptr, 10);
  }
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  std::printf("device %d: %s, sm_%d%d, %d SMs, %.1f GiB; runtime %d, driver %d\n", device, prop.name, prop.major,
              prop.minor, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, runtime, driver);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Row> rows;
  try {
    std::printf("correctness (every element against the CPU core)\n");
    checkReduce();
    checkCodecs();
    checkDecodeEveryCode();
    checkScale();
    if (!quick) checkAllInputs();
    rows = bandwidth(benchMib);
  } catch (const std::exception& e) {
    std::printf("FAILED: exception: %s\n", e.what());
    ++failures;
  }
  std::printf("%s: %zu checks, %zu failed (%.1f s)\n", failures ? "FAIL" : "PASS", checks, failures,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (!rows.empty()) {
    const double copy = rows.front().gbps;
    std::printf("\nbandwidth: %zu MiB fp32 buffers; GB/s = (bytes read + bytes written) / time, 1 GB = 1e9 B\n", benchMib);
    std::printf("%-28s %10s %12s\n", "kernel", "GB/s", "% of copy");
    for (const Row& r : rows) std::printf("%-28s %10.1f %11.1f%%\n", r.name.c_str(), r.gbps, 100.0 * r.gbps / copy);
  }
  return failures ? 1 : 0;
}
