#include "segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "../../error.h"

namespace pycomm::transport::shm {
namespace {

void* mapFd(int fd, size_t bytes, const std::string& name) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  PYCOMM_CHECK(base != MAP_FAILED, RemoteError, "mmap of shared memory ", name, " (", bytes, " B) failed: ",
               std::strerror(errno));
  return base;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack the name
#endif

constexpr size_t kPage = 4096;

}  // namespace

bool reservesPartly() {
  // Probed once on a page of anonymous shared memory, which tmpfs backs as it backs a segment.
  static const bool supported = [] {
    void* page = ::mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) return false;
    const bool ok = ::madvise(page, kPage, MADV_POPULATE_WRITE) == 0;
    ::munmap(page, kPage);
    return ok;
  }();
  return supported;
}

std::string reservePages(void* from, size_t bytes) {
  if (bytes == 0 || !reservesPartly()) return {};  // without it, create() reserved everything
  const auto start = reinterpret_cast<uintptr_t>(from) & ~uintptr_t{kPage - 1};
  const auto end = (reinterpret_cast<uintptr_t>(from) + bytes + kPage - 1) & ~uintptr_t{kPage - 1};
  if (::madvise(reinterpret_cast<void*>(start), end - start, MADV_POPULATE_WRITE) == 0) return {};
  // EFAULT: a touch would have raised SIGBUS, which on tmpfs means it is full.
  const int err = errno;
  return strCat("cannot reserve ", end - start, " B of shared memory: ", std::strerror(err),
                err == EFAULT || err == ENOMEM ? " (is /dev/shm full?)" : "");
}

size_t grownReservation(size_t reserved, size_t reach, size_t limit) {
  const size_t grains = (std::min(reach, limit) + kReserveGrain - 1) / kReserveGrain;
  return std::min(limit, std::max(grains * kReserveGrain, 2 * reserved));
}

void Segment::unlinkName(const std::string& name) { ::shm_unlink(name.c_str()); }

Segment Segment::createOrOpen(const std::string& name, size_t bytes, bool* created) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  *created = fd >= 0;
  if (fd >= 0) return create(fd, name, bytes);
  PYCOMM_CHECK(errno == EEXIST, RemoteError, "shm_open(", name, ") failed: ", std::strerror(errno));
  return open(name, bytes);
}

Segment Segment::create(int fd, const std::string& name, size_t bytes) {
  Segment s;
  s.name_ = name;
  s.owner_ = true;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    ::close(fd);
    ::shm_unlink(s.name_.c_str());
    throw RemoteError(strCat("cannot size shared memory ", s.name_, " to ", bytes, " B: ", std::strerror(err),
                             " (is /dev/shm large enough?)"));
  }
  // A /dev/shm without room for the whole segment fails setup with this message (and the group
  // runs over its connections) rather than a later reservation. Where pages cannot be reserved
  // as they are first written, they all are now, or some later op would meet a SIGBUS.
  std::string noRoom;
  if (reservesPartly()) {
    struct statvfs fs {};
    if (::fstatvfs(fd, &fs) == 0 && fs.f_blocks > 0 &&
        static_cast<unsigned long long>(fs.f_bavail) * fs.f_frsize < bytes) {
      noRoom = strCat(static_cast<unsigned long long>(fs.f_bavail) * fs.f_frsize, " B are free");
    }
  } else if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err == ENOSPC || err == EFBIG) {
    noRoom = std::strerror(err);  // (filesystems without fallocate: skipped)
  }
  if (!noRoom.empty()) {
    ::close(fd);
    ::shm_unlink(s.name_.c_str());
    throw RemoteError(strCat("cannot reserve ", bytes, " B of shared memory for ", s.name_, ": ", noRoom,
                             " (is /dev/shm large enough?)"));
  }
  try {
    s.base_ = mapFd(fd, bytes, s.name_);
  } catch (...) {
    ::close(fd);
    ::shm_unlink(s.name_.c_str());
    throw;
  }
  ::close(fd);
  s.size_ = bytes;
  return s;
}

Segment Segment::open(const std::string& name, size_t bytes) {
  Segment s;
  s.name_ = name;
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  PYCOMM_CHECK(fd >= 0, RemoteError, "shm_open(", name, ") failed: ", std::strerror(errno));
  // Empty: the creator has not sized it yet, and sizes it to the same length. A shorter file (not
  // the creator's segment, or one cut short) would fault with SIGBUS on the first touch past its
  // end: refuse it here.
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size == 0 && ::ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    st.st_size = static_cast<off_t>(bytes);
  }
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    ::close(fd);
    throw RemoteError(strCat("shared memory ", name, " has ", st.st_size, " B, expected ", bytes, " B"));
  }
  try {
    s.base_ = mapFd(fd, bytes, name);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  s.size_ = bytes;
  return s;
}

Segment::~Segment() { release(); }

Segment::Segment(Segment&& other) noexcept { *this = std::move(other); }

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    release();
    base_ = other.base_;
    size_ = other.size_;
    name_ = std::move(other.name_);
    owner_ = other.owner_;
    other.base_ = nullptr;
    other.size_ = 0;
    other.owner_ = false;
  }
  return *this;
}

void Segment::unlink() {
  if (owner_) {
    ::shm_unlink(name_.c_str());
    owner_ = false;
  }
}

void Segment::release() {
  unlink();
  if (base_ != nullptr) {
    ::munmap(base_, size_);
    base_ = nullptr;
  }
}

}  // namespace pycomm::transport::shm
