// Every collective of the core over real TCP on loopback, ranks as threads, world sizes 1 to 5 (the
// all-reduce algorithms 1 to 8), element counts including 0, 1, primes and counts not divisible by
// the world size; results checked exactly against integer references computed here (float32 sums
// against a double reference, within a stated bound). Also: mismatched sizes fail on every rank and
// leave the group usable, sends before receives do not deadlock, and a silent peer times out with
// its rank named.
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>

#include "core/communicator.h"
#include "group.h"
#include "harness.h"

using namespace pycomm;
using pycomm::testing::MemoryStore;
using pycomm::testing::runRanks;

namespace {

int64_t value(int rank, size_t i) { return static_cast<int64_t>((i * 7 + rank * 13) % 101) - 50; }

std::vector<std::unique_ptr<Communicator>> makeGroup(int size, MemoryStore& store, size_t chunkBytes,
                                                     std::chrono::milliseconds timeout = std::chrono::seconds(20),
                                                     Algorithm algorithm = Algorithm::kAuto,
                                                     const std::string& hostId = "") {
  return pycomm::testing::makeGroup(size, store, [&](int, Config& config) {
    config.timeout = timeout;
    config.chunkBytes = chunkBytes;
    config.algorithm = algorithm;
    config.hostId = hostId;
    config.shmSlotBytes = 4096;  // small slots: many steps per op
  });
}

void checkCollectives(int size, size_t chunkBytes, const std::string& hostId = "") {
  MemoryStore store;
  auto comms = makeGroup(size, store, chunkBytes, std::chrono::seconds(20), Algorithm::kAuto, hostId);
  for (size_t count : {size_t{0}, size_t{1}, size_t{2}, size_t{13}, size_t{1031}, size_t{65537}}) {
    runRanks(size, [&](int r) {
      Communicator& c = *comms[r];
      // allreduce sum / max, int64
      std::vector<int64_t> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = value(r, i);
      c.allreduce(buf.data(), count, DataType::kInt64, ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i) {
        int64_t expect = 0;
        for (int q = 0; q < size; ++q) expect += value(q, i);
        EXPECT_TRUE(buf[i] == expect, "allreduce size ", size, " count ", count, " i ", i);
      }
      std::vector<int32_t> mx(count);
      for (size_t i = 0; i < count; ++i) mx[i] = static_cast<int32_t>(value(r, i));
      c.allreduce(mx.data(), count, DataType::kInt32, ReduceOp::kMax);
      for (size_t i = 0; i < count; ++i) {
        int32_t expect = INT32_MIN;
        for (int q = 0; q < size; ++q) expect = std::max<int32_t>(expect, static_cast<int32_t>(value(q, i)));
        EXPECT_TRUE(mx[i] == expect, "allreduce max count ", count);
      }
      // broadcast from the last rank
      const int root = size - 1;
      std::vector<int64_t> bc(count);
      for (size_t i = 0; i < count; ++i) bc[i] = value(r, i);
      c.broadcast(bc.data(), count, DataType::kInt64, root);
      for (size_t i = 0; i < count; ++i) EXPECT_TRUE(bc[i] == value(root, i), "broadcast count ", count);
      // reduce to rank 0: non-roots keep their input
      std::vector<int64_t> rd(count);
      for (size_t i = 0; i < count; ++i) rd[i] = value(r, i);
      c.reduce(rd.data(), count, DataType::kInt64, ReduceOp::kSum, 0);
      for (size_t i = 0; i < count; ++i) {
        int64_t expect = 0;
        for (int q = 0; q < size; ++q) expect += value(q, i);
        EXPECT_TRUE(rd[i] == (r == 0 ? expect : value(r, i)), "reduce count ", count);
      }
      // allgather
      std::vector<int64_t> in(count), out(count * size, -1);
      for (size_t i = 0; i < count; ++i) in[i] = value(r, i);
      c.allgather(in.data(), out.data(), count, DataType::kInt64);
      for (int q = 0; q < size; ++q) {
        for (size_t i = 0; i < count; ++i) EXPECT_TRUE(out[q * count + i] == value(q, i), "allgather");
      }
      // reduce-scatter
      std::vector<int64_t> rsIn(count * size), rsOut(count, -1);
      for (size_t i = 0; i < count * size; ++i) rsIn[i] = value(r, i);
      c.reduceScatter(rsIn.data(), rsOut.data(), count, DataType::kInt64, ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i) {
        int64_t expect = 0;
        for (int q = 0; q < size; ++q) expect += value(q, r * count + i);
        EXPECT_TRUE(rsOut[i] == expect, "reduce_scatter count ", count);
      }
      // gather and scatter at root 1 % size
      const int gr = 1 % size;
      std::vector<int64_t> gathered(count * size, -1);
      c.gather(in.data(), gathered.data(), count, DataType::kInt64, gr);
      if (r == gr) {
        for (int q = 0; q < size; ++q) {
          for (size_t i = 0; i < count; ++i) EXPECT_TRUE(gathered[q * count + i] == value(q, i), "gather");
        }
      }
      std::vector<int64_t> scattered(count, -1);
      std::vector<int64_t> source(count * size);
      for (size_t i = 0; i < count * size; ++i) source[i] = value(gr, i);
      c.scatter(source.data(), scattered.data(), count, DataType::kInt64, gr);
      for (size_t i = 0; i < count; ++i) EXPECT_TRUE(scattered[i] == value(gr, r * count + i), "scatter");
      // all-to-all with uneven splits: rank r sends (r + q) % 3 * count/4 elements to q
      std::vector<size_t> sc(size), so(size), rc(size), ro(size);
      size_t sTotal = 0, rTotal = 0;
      for (int q = 0; q < size; ++q) {
        sc[q] = ((r + q) % 3) * (count / 4);
        rc[q] = ((q + r) % 3) * (count / 4);
        so[q] = sTotal;
        ro[q] = rTotal;
        sTotal += sc[q];
        rTotal += rc[q];
      }
      std::vector<int64_t> aIn(sTotal), aOut(rTotal, -1);
      for (int q = 0; q < size; ++q) {
        for (size_t i = 0; i < sc[q]; ++i) aIn[so[q] + i] = value(r * 100 + q, i);
      }
      c.alltoall(aIn.data(), sc, so, aOut.data(), rc, ro, DataType::kInt64);
      for (int q = 0; q < size; ++q) {
        for (size_t i = 0; i < rc[q]; ++i) EXPECT_TRUE(aOut[ro[q] + i] == value(q * 100 + r, i), "alltoall");
      }
      c.barrier();
    });
  }
}

// Rank r's element i for the float and integer cases of the algorithm check. Floats: not exactly
// representable, magnitudes 2^-4 to 2^4 mixed across ranks within one element, so sums round and the
// summation order shows. Factors: products of 8 ranks stay within int32 (no zeros, so a product is
// not trivially 0). Bytes: the full int8 range, for an element size that misaligns every split.
float floatValue(int rank, size_t i) {
  static const double scale[] = {1.0 / 16, 1.0 / 8, 1.0 / 4, 1.0 / 2, 1, 2, 4, 8, 16};
  return static_cast<float>((value(rank, i) + 0.3) * scale[(i + rank) % 9]);
}
int32_t factor(int rank, size_t i) {
  static const int32_t factors[] = {-2, -1, 1, 2};
  return factors[(i * 5 + rank * 3) % 4];
}
int8_t byteValue(int rank, size_t i) { return static_cast<int8_t>((i * 37 + rank * 91 + 5) & 0xff); }

using Group = std::vector<std::unique_ptr<Communicator>>;

// All-reduces `count` elements of T on every rank of `comms` (rank r's element i is input(r, i)),
// then checks that every rank holds the same bits and that element i satisfies ok(i, x). One failure
// line per case, not per element: the large case has millions.
template <typename T, typename Input, typename Ok>
void checkAllreduceCase(Group& comms, const std::string& label, size_t count, DataType dtype, ReduceOp op,
                        Input input, Ok ok) {
  const int size = static_cast<int>(comms.size());
  std::vector<std::vector<T>> out(size);
  runRanks(size, [&](int r) {
    out[r].resize(count);
    for (size_t i = 0; i < count; ++i) out[r][i] = input(r, i);
    comms[r]->allreduce(out[r].data(), count, dtype, op);
  });
  for (int r = 1; r < size; ++r) {
    EXPECT_TRUE(count == 0 || std::memcmp(out[r].data(), out[0].data(), count * sizeof(T)) == 0, label,
                " count ", count, ": rank ", r, " holds other bits than rank 0");
  }
  // Rank r's thread checks slice r of its own result (the references cost more than the op).
  std::mutex mutex;
  size_t wrong = 0, first = count;
  runRanks(size, [&](int r) {
    size_t myWrong = 0, myFirst = count;
    for (size_t i = count * r / size; i < count * (r + 1) / size; ++i) {
      if (!ok(i, out[r][i]) && myWrong++ == 0) myFirst = i;
    }
    std::lock_guard<std::mutex> lock(mutex);
    wrong += myWrong;
    first = std::min(first, myFirst);
  });
  EXPECT_TRUE(wrong == 0, label, " count ", count, ": ", wrong, " wrong elements, first at ", first);
}

// The all-reduce cases of one count: int64 sum, int32 min, float32 sum, int32 product, int8 max.
void checkAllreduceCount(Group& comms, Algorithm algorithm, size_t count) {
  const int size = static_cast<int>(comms.size());
  const std::string label = strCat(algorithmName(algorithm), " size ", size);
  checkAllreduceCase<int64_t>(
      comms, label + " int64 sum", count, DataType::kInt64, ReduceOp::kSum,
      [](int r, size_t i) { return value(r, i); },
      [&](size_t i, int64_t got) {
        int64_t expect = 0;
        for (int q = 0; q < size; ++q) expect += value(q, i);
        return got == expect;
      });
  checkAllreduceCase<int32_t>(
      comms, label + " int32 min", count, DataType::kInt32, ReduceOp::kMin,
      [](int r, size_t i) { return static_cast<int32_t>(value(r, i)); },
      [&](size_t i, int32_t got) {
        int32_t expect = INT32_MAX;
        for (int q = 0; q < size; ++q) expect = std::min<int32_t>(expect, static_cast<int32_t>(value(q, i)));
        return got == expect;
      });
  // float32 sum against the double sum of the same float inputs. Any summation order of p terms
  // is within (p - 1) * 2^-24 * sum |x_q| of the exact sum; FLT_EPSILON (2^-23) doubles that
  // margin, which stays below the smallest term (0.3 / 16 against at most 7 * 2^-23 * 8 * 50.3 * 16),
  // so a dropped, doubled or misplaced term still fails.
  checkAllreduceCase<float>(
      comms, label + " float32 sum", count, DataType::kFloat32, ReduceOp::kSum, floatValue,
      [&](size_t i, float got) {
        double exact = 0, magnitude = 0;
        for (int q = 0; q < size; ++q) {
          exact += floatValue(q, i);
          magnitude += std::fabs(floatValue(q, i));
        }
        return std::fabs(got - exact) <= (size - 1) * static_cast<double>(FLT_EPSILON) * magnitude;
      });
  checkAllreduceCase<int32_t>(
      comms, label + " int32 product", count, DataType::kInt32, ReduceOp::kProduct, factor,
      [&](size_t i, int32_t got) {
        int64_t expect = 1;
        for (int q = 0; q < size; ++q) expect *= factor(q, i);
        return got == expect;
      });
  checkAllreduceCase<int8_t>(
      comms, label + " int8 max", count, DataType::kInt8, ReduceOp::kMax, byteValue,
      [&](size_t i, int8_t got) {
        int8_t expect = INT8_MIN;
        for (int q = 0; q < size; ++q) expect = std::max(expect, byteValue(q, i));
        return got == expect;
      });
}

// Every all-reduce algorithm x world sizes 1 to 8 x counts (0, 1, p - 1, p + 1, primes, 4 MiB + 3)
// x the reduce ops and dtypes of checkAllreduceCount.
void checkAllreduceAlgorithms() {
  // 4 Mi + 3 elements, not bytes (16 MiB + 12 bytes of float32, 32 MiB + 24 of int64): odd for
  // every world size, and far above the socket buffers and the chunk size. Its own group with the
  // default 512 KiB chunks: at 256 bytes it would be tens of thousands of frames per segment.
  // Costs ~20 s of this test's ~25 s (~50 of ~55 s under ASan).
  const size_t large = (size_t{4} << 20) + 3;
  for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kTree, Algorithm::kRhd}) {
    for (int size = 1; size <= 8; ++size) {
      MemoryStore store;
      // 256-byte chunks: counts around a few thousand span many chunks that do not align with the
      // per-rank segments.
      auto comms = makeGroup(size, store, 256, std::chrono::seconds(20), algorithm);
      const size_t p = static_cast<size_t>(size);
      for (size_t count : {size_t{0}, size_t{1}, p - 1, p + 1, size_t{97}, size_t{20011}}) {
        checkAllreduceCount(comms, algorithm, count);
      }
      MemoryStore largeStore;
      auto largeComms = makeGroup(size, largeStore, 512 * 1024, std::chrono::seconds(60), algorithm);
      checkAllreduceCount(largeComms, algorithm, large);
    }
  }
}

// Compressed all-reduce: every rank ends with the same bits, close to the exact sum.
void checkCompressedAllreduce() {
  for (codecs::Codec codec : {codecs::Codec::kFp16, codecs::Codec::kBf16, codecs::Codec::kFp8E4M3,
                              codecs::Codec::kFp8E5M2}) {
    const double bound = codec == codecs::Codec::kFp16 ? 1e-3 : codec == codecs::Codec::kBf16 ? 8e-3
                         : codec == codecs::Codec::kFp8E4M3 ? 4.5e-2 : 9e-2;
    for (int size : {1, 2, 3, 5}) {
      MemoryStore store;
      auto comms = makeGroup(size, store, 4096);
      for (size_t count : {size_t{0}, size_t{1}, size_t{255}, size_t{257}, size_t{10007}}) {
        std::vector<std::vector<float>> results(size);
        runRanks(size, [&](int r) {
          std::vector<float> buf(count);
          for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(std::sin(0.1 * i + r)) * (r + 1);
          comms[r]->allreduceCompressed(buf.data(), count, codec, false);
          results[r] = buf;
        });
        double err = 0, norm = 0;
        for (size_t i = 0; i < count; ++i) {
          double exact = 0;
          for (int q = 0; q < size; ++q) exact += std::sin(0.1 * i + q) * (q + 1);
          err += (results[0][i] - exact) * (results[0][i] - exact);
          norm += exact * exact;
          for (int q = 1; q < size; ++q) {
            EXPECT_TRUE(std::memcmp(&results[q][i], &results[0][i], 4) == 0, codecs::codecName(codec),
                        " ranks differ at ", i);
          }
        }
        // A relative L2 bound means something over many elements; a handful can cancel to ~0.
        if (count >= 255) {
          EXPECT_TRUE(std::sqrt(err / norm) <= bound, codecs::codecName(codec), " size ", size, " count ", count,
                      " relative error ", std::sqrt(err / norm));
        }
      }
      const auto stats = comms[0]->stats();
      if (size > 1) {
        EXPECT_TRUE(stats.count(std::string("allreduce/") + codecs::codecName(codec)) == 1, "stats key");
      }
    }
    // World 1 rounds once, SUM and AVG alike, and error feedback keeps what that rounding dropped:
    // exactly the codec's own encode and decode, over more elements than one piece holds.
    MemoryStore store;
    auto one = makeGroup(1, store, 4096);
    for (bool feedback : {false, true}) {
      const size_t count = 3001;
      std::vector<float> buf(count), residual(count), expect(count), encodedInput(count);
      for (size_t i = 0; i < count; ++i) {
        buf[i] = static_cast<float>(std::sin(0.37 * i)) * 1000.0f;
        residual[i] = feedback ? static_cast<float>(std::cos(0.11 * i)) : 0.0f;
        encodedInput[i] = buf[i] + residual[i];
      }
      std::vector<uint8_t> code(codecs::encodedBytes(codec, count));
      codecs::encode(codec, encodedInput.data(), count, code.data());
      codecs::decode(codec, code.data(), count, expect.data());
      one[0]->allreduceCompressed(buf.data(), count, codec, feedback, feedback ? residual.data() : nullptr);
      EXPECT_TRUE(std::memcmp(buf.data(), expect.data(), count * 4) == 0, codecs::codecName(codec),
                  " at world 1 is not one rounding", feedback ? " (with error feedback, AVG)" : "");
      for (size_t i = 0; feedback && i < count; ++i) {
        if (residual[i] != encodedInput[i] - expect[i]) {
          EXPECT_TRUE(false, codecs::codecName(codec), " world 1 residual ", i, ": ", residual[i], " != ",
                      encodedInput[i] - expect[i]);
          break;
        }
      }
    }
  }
}

// Several "hosts" of several ranks: shared memory inside each, TCP across.
void checkHierarchical(int hosts, int perHost) {
  const int size = hosts * perHost;
  MemoryStore store;
  auto comms = pycomm::testing::makeGroup(size, store, [&](int r, Config& config) {
    config.timeout = std::chrono::seconds(20);
    config.chunkBytes = 4096;
    config.shmSlotBytes = 4096;
    config.hostId = strCat("host", r % hosts);  // interleaved, as a launcher might place them
  });
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}, size_t{100003}}) {
    runRanks(size, [&](int r) {
      std::vector<int64_t> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = value(r, i);
      comms[r]->allreduce(buf.data(), count, DataType::kInt64, ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i) {
        int64_t expect = 0;
        for (int q = 0; q < size; ++q) expect += value(q, i);
        EXPECT_TRUE(buf[i] == expect, "hierarchical ", hosts, "x", perHost, " count ", count, " i ", i);
      }
      comms[r]->barrier();
    });
  }
}

void checkMismatchAndRecovery(const std::string& hostId) {
  MemoryStore store;
  const int size = 3;
  auto comms = makeGroup(size, store, 1024, std::chrono::seconds(20), Algorithm::kAuto, hostId);
  std::atomic<int> failed{0};
  runRanks(size, [&](int r) {
    std::vector<float> buf(r == 1 ? 12 : 10, 1.0f);
    try {
      comms[r]->allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
    } catch (const Error& e) {
      ++failed;
      const std::string what = e.what();
      EXPECT_TRUE(what.find("allreduce") != std::string::npos, "message names the op: ", what);
      EXPECT_TRUE(what.find("12") != std::string::npos || what.find("mismatch") != std::string::npos,
                  "message names the counts: ", what);
    }
    std::vector<int32_t> ok(5, r + 1);
    comms[r]->allreduce(ok.data(), ok.size(), DataType::kInt32, ReduceOp::kSum);
    for (int v : ok) EXPECT_TRUE(v == 6, "group usable after a mismatch");
  });
  EXPECT_TRUE(failed == size, "every rank saw the mismatch, got ", failed.load());
}

void checkSendBeforeReceive() {
  MemoryStore store;
  auto comms = makeGroup(2, store, 1 << 16);
  runRanks(2, [&](int r) {
    const size_t n = 8 << 20;  // larger than the socket buffers
    std::vector<uint8_t> out(n, static_cast<uint8_t>(r + 1)), in(n, 0);
    auto s = comms[r]->send(out.data(), n, 1 - r, 7);
    auto q = comms[r]->recv(in.data(), n, 1 - r, 7);
    comms[r]->waitPointToPoint(s, "send", comms[r]->timeout());
    comms[r]->waitPointToPoint(q, "recv", comms[r]->timeout());
    EXPECT_TRUE(in[0] == 2 - r && in[n - 1] == 2 - r, "p2p payload");
  });
}

void checkTimeoutNamesPeer() {
  MemoryStore store;
  auto comms = makeGroup(2, store, 1024, std::chrono::milliseconds(500));
  std::vector<float> buf(4, 1.0f);
  std::string message;
  try {
    comms[0]->allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
  } catch (const TimeoutError& e) {
    message = e.what();
  }
  EXPECT_TRUE(message.find("peer 1") != std::string::npos, "timeout names the peer: ", message);
}

}  // namespace

int main() {
  for (int size : {1, 2, 3, 4, 5}) checkCollectives(size, 4096);
  checkCollectives(3, 64);  // many chunks per segment
  checkAllreduceAlgorithms();
  checkCompressedAllreduce();
  checkMismatchAndRecovery("");
  checkMismatchAndRecovery("one-host");  // over shared memory
  for (int size : {2, 3, 4}) checkCollectives(size, 4096, "one-host");
  checkHierarchical(2, 2);
  checkHierarchical(3, 2);
  checkHierarchical(2, 3);
  checkSendBeforeReceive();
  checkTimeoutNamesPeer();
  return pycomm::testing::finish("test_collectives");
}
