// Group setup over TCP, without torch: connectTo's deadline when SYNs go unanswered.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/transport/tcp/socket.h"
#include "harness.h"

namespace {

using namespace pycomm;
using namespace pycomm::transport::tcp;
using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
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

}  // namespace

int main() {
  testConnectHonoursItsDeadline();
  return pycomm::testing::finish("test_handshake");
}
