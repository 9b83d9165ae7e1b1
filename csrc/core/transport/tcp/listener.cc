#include "listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include "../../error.h"

namespace pycomm::transport::tcp {
namespace {

using Clock = std::chrono::steady_clock;

// accept(2): errors that belong to the one connection being accepted (it was reset, or the
// network under it went away); the next one may be fine.
bool connectionError(int err) {
  return err == ECONNABORTED || err == EPROTO || err == ENETDOWN || err == ENOPROTOOPT || err == EHOSTDOWN ||
         err == ENONET || err == EHOSTUNREACH || err == EOPNOTSUPP || err == ENETUNREACH || err == EPERM;
}

// The process (or the system) is short of something a new socket needs. Retrying at once fails
// the same way, and the listener stays readable, so a loop that only retries spins.
bool resourceError(int err) { return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM; }

// One descriptor the process keeps in reserve, so that with every other one in use it can still
// accept a stranger in order to close it (the classic EMFILE trick). Per process, because the
// descriptor limit is; the mutex makes transports on several threads take turns with it. Never
// destroyed: an event loop may still run while static destructors do.
class SpareDescriptor {
 public:
  static SpareDescriptor& process() {
    static auto* spare = new SpareDescriptor;
    return *spare;
  }

  void reserve() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!spare_.valid()) spare_ = Socket(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  }

  // Gives the spare up, accepts one connection into its slot, closes it, and takes the spare
  // back. False if there was no spare to give up (or a connection was not accepted after all).
  bool acceptAndClose(int listenerFd, std::string* from) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!spare_.valid()) spare_ = Socket(::open("/dev/null", O_RDONLY | O_CLOEXEC));  // freed since it was lost?
    if (!spare_.valid()) return false;
    spare_.close();
    bool accepted = false;
    {
      Socket stranger(::accept4(listenerFd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (stranger.valid()) {
        *from = stranger.peerAddress();
        accepted = true;
      }
    }
    // Another thread may take the slot meanwhile; then there is no spare until one is freed.
    spare_ = Socket(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    return accepted;
  }

 private:
  std::mutex mutex_;
  Socket spare_;  // any descriptor: Socket only owns and closes it
};

struct Pending {
  Socket socket;
  HelloAcceptor hello;
  std::string from;
  Clock::time_point deadline;
};

std::string missingRanks(const std::vector<Socket>& peers, int rank) {
  std::string ranks;
  for (int r = rank + 1; r < static_cast<int>(peers.size()); ++r) {
    if (!peers[r].valid()) ranks += strCat(ranks.empty() ? "" : ", ", r);
  }
  return ranks;
}

int msBetween(Clock::time_point from, Clock::time_point to) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1000));
}

// The accepting side of setup: the pending connections and what happens to them.
class Acceptor {
 public:
  Acceptor(const Socket& listener, const Token& token, int rank, int size, std::vector<Socket>& peers,
           StrangerLog& log, const AcceptLimits& limits, std::chrono::milliseconds groupTimeout)
      : listener_(listener),
        token_(token),
        rank_(rank),
        size_(size),
        peers_(peers),
        log_(log),
        limits_(limits),
        handshakeTimeout_(std::min(limits.handshakeTimeout, groupTimeout)) {}

  int missing() const {
    int n = 0;
    for (int r = rank_ + 1; r < size_; ++r) n += peers_[r].valid() ? 0 : 1;
    return n;
  }

  // One round: wait for something (at most until `deadline`), then accept and read.
  void step(Deadline deadline) {
    Clock::time_point now = Clock::now();
    expire(now);
    // Before computing the wait: a closed entry's past deadline would make every poll return at once.
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const Pending& p) { return !p.socket.valid(); }),
                   pending_.end());
    std::vector<pollfd> fds;
    const bool accepting = now >= pausedUntil_;
    if (accepting) fds.push_back({listener_.fd(), POLLIN, 0});
    const size_t first = fds.size();
    Clock::time_point wake = std::min(deadline, now + std::chrono::seconds(1));
    if (!accepting) wake = std::min(wake, pausedUntil_);
    for (const auto& p : pending_) {
      fds.push_back({p.socket.fd(), POLLIN, 0});
      wake = std::min(wake, p.deadline);
    }
    const int rc = ::poll(fds.data(), fds.size(), msBetween(now, wake));
    if (rc <= 0) return;  // a timeout, or EINTR: the caller checks its deadline and comes back
    // Read before accepting: a peer that answered its challenge is done before new arrivals can
    // push it out as the oldest.
    for (size_t i = first; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read(pending_[i - first]);
    }
    if (accepting && (fds[0].revents & POLLIN)) acceptSome();
  }

  void dropAll(const std::string& why) {
    for (auto& p : pending_) drop(p, why);
    pending_.clear();
  }

 private:
  void drop(Pending& p, const std::string& why) {
    if (!p.socket.valid()) return;
    log_.dropped(p.from, why);
    p.socket.close();
  }

  void expire(Clock::time_point now) {
    for (auto& p : pending_) {
      if (now >= p.deadline) drop(p, strCat("no handshake within ", handshakeTimeout_.count(), " ms"));
    }
  }

  // Closes the connection that has waited longest, to make room for a new one.
  bool dropOldest(const std::string& why) {
    for (auto& p : pending_) {
      if (p.socket.valid()) {
        drop(p, why);
        return true;
      }
    }
    return false;
  }

  size_t live() const {
    return static_cast<size_t>(
        std::count_if(pending_.begin(), pending_.end(), [](const Pending& p) { return p.socket.valid(); }));
  }

  void acceptSome() {
    // A bounded batch: between batches the pending connections are read.
    for (int i = 0; i < 16; ++i) {
      Socket socket(::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!socket.valid()) {
        const int err = errno;
        if (err == EAGAIN || err == EWOULDBLOCK) return;
        if (err == EINTR || connectionError(err)) continue;
        if (resourceError(err) &&
            dropOldest(strCat("closed to make room (accept: ", std::strerror(err), ")"))) {
          continue;
        }
        // Nothing of ours to close: wait for the system to free something.
        log_.note(strCat(" accept on the listening port failed: ", std::strerror(err), "; pausing ",
                         limits_.pause.count(), " ms"));
        pausedUntil_ = Clock::now() + limits_.pause;
        return;
      }
      if (live() >= limits_.maxPending) {
        dropOldest(strCat("closed to make room (", limits_.maxPending, " connections waiting for a handshake)"));
      }
      Pending p{std::move(socket), HelloAcceptor(token_, makeNonce(), rank_, size_), {},
                Clock::now() + handshakeTimeout_};
      p.from = p.socket.peerAddress();
      const Challenge& challenge = p.hello.challenge();
      if (!p.socket.sendNow(&challenge, sizeof challenge)) {
        drop(p, "closed before completing the handshake");
        continue;
      }
      pending_.push_back(std::move(p));
    }
  }

  void read(Pending& p) {
    if (!p.socket.valid()) return;
    uint8_t buffer[sizeof(Hello)];
    const ssize_t n = ::recv(p.socket.fd(), buffer, p.hello.wanted(), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    // A reset is how a stranger that leaves without reading our challenge usually closes.
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return drop(p, "closed before completing the handshake");
    if (n < 0) return drop(p, std::strerror(errno));
    p.hello.feed(buffer, static_cast<size_t>(n));
    if (p.hello.state() == HelloAcceptor::State::kRejected) return drop(p, p.hello.reason());
    if (p.hello.state() != HelloAcceptor::State::kAccepted) return;
    const int peer = p.hello.peer();
    // Never replace a peer: a second connection naming a connected rank is an intruder or a
    // confused rank, and the first one is the group's.
    if (peers_[peer].valid()) return drop(p, "rank already connected");
    const Welcome welcome = p.hello.welcome();
    if (!p.socket.sendNow(&welcome, sizeof welcome)) {
      return drop(p, strCat("closed before rank ", peer, "'s handshake could be answered"));
    }
    peers_[peer] = std::move(p.socket);
  }

  const Socket& listener_;
  const Token& token_;
  const int rank_;
  const int size_;
  std::vector<Socket>& peers_;
  StrangerLog& log_;
  const AcceptLimits limits_;
  const std::chrono::milliseconds handshakeTimeout_;
  std::vector<Pending> pending_;  // oldest first
  Clock::time_point pausedUntil_{};
};

}  // namespace

bool StrangerLog::admit(Clock::time_point now) {
  if (now - windowStart_ >= std::chrono::seconds(1)) {
    flush();
    windowStart_ = now;
    inWindow_ = 0;
  }
  if (inWindow_ < kLinesPerSecond) {
    ++inWindow_;
    return true;
  }
  ++heldBack_;
  return false;
}

void StrangerLog::dropped(const std::string& from, const std::string& why, Clock::time_point now) {
  if (admit(now)) sink_(strCat(" dropped connection from ", from, ": ", why));
}

void StrangerLog::note(const std::string& line, Clock::time_point now) {
  if (admit(now)) sink_(line);
}

void StrangerLog::flush() {
  if (heldBack_ == 0) return;
  sink_(strCat(" ... and ", heldBack_, " more dropped connections (at most ", kLinesPerSecond,
               " are logged a second)"));
  heldBack_ = 0;
}

void acceptPeers(const Socket& listener, const Token& token, int rank, int size, std::vector<Socket>& peers,
                 Deadline deadline, std::chrono::milliseconds timeout, StrangerLog& log, const AcceptLimits& limits) {
  Acceptor acceptor(listener, token, rank, size, peers, log, limits, timeout);
  while (acceptor.missing() > 0) {
    if (Clock::now() >= deadline) {
      acceptor.dropAll("the group timed out");
      log.flush();
      throw TimeoutError(strCat("[rank ", rank, "/", size, "] timed out after ", timeout.count(),
                                " ms waiting for peers ", missingRanks(peers, rank), " to connect"));
    }
    acceptor.step(deadline);
  }
  acceptor.dropAll("no handshake before the group was complete");
  log.flush();
}

void turnAwayStrangers(const Socket& listener, StrangerLog& log) {
  for (int i = 0; i < 64; ++i) {
    Socket stranger(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (stranger.valid()) {
      log.dropped(stranger.peerAddress(), "the group is already connected");
      continue;
    }
    const int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK) return;
    if (err == EINTR || connectionError(err)) continue;
    std::string from;
    if (resourceError(err) && SpareDescriptor::process().acceptAndClose(listener.fd(), &from)) {
      log.dropped(from, strCat("the group is already connected (accepted with the spare descriptor: ",
                               std::strerror(err), ")"));
      continue;
    }
    // No spare either: the listener stays readable, so without this pause the loop would spin.
    log.note(strCat(" accept on the listening port failed: ", std::strerror(err), "; pausing 10 ms"));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return;
  }
}

void reserveSpareDescriptor() { SpareDescriptor::process().reserve(); }

}  // namespace pycomm::transport::tcp
