// A rank's listening port, against strangers who would keep the group from forming or the event
// loop from running.
//
// During setup every accepted connection gets a handshake deadline of a few seconds (never the
// group's timeout), their number is capped, and when accept fails for lack of descriptors or
// memory the oldest pending connection is closed to make room, or accepting pauses briefly when
// there is none: the loop never spins and the real peer, waiting in the backlog, gets its turn.
// After setup every connection is a stranger; one spare descriptor held by the process lets the
// event loop accept and close it even when the process has no descriptor left, which a
// level-triggered epoll on the listener would otherwise report again at once, forever.
// Warnings about dropped connections are rate-limited so a flood cannot flood the log.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hello.h"
#include "socket.h"

namespace pycomm::transport::tcp {

// "dropped connection from <address>: <why>" lines, at most kLinesPerSecond in each one-second
// window; the rest are counted, and the count is logged as "... and K more dropped connections"
// when a later window opens, on flush(), or on destruction.
class StrangerLog {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kLinesPerSecond = 20;

  explicit StrangerLog(std::function<void(const std::string&)> sink) : sink_(std::move(sink)) {}
  ~StrangerLog() { flush(); }
  StrangerLog(const StrangerLog&) = delete;
  StrangerLog& operator=(const StrangerLog&) = delete;

  void dropped(const std::string& from, const std::string& why, Clock::time_point now = Clock::now());
  // Anything else worth a line (a failing accept), under the same limit.
  void note(const std::string& line, Clock::time_point now = Clock::now());
  void flush();

 private:
  bool admit(Clock::time_point now);

  std::function<void(const std::string&)> sink_;
  Clock::time_point windowStart_{};
  int inWindow_ = 0;
  uint64_t heldBack_ = 0;
};

struct AcceptLimits {
  // A real peer sends its hello within milliseconds of the challenge; a few seconds covers a
  // loaded machine without letting silent strangers pile up.
  std::chrono::milliseconds handshakeTimeout{2500};
  size_t maxPending = 64;
  // How long accepting pauses after a resource error with no pending connection to close.
  std::chrono::milliseconds pause{50};
};

// Accepts on `listener` until every higher rank has proven membership (peers[rank] set for each),
// dropping everything else. Throws TimeoutError naming the missing ranks at `deadline`.
void acceptPeers(const Socket& listener, const Token& token, int rank, int size, std::vector<Socket>& peers,
                 Deadline deadline, std::chrono::milliseconds timeout, StrangerLog& log,
                 const AcceptLimits& limits = {});

// After setup: accepts and closes what waits on `listener` (a bounded batch, so the event loop
// gets back to its peers). Never blocks or spins: out of descriptors, it uses the process's spare
// one; without that, it sleeps a few milliseconds.
void turnAwayStrangers(const Socket& listener, StrangerLog& log);

// Opens the process's spare descriptor if it is not open: called at setup, before strangers can
// take every descriptor.
void reserveSpareDescriptor();

}  // namespace pycomm::transport::tcp
