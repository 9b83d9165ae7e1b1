// ProcessGroup.monitored_barrier (torch's c10d::monitored_barrier_ op on CPU): a barrier that, on
// rank 0, names the ranks that did not arrive within the timeout instead of hanging or failing
// anonymously. Every other rank tells rank 0 it arrived and waits for its release; rank 0 waits for
// each rank in turn and releases all of them only once every one arrived. Over the group's
// point-to-point channel with tags no c10d tag can take (those fit in 32 bits).
#include <algorithm>
#include <string>
#include <vector>

#include "backend.h"
#include "core/error.h"

namespace pycomm::torch_adapter {
namespace {

constexpr uint64_t kArrivedTag = uint64_t{1} << 40;
constexpr uint64_t kReleasedTag = kArrivedTag + 1;

std::chrono::milliseconds left(transport::Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - transport::Clock::now());
  // At least 1 ms: a wait's timeout of 0 means no limit (Communicator::waitPointToPoint).
  return std::max(left, std::chrono::milliseconds(1));
}

std::string joinRanks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

}  // namespace

void PycommBackend::monitoredBarrier(const ::c10d::BarrierOptions& opts, bool waitAllRanks) {
  const auto timeout = opts.timeout == ::c10d::kUnsetTimeout ? comm_->timeout() : opts.timeout;
  const auto deadline = transport::Clock::now() + timeout;
  const std::string where = strCat("pycomm rank ", rank_, " of ", size_, ": monitored_barrier");
  if (size_ == 1) return;
  uint8_t token = 1;
  if (rank_ != 0) {
    comm_->waitPointToPoint(comm_->send(&token, 1, 0, kArrivedTag), "monitored_barrier: tell rank 0", left(deadline));
    uint8_t released = 0;
    try {
      comm_->waitPointToPoint(comm_->recv(&released, 1, 0, kReleasedTag), "monitored_barrier: release by rank 0",
                              left(deadline));
    } catch (const TimeoutError&) {
      TORCH_CHECK(false, where, ": rank 0 did not release this rank within ", timeout.count(),
                  " ms: a rank did not arrive (rank 0's error names it)");
    }
    return;
  }
  // One byte per peer: every receive posted first, so a rank's arrival is taken whenever it comes.
  std::vector<uint8_t> arrivals(static_cast<size_t>(size_), 0);
  std::vector<std::shared_ptr<transport::Request>> waits(static_cast<size_t>(size_));
  for (int peer = 1; peer < size_; ++peer) waits[peer] = comm_->recv(&arrivals[peer], 1, peer, kArrivedTag);
  std::vector<int> missing;
  for (int peer = 1; peer < size_; ++peer) {
    try {
      // After the first missing rank, only the ones already there count (unless waitAllRanks, the
      // deadline is shared anyway); a receive that times out is withdrawn, so none outlives `arrivals`.
      comm_->waitPointToPoint(waits[peer], strCat("monitored_barrier: arrival of rank ", peer),
                              missing.empty() || waitAllRanks ? left(deadline) : std::chrono::milliseconds(1));
    } catch (const TimeoutError&) {
      missing.push_back(peer);
    }
  }
  if (!missing.empty()) {
    const std::vector<int> named = waitAllRanks ? missing : std::vector<int>{missing.front()};
    TORCH_CHECK(false, where, ": ", named.size() == 1 ? "Rank " : "Ranks ", joinRanks(named),
                " failed to pass monitoredBarrier in ", timeout.count(), " ms",
                waitAllRanks ? "" : " (the first rank missing; wait_all_ranks=True names every one)");
  }
  std::vector<std::shared_ptr<transport::Request>> releases;
  for (int peer = 1; peer < size_; ++peer) releases.push_back(comm_->send(&token, 1, peer, kReleasedTag));
  for (int peer = 1; peer < size_; ++peer) {
    comm_->waitPointToPoint(releases[peer - 1], strCat("monitored_barrier: release of rank ", peer), left(deadline));
  }
}

}  // namespace pycomm::torch_adapter
