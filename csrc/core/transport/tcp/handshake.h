// How a group's ranks find and authenticate each other.
//
// Each rank listens on one address and publishes it in the store; rank 0 publishes a random token.
// Every rank connects to each lower rank and proves, by the exchange hello.h describes, that it
// knows the token without sending it; the lower rank proves the same back. A connection that does
// anything else (a stranger, garbage, a wrong or replayed answer, nothing at all) is closed with a
// warning and never becomes a peer.
#pragma once

#include <chrono>
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
};

// Rendezvous through `store` and connect every pair. Throws TimeoutError naming the missing ranks.
GroupSockets connectGroup(int rank, int size, const std::string& bindHost, Store& store,
                          std::chrono::milliseconds timeout, const Logger& logger);

}  // namespace pycomm::transport::tcp
