#include "tcp_transport.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "../../error.h"
#include "handshake.h"

namespace pycomm::transport::tcp {
namespace {

constexpr uint64_t kWakeupTag = ~uint64_t{0};
constexpr uint64_t kListenerTag = ~uint64_t{0} - 1;
constexpr size_t kMaxErrorText = 64 * 1024;
// Failure reports held for ops this rank has not retired yet; a few per op in flight is the most a
// sane peer sends.
constexpr size_t kMaxFailedSeqs = 4096;
constexpr size_t kMaxIov = 32;
// Receives up to this size are read by the waiting thread. Longer ones stay with the loop thread,
// which then receives the next chunk of a pipelined schedule while the caller reduces this one.
constexpr size_t kCallerReadMaxBytes = 64 * 1024;
// Yields, each followed by a look at the socket, before a waiting caller sleeps in poll(): a short
// message is often a few microseconds away, and the yield lets a rank sharing this core send it.
constexpr int kCallerReadSpins = 200;
// Reads (a header or a piece of a payload each) a waiter goes on with once its own frame is in.
constexpr int kCallerReadsPastOwnFrame = 16;
int64_t steadyNanoseconds() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// Where unwanted bytes go. Per thread: the loop thread and waiting callers read different peers at once.
uint8_t* discardBuffer(size_t& size) {
  thread_local std::vector<uint8_t> buffer(256 * 1024);
  size = buffer.size();
  return buffer.data();
}

// Set on a transport's event-loop thread, to count what other threads read.
thread_local bool onLoopThread = false;
thread_local const void* loopOwner = nullptr;  // the transport whose loop this thread runs

std::exception_ptr remoteError(const std::string& message) {
  return std::make_exception_ptr(RemoteError(message));
}

std::string describeFrame(const FrameHeader& h) {
  return strCat(h.kind == static_cast<uint8_t>(FrameKind::kError)                ? "error"
                : h.kind == static_cast<uint8_t>(FrameKind::kMoveToSharedMemory) ? "move to shared memory"
                                                                                 : "data",
                h.channel == static_cast<uint8_t>(Channel::kP2P) ? " p2p tag=" : " seq=", h.seq,
                " slot=", h.slot, " op=", opKindName(static_cast<OpKind>(h.opKind)), " count=", h.count,
                " bytes=", h.nbytes);
}

}  // namespace

thread_local std::vector<TcpTransport::Completion>* TcpTransport::deferredCompletions_ = nullptr;
thread_local const TcpTransport::Peer* TcpTransport::inputPeer_ = nullptr;

template <typename Body>
bool TcpTransport::handleInput(Peer& peer, Body&& body, std::vector<Completion>* keep) {
  std::vector<Completion> completions;
  bool result;
  try {
    std::lock_guard<std::mutex> lock(peer.recvMutex);
    auto* const outerCompletions = deferredCompletions_;
    const Peer* const outerPeer = inputPeer_;
    deferredCompletions_ = &completions;
    inputPeer_ = &peer;
    struct Restore {
      std::vector<Completion>* completions;
      const Peer* peer;
      ~Restore() {
        deferredCompletions_ = completions;
        inputPeer_ = peer;
      }
    } restore{outerCompletions, outerPeer};
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

std::unique_lock<std::mutex> TcpTransport::lockReceiveSide(Peer& peer) {
  std::unique_lock<std::mutex> lock(peer.recvMutex, std::defer_lock);
  if (inputPeer_ != &peer) lock.lock();  // else this thread holds it already (handleInput)
  return lock;
}

TcpTransport::TcpTransport(const TcpOptions& options, Store& store)
    : rank_(options.rank),
      size_(options.size),
      timeout_(options.timeout),
      linger_(options.linger),
      unexpectedBudget_(options.unexpectedBytes),
      logger_(options.logger) {
  peers_.resize(size_);
  epoll_ = Socket(epoll_create1(EPOLL_CLOEXEC));
  wakeup_ = Socket(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  PYCOMM_CHECK(epoll_.valid() && wakeup_.valid(), InternalError, "epoll/eventfd: ", std::strerror(errno));
  auto watch = [&](int fd, uint64_t tag) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    PYCOMM_CHECK(epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, fd, &ev) == 0, InternalError,
                 "epoll_ctl: ", std::strerror(errno));
  };
  watch(wakeup_.fd(), kWakeupTag);
  if (size_ > 1) {
    GroupSockets group = connectGroup(rank_, size_, options.bindHost, store, timeout_, logger_);
    listener_ = std::move(group.listener);
    watch(listener_.fd(), kListenerTag);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      peers_[r] = std::make_unique<Peer>();
      peers_[r]->rank = r;
      peers_[r]->socket = std::move(group.peers[r]);
      watch(peers_[r]->socket.fd(), static_cast<uint64_t>(r));
    }
  }
  thread_ = std::thread([this] { loop(); });
}

TcpTransport::~TcpTransport() {
  abort("the process group was destroyed");
  // An abort from the loop thread itself (a request's callback) could not join it.
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
}

bool TcpTransport::onIoThread() const { return onLoopThread && loopOwner == this; }

std::string TcpTransport::context() const { return strCat("[rank ", rank_, "/", size_, "]"); }

// ---------------------------------------------------------------------------------------------
// Posting

std::shared_ptr<Request> TcpTransport::isend(int peer, const FrameInfo& info, const void* data,
                                             size_t nbytes) {
  PYCOMM_CHECK(peer >= 0 && peer < size_ && peer != rank_, InvalidUsageError, context(),
               " send to invalid peer ", peer, " (group of ", size_, ")");
  auto request = std::make_shared<Request>(Request::Direction::kSend, peer,
                                           const_cast<void*>(data), nbytes);
  Peer& p = *peers_[peer];
  std::vector<std::shared_ptr<Request>> done;
  int err = 0;
  {
    std::lock_guard<std::mutex> lock(p.sendMutex);
    if (p.sendClosed) {
      request->fail(p.sendClosed);
      return request;
    }
    OutgoingFrame frame{makeHeader(FrameKind::kData, info, nbytes),
                        static_cast<const uint8_t*>(data), nbytes, 0, request, {}};
    if (logger_.enabled(LogLevel::kTrace)) {
      logger_.log(LogLevel::kTrace, strCat(" send to peer ", peer, ": ", describeFrame(frame.header)));
    }
    err = enqueueLocked(p, std::move(frame), done);
  }
  afterFlush(p, done, err);
  return request;
}

std::shared_ptr<Request> TcpTransport::irecv(int peer, const FrameInfo& info, void* data,
                                             size_t nbytes) {
  const bool anyPeer = peer == kAnyPeer;
  PYCOMM_CHECK((anyPeer && info.channel == Channel::kP2P) ||
                   (peer >= 0 && peer < size_ && peer != rank_),
               InvalidUsageError, context(), " receive from invalid peer ", peer, " (group of ",
               size_, ")");
  auto request = std::make_shared<Request>(Request::Direction::kRecv, peer, data, nbytes);
  std::vector<Completion> completions;
  bool postedForLoop = false;
  {
    std::lock_guard<std::mutex> lock(matchMutex_);
    // A message that already arrived is delivered even if its sender has gone since: a peer may
    // finish its part of an op and leave before this rank gets round to receiving.
    std::exception_ptr failure = aborted_;
    if (failure) {
      completions.push_back({request, 0, peer, failure});
    } else if (info.channel == Channel::kCollective) {
      CollectiveKey key{peer, info.seq, info.slot};
      auto arrived = arrivedCollective_.find(key);
      auto failed = failedSeqs_.find(info.seq);
      if (arrived != arrivedCollective_.end()) {
        deliverLocked(request, peer, arrived->second.header, arrived->second.payload,
                      checkCollective(peer, arrived->second.header, {request, info.signature}, nbytes), completions);
        releaseLocked(arrived->second);
        arrivedCollective_.erase(arrived);
      } else if (failed != failedSeqs_.end()) {
        completions.push_back({request, 0, peer, remoteError(failed->second)});
      } else if (peers_[peer]->failure) {
        completions.push_back({request, 0, peer, peers_[peer]->failure});
      } else {
        auto inserted = postedCollective_.emplace(key, PostedCollective{request, info.signature});
        PYCOMM_CHECK(inserted.second, InternalError, context(), " duplicate receive for seq ",
                     info.seq, " slot ", info.slot, " from peer ", peer);
      }
    } else {
      auto match = std::find_if(arrivedP2P_.begin(), arrivedP2P_.end(), [&](const Arrived& a) {
        return (anyPeer || a.peer == peer) && a.header.seq == info.seq;
      });
      if (match != arrivedP2P_.end()) {
        deliverLocked(request, match->peer, match->header, match->payload,
                      checkP2P(match->peer, match->header, nbytes), completions);
        releaseLocked(*match);
        arrivedP2P_.erase(match);
      } else if (!anyPeer && peers_[peer]->failure) {
        completions.push_back({request, 0, peer, peers_[peer]->failure});
      } else {
        postedP2P_.push_back({peer, info.seq, request});
        postedForLoop = true;
      }
    }
  }
  // A point-to-point receive may complete with no thread waiting for it (a callback, polling).
  if (postedForLoop) endLinger(peer);
  finish(completions);
  return request;
}

bool TcpTransport::cancel(const std::shared_ptr<Request>& request, Clock::time_point deadline) {
  if (request->done()) return true;
  bool active = false;
  {
    std::lock_guard<std::mutex> lock(matchMutex_);
    for (auto it = postedCollective_.begin(); it != postedCollective_.end(); ++it) {
      if (it->second.request == request) {
        postedCollective_.erase(it);
        return true;
      }
    }
    for (auto it = postedP2P_.begin(); it != postedP2P_.end(); ++it) {
      if (it->request == request) {
        postedP2P_.erase(it);
        return true;
      }
    }
    for (auto& p : peers_) {
      if (p && p->request == request) active = true;
    }
  }
  if (!active && request->direction() == Request::Direction::kSend) {
    Peer& p = *peers_[request->peer()];
    std::lock_guard<std::mutex> lock(p.sendMutex);
    for (auto it = p.sendQueue.begin(); it != p.sendQueue.end(); ++it) {
      if (it->request != request) continue;
      if (it->written == 0) {
        p.sendQueue.erase(it);
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
        waitForLoop(*request, request->peer(), deadline, context());
      } else {
        request->wait(deadline, context());
      }
    } catch (const Error&) {
      // Only whether it is done matters here; the op reports its own error.
    }
  }
  if (request->done()) return true;
  abort(strCat("a request to or from peer ", request->peer(), " could not be cancelled"));
  return false;
}

void TcpTransport::reportFailure(uint64_t seq, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(matchMutex_);
    if (seq > retiredSeq_) failedSeqs_.emplace(seq, message);
  }
  const std::string text = message.size() > kMaxErrorText ? message.substr(0, kMaxErrorText) : message;
  for (auto& peerPtr : peers_) {
    if (!peerPtr) continue;
    Peer& p = *peerPtr;
    std::vector<std::shared_ptr<Request>> done;
    int err = 0;
    {
      std::lock_guard<std::mutex> lock(p.sendMutex);
      if (p.sendClosed) continue;
      FrameInfo info;
      info.channel = Channel::kCollective;
      info.seq = seq;
      OutgoingFrame frame{makeHeader(FrameKind::kError, info, text.size()), nullptr, text.size(), 0,
                          nullptr, std::vector<uint8_t>(text.begin(), text.end())};
      frame.data = frame.owned.data();  // the vector's buffer moves with it
      err = enqueueLocked(p, std::move(frame), done);
    }
    afterFlush(p, done, err);
  }
}

void TcpTransport::beginOp(uint64_t seq, const OpSignature& signature) {
  std::vector<Completion> completions;
  std::string error;
  {
    std::lock_guard<std::mutex> lock(matchMutex_);
    activeOps_[seq] = signature;
    for (auto& [key, arrived] : arrivedCollective_) {
      if (std::get<1>(key) == seq && signatureOf(arrived.header) != signature) {
        failMismatchLocked(arrived.peer, arrived.header, signature, completions);
        error = failedSeqs_[seq];
        break;
      }
    }
  }
  finish(completions);
  if (!error.empty()) throw InvalidUsageError(error);
}

std::string TcpTransport::peerReportedFailure(uint64_t seq) {
  std::lock_guard<std::mutex> lock(matchMutex_);
  auto failed = failedSeqs_.find(seq);
  return failed == failedSeqs_.end() ? std::string() : failed->second;
}

std::string TcpTransport::takeLateFailure() {
  std::lock_guard<std::mutex> lock(matchMutex_);
  std::string taken;
  taken.swap(lateFailure_);
  return taken;
}

void TcpTransport::failMismatchLocked(int peer, const FrameHeader& header, const OpSignature& ours,
                                      std::vector<Completion>& completions) {
  const std::string message =
      strCat(context(), " ", opKindName(ours.kind), " seq=", header.seq, ": mismatched collectives across ranks: rank ",
             rank_, " runs ", ours.describe(), " but rank ", peer, " runs ", signatureOf(header).describe());
  failedSeqs_.emplace(header.seq, message);
  failPostedSeqLocked(header.seq, std::make_exception_ptr(InvalidUsageError(message)), completions);
}

void TcpTransport::retire(uint64_t seq, bool succeeded) {
  std::lock_guard<std::mutex> lock(matchMutex_);
  retiredSeq_ = std::max(retiredSeq_, seq);
  for (auto it = arrivedCollective_.begin(); it != arrivedCollective_.end();) {
    if (std::get<1>(it->first) > retiredSeq_) {
      ++it;
      continue;
    }
    releaseLocked(it->second);
    it = arrivedCollective_.erase(it);
  }
  failedSeqs_.erase(failedSeqs_.begin(), failedSeqs_.upper_bound(retiredSeq_));
  activeOps_.erase(activeOps_.begin(), activeOps_.upper_bound(retiredSeq_));
  if (succeeded) {
    succeeded_.push_back(seq);
    if (succeeded_.size() > 64) succeeded_.pop_front();
  }
}

std::exception_ptr TcpTransport::peerFailure(int peer) {
  std::lock_guard<std::mutex> lock(matchMutex_);
  if (aborted_) return aborted_;
  return peer >= 0 && peer < size_ && peers_[peer] ? peers_[peer]->failure : nullptr;
}

void TcpTransport::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(abortMutex_);
    if (stopped_) return;
    stopped_ = true;
  }
  auto error = remoteError(strCat(context(), " communicator aborted: ", reason));
  stopping_.store(true);
  wakeLoop();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  // The loop has stopped; a thread reading a socket itself stops at its next read (stopping_).
  // Fail whatever waits.
  std::vector<Completion> completions;
  {
    std::lock_guard<std::mutex> lock(matchMutex_);
    aborted_ = error;
    for (auto& entry : postedCollective_) completions.push_back({entry.second.request, 0, -1, error});
    for (auto& entry : postedP2P_) completions.push_back({entry.request, 0, entry.peer, error});
    postedCollective_.clear();
    postedP2P_.clear();
    arrivedCollective_.clear();
    arrivedP2P_.clear();
    for (auto& p : peers_) {
      if (p) p->unexpectedBytes = 0;
    }
  }
  for (auto& p : peers_) {
    if (!p) continue;
    auto recvLock = lockReceiveSide(*p);
    {
      std::lock_guard<std::mutex> lock(matchMutex_);
      if (p->request) completions.push_back({std::move(p->request), 0, p->rank, error});
      p->request.reset();
    }
    std::lock_guard<std::mutex> lock(p->sendMutex);
    p->sendClosed = error;
    for (auto& frame : p->sendQueue) {
      if (frame.request) completions.push_back({frame.request, 0, p->rank, error});
    }
    p->sendQueue.clear();
    closeGracefully(*p);
  }
  finish(completions);
}

void TcpTransport::closeGracefully(Peer& peer) {
  if (!peer.socket.valid()) return;
  // FIN after whatever the kernel still has to send, so the peer reads all of it. Unread bytes on
  // our side would make close() answer with a reset, which can destroy data the peer has not read
  // yet: drain them first.
  ::shutdown(peer.socket.fd(), SHUT_WR);
  size_t size;
  uint8_t* sink = discardBuffer(size);
  for (int i = 0; i < 1024; ++i) {
    ssize_t n = ::recv(peer.socket.fd(), sink, size, MSG_DONTWAIT);
    if (n <= 0) break;
  }
  peer.socket.close();
}

// ---------------------------------------------------------------------------------------------
// Matching

std::string TcpTransport::checkCollective(int peer, const FrameHeader& header,
                                          const PostedCollective& posted,
                                          size_t expectedBytes) const {
  const OpSignature theirs = signatureOf(header);
  const OpSignature& ours = posted.signature;
  const std::string op = strCat(context(), " ", opKindName(ours.kind), " seq=", header.seq);
  if (theirs != ours) {
    return strCat(op, ": mismatched collectives across ranks: rank ", rank_, " runs ",
                  ours.describe(), " but rank ", peer, " runs ", theirs.describe());
  }
  if (header.nbytes != expectedBytes) {
    return strCat(op, ": mismatched sizes across ranks: rank ", rank_, " expects ", expectedBytes,
                  " bytes from rank ", peer, " but rank ", peer, " sent ", header.nbytes, " bytes");
  }
  return {};
}

std::string TcpTransport::checkP2P(int peer, const FrameHeader& header, size_t expectedBytes) const {
  if (header.nbytes == expectedBytes) return {};
  return strCat(context(), " recv from peer ", peer, " (tag ", header.seq, "): rank ", rank_,
                " posted a buffer of ", expectedBytes, " bytes but rank ", peer, " sent ",
                header.nbytes, " bytes");
}

uint64_t TcpTransport::unexpectedCost(const FrameHeader& header) {
  // Bookkeeping counts too, so that a flood of empty frames for far-future ops is bounded as well.
  return header.nbytes + sizeof(Arrived) + 64;
}

void TcpTransport::releaseLocked(const Arrived& arrived) {
  Peer& peer = *peers_[arrived.peer];
  peer.unexpectedBytes -= std::min(peer.unexpectedBytes, unexpectedCost(arrived.header));
}

bool TcpTransport::deliverArrivedLocked(Arrived& arrived, std::vector<Completion>& completions) {
  const FrameHeader& h = arrived.header;
  if (h.channel == static_cast<uint8_t>(Channel::kCollective)) {
    auto posted = postedCollective_.find(CollectiveKey{arrived.peer, h.seq, h.slot});
    if (posted == postedCollective_.end()) return false;
    auto request = posted->second.request;
    std::string why = checkCollective(arrived.peer, h, posted->second, request->capacity());
    postedCollective_.erase(posted);
    deliverLocked(request, arrived.peer, h, arrived.payload, why, completions);
    return true;
  }
  auto posted = std::find_if(postedP2P_.begin(), postedP2P_.end(), [&](const PostedP2P& p) {
    return (p.peer == kAnyPeer || p.peer == arrived.peer) && p.tag == h.seq;
  });
  if (posted == postedP2P_.end()) return false;
  auto request = posted->request;
  postedP2P_.erase(posted);
  deliverLocked(request, arrived.peer, h, arrived.payload, checkP2P(arrived.peer, h, request->capacity()), completions);
  return true;
}

void TcpTransport::deliverLocked(const std::shared_ptr<Request>& request, int peer, const FrameHeader& header,
                                 const std::vector<uint8_t>& payload, const std::string& why,
                                 std::vector<Completion>& completions) {
  if (!why.empty()) {
    completions.push_back({request, 0, peer, std::make_exception_ptr(InvalidUsageError(why))});
    return;
  }
  if (header.nbytes > 0) std::memcpy(request->data(), payload.data(), header.nbytes);
  completions.push_back({request, header.nbytes, peer, nullptr});
}

void TcpTransport::failPostedSeqLocked(uint64_t seq, const std::exception_ptr& error,
                                       std::vector<Completion>& completions) {
  for (auto it = postedCollective_.begin(); it != postedCollective_.end();) {
    if (std::get<1>(it->first) == seq) {
      completions.push_back({it->second.request, 0, std::get<0>(it->first), error});
      it = postedCollective_.erase(it);
    } else {
      ++it;
    }
  }
}

void TcpTransport::finish(std::vector<Completion>& completions) {
  if (deferredCompletions_ != nullptr && deferredCompletions_ != &completions) {
    for (auto& c : completions) deferredCompletions_->push_back(std::move(c));
    completions.clear();
    return;
  }
  // Every request completes even if a callback throws (its requests are no longer posted anywhere,
  // so nothing else would); the first exception goes on afterwards.
  std::exception_ptr thrown;
  for (auto& c : completions) {
    try {
      if (c.error) {
        c.request->fail(c.error);
      } else {
        c.request->complete(c.bytes, c.peer);
      }
    } catch (...) {
      if (!thrown) thrown = std::current_exception();
    }
  }
  completions.clear();
  if (thrown) std::rethrow_exception(thrown);
}

// ---------------------------------------------------------------------------------------------
// The event loop

void TcpTransport::loop() {
  onLoopThread = true;
  loopOwner = this;
  epoll_event events[64];
  while (!stopping_.load()) {
    // While sockets linger out of sight the loop wakes now and then to take back idle ones.
    const bool loopTimed = loopTimed_.load();
    int n = epoll_wait(epoll_.fd(), events, 64,
                       loopTimed ? static_cast<int>(std::max<int64_t>(1, linger_.count())) : -1);
    if (loopTimed) endIdleLingers();
    if (n < 0) {
      if (errno == EINTR) continue;
      logger_.warn(strCat(context(), " event loop stopped: epoll_wait: ", std::strerror(errno)));
      return;
    }
    for (int i = 0; i < n && !stopping_.load(); ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kWakeupTag) {
        uint64_t value;
        (void)!::read(wakeup_.fd(), &value, sizeof value);
        continue;
      }
      if (tag == kListenerTag) {
        acceptStranger();
        continue;
      }
      Peer& peer = *peers_[tag];
      if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        while (handleInput(peer, [&] { return handleReadable(peer); }) && !stopping_.load()) {
        }
      }
      if (events[i].events & EPOLLOUT) handleWritable(peer);
    }
  }
}

void TcpTransport::wait(const std::shared_ptr<Request>& request, Clock::time_point deadline,
                        const std::string& context) {
  if (request->done()) {
    request->wait(deadline, context);  // throws what it failed with
  } else if (request->direction() == Request::Direction::kSend) {
    // A send that waits is one the peer is not draining, perhaps because it is stuck in a send of its
    // own to a rank that waits like this one. A linger here would hold both until it ran out.
    waitForLoop(*request, kAnyPeer, deadline, context);
  } else if (request->peer() != kAnyPeer && request->capacity() <= kCallerReadMaxBytes && !onLoopThread) {
    readOnCallingThread(*peers_[request->peer()], *request, deadline);
    request->wait(deadline, context);
  } else {
    waitForLoop(*request, request->peer(), deadline, context);
  }
}

void TcpTransport::waitForLoop(Request& request, int peer, Clock::time_point deadline, const std::string& context) {
  setLoopReading(peer, true);
  struct Unhold {
    TcpTransport& transport;
    int peer;
    ~Unhold() { transport.setLoopReading(peer, false); }
  } unhold{*this, peer};
  request.wait(deadline, context);
}

void TcpTransport::readOnCallingThread(Peer& peer, Request& request, Clock::time_point deadline) {
  // Requests completed by what this thread reads. They complete, and their callbacks run, only once
  // this thread has stopped reading the socket, so a callback may wait for anything from this peer
  // (a wait for what this thread would not read ends any linger).
  std::vector<Completion> found;
  bool drained = false;  // the last read found the socket empty at a frame boundary
  // Reads what the socket holds up to this request's frame, and then a few short frames that are
  // already there (the next steps of the same op, often): never a long payload past its own frame,
  // which is the loop's, and never an endless stream. False if the loop must take over (rings,
  // stopping, closed).
  auto readNow = [&](int& fd) {
    drained = false;
    return handleInput(
        peer,
        [&] {
          if (peer.readViaRing || stopping_.load() || !peer.socket.valid()) return false;
          fd = peer.socket.fd();
          auto completedHere = [&] {
            return request.done() || std::any_of(deferredCompletions_->begin(), deferredCompletions_->end(),
                                                  [&](const Completion& c) { return c.request.get() == &request; });
          };
          for (int readsPast = 0; !peer.readViaRing && !stopping_.load();) {
            if (completedHere()) {
              const bool longPayloadNext = peer.headerGot == sizeof(FrameHeader) &&
                                           peer.header.nbytes - peer.payloadGot > kCallerReadMaxBytes;
              if (longPayloadNext || ++readsPast > kCallerReadsPastOwnFrame) break;
            }
            if (!readSome(peer)) {
              drained = peer.headerGot == 0;  // nothing half read, which the loop would have to finish
              break;
            }
          }
          return true;
        },
        &found);
  };
  int fd = -1;
  bool reading = readNow(fd);
  finish(found);
  if (reading && request.done()) {
    if (drained) {
      peer.lastCallerRead.store(steadyNanoseconds(), std::memory_order_relaxed);  // a linger goes on
    } else {
      endLinger(peer);  // what this thread left in the socket is the loop's
    }
  }
  // Another thread completing the request (a peer's failure report, an abort) writes to this;
  // made only once a wait is about to sleep, and owned by this wait alone.
  Socket wake;
  // Rounds: take the socket from the loop, read until something completes, hand it back or let it
  // linger, complete.
  while (reading && !request.done()) {
    {
      setCallerReading(peer, true);
      struct Unwatch {
        TcpTransport& transport;
        Peer& peer;
        bool linger;
        ~Unwatch() { transport.setCallerReading(peer, false, linger); }
      } unwatch{*this, peer, false};
      for (int spin = 0;; ++spin) {
        if (!readNow(fd)) {
          reading = false;
          break;
        }
        if (!found.empty() || request.done()) {
          unwatch.linger = drained;
          break;
        }
        if (spin < kCallerReadSpins) {
          std::this_thread::yield();
          continue;
        }
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) {
          reading = false;  // the caller's wait reports the timeout
          break;
        }
        if (!wake.valid()) wake = Socket(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
        // Not set when no fd was to spare, when another thread completed the request meanwhile, or
        // when another thread polls for it too: then Request::wait waits for its completion.
        if (!wake.valid() || !request.setWakeFd(wake.fd())) {
          reading = false;
          break;
        }
        pollfd fds[2] = {{fd, POLLIN, 0}, {wake.fd(), POLLIN, 0}};
        const int n = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
        request.setWakeFd(-1);  // before `wake` can close
        if (n > 0 && (fds[1].revents & POLLIN) != 0) {
          uint64_t count;
          (void)!::read(wake.fd(), &count, sizeof count);
        }
      }
    }
    finish(found);
  }
}

void TcpTransport::acceptStranger() {
  // Only the loop thread comes here, so one log per thread is one per transport. It captures
  // copies: a detached loop thread may exit after the transport is gone.
  thread_local StrangerLog strangers(
      [logger = logger_, context = context()](const std::string& line) { logger.warn(context + line); });
  turnAwayStrangers(listener_, strangers);
}

bool TcpTransport::handleReadable(Peer& peer) {
  std::exception_ptr gone;
  if (peer.readViaRing) gone = drainDoorbells(peer);
  // Frames the peer wrote before it closed are delivered first, as a socket would deliver them.
  // Stop once something completed, so its waiter gets it now (the next chunk of a pipelined op is
  // read while the waiter reduces this one); the caller comes back for the rest.
  bool more = false;
  while (peer.socket.valid() && !stopping_.load() && readSome(peer)) {
    if (!deferredCompletions_->empty()) {
      more = true;
      break;
    }
  }
  if (gone && !more) {
    failPeer(peer, gone);
    return false;
  }
  // A doorbell also says that the peer made space in this rank's ring to it.
  if (peer.readViaRing) handleWritable(peer);
  return more;
}

std::exception_ptr TcpTransport::drainDoorbells(Peer& peer) {
  size_t size;
  uint8_t* sink = discardBuffer(size);
  for (;;) {
    ssize_t n = ::recv(peer.socket.fd(), sink, size, MSG_DONTWAIT);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return nullptr;
    return remoteError(n == 0 ? strCat(context(), " connection to peer ", peer.rank,
                                       " closed (the peer exited, was killed, or destroyed its process group)")
                              : strCat(context(), " connection to peer ", peer.rank, " failed: ",
                                       std::strerror(errno)));
  }
}

void TcpTransport::ringDoorbellLocked(Peer& peer) {
  if (!peer.writeViaRing) {
    peer.doorbellOwed = true;  // frames still go to the socket; a byte there would corrupt them
    return;
  }
  const uint8_t bell = 1;
  // EAGAIN means the peer has a full socket buffer of doorbells unread: it will wake anyway. Any
  // other error ends the connection, which the read side reports.
  (void)!::send(peer.socket.fd(), &bell, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

void TcpTransport::attachRings(int peer, shm::Ring out, shm::Ring in, std::shared_ptr<void> keepalive) {
  Peer& p = *peers_.at(peer);
  std::lock_guard<std::mutex> sendLock(p.sendMutex);
  std::lock_guard<std::mutex> matchLock(matchMutex_);
  p.ringOut = out;
  p.ringIn = in;
  p.ringMemory = std::move(keepalive);
}

void TcpTransport::moveToSharedMemory(int peer) {
  Peer& p = *peers_.at(peer);
  std::vector<std::shared_ptr<Request>> done;
  int err = 0;
  {
    std::lock_guard<std::mutex> lock(p.sendMutex);
    PYCOMM_CHECK(p.ringOut.valid(), InternalError, context(), " no ring attached for peer ", peer);
    if (p.sendClosed) return;
    FrameInfo info;
    info.channel = Channel::kCollective;
    err = enqueueLocked(p, OutgoingFrame{makeHeader(FrameKind::kMoveToSharedMemory, info, 0), nullptr, 0, 0, nullptr, {}},
                        done);
  }
  afterFlush(p, done, err);
}

bool TcpTransport::readSome(Peer& peer) {
  {
    std::lock_guard<std::mutex> lock(matchMutex_);
    if (peer.failure) return false;
  }
  uint8_t* dst;
  size_t want;
  if (peer.headerGot < sizeof(FrameHeader)) {
    dst = reinterpret_cast<uint8_t*>(&peer.header) + peer.headerGot;
    want = sizeof(FrameHeader) - peer.headerGot;
  } else {
    want = peer.header.nbytes - peer.payloadGot;
    switch (peer.target) {
      case ReadTarget::kRequest:
        dst = static_cast<uint8_t*>(peer.request->data()) + peer.payloadGot;
        break;
      case ReadTarget::kBuffer:
      case ReadTarget::kErrorText:
        dst = peer.buffer.data() + peer.payloadGot;
        break;
      default: {
        size_t size;
        dst = discardBuffer(size);
        want = std::min(want, size);
        break;
      }
    }
  }
  ssize_t n;
  if (peer.readViaRing) {
    bool ringProducer = false;
    n = static_cast<ssize_t>(peer.ringIn.read(dst, want, ringProducer));
    if (ringProducer) {
      std::lock_guard<std::mutex> lock(peer.sendMutex);
      ringDoorbellLocked(peer);
    }
    if (n == 0) return false;
  } else {
    n = ::recv(peer.socket.fd(), dst, want, MSG_DONTWAIT);
    if (n > 0) {
      socketBytesReceived_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
      if (!onLoopThread) callerBytesReceived_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    }
  }
  if (n < 0) {
    if (errno == EINTR) return true;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    failPeer(peer, remoteError(strCat(context(), " connection to peer ", peer.rank, " failed: ",
                                      std::strerror(errno))));
    return false;
  }
  if (n == 0) {
    failPeer(peer, remoteError(strCat(context(), " connection to peer ", peer.rank,
                                      " closed (the peer exited, was killed, or destroyed its "
                                      "process group)")));
    return false;
  }
  if (peer.headerGot < sizeof(FrameHeader)) {
    peer.headerGot += static_cast<size_t>(n);
    if (peer.headerGot == sizeof(FrameHeader)) onHeader(peer);
  } else {
    peer.payloadGot += static_cast<size_t>(n);
    if (peer.payloadGot == peer.header.nbytes) onPayload(peer);
  }
  return true;
}

void TcpTransport::onHeader(Peer& peer) {
  const FrameHeader& h = peer.header;
  std::string malformed = validateHeader(h);
  if (logger_.enabled(LogLevel::kTrace)) {
    logger_.log(LogLevel::kTrace, strCat(" recv from peer ", peer.rank, ": ", describeFrame(h)));
  }
  if (malformed.empty() && h.kind == static_cast<uint8_t>(FrameKind::kError) && h.nbytes > kMaxErrorText) {
    malformed = "error report too long";
  }
  if (!malformed.empty()) {
    failPeer(peer, remoteError(strCat(context(), " malformed frame from peer ", peer.rank, ": ",
                                      malformed, "; connection closed")));
    return;
  }
  peer.payloadGot = 0;
  if (h.kind == static_cast<uint8_t>(FrameKind::kMoveToSharedMemory)) {
    bool haveRing;
    {
      std::lock_guard<std::mutex> lock(matchMutex_);
      haveRing = peer.ringIn.valid();
    }
    if (!haveRing || h.nbytes != 0) {
      failPeer(peer, remoteError(strCat(context(), " peer ", peer.rank,
                                        " moved to shared memory, but this rank shares none with it")));
      return;
    }
    peer.headerGot = 0;
    peer.readViaRing = true;
    endLinger(peer);  // doorbells and the peer's leaving arrive on the socket, for the loop
    return;
  }
  std::vector<Completion> completions;
  {
    std::lock_guard<std::mutex> lock(matchMutex_);
    peer.target = ReadTarget::kBuffer;
    if (h.kind == static_cast<uint8_t>(FrameKind::kError)) {
      peer.target = ReadTarget::kErrorText;
    } else if (h.channel == static_cast<uint8_t>(Channel::kCollective)) {
      auto posted = postedCollective_.find(CollectiveKey{peer.rank, h.seq, h.slot});
      auto active = activeOps_.find(h.seq);
      if (h.seq <= retiredSeq_ || failedSeqs_.count(h.seq) != 0) {
        peer.target = ReadTarget::kDiscard;
      } else if (active != activeOps_.end() && signatureOf(h) != active->second) {
        failMismatchLocked(peer.rank, h, active->second, completions);
        peer.target = ReadTarget::kDiscard;
      } else if (posted != postedCollective_.end()) {
        auto request = posted->second.request;
        std::string why = checkCollective(peer.rank, h, posted->second, request->capacity());
        postedCollective_.erase(posted);
        if (why.empty()) {
          peer.target = ReadTarget::kRequest;
          peer.request = std::move(request);
        } else {
          peer.target = ReadTarget::kDiscard;
          completions.push_back({request, 0, peer.rank, std::make_exception_ptr(InvalidUsageError(why))});
        }
      }
    } else {
      auto posted = std::find_if(postedP2P_.begin(), postedP2P_.end(), [&](const PostedP2P& p) {
        return (p.peer == kAnyPeer || p.peer == peer.rank) && p.tag == h.seq;
      });
      if (posted != postedP2P_.end()) {
        auto request = posted->request;
        postedP2P_.erase(posted);
        std::string why = checkP2P(peer.rank, h, request->capacity());
        if (why.empty()) {
          peer.target = ReadTarget::kRequest;
          peer.request = std::move(request);
        } else {
          peer.target = ReadTarget::kDiscard;
          completions.push_back({request, 0, peer.rank, std::make_exception_ptr(InvalidUsageError(why))});
        }
      }
    }
  }
  finish(completions);
  if (peer.target == ReadTarget::kBuffer) {
    // What a peer may make this rank hold for receives not posted yet. Counted from the header on,
    // so a frame announcing more than the budget is refused before a byte of it is allocated.
    std::string refused;
    {
      std::lock_guard<std::mutex> lock(matchMutex_);
      const uint64_t cost = unexpectedCost(h);
      if (cost > unexpectedBudget_ || peer.unexpectedBytes > unexpectedBudget_ - cost) {
        refused = strCat(context(), " peer ", peer.rank, " sent ", describeFrame(h), " that no receive was posted for, ",
                         "with ", peer.unexpectedBytes, " B of such data held already: more than the budget of ",
                         unexpectedBudget_, " B per peer (Options(unexpected_bytes=...), PYCOMM_UNEXPECTED_BYTES); "
                         "connection closed");
      } else {
        peer.unexpectedBytes += cost;
      }
    }
    if (!refused.empty()) {
      failPeer(peer, remoteError(refused));
      return;
    }
  }
  if (peer.target == ReadTarget::kBuffer || peer.target == ReadTarget::kErrorText) {
    try {
      peer.buffer.resize(h.nbytes);
    } catch (const std::bad_alloc&) {
      failPeer(peer, remoteError(strCat(context(), " peer ", peer.rank, " announced a frame of ",
                                        h.nbytes, " bytes that cannot be buffered")));
      return;
    }
  }
  if (h.nbytes == 0) onPayload(peer);
}

void TcpTransport::onPayload(Peer& peer) {
  const FrameHeader h = peer.header;
  const ReadTarget target = peer.target;
  peer.headerGot = 0;
  peer.payloadGot = 0;
  peer.target = ReadTarget::kNone;
  std::vector<Completion> completions;
  std::string refused;
  switch (target) {
    case ReadTarget::kRequest: {
      std::shared_ptr<Request> request;
      {
        std::lock_guard<std::mutex> lock(matchMutex_);
        request = std::move(peer.request);
        peer.request.reset();
      }
      completions.push_back({request, h.nbytes, peer.rank, nullptr});
      break;
    }
    case ReadTarget::kBuffer: {
      Arrived arrived{h, std::move(peer.buffer), peer.rank};
      peer.buffer = {};
      std::lock_guard<std::mutex> lock(matchMutex_);
      const bool collective = h.channel == static_cast<uint8_t>(Channel::kCollective);
      if ((collective && (h.seq <= retiredSeq_ || failedSeqs_.count(h.seq) != 0)) ||
          deliverArrivedLocked(arrived, completions)) {
        releaseLocked(arrived);
        break;
      }
      if (collective) {
        arrivedCollective_.emplace(CollectiveKey{peer.rank, h.seq, h.slot}, std::move(arrived));
      } else {
        arrivedP2P_.push_back(std::move(arrived));
      }
      break;
    }
    case ReadTarget::kErrorText: {
      std::string text(peer.buffer.begin(), peer.buffer.end());
      peer.buffer = {};
      std::lock_guard<std::mutex> lock(matchMutex_);
      if (h.seq <= retiredSeq_) {
        // An op that completed here failed elsewhere (a rank that only sent, say): raise it on this
        // rank's next collective rather than let the ranks drift apart silently.
        if (std::find(succeeded_.begin(), succeeded_.end(), h.seq) != succeeded_.end() && lateFailure_.empty()) {
          lateFailure_ = strCat(context(), " collective seq=", h.seq, " completed on this rank but failed on peer ",
                                peer.rank, ": ", text);
        }
        break;
      }
      const std::string message = strCat(context(), " peer ", peer.rank, " reported a failure: ", text);
      if (failedSeqs_.size() >= kMaxFailedSeqs) {
        // Reports for ops far ahead of this rank, without end: a peer gone wrong, not a failure.
        refused = strCat(context(), " peer ", peer.rank, " reported failures of ", failedSeqs_.size(),
                         " ops this rank has not finished; connection closed");
        break;
      }
      failedSeqs_.emplace(h.seq, message);
      failPostedSeqLocked(h.seq, remoteError(message), completions);
      break;
    }
    default:
      break;
  }
  finish(completions);
  if (!refused.empty()) failPeer(peer, remoteError(refused));
}

void TcpTransport::handleWritable(Peer& peer) {
  std::vector<std::shared_ptr<Request>> done;
  int err;
  {
    std::lock_guard<std::mutex> lock(peer.sendMutex);
    err = flushLocked(peer, done);
    if ((peer.sendQueue.empty() || err != 0 || peer.writeViaRing) && peer.pollingWrite) setPollWrite(peer, false);
  }
  afterFlush(peer, done, err);
}

void TcpTransport::afterFlush(Peer& peer, std::vector<std::shared_ptr<Request>>& done, int err) {
  std::vector<Completion> completions;
  for (auto& r : done) {
    const size_t bytes = r->capacity();
    completions.push_back({std::move(r), bytes, peer.rank, nullptr});
  }
  done.clear();
  finish(completions);  // inside input handling (a ring's space doorbell), after the lock is released
  if (err != 0) {
    failPeer(peer, remoteError(strCat(context(), " sending to peer ", peer.rank, " failed: ", std::strerror(err))));
  }
}

int TcpTransport::enqueueLocked(Peer& peer, OutgoingFrame frame, std::vector<std::shared_ptr<Request>>& done) {
  peer.sendQueue.push_back(std::move(frame));
  // Write from this thread when nothing is queued ahead: it saves waking the loop, which matters
  // for small messages. What the socket does not take now, the loop writes when it can (a full
  // ring needs no EPOLLOUT: the consumer rings when it has made space).
  int err = 0;
  if (peer.sendQueue.size() == 1) err = flushLocked(peer, done);
  if (!peer.sendQueue.empty() && !peer.pollingWrite && !peer.writeViaRing && err == 0) setPollWrite(peer, true);
  return err;
}

int TcpTransport::flushLocked(Peer& peer, std::vector<std::shared_ptr<Request>>& done) {
  auto isMove = [](const OutgoingFrame& frame) {
    return frame.header.kind == static_cast<uint8_t>(FrameKind::kMoveToSharedMemory);
  };
  while (!peer.sendQueue.empty()) {
    iovec iov[kMaxIov];
    size_t count = 0;
    for (auto it = peer.sendQueue.begin(); it != peer.sendQueue.end() && count + 2 <= kMaxIov; ++it) {
      size_t skip = it->written;
      if (skip < sizeof(FrameHeader)) {
        iov[count++] = {reinterpret_cast<uint8_t*>(&it->header) + skip, sizeof(FrameHeader) - skip};
        skip = 0;
      } else {
        skip -= sizeof(FrameHeader);
      }
      if (it->nbytes > skip) iov[count++] = {const_cast<uint8_t*>(it->data) + skip, it->nbytes - skip};
      if (!peer.writeViaRing && isMove(*it)) break;  // the last frame the socket carries
    }
    size_t left;
    if (peer.writeViaRing) {
      bool ringConsumer = false;
      left = peer.ringOut.write(iov, count, ringConsumer);
      if (ringConsumer) ringDoorbellLocked(peer);
      if (left == 0) return 0;  // full: the consumer rings once it has made space
      ringBytesSent_.fetch_add(left, std::memory_order_relaxed);
    } else {
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = count;
      ssize_t n = ::sendmsg(peer.socket.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        return errno;
      }
      left = static_cast<size_t>(n);
      socketBytesSent_.fetch_add(left, std::memory_order_relaxed);
    }
    while (left > 0) {
      OutgoingFrame& front = peer.sendQueue.front();
      const size_t total = sizeof(FrameHeader) + front.nbytes;
      const size_t take = std::min(left, total - front.written);
      front.written += take;
      left -= take;
      if (front.written < total) break;
      if (front.request) done.push_back(std::move(front.request));
      if (isMove(front)) {
        peer.writeViaRing = true;
        if (peer.doorbellOwed) ringDoorbellLocked(peer);
        peer.doorbellOwed = false;
      }
      peer.sendQueue.pop_front();
    }
  }
  return 0;
}

void TcpTransport::setPollWrite(Peer& peer, bool enable) {
  if (watchLocked(peer, enable)) peer.pollingWrite = enable;
}

bool TcpTransport::watchLocked(Peer& peer, bool pollWrite) {
  epoll_event ev{};
  ev.events = (loopWatchesInput(peer) ? static_cast<uint32_t>(EPOLLIN) : 0u) |
              (pollWrite ? static_cast<uint32_t>(EPOLLOUT) : 0u);
  ev.data.u64 = static_cast<uint64_t>(peer.rank);
  return epoll_ctl(epoll_.fd(), EPOLL_CTL_MOD, peer.socket.fd(), &ev) == 0;
}

void TcpTransport::setCallerReading(Peer& peer, bool reading, bool linger) {
  bool loopMustWake = false;
  {
    std::lock_guard<std::mutex> lock(peer.sendMutex);
    const bool watched = loopWatchesInput(peer);
    peer.callerReaders += reading ? 1 : -1;
    if (!reading && peer.callerReaders == 0) {
      // No linger while a receive from this peer is the loop's to read.
      peer.lingering =
          linger && linger_.count() > 0 && peer.loopReaders == 0 && !receivePostedForLoop(peer.rank);
      if (peer.lingering) {
        peer.lastCallerRead.store(steadyNanoseconds(), std::memory_order_relaxed);
        loopMustWake = !loopTimed_.exchange(true);  // a loop asleep for good must start taking lingers back
      }
    }
    // A failed peer is no longer watched at all, and epoll says so; nothing is lost.
    if (watched != loopWatchesInput(peer) && !stopping_.load()) (void)watchLocked(peer, peer.pollingWrite);
  }
  if (loopMustWake) wakeLoop();
}

void TcpTransport::wakeLoop() {
  const uint64_t one = 1;
  (void)!::write(wakeup_.fd(), &one, sizeof one);
}

bool TcpTransport::receivePostedForLoop(int peer) {
  std::lock_guard<std::mutex> lock(matchMutex_);
  if (std::any_of(postedP2P_.begin(), postedP2P_.end(),
                  [&](const PostedP2P& posted) { return posted.peer == peer || posted.peer == kAnyPeer; })) {
    return true;
  }
  // The next chunks of a pipelined op, which the loop receives while the op reduces this one.
  for (auto it = postedCollective_.lower_bound(CollectiveKey{peer, 0, 0});
       it != postedCollective_.end() && std::get<0>(it->first) == peer; ++it) {
    if (it->second.request->capacity() > kCallerReadMaxBytes) return true;
  }
  return false;
}

void TcpTransport::setLoopReading(int peer, bool reading) {
  forPeers(peer, [&](Peer& p) { setLoopReading(p, reading); });
}

void TcpTransport::setLoopReading(Peer& peer, bool reading) {
  std::lock_guard<std::mutex> lock(peer.sendMutex);
  const bool watched = loopWatchesInput(peer);
  peer.loopReaders += reading ? 1 : -1;
  if (reading) peer.lingering = false;
  if (watched != loopWatchesInput(peer) && !stopping_.load()) (void)watchLocked(peer, peer.pollingWrite);
}

void TcpTransport::endLinger(int peer) {
  forPeers(peer, [&](Peer& p) { endLinger(p); });
}

void TcpTransport::endLinger(Peer& peer) {
  std::lock_guard<std::mutex> lock(peer.sendMutex);
  if (!peer.lingering) return;
  peer.lingering = false;
  if (loopWatchesInput(peer) && !stopping_.load()) (void)watchLocked(peer, peer.pollingWrite);
}

void TcpTransport::endIdleLingers() {
  const int64_t now = steadyNanoseconds();
  if (now < nextLingerScan_) return;
  const int64_t linger = std::chrono::nanoseconds(linger_).count();
  nextLingerScan_ = now + linger;
  // Cleared first: a thread that starts a linger after this sees it clear and wakes the loop; one
  // that started before is seen below.
  loopTimed_.store(false);
  bool lingering = false;
  for (auto& p : peers_) {
    if (!p) continue;
    std::lock_guard<std::mutex> lock(p->sendMutex);
    if (!p->lingering) continue;
    if (p->callerReaders > 0 || now - p->lastCallerRead.load(std::memory_order_relaxed) < linger) {
      lingering = true;
      continue;
    }
    p->lingering = false;
    if (!stopping_.load()) (void)watchLocked(*p, p->pollingWrite);
  }
  if (lingering) loopTimed_.store(true);
}

void TcpTransport::failPeer(Peer& peer, std::exception_ptr error) {
  std::vector<Completion> completions;
  auto recvLock = lockReceiveSide(peer);  // peer.request is the receive side's
  {
    std::lock_guard<std::mutex> lock(matchMutex_);
    if (peer.failure) return;
    if (!lateFailure_.empty()) {
      // Say why the peer left, if it told us: its failure is the news, the closed socket the echo.
      try {
        std::rethrow_exception(error);
      } catch (const Error& e) {
        error = remoteError(strCat(e.what(), "; before that: ", lateFailure_));
      }
    }
    peer.failure = error;
    for (auto it = postedCollective_.begin(); it != postedCollective_.end();) {
      if (std::get<0>(it->first) == peer.rank) {
        completions.push_back({it->second.request, 0, peer.rank, error});
        it = postedCollective_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = postedP2P_.begin(); it != postedP2P_.end();) {
      if (it->peer == peer.rank) {
        completions.push_back({it->request, 0, peer.rank, error});
        it = postedP2P_.erase(it);
      } else {
        ++it;
      }
    }
    if (peer.request) completions.push_back({std::move(peer.request), 0, peer.rank, error});
    peer.request.reset();
  }
  if (recvLock.owns_lock()) recvLock.unlock();
  {
    std::lock_guard<std::mutex> lock(peer.sendMutex);
    peer.sendClosed = error;
    for (auto& frame : peer.sendQueue) {
      if (frame.request) completions.push_back({frame.request, 0, peer.rank, error});
    }
    peer.sendQueue.clear();
    // Under sendMutex, which abort holds to close the socket: never a reused fd number.
    if (peer.socket.valid()) {
      epoll_ctl(epoll_.fd(), EPOLL_CTL_DEL, peer.socket.fd(), nullptr);
      ::shutdown(peer.socket.fd(), SHUT_RDWR);
    }
  }
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    // A peer leaving while nothing waits on it is how groups end; say so only when it costs work.
    logger_.log(completions.empty() ? LogLevel::kInfo : LogLevel::kWarn, e.what());
  }
  finish(completions);
}

}  // namespace pycomm::transport::tcp
