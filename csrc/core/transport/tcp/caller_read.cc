// The caller-read path: a thread waiting for a short message from one peer reads that peer's socket
// itself instead of sleeping until the loop has read it, which saves a wake-up of the loop thread
// and of the waiter per message; and once it has drained the socket, the loop leaves the socket
// alone for a while (the linger), so the next op's messages are read the same way. Who reads a
// socket when, and what ends a linger, is ReadOwnership's (read_ownership.h); this file drives it.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "tcp_transport.h"

namespace pycomm::transport::tcp {
namespace {

// Yields, each followed by a look at the socket, before a waiting caller sleeps in poll(): a short
// message is often a few microseconds away, and the yield lets a rank sharing this core send it.
constexpr int kCallerReadSpins = 200;
// Reads (a header or a piece of a payload each) a waiter goes on with once its own frame is in.
constexpr int kCallerReadsPastOwnFrame = 16;

int64_t steadyNanoseconds() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

}  // namespace

void TcpTransport::wait(const std::shared_ptr<Request>& request, Clock::time_point deadline,
                        const std::string& context) {
  if (request->done()) {
    request->wait(deadline, context);  // throws what it failed with
  } else if (request->direction() == Request::Direction::kSend) {
    // A send that waits is one the peer is not draining, perhaps because it is stuck in a send of its
    // own to a rank that waits like this one. A linger here would hold both until it ran out.
    waitForLoop(*request, kAnyPeer, deadline, context);
  } else if (request->peer() != kAnyPeer && request->capacity() <= kCallerReadMaxBytes &&
             !EventLoop::onAnyLoopThread()) {
    readOnCallingThread(*connections_[request->peer()], *request, deadline);
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

void TcpTransport::readOnCallingThread(Connection& peer, Request& request, Clock::time_point deadline) {
  // Requests completed by what this thread reads. They complete, and their callbacks run, only once
  // this thread has stopped reading the socket, so a callback may wait for anything from this peer
  // (a wait for what this thread would not read ends any linger).
  Completions found;
  bool drained = false;  // the last read found the socket empty at a frame boundary
  // Reads what the socket holds up to this request's frame, and then a few short frames that are
  // already there (the next steps of the same op, often), no more than kCallerReadMaxBytes of
  // payload in all: never a long payload past its own frame, which is the loop's, and never an
  // endless stream, which would hold back what it completes. False if the loop must take over
  // (rings, stopping, closed).
  auto readNow = [&](int& fd) {
    drained = false;
    return handleInput(
        peer,
        [&] {
          if (peer.readViaRing || loop_.stopping() || !peer.socket.valid()) return false;
          fd = peer.socket.fd();
          auto completedHere = [&] {
            const Completions& deferred = *InputScope::deferred();
            return request.done() || std::any_of(deferred.begin(), deferred.end(),
                                                 [&](const Completion& c) { return c.request.get() == &request; });
          };
          size_t bytesPast = 0;  // payload bytes of the frames past its own it has started
          for (int readsPast = 0; !peer.readViaRing && !loop_.stopping();) {
            if (completedHere()) {
              const bool headerIn = peer.headerGot == sizeof(FrameHeader);
              const size_t payloadLeft = headerIn ? peer.header.nbytes - peer.payloadGot : 0;
              if (headerIn && peer.payloadGot == 0) bytesPast += payloadLeft;  // a payload starts
              if (payloadLeft > kCallerReadMaxBytes || bytesPast > kCallerReadMaxBytes ||
                  ++readsPast > kCallerReadsPastOwnFrame) {
                break;
              }
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
      peer.ownership.noteCallerRead(steadyNanoseconds());  // a linger goes on
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
        Connection& peer;
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

void TcpTransport::setCallerReading(Connection& connection, bool reading, bool linger) {
  bool loopMustWake = false;
  connection.changeOwnership([&](ReadOwnership& ownership) {
    if (reading) {
      ownership.callerEnters();
      return;
    }
    // No linger while a receive from this peer is the loop's to read.
    const bool lingering = ownership.callerLeaves(linger, linger_.count() > 0, [&] {
      return matcher_.receivePostedForLoop(connection.rank, kCallerReadMaxBytes);
    });
    if (lingering) {
      ownership.noteCallerRead(steadyNanoseconds());
      loopMustWake = loop_.startTicking();  // a loop asleep for good must start taking lingers back
    }
  });
  if (loopMustWake) loop_.wake();
}

void TcpTransport::setLoopReading(int peer, bool reading) {
  forPeers(peer, [&](Connection& c) {
    c.changeOwnership([&](ReadOwnership& ownership) {
      if (reading) {
        ownership.loopWaitStarts();
      } else {
        ownership.loopWaitEnds();
      }
    });
  });
}

void TcpTransport::endLinger(int peer) {
  forPeers(peer, [&](Connection& c) { endLinger(c); });
}

void TcpTransport::endLinger(Connection& connection) {
  connection.changeOwnership([](ReadOwnership& ownership) { ownership.endLinger(); });
}

void TcpTransport::endIdleLingers() {
  const int64_t now = steadyNanoseconds();
  if (now < nextLingerScan_) return;
  const int64_t linger = std::chrono::nanoseconds(linger_).count();
  nextLingerScan_ = now + linger;
  // Cleared first: a thread that starts a linger after this sees it clear and wakes the loop; one
  // that started before is seen below.
  loop_.stopTicking();
  bool lingering = false;
  for (auto& c : connections_) {
    if (!c) continue;
    std::lock_guard<std::mutex> lock(c->watchMutex);
    switch (c->ownership.expire(now, linger)) {
      case ReadOwnership::Expiry::kNone:
        break;
      case ReadOwnership::Expiry::kKept:
        lingering = true;
        break;
      case ReadOwnership::Expiry::kEnded:
        if (!loop_.stopping()) (void)c->watchLocked(c->pollingWrite);
        break;
    }
  }
  if (lingering) loop_.startTicking();
}

}  // namespace pycomm::transport::tcp
