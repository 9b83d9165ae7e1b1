#include "tcp_transport.h"

#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "../../error.h"
#include "handshake.h"

namespace pycomm::transport::tcp {
namespace {

constexpr uint64_t kListenerTag = EventLoop::kWakeupTag - 1;

}  // namespace

TcpTransport::TcpTransport(const TcpOptions& options, Store& store, OpLedger& ledger)
    : rank_(options.rank),
      size_(options.size),
      timeout_(options.timeout),
      linger_(options.linger),
      logger_(options.logger),
      context_(strCat("[rank ", rank_, "/", size_, "]")),
      ledger_(ledger),
      loop_(options.linger, logger_, context_),
      matcher_(rank_, size_, context_, options.unexpectedBytes, ledger) {
  connections_.resize(size_);
  if (size_ > 1) {
    GroupSockets group = connectGroup(rank_, size_, options.bindHost, store, timeout_, logger_, options.token);
    token_ = group.token;
    listener_ = std::move(group.listener);
    loop_.add(listener_.fd(), kListenerTag);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      connections_[r] = std::make_unique<Connection>(r, std::move(group.peers[r]), loop_, counters_);
      loop_.add(connections_[r]->socket.fd(), static_cast<uint64_t>(r));
    }
  }
  loop_.start([this](uint64_t tag, uint32_t events) { onEvents(tag, events); }, [this] { endIdleLingers(); });
}

// The loop thread is joined here, before the connections and the matcher it reads are destroyed:
// an abort run earlier on the loop thread itself (from a request's callback) could not join it. On
// the loop thread, EventLoop's destructor detaches it instead.
TcpTransport::~TcpTransport() {
  abort("the process group was destroyed");
  loop_.stop();
}

// ---------------------------------------------------------------------------------------------
// Posting

std::shared_ptr<Request> TcpTransport::isend(int peer, const FrameInfo& info, const void* data, size_t nbytes) {
  PYCOMM_CHECK(peer >= 0 && peer < size_ && peer != rank_, InvalidUsageError, context_, " send to invalid peer ", peer,
               " (group of ", size_, ")");
  auto request = std::make_shared<Request>(Request::Direction::kSend, peer, const_cast<void*>(data), nbytes);
  OutgoingFrame frame{makeHeader(FrameKind::kData, info, nbytes), static_cast<const uint8_t*>(data), nbytes, 0,
                      request, {}};
  if (logger_.enabled(LogLevel::kTrace)) {
    logger_.log(LogLevel::kTrace, strCat(" send to peer ", peer, ": ", describeFrame(frame.header)));
  }
  send(*connections_[peer], std::move(frame));
  return request;
}

std::shared_ptr<Request> TcpTransport::irecv(int peer, const FrameInfo& info, void* data, size_t nbytes) {
  PYCOMM_CHECK((peer == kAnyPeer && info.channel == Channel::kP2P) || (peer >= 0 && peer < size_ && peer != rank_),
               InvalidUsageError, context_, " receive from invalid peer ", peer, " (group of ", size_, ")");
  auto request = std::make_shared<Request>(Request::Direction::kRecv, peer, data, nbytes);
  Completions completions;
  const bool postedForLoop = matcher_.post(peer, info, request, completions);
  // A point-to-point receive may complete with no thread waiting for it (a callback, polling).
  if (postedForLoop) endLinger(peer);
  finish(completions);
  return request;
}

void TcpTransport::send(Connection& connection, OutgoingFrame frame) {
  std::vector<std::shared_ptr<Request>> done;
  int err = 0;
  {
    std::lock_guard<std::mutex> lock(connection.sendMutex);
    if (connection.sendClosed) {
      // A new send has no callback yet: failing it under the lock runs no user code.
      if (frame.request) frame.request->fail(connection.sendClosed);
      return;
    }
    err = connection.enqueueLocked(std::move(frame), done);
  }
  afterFlush(connection, done, err);
}

bool TcpTransport::cancel(const std::shared_ptr<Request>& request, Clock::time_point deadline) {
  if (request->done()) return true;
  bool active = false;
  if (matcher_.unpost(
          request,
          [&](const std::shared_ptr<Request>& r) {
            for (auto& c : connections_) {
              if (c && c->request == r) return true;  // being read into: read under the matcher's lock
            }
            return false;
          },
          &active)) {
    return true;
  }
  if (!active && request->direction() == Request::Direction::kSend) {
    Connection& c = *connections_[request->peer()];
    std::lock_guard<std::mutex> lock(c.sendMutex);
    for (auto it = c.sendQueue.begin(); it != c.sendQueue.end(); ++it) {
      if (it->request != request) continue;
      if (it->written == 0) {
        c.sendQueue.erase(it);
        return true;
      }
      active = true;  // half written: the rest must follow or the stream loses its framing
      break;
    }
  }
  if (active || !request->done()) {
    // The loop is moving this request's bytes right now; that ends soon unless the peer stalls.
    try {
      if (request->direction() == Request::Direction::kRecv) {
        waitForLoop(*request, request->peer(), deadline, context_);
      } else {
        request->wait(deadline, context_);
      }
    } catch (const Error&) {
      // Only whether it is done matters here; the op reports its own error.
    }
  }
  if (request->done()) return true;
  abort(strCat("a request to or from peer ", request->peer(), " could not be cancelled"));
  return false;
}

void TcpTransport::reportFailure(uint64_t seq, const std::string& message, const std::vector<int>& lostRanks) {
  const std::string text = message.size() > kMaxErrorText ? message.substr(0, kMaxErrorText) : message;
  // One frame per lost rank (its root names it), so that every peer learns all of them; one with
  // root -1 when none is lost.
  std::vector<int> roots = lostRanks.empty() ? std::vector<int>{-1} : lostRanks;
  for (auto& c : connections_) {
    if (!c) continue;
    for (int lost : roots) {
      FrameInfo info;
      info.channel = Channel::kCollective;
      info.seq = seq;
      info.signature.root = lost;  // an error frame's root: a rank the reporter lost, or -1
      OutgoingFrame frame{makeHeader(FrameKind::kError, info, text.size()), nullptr, text.size(), 0, nullptr,
                          std::vector<uint8_t>(text.begin(), text.end())};
      frame.data = frame.owned.data();  // the vector's buffer moves with it
      send(*c, std::move(frame));
    }
  }
}

std::string TcpTransport::judgeTimeout(int peer) {
  if (peer < 0 || peer >= size_ || peer == rank_ || !connections_[peer]) {
    ledger_.noteFault(OpLedger::Fault::kTimeout, -1);
    return {};
  }
  // A live peer's transport answers within milliseconds; a frozen one never. The probe is short
  // beside the timeout that led here, long enough for a loaded machine's scheduler (two pings, so
  // one lost in a stall is not the verdict), and bounded for the longest timeouts.
  const auto probe = std::clamp(timeout_ / 4, std::chrono::milliseconds(500), std::chrono::milliseconds(1000));
  Connection& c = *connections_[peer];
  const uint64_t before = c.pongs.load();
  const auto ping = [&] {
    if (matcher_.failed(peer)) return;
    FrameInfo info;
    send(c, OutgoingFrame{makeHeader(FrameKind::kPing, info, 0), nullptr, 0, 0, nullptr, {}});
    endLinger(c);  // the loop reads the answer
  };
  const auto answered = [&] { return c.pongs.load() != before; };
  const auto start = Clock::now();
  ping();
  bool pingedAgain = false;
  while (!answered() && Clock::now() < start + probe && !matcher_.failed(peer) && !loop_.stopping()) {
    if (!pingedAgain && Clock::now() >= start + probe / 2) {
      ping();
      pingedAgain = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (loop_.stopping()) return {};
  if (!answered()) {
    // Frozen: its connection is of no more use, and closing it fails at once what is still queued
    // to it (a half-written send would otherwise hold this op's cancel for seconds). The timeout,
    // not the closing, is the fault.
    failPeer(c, remoteError(strCat(context_, " peer ", peer, " did not answer a probe after a timeout: lost")));
    ledger_.noteFault(OpLedger::Fault::kTimeout, peer);
    return strCat("; peer ", peer, " does not answer a probe either (frozen or gone): rank ", peer, " is lost");
  }
  // Alive: it waits for someone else. The rank that waits for the frozen one probes it as this rank
  // just did and reports it lost; that report names it here too (OpLedger::recordPeerReport). Its
  // op may have begun a little after this one's (a DDP bucket is ready at each rank's own pace):
  // wait out its probe and some skew.
  ledger_.noteFault(OpLedger::Fault::kTimeout, -1);
  const auto deadline = Clock::now() + 2 * probe + std::chrono::seconds(1);
  while (ledger_.lostRanks().empty() && Clock::now() < deadline && !loop_.stopping()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const std::vector<int> lost = ledger_.lostRanks();
  if (lost.empty()) return strCat("; peer ", peer, " answers a probe: it is alive, waiting for another rank");
  std::string ranks;
  for (int r : lost) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  return strCat("; peer ", peer, " answers a probe (alive, waiting too); the group lost rank ", ranks);
}

// ---------------------------------------------------------------------------------------------
// Shared-memory rings

void TcpTransport::attachRings(int peer, shm::Ring out, shm::Ring in, std::shared_ptr<void> keepalive) {
  Connection& c = *connections_.at(peer);
  auto replace = [&] {
    c.ringOut = out;
    c.ringIn = in;
    c.ringMemory = std::move(keepalive);
  };
  {
    std::lock_guard<std::mutex> recvLock(c.recvMutex);  // ringIn is the receive side's
    std::lock_guard<std::mutex> sendLock(c.sendMutex);
    // A setup that gives shared memory up after a peer moved onto it (the peer's vote passed, this
    // rank's failed: a rank lost between the ballots it sent) drops rings the connection runs
    // through. That peer can no longer be reached: it fails first, and the rings go after.
    const bool stranded = (c.readViaRing && !in.valid()) || (c.writeViaRing && !out.valid());
    if (!stranded) return replace();
  }
  // Once failed, the connection neither reads nor writes a ring (readSome asks the matcher first;
  // its sends are closed).
  failPeer(c, remoteError(strCat(context_, " peer ", peer, ": its connection runs through shared memory that this ",
                                 "rank gave up (the group's setup failed after the move); connection closed")));
  std::lock_guard<std::mutex> recvLock(c.recvMutex);
  std::lock_guard<std::mutex> sendLock(c.sendMutex);
  replace();
}

void TcpTransport::moveToSharedMemory(int peer) {
  Connection& c = *connections_.at(peer);
  {
    std::lock_guard<std::mutex> lock(c.sendMutex);
    PYCOMM_CHECK(c.ringOut.valid(), InternalError, context_, " no ring attached for peer ", peer);
  }
  FrameInfo info;
  info.channel = Channel::kCollective;
  send(c, OutgoingFrame{makeHeader(FrameKind::kMoveToSharedMemory, info, 0), nullptr, 0, 0, nullptr, {}});
}

// ---------------------------------------------------------------------------------------------
// The loop's events

void TcpTransport::onEvents(uint64_t tag, uint32_t events) {
  if (tag == kListenerTag) {
    acceptStranger();
    return;
  }
  Connection& c = *connections_[tag];
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
    while (handleInput(c, [&] { return handleReadable(c); }) && !loop_.stopping()) {
    }
  }
  if (events & EPOLLOUT) handleWritable(c);
}

void TcpTransport::acceptStranger() {
  // Only the loop thread comes here, so one log per thread is one per transport. It captures
  // copies: a detached loop thread may exit after the transport is gone.
  thread_local StrangerLog strangers(
      [logger = logger_, context = context_](const std::string& line) { logger.warn(context + line); });
  turnAwayStrangers(listener_, strangers);
}

void TcpTransport::handleWritable(Connection& c) {
  std::vector<std::shared_ptr<Request>> done;
  int err;
  {
    std::lock_guard<std::mutex> lock(c.sendMutex);
    err = c.flushLocked(done);
    if ((c.sendQueue.empty() || err != 0 || c.writeViaRing) && c.pollingWrite) c.setPollWrite(false);
  }
  afterFlush(c, done, err);
}

void TcpTransport::afterFlush(Connection& c, std::vector<std::shared_ptr<Request>>& done, int err) {
  Completions completions;
  for (auto& r : done) completions.push_back({std::move(r), c.rank, nullptr});
  done.clear();
  finish(completions);  // inside input handling (a ring's space doorbell), after the lock is released
  if (err != 0) {
    std::string why = std::strerror(err);
    {
      std::lock_guard<std::mutex> lock(c.sendMutex);
      if (!c.ringFailure.empty()) why = c.ringFailure + " (its shared-memory ring)";
    }
    failPeer(c, remoteError(strCat(context_, " sending to peer ", c.rank, " failed: ", why)));
  }
}

// ---------------------------------------------------------------------------------------------
// Failures

std::exception_ptr TcpTransport::peerFailure(int peer) { return matcher_.failure(peer); }

void TcpTransport::endSends(Connection& c, const std::exception_ptr& error, Completions& completions, bool close) {
  std::lock_guard<std::mutex> sendLock(c.sendMutex);
  c.closeSendsLocked(error, completions);
  std::lock_guard<std::mutex> watchLock(c.watchMutex);
  if (close) {
    c.closeGracefully();
  } else if (c.socket.valid()) {
    loop_.remove(c.socket.fd());
    ::shutdown(c.socket.fd(), SHUT_RDWR);
  }
}

void TcpTransport::failPeer(Connection& c, std::exception_ptr error) {
  Completions completions;
  {
    auto recvLock = lockReceiveSide(c);  // connection.request is the receive side's
    if (!matcher_.failPeer(c, error, completions)) return;
  }
  endSends(c, error, completions, false);
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    // A peer leaving while nothing waits on it is how groups end; say so only when it costs work.
    logger_.log(completions.empty() ? LogLevel::kInfo : LogLevel::kWarn, e.what());
  }
  finish(completions);
}

void TcpTransport::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abortMutex_);
    if (stopped_) return;
    stopped_ = true;
  }
  auto error = remoteError(strCat(context_, " communicator aborted: ", reason));
  loop_.stop();
  // The loop has stopped; a thread reading a socket itself stops at its next read (stopping()).
  // Fail whatever waits.
  Completions completions;
  matcher_.abort(error, completions);
  for (auto& c : connections_) {
    if (!c) continue;
    auto recvLock = lockReceiveSide(*c);
    matcher_.failClaimed(*c, error, completions);
    endSends(*c, error, completions, true);
  }
  finish(completions);
}

}  // namespace pycomm::transport::tcp
