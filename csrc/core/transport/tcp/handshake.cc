#include "handshake.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "../../error.h"
#include "listener.h"

namespace pycomm::transport::tcp {
namespace {

constexpr char kTokenKey[] = "pycomm/token";
std::string addressKey(int rank) { return strCat("pycomm/addr/", rank); }

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
                          std::chrono::milliseconds timeout, const Logger& logger,
                          const std::optional<Token>& inherited) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  GroupSockets group;
  group.peers.resize(size);
  reserveSpareDescriptor();  // now, while descriptors are to be had (see turnAwayStrangers)
  Endpoint self;
  group.listener = listenOn(bindHost, &self);
  group.listener.setNonBlocking();
  const std::string selfText = self.str();
  store.set(addressKey(rank), std::vector<uint8_t>(selfText.begin(), selfText.end()));

  Token& token = group.token;
  const bool readToken = !inherited && rank != 0;
  if (inherited) {
    token = *inherited;
  } else if (rank == 0) {
    token = makeToken();
    store.set(kTokenKey, std::vector<uint8_t>(token.begin(), token.end()));
  }
  // The token and every lower rank's address, read at once (every rank publishes its address
  // before it waits for anything).
  std::vector<std::string> keys;
  if (readToken) keys.push_back(kTokenKey);
  for (int peer = 0; peer < rank; ++peer) keys.push_back(addressKey(peer));
  const auto values = store.getAll(keys, timeout);
  if (readToken) {
    const auto& bytes = values[0];
    PYCOMM_CHECK(bytes.size() == token.size(), InternalError, "group token has ", bytes.size(), " bytes");
    std::memcpy(token.data(), bytes.data(), token.size());
  }

  // Connect to every lower rank. A lower rank answers only once it has finished its own connects,
  // which by induction always happens: rank 0 answers at once.
  for (int peer = 0; peer < rank; ++peer) {
    const auto& text = values[(readToken ? 1 : 0) + peer];
    const Endpoint endpoint = Endpoint::parse(std::string(text.begin(), text.end()));
    group.peers[peer] = connectToPeer(rank, size, peer, endpoint, token, deadline);
  }

  // Accept every higher rank, authenticating each connection; strangers are dropped.
  StrangerLog log([&logger](const std::string& line) { logger.warn(line); });
  acceptPeers(group.listener, token, rank, size, group.peers, deadline, timeout, log);
  for (auto& socket : group.peers) {
    if (!socket.valid()) continue;
    socket.setNonBlocking();
    socket.setNoDelay();
  }
  return group;
}

}  // namespace pycomm::transport::tcp
