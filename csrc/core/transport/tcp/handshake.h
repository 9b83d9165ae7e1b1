// How a group's ranks find and authenticate each other.
//
// Each rank listens on one address and publishes it in the store; rank 0 publishes a random token.
// Every rank connects to each lower rank and presents a Hello carrying the token and both ranks; the
// lower rank checks it and answers. A connection that presents anything else (a stranger, garbage, a
// wrong token, nothing at all) is closed with a warning and never becomes a peer.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "../../logging.h"
#include "../../store.h"
#include "socket.h"

namespace pycomm::transport::tcp {

constexpr uint32_t kHelloMagic = 0x48435950;  // "PYCH"
constexpr uint32_t kHelloVersion = 1;
using Token = std::array<uint8_t, 16>;

#pragma pack(push, 1)
struct Hello {
  uint32_t magic;
  uint32_t version;
  Token token;
  int32_t fromRank;
  int32_t toRank;
};
#pragma pack(pop)

// Why a Hello is rejected, or empty when it is acceptable to rank `self` of a group of `size`.
std::string checkHello(const Hello& hello, const Token& token, int self, int size);

Token makeToken();

struct GroupSockets {
  Socket listener;                 // kept open to turn strangers away after setup
  std::vector<Socket> peers;       // peers[rank] is invalid for our own rank
};

// Rendezvous through `store` and connect every pair. Throws TimeoutError naming the missing ranks.
GroupSockets connectGroup(int rank, int size, const std::string& bindHost, Store& store,
                          std::chrono::milliseconds timeout, const Logger& logger);

}  // namespace pycomm::transport::tcp
