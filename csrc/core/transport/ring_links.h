// What a communicator asks of a transport beyond the Transport interface: to move the connections
// to its same-host peers onto shared-memory rings, and how many frame bytes took each path. The TCP
// transport is one; the communicator holds it through this, not through its concrete type.
#pragma once

#include <cstdint>
#include <memory>

#include "shm/ring.h"

namespace pycomm::transport {

class RingLinks {
 public:
  virtual ~RingLinks() = default;

  // Gives the connection to `peer`, a rank on this host, a ring in each direction (shm/ring.h);
  // `keepalive` holds their mapping. Both ranks must attach before either moves the pair.
  virtual void attachRings(int peer, shm::Ring out, shm::Ring in, std::shared_ptr<void> keepalive) = 0;
  // After the frames already queued, this rank's frames to `peer` go through its ring; the socket
  // only carries doorbells and tells when the peer is gone.
  virtual void moveToSharedMemory(int peer) = 0;

  // Frame bytes (headers and payloads) this rank wrote to sockets and to rings.
  virtual uint64_t socketBytesSent() const = 0;
  virtual uint64_t ringBytesSent() const = 0;
  // Frame bytes this rank read from sockets, and the part of them read by waiting threads rather
  // than by an event loop.
  virtual uint64_t socketBytesReceived() const = 0;
  virtual uint64_t callerBytesReceived() const = 0;
};

}  // namespace pycomm::transport
