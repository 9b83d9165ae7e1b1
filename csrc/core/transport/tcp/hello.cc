#include "hello.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "../../error.h"
#include "sha256.h"

namespace pycomm::transport::tcp {
namespace {

constexpr char kHelloLabel[] = "pycomm-hello";
constexpr char kWelcomeLabel[] = "pycomm-welcome";

void fillRandom(uint8_t* out, size_t nbytes) {
  while (nbytes > 0) {
    const ssize_t n = ::getrandom(out, nbytes, 0);
    if (n < 0 && errno == EINTR) continue;
    PYCOMM_CHECK(n > 0, InternalError, "getrandom: ", std::strerror(errno));
    out += n;
    nbytes -= static_cast<size_t>(n);
  }
}

void putLittleEndian(int32_t value, uint8_t* out) {
  const auto v = static_cast<uint32_t>(value);
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

// The label keeps a hello's MAC from ever serving as a welcome's, and the other way round; the
// transcript binds both nonces and both ranks, so no part can be swapped for another connection's.
Mac transcriptMac(const char* label, const Token& token, const Nonce& acceptorNonce, const Nonce& connectorNonce,
                  int32_t fromRank, int32_t toRank) {
  HmacSha256 mac(token.data(), token.size());
  mac.update(label, std::strlen(label));
  mac.update(acceptorNonce.data(), acceptorNonce.size());
  mac.update(connectorNonce.data(), connectorNonce.size());
  uint8_t ranks[8];
  putLittleEndian(fromRank, ranks);
  putLittleEndian(toRank, ranks + 4);
  mac.update(ranks, sizeof ranks);
  return mac.finish();
}

std::string checkMagicAndVersion(uint32_t magic, uint32_t version) {
  if (magic != kHelloMagic) return "not a pycomm handshake";
  if (version != kHelloVersion) return strCat("handshake version ", version, ", expected ", kHelloVersion);
  return {};
}

}  // namespace

Token makeToken() {
  Token token;
  fillRandom(token.data(), token.size());
  return token;
}

Nonce makeNonce() {
  Nonce nonce;
  fillRandom(nonce.data(), nonce.size());
  return nonce;
}

Challenge makeChallenge(const Nonce& acceptorNonce) { return Challenge{kHelloMagic, kHelloVersion, acceptorNonce}; }

Hello makeHello(const Token& token, const Nonce& acceptorNonce, const Nonce& connectorNonce, int fromRank,
                int toRank) {
  return Hello{kHelloMagic, kHelloVersion, fromRank, toRank, connectorNonce,
               transcriptMac(kHelloLabel, token, acceptorNonce, connectorNonce, fromRank, toRank)};
}

Welcome makeWelcome(const Token& token, const Nonce& acceptorNonce, const Hello& hello) {
  return Welcome{kHelloMagic, kHelloVersion, hello.toRank,
                 transcriptMac(kWelcomeLabel, token, acceptorNonce, hello.nonce, hello.fromRank, hello.toRank)};
}

std::string checkChallenge(const Challenge& challenge) {
  return checkMagicAndVersion(challenge.magic, challenge.version);
}

std::string checkHello(const Hello& hello, const Token& token, const Nonce& acceptorNonce, int self, int size) {
  if (auto why = checkMagicAndVersion(hello.magic, hello.version); !why.empty()) return why;
  // The MAC first: what an unauthenticated hello claims about ranks is not worth reporting.
  const Mac expected = transcriptMac(kHelloLabel, token, acceptorNonce, hello.nonce, hello.fromRank, hello.toRank);
  if (!equalInConstantTime(expected.data(), hello.mac.data(), expected.size())) {
    return "wrong group token or a replayed handshake (its authentication code does not match)";
  }
  if (hello.toRank != self) return strCat("addressed to rank ", hello.toRank);
  if (hello.fromRank <= self || hello.fromRank >= size) {
    return strCat("claims to be rank ", hello.fromRank, ", not a higher rank of this group");
  }
  return {};
}

std::string checkWelcome(const Welcome& welcome, const Token& token, const Nonce& acceptorNonce, const Hello& sent) {
  if (auto why = checkMagicAndVersion(welcome.magic, welcome.version); !why.empty()) return why;
  const Mac expected = transcriptMac(kWelcomeLabel, token, acceptorNonce, sent.nonce, sent.fromRank, sent.toRank);
  if (!equalInConstantTime(expected.data(), welcome.mac.data(), expected.size())) {
    return "its authentication code does not match the group token";
  }
  if (welcome.rank != sent.toRank) return strCat("answers as rank ", welcome.rank);
  return {};
}

HelloAcceptor::HelloAcceptor(const Token& token, const Nonce& nonce, int self, int size)
    : token_(token), challenge_(makeChallenge(nonce)), self_(self), size_(size) {}

size_t HelloAcceptor::wanted() const { return state_ == State::kWaiting ? sizeof(Hello) - received_ : 0; }

size_t HelloAcceptor::feed(const uint8_t* data, size_t nbytes) {
  const size_t take = std::min(nbytes, wanted());
  if (take == 0) return 0;
  std::memcpy(reinterpret_cast<uint8_t*>(&hello_) + received_, data, take);
  received_ += take;
  // Judge the fields as soon as they are complete, so that a stranger is dropped on its first
  // bytes rather than kept until its deadline.
  constexpr size_t kMagicEnd = offsetof(Hello, magic) + sizeof(uint32_t);
  constexpr size_t kVersionEnd = offsetof(Hello, version) + sizeof(uint32_t);
  std::string why;
  if (received_ >= kMagicEnd && hello_.magic != kHelloMagic) {
    why = "not a pycomm handshake";
  } else if (received_ >= kVersionEnd) {
    why = checkMagicAndVersion(hello_.magic, hello_.version);
  }
  if (why.empty() && received_ == sizeof(Hello)) {
    why = checkHello(hello_, token_, challenge_.nonce, self_, size_);
    if (why.empty()) state_ = State::kAccepted;
  }
  if (!why.empty()) {
    state_ = State::kRejected;
    reason_ = std::move(why);
  }
  return take;
}

Welcome HelloAcceptor::welcome() const {
  PYCOMM_CHECK(state_ == State::kAccepted, InternalError, "a welcome for a hello that was not accepted");
  return makeWelcome(token_, challenge_.nonce, hello_);
}

}  // namespace pycomm::transport::tcp
