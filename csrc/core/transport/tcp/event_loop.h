// The event loop of a TCP transport: one thread in epoll_wait over the group's sockets, an eventfd
// that wakes it, and, while asked for (ticking), a wake-up every tick so its owner can do timed
// work (taking back sockets that lingered out of the loop's sight). Only the loop itself lives here:
// what a socket's events mean is the handler's business.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "../../logging.h"
#include "socket.h"

namespace pycomm::transport::tcp {

class EventLoop {
 public:
  // Tags the handler never sees.
  static constexpr uint64_t kWakeupTag = ~uint64_t{0};

  // `tick`: how often the loop wakes while ticking; `logger` and `context` for the loop's own failure.
  EventLoop(std::chrono::milliseconds tick, const Logger& logger, std::string context);
  // Stops the loop (see stop()).
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Watches `fd` for input; its events reach the handler with `tag`. Throws if epoll refuses.
  void add(int fd, uint64_t tag);
  // Watches `fd` for `events` (EPOLLIN, EPOLLOUT) from now on; false if epoll refused.
  bool modify(int fd, uint64_t tag, uint32_t events);
  void remove(int fd);

  // Starts the thread: `onEvents(tag, events)` for each ready socket, `onTick()` on each wake-up
  // while ticking. Both run on the loop thread only.
  void start(std::function<void(uint64_t, uint32_t)> onEvents, std::function<void()> onTick);
  // Makes epoll_wait return (a stop, or ticking to take up).
  void wake();
  // Asks for ticks; true if the loop was not ticking, so it may be asleep for good: wake() it then.
  bool startTicking() { return !ticking_.exchange(true); }
  // On the loop thread, in onTick: no more ticks unless asked again. Cleared before the owner looks
  // at what needs ticks, so a thread that asks after that sees it clear and wakes the loop.
  void stopTicking() { ticking_.store(false); }

  // Ends the loop at its next wake-up and joins it, unless called on the loop thread itself.
  void stop();
  bool stopping() const { return stopping_.load(); }

  // Whether the calling thread runs this loop; and whether it runs any transport's loop.
  bool onLoopThread() const;
  static bool onAnyLoopThread();

 private:
  void run();

  const std::chrono::milliseconds tick_;
  const Logger logger_;
  const std::string context_;
  Socket epoll_;
  Socket wakeup_;  // eventfd
  std::atomic<bool> ticking_{false};
  std::atomic<bool> stopping_{false};
  std::function<void(uint64_t, uint32_t)> onEvents_;
  std::function<void()> onTick_;
  std::thread thread_;
};

}  // namespace pycomm::transport::tcp
