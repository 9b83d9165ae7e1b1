#include "event_loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "../../error.h"

namespace pycomm::transport::tcp {
namespace {

// The loop this thread runs, if it is a transport's event-loop thread: what other threads read is
// counted apart, and a wait on a loop thread never reads a socket itself (caller_read.cc).
thread_local const void* loopOwner = nullptr;

constexpr int kMaxEvents = 64;

}  // namespace

EventLoop::EventLoop(std::chrono::milliseconds tick, const Logger& logger, std::string context)
    : tick_(tick), logger_(logger), context_(std::move(context)) {
  epoll_ = Socket(epoll_create1(EPOLL_CLOEXEC));
  wakeup_ = Socket(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  PYCOMM_CHECK(epoll_.valid() && wakeup_.valid(), InternalError, "epoll/eventfd: ", std::strerror(errno));
  add(wakeup_.fd(), kWakeupTag);
}

EventLoop::~EventLoop() {
  stop();
  // A stop from the loop thread itself (a request's callback) could not join it.
  if (thread_.joinable()) thread_.detach();
}

void EventLoop::add(int fd, uint64_t tag) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = tag;
  PYCOMM_CHECK(epoll_ctl(epoll_.fd(), EPOLL_CTL_ADD, fd, &ev) == 0, InternalError, "epoll_ctl: ", std::strerror(errno));
}

bool EventLoop::modify(int fd, uint64_t tag, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = tag;
  return epoll_ctl(epoll_.fd(), EPOLL_CTL_MOD, fd, &ev) == 0;
}

void EventLoop::remove(int fd) { epoll_ctl(epoll_.fd(), EPOLL_CTL_DEL, fd, nullptr); }

void EventLoop::start(std::function<void(uint64_t, uint32_t)> onEvents, std::function<void()> onTick) {
  onEvents_ = std::move(onEvents);
  onTick_ = std::move(onTick);
  thread_ = std::thread([this] { run(); });
}

void EventLoop::wake() {
  const uint64_t one = 1;
  (void)!::write(wakeup_.fd(), &one, sizeof one);
}

void EventLoop::stop() {
  stopping_.store(true);
  wake();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

bool EventLoop::onLoopThread() const { return loopOwner == this; }

bool EventLoop::onAnyLoopThread() { return loopOwner != nullptr; }

void EventLoop::run() {
  loopOwner = this;
  epoll_event events[kMaxEvents];
  while (!stopping_.load()) {
    // While ticking (sockets linger out of sight) the loop wakes now and then to take back idle ones.
    const bool ticking = ticking_.load();
    int n = epoll_wait(epoll_.fd(), events, kMaxEvents,
                       ticking ? static_cast<int>(std::max<int64_t>(1, tick_.count())) : -1);
    if (ticking) onTick_();
    if (n < 0) {
      if (errno == EINTR) continue;
      logger_.warn(strCat(context_, " event loop stopped: epoll_wait: ", std::strerror(errno)));
      return;
    }
    for (int i = 0; i < n && !stopping_.load(); ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kWakeupTag) {
        uint64_t value;
        (void)!::read(wakeup_.fd(), &value, sizeof value);
        continue;
      }
      onEvents_(tag, events[i].events);
    }
  }
}

}  // namespace pycomm::transport::tcp
