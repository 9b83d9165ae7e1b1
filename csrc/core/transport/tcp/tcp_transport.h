// The TCP transport: one connection per peer, non-blocking sockets and one event-loop thread.
//
// Receives are matched by (peer, seq, slot) for collectives and in arrival order per (peer, tag) for
// point-to-point, as MPI does. A message whose receive is already posted is read straight into the
// caller's buffer; one that arrives first is buffered until its receive is posted. Sends are written
// directly from the posting thread while the socket accepts them and queued for the loop otherwise,
// so a rank's sends never wait on its receives. Likewise the thread waiting for a short message
// reads the peer's socket itself while the loop leaves that socket alone (wait()), and for a short
// while after (Peer::lingering), so neither that message nor the next op's costs a wake-up of the
// loop; everything else is read by the loop.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "../../logging.h"
#include "../../store.h"
#include "../shm/ring.h"
#include "../transport.h"
#include "socket.h"

namespace pycomm::transport::tcp {

struct TcpOptions {
  int rank = 0;
  int size = 1;
  std::string bindHost = "127.0.0.1";
  std::chrono::milliseconds timeout{300000};
  // How long a socket a waiting thread drained stays out of the loop's sight (Peer::lingering) and
  // how often the loop wakes while one does; 0 hands it back at once.
  std::chrono::milliseconds linger{10};
  // At most this many bytes of frames nobody posted a receive for yet (sent ahead, or a peer
  // misbehaving) are held per peer; past it the peer is failed (Config::unexpectedBytes).
  uint64_t unexpectedBytes = uint64_t{4} << 30;
  Logger logger;
};

class TcpTransport final : public Transport {
 public:
  TcpTransport(const TcpOptions& options, Store& store);
  ~TcpTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "tcp"; }

  std::shared_ptr<Request> isend(int peer, const FrameInfo& info, const void* data,
                                 size_t nbytes) override;
  std::shared_ptr<Request> irecv(int peer, const FrameInfo& info, void* data,
                                 size_t nbytes) override;
  // A short receive from one peer over a socket is read by the waiting thread itself, which saves
  // waking the loop thread for it; anything else waits for the loop.
  void wait(const std::shared_ptr<Request>& request, Clock::time_point deadline,
            const std::string& context) override;
  bool cancel(const std::shared_ptr<Request>& request, Clock::time_point deadline) override;
  bool onIoThread() const override;
  void reportFailure(uint64_t seq, const std::string& message) override;
  void beginOp(uint64_t seq, const OpSignature& signature) override;
  std::string takeLateFailure() override;
  std::string peerReportedFailure(uint64_t seq) override;
  void retire(uint64_t seq, bool succeeded) override;
  std::exception_ptr peerFailure(int peer) override;
  void abort(const std::string& reason) override;

  // Gives the connection to `peer`, a rank on this host, a ring in each direction (shm/ring.h);
  // `keepalive` holds their mapping. Both ranks must attach before either moves the pair.
  void attachRings(int peer, shm::Ring out, shm::Ring in, std::shared_ptr<void> keepalive);
  // After the frames already queued, this rank's frames to `peer` go through its ring; the socket
  // only carries doorbells and tells when the peer is gone.
  void moveToSharedMemory(int peer);
  // Frame bytes (headers and payloads) this rank wrote to sockets and to rings.
  uint64_t socketBytesSent() const { return socketBytesSent_.load(); }
  uint64_t ringBytesSent() const { return ringBytesSent_.load(); }
  // Frame bytes this rank read from sockets, and the part of them read by waiting threads rather
  // than by the event loop (wait()).
  uint64_t socketBytesReceived() const { return socketBytesReceived_.load(); }
  uint64_t callerBytesReceived() const { return callerBytesReceived_.load(); }

 private:
  struct OutgoingFrame {
    FrameHeader header;
    const uint8_t* data;
    size_t nbytes;
    size_t written = 0;  // of header + payload
    std::shared_ptr<Request> request;
    std::vector<uint8_t> owned;  // payload owned by the frame (error reports)
  };

  enum class ReadTarget { kNone, kRequest, kBuffer, kErrorText, kDiscard };

  struct Peer {
    int rank = -1;
    Socket socket;
    // Send side, guarded by sendMutex: the posting thread writes directly when the queue is empty.
    std::mutex sendMutex;
    std::deque<OutgoingFrame> sendQueue;
    bool pollingWrite = false;
    std::exception_ptr sendClosed;  // set once the peer failed: later sends fail at once
    shm::Ring ringOut;
    bool writeViaRing = false;  // the move frame went out: later frames go through ringOut
    bool doorbellOwed = false;  // a doorbell waits for this side's move (the socket still has frames)
    int callerReaders = 0;      // threads reading this socket themselves: the loop leaves it alone
    // Once the last of them leaves the socket drained at a frame boundary, the loop goes on leaving
    // it alone for a while (TcpOptions::linger): the next op's messages are usually read by a
    // waiting thread too. Ended at once by a wait for what no thread will read itself (or for a
    // send), a posted receive the loop is to read, or the move to a ring; else by the loop once no
    // thread has read the socket for that long.
    bool lingering = false;
    std::atomic<int64_t> lastCallerRead{0};  // steady clock, ns; when a waiter last left it drained
    int loopReaders = 0;  // threads waiting for a receive from this peer that the loop reads
    // Receive side, touched with recvMutex held only (handleInput): by the loop thread, or by a
    // thread waiting for a message from this peer. target/request are also read under matchMutex_;
    // request is taken (failPeer, abort) with both held, so no reader is writing into its buffer.
    std::mutex recvMutex;
    alignas(8) FrameHeader header{};  // packed; its 8-byte fields are read in place
    size_t headerGot = 0;
    ReadTarget target = ReadTarget::kNone;
    std::shared_ptr<Request> request;
    std::vector<uint8_t> buffer;
    size_t payloadGot = 0;
    shm::Ring ringIn;
    bool readViaRing = false;  // the peer's move frame arrived: its frames come through ringIn
    std::shared_ptr<void> ringMemory;
    // Guarded by matchMutex_.
    std::exception_ptr failure;
    uint64_t unexpectedBytes = 0;  // held in arrived*_ (and being read into a buffer) for this peer
  };

  struct PostedCollective {
    std::shared_ptr<Request> request;
    OpSignature signature;
  };
  struct PostedP2P {
    int peer;  // or kAnyPeer
    uint64_t tag;
    std::shared_ptr<Request> request;
  };
  struct Arrived {  // a message that came before its receive was posted
    FrameHeader header;
    std::vector<uint8_t> payload;
    int peer;
  };
  using CollectiveKey = std::tuple<int, uint64_t, uint32_t>;  // peer, seq, slot

  // A request to complete (error null) or fail, once no lock is held.
  struct Completion {
    std::shared_ptr<Request> request;
    size_t bytes = 0;
    int peer = -1;
    std::exception_ptr error;
  };

  void loop();
  // Runs `body` (input handling for `peer`) on this thread with peer.recvMutex held. Requests it
  // completes are completed, and their callbacks (user code) run, only after the mutex is released
  // (or they are appended to `keep`, for the caller to complete once it is ready). Returns what
  // `body` returns.
  template <typename Body>
  bool handleInput(Peer& peer, Body&& body, std::vector<Completion>* keep = nullptr);
  // Holds peer.recvMutex unless this thread already does (inside handleInput for `peer`): once held,
  // no thread is reading into the buffer of the request being received, so it may be taken.
  static std::unique_lock<std::mutex> lockReceiveSide(Peer& peer);
  // Reads `peer`'s socket on the calling thread until `request` is done or `deadline` passes; returns
  // early, leaving the rest to the loop, if the peer moves to a ring or the transport stops.
  void readOnCallingThread(Peer& peer, Request& request, Clock::time_point deadline);
  // Counts a thread reading `peer`'s socket itself; while any does, the loop does not watch it for
  // input (a wake-up of the loop per message is what reading on the caller saves). The last one to
  // stop may leave it lingering out of the loop's sight (Peer::lingering).
  void setCallerReading(Peer& peer, bool reading, bool linger = false);
  // Counts a thread waiting for what the loop moves: a receive from `peer` that no waiter reads, or
  // (with kAnyPeer, every peer) a send. Ends any linger there, and none starts until it is done.
  void setLoopReading(int peer, bool reading);
  void setLoopReading(Peer& peer, bool reading);
  // Waits for a request that the loop moves, counted by setLoopReading as a reader of `peer` (or of
  // every peer, kAnyPeer).
  void waitForLoop(Request& request, int peer, Clock::time_point deadline, const std::string& context);
  // Ends a linger at once (a posted receive may complete with no thread waiting for it).
  void endLinger(int peer);
  void endLinger(Peer& peer);
  // Whether the loop watches the peer's socket for input. Called with peer.sendMutex held.
  static bool loopWatchesInput(const Peer& peer) { return peer.callerReaders == 0 && !peer.lingering; }
  // Whether a receive from `peer` that the loop is to read is posted: a point-to-point one (from it
  // or from any peer), or a collective one longer than a waiter reads.
  bool receivePostedForLoop(int peer);
  // On the loop thread: gives the loop back the sockets no thread has read for the linger.
  void endIdleLingers();
  // Calls `f` on `peer`'s Peer, or on every peer's for kAnyPeer.
  template <typename F>
  void forPeers(int peer, F&& f) {
    if (peer != kAnyPeer) {
      f(*peers_[peer]);
      return;
    }
    for (auto& p : peers_) {
      if (p) f(*p);
    }
  }
  // Makes the loop's epoll_wait return (a stop, or a timeout to take up).
  void wakeLoop();
  // Called inside handleInput. True when it stopped early because something completed: call again.
  bool handleReadable(Peer& peer);
  bool readSome(Peer& peer);  // false once the socket would block or failed
  void onHeader(Peer& peer);
  void onPayload(Peer& peer);
  void handleWritable(Peer& peer);
  // Queues a frame and writes what it can at once; called with peer.sendMutex held. Returns 0 or an
  // errno; requests whose frames were fully written are appended to `done`.
  int enqueueLocked(Peer& peer, OutgoingFrame frame, std::vector<std::shared_ptr<Request>>& done);
  // After a flush, with peer.sendMutex released: completes the sends it finished and fails the peer
  // if the write failed (errno `err`).
  void afterFlush(Peer& peer, std::vector<std::shared_ptr<Request>>& done, int err);
  // Writes as much of the queue as the socket takes; called with peer.sendMutex held.
  // Requests whose frames were fully written are appended to `done`; returns 0 or an errno.
  int flushLocked(Peer& peer, std::vector<std::shared_ptr<Request>>& done);
  void setPollWrite(Peer& peer, bool enable);
  // Tells epoll what to watch on the peer's socket: input unless a caller reads it or it lingers,
  // output if `pollWrite`. Called with peer.sendMutex held; false if epoll refused (the peer has
  // failed).
  bool watchLocked(Peer& peer, bool pollWrite);
  // One byte on the socket: the peer may be asleep in epoll while its ring has data or space.
  // Called with peer.sendMutex held.
  void ringDoorbellLocked(Peer& peer);
  // Reads doorbells off a peer's socket; the error to fail it with once it is gone, else null.
  std::exception_ptr drainDoorbells(Peer& peer);
  void failPeer(Peer& peer, std::exception_ptr error);
  void closeGracefully(Peer& peer);
  void acceptStranger();

  // Match checks; return an error message or empty. Called with matchMutex_ held.
  std::string checkCollective(int peer, const FrameHeader& header, const PostedCollective& posted,
                              size_t expectedBytes) const;
  std::string checkP2P(int peer, const FrameHeader& header, size_t expectedBytes) const;
  // What an unexpected frame counts against its peer's budget; and the release of an arrived one.
  static uint64_t unexpectedCost(const FrameHeader& header);
  void releaseLocked(const Arrived& arrived);  // called with matchMutex_ held
  // Hands an arrived message to a posted receive, if there is one. Called with matchMutex_ held.
  bool deliverArrivedLocked(Arrived& arrived, std::vector<Completion>& completions);
  // Completes the requests, or, inside handleInput on this thread, hands them to it for later.
  static void finish(std::vector<Completion>& completions);
  // Inside handleInput on this thread: where finish() puts completions, and the peer being read.
  static thread_local std::vector<Completion>* deferredCompletions_;
  static thread_local const Peer* inputPeer_;
  // Copies an arrived payload into a receive and completes it, or fails it with `why`.
  static void deliverLocked(const std::shared_ptr<Request>& request, int peer, const FrameHeader& header,
                            const std::vector<uint8_t>& payload, const std::string& why,
                            std::vector<Completion>& completions);
  // Fails every posted receive of collective `seq`. Called with matchMutex_ held.
  void failPostedSeqLocked(uint64_t seq, const std::exception_ptr& error, std::vector<Completion>& completions);
  // A collective frame whose op this rank runs with another signature: records the failure and
  // fails that op's posted receives. Called with matchMutex_ held.
  void failMismatchLocked(int peer, const FrameHeader& header, const OpSignature& ours,
                          std::vector<Completion>& completions);

  std::string context() const;

  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  const std::chrono::milliseconds linger_;
  const uint64_t unexpectedBudget_;
  const Logger logger_;

  Socket listener_;
  std::vector<std::unique_ptr<Peer>> peers_;
  Socket epoll_;
  Socket wakeup_;  // eventfd: stops the loop, or makes it start taking lingers back
  std::atomic<bool> loopTimed_{false};  // some socket may linger: the loop wakes now and then
  int64_t nextLingerScan_ = 0;          // loop thread only

  std::mutex matchMutex_;
  std::map<CollectiveKey, PostedCollective> postedCollective_;
  std::map<CollectiveKey, Arrived> arrivedCollective_;
  std::deque<PostedP2P> postedP2P_;
  std::deque<Arrived> arrivedP2P_;
  std::map<uint64_t, std::string> failedSeqs_;
  std::map<uint64_t, OpSignature> activeOps_;  // begun here, not yet retired
  std::deque<uint64_t> succeeded_;             // recent ops that completed here, for late errors
  std::string lateFailure_;                    // a peer failed an op that succeeded here
  uint64_t retiredSeq_ = 0;
  std::exception_ptr aborted_;

  std::atomic<uint64_t> socketBytesSent_{0};
  std::atomic<uint64_t> ringBytesSent_{0};
  std::atomic<uint64_t> socketBytesReceived_{0};
  std::atomic<uint64_t> callerBytesReceived_{0};

  std::mutex abortMutex_;
  bool stopped_ = false;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace pycomm::transport::tcp
