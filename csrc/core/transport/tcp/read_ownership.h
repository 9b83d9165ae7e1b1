// Who reads one peer's socket now: the event loop, or threads waiting for a short message that read
// it themselves (callers), or, for a short while after the last of them drained it, nobody
// (lingering). The rules of the caller-read path live here, in one place; TcpTransport::wait and
// the loop drive the transitions, Connection turns the answer into what epoll watches.
//
//   loop      The loop watches the socket for input and reads it.
//   callers   One or more waiting threads read it themselves (a wake-up of the loop per message is
//             what reading on the caller saves): the loop does not watch it for input.
//   lingering The last caller left the socket drained at a frame boundary; the loop goes on leaving
//             it alone for a while (TcpOptions::linger), since the next op's messages are usually
//             read by a waiting thread too. Ended at once by a wait for what no thread will read
//             itself (or for a send), a posted receive the loop is to read, or the move to a ring;
//             else by the loop once no thread has read the socket for that long.
//
// A linger is a window that callers may enter and leave: while one reads inside it, the window stays
// open (the loop keeps ticking for it), and whether it goes on is decided again when the last leaves.
// No linger starts while a thread waits for what the loop reads from this peer (loop waiters).
//
// Not thread-safe: used with the connection's watchMutex held, except noteCallerRead (atomic).
#pragma once

#include <atomic>
#include <cstdint>

namespace pycomm::transport::tcp {

class ReadOwnership {
 public:
  enum class Reader { kLoop, kCallers, kLingering };

  Reader reader() const { return callers_ > 0 ? Reader::kCallers : lingering_ ? Reader::kLingering : Reader::kLoop; }
  // Whether the loop watches the socket for input.
  bool loopWatches() const { return reader() == Reader::kLoop; }

  // A waiting thread starts reading the socket itself.
  void callerEnters() { ++callers_; }
  // It stops. The last one to leave starts (or goes on with) a linger if it left the socket drained
  // (`drained`) and `lingerAllowed` (the linger is not 0), no thread waits for the loop here, and
  // `loopHasReceive()` says no receive the loop is to read is posted (asked only then: it takes the
  // matcher's lock). True if a linger is on now: the caller notes the time and makes the loop tick.
  template <typename LoopHasReceive>
  bool callerLeaves(bool drained, bool lingerAllowed, LoopHasReceive&& loopHasReceive) {
    --callers_;
    if (callers_ > 0) return false;
    lingering_ = drained && lingerAllowed && loopWaiters_ == 0 && !loopHasReceive();
    return lingering_;
  }

  // A thread waits for what the loop moves from (or to) this peer: any linger ends, none starts
  // until it is done.
  void loopWaitStarts() {
    ++loopWaiters_;
    lingering_ = false;
  }
  void loopWaitEnds() { --loopWaiters_; }

  // Ends a linger at once; false if there was none.
  bool endLinger() {
    if (!lingering_) return false;
    lingering_ = false;
    return true;
  }

  // On the loop's tick, at steady time `now` (ns): a linger no caller has renewed for `linger` ns
  // ends (kEnded); one still in use is kept (kKept).
  enum class Expiry { kNone, kKept, kEnded };
  Expiry expire(int64_t now, int64_t linger) {
    if (!lingering_) return Expiry::kNone;
    if (callers_ > 0 || now - lastCallerRead_.load(std::memory_order_relaxed) < linger) return Expiry::kKept;
    lingering_ = false;
    return Expiry::kEnded;
  }

  // A waiting thread left the socket drained at steady time `now` (ns): a linger goes on from here.
  // Needs no lock: a waiter that found its message at once notes it without taking the socket.
  void noteCallerRead(int64_t now) { lastCallerRead_.store(now, std::memory_order_relaxed); }

 private:
  int callers_ = 0;         // threads reading the socket themselves now
  bool lingering_ = false;  // the linger window is open
  int loopWaiters_ = 0;     // threads waiting for a receive from this peer that the loop reads
  std::atomic<int64_t> lastCallerRead_{0};  // steady clock, ns; when a waiter last left it drained
};

}  // namespace pycomm::transport::tcp
