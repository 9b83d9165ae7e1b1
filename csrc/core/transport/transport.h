// The interface algorithms see: post a send or a receive of one framed message to or from a peer,
// and wait on the returned Request. Algorithms never see sockets (as in gloo's Context/Pair split).
//
// Sends and receives are asynchronous and never wait on each other: a send completes once its bytes
// are handed to the wire, whether or not the peer has posted the receive (unposted messages are
// buffered on arrival), so no pattern of sends before receives can deadlock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "frame.h"
#include "request.h"

namespace pycomm::transport {

class Transport {
 public:
  static constexpr int kAnyPeer = -1;

  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;

  // `data` must stay valid and unmodified until the request is done.
  virtual std::shared_ptr<Request> isend(int peer, const FrameInfo& info, const void* data,
                                         size_t nbytes) = 0;
  // Receives a message whose (channel, seq, slot) match `info` into `data`, which must be exactly
  // the message's size; a message whose signature differs from `info.signature` fails the request
  // with an error naming both. `peer` may be kAnyPeer on the p2p channel.
  virtual std::shared_ptr<Request> irecv(int peer, const FrameInfo& info, void* data,
                                         size_t nbytes) = 0;

  // Waits for a request this transport returned, like Request::wait (same errors and timeout). A
  // transport may move bytes on the calling thread meanwhile, rather than hand them over from its
  // own thread.
  virtual void wait(const std::shared_ptr<Request>& request, Clock::time_point deadline,
                    const std::string& context) {
    request->wait(deadline, context);
  }

  // Whether the calling thread is this transport's own I/O thread (its event loop), where user code
  // must not run: a callback that waits there for more input stops the input.
  virtual bool onIoThread() const { return false; }

  // Detaches a request that is not done, so the transport no longer touches its buffer. Returns false
  // if that was impossible before `deadline`; the transport has then been aborted.
  virtual bool cancel(const std::shared_ptr<Request>& request, Clock::time_point deadline) = 0;

  // Tells every peer that collective `seq` failed here with `message`, so they fail it too instead
  // of waiting (a frame after those of the op already queued to each peer). What this rank itself
  // knows of the op's fate is the communicator's op ledger's (op_ledger.h), not the transport's.
  // `lostRanks`: the ranks this rank lost (connection gone, or waited for past the timeout), which
  // the peers then count as lost too (pycomm.failed_ranks).
  virtual void reportFailure(uint64_t seq, const std::string& message, const std::vector<int>& lostRanks) = 0;

  // A wait for `peer` ran past the timeout: records in the op ledger whether the peer is lost. A
  // timeout alone cannot say (a live peer may be waiting for a frozen one), so a transport that can
  // probes the peer: no answer, it is lost; an answer, it is alive, and the rank that waits for the
  // frozen one will report it (this waits a moment for that report). Returns what the timeout's
  // message should add: which rank is lost. `peer`: as the waited request names it (Request::peer).
  virtual std::string judgeTimeout(int peer) { return {}; }

  // The error that ended the connection to `peer`, or null while it is alive.
  virtual std::exception_ptr peerFailure(int peer) = 0;

  // Fails everything pending and stops all I/O; later calls fail at once. Idempotent.
  virtual void abort(const std::string& reason) = 0;
};

}  // namespace pycomm::transport
