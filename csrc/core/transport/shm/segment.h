// A POSIX shared-memory segment, mapped for the object's lifetime.
//
// The name comes from the group's secret token; the rank that comes first creates it and the others
// open it, so that no rank waits for another to create it; once every rank has mapped it the ranks
// unlink the name, so nothing is left in /dev/shm even if a process is killed later. The creator's
// destructor unlinks too, for a group whose setup failed before that point.
//
// A fresh segment takes no memory: the ranks reserve its pages themselves (reservePages), each the
// part it writes, so that a group does not reserve all of its slots and rings on one rank at setup
// (17 ms of a 29 ms setup at world 4). A touch of a page that tmpfs cannot back raises SIGBUS; a
// reservation that cannot be had fails with an error instead. create() checks that /dev/shm has
// room for the whole segment now; where the kernel cannot reserve part of a mapping
// (MADV_POPULATE_WRITE, Linux 5.14), create() reserves the whole segment instead, as it always did.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pycomm::transport::shm {

// Reserves the pages of [from, from + bytes) of a shared mapping (rounded out to whole pages), so
// that touching them cannot raise SIGBUS: empty when done, else why not (/dev/shm is full, say).
std::string reservePages(void* from, size_t bytes);
// Whether reservePages reserves anything here; if not, create() reserves a segment whole.
bool reservesPartly();
// How far a writer that has reserved `reserved` bytes of a region of `limit` reserves once it must
// reach `reach`: whole 64 KiB grains, at least double what it has (so that a run of small writes
// does not reserve page by page), at most the region.
constexpr size_t kReserveGrain = 64 * 1024;
size_t grownReservation(size_t reserved, size_t reach, size_t limit);

class Segment {
 public:
  // Creates the segment `name` of `bytes` (*created = true) or, where it exists, opens it. `name`
  // is derived from the group (so every rank can remove it if the creator dies early). Ranks that
  // each created a segment of that name were in different /dev/shm: their group counts creators.
  static Segment createOrOpen(const std::string& name, size_t bytes, bool* created);
  Segment() = default;
  ~Segment();
  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  uint8_t* data() const { return static_cast<uint8_t*>(base_); }
  // Removes the name (the creator, once every peer has mapped the segment). Idempotent.
  void unlink();
  // Removes a segment by name, if it exists: cleanup after a setup that failed half way.
  static void unlinkName(const std::string& name);

 private:
  void release();
  static Segment create(int fd, const std::string& name, size_t bytes);
  static Segment open(const std::string& name, size_t bytes);

  void* base_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  bool owner_ = false;  // the creator unlinks
};

}  // namespace pycomm::transport::shm
