// ProcessGroup.monitored_barrier (torch's c10d::monitored_barrier_ op on CPU): a barrier that, on
// rank 0, names the ranks that did not arrive within the timeout instead of hanging or failing
// anonymously. Every other rank tells rank 0 it arrived and waits for its release; rank 0 waits for
// each rank in turn and releases all of them only once every one arrived. Over the group's
// point-to-point channel with tags no c10d tag can take (those fit in 32 bits), fresh ones each call.
#include <algorithm>
#include <string>
#include <vector>

#include "backend.h"
#include "core/error.h"

namespace pycomm::torch_adapter {
namespace {

// Tags of the n-th barrier: fresh ones per call, so that a rank arriving after rank 0 gave up (or
// a release after its rank gave up) is never taken by a later barrier.
constexpr uint64_t kTagBase = uint64_t{1} << 40;
uint64_t arrivedTag(uint64_t n) { return kTagBase + 2 * n; }
uint64_t releasedTag(uint64_t n) { return kTagBase + 2 * n + 1; }
// What every send carries: static, so no send outlives its buffer whatever a wait throws.
const uint8_t kToken = 1;

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
  // Every rank counts its calls (TORCH_CHECK below: not taken on a size-1 group).
  const uint64_t n = monitoredBarriers_++;
  if (rank_ != 0) {
    comm_->waitPointToPoint(comm_->send(&kToken, 1, 0, arrivedTag(n)), "monitored_barrier: tell rank 0",
                            left(deadline));
    uint8_t released = 0;
    try {
      comm_->waitPointToPoint(comm_->recv(&released, 1, 0, releasedTag(n)), "monitored_barrier: release by rank 0",
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
  for (int peer = 1; peer < size_; ++peer) waits[peer] = comm_->recv(&arrivals[peer], 1, peer, arrivedTag(n));
  std::vector<int> missing;
  std::string why;  // what failed for the first missing rank that did not just time out
  for (int peer = 1; peer < size_; ++peer) {
    // Every posted receive is waited for here, whatever happened to the others: one that times
    // out is withdrawn and one whose peer failed is failed, so none outlives `arrivals`. After the
    // first missing rank, only the ones already there count (unless waitAllRanks).
    try {
      comm_->waitPointToPoint(waits[peer], strCat("monitored_barrier: arrival of rank ", peer),
                              missing.empty() || waitAllRanks ? left(deadline) : std::chrono::milliseconds(1));
    } catch (const TimeoutError&) {
      missing.push_back(peer);
    } catch (const std::exception& e) {
      if (why.empty()) why = strCat(" (rank ", peer, ": ", e.what(), ")");
      missing.push_back(peer);
    }
  }
  if (!missing.empty()) {
    const std::vector<int> named = waitAllRanks ? missing : std::vector<int>{missing.front()};
    TORCH_CHECK(false, where, ": ", named.size() == 1 ? "Rank " : "Ranks ", joinRanks(named),
                " failed to pass monitoredBarrier in ", timeout.count(), " ms",
                waitAllRanks ? "" : " (the first rank missing; wait_all_ranks=True names every one)", why);
  }
  std::vector<std::shared_ptr<transport::Request>> releases;
  for (int peer = 1; peer < size_; ++peer) releases.push_back(comm_->send(&kToken, 1, peer, releasedTag(n)));
  for (int peer = 1; peer < size_; ++peer) {
    comm_->waitPointToPoint(releases[peer - 1], strCat("monitored_barrier: release of rank ", peer), left(deadline));
  }
}

}  // namespace pycomm::torch_adapter
