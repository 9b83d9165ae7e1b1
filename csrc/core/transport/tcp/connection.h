// The connection to one peer: its socket (and, once both sides moved, a shared-memory ring each way
// that carries the frames while the socket carries only doorbells), the frame being read from it,
// and the frames queued to it. Framing only: what an arrived frame means is the matcher's business,
// who may read the socket is ReadOwnership's, and when to read is TcpTransport's.
//
// Three locks, each for one side, taken in this order when nested: recvMutex, sendMutex, watchMutex
// (and the matcher's lock after any of them).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../frame.h"
#include "../request.h"
#include "../shm/ring.h"
#include "event_loop.h"
#include "read_ownership.h"
#include "socket.h"

namespace pycomm::transport::tcp {

// Bytes of a frame that arrived before its receive was posted. Its allocator leaves them
// uninitialised: the socket overwrites every byte before anything reads them, and zero-filling a
// 512 KiB chunk first cost a memset as long as the copy out of it.
template <typename T>
struct UninitialisedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitialisedAllocator<U>;
  };
  UninitialisedAllocator() = default;
  template <typename U>
  UninitialisedAllocator(const UninitialisedAllocator<U>&) noexcept {}
  // Only the no-argument construct: allocator_traits constructs with arguments by placement new.
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;  // default-initialised: no zeros for bytes
  }
};
using FrameBytes = std::vector<uint8_t, UninitialisedAllocator<uint8_t>>;

// Frame bytes (headers and payloads) by the path they took, for the whole transport.
struct WireCounters {
  std::atomic<uint64_t> socketBytesSent{0};
  std::atomic<uint64_t> ringBytesSent{0};
  std::atomic<uint64_t> socketBytesReceived{0};
  std::atomic<uint64_t> callerBytesReceived{0};  // of those, read by waiting threads, not the loop
};

struct OutgoingFrame {
  FrameHeader header;
  const uint8_t* data;
  size_t nbytes;
  size_t written = 0;  // of header + payload
  std::shared_ptr<Request> request;
  std::vector<uint8_t> owned;  // payload owned by the frame (error reports)
};

// Where the payload of the frame being read goes.
enum class ReadTarget { kNone, kRequest, kBuffer, kErrorText, kDiscard };

struct Connection {
  Connection(int rank, Socket socket, EventLoop& loop, WireCounters& counters)
      : rank(rank), socket(std::move(socket)), loop(loop), counters(counters) {}
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const int rank;
  // Closed only with recvMutex, sendMutex and watchMutex held (abort): never a reused fd number.
  Socket socket;
  EventLoop& loop;
  WireCounters& counters;

  // --- Send side, guarded by sendMutex: the posting thread writes directly when the queue is empty.
  std::mutex sendMutex;
  std::deque<OutgoingFrame> sendQueue;
  std::exception_ptr sendClosed;  // set once the peer failed: later sends fail at once
  shm::Ring ringOut;
  bool writeViaRing = false;  // the move frame went out: later frames go through ringOut
  std::string ringFailure;    // why ringOut could not reserve its pages (flushLocked's ENOSPC)
  bool doorbellOwed = false;  // a doorbell waits for this side's move (the socket still has frames)

  // Queues a frame and writes what it can at once; with sendMutex held. Returns 0 or an errno;
  // requests whose frames were fully written are appended to `done`.
  int enqueueLocked(OutgoingFrame frame, std::vector<std::shared_ptr<Request>>& done);
  // Writes as much of the queue as the socket (or ring) takes; with sendMutex held. Requests whose
  // frames were fully written are appended to `done`; returns 0 or an errno.
  int flushLocked(std::vector<std::shared_ptr<Request>>& done);
  // One byte on the socket: the peer may be asleep in epoll while its ring has data or space. With
  // sendMutex held.
  void ringDoorbellLocked();
  // Fails every queued send with `error` (appended to `completions` by the caller's type) and makes
  // later sends fail at once. With sendMutex held.
  template <typename Completions>
  void closeSendsLocked(const std::exception_ptr& error, Completions& completions) {
    sendClosed = error;
    for (auto& frame : sendQueue) {
      if (frame.request) completions.push_back({frame.request, rank, error});
    }
    sendQueue.clear();
  }

  // --- What epoll watches on the socket, guarded by watchMutex: input while ownership says the
  // loop reads it, output while pollingWrite. One lock for both, because one epoll_ctl sets both;
  // not sendMutex, so that a thread taking or handing back the socket for reading never waits for
  // a sender's write.
  std::mutex watchMutex;
  bool pollingWrite = false;  // written with sendMutex and watchMutex held: either lock reads it
  ReadOwnership ownership;

  // Tells epoll what to watch, with output if `pollWrite`; with watchMutex held. False if epoll
  // refused (the peer has failed: it is no longer watched at all, and nothing is lost).
  bool watchLocked(bool pollWrite);
  // Starts or stops watching for output (if not so already); with sendMutex held (watchMutex is
  // taken here).
  void setPollWrite(bool enable);
  // Runs `transition` on the ownership and updates epoll if what the loop watches changed (not once
  // the loop stops: the socket may be closed).
  template <typename Transition>
  void changeOwnership(Transition&& transition) {
    std::lock_guard<std::mutex> lock(watchMutex);
    const bool watched = ownership.loopWatches();
    transition(ownership);
    if (watched != ownership.loopWatches() && !loop.stopping()) (void)watchLocked(pollingWrite);
  }

  // --- Receive side, touched with recvMutex held only (TcpTransport::handleInput): by the loop
  // thread, or by a thread waiting for a message from this peer. `request` is also read under the
  // matcher's lock; it is set (claimed) and taken (failPeer, abort) with both held, so no reader is
  // writing into its buffer when it is taken.
  std::mutex recvMutex;
  alignas(8) FrameHeader header{};  // packed; its 8-byte fields are read in place
  size_t headerGot = 0;
  ReadTarget target = ReadTarget::kNone;
  std::shared_ptr<Request> request;
  FrameBytes buffer;
  size_t payloadGot = 0;
  // Attached with recvMutex and sendMutex held, before either side moves.
  shm::Ring ringIn;
  bool readViaRing = false;  // the peer's move frame arrived: its frames come through ringIn
  std::shared_ptr<void> ringMemory;
  std::atomic<uint64_t> pongs{0};  // kPong frames from the peer (TcpTransport::judgeTimeout)
  int64_t lastPingAnsweredNs = 0;  // steady clock: pings are answered at most every 10 ms

  // What one read did.
  enum class Read {
    kBlocked,   // nothing to read now (socket would block, ring empty)
    kProgress,  // some bytes of a header or payload
    kHeader,    // the header is complete: decide the target, then read on
    kPayload,   // the payload is complete (headerGot, payloadGot still tell its size)
    kFailed,    // the connection failed or closed: *error says how
  };
  // Reads what the socket (or ring) holds of the current frame, at most once; with recvMutex held.
  Read readSome(const std::string& context, std::exception_ptr* error);
  // Reads doorbells off the socket; the error to fail the peer with once it is gone, else null.
  std::exception_ptr drainDoorbells(const std::string& context);
  // FIN after whatever the kernel still has to send, then close.
  void closeGracefully();
};

// Where unwanted bytes go. Per thread: the loop thread and waiting callers read different peers at once.
uint8_t* discardBuffer(size_t& size);

// The errors of a connection that ended, and any other message, as RemoteError.
std::exception_ptr remoteError(const std::string& message);
std::exception_ptr connectionClosed(const std::string& context, int peer);
std::exception_ptr connectionFailed(const std::string& context, int peer, int err);

}  // namespace pycomm::transport::tcp
