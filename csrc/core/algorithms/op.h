// One collective in flight, as the algorithms see it: its sequence number and signature, the
// deadline every wait shares, and the sends and receives it posted. Algorithms are written against
// this class and the transport interface only.
//
// If an algorithm throws, the communicator calls fail(): the op's failure is recorded in the
// communicator's op ledger, peers are told (so they fail too instead of waiting), every request
// still pending is detached from its buffer, and late frames are dropped (the op is retired).
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "../op_ledger.h"
#include "../transport/transport.h"

namespace pycomm::algorithms {

using transport::Clock;
using transport::OpSignature;
using transport::Request;
using transport::Transport;

class Op {
 public:
  // `ledger` is the communicator's: the same for an op and its sub-ops over views of the group.
  Op(Transport& transport, OpLedger& ledger, uint64_t seq, OpSignature signature, std::string context,
     Clock::time_point deadline, std::chrono::milliseconds timeout);
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  int rank() const { return transport_.rank(); }
  int size() const { return transport_.size(); }
  const std::string& context() const { return context_; }
  uint64_t seq() const { return seq_; }
  Clock::time_point deadline() const { return deadline_; }
  const OpSignature& signature() const { return signature_; }

  std::shared_ptr<Request> send(int peer, uint32_t slot, const void* data, size_t nbytes);
  std::shared_ptr<Request> recv(int peer, uint32_t slot, void* data, size_t nbytes);
  void wait(const std::shared_ptr<Request>& request);
  // Waits for every request posted so far.
  void waitAll();

  // Called after the algorithm returned: waits for what is still pending, fails if a peer reported
  // the op failed there, and retires the op.
  void finish();
  uint64_t bytesSent() const { return bytesSent_; }
  uint64_t bytesReceived() const { return bytesReceived_; }
  // Counts a sub-op's bytes (one over a view of the group) as this op's.
  void countBytesOf(const Op& part) {
    bytesSent_ += part.bytesSent_;
    bytesReceived_ += part.bytesReceived_;
  }

  // Called when the algorithm threw `message`: reports it to the peers and detaches every request.
  void fail(const std::string& message);

 private:
  transport::FrameInfo info(uint32_t slot) const;

  Transport& transport_;
  OpLedger& ledger_;
  const uint64_t seq_;
  const OpSignature signature_;
  const std::string context_;
  const Clock::time_point deadline_;
  const std::chrono::milliseconds timeout_;  // for messages
  std::vector<std::shared_ptr<Request>> requests_;
  uint64_t bytesSent_ = 0;
  uint64_t bytesReceived_ = 0;
};

// Rooted ops in which some rank only sends (a broadcast root, a reduce or gather leaf, a scatter
// root) end with an empty acknowledgement from each receiver to its sender: it carries the
// receiver's op signature, so a sender whose peer runs a different op fails too instead of
// returning as if all went well.
constexpr uint32_t kAckSlot = 0xfffffff0u;
// A root that only receives (binomial reduce) first sends its children an empty frame nobody waits
// for: it carries the root's signature, so ranks that disagree about the root fail at once
// instead of all waiting for data that never comes.
constexpr uint32_t kAnnounceSlot = 0xfffffff1u;

// Splits `count` elements into `parts` contiguous segments whose sizes differ by at most one.
// The chunk an algorithm cuts with. A chunk longer than the longest stretch of data makes no cut,
// so the stretch's length is used instead: the same cut, and scratch sized by the data rather than
// by a chunk_bytes far above it.
inline size_t chunkWithin(size_t chunkElems, size_t longest) {
  return chunkElems < longest ? std::max<size_t>(1, chunkElems) : std::max<size_t>(1, longest);
}

struct Segments {
  Segments(size_t count, int parts);
  Segments(size_t countPerPart, int parts, bool /*equal*/);
  explicit Segments(std::vector<size_t> offsets) : offsets_(std::move(offsets)) {}
  size_t offset(int i) const { return offsets_[i]; }
  size_t length(int i) const { return offsets_[i + 1] - offsets_[i]; }
  size_t maxLength() const;
  int parts() const { return static_cast<int>(offsets_.size()) - 1; }

 private:
  std::vector<size_t> offsets_;
};

}  // namespace pycomm::algorithms
