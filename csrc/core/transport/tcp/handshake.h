// How a group's ranks find and authenticate each other.
//
// Each rank listens on one address and publishes it in the store; rank 0 publishes a random token.
// Every rank connects to each lower rank and proves, by the exchange hello.h describes, that it
// knows the token without sending it; the lower rank proves the same back. A connection that does
// anything else (a stranger, garbage, a wrong or replayed answer, nothing at all) is closed with a
// warning and never becomes a peer.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "../../logging.h"
#include "../../store.h"
#include "hello.h"
#include "listener.h"  // the listener outlives setup: turnAwayStrangers takes over from acceptPeers
#include "socket.h"

namespace pycomm::transport::tcp {

struct GroupSockets {
  Socket listener;                 // kept open to turn strangers away after setup
  std::vector<Socket> peers;       // peers[rank] is invalid for our own rank
  Token token{};                   // the secret the connections proved
};

// Rendezvous through `store` and connect every pair. Throws TimeoutError naming the missing ranks.
// The group's secret is `inherited` when given (every rank derived the same one from the group it
// was formed from, config.h: Lineage); otherwise rank 0 draws one and publishes it in the store.
GroupSockets connectGroup(int rank, int size, const std::string& bindHost, Store& store,
                          std::chrono::milliseconds timeout, const Logger& logger,
                          const std::optional<Token>& inherited = std::nullopt);

}  // namespace pycomm::transport::tcp
