// RAII sockets and the blocking helpers used while a group connects. After setup every socket is
// non-blocking and driven by the transport's event loop.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace pycomm::transport::tcp {

using Deadline = std::chrono::steady_clock::time_point;

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept {
    if (this != &other) {
      close();
      fd_ = other.release();
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void close();

  void setNonBlocking();
  void setNoDelay();
  // The remote "host:port", for messages.
  std::string peerAddress() const;

  // Blocking helpers with a deadline (poll based), for the handshake. They throw RemoteError
  // (closed, reset) or TimeoutError, with `what` in front of the reason.
  void sendAll(const void* data, size_t nbytes, Deadline deadline, const std::string& what);
  void recvAll(void* data, size_t nbytes, Deadline deadline, const std::string& what);

  // The same, with a lost connection and the deadline as results rather than errors: a connecting
  // rank retries a connection its peer dropped (the peer may be shedding strangers). `error`, if
  // given, gets the reason.
  // Sends all of a small message now or returns false, never waiting: for a fresh connection's
  // first bytes, which always fit its empty send buffer unless the connection is already gone.
  bool sendNow(const void* data, size_t nbytes);

  enum class Io { kDone, kClosed, kTimedOut };
  Io trySendAll(const void* data, size_t nbytes, Deadline deadline, std::string* error);
  Io tryRecvAll(void* data, size_t nbytes, Deadline deadline, std::string* error);

 private:
  int fd_ = -1;
};

struct Endpoint {
  std::string host;
  uint16_t port = 0;
  std::string str() const;
  static Endpoint parse(const std::string& text);
};

// Listens on `host` (an address, not a name), port chosen by the kernel.
Socket listenOn(const std::string& host, Endpoint* bound);
// Connects, retrying refused and unreachable until `deadline`, and never waiting past it: a
// blocking connect() whose SYNs are dropped would wait ~2 minutes whatever the deadline. Throws
// TimeoutError (RemoteError for an error no retry can mend) with `what` in front.
// The socket returned is non-blocking.
Socket connectTo(const Endpoint& endpoint, Deadline deadline, const std::string& what);

// The local address the kernel would use to reach `host` (no packet is sent).
std::string localAddressToward(const std::string& host);
// The IPv4 (or IPv6) address of the named interface.
std::string interfaceAddress(const std::string& ifname);

}  // namespace pycomm::transport::tcp
