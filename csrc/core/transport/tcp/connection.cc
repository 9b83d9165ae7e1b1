#include "connection.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "../../error.h"

namespace pycomm::transport::tcp {
namespace {

constexpr size_t kMaxIov = 32;

bool isMove(const OutgoingFrame& frame) {
  return frame.header.kind == static_cast<uint8_t>(FrameKind::kMoveToSharedMemory);
}

}  // namespace

uint8_t* discardBuffer(size_t& size) {
  thread_local std::vector<uint8_t> buffer(256 * 1024);
  size = buffer.size();
  return buffer.data();
}

std::exception_ptr remoteError(const std::string& message) { return std::make_exception_ptr(RemoteError(message)); }

std::exception_ptr connectionClosed(const std::string& context, int peer) {
  return std::make_exception_ptr(RemoteError(strCat(
      context, " connection to peer ", peer, " closed (the peer exited, was killed, or destroyed its process group)")));
}

std::exception_ptr connectionFailed(const std::string& context, int peer, int err) {
  return std::make_exception_ptr(
      RemoteError(strCat(context, " connection to peer ", peer, " failed: ", std::strerror(err))));
}

// ---------------------------------------------------------------------------------------------
// Sending

int Connection::enqueueLocked(OutgoingFrame frame, std::vector<std::shared_ptr<Request>>& done) {
  sendQueue.push_back(std::move(frame));
  // Write from this thread when nothing is queued ahead: it saves waking the loop, which matters
  // for small messages. What the socket does not take now, the loop writes when it can (a full
  // ring needs no EPOLLOUT: the consumer rings when it has made space).
  int err = 0;
  if (sendQueue.size() == 1) err = flushLocked(done);
  if (!sendQueue.empty() && !pollingWrite && !writeViaRing && err == 0) setPollWrite(true);
  return err;
}

int Connection::flushLocked(std::vector<std::shared_ptr<Request>>& done) {
  while (!sendQueue.empty()) {
    iovec iov[kMaxIov];
    size_t count = 0;
    for (auto it = sendQueue.begin(); it != sendQueue.end() && count + 2 <= kMaxIov; ++it) {
      size_t skip = it->written;
      if (skip < sizeof(FrameHeader)) {
        iov[count++] = {reinterpret_cast<uint8_t*>(&it->header) + skip, sizeof(FrameHeader) - skip};
        skip = 0;
      } else {
        skip -= sizeof(FrameHeader);
      }
      if (it->nbytes > skip) iov[count++] = {const_cast<uint8_t*>(it->data) + skip, it->nbytes - skip};
      if (!writeViaRing && isMove(*it)) break;  // the last frame the socket carries
    }
    size_t left;
    if (writeViaRing) {
      size_t wanted = 0;
      for (size_t i = 0; i < count; ++i) wanted += iov[i].iov_len;
      if (std::string failed = ringOut.reserveFor(wanted); !failed.empty()) {
        ringFailure = std::move(failed);
        return ENOSPC;  // the connection fails as on a socket error, with ringFailure's words
      }
      bool ringConsumer = false;
      left = ringOut.write(iov, count, ringConsumer);
      if (ringConsumer) ringDoorbellLocked();
      if (left == 0) return 0;  // full: the consumer rings once it has made space
      counters.ringBytesSent.fetch_add(left, std::memory_order_relaxed);
    } else {
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = count;
      ssize_t n = ::sendmsg(socket.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        return errno;
      }
      left = static_cast<size_t>(n);
      counters.socketBytesSent.fetch_add(left, std::memory_order_relaxed);
    }
    while (left > 0) {
      OutgoingFrame& front = sendQueue.front();
      const size_t total = sizeof(FrameHeader) + front.nbytes;
      const size_t take = std::min(left, total - front.written);
      front.written += take;
      left -= take;
      if (front.written < total) break;
      if (front.request) done.push_back(std::move(front.request));
      if (isMove(front)) {
        writeViaRing = true;
        if (doorbellOwed) ringDoorbellLocked();
        doorbellOwed = false;
      }
      sendQueue.pop_front();
    }
  }
  return 0;
}

void Connection::ringDoorbellLocked() {
  if (!writeViaRing) {
    doorbellOwed = true;  // frames still go to the socket; a byte there would corrupt them
    return;
  }
  const uint8_t bell = 1;
  // EAGAIN means the peer has a full socket buffer of doorbells unread: it will wake anyway. Any
  // other error ends the connection, which the read side reports.
  (void)!::send(socket.fd(), &bell, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

// ---------------------------------------------------------------------------------------------
// Watching

bool Connection::watchLocked(bool pollWrite) {
  const uint32_t events = (ownership.loopWatches() ? static_cast<uint32_t>(EPOLLIN) : 0u) |
                          (pollWrite ? static_cast<uint32_t>(EPOLLOUT) : 0u);
  return loop.modify(socket.fd(), static_cast<uint64_t>(rank), events);
}

void Connection::setPollWrite(bool enable) {
  std::lock_guard<std::mutex> lock(watchMutex);
  if (pollingWrite != enable && watchLocked(enable)) pollingWrite = enable;
}

// ---------------------------------------------------------------------------------------------
// Receiving

Connection::Read Connection::readSome(const std::string& context, std::exception_ptr* error) {
  uint8_t* dst;
  size_t want;
  if (headerGot < sizeof(FrameHeader)) {
    dst = reinterpret_cast<uint8_t*>(&header) + headerGot;
    want = sizeof(FrameHeader) - headerGot;
  } else {
    want = header.nbytes - payloadGot;
    switch (target) {
      case ReadTarget::kRequest:
        dst = static_cast<uint8_t*>(request->data()) + payloadGot;
        break;
      case ReadTarget::kBuffer:
      case ReadTarget::kErrorText:
        dst = buffer.data() + payloadGot;
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
  if (readViaRing) {
    bool ringProducer = false;
    n = static_cast<ssize_t>(ringIn.read(dst, want, ringProducer));
    if (ringProducer) {
      std::lock_guard<std::mutex> lock(sendMutex);
      ringDoorbellLocked();
    }
    if (n == 0) return Read::kBlocked;
  } else {
    n = ::recv(socket.fd(), dst, want, MSG_DONTWAIT);
    if (n > 0) {
      counters.socketBytesReceived.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
      if (!EventLoop::onAnyLoopThread()) {
        counters.callerBytesReceived.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
      }
    }
  }
  if (n < 0) {
    if (errno == EINTR) return Read::kProgress;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Read::kBlocked;
    *error = connectionFailed(context, rank, errno);
    return Read::kFailed;
  }
  if (n == 0) {
    *error = connectionClosed(context, rank);
    return Read::kFailed;
  }
  if (headerGot < sizeof(FrameHeader)) {
    headerGot += static_cast<size_t>(n);
    return headerGot == sizeof(FrameHeader) ? Read::kHeader : Read::kProgress;
  }
  payloadGot += static_cast<size_t>(n);
  return payloadGot == header.nbytes ? Read::kPayload : Read::kProgress;
}

std::exception_ptr Connection::drainDoorbells(const std::string& context) {
  size_t size;
  uint8_t* sink = discardBuffer(size);
  for (;;) {
    ssize_t n = ::recv(socket.fd(), sink, size, MSG_DONTWAIT);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return nullptr;
    return n == 0 ? connectionClosed(context, rank) : connectionFailed(context, rank, errno);
  }
}

void Connection::closeGracefully() {
  if (!socket.valid()) return;
  // FIN after whatever the kernel still has to send, so the peer reads all of it. Unread bytes on
  // our side would make close() answer with a reset, which can destroy data the peer has not read
  // yet: drain them first.
  ::shutdown(socket.fd(), SHUT_WR);
  size_t size;
  uint8_t* sink = discardBuffer(size);
  for (int i = 0; i < 1024; ++i) {
    ssize_t n = ::recv(socket.fd(), sink, size, MSG_DONTWAIT);
    if (n <= 0) break;
  }
  socket.close();
}

}  // namespace pycomm::transport::tcp
