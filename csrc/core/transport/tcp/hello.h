// The handshake's three messages, and pure functions that make and judge them.
//
// On each connection from a higher rank C to a lower rank A:
//   A -> C  Challenge {magic, version, nonceA}                  as soon as A accepts
//   C -> A  Hello     {magic, version, C, A, nonceC, mac}        mac  = HMAC(token, "pycomm-hello"   | T)
//   A -> C  Welcome   {magic, version, A, mac'}                  mac' = HMAC(token, "pycomm-welcome" | T)
// where T = nonceA | nonceC | C | A (ranks as little-endian int32) and token is the group's random
// secret from the rendezvous store. The token never crosses the wire, so watching a setup teaches
// nothing that lets one in; nonceA is fresh per connection, so a captured hello does not work
// twice; the welcome proves to C that it reached a member and not whoever sits on the port. Whoever
// can read the store can join: the store is the root of trust, as for every torch backend.
//
// No socket here: the functions and HelloAcceptor are fed bytes, so that tests and the fuzz
// target (tests/native/test_fuzz.cc) drive them directly.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace pycomm::transport::tcp {

constexpr uint32_t kHelloMagic = 0x48435950;  // "PYCH"
// 1: the token itself in the hello. 2: challenge and HMAC answers.
constexpr uint32_t kHelloVersion = 2;
using Token = std::array<uint8_t, 16>;
using Nonce = std::array<uint8_t, 16>;
using Mac = std::array<uint8_t, 32>;

#pragma pack(push, 1)
struct Challenge {
  uint32_t magic;
  uint32_t version;
  Nonce nonce;  // the acceptor's
};
struct Hello {
  uint32_t magic;
  uint32_t version;
  int32_t fromRank;
  int32_t toRank;
  Nonce nonce;  // the connector's
  Mac mac;
};
struct Welcome {
  uint32_t magic;
  uint32_t version;
  int32_t rank;  // the acceptor's
  Mac mac;
};
#pragma pack(pop)
static_assert(sizeof(Challenge) == 24 && sizeof(Hello) == 64 && sizeof(Welcome) == 44,
              "the handshake messages are part of the wire format");

// Random bytes from the kernel (getrandom: no file descriptor needed, which matters when a flood
// of strangers has taken them all).
Token makeToken();
Nonce makeNonce();

Challenge makeChallenge(const Nonce& acceptorNonce);
Hello makeHello(const Token& token, const Nonce& acceptorNonce, const Nonce& connectorNonce, int fromRank,
                int toRank);
Welcome makeWelcome(const Token& token, const Nonce& acceptorNonce, const Hello& hello);

// Each returns why the message is rejected, or an empty string.
// The connector's view of the acceptor's first message.
std::string checkChallenge(const Challenge& challenge);
// The acceptor's (rank `self` of `size`, having sent `acceptorNonce`) view of a hello. Whether the
// rank it names is connected already is the caller's to judge.
std::string checkHello(const Hello& hello, const Token& token, const Nonce& acceptorNonce, int self, int size);
// The connector's view of the answer to the hello it sent.
std::string checkWelcome(const Welcome& welcome, const Token& token, const Nonce& acceptorNonce, const Hello& sent);

// The acceptor's side of one connection that has not proven membership yet, fed with whatever
// bytes arrive. Rejects as soon as the bytes cannot start a hello (a stranger that sends an HTTP
// request is turned away at once, not after its hello-sized read).
class HelloAcceptor {
 public:
  enum class State { kWaiting, kAccepted, kRejected };

  HelloAcceptor(const Token& token, const Nonce& nonce, int self, int size);

  // What to send as soon as the connection is accepted.
  const Challenge& challenge() const { return challenge_; }
  // Bytes still wanted. Read no more than this: what follows the hello belongs to the transport.
  size_t wanted() const;
  // Takes up to wanted() bytes and returns how many it took.
  size_t feed(const uint8_t* data, size_t nbytes);

  State state() const { return state_; }
  const std::string& reason() const { return reason_; }  // once rejected
  int peer() const { return hello_.fromRank; }            // once accepted
  Welcome welcome() const;                                // once accepted

 private:
  Token token_;
  Challenge challenge_;
  int self_;
  int size_;
  Hello hello_{};
  size_t received_ = 0;
  State state_ = State::kWaiting;
  std::string reason_;
};

}  // namespace pycomm::transport::tcp
