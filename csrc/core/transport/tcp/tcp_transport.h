// The TCP transport: one connection per peer, non-blocking sockets and one event-loop thread. This
// class coordinates the parts, each of which has one job:
//
//   event_loop     epoll, the wake-up eventfd, the loop thread and its ticks
//   connection     one peer's framing: the frame being read, the send queue and its flush, the rings
//   matcher        every kind of receive meets its message there (posted first or arrived first)
//   read_ownership who reads a socket now: the loop, waiting callers, or nobody for a linger
//   completion     requests completed only once no lock is held
//
// and its own code falls in three files: this one (posting, cancelling, failures, the move to
// rings, the loop's events), inbound.cc (reading frames off a connection, for the loop and for
// waiting callers alike) and caller_read.cc (the caller-read path and the linger).
//
// Receives are matched by (peer, seq, slot) for collectives and in arrival order per (peer, tag) for
// point-to-point, as MPI does. A message whose receive is already posted is read straight into the
// caller's buffer; one that arrives first is buffered until its receive is posted. Sends are written
// directly from the posting thread while the socket accepts them and queued for the loop otherwise,
// so a rank's sends never wait on its receives. Likewise the thread waiting for a short message
// reads the peer's socket itself while the loop leaves that socket alone (wait()), and for a short
// while after (ReadOwnership's linger), so neither that message nor the next op's costs a wake-up of
// the loop; everything else is read by the loop.
//
// The per-op failure ledger is the communicator's (op_ledger.h): the matcher reads it to judge
// collective frames and records into it the mismatches and the peers' failure reports it receives.
// Telling the peers that an op failed here (reportFailure) stays a transport job: it is a frame to
// every peer's send queue, ordered after the frames of that op already queued.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "../../logging.h"
#include "../../op_ledger.h"
#include "../../store.h"
#include "../ring_links.h"
#include "../transport.h"
#include "completion.h"
#include "connection.h"
#include "event_loop.h"
#include "hello.h"
#include "matcher.h"
#include "socket.h"

namespace pycomm::transport::tcp {

struct TcpOptions {
  int rank = 0;
  int size = 1;
  std::string bindHost = "127.0.0.1";
  std::chrono::milliseconds timeout{300000};
  // How long a socket a waiting thread drained stays out of the loop's sight (ReadOwnership's
  // linger) and how often the loop wakes while one does; 0 hands it back at once.
  std::chrono::milliseconds linger{10};
  // At most this many bytes of frames nobody posted a receive for yet (sent ahead, or a peer
  // misbehaving) are held per peer; past it the peer is failed (Config::unexpectedBytes).
  uint64_t unexpectedBytes = uint64_t{4} << 30;
  Logger logger;
  // The group's secret, when it was derived from another group's (handshake.h: connectGroup).
  std::optional<Token> token;
};

class TcpTransport final : public Transport, public RingLinks {
 public:
  // `ledger` (the communicator's) must outlive the transport.
  TcpTransport(const TcpOptions& options, Store& store, OpLedger& ledger);
  ~TcpTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "tcp"; }
  // The secret this group's connections proved (handshake.h), from which groups formed from this
  // one derive theirs (Communicator::lineageFor) and its shared memory takes its names.
  const Token& token() const { return token_; }

  std::shared_ptr<Request> isend(int peer, const FrameInfo& info, const void* data, size_t nbytes) override;
  std::shared_ptr<Request> irecv(int peer, const FrameInfo& info, void* data, size_t nbytes) override;
  // A short receive from one peer over a socket is read by the waiting thread itself, which saves
  // waking the loop thread for it; anything else waits for the loop (caller_read.cc).
  void wait(const std::shared_ptr<Request>& request, Clock::time_point deadline, const std::string& context) override;
  bool cancel(const std::shared_ptr<Request>& request, Clock::time_point deadline) override;
  bool onIoThread() const override { return loop_.onLoopThread(); }
  void reportFailure(uint64_t seq, const std::string& message, const std::vector<int>& lostRanks) override;
  std::string judgeTimeout(int peer) override;
  std::exception_ptr peerFailure(int peer) override;
  void abort(const std::string& reason) override;

  // RingLinks
  void attachRings(int peer, shm::Ring out, shm::Ring in, std::shared_ptr<void> keepalive) override;
  void moveToSharedMemory(int peer) override;
  uint64_t socketBytesSent() const override { return counters_.socketBytesSent.load(); }
  uint64_t ringBytesSent() const override { return counters_.ringBytesSent.load(); }
  uint64_t socketBytesReceived() const override { return counters_.socketBytesReceived.load(); }
  uint64_t callerBytesReceived() const override { return counters_.callerBytesReceived.load(); }

  // Error reports longer than this are cut (sending) or malformed (receiving).
  static constexpr size_t kMaxErrorText = 64 * 1024;
  // Receives up to this size are read by the waiting thread. Longer ones (the default chunk_bytes,
  // 512 KiB, and up) stay with the loop thread, which then receives the next chunk of a pipelined
  // schedule while the caller reduces this one. Up to 256 KiB the loop's two wake-ups per message
  // cost more than the overlap saves: a 256 KiB all-reduce at world 2 took 81-88 us read by its
  // waiters against 123-136 us through the loop, alternating in one process pair; at 1 and 4 MiB
  // reading 512 KiB chunks on the waiter as well changed nothing (docs/PERFORMANCE.md).
  static constexpr size_t kCallerReadMaxBytes = 256 * 1024;

 private:
  // --- tcp_transport.cc
  // The loop's events for socket `tag` (a peer's rank, or the listener).
  void onEvents(uint64_t tag, uint32_t events);
  void acceptStranger();
  // Queues `frame` to `connection` and writes what it can at once; a frame for a closed connection
  // fails (or, without a request, is dropped).
  void send(Connection& connection, OutgoingFrame frame);
  void handleWritable(Connection& connection);
  // After a flush, with sendMutex released: completes the sends it finished and fails the peer if
  // the write failed (errno `err`).
  void afterFlush(Connection& connection, std::vector<std::shared_ptr<Request>>& done, int err);
  void failPeer(Connection& connection, std::exception_ptr error);
  // The send side and socket of a connection that ends, for failPeer and abort alike: queued sends
  // fail and later ones fail at once; the socket is shut and unwatched (`close` false: the fd number
  // stays taken, as other threads may still hold it) or closed gracefully (abort, with every lock of
  // the connection held).
  void endSends(Connection& connection, const std::exception_ptr& error, Completions& completions, bool close);

  // --- inbound.cc
  // Runs `body` (input handling for `connection`) on this thread with its recvMutex held. Requests
  // it completes are completed, and their callbacks (user code) run, only after the mutex is
  // released (or they are appended to `keep`, for the caller to complete once it is ready). Returns
  // what `body` returns.
  template <typename Body>
  bool handleInput(Connection& connection, Body&& body, Completions* keep = nullptr);
  // Holds connection.recvMutex unless this thread already does (inside handleInput for it): once
  // held, no thread is reading into the buffer of the request being received, so it may be taken.
  static std::unique_lock<std::mutex> lockReceiveSide(Connection& connection);
  // Called inside handleInput. True when it stopped early because something completed: call again.
  bool handleReadable(Connection& connection);
  bool readSome(Connection& connection);  // false once the socket would block or failed
  void onHeader(Connection& connection);
  void onPayload(Connection& connection);

  // --- caller_read.cc
  // Reads `connection`'s socket on the calling thread until `request` is done or `deadline` passes;
  // returns early, leaving the rest to the loop, if the peer moves to a ring or the transport stops.
  void readOnCallingThread(Connection& connection, Request& request, Clock::time_point deadline);
  // A thread starts or stops reading `connection`'s socket itself (ReadOwnership); the last one to
  // stop may leave it lingering if it left it drained (`linger`).
  void setCallerReading(Connection& connection, bool reading, bool linger = false);
  // A thread starts or stops waiting for what the loop moves: a receive from `peer` that no waiter
  // reads, or (with kAnyPeer, every peer) a send.
  void setLoopReading(int peer, bool reading);
  // Waits for a request that the loop moves, counted by setLoopReading as a reader of `peer` (or of
  // every peer, kAnyPeer).
  void waitForLoop(Request& request, int peer, Clock::time_point deadline, const std::string& context);
  // Ends a linger at once (a posted receive may complete with no thread waiting for it).
  void endLinger(int peer);
  void endLinger(Connection& connection);
  // On the loop's tick: gives the loop back the sockets no thread has read for the linger.
  void endIdleLingers();
  // Calls `f` on `peer`'s connection, or on every peer's for kAnyPeer.
  template <typename F>
  void forPeers(int peer, F&& f) {
    if (peer != kAnyPeer) {
      f(*connections_[peer]);
      return;
    }
    for (auto& c : connections_) {
      if (c) f(*c);
    }
  }

  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  const std::chrono::milliseconds linger_;
  const Logger logger_;
  const std::string context_;  // "[rank r/p]"

  OpLedger& ledger_;  // told of timeouts (judgeTimeout); the matcher judges frames by it
  WireCounters counters_;
  Token token_{};
  Socket listener_;
  EventLoop loop_;
  Matcher matcher_;
  std::vector<std::unique_ptr<Connection>> connections_;  // by rank; null for this rank
  int64_t nextLingerScan_ = 0;                            // loop thread only

  std::mutex abortMutex_;
  bool stopped_ = false;
};

template <typename Body>
bool TcpTransport::handleInput(Connection& connection, Body&& body, Completions* keep) {
  Completions completions;
  bool result;
  try {
    std::lock_guard<std::mutex> lock(connection.recvMutex);
    InputScope scope(&completions, &connection);
    result = body();
  } catch (...) {
    finish(completions);  // what was found before the error still completes, then the error goes on
    throw;
  }
  if (keep != nullptr) {
    for (auto& c : completions) keep->push_back(std::move(c));
  } else {
    finish(completions);
  }
  return result;
}

}  // namespace pycomm::transport::tcp
