#include "socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "../../error.h"

namespace pycomm::transport::tcp {
namespace {

std::string errnoText(int err) { return std::strerror(err); }

int msUntil(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

std::string formatAddress(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = {0};
  uint16_t port = 0;
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
    return strCat("[", host, "]:", port);
  }
  return strCat(host, ":", port);
}

// Parses a numeric address into a sockaddr.
socklen_t makeAddress(const std::string& host, uint16_t port, sockaddr_storage* out) {
  std::memset(out, 0, sizeof *out);
  auto* v4 = reinterpret_cast<sockaddr_in*>(out);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    return sizeof(sockaddr_in);
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(out);
  if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    return sizeof(sockaddr_in6);
  }
  // A host name: resolve it once.
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &result);
  PYCOMM_CHECK(rc == 0 && result != nullptr, InvalidUsageError, "cannot resolve address '", host,
               "': ", gai_strerror(rc));
  std::memcpy(out, result->ai_addr, result->ai_addrlen);
  socklen_t len = result->ai_addrlen;
  freeaddrinfo(result);
  if (out->ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(out)->sin_port = htons(port);
  if (out->ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(out)->sin6_port = htons(port);
  return len;
}

// Waits until `fd` is ready for `events`: false once the deadline passed (or poll failed), with
// `timedOut` in *error.
bool pollUntil(int fd, short events, Deadline deadline, const char* timedOut, std::string* error) {
  for (;;) {
    pollfd pfd{fd, events, 0};
    const int rc = ::poll(&pfd, 1, msUntil(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc > 0) return true;
    if (error != nullptr) *error = timedOut;
    return false;
  }
}

}  // namespace

void Socket::close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void Socket::setNonBlocking() {
  int flags = fcntl(fd_, F_GETFL, 0);
  PYCOMM_CHECK(flags >= 0 && fcntl(fd_, F_SETFL, flags | O_NONBLOCK) == 0, InternalError,
               "fcntl(O_NONBLOCK): ", errnoText(errno));
}

void Socket::setNoDelay() {
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string Socket::peerAddress() const {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  return formatAddress(addr);
}

Socket::Io Socket::trySendAll(const void* data, size_t nbytes, Deadline deadline, std::string* error) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (nbytes > 0) {
    ssize_t n = ::send(fd_, p, nbytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      nbytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      if (error != nullptr) *error = "send failed: " + errnoText(errno);
      return Io::kClosed;
    }
    if (!pollUntil(fd_, POLLOUT, deadline, "timed out sending", error)) return Io::kTimedOut;
  }
  return Io::kDone;
}

Socket::Io Socket::tryRecvAll(void* data, size_t nbytes, Deadline deadline, std::string* error) {
  auto* p = static_cast<uint8_t*>(data);
  while (nbytes > 0) {
    if (!pollUntil(fd_, POLLIN, deadline, "timed out receiving", error)) return Io::kTimedOut;
    ssize_t n = ::recv(fd_, p, nbytes, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      nbytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (error != nullptr) *error = n == 0 ? std::string("connection closed by peer") : "connection failed: " + errnoText(errno);
    return Io::kClosed;
  }
  return Io::kDone;
}

bool Socket::sendNow(const void* data, size_t nbytes) {
  ssize_t n;
  do {
    n = ::send(fd_, data, nbytes, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(nbytes);
}

void Socket::sendAll(const void* data, size_t nbytes, Deadline deadline, const std::string& what) {
  std::string error;
  const Io io = trySendAll(data, nbytes, deadline, &error);
  PYCOMM_CHECK(io != Io::kTimedOut, TimeoutError, what, ": ", error);
  PYCOMM_CHECK(io == Io::kDone, RemoteError, what, ": ", error);
}

void Socket::recvAll(void* data, size_t nbytes, Deadline deadline, const std::string& what) {
  std::string error;
  const Io io = tryRecvAll(data, nbytes, deadline, &error);
  PYCOMM_CHECK(io != Io::kTimedOut, TimeoutError, what, ": ", error);
  PYCOMM_CHECK(io == Io::kDone, RemoteError, what, ": ", error);
}

std::string Endpoint::str() const {
  if (host.find(':') != std::string::npos) return strCat("[", host, "]:", port);
  return strCat(host, ":", port);
}

Endpoint Endpoint::parse(const std::string& text) {
  auto colon = text.rfind(':');
  PYCOMM_CHECK(colon != std::string::npos, InternalError, "bad endpoint '", text, "'");
  Endpoint e;
  e.host = text.substr(0, colon);
  if (e.host.size() >= 2 && e.host.front() == '[') e.host = e.host.substr(1, e.host.size() - 2);
  e.port = static_cast<uint16_t>(std::stoi(text.substr(colon + 1)));
  return e;
}

Socket listenOn(const std::string& host, Endpoint* bound) {
  sockaddr_storage addr;
  socklen_t len = makeAddress(host, 0, &addr);
  Socket s(::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  PYCOMM_CHECK(s.valid(), InternalError, "socket(): ", errnoText(errno));
  int one = 1;
  setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  PYCOMM_CHECK(::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), len) == 0, InvalidUsageError,
               "cannot bind to ", host, ": ", errnoText(errno));
  PYCOMM_CHECK(::listen(s.fd(), 128) == 0, InternalError, "listen(): ", errnoText(errno));
  sockaddr_storage actual{};
  socklen_t actualLen = sizeof actual;
  getsockname(s.fd(), reinterpret_cast<sockaddr*>(&actual), &actualLen);
  bound->host = host;
  bound->port = actual.ss_family == AF_INET
                    ? ntohs(reinterpret_cast<sockaddr_in*>(&actual)->sin_port)
                    : ntohs(reinterpret_cast<sockaddr_in6*>(&actual)->sin6_port);
  return s;
}

namespace {

// Errors after which a later attempt may succeed: the peer is not listening yet, or is shedding
// connections, or the route is briefly missing.
bool worthRetrying(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == EINTR || err == ENETUNREACH || err == EHOSTUNREACH ||
         err == EAGAIN || err == ECONNRESET || err == ECONNABORTED;
}

// One non-blocking connect, waited for until `deadline`: 0 once connected, else the errno
// (ETIMEDOUT when the deadline came first).
int connectOnce(const Socket& s, const sockaddr_storage& addr, socklen_t len, Deadline deadline) {
  if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&addr), len) == 0) return 0;
  if (errno != EINPROGRESS) return errno;
  while (true) {
    pollfd pfd{s.fd(), POLLOUT, 0};
    const int rc = ::poll(&pfd, 1, msUntil(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return errno;
    if (rc == 0) return ETIMEDOUT;
    int err = 0;
    socklen_t errLen = sizeof err;
    if (getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &errLen) != 0) return errno;
    return err;
  }
}

}  // namespace

Socket connectTo(const Endpoint& endpoint, Deadline deadline, const std::string& what) {
  sockaddr_storage addr;
  socklen_t len = makeAddress(endpoint.host, endpoint.port, &addr);
  const auto start = std::chrono::steady_clock::now();
  auto backoff = std::chrono::milliseconds(5);
  int attempts = 0;
  while (true) {
    Socket s(::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    PYCOMM_CHECK(s.valid(), InternalError, what, ": socket(): ", errnoText(errno));
    ++attempts;
    const int err = connectOnce(s, addr, len, deadline);
    if (err == 0) return s;
    const auto now = std::chrono::steady_clock::now();
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count();
    PYCOMM_CHECK(worthRetrying(err), RemoteError, what, ": cannot connect to ", endpoint.str(), ": ",
                 errnoText(err));
    PYCOMM_CHECK(now + backoff < deadline, TimeoutError, what, ": cannot connect to ", endpoint.str(), " within ",
                 waited, " ms (", attempts, attempts == 1 ? " attempt" : " attempts", ", last: ",
                 err == ETIMEDOUT ? std::string("no answer") : errnoText(err), ")");
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

std::string localAddressToward(const std::string& host) {
  sockaddr_storage addr;
  socklen_t len = makeAddress(host, 9, &addr);
  Socket s(::socket(addr.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  PYCOMM_CHECK(s.valid(), InternalError, "socket(): ", errnoText(errno));
  PYCOMM_CHECK(::connect(s.fd(), reinterpret_cast<sockaddr*>(&addr), len) == 0, InvalidUsageError,
               "no route to the rendezvous host ", host, ": ", errnoText(errno));
  sockaddr_storage local{};
  socklen_t localLen = sizeof local;
  getsockname(s.fd(), reinterpret_cast<sockaddr*>(&local), &localLen);
  std::string text = formatAddress(local);
  // Strip the port (and IPv6 brackets).
  text = text.substr(0, text.rfind(':'));
  if (!text.empty() && text.front() == '[') text = text.substr(1, text.size() - 2);
  return text;
}

std::string interfaceAddress(const std::string& ifname) {
  ifaddrs* list = nullptr;
  PYCOMM_CHECK(getifaddrs(&list) == 0, InternalError, "getifaddrs: ", errnoText(errno));
  std::string found, names;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr) continue;
    const int family = it->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (names.find(it->ifa_name) == std::string::npos) names += strCat(names.empty() ? "" : ", ", it->ifa_name);
    if (ifname == it->ifa_name && (found.empty() || family == AF_INET)) {
      char host[INET6_ADDRSTRLEN] = {0};
      const void* src = family == AF_INET
                            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr)
                            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(it->ifa_addr)->sin6_addr);
      inet_ntop(family, src, host, sizeof host);
      if (family == AF_INET || found.empty()) found = host;
    }
  }
  freeifaddrs(list);
  PYCOMM_CHECK(!found.empty(), InvalidUsageError, "socket interface '", ifname,
               "' has no address; interfaces with addresses: ", names);
  return found;
}

}  // namespace pycomm::transport::tcp
