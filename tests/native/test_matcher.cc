// The TCP matcher against the op ledger, driven step by step without sockets: a collective frame
// whose signature differs from the op this rank runs fails that op, wherever the op's start falls
// in the frame's arrival (before its header, between header and payload, after the payload), and
// a frame that agrees is held and delivered as before; and a peer's late report that it lost a
// rank fails the ops this rank runs after the one reported.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/logging.h"
#include "core/op_ledger.h"
#include "core/transport/tcp/connection.h"
#include "core/transport/tcp/event_loop.h"
#include "core/transport/tcp/matcher.h"
#include "harness.h"

namespace {

using namespace pycomm;
using namespace pycomm::transport;
using namespace pycomm::transport::tcp;

constexpr int kRank = 2;
constexpr int kSize = 3;
constexpr size_t kBytes = 4000;

OpSignature signature(OpKind kind, int root) {
  OpSignature s;
  s.kind = kind;
  s.dtype = 1;
  s.reduceOp = 0;
  s.root = root;
  s.count = kBytes / 4;
  return s;
}

// When this rank's op starts, against the frame of a peer's op with the same seq.
enum class BeginAt { kBeforeHeader, kAfterHeader, kAfterPayload };

const char* name(BeginAt at) {
  switch (at) {
    case BeginAt::kBeforeHeader: return "before the header";
    case BeginAt::kAfterHeader: return "between header and payload";
    case BeginAt::kAfterPayload: return "after the payload";
  }
  return "?";
}

struct Rig {
  Rig()
      : ledger(kRank, "[rank 2/3]"),
        matcher(kRank, kSize, "[rank 2/3]", 1 << 20, ledger),
        loop(std::chrono::milliseconds(10), Logger(), "[rank 2/3]"),
        connection(/*rank=*/1, Socket(), loop, counters) {}

  // This rank's op `seq` starts: true if the ledger refused it at once (a held frame disagreed).
  bool begin(uint64_t seq, const OpSignature& mine) {
    try {
      ledger.begin(seq, mine);
      return false;
    } catch (const InvalidUsageError&) {
      return true;
    }
  }

  // The header of a frame from peer 1 is complete; returns whether its payload goes to a buffer.
  bool header(uint64_t seq, const OpSignature& theirs) {
    FrameInfo info;
    info.seq = seq;
    info.signature = theirs;
    connection.header = makeHeader(FrameKind::kData, info, kBytes);
    Completions completions;
    std::string why = matcher.claim(connection, completions);
    EXPECT_TRUE(why.empty(), "claim refused the frame: ", why);
    finish(completions);
    return connection.target == ReadTarget::kBuffer;
  }

  void payload() {
    Completions completions;
    matcher.arrived(connection.rank, connection.header, FrameBytes(kBytes, 7), completions);
    finish(completions);
  }

  OpLedger ledger;
  Matcher matcher;
  EventLoop loop;
  WireCounters counters;
  Connection connection;
};

// Peer 1 runs an all-reduce as op 1; this rank runs a broadcast from rank 0 and waits on rank 0. No
// frame of rank 0 ever comes (it runs the all-reduce too), so only rank 1's frame can tell: however
// its arrival and this op's start interleave, op 1 fails here with the mismatch, naming both ops.
void testMismatchFailsTheOpWheneverItBegins(BeginAt at) {
  Rig rig;
  const OpSignature mine = signature(OpKind::kBroadcast, 0);
  const OpSignature theirs = signature(OpKind::kAllreduce, -1);
  bool refused = false;
  if (at == BeginAt::kBeforeHeader) refused = rig.begin(1, mine);
  const bool buffered = rig.header(1, theirs);
  if (at == BeginAt::kAfterHeader) refused = rig.begin(1, mine);
  if (buffered) rig.payload();
  if (at == BeginAt::kAfterPayload) refused = rig.begin(1, mine);

  const std::string failure = rig.ledger.failure(1);
  EXPECT_TRUE(!failure.empty(), "op 1 began ", name(at), ": no failure recorded for the mismatch");
  EXPECT_TRUE(failure.find("mismatched") != std::string::npos && failure.find("allreduce") != std::string::npos &&
                  failure.find("broadcast") != std::string::npos,
              "op 1 began ", name(at), ": ", failure);
  // Started after the whole frame was held: the start itself refuses the op.
  if (at == BeginAt::kAfterPayload) EXPECT_TRUE(refused, "op 1 began ", name(at), ": begin did not throw");

  // The receive the broadcast posts (from rank 0) fails at once instead of waiting for the timeout.
  auto recv = std::make_shared<Request>(Request::Direction::kRecv, 0, nullptr, kBytes);
  FrameInfo info;
  info.seq = 1;
  info.signature = mine;
  Completions completions;
  rig.matcher.post(0, info, recv, completions);
  finish(completions);
  EXPECT_TRUE(recv->done() && recv->error() != nullptr, "op 1 began ", name(at),
              ": the broadcast's receive from rank 0 still waits");
}

// The same interleavings with agreeing ops: no failure, and the receive gets the frame's bytes.
void testAgreeingFrameIsDelivered(BeginAt at) {
  Rig rig;
  const OpSignature sig = signature(OpKind::kAllreduce, -1);
  bool refused = false;
  if (at == BeginAt::kBeforeHeader) refused = rig.begin(1, sig);
  const bool buffered = rig.header(1, sig);
  if (at == BeginAt::kAfterHeader) refused = rig.begin(1, sig);
  if (buffered) rig.payload();
  if (at == BeginAt::kAfterPayload) refused = rig.begin(1, sig);
  EXPECT_TRUE(!refused && rig.ledger.failure(1).empty(), "op 1 began ", name(at), ": ", rig.ledger.failure(1));

  std::vector<uint8_t> into(kBytes, 0);
  auto recv = std::make_shared<Request>(Request::Direction::kRecv, 1, into.data(), kBytes);
  FrameInfo info;
  info.seq = 1;
  info.signature = sig;
  Completions completions;
  rig.matcher.post(1, info, recv, completions);
  finish(completions);
  EXPECT_TRUE(recv->done() && recv->error() == nullptr, "op 1 began ", name(at), ": the receive did not complete");
  EXPECT_TRUE(into == std::vector<uint8_t>(kBytes, 7), "op 1 began ", name(at), ": wrong bytes delivered");
}

// Rank 0 of 3 finished op 1 before rank 1 died; rank 2 did not, and reports op 1 failed after it
// lost rank 1 (the report's root). Rank 0 is in op 2 by then, waiting for rank 2, which gave the
// group up: op 2 fails at once naming the lost rank, and so does any later op, instead of each
// waiting for the timeout. A report that names no lost rank (a mismatch seen late) leaves op 2 be.
void testReportOfALostRankFailsTheOpsAfterIt(bool namesLostRank) {
  OpLedger ledger(0, "[rank 0/3]");
  Matcher matcher(0, kSize, "[rank 0/3]", 1 << 20, ledger);
  const OpSignature sig = signature(OpKind::kAllreduce, -1);
  ledger.begin(1, sig);
  ledger.retire(1, true);
  ledger.begin(2, sig);
  auto recv = std::make_shared<Request>(Request::Direction::kRecv, 2, nullptr, kBytes);
  FrameInfo info;
  info.seq = 2;
  info.signature = sig;
  Completions completions;
  matcher.post(2, info, recv, completions);
  finish(completions);

  FrameInfo reported;
  reported.seq = 1;
  reported.signature.root = namesLostRank ? 1 : -1;
  const std::string text = "[rank 2/3] connection to peer 1 closed";
  const FrameHeader h = makeHeader(FrameKind::kError, reported, text.size());
  std::string refused = matcher.errorReport(2, h, text, completions);
  finish(completions);
  EXPECT_TRUE(refused.empty(), refused);
  const char* what = namesLostRank ? "a lost rank" : "no lost rank";
  if (!namesLostRank) {
    EXPECT_TRUE(!recv->done(), "a late report naming ", what, " failed the op in flight");
    EXPECT_TRUE(ledger.lostRanks().empty(), "lost ranks from a report naming none");
    return;
  }
  EXPECT_TRUE(recv->done() && recv->error() != nullptr, "op 2's receive from rank 2 still waits after a report of ", what);
  EXPECT_TRUE(ledger.lostRanks() == std::vector<int>({1}), "lost ranks: ", ledger.lostRanks().size());
  std::string message;
  try {
    ledger.begin(3, sig);
  } catch (const std::exception& e) {
    message = e.what();
  }
  EXPECT_TRUE(message.find("rank 1") != std::string::npos, "op 3 began on a group that lost rank 1: '", message, "'");
}

// Rank 0 is still in op 1 when rank 2 reports that op 2 failed there after losing rank 1: op 1
// fails at once too (it needs rank 1 as well). A report whose lost rank is its own sender names
// no one (a rank cannot report itself lost).
void testReportAheadFailsTheOpRunningHere(bool selfNamed) {
  OpLedger ledger(0, "[rank 0/3]");
  Matcher matcher(0, kSize, "[rank 0/3]", 1 << 20, ledger);
  const OpSignature sig = signature(OpKind::kAllreduce, -1);
  ledger.begin(1, sig);
  auto recv = std::make_shared<Request>(Request::Direction::kRecv, 2, nullptr, kBytes);
  FrameInfo info;
  info.seq = 1;
  info.signature = sig;
  Completions completions;
  matcher.post(2, info, recv, completions);
  finish(completions);
  FrameInfo reported;
  reported.seq = 2;
  reported.signature.root = selfNamed ? 2 : 1;
  const std::string text = "[rank 2/3] timed out waiting for peer 1";
  EXPECT_TRUE(matcher.errorReport(2, makeHeader(FrameKind::kError, reported, text.size()), text, completions).empty(), "refused");
  finish(completions);
  if (selfNamed) {
    EXPECT_TRUE(!recv->done() && ledger.lostRanks().empty(), "a report naming its own sender counted it lost");
    return;
  }
  EXPECT_TRUE(recv->done() && recv->error() != nullptr, "op 1 still waits after a report of op 2 naming a lost rank");
  EXPECT_TRUE(ledger.lostRanks() == std::vector<int>({1}), "lost ranks: ", ledger.lostRanks().size());
}

// Probe frames carry nothing: a ping or pong with a payload, or a kind past them, is malformed.
void testProbeFramesAreValidatedLikeAnyOther() {
  FrameInfo info;
  for (FrameKind kind : {FrameKind::kPing, FrameKind::kPong}) {
    EXPECT_TRUE(validateHeader(makeHeader(kind, info, 0)).empty(), validateHeader(makeHeader(kind, info, 0)));
    EXPECT_TRUE(!validateHeader(makeHeader(kind, info, 1)).empty(), "a probe with a payload passed");
  }
  FrameHeader past = makeHeader(FrameKind::kPong, info, 0);
  past.kind = static_cast<uint8_t>(FrameKind::kPong) + 1;
  EXPECT_TRUE(validateHeader(past).find("unknown frame kind") != std::string::npos, validateHeader(past));
}

// A peer that sends a second frame for the same op and slot while the first is still held (no
// receive posted yet) breaks the framing: the second is refused, which fails the peer by name,
// instead of being dropped while its bytes stay counted against the peer's budget for good.
void testSecondFrameForAHeldSlotIsRefused() {
  Rig rig;
  const OpSignature sig = signature(OpKind::kAllreduce, -1);
  EXPECT_TRUE(rig.header(5, sig), "the first frame of seq 5 slot 0 is held");
  rig.payload();
  FrameInfo info;
  info.seq = 5;
  info.signature = sig;
  rig.connection.header = makeHeader(FrameKind::kData, info, kBytes);
  Completions completions;
  const std::string why = rig.matcher.claim(rig.connection, completions);
  finish(completions);
  EXPECT_TRUE(why.find("peer 1") != std::string::npos && why.find("seq=5 slot=0") != std::string::npos &&
                  why.find("twice") != std::string::npos,
              "a second frame for seq 5 slot 0: '", why, "'");
  // The first is still delivered to the receive posted for it.
  std::vector<uint8_t> into(kBytes, 0);
  auto recv = std::make_shared<Request>(Request::Direction::kRecv, 1, into.data(), kBytes);
  rig.ledger.begin(5, sig);
  rig.matcher.post(1, info, recv, completions);
  finish(completions);
  EXPECT_TRUE(recv->done() && recv->error() == nullptr && into == std::vector<uint8_t>(kBytes, 7),
              "the held frame of seq 5 was not delivered");
}

}  // namespace

int main() {
  testSecondFrameForAHeldSlotIsRefused();
  testProbeFramesAreValidatedLikeAnyOther();
  testReportAheadFailsTheOpRunningHere(false);
  testReportAheadFailsTheOpRunningHere(true);
  testReportOfALostRankFailsTheOpsAfterIt(true);
  testReportOfALostRankFailsTheOpsAfterIt(false);
  for (BeginAt at : {BeginAt::kBeforeHeader, BeginAt::kAfterHeader, BeginAt::kAfterPayload}) {
    testMismatchFailsTheOpWheneverItBegins(at);
    testAgreeingFrameIsDelivered(at);
  }
  const int failed = pycomm::testing::failures();
  std::printf("%s: %d failure(s)\n", failed ? "FAILED" : "ok", failed);
  return failed ? 1 : 0;
}
