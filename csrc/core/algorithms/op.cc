#include "op.h"

#include "../error.h"

namespace pycomm::algorithms {

Op::Op(Transport& transport, OpLedger& ledger, uint64_t seq, OpSignature signature, std::string context,
       Clock::time_point deadline, std::chrono::milliseconds timeout)
    : transport_(transport),
      ledger_(ledger),
      seq_(seq),
      signature_(signature),
      context_(std::move(context)),
      deadline_(deadline),
      timeout_(timeout) {}

transport::FrameInfo Op::info(uint32_t slot) const {
  transport::FrameInfo info;
  info.channel = transport::Channel::kCollective;
  info.seq = seq_;
  info.slot = slot;
  info.signature = signature_;
  return info;
}

std::shared_ptr<Request> Op::send(int peer, uint32_t slot, const void* data, size_t nbytes) {
  bytesSent_ += nbytes;
  requests_.push_back(transport_.isend(peer, info(slot), data, nbytes));
  return requests_.back();
}

std::shared_ptr<Request> Op::recv(int peer, uint32_t slot, void* data, size_t nbytes) {
  bytesReceived_ += nbytes;
  requests_.push_back(transport_.irecv(peer, info(slot), data, nbytes));
  return requests_.back();
}

void Op::wait(const std::shared_ptr<Request>& request) {
  try {
    transport_.wait(request, deadline_, context_);
  } catch (const TimeoutError& e) {
    throw TimeoutError(strCat(e.what(), " after ", timeout_.count(), " ms", transport_.judgeTimeout(request->peer())));
  }
}

void Op::waitAll() {
  for (auto& r : requests_) wait(r);
  requests_.clear();
}

void Op::finish() {
  waitAll();
  if (std::string failure = ledger_.failure(seq_); !failure.empty()) throw RemoteError(failure);
  ledger_.retire(seq_, true);
}

void Op::fail(const std::string& message) {
  ledger_.recordOwnFailure(seq_, message);
  transport_.reportFailure(seq_, message, ledger_.lostRanks());
  // Give in-flight transfers a moment to land before their buffers go back to the caller.
  const auto detachDeadline = Clock::now() + std::chrono::seconds(5);
  for (auto& r : requests_) {
    if (!transport_.cancel(r, detachDeadline)) break;  // the transport aborted itself
  }
  requests_.clear();
  ledger_.retire(seq_, false);
}

Segments::Segments(size_t count, int parts) : offsets_(parts + 1) {
  const size_t base = count / parts;
  const size_t rem = count % parts;
  for (int i = 0; i <= parts; ++i) {
    offsets_[i] = i * base + std::min<size_t>(i, rem);
  }
}

Segments::Segments(size_t countPerPart, int parts, bool) : offsets_(parts + 1) {
  for (int i = 0; i <= parts; ++i) offsets_[i] = i * countPerPart;
}

size_t Segments::maxLength() const {
  size_t best = 0;
  for (size_t i = 0; i + 1 < offsets_.size(); ++i) best = std::max(best, offsets_[i + 1] - offsets_[i]);
  return best;
}

}  // namespace pycomm::algorithms
