// Hierarchical compressed collectives: several "hosts" of several ranks each (ranks as threads,
// host ids interleaved as a launcher might place them), shared memory inside a host and TCP on
// loopback across. Every result is compared bit for bit with a reference computed here from the
// definition: each host sums its ranks' fp32 inputs in local-rank order, that sum is rounded once
// through the codec, the owner of a segment adds the hosts' rounded sums (its own first, then the
// others in host order) in fp32, scales, and rounds once more. The reference takes only the places
// where encoded segments begin (fp8 block scales start there) from the schedule's cut; the sums and
// roundings are its own. One rank a host is the flat schedule, checked the same way. Error feedback
// is checked the same way, residuals included. Also: all ranks agree, the error against the exact double sum is small,
// the stats count the bytes that crossed, and a mismatch between ranks fails rather than hangs.
#include <cmath>
#include <cstring>
#include <random>

#include "core/algorithms/hierarchical_compressed.h"
#include "core/codecs/block_codec.h"
#include "core/communicator.h"
#include "group.h"
#include "harness.h"

using namespace pycomm;
using pycomm::testing::MemoryStore;
using pycomm::testing::runRanks;

namespace {

constexpr size_t kChunkBytes = 4096;  // 1024 elements a segment: many chunks, partial ones too

struct Grid {
  int hosts;
  int perHost;
  int size() const { return hosts * perHost; }
  // Interleaved placement: rank r on host r % hosts, so a host's ranks are not consecutive.
  int rankAt(int host, int local) const { return local * hosts + host; }
};

std::vector<std::unique_ptr<Communicator>> makeGroup(const Grid& g, MemoryStore& store,
                                                     size_t chunkBytes = kChunkBytes) {
  return pycomm::testing::makeGroup(g.size(), store, [&](int r, Config& config) {
    config.timeout = std::chrono::seconds(30);
    config.chunkBytes = chunkBytes;
    config.shmSlotBytes = 4096;
    config.hostId = strCat("host", r % g.hosts);
  });
}

std::vector<float> roundTrip(codecs::Codec codec, const float* in, size_t n) {
  std::vector<uint8_t> encoded(codecs::encodedBytes(codec, n));
  std::vector<float> out(n);
  codecs::encode(codec, in, n, encoded.data());
  codecs::decode(codec, encoded.data(), n, out.data());
  return out;
}

// inputs[r]: rank r's data; element i of host h's fp32 sum, local ranks in order.
std::vector<float> hostSum(const Grid& g, const std::vector<std::vector<float>>& inputs, int host, size_t begin,
                           size_t n) {
  std::vector<float> sum(n, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    float s = inputs[g.rankAt(host, 0)][begin + i];
    for (int l = 1; l < g.perHost; ++l) s += inputs[g.rankAt(host, l)][begin + i];
    sum[i] = s;
  }
  return sum;
}

// The reference all-reduce of elements [begin, begin + n), one encoded segment owned by cross rank
// `owner`, of local index `local`. With `residuals` (error feedback), the residual of the rank of
// that local index on each host is added to the host's sum before it is rounded, and becomes what
// that rounding dropped.
void referenceSegment(const Grid& g, const std::vector<std::vector<float>>& inputs, codecs::Codec codec, bool average,
                      size_t begin, size_t n, int owner, int local, std::vector<float>& out,
                      std::vector<std::vector<float>>* residuals) {
  std::vector<std::vector<float>> rounded(g.hosts);
  for (int h = 0; h < g.hosts; ++h) {
    auto sum = hostSum(g, inputs, h, begin, n);
    if (residuals != nullptr) {
      float* r = (*residuals)[g.rankAt(h, local)].data() + begin;
      for (size_t i = 0; i < n; ++i) sum[i] += r[i];
      rounded[h] = roundTrip(codec, sum.data(), n);
      for (size_t i = 0; i < n; ++i) r[i] = sum[i] - rounded[h][i];
      continue;
    }
    rounded[h] = roundTrip(codec, sum.data(), n);
  }
  std::vector<float> acc = rounded[owner];
  for (int h = 0; h < g.hosts; ++h) {
    if (h == owner) continue;
    for (size_t i = 0; i < n; ++i) acc[i] += rounded[h][i];
  }
  if (average) {
    const float factor = 1.0f / static_cast<float>(g.size());
    for (float& x : acc) x *= factor;
  }
  const auto result = roundTrip(codec, acc.data(), n);
  std::copy(result.begin(), result.end(), out.begin() + begin);
}

std::vector<float> referenceAllreduce(const Grid& g, const std::vector<std::vector<float>>& inputs,
                                      codecs::Codec codec, bool average, size_t count,
                                      std::vector<std::vector<float>>* residuals = nullptr) {
  std::vector<float> out(count);
  for (int l = 0; l < g.perHost; ++l) {
    const auto cut = algorithms::hierarchicalCut(count, l, g.perHost, g.hosts, codec, kChunkBytes);
    for (const auto& piece : cut.pieces) {
      for (int h = 0; h < g.hosts; ++h) {
        referenceSegment(g, inputs, codec, average, piece.begin + piece.segments.offset(h), piece.segments.length(h), h,
                         l, out, residuals);
      }
    }
  }
  return out;
}

std::vector<float> randomInput(int rank, size_t count, uint32_t seed) {
  std::mt19937 gen(seed * 977 + rank);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(count);
  for (auto& v : x) v = normal(gen) * static_cast<float>(1 + rank % 3);
  return x;
}

bool sameBits(const float* a, const float* b, size_t n) { return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0; }

void checkAllreduce(const Grid& g, std::vector<std::unique_ptr<Communicator>>& comms) {
  for (codecs::Codec codec : {codecs::Codec::kFp16, codecs::Codec::kBf16, codecs::Codec::kFp8E4M3,
                              codecs::Codec::kFp8E5M2}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{255}, size_t{257}, size_t{4099}, size_t{100003}}) {
      for (bool average : {false, true}) {
        std::vector<std::vector<float>> inputs(g.size()), outputs(g.size());
        for (int r = 0; r < g.size(); ++r) inputs[r] = randomInput(r, count, static_cast<uint32_t>(count));
        runRanks(g.size(), [&](int r) {
          outputs[r] = inputs[r];
          comms[r]->allreduceCompressed(outputs[r].data(), count, codec, average);
        });
        const auto expect = referenceAllreduce(g, inputs, codec, average, count);
        double err = 0, norm = 0;
        for (size_t i = 0; i < count; ++i) {
          double exact = 0;
          for (int r = 0; r < g.size(); ++r) exact += inputs[r][i];
          if (average) exact /= g.size();
          err += (outputs[0][i] - exact) * (outputs[0][i] - exact);
          norm += exact * exact;
        }
        for (int r = 0; r < g.size(); ++r) {
          EXPECT_TRUE(sameBits(outputs[r].data(), expect.data(), count), g.hosts, "x", g.perHost, " ",
                      codecs::codecName(codec), " count ", count, " average ", average, ": rank ", r,
                      " differs from the two-rounding reference");
        }
        const double bound = codec == codecs::Codec::kFp16 ? 1e-3 : codec == codecs::Codec::kBf16 ? 8e-3
                             : codec == codecs::Codec::kFp8E4M3 ? 4.5e-2 : 9e-2;
        if (count >= 255) {
          EXPECT_TRUE(std::sqrt(err / norm) <= bound, codecs::codecName(codec), " count ", count, " relative error ",
                      std::sqrt(err / norm));
        }
      }
    }
  }
}

void checkReduceScatterAndAllgather(const Grid& g, std::vector<std::unique_ptr<Communicator>>& comms) {
  const int p = g.size();
  for (codecs::Codec codec : {codecs::Codec::kFp16, codecs::Codec::kFp8E4M3}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{257}, size_t{5003}}) {
      std::vector<std::vector<float>> inputs(p), outputs(p), gathered(p);
      for (int r = 0; r < p; ++r) inputs[r] = randomInput(r, p * count, static_cast<uint32_t>(count + 1));
      runRanks(p, [&](int r) {
        outputs[r].resize(count);
        comms[r]->reduceScatterCompressed(inputs[r].data(), outputs[r].data(), count, codec, true);
        gathered[r].resize(p * count);
        comms[r]->allgatherCompressed(outputs[r].data(), gathered[r].data(), count, codec);
      });
      for (int host = 0; host < g.hosts; ++host) {
        for (int local = 0; local < g.perHost; ++local) {
          const int r = g.rankAt(host, local);
          // Rank r's block: each host's fp32 sum of it rounded once, added in fp32 (r's host first).
          std::vector<std::vector<float>> rounded(g.hosts);
          for (int h = 0; h < g.hosts; ++h) {
            const auto sum = hostSum(g, inputs, h, r * count, count);
            rounded[h] = roundTrip(codec, sum.data(), count);
          }
          std::vector<float> expect = rounded[host];
          for (int h = 0; h < g.hosts; ++h) {
            if (h == host) continue;
            for (size_t i = 0; i < count; ++i) expect[i] += rounded[h][i];
          }
          for (float& x : expect) x *= 1.0f / static_cast<float>(p);
          EXPECT_TRUE(sameBits(outputs[r].data(), expect.data(), count), g.hosts, "x", g.perHost, " ",
                      codecs::codecName(codec), " reduce-scatter count ", count, " rank ", r);
        }
      }
      for (int r = 0; r < p; ++r) {
        for (int q = 0; q < p; ++q) {
          const auto expect = roundTrip(codec, outputs[q].data(), count);
          EXPECT_TRUE(sameBits(gathered[r].data() + q * count, expect.data(), count), g.hosts, "x", g.perHost, " ",
                      codecs::codecName(codec), " all-gather count ", count, " rank ", r, " block ", q);
        }
      }
    }
  }
}

// Error feedback over three calls: results and residuals bit for bit as the reference says.
void checkErrorFeedback(const Grid& g, std::vector<std::unique_ptr<Communicator>>& comms) {
  for (codecs::Codec codec : {codecs::Codec::kBf16, codecs::Codec::kFp8E4M3}) {
    for (size_t count : {size_t{1}, size_t{257}, size_t{100003}}) {
      std::vector<std::vector<float>> residuals(g.size(), std::vector<float>(count, 0.0f));
      std::vector<std::vector<float>> expectResiduals = residuals;
      for (uint32_t call = 0; call < 3; ++call) {
        std::vector<std::vector<float>> inputs(g.size()), outputs(g.size());
        for (int r = 0; r < g.size(); ++r) inputs[r] = randomInput(r, count, 100 + call);
        runRanks(g.size(), [&](int r) {
          outputs[r] = inputs[r];
          comms[r]->allreduceCompressed(outputs[r].data(), count, codec, true, residuals[r].data());
        });
        const auto expect = referenceAllreduce(g, inputs, codec, true, count, &expectResiduals);
        for (int r = 0; r < g.size(); ++r) {
          EXPECT_TRUE(sameBits(outputs[r].data(), expect.data(), count), g.hosts, "x", g.perHost, " ",
                      codecs::codecName(codec), " error feedback call ", call, " count ", count, ": rank ", r, " result");
          EXPECT_TRUE(sameBits(residuals[r].data(), expectResiduals[r].data(), count), g.hosts, "x", g.perHost, " ",
                      codecs::codecName(codec), " error feedback call ", call, " count ", count, ": rank ", r,
                      " residual");
        }
      }
      double kept = 0;
      for (const auto& r : residuals) for (float x : r) kept += std::abs(x);
      EXPECT_TRUE(count < 257 || kept > 0, "error feedback keeps a residual");
    }
  }
}

// Only what crosses hosts is counted, and it is compressed: about count * 2 bytes (fp16) for a
// 2-host all-reduce, shared among a host's ranks.
void checkBytesAcrossHosts(const Grid& g, std::vector<std::unique_ptr<Communicator>>& comms) {
  const size_t count = 1 << 16;
  std::vector<uint64_t> before(g.size()), after(g.size());
  runRanks(g.size(), [&](int r) {
    std::vector<float> x = randomInput(r, count, 5);
    before[r] = comms[r]->stats()["allreduce/fp16"].bytesSent;
    comms[r]->allreduceCompressed(x.data(), count, codecs::Codec::kFp16, false);
    after[r] = comms[r]->stats()["allreduce/fp16"].bytesSent;
  });
  uint64_t total = 0;
  for (int r = 0; r < g.size(); ++r) total += after[r] - before[r];
  // Each host sends (hosts - 1) / hosts of the encoded data twice (all-to-all, then all-gather).
  const double expect = 2.0 * count * 2 * (g.hosts - 1) / g.hosts * g.hosts;
  EXPECT_TRUE(std::abs(static_cast<double>(total) - expect) <= 0.01 * expect, "bytes across hosts ", total,
              " expected about ", expect);
}

// A rank that runs an uncompressed all-reduce where the others run a compressed one fails, and so
// do the others, well before the timeout.
void checkMismatch(const Grid& g, std::vector<std::unique_ptr<Communicator>>& comms) {
  std::atomic<int> failed{0};
  const auto start = std::chrono::steady_clock::now();
  runRanks(g.size(), [&](int r) {
    std::vector<float> x(4096, 1.0f);
    try {
      if (r == 1) {
        comms[r]->allreduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
      } else {
        comms[r]->allreduceCompressed(x.data(), x.size(), codecs::Codec::kFp16, false);
      }
    } catch (const std::exception&) {
      ++failed;
    }
  });
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(failed == g.size(), "every rank fails a mismatched op, got ", failed.load());
  EXPECT_TRUE(took < std::chrono::seconds(20), "the mismatch was found before the timeout");
}

// chunk_bytes comes from the user: a huge one is "do not cut", never an overflow. (Segments of
// 2^61 elements times 8 ranks wrapped to 0, and cutting the data into pieces never ended.)
void checkHugeChunk() {
  for (Grid g : {Grid{4, 2}, Grid{8, 1}}) {
    MemoryStore store;
    // 2^61 elements a segment, times 8 ranks: 2^64.
    auto comms = makeGroup(g, store, size_t{1} << 63);
    const size_t count = 1000;
    std::vector<std::vector<float>> outputs(g.size());
    std::vector<std::vector<uint8_t>> bytes(g.size());
    runRanks(g.size(), [&](int r) {
      outputs[r].assign(count, static_cast<float>(r + 1));
      comms[r]->allreduceCompressed(outputs[r].data(), count, codecs::Codec::kBf16, false);
      bytes[r].assign(count, 1);
      comms[r]->allreduce(bytes[r].data(), count, DataType::kUInt8, ReduceOp::kSum);
      // The other ops that cut by chunk_bytes: they complete with the right bytes too.
      std::vector<uint8_t> b(count, static_cast<uint8_t>(r));
      comms[r]->broadcast(b.data(), count, DataType::kUInt8, 1);
      std::vector<uint8_t> red(count, 1), all(count * g.size()), rs(count);
      comms[r]->reduce(red.data(), count, DataType::kUInt8, ReduceOp::kSum, 0);
      comms[r]->allgather(b.data(), all.data(), count, DataType::kUInt8);
      comms[r]->reduceScatter(all.data(), rs.data(), count, DataType::kUInt8, ReduceOp::kSum);
      EXPECT_TRUE(b[0] == 1 && b[count - 1] == 1, "huge chunk_bytes broadcast rank ", r);
      EXPECT_TRUE(r != 0 || (red[0] == g.size() && red[count - 1] == g.size()), "huge chunk_bytes reduce");
      EXPECT_TRUE(all[0] == 1 && all.back() == 1, "huge chunk_bytes allgather rank ", r);
      EXPECT_TRUE(rs[0] == g.size() && rs[count - 1] == g.size(), "huge chunk_bytes reduce-scatter rank ", r);
    });
    const float expect = static_cast<float>(g.size() * (g.size() + 1) / 2);
    for (int r = 0; r < g.size(); ++r) {
      EXPECT_TRUE(outputs[r][0] == expect && outputs[r][count - 1] == expect, g.hosts, "x", g.perHost,
                  " huge chunk_bytes: rank ", r, " got ", outputs[r][0]);
      EXPECT_TRUE(bytes[r][0] == g.size() && bytes[r][count - 1] == g.size(), "huge chunk_bytes, uint8 all-reduce ", g.hosts, "x", g.perHost, " rank ", r, " got ", int(bytes[r][0]), " ", int(bytes[r][count - 1]));
    }
  }
}

// A rank that rejects its input (the adapter's checks failed: rejectCollective) where its peers run a
// hierarchical op: every peer fails that op quoting the reject, and the group's next op works on
// every rank. (Before, the rejecting rank stayed in shared memory while its host peer left it, so
// its next op's step paired with the peer's step of the rejected op: that op failed as
// "mismatched collectives" on every rank, and the rejected one did too on the host peer.)
void checkRejectInHierarchy() {
  const Grid g{2, 2};
  MemoryStore store;
  const int b1 = g.rankAt(1, 1);
  auto comms = makeGroup(g, store);
  const size_t count = 2048;
  std::vector<std::string> firstError(g.size()), secondError(g.size());
  std::vector<int> secondOk(g.size(), 0);
  runRanks(g.size(), [&](int r) {
    std::vector<float> in(g.size() * count, 1.0f), out(count);
    try {
      if (r == b1) {
        comms[r]->rejectCollective("rank 3's input is invalid");
      } else {
        comms[r]->reduceScatterCompressed(in.data(), out.data(), count, codecs::Codec::kFp16, false);
      }
    } catch (const std::exception& e) {
      firstError[r] = e.what();
    }
    std::vector<float> x(count, 1.0f);
    try {
      comms[r]->allreduceCompressed(x.data(), count, codecs::Codec::kFp16, false);
      secondOk[r] = x[0] == static_cast<float>(g.size()) && x[count - 1] == static_cast<float>(g.size());
    } catch (const std::exception& e) {
      secondError[r] = e.what();
    }
  });
  for (int r = 0; r < g.size(); ++r) {
    EXPECT_TRUE(r == b1 || firstError[r].find("input is invalid") != std::string::npos, "rank ", r,
                " fails the rejected op quoting the reject; got: ", firstError[r]);
    EXPECT_TRUE(secondOk[r] == 1, "rank ", r, " runs the next op; got: ", secondError[r]);
  }
}

// chunk_bytes decides how the hierarchical schedules cut the data, and it is each rank's own
// setting: ranks that disagree must not pair shared-memory steps of different lengths (which
// returned wrong sums without an error). They either get the right answer or an error on every rank.
void checkChunkBytesDisagree() {
  const Grid g{2, 2};
  MemoryStore store;
  auto comms = pycomm::testing::makeGroup(g.size(), store, [&](int r, Config& config) {
    config.timeout = std::chrono::seconds(20);
    config.chunkBytes = r < 2 ? 4096 : 8192;  // host 0 = ranks 0 and 2: one of each
    config.shmSlotBytes = 4096;
    config.hostId = strCat("host", r % g.hosts);
  });
  const size_t count = 100003;
  std::vector<std::vector<float>> out(g.size());
  std::vector<std::string> error(g.size());
  runRanks(g.size(), [&](int r) {
    out[r] = randomInput(r, count, 9);
    try {
      comms[r]->allreduceCompressed(out[r].data(), count, codecs::Codec::kBf16, false);
    } catch (const std::exception& e) {
      error[r] = e.what();
    }
  });
  size_t failed = 0;
  for (int r = 0; r < g.size(); ++r) failed += error[r].empty() ? 0 : 1;
  EXPECT_TRUE(failed == 0 || failed == static_cast<size_t>(g.size()), "ranks disagree on whether the op failed");
  if (failed == 0) {
    std::vector<std::vector<float>> inputs(g.size());
    for (int r = 0; r < g.size(); ++r) inputs[r] = randomInput(r, count, 9);
    double worst = 0;
    for (size_t i = 0; i < count; ++i) {
      double exact = 0;
      for (int r = 0; r < g.size(); ++r) exact += inputs[r][i];
      worst = std::max(worst, std::abs(out[0][i] - exact) / (1 + std::abs(exact)));
      if (worst > 0.05) break;
    }
    EXPECT_TRUE(worst <= 0.05, "chunk_bytes differing between ranks gave a wrong sum without an error, error ", worst);
  }
}

}  // namespace

int main() {
  checkChunkBytesDisagree();
  checkRejectInHierarchy();
  checkHugeChunk();
  // One rank a host is the flat schedule, which the same reference describes.
  for (Grid g : {Grid{2, 2}, Grid{3, 2}, Grid{2, 3}, Grid{3, 1}}) {
    MemoryStore store;
    auto comms = makeGroup(g, store);
    checkAllreduce(g, comms);
    checkReduceScatterAndAllgather(g, comms);
    checkErrorFeedback(g, comms);
    checkBytesAcrossHosts(g, comms);
  }
  {
    MemoryStore store;
    Grid g{2, 2};
    auto comms = makeGroup(g, store);
    checkMismatch(g, comms);
  }
  return pycomm::testing::finish("test_hierarchical_compressed");
}
