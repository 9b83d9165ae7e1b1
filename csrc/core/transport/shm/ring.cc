#include "ring.h"

#include <algorithm>
#include <cstring>

#include "segment.h"

namespace pycomm::transport::shm {

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "ring counters are shared between processes and must be lock-free");

size_t Ring::bytesFor(size_t capacity) { return sizeof(Header) + capacity; }

Ring::Ring(uint8_t* base, size_t capacity)
    : header_(reinterpret_cast<Header*>(base)),
      data_(base + sizeof(Header)),
      capacity_(capacity),
      reserved_(std::min(bytesFor(capacity), kReserveGrain)) {}

std::string Ring::reserveFor(size_t bytes) {
  // Offsets from the ring's start, header included: the first grain came reserved (ring.h).
  const size_t total = sizeof(Header) + capacity_;
  if (reserved_ >= total) return {};
  // The first lap writes from the start up, so what it reaches is head + bytes.
  const uint64_t head = header_->head.load(std::memory_order_relaxed);
  const uint64_t reach = sizeof(Header) + std::min<uint64_t>(capacity_, head + bytes);
  if (reach <= reserved_) return {};
  const size_t wanted = grownReservation(reserved_, static_cast<size_t>(reach), total);
  std::string failed = reservePages(reinterpret_cast<uint8_t*>(header_) + reserved_, wanted - reserved_);
  if (failed.empty()) reserved_ = wanted;
  return failed;
}

size_t Ring::write(const iovec* iov, size_t count, bool& ringConsumer) {
  ringConsumer = false;
  const uint64_t head = header_->head.load(std::memory_order_relaxed);
  size_t space = capacity_ - static_cast<size_t>(head - header_->tail.load());
  if (space == 0) {
    header_->spaceWanted.store(1);
    space = capacity_ - static_cast<size_t>(head - header_->tail.load());
    if (space == 0) return 0;
  }
  size_t written = 0;
  for (size_t i = 0; i < count && written < space; ++i) {
    const auto* src = static_cast<const uint8_t*>(iov[i].iov_base);
    size_t n = std::min(iov[i].iov_len, space - written);
    while (n > 0) {
      const size_t at = static_cast<size_t>((head + written) % capacity_);
      const size_t piece = std::min(n, capacity_ - at);
      std::memcpy(data_ + at, src, piece);
      src += piece;
      n -= piece;
      written += piece;
    }
  }
  if (written == 0) return 0;
  header_->head.store(head + written);
  ringConsumer = header_->dataBell.exchange(1) == 0;
  return written;
}

size_t Ring::read(uint8_t* dst, size_t want, bool& ringProducer) {
  ringProducer = false;
  const uint64_t tail = header_->tail.load(std::memory_order_relaxed);
  size_t available = static_cast<size_t>(header_->head.load() - tail);
  if (available == 0) {
    header_->dataBell.store(0);
    available = static_cast<size_t>(header_->head.load() - tail);
    if (available == 0) return 0;
  }
  const size_t n = std::min(want, available);
  size_t done = 0;
  while (done < n) {
    const size_t at = static_cast<size_t>((tail + done) % capacity_);
    const size_t piece = std::min(n - done, capacity_ - at);
    std::memcpy(dst + done, data_ + at, piece);
    done += piece;
  }
  header_->tail.store(tail + n);
  // A producer waiting for space is told once half the ring is free (or all of it: the consumer
  // reads until the ring is empty, so that point always comes), not after every small read.
  const size_t space = capacity_ - (available - n);
  if (space >= capacity_ / 2 || available == n) {
    ringProducer = header_->spaceWanted.load() != 0 && header_->spaceWanted.exchange(0) != 0;
  }
  return n;
}

}  // namespace pycomm::transport::shm
