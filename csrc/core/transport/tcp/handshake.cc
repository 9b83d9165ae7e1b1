#include "handshake.h"

#include <poll.h>
#include <algorithm>
#include <sys/socket.h>

#include <cstring>
#include <random>

#include "../../error.h"

namespace pycomm::transport::tcp {
namespace {

constexpr char kTokenKey[] = "pycomm/token";
std::string addressKey(int rank) { return strCat("pycomm/addr/", rank); }

bool tokensEqual(const Token& a, const Token& b) {
  uint8_t diff = 0;  // constant time: no early exit that leaks how much of a guess was right
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

// A connection accepted but not yet authenticated.
struct PendingConnection {
  Socket socket;
  Hello hello{};
  size_t received = 0;
  std::string from;
};

}  // namespace

std::string checkHello(const Hello& hello, const Token& token, int self, int size) {
  if (hello.magic != kHelloMagic) return "not a pycomm handshake";
  if (hello.version != kHelloVersion) return strCat("handshake version ", hello.version);
  if (!tokensEqual(hello.token, token)) return "wrong group token";
  if (hello.toRank != self) return strCat("addressed to rank ", hello.toRank);
  if (hello.fromRank <= self || hello.fromRank >= size) {
    return strCat("claims to be rank ", hello.fromRank, ", not a higher rank of this group");
  }
  return {};
}

Token makeToken() {
  Token token;
  std::random_device device;  // reads the kernel's entropy source
  for (auto& byte : token) byte = static_cast<uint8_t>(device());
  return token;
}

GroupSockets connectGroup(int rank, int size, const std::string& bindHost, Store& store,
                          std::chrono::milliseconds timeout, const Logger& logger) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  GroupSockets group;
  group.peers.resize(size);
  Endpoint self;
  group.listener = listenOn(bindHost, &self);
  group.listener.setNonBlocking();
  const std::string selfText = self.str();
  store.set(addressKey(rank), std::vector<uint8_t>(selfText.begin(), selfText.end()));

  Token token{};
  if (rank == 0) {
    token = makeToken();
    store.set(kTokenKey, std::vector<uint8_t>(token.begin(), token.end()));
  } else {
    auto bytes = store.get(kTokenKey, timeout);
    PYCOMM_CHECK(bytes.size() == token.size(), InternalError, "group token has ", bytes.size(), " bytes");
    std::memcpy(token.data(), bytes.data(), token.size());
  }

  // Connect to every lower rank. A lower rank answers only once it has finished its own connects,
  // which by induction always happens: rank 0 answers at once.
  for (int peer = 0; peer < rank; ++peer) {
    auto text = store.get(addressKey(peer), timeout);
    Endpoint endpoint = Endpoint::parse(std::string(text.begin(), text.end()));
    const std::string what = strCat("[rank ", rank, "/", size, "] connecting to peer ", peer, " at ",
                                    endpoint.str());
    Socket socket = connectTo(endpoint, deadline, what);
    Hello hello{kHelloMagic, kHelloVersion, token, rank, peer};
    socket.sendAll(&hello, sizeof hello, deadline, what);
    int32_t ack = -1;
    socket.recvAll(&ack, sizeof ack, deadline, what);
    PYCOMM_CHECK(ack == peer, RemoteError, what, ": unexpected handshake answer ", ack);
    group.peers[peer] = std::move(socket);
  }

  // Accept every higher rank, authenticating each connection; strangers are dropped.
  int missing = size - 1 - rank;
  std::vector<PendingConnection> pending;
  while (missing > 0) {
    std::vector<pollfd> fds;
    fds.push_back({group.listener.fd(), POLLIN, 0});
    for (auto& p : pending) fds.push_back({p.socket.fd(), POLLIN, 0});
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      std::string ranks;
      for (int r = rank + 1; r < size; ++r) {
        if (!group.peers[r].valid()) ranks += strCat(ranks.empty() ? "" : ", ", r);
      }
      throw TimeoutError(strCat("[rank ", rank, "/", size, "] timed out after ", timeout.count(),
                                " ms waiting for peers ", ranks, " to connect"));
    }
    ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (fds[0].revents & POLLIN) {
      int fd = ::accept4(group.listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        PendingConnection conn;
        conn.socket = Socket(fd);
        conn.from = conn.socket.peerAddress();
        pending.push_back(std::move(conn));
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      auto& conn = pending[i - 1];
      auto* dst = reinterpret_cast<uint8_t*>(&conn.hello) + conn.received;
      ssize_t n = ::recv(conn.socket.fd(), dst, sizeof(Hello) - conn.received, MSG_DONTWAIT);
      if (n > 0) conn.received += static_cast<size_t>(n);
      std::string why;
      if (n == 0) why = "closed before completing the handshake";
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) why = std::strerror(errno);
      if (why.empty() && conn.received == sizeof(Hello)) {
        why = checkHello(conn.hello, token, rank, size);
        if (why.empty() && group.peers[conn.hello.fromRank].valid()) why = "rank already connected";
        if (why.empty()) {
          const int peer = conn.hello.fromRank;
          int32_t ack = rank;
          conn.socket.sendAll(&ack, sizeof ack, deadline,
                              strCat("[rank ", rank, "/", size, "] answering peer ", peer));
          group.peers[peer] = std::move(conn.socket);
          --missing;
        }
      }
      if (!why.empty()) {
        logger.warn(strCat(" dropped connection from ", conn.from, ": ", why));
        conn.socket.close();
      }
    }
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [](const PendingConnection& c) { return !c.socket.valid(); }),
                  pending.end());
  }
  for (auto& conn : pending) {
    logger.warn(strCat(" dropped connection from ", conn.from, ": no handshake before the group was complete"));
  }
  for (auto& socket : group.peers) {
    if (!socket.valid()) continue;
    socket.setNonBlocking();
    socket.setNoDelay();
  }
  return group;
}

}  // namespace pycomm::transport::tcp
