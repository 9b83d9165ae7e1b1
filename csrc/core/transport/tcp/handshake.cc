#include "handshake.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "../../error.h"

namespace pycomm::transport::tcp {
namespace {

constexpr char kTokenKey[] = "pycomm/token";
std::string addressKey(int rank) { return strCat("pycomm/addr/", rank); }

// A connection accepted but not yet authenticated.
struct PendingConnection {
  Socket socket;
  HelloAcceptor hello;
  std::string from;
};

std::string rankText(int rank, int size) { return strCat("[rank ", rank, "/", size, "]"); }

// Connects to the lower rank `peer` and proves membership both ways. A connection the peer closes
// before answering (it sheds connections while strangers flood it) is tried again until the
// deadline; an answer that fails verification is an error at once, never retried.
Socket connectToPeer(int rank, int size, int peer, const Endpoint& endpoint, const Token& token,
                     Deadline deadline) {
  const std::string what = strCat(rankText(rank, size), " connecting to peer ", peer, " at ", endpoint.str());
  auto backoff = std::chrono::milliseconds(10);
  int attempts = 0;
  while (true) {
    Socket socket = connectTo(endpoint, deadline, what);
    ++attempts;
    std::string error;
    Challenge challenge{};
    auto io = socket.tryRecvAll(&challenge, sizeof challenge, deadline, &error);
    if (io == Socket::Io::kDone) {
      const std::string why = checkChallenge(challenge);
      PYCOMM_CHECK(why.empty(), RemoteError, what, ": the listener is not a pycomm rank speaking handshake version ",
                   kHelloVersion, ": ", why);
      const Hello hello = makeHello(token, challenge.nonce, makeNonce(), rank, peer);
      io = socket.trySendAll(&hello, sizeof hello, deadline, &error);
      if (io == Socket::Io::kDone) {
        Welcome welcome{};
        io = socket.tryRecvAll(&welcome, sizeof welcome, deadline, &error);
        if (io == Socket::Io::kDone) {
          const std::string bad = checkWelcome(welcome, token, challenge.nonce, hello);
          PYCOMM_CHECK(bad.empty(), RemoteError, what, ": the listener did not prove it belongs to this group: ", bad);
          return socket;
        }
      }
    }
    PYCOMM_CHECK(io == Socket::Io::kClosed, TimeoutError, what, ": handshake ", error, " (attempt ", attempts, ")");
    PYCOMM_CHECK(std::chrono::steady_clock::now() + backoff < deadline, TimeoutError, what, ": the peer closed ",
                 attempts, attempts == 1 ? " connection" : " connections", " during the handshake (last: ", error, ")");
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

}  // namespace

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
    const Endpoint endpoint = Endpoint::parse(std::string(text.begin(), text.end()));
    group.peers[peer] = connectToPeer(rank, size, peer, endpoint, token, deadline);
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
        PendingConnection conn{Socket(fd), HelloAcceptor(token, makeNonce(), rank, size), {}};
        conn.from = conn.socket.peerAddress();
        const Challenge& challenge = conn.hello.challenge();
        if (conn.socket.sendNow(&challenge, sizeof challenge)) {
          pending.push_back(std::move(conn));
        } else {
          logger.warn(strCat(" dropped connection from ", conn.from, ": closed before completing the handshake"));
        }
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      auto& conn = pending[i - 1];
      uint8_t buffer[sizeof(Hello)];
      const ssize_t n = ::recv(conn.socket.fd(), buffer, conn.hello.wanted(), MSG_DONTWAIT);
      std::string why;
      if (n > 0) conn.hello.feed(buffer, static_cast<size_t>(n));
      // A reset is how a stranger that leaves without reading our challenge usually closes.
      if (n == 0 || (n < 0 && errno == ECONNRESET)) why = "closed before completing the handshake";
      if (n < 0 && errno != ECONNRESET && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        why = std::strerror(errno);
      }
      if (conn.hello.state() == HelloAcceptor::State::kRejected) why = conn.hello.reason();
      if (why.empty() && conn.hello.state() == HelloAcceptor::State::kAccepted) {
        const int peer = conn.hello.peer();
        // Never replace a peer: a second connection naming a connected rank is an intruder or a
        // confused rank, and the first one is the group's.
        const Welcome welcome = conn.hello.welcome();
        if (group.peers[peer].valid()) {
          why = "rank already connected";
        } else if (!conn.socket.sendNow(&welcome, sizeof welcome)) {
          why = strCat("closed before rank ", peer, "'s handshake could be answered");
        } else {
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
