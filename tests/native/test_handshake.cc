// Group setup over TCP, without torch: SHA-256 and HMAC-SHA256 against the published vectors, the
// handshake's messages and HelloAcceptor fed byte by byte, connectTo's deadline when SYNs go
// unanswered, whole groups formed by connectGroup on threads with strangers on the port, the cap
// and deadline of pending connections, and the rate-limited log of dropped ones.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/transport/tcp/handshake.h"
#include "core/transport/tcp/hello.h"
#include "core/transport/tcp/sha256.h"
#include "core/transport/tcp/socket.h"
#include "harness.h"

namespace {

using namespace pycomm;
using namespace pycomm::transport::tcp;
using Clock = std::chrono::steady_clock;

std::string hex(const uint8_t* p, size_t n) {
  static const char* const kDigits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += kDigits[p[i] >> 4];
    out += kDigits[p[i] & 15];
  }
  return out;
}

std::string hex(const Digest& d) { return hex(d.data(), d.size()); }

std::vector<uint8_t> repeated(uint8_t byte, size_t n) { return std::vector<uint8_t>(n, byte); }
std::vector<uint8_t> bytesOf(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

// FIPS 180-4 examples (as RFC 6234 lists them), fed whole and in uneven pieces.
void testSha256Vectors() {
  const std::pair<std::string, std::string> vectors[] = {
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
      {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
       "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
  };
  for (const auto& [message, expected] : vectors) {
    EXPECT_TRUE(hex(sha256(message.data(), message.size())) == expected, "sha256(\"", message, "\")");
    Sha256 pieces;
    for (size_t at = 0, step = 1; at < message.size(); at += step, step = step * 2 + 1) {
      pieces.update(message.data() + at, std::min(step, message.size() - at));
    }
    EXPECT_TRUE(hex(pieces.finish()) == expected, "sha256 in pieces of \"", message, "\"");
  }
  Sha256 million;
  const std::string thousand(1000, 'a');
  for (int i = 0; i < 1000; ++i) million.update(thousand.data(), thousand.size());
  EXPECT_TRUE(hex(million.finish()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
              "sha256 of a million 'a'");
  // Every length around the padding boundaries (55, 56, 63, 64 bytes) gives a distinct digest.
  std::vector<std::string> seen;
  for (size_t n = 50; n < 70; ++n) {
    const std::string m(n, 'x');
    seen.push_back(hex(sha256(m.data(), m.size())));
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_TRUE(std::unique(seen.begin(), seen.end()) == seen.end(), "digests collide around the padding boundary");
}

// RFC 4231, test cases 1-7 (case 5 compares the first 128 bits, as the RFC does).
void testHmacVectors() {
  std::vector<uint8_t> key4;
  for (uint8_t b = 1; b <= 25; ++b) key4.push_back(b);
  const struct {
    std::vector<uint8_t> key, data;
    std::string expected;
  } vectors[] = {
      {repeated(0x0b, 20), bytesOf("Hi There"), "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {bytesOf("Jefe"), bytesOf("what do ya want for nothing?"),
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {repeated(0xaa, 20), repeated(0xdd, 50), "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {key4, repeated(0xcd, 50), "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {repeated(0x0c, 20), bytesOf("Test With Truncation"), "a3b6167473100ee06e0c796c2955552b"},
      {repeated(0xaa, 131), bytesOf("Test Using Larger Than Block-Size Key - Hash Key First"),
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {repeated(0xaa, 131),
       bytesOf("This is a test using a larger than block-size key and a larger than block-size data. The key needs "
               "to be hashed before being used by the HMAC algorithm."),
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  int index = 1;
  for (const auto& v : vectors) {
    HmacSha256 mac(v.key.data(), v.key.size());
    mac.update(v.data.data(), v.data.size());
    const std::string got = hex(mac.finish()).substr(0, v.expected.size());
    EXPECT_TRUE(got == v.expected, "RFC 4231 case ", index, ": ", got);
    ++index;
  }
}

Token tokenOf(uint8_t first) {
  Token t;
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint8_t>(first + i);
  return t;
}

void testHelloMessages() {
  const Token token = tokenOf(0), other = tokenOf(1);
  const Nonce acceptorNonce = makeNonce(), connectorNonce = makeNonce();
  const Hello good = makeHello(token, acceptorNonce, connectorNonce, 3, 1);
  EXPECT_TRUE(checkHello(good, token, acceptorNonce, 1, 4).empty(), checkHello(good, token, acceptorNonce, 1, 4));
  EXPECT_TRUE(checkChallenge(makeChallenge(acceptorNonce)).empty(), "a fresh challenge");

  auto verdict = [&](const Hello& h, int self = 1, int size = 4) { return checkHello(h, token, acceptorNonce, self, size); };
  auto contains = [](const std::string& text, const char* part) { return text.find(part) != std::string::npos; };
  // The same hello under another challenge: a replay.
  EXPECT_TRUE(contains(checkHello(good, token, makeNonce(), 1, 4), "replayed"), "replay accepted");
  EXPECT_TRUE(contains(verdict(makeHello(other, acceptorNonce, connectorNonce, 3, 1)), "wrong group token"), "wrong token");
  Hello edited = good;
  edited.fromRank = 2;  // the ranks are covered by the MAC
  EXPECT_TRUE(contains(verdict(edited), "authentication code"), "a hello whose rank was edited");
  edited = good;
  edited.nonce[0] ^= 1;
  EXPECT_TRUE(contains(verdict(edited), "authentication code"), "a hello whose nonce was edited");
  edited = good;
  edited.magic = 0;
  EXPECT_TRUE(verdict(edited) == "not a pycomm handshake", verdict(edited));
  edited = good;
  edited.version = 1;
  EXPECT_TRUE(contains(verdict(edited), "handshake version 1"), verdict(edited));
  // Right token, impossible ranks: addressed elsewhere, a lower rank, outside the group.
  EXPECT_TRUE(contains(verdict(makeHello(token, acceptorNonce, connectorNonce, 3, 2)), "addressed to rank 2"), "to 2");
  EXPECT_TRUE(contains(verdict(makeHello(token, acceptorNonce, connectorNonce, 0, 1)), "claims to be rank 0"), "from 0");
  EXPECT_TRUE(contains(verdict(makeHello(token, acceptorNonce, connectorNonce, 4, 1)), "claims to be rank 4"), "from 4");
  EXPECT_TRUE(contains(verdict(makeHello(token, acceptorNonce, connectorNonce, -1, 1)), "claims to be rank -1"), "-1");

  // The welcome: right only for the hello it answers.
  const Welcome welcome = makeWelcome(token, acceptorNonce, good);
  EXPECT_TRUE(checkWelcome(welcome, token, acceptorNonce, good).empty(), checkWelcome(welcome, token, acceptorNonce, good));
  EXPECT_TRUE(!checkWelcome(welcome, other, acceptorNonce, good).empty(), "a welcome under another token");
  EXPECT_TRUE(!checkWelcome(welcome, token, makeNonce(), good).empty(), "a welcome from another connection");
  const Hello another = makeHello(token, acceptorNonce, makeNonce(), 3, 1);
  EXPECT_TRUE(!checkWelcome(welcome, token, acceptorNonce, another).empty(), "a welcome for another hello");
  // A hello's MAC never serves as a welcome's.
  Welcome reflected = welcome;
  reflected.mac = good.mac;
  EXPECT_TRUE(!checkWelcome(reflected, token, acceptorNonce, good).empty(), "the hello's MAC reflected");
  Welcome wrongRank = makeWelcome(token, acceptorNonce, good);
  wrongRank.rank = 2;
  EXPECT_TRUE(!checkWelcome(wrongRank, token, acceptorNonce, good).empty(), "a welcome naming another rank");
}

void testHelloAcceptor() {
  const Token token = tokenOf(7);
  const Nonce nonce = makeNonce();
  const Hello good = makeHello(token, nonce, makeNonce(), 2, 0);
  const auto* bytes = reinterpret_cast<const uint8_t*>(&good);
  {  // byte by byte
    HelloAcceptor acceptor(token, nonce, 0, 3);
    EXPECT_TRUE(acceptor.challenge().nonce == nonce, "the challenge carries the nonce");
    for (size_t i = 0; i < sizeof good; ++i) {
      EXPECT_TRUE(acceptor.state() == HelloAcceptor::State::kWaiting, "decided early at byte ", i);
      EXPECT_TRUE(acceptor.feed(bytes + i, 1) == 1, "byte ", i, " not taken");
    }
    EXPECT_TRUE(acceptor.state() == HelloAcceptor::State::kAccepted, acceptor.reason());
    EXPECT_TRUE(acceptor.peer() == 2, "peer ", acceptor.peer());
    const Welcome w = acceptor.welcome();
    EXPECT_TRUE(checkWelcome(w, token, nonce, good).empty(), "the acceptor's welcome");
    EXPECT_TRUE(acceptor.wanted() == 0 && acceptor.feed(bytes, 4) == 0, "bytes past the hello taken");
  }
  {  // more than a hello at once: only the hello is taken
    std::vector<uint8_t> more(bytes, bytes + sizeof good);
    more.resize(sizeof good + 100, 0xee);
    HelloAcceptor acceptor(token, nonce, 0, 3);
    EXPECT_TRUE(acceptor.feed(more.data(), more.size()) == sizeof good, "took past the hello");
    EXPECT_TRUE(acceptor.state() == HelloAcceptor::State::kAccepted, acceptor.reason());
  }
  {  // an HTTP request is refused on its first four bytes
    HelloAcceptor acceptor(token, nonce, 0, 3);
    const std::string http = "GET / HTTP/1.1\r\n";
    acceptor.feed(reinterpret_cast<const uint8_t*>(http.data()), 4);
    EXPECT_TRUE(acceptor.state() == HelloAcceptor::State::kRejected && acceptor.reason() == "not a pycomm handshake",
                acceptor.reason());
  }
  {  // a version-1 hello is refused on its first eight bytes
    HelloAcceptor acceptor(token, nonce, 0, 3);
    const uint32_t old[2] = {kHelloMagic, 1};
    acceptor.feed(reinterpret_cast<const uint8_t*>(old), sizeof old);
    EXPECT_TRUE(acceptor.state() == HelloAcceptor::State::kRejected, "version 1 waited for more");
  }
}

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double threadCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec + 1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

// Runs `body` on a thread and gives up on it after `limit`: a connect that ignores its deadline
// must fail the test, not hang it. A thread still blocked then cannot be joined, so the process
// exits at once with the failure reported.
void withGuard(const char* what, std::chrono::seconds limit, const std::function<void()>& body) {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::thread worker([&] {
    body();
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mutex);
  if (!cv.wait_for(lock, limit, [&] { return done; })) {
    std::fprintf(stderr, "FAILED %s: still blocked after %lld s\n", what, static_cast<long long>(limit.count()));
    std::fflush(stderr);
    std::_Exit(1);
  }
  lock.unlock();
  worker.join();
}

// A listener whose accept queue is full: on Linux further SYNs are dropped, so a connect to it
// gets no answer at all, the case a blocking connect() waits ~2 minutes for.
struct FullListener {
  Socket listener;
  std::vector<Socket> fillers;
  Endpoint endpoint;

  FullListener() {
    listener = Socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    EXPECT_TRUE(::bind(listener.fd(), reinterpret_cast<sockaddr*>(&addr), len) == 0, "bind");
    EXPECT_TRUE(::listen(listener.fd(), 0) == 0, "listen");
    EXPECT_TRUE(::getsockname(listener.fd(), reinterpret_cast<sockaddr*>(&addr), &len) == 0, "getsockname");
    endpoint.host = "127.0.0.1";
    endpoint.port = ntohs(addr.sin_port);
    // Non-blocking connects that are never accepted fill the queue (backlog 0 holds one).
    for (int i = 0; i < 4; ++i) {
      Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      (void)::connect(s.fd(), reinterpret_cast<sockaddr*>(&addr), len);
      fillers.push_back(std::move(s));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
};

void testConnectHonoursItsDeadline() {
  FullListener full;
  const auto budget = std::chrono::milliseconds(1500);
  withGuard("connectTo with a 1.5 s deadline to a listener that drops SYNs", std::chrono::seconds(8), [&] {
    const auto start = Clock::now();
    std::string outcome = "connected";
    try {
      Socket s = connectTo(full.endpoint, start + budget, "test");
    } catch (const TimeoutError& e) {
      outcome = std::string("TimeoutError: ") + e.what();
    } catch (const std::exception& e) {
      outcome = std::string("other error: ") + e.what();
    }
    const double took = secondsSince(start);
    std::printf("connectTo to a full accept queue: %.2f s, %s\n", took, outcome.c_str());
    EXPECT_TRUE(outcome.rfind("TimeoutError", 0) == 0, outcome);
    EXPECT_TRUE(took < 2.0, "took ", took, " s for a 1.5 s deadline");
  });
}

void testConnectRetriesUntilTheListenerAppears() {
  // A port nobody listens on yet: refused, retried, then connected once a listener binds it.
  Endpoint endpoint;
  Socket probe = listenOn("127.0.0.1", &endpoint);
  probe.close();
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    Endpoint again;
    Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    int one = 1;
    setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(endpoint.port);
    if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(s.fd(), 4) != 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // connected by then: the backlog holds it
  });
  const auto start = Clock::now();
  std::string outcome = "connected";
  try {
    Socket s = connectTo(endpoint, start + std::chrono::seconds(3), "test");
  } catch (const std::exception& e) {
    outcome = e.what();
  }
  late.join();
  EXPECT_TRUE(outcome == "connected", outcome);
  // Nobody ever listens: the deadline ends it, and the error says what was tried.
  probe = listenOn("127.0.0.1", &endpoint);
  probe.close();
  try {
    Socket s = connectTo(endpoint, Clock::now() + std::chrono::milliseconds(300), "[rank 1/2] connecting to peer 0");
    outcome = "connected";
  } catch (const TimeoutError& e) {
    outcome = e.what();
  }
  EXPECT_TRUE(outcome.find("[rank 1/2] connecting to peer 0") != std::string::npos &&
                  outcome.find("refused") != std::string::npos,
              outcome);
}

// Every pair of a group formed by connectGroup carries bytes both ways.
void checkPairs(std::vector<GroupSockets>& groups) {
  const int size = static_cast<int>(groups.size());
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  for (int r = 0; r < size; ++r) {
    for (int q = 0; q < size; ++q) {
      if (q == r) continue;
      EXPECT_TRUE(groups[r].peers[q].valid(), "rank ", r, " has no socket to ", q);
      if (!groups[r].peers[q].valid() || !groups[q].peers[r].valid()) continue;
      const int32_t sent = 100 * r + q;
      int32_t got = -1;
      groups[r].peers[q].sendAll(&sent, sizeof sent, deadline, "test send");
      groups[q].peers[r].recvAll(&got, sizeof got, deadline, "test recv");
      EXPECT_TRUE(got == sent, "rank ", q, " got ", got, " from ", r);
    }
  }
}

void testGroupForms(int size) {
  pycomm::testing::MemoryStore store;
  const Logger logger(LogLevel::kWarn, strCat("[test group of ", size, "]"));
  std::vector<GroupSockets> groups(size);
  pycomm::testing::runRanks(size, [&](int r) {
    groups[r] = connectGroup(r, size, "127.0.0.1", store, std::chrono::seconds(20), logger);
  });
  checkPairs(groups);
}

// Rank 1 comes late; meanwhile strangers knock on rank 0: one silent, one with garbage, one with a
// version-1 hello carrying the token, one that reads the challenge and answers for a rank that is
// outside the group. Every one is closed, and the group forms.
void testStrangersDuringSetup() {
  pycomm::testing::MemoryStore store;
  const Logger logger(LogLevel::kWarn, "[test strangers]");
  std::vector<GroupSockets> groups(2);
  std::vector<std::string> outcomes;
  std::thread strangers([&] {
    const auto addr = store.get("pycomm/addr/0", std::chrono::seconds(10));
    const auto tokenBytes = store.get("pycomm/token", std::chrono::seconds(10));
    Token token;
    std::memcpy(token.data(), tokenBytes.data(), token.size());
    const Endpoint endpoint = Endpoint::parse(std::string(addr.begin(), addr.end()));
    const auto deadline = Clock::now() + std::chrono::seconds(8);
    std::vector<Socket> socks;
    for (int i = 0; i < 4; ++i) socks.push_back(connectTo(endpoint, deadline, "stranger"));
    const std::string garbage(100, '\x5a');
    socks[1].sendAll(garbage.data(), garbage.size(), deadline, "stranger");
    const uint32_t v1[2] = {kHelloMagic, 1};
    socks[2].sendAll(v1, sizeof v1, deadline, "stranger");
    socks[2].sendAll(token.data(), token.size(), deadline, "stranger");
    Challenge challenge{};
    socks[3].recvAll(&challenge, sizeof challenge, deadline, "stranger");
    const Hello outside = makeHello(token, challenge.nonce, makeNonce(), 5, 0);
    socks[3].sendAll(&outside, sizeof outside, deadline, "stranger");
    for (auto& s : socks) {
      // Whatever the rank sends (its challenge) is read until it closes the connection.
      std::string outcome = "open";
      uint8_t buffer[64];
      while (true) {
        std::string error;
        const auto io = s.tryRecvAll(buffer, 1, deadline, &error);
        if (io == Socket::Io::kClosed) outcome = "closed";
        if (io != Socket::Io::kDone) break;
      }
      outcomes.push_back(outcome);
    }
  });
  pycomm::testing::runRanks(2, [&](int r) {
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    groups[r] = connectGroup(r, 2, "127.0.0.1", store, std::chrono::seconds(20), logger);
  });
  strangers.join();
  checkPairs(groups);
  EXPECT_TRUE(outcomes.size() == 4, outcomes.size(), " outcomes");
  for (size_t i = 0; i < outcomes.size(); ++i) EXPECT_TRUE(outcomes[i] == "closed", "stranger ", i, ": ", outcomes[i]);
}

// At most kLinesPerSecond lines a second; the rest counted and reported when a later second opens
// and when the log is flushed or destroyed.
void testStrangerLogIsRateLimited() {
  std::vector<std::string> lines;
  const auto t0 = Clock::now();
  {
    StrangerLog log([&](const std::string& line) { lines.push_back(line); });
    for (int i = 0; i < 25; ++i) log.dropped("10.0.0.1:" + std::to_string(i), "silent", t0 + std::chrono::milliseconds(i));
    EXPECT_TRUE(lines.size() == StrangerLog::kLinesPerSecond, lines.size(), " lines in the first second");
    log.dropped("10.0.0.2:1", "late", t0 + std::chrono::milliseconds(1500));
    EXPECT_TRUE(lines.size() == StrangerLog::kLinesPerSecond + 2, lines.size(), " lines");
    EXPECT_TRUE(lines.size() > 21 && lines[20].find("and 5 more dropped connections") != std::string::npos, lines[20]);
    EXPECT_TRUE(lines.back().find("dropped connection from 10.0.0.2:1: late") != std::string::npos, lines.back());
    for (int i = 0; i < 30; ++i) log.dropped("10.0.0.3:1", "flood", t0 + std::chrono::milliseconds(2600));
  }
  EXPECT_TRUE(lines.back().find("and 10 more dropped connections") != std::string::npos, "on destruction: ", lines.back());
}

// acceptPeers with small limits: ten silent strangers against a cap of four pending connections
// and a 300 ms handshake deadline, then the real rank 1. The oldest strangers make room, the rest
// time out, every one is closed, and rank 1 gets in.
void testPendingConnectionsAreCappedAndTimed() {
  pycomm::testing::MemoryStore store;
  Endpoint endpoint;
  Socket listener = listenOn("127.0.0.1", &endpoint);
  listener.setNonBlocking();
  const Token token = makeToken();
  const std::string text = endpoint.str();
  store.set("pycomm/addr/0", std::vector<uint8_t>(text.begin(), text.end()));
  store.set("pycomm/token", std::vector<uint8_t>(token.begin(), token.end()));
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  std::vector<Socket> strangers;
  for (int i = 0; i < 10; ++i) strangers.push_back(connectTo(endpoint, deadline, "stranger"));

  std::vector<std::string> lines;
  std::vector<Socket> peers(2);
  GroupSockets rank1;
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    rank1 = connectGroup(1, 2, "127.0.0.1", store, std::chrono::seconds(10), Logger());
  });
  const double cpuBefore = threadCpuSeconds();
  const auto wallBefore = Clock::now();
  try {
    StrangerLog log([&](const std::string& line) { lines.push_back(line); });
    AcceptLimits limits;
    limits.handshakeTimeout = std::chrono::milliseconds(300);
    limits.maxPending = 4;
    acceptPeers(listener, token, 0, 2, peers, deadline, std::chrono::seconds(10), log, limits);
  } catch (const std::exception& e) {
    EXPECT_TRUE(false, "acceptPeers: ", e.what());
  }
  // Between the strangers' deadline and rank 1's arrival there is nothing to do: no spinning.
  const double cpu = threadCpuSeconds() - cpuBefore, wall = secondsSince(wallBefore);
  EXPECT_TRUE(cpu < 0.25 * wall, "acceptPeers used ", cpu, " s of CPU in ", wall, " s");
  late.join();
  EXPECT_TRUE(peers[1].valid() && rank1.peers[0].valid(), "rank 1 did not get in");
  int madeRoom = 0, timedOut = 0;
  for (const auto& line : lines) {
    madeRoom += line.find("closed to make room (4 connections waiting") != std::string::npos;
    timedOut += line.find("no handshake within 300 ms") != std::string::npos;
  }
  // Six make room for the last four; those time out, unless rank 1 comes first and pushes out one more.
  EXPECT_TRUE(madeRoom >= 6 && madeRoom + timedOut == 10, madeRoom, " made room, ", timedOut, " timed out");
  for (auto& s : strangers) {
    uint8_t buffer[64];
    std::string error;
    while (s.tryRecvAll(buffer, 1, Clock::now() + std::chrono::seconds(2), &error) == Socket::Io::kDone) {
    }
    EXPECT_TRUE(error.find("closed") != std::string::npos || error.find("reset") != std::string::npos,
                "a stranger still open: ", error);
  }
}

}  // namespace

int main() {
  testSha256Vectors();
  testHmacVectors();
  testHelloMessages();
  testHelloAcceptor();
  testConnectHonoursItsDeadline();
  testConnectRetriesUntilTheListenerAppears();
  for (int size : {2, 3, 5}) testGroupForms(size);
  testStrangersDuringSetup();
  testStrangerLogIsRateLimited();
  testPendingConnectionsAreCappedAndTimed();
  return pycomm::testing::finish("test_handshake");
}
