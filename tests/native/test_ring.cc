// The shared-memory byte ring between a producer and a consumer thread, with a small capacity that
// is not a power of two: every byte of a pseudo-random stream must arrive in order through writes
// of 1-3 pieces and reads of random sizes (wrapping around the end many times), and no doorbell may
// be lost. A side waits for its doorbell with a timeout; a lost wake-up shows up as that timeout.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <thread>

#include "core/transport/shm/ring.h"
#include "harness.h"

namespace {

using pycomm::transport::shm::Ring;

// One doorbell: an eventfd. wait() returns false if nobody rang within the timeout.
struct Doorbell {
  int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ~Doorbell() { ::close(fd); }
  void ring() const {
    const uint64_t one = 1;
    (void)!::write(fd, &one, sizeof one);
  }
  bool wait() const {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) != 1) return false;
    uint64_t value;
    (void)!::read(fd, &value, sizeof value);
    return true;
  }
};

uint8_t streamByte(uint64_t i) { return static_cast<uint8_t>((i * 2654435761u) >> 13); }

void checkStream(size_t capacity, uint64_t total, unsigned seed) {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  const size_t bytes = (Ring::bytesFor(capacity) + 63) / 64 * 64;
  std::unique_ptr<uint8_t, Free> memory(static_cast<uint8_t*>(std::aligned_alloc(64, bytes)));
  std::fill(memory.get(), memory.get() + bytes, 0);  // a fresh segment is zero-filled
  Ring producerSide(memory.get(), capacity);
  Ring consumerSide(memory.get(), capacity);
  Doorbell data, space;
  bool producerTimedOut = false;

  std::thread producer([&] {
    std::mt19937_64 rng(seed);
    std::vector<uint8_t> chunk;
    uint64_t sent = 0;
    while (sent < total) {
      const size_t n = std::min<uint64_t>(total - sent, 1 + rng() % (2 * capacity));
      chunk.resize(n);
      for (size_t i = 0; i < n; ++i) chunk[i] = streamByte(sent + i);
      size_t done = 0;
      while (done < n) {
        // Up to three pieces, as frames are written (header, payload, next header).
        iovec iov[3];
        size_t count = 0, at = done;
        while (count < 3 && at < n) {
          const size_t piece = std::min<size_t>(n - at, 1 + rng() % capacity);
          iov[count++] = {chunk.data() + at, piece};
          at += piece;
        }
        bool ringConsumer = false;
        const size_t w = producerSide.write(iov, count, ringConsumer);
        if (ringConsumer) data.ring();
        if (w == 0 && !space.wait()) {
          producerTimedOut = true;
          return;
        }
        done += w;
      }
      sent += n;
    }
  });

  std::mt19937_64 rng(seed + 1);
  std::vector<uint8_t> buffer(2 * capacity);
  uint64_t received = 0;
  bool ok = true;
  while (received < total && ok) {
    bool ringProducer = false;
    const size_t n = consumerSide.read(buffer.data(), 1 + rng() % buffer.size(), ringProducer);
    if (ringProducer) space.ring();
    if (n == 0) {
      if (!data.wait()) {
        EXPECT_TRUE(false, "consumer waited 5 s for data at byte ", received, " of ", total, " (lost doorbell)");
        ok = false;
      }
      continue;
    }
    for (size_t i = 0; i < n && ok; ++i) {
      if (buffer[i] != streamByte(received + i)) {
        EXPECT_TRUE(false, "byte ", received + i, " corrupted (capacity ", capacity, ")");
        ok = false;
      }
    }
    received += n;
  }
  if (!ok) space.ring();  // let a producer waiting for space see the end
  producer.join();
  EXPECT_TRUE(!producerTimedOut, "producer waited 5 s for space (lost doorbell), capacity ", capacity);
}

}  // namespace

int main() {
  for (unsigned seed = 0; seed < 4; ++seed) {
    checkStream(1000, 10'000'000, seed);  // many wrap-arounds of a small ring
    checkStream(4096 + 7, 10'000'000, seed);
  }
  checkStream(2 << 20, 100'000'000, 9);
  const int failed = pycomm::testing::failures();
  std::printf("%s: %d failure(s)\n", failed ? "FAILED" : "ok", failed);
  return failed ? 1 : 0;
}
