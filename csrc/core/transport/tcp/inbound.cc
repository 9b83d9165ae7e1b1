// Reading frames off a connection: the same code for the event loop and for a thread that reads a
// socket while it waits (caller_read.cc). Framing is the connection's, matching the matcher's; here a
// frame's header decides where its payload goes, and a complete frame is handed on.
#include <new>

#include "../../error.h"
#include "tcp_transport.h"

namespace pycomm::transport::tcp {

std::unique_lock<std::mutex> TcpTransport::lockReceiveSide(Connection& connection) {
  std::unique_lock<std::mutex> lock(connection.recvMutex, std::defer_lock);
  if (InputScope::connection() != &connection) lock.lock();  // else this thread holds it already (handleInput)
  return lock;
}

bool TcpTransport::handleReadable(Connection& c) {
  std::exception_ptr gone;
  if (c.readViaRing) gone = c.drainDoorbells(context_);
  // Frames the peer wrote before it closed are delivered first, as a socket would deliver them.
  // Stop once something completed, so its waiter gets it now (the next chunk of a pipelined op is
  // read while the waiter reduces this one); the caller comes back for the rest.
  bool more = false;
  while (c.socket.valid() && !loop_.stopping() && readSome(c)) {
    if (!InputScope::deferred()->empty()) {
      more = true;
      break;
    }
  }
  if (gone && !more) {
    failPeer(c, gone);
    return false;
  }
  // A doorbell also says that the peer made space in this rank's ring to it.
  if (c.readViaRing) handleWritable(c);
  return more;
}

bool TcpTransport::readSome(Connection& c) {
  if (matcher_.failed(c.rank)) return false;
  std::exception_ptr error;
  switch (c.readSome(context_, &error)) {
    case Connection::Read::kBlocked:
      return false;
    case Connection::Read::kProgress:
      return true;
    case Connection::Read::kHeader:
      onHeader(c);
      return true;
    case Connection::Read::kPayload:
      onPayload(c);
      return true;
    case Connection::Read::kFailed:
      failPeer(c, error);
      return false;
  }
  return false;
}

void TcpTransport::onHeader(Connection& c) {
  const FrameHeader& h = c.header;
  std::string malformed = validateHeader(h);
  if (logger_.enabled(LogLevel::kTrace)) {
    logger_.log(LogLevel::kTrace, strCat(" recv from peer ", c.rank, ": ", describeFrame(h)));
  }
  if (malformed.empty() && h.kind == static_cast<uint8_t>(FrameKind::kError) && h.nbytes > kMaxErrorText) {
    malformed = "error report too long";
  }
  if (!malformed.empty()) {
    failPeer(c, remoteError(strCat(context_, " malformed frame from peer ", c.rank, ": ", malformed,
                                   "; connection closed")));
    return;
  }
  c.payloadGot = 0;
  if (h.kind == static_cast<uint8_t>(FrameKind::kPing)) {
    c.headerGot = 0;
    // A prober sends a ping or two per timeout; a peer that floods them (and never reads) must not
    // grow this rank's send queue without bound.
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
    if (now - c.lastPingAnsweredNs < 10'000'000) return;
    c.lastPingAnsweredNs = now;
    FrameInfo info;
    send(c, OutgoingFrame{makeHeader(FrameKind::kPong, info, 0), nullptr, 0, 0, nullptr, {}});
    return;
  }
  if (h.kind == static_cast<uint8_t>(FrameKind::kPong)) {
    c.headerGot = 0;
    c.pongs.fetch_add(1);
    return;
  }
  if (h.kind == static_cast<uint8_t>(FrameKind::kMoveToSharedMemory)) {
    if (!c.ringIn.valid() || h.nbytes != 0) {
      failPeer(c, remoteError(strCat(context_, " peer ", c.rank,
                                     " moved to shared memory, but this rank shares none with it")));
      return;
    }
    c.headerGot = 0;
    c.readViaRing = true;
    endLinger(c);  // doorbells and the peer's leaving arrive on the socket, for the loop
    return;
  }
  Completions completions;
  std::string refused;
  if (h.kind == static_cast<uint8_t>(FrameKind::kError)) {
    c.target = ReadTarget::kErrorText;
  } else {
    refused = matcher_.claim(c, completions);
  }
  finish(completions);
  if (!refused.empty()) {
    failPeer(c, remoteError(refused));
    return;
  }
  if (c.target == ReadTarget::kBuffer || c.target == ReadTarget::kErrorText) {
    try {
      c.buffer.resize(h.nbytes);
    } catch (const std::bad_alloc&) {
      failPeer(c, remoteError(strCat(context_, " peer ", c.rank, " announced a frame of ", h.nbytes,
                                     " bytes that cannot be buffered")));
      return;
    }
  }
  if (h.nbytes == 0) onPayload(c);
}

void TcpTransport::onPayload(Connection& c) {
  const FrameHeader h = c.header;
  const ReadTarget target = c.target;
  c.headerGot = 0;
  c.payloadGot = 0;
  c.target = ReadTarget::kNone;
  Completions completions;
  std::string refused;
  switch (target) {
    case ReadTarget::kRequest:
      completions.push_back({matcher_.takeClaimed(c), c.rank, nullptr});
      break;
    case ReadTarget::kBuffer: {
      FrameBytes payload = std::move(c.buffer);
      c.buffer = {};
      matcher_.arrived(c.rank, h, std::move(payload), completions);
      break;
    }
    case ReadTarget::kErrorText: {
      std::string text(c.buffer.begin(), c.buffer.end());
      c.buffer = {};
      refused = matcher_.errorReport(c.rank, h, text, completions);
      break;
    }
    default:
      break;
  }
  finish(completions);
  if (!refused.empty()) failPeer(c, remoteError(refused));
}

}  // namespace pycomm::transport::tcp
