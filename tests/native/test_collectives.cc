// Every collective of the core over real TCP on loopback, ranks as threads, world sizes 1 to 5,
// element counts including 0, 1, primes and counts not divisible by the world size; results checked
// exactly against integer references computed here. Also: mismatched sizes fail on every rank and
// leave the group usable, sends before receives do not deadlock, and a silent peer times out with
// its rank named.
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "core/communicator.h"
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
  std::vector<std::unique_ptr<Communicator>> comms(size);
  runRanks(size, [&](int r) {
    Config config;
    config.rank = r;
    config.size = size;
    config.timeout = timeout;
    config.chunkBytes = chunkBytes;
    config.algorithm = algorithm;
    config.hostId = hostId;
    config.shmSlotBytes = 4096;  // small slots: many steps per op
    comms[r] = std::make_unique<Communicator>(config, store);
  });
  return comms;
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

// Every all-reduce algorithm, world sizes 1 to 8, sizes around the world size and chunk boundaries.
void checkAllreduceAlgorithms() {
  for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kTree, Algorithm::kRhd}) {
    for (int size = 1; size <= 8; ++size) {
      MemoryStore store;
      auto comms = makeGroup(size, store, 256, std::chrono::seconds(20), algorithm);
      const size_t p = static_cast<size_t>(size);
      for (size_t count : {size_t{0}, size_t{1}, p - 1, p + 1, size_t{97}, size_t{20011}}) {
        runRanks(size, [&](int r) {
          std::vector<int64_t> buf(count);
          for (size_t i = 0; i < count; ++i) buf[i] = value(r, i);
          comms[r]->allreduce(buf.data(), count, DataType::kInt64, ReduceOp::kSum);
          for (size_t i = 0; i < count; ++i) {
            int64_t expect = 0;
            for (int q = 0; q < size; ++q) expect += value(q, i);
            EXPECT_TRUE(buf[i] == expect, algorithmName(algorithm), " size ", size, " count ", count, " i ", i);
          }
          std::vector<int32_t> mn(count);
          for (size_t i = 0; i < count; ++i) mn[i] = static_cast<int32_t>(value(r, i));
          comms[r]->allreduce(mn.data(), count, DataType::kInt32, ReduceOp::kMin);
          for (size_t i = 0; i < count; ++i) {
            int32_t expect = INT32_MAX;
            for (int q = 0; q < size; ++q) expect = std::min<int32_t>(expect, static_cast<int32_t>(value(q, i)));
            EXPECT_TRUE(mn[i] == expect, algorithmName(algorithm), " min size ", size, " count ", count);
          }
        });
      }
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
  }
}

// Several "hosts" of several ranks: shared memory inside each, TCP across.
void checkHierarchical(int hosts, int perHost) {
  const int size = hosts * perHost;
  MemoryStore store;
  std::vector<std::unique_ptr<Communicator>> comms(size);
  runRanks(size, [&](int r) {
    Config config;
    config.rank = r;
    config.size = size;
    config.timeout = std::chrono::seconds(20);
    config.chunkBytes = 4096;
    config.shmSlotBytes = 4096;
    config.hostId = strCat("host", r % hosts);  // interleaved, as a launcher might place them
    comms[r] = std::make_unique<Communicator>(config, store);
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
    comms[r]->waitPointToPoint(s, "send");
    comms[r]->waitPointToPoint(q, "recv");
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
