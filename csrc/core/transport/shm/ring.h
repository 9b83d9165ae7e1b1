// A single-producer, single-consumer byte stream in shared memory between two ranks of one host.
//
// The TCP transport carries a peer's frames through a pair of these once both ranks have mapped
// them: the bytes then move by two memcpys and never through the kernel's socket path. The socket
// stays open as a doorbell (one byte when the other side may be asleep in epoll) and as the
// liveness signal: a peer that dies closes it, exactly as before.
//
// Doorbells follow the Dekker pattern on two flags, all sequentially consistent:
//  - data: the producer publishes `head`, then sets `dataBell`; only if it was clear does it ring.
//    The consumer clears `dataBell` only when it finds the ring empty, then looks at `head` again.
//  - space: a producer that finds the ring full sets `spaceWanted`, then looks at `tail` again;
//    the consumer publishes `tail`, then takes `spaceWanted` and rings if it was set.
// Either the waiting side sees the other's progress, or the other side sees its flag and rings.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <string>
#include <cstddef>
#include <cstdint>

namespace pycomm::transport::shm {

class Ring {
 public:
  // Shared-memory bytes for one ring of `capacity` data bytes (header included).
  static size_t bytesFor(size_t capacity);

  Ring() = default;
  // `base` is bytesFor(capacity) bytes of zero-filled shared memory (a fresh segment is).
  Ring(uint8_t* base, size_t capacity);

  bool valid() const { return header_ != nullptr; }

  // Whoever lays a ring out reserves its first kReserveGrain bytes (header included) before anyone
  // touches it: its consumer polls the header (segment.h).
  // Producer, before write(): reserves the pages the next `bytes` reach, in the ring's first lap
  // (later laps reuse them). Empty when done, else why not (/dev/shm full).
  std::string reserveFor(size_t bytes);
  // Producer. Copies as much of `iov` as fits and returns the byte count; `ringConsumer` is set
  // when the consumer may be asleep and must be told.
  size_t write(const iovec* iov, size_t count, bool& ringConsumer);
  // Consumer. Copies up to `want` bytes; 0 means the ring is empty and the producer will ring.
  // `ringProducer` is set when the producer waits for space and must be told.
  size_t read(uint8_t* dst, size_t want, bool& ringProducer);

 private:
  struct Header {
    alignas(64) std::atomic<uint64_t> head;  // bytes produced so far; the producer's
    alignas(64) std::atomic<uint64_t> tail;  // bytes consumed so far; the consumer's
    alignas(64) std::atomic<uint32_t> dataBell;
    alignas(64) std::atomic<uint32_t> spaceWanted;
  };

  Header* header_ = nullptr;
  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
  size_t reserved_ = 0;  // the producer's: bytes from the ring's start reserved so far
};

}  // namespace pycomm::transport::shm
