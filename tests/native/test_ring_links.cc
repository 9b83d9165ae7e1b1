// Two TCP transports that move their connection onto shared-memory rings (RingLinks), and a rank
// that then drops its rings while its peer still uses them: what a setup does when it gives shared
// memory up after a peer's vote passed (a third rank lost between the ballots it sent, say), or when
// a peer moves although the vote failed. The peer's next frames are in a ring this rank no longer
// maps: the connection must fail, naming the peer, and a receive from it must end with that error
// instead of reading through a ring that is gone.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/communicator_run.h"
#include "core/op_ledger.h"
#include "core/transport/shm/ring.h"
#include "core/transport/tcp/tcp_transport.h"
#include "harness.h"

namespace {

using namespace pycomm;
using namespace pycomm::testing;
using pycomm::transport::shm::Ring;
using pycomm::transport::tcp::TcpOptions;
using pycomm::transport::tcp::TcpTransport;

constexpr auto kTimeout = std::chrono::seconds(10);

transport::FrameInfo p2p(uint64_t tag, size_t nbytes) {
  transport::FrameInfo info;
  info.channel = transport::Channel::kP2P;
  info.seq = tag;
  info.signature = makeSignature(OpKind::kSend, DataType::kUInt8, ReduceOp::kSum, -1, nbytes);
  return info;
}

// Both ranks' transports, and one ring each way in one zero-filled block.
struct Pair {
  static constexpr size_t kCapacity = 64 * 1024;
  MemoryStore store;
  std::vector<std::unique_ptr<OpLedger>> ledgers{2};
  std::vector<std::unique_ptr<TcpTransport>> links{2};
  size_t ringBytes = (Ring::bytesFor(kCapacity) + 63) / 64 * 64;
  std::shared_ptr<uint8_t> memory{static_cast<uint8_t*>(std::aligned_alloc(64, 2 * ringBytes)), std::free};

  Pair() {
    std::memset(memory.get(), 0, 2 * ringBytes);
    runRanks(2, [&](int r) {
      TcpOptions options;
      options.rank = r;
      options.size = 2;
      options.timeout = kTimeout;
      ledgers[r] = std::make_unique<OpLedger>(r, strCat("[rank ", r, "/2]"));
      links[r] = std::make_unique<TcpTransport>(options, store, *ledgers[r]);
    });
  }
  ~Pair() {
    for (auto& link : links) link.reset();  // before the ledgers they read
  }
  // The ring rank `from` writes to rank `to`.
  Ring ring(int from, int to) const { return Ring(memory.get() + (from == 0 ? 0 : ringBytes), kCapacity); }

  // Rank `from` sends `value` with `tag`; rank `to` receives it, or the error it got.
  std::string exchange(int from, int to, uint64_t tag, uint64_t value) {
    uint64_t got = 0;
    std::string error;
    runRanks(2, [&](int r) {
      const auto deadline = std::chrono::steady_clock::now() + kTimeout;
      if (r == from) {
        auto request = links[r]->isend(to, p2p(tag, sizeof value), &value, sizeof value);
        try {
          links[r]->wait(request, deadline, "send");
        } catch (const RemoteError&) {
          // The receiver may fail the connection before this send completes.
        }
      } else {
        auto request = links[r]->irecv(from, p2p(tag, sizeof got), &got, sizeof got);
        try {
          links[r]->wait(request, deadline, "recv");
          if (got != value) error = strCat("received ", got, " instead of ", value);
        } catch (const Error& e) {
          error = e.what();
        }
      }
    });
    return error;
  }
};

// Both ranks move; a frame goes through the rings; then rank 0 drops its rings, as a setup that
// gives shared memory up does, and rank 1 sends on through its ring.
void checkDroppedRingsFailThePeer() {
  Pair pair;
  for (int r = 0; r < 2; ++r) {
    const int peer = 1 - r;
    pair.links[r]->attachRings(peer, pair.ring(r, peer), pair.ring(peer, r), pair.memory);
  }
  for (int r = 0; r < 2; ++r) pair.links[r]->moveToSharedMemory(1 - r);
  EXPECT_TRUE(pair.exchange(1, 0, 1, 41).empty(), "a frame through the rings");
  EXPECT_TRUE(pair.exchange(0, 1, 2, 42).empty(), "a frame through the rings, the other way");
  EXPECT_TRUE(pair.links[1]->ringBytesSent() > 0, "rank 1 sent through its ring");

  pair.links[0]->attachRings(1, {}, {}, nullptr);
  const std::string error = pair.exchange(1, 0, 3, 43);
  EXPECT_TRUE(error.find("peer 1") != std::string::npos && error.find("shared memory") != std::string::npos,
              "a receive from a peer whose ring this rank dropped fails naming it and shared memory; got: '", error,
              "'");
  EXPECT_TRUE(pair.links[0]->peerFailure(1) != nullptr, "the peer whose ring was dropped is failed");
}

// The peer moved, this rank never did (its vote failed) and drops its rings: the same.
void checkPeerMovedAloneFails() {
  Pair pair;
  for (int r = 0; r < 2; ++r) {
    const int peer = 1 - r;
    pair.links[r]->attachRings(peer, pair.ring(r, peer), pair.ring(peer, r), pair.memory);
  }
  pair.links[1]->moveToSharedMemory(0);
  EXPECT_TRUE(pair.exchange(1, 0, 1, 7).empty(), "a frame through rank 1's ring");
  pair.links[0]->attachRings(1, {}, {}, nullptr);
  const std::string error = pair.exchange(1, 0, 2, 8);
  EXPECT_TRUE(error.find("peer 1") != std::string::npos && error.find("shared memory") != std::string::npos,
              "a receive from a peer that moved alone fails naming it and shared memory; got: '", error, "'");
}

// Dropping rings that nobody moved onto (the usual failed setup) leaves the connection working.
void checkDropBeforeAnyMoveKeepsTheSocket() {
  Pair pair;
  for (int r = 0; r < 2; ++r) {
    const int peer = 1 - r;
    pair.links[r]->attachRings(peer, pair.ring(r, peer), pair.ring(peer, r), pair.memory);
  }
  for (int r = 0; r < 2; ++r) pair.links[r]->attachRings(1 - r, {}, {}, nullptr);
  EXPECT_TRUE(pair.exchange(1, 0, 1, 5).empty(), "a frame over the socket after rings were dropped unused");
  EXPECT_TRUE(pair.exchange(0, 1, 2, 6).empty(), "and the other way");
  EXPECT_TRUE(pair.links[1]->ringBytesSent() == 0, "nothing went through a ring");
}

}  // namespace

int main() {
  checkDropBeforeAnyMoveKeepsTheSocket();
  checkPeerMovedAloneFails();
  checkDroppedRingsFailThePeer();
  return finish("test_ring_links");
}
