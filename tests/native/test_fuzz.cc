// A bounded mutation fuzzer for what a stranger or a broken peer can feed the core: the frame
// header parser, the handshake (the pure checks and HelloAcceptor fed in pieces), and the
// shared-memory ring reader over a header it corrupts. Fixed seed and a fixed number of
// executions, so ctest runs the same inputs every time; built like every native test, so it runs
// under ASan/UBSan in scripts/test.sh, which is what turns an out-of-bounds access into a failure.
//
// Inputs start from a seed corpus (tests/native/fuzz_corpus/, files named after their target; see
// its README) plus seeds made here, and are mutated by bit flips, byte sets, interesting integers
// (0, -1, 2^31, 2^63, 2^40+1...), truncation, extension, insertion and splicing. A mutated input
// that produces a verdict not seen before joins the corpus: a poor man's coverage feedback.
//
// A finding is an input for which a property fails (beyond crashing): a header that passes but
// announces more than kMaxFrameBytes, a hello accepted that is not exactly what the token holder
// would send, a ring read that returns more than asked. Findings fail the test and are printed in
// hex so they can be added to the corpus.
#include <dirent.h>
#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/transport/frame.h"
#include "core/transport/shm/ring.h"
#include "core/transport/tcp/hello.h"
#include "harness.h"

namespace {

using namespace pycomm;
using namespace pycomm::transport;
using Bytes = std::vector<uint8_t>;

constexpr uint64_t kSeed = 0x70796330'6d6d6f63;  // fixed: every run fuzzes the same inputs
constexpr int kExecutionsPerTarget[] = {80'000, 60'000, 60'000};  // header, hello, ring
constexpr size_t kMaxInput = 512;
constexpr size_t kMaxCorpus = 256;

// The handshake target's fixed secrets; the corpus's valid hello is made with them.
tcp::Token fuzzToken() {
  tcp::Token t;
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint8_t>(i);
  return t;
}
tcp::Nonce fuzzNonce() {
  tcp::Nonce n;
  for (size_t i = 0; i < n.size(); ++i) n[i] = static_cast<uint8_t>(100 + i);
  return n;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(next() % n); }

 private:
  uint64_t state_;
};

constexpr uint64_t kInteresting[] = {0,          1,          0x7f,        0x80,          0xff,
                                     0x7fff,     0x8000,     0xffff,      0x7fffffff,    0x80000000,
                                     0xffffffff, 1ull << 32, 1ull << 40,  (1ull << 40) + 1, 1ull << 63,
                                     (1ull << 63) + 5,       ~0ull,       ~0ull - 1};

void putInteger(Bytes& b, size_t at, uint64_t value, size_t width) {
  for (size_t i = 0; i < width && at + i < b.size(); ++i) b[at + i] = static_cast<uint8_t>(value >> (8 * i));
}

Bytes mutate(const Bytes& input, const std::vector<Bytes>& corpus, Rng& rng) {
  Bytes b = input;
  const int rounds = 1 + static_cast<int>(rng.below(4));
  for (int r = 0; r < rounds; ++r) {
    switch (rng.below(8)) {
      case 0:  // flip a bit
        if (!b.empty()) b[rng.below(b.size())] ^= static_cast<uint8_t>(1u << rng.below(8));
        break;
      case 1:  // set a byte
        if (!b.empty()) b[rng.below(b.size())] = static_cast<uint8_t>(rng.next());
        break;
      case 2: {  // an interesting integer, 1/2/4/8 bytes wide, maybe negated
        if (b.empty()) break;
        uint64_t v = kInteresting[rng.below(sizeof kInteresting / sizeof kInteresting[0])];
        if (rng.below(4) == 0) v = 0 - v;
        putInteger(b, rng.below(b.size()), v, size_t{1} << rng.below(4));
        break;
      }
      case 3:  // truncate
        b.resize(rng.below(b.size() + 1));
        break;
      case 4: {  // extend with random bytes
        const size_t n = 1 + rng.below(64);
        for (size_t i = 0; i < n && b.size() < kMaxInput; ++i) b.push_back(static_cast<uint8_t>(rng.next()));
        break;
      }
      case 5: {  // splice: a prefix of this one, a suffix of another
        const Bytes& other = corpus[rng.below(corpus.size())];
        const size_t keep = rng.below(b.size() + 1);
        const size_t from = rng.below(other.size() + 1);
        b.resize(keep);
        b.insert(b.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
        break;
      }
      case 6: {  // insert random bytes
        const size_t at = rng.below(b.size() + 1);
        const size_t n = 1 + rng.below(8);
        for (size_t i = 0; i < n; ++i) b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), static_cast<uint8_t>(rng.next()));
        break;
      }
      default: {  // copy a chunk over another place
        if (b.size() < 2) break;
        const size_t from = rng.below(b.size()), to = rng.below(b.size());
        const size_t n = std::min({rng.below(16) + 1, b.size() - from, b.size() - to});
        std::memmove(b.data() + to, b.data() + from, n);
        break;
      }
    }
  }
  if (b.size() > kMaxInput) b.resize(kMaxInput);
  return b;
}

std::string hexOf(const Bytes& b) {
  static const char* const kDigits = "0123456789abcdef";
  std::string out;
  for (uint8_t x : b) {
    out += kDigits[x >> 4];
    out += kDigits[x & 15];
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The targets. Each returns a short verdict (for the feedback) and records findings.

struct Findings {
  std::vector<std::string> list;
  void add(const std::string& what, const Bytes& input) {
    if (list.size() < 20) list.push_back(what + ": " + hexOf(input));
  }
};

std::string fuzzHeader(const Bytes& input, Findings& findings) {
  FrameHeader h{};
  std::memcpy(&h, input.data(), std::min(input.size(), sizeof h));  // the wire reads exactly 48 bytes
  const std::string why = validateHeader(h);
  if (!why.empty()) return why.substr(0, why.find_first_of("0123456789"));
  const OpSignature signature = signatureOf(h);
  const std::string text = signature.describe();
  if (h.nbytes > kMaxFrameBytes || h.magic != kFrameMagic || text.empty()) {
    findings.add("a header that should fail passed", input);
  }
  return "valid " + std::to_string(h.kind) + "/" + std::to_string(h.channel);
}

// input[0] picks the acceptor's rank and group size and how the rest is cut into reads; the rest
// is the byte stream a connection delivers after the challenge.
std::string fuzzHello(const Bytes& input, Findings& findings) {
  if (input.empty()) return "empty";
  static const tcp::Token token = fuzzToken();
  static const tcp::Nonce nonce = fuzzNonce();
  const int self = input[0] % 4;
  const int size = self + 1 + (input[0] >> 2) % 5;
  tcp::HelloAcceptor acceptor(token, nonce, self, size);
  Rng cuts(input.size() * 31 + input[0]);
  size_t at = 1;
  while (at < input.size() && acceptor.state() == tcp::HelloAcceptor::State::kWaiting) {
    const size_t piece = 1 + cuts.below(24);
    const size_t n = std::min(piece, input.size() - at);
    const size_t took = acceptor.feed(input.data() + at, n);
    if (took == 0 || took > n) {
      findings.add("HelloAcceptor took " + std::to_string(took) + " of " + std::to_string(n) + " bytes", input);
      break;
    }
    at += took;
  }
  // The pure checks on the same bytes, as whichever message they might be.
  tcp::Hello hello{};
  std::memcpy(&hello, input.data() + 1, std::min(input.size() - 1, sizeof hello));
  const std::string verdict = tcp::checkHello(hello, token, nonce, self, size);
  tcp::Challenge challenge{};
  std::memcpy(&challenge, input.data() + 1, std::min(input.size() - 1, sizeof challenge));
  (void)tcp::checkChallenge(challenge);
  tcp::Welcome welcome{};
  std::memcpy(&welcome, input.data() + 1, std::min(input.size() - 1, sizeof welcome));
  const tcp::Hello sent = tcp::makeHello(token, nonce, hello.nonce, hello.fromRank, hello.toRank);
  if (tcp::checkWelcome(welcome, token, nonce, sent).empty()) {
    const tcp::Welcome real = tcp::makeWelcome(token, nonce, sent);
    if (std::memcmp(&real, &welcome, sizeof real) != 0) findings.add("a forged welcome passed", input);
  }

  switch (acceptor.state()) {
    case tcp::HelloAcceptor::State::kAccepted: {
      // Only what the token holder would send may pass: exactly makeHello's bytes.
      const tcp::Hello real = tcp::makeHello(token, nonce, hello.nonce, hello.fromRank, hello.toRank);
      if (std::memcmp(&real, &hello, sizeof real) != 0 || !verdict.empty()) findings.add("a forged hello passed", input);
      if (acceptor.peer() <= self || acceptor.peer() >= size) findings.add("accepted an impossible rank", input);
      (void)acceptor.welcome();
      return "accepted";
    }
    case tcp::HelloAcceptor::State::kRejected:
      return acceptor.reason().substr(0, acceptor.reason().find_first_of("0123456789"));
    default:
      return "waiting";
  }
}

// input: [capacity: 2 bytes][bytes laid over the ring's header][ops: kind, 2-byte length]...
std::string fuzzRing(const Bytes& input, Findings& findings) {
  if (input.size() < 2) return "short";
  const size_t capacity = 1 + ((input[0] | (input[1] << 8)) % 4096);
  const size_t headerBytes = shm::Ring::bytesFor(0);
  const size_t bytes = (shm::Ring::bytesFor(capacity) + 63) / 64 * 64;
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> memory(static_cast<uint8_t*>(std::aligned_alloc(64, bytes)));
  std::memset(memory.get(), 0, bytes);
  size_t at = 2;
  // The other process owns half of this header: here it is whatever the input says.
  const size_t laid = std::min(headerBytes, input.size() - at);
  std::memcpy(memory.get(), input.data() + at, laid);
  at += laid;
  shm::Ring ring(memory.get(), capacity);
  // Which kinds of result the ops had, as bits: the verdict the feedback keys on.
  enum : unsigned { kReadNone = 1, kReadSome = 2, kReadAll = 4, kReadPastCapacity = 8, kWriteNone = 16,
                    kWriteSome = 32, kWriteAll = 64, kScribble = 128 };
  unsigned seen = 0;
  int ops = 0;
  while (at + 3 <= input.size() && ops < 64) {
    const uint8_t kind = input[at];
    const size_t length = (input[at + 1] | (input[at + 2] << 8)) % 8192;
    at += 3;
    ++ops;
    bool bell = false;
    if (kind % 3 == 0) {
      Bytes dst(length);  // exactly `length`: a read past it is an ASan error
      const size_t n = ring.read(dst.data(), length, bell);
      if (n > length) findings.add("read returned more than asked", input);
      seen |= n == 0 ? kReadNone : n < length ? kReadSome : kReadAll;
      if (n > capacity) seen |= kReadPastCapacity;  // a corrupt header: stale bytes, inside the ring
    } else if (kind % 3 == 1) {
      Bytes src(length, 0xab);
      const size_t half = length / 2;
      iovec iov[2] = {{src.data(), half}, {src.data() + half, length - half}};
      const size_t n = ring.write(iov, 2, bell);
      if (n > length) findings.add("write took more than given", input);
      seen |= n == 0 ? kWriteNone : n < length ? kWriteSome : kWriteAll;
    } else if (at < input.size()) {  // the peer scribbles on the header again
      memory.get()[length % headerBytes] = input[at++];
      seen |= kScribble;
    }
  }
  return "ops " + std::to_string(seen);
}

// ---------------------------------------------------------------------------------------------

struct Target {
  const char* name;
  std::string (*run)(const Bytes&, Findings&);
  std::vector<Bytes> corpus;
};

Bytes bytesOf(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return Bytes(b, b + n);
}

// Seeds made here, beside the checked-in corpus: the valid form of each input.
void builtInSeeds(std::vector<Target>& targets) {
  FrameInfo info;
  info.seq = 7;
  info.signature.kind = OpKind::kAllreduce;
  info.signature.count = 1024;
  const FrameHeader header = makeHeader(FrameKind::kData, info, 4096);
  targets[0].corpus.push_back(bytesOf(&header, sizeof header));

  const tcp::Hello hello = tcp::makeHello(fuzzToken(), fuzzNonce(), tcp::Nonce{}, 3, 1);
  Bytes seed{static_cast<uint8_t>(1 | (2 << 2))};  // acceptor rank 1 of 4
  const Bytes body = bytesOf(&hello, sizeof hello);
  seed.insert(seed.end(), body.begin(), body.end());
  targets[1].corpus.push_back(seed);

  Bytes ring{0x00, 0x01};  // capacity 257, a zeroed header, then write 300, read 100, read 4096
  ring.resize(2 + shm::Ring::bytesFor(0), 0);
  for (uint8_t op : {1, 0x2c, 0x01, 0, 0x64, 0x00, 0, 0x00, 0x10}) ring.push_back(op);
  targets[2].corpus.push_back(ring);
}

std::string corpusDirectory() {
  std::string file = __FILE__;  // CMake compiles with the absolute path
  return file.substr(0, file.find_last_of('/') + 1) + "fuzz_corpus";
}

int loadCorpus(std::vector<Target>& targets) {
  const std::string dir = corpusDirectory();
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    std::printf("test_fuzz: no corpus at %s; built-in seeds only\n", dir.c_str());
    return 0;
  }
  int loaded = 0;
  while (dirent* entry = ::readdir(d)) {
    const std::string name = entry->d_name;
    for (auto& target : targets) {
      if (name.rfind(std::string(target.name) + "-", 0) != 0) continue;
      std::ifstream in(dir + "/" + name, std::ios::binary);
      Bytes content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (content.size() > kMaxInput) content.resize(kMaxInput);
      // A valid hello made by make_corpus.py with Python's hmac: the core's HMAC must agree.
      if (name.rfind("hello-valid", 0) == 0) {
        Findings none;
        EXPECT_TRUE(fuzzHello(content, none) == "accepted", name, " is not accepted: ", fuzzHello(content, none));
      }
      target.corpus.push_back(content);
      ++loaded;
    }
  }
  ::closedir(d);
  return loaded;
}

}  // namespace

int main() {
  std::vector<Target> targets = {{"header", fuzzHeader, {}}, {"hello", fuzzHello, {}}, {"ring", fuzzRing, {}}};
  builtInSeeds(targets);
  const int loaded = loadCorpus(targets);
  Findings findings;
  Rng rng(kSeed);
  long total = 0;
  const auto start = std::chrono::steady_clock::now();
  for (size_t t = 0; t < targets.size(); ++t) {
    Target& target = targets[t];
    std::set<std::string> verdicts;
    std::map<std::string, long> counts;
    for (const Bytes& seed : target.corpus) verdicts.insert(target.run(seed, findings));
    // The valid seeds must pass as valid: else the fuzzer only ever explores rejections.
    if (t == 1) EXPECT_TRUE(verdicts.count("accepted") == 1, "the hello seed was not accepted");
    if (t == 0) EXPECT_TRUE(fuzzHeader(target.corpus[0], findings).rfind("valid", 0) == 0, "the header seed failed");
    const auto targetStart = std::chrono::steady_clock::now();
    for (int i = 0; i < kExecutionsPerTarget[t]; ++i) {
      const Bytes input = mutate(target.corpus[rng.below(target.corpus.size())], target.corpus, rng);
      const std::string verdict = target.run(input, findings);
      ++counts[verdict];
      if (verdicts.insert(verdict).second && target.corpus.size() < kMaxCorpus) target.corpus.push_back(input);
    }
    total += kExecutionsPerTarget[t];
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - targetStart).count();
    std::printf("test_fuzz: %-6s %d executions in %.2f s (%.0f/s), %zu distinct verdicts, corpus %zu\n", target.name,
                kExecutionsPerTarget[t], seconds, kExecutionsPerTarget[t] / seconds, verdicts.size(),
                target.corpus.size());
    if (t == 1) std::printf("test_fuzz:        hellos accepted: %ld\n", counts["accepted"]);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("test_fuzz: %ld executions in %.2f s (%.0f/s) from %d corpus files; %zu findings\n", total, seconds,
              total / seconds, loaded, findings.list.size());
  for (const auto& f : findings.list) std::printf("  finding: %s\n", f.c_str());
  EXPECT_TRUE(findings.list.empty(), findings.list.size(), " findings");
  return pycomm::testing::finish("test_fuzz");
}
