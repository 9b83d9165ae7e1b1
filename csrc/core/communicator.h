// A communicator: one group's rank, size, transport, and the worker that runs its ops.
//
// Collectives are queued with enqueue() and run on the worker thread in the order they were issued
// (the same order on every rank, as with NCCL and Gloo); each runs to completion, overlapping its
// own chunks' sends, receives and reductions. Point-to-point sends and receives bypass the queue:
// they are posted to the transport at once and complete asynchronously, so a receive never waits
// behind an unrelated collective.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "buffer_list.h"
#include "codecs/block_codec.h"
#include "config.h"
#include "dtype.h"
#include "reduce_spec.h"
#include "store.h"
#include "task_queue.h"
#include "op_ledger.h"
#include "transport/ring_links.h"
#include "transport/shm/group.h"
#include "transport/transport.h"

namespace pycomm::algorithms {
class Op;
struct HostGrid;
}  // namespace pycomm::algorithms

namespace pycomm {

using transport::Request;

// Longer timeouts are taken as this one (about 10 years): deadlines are steady-clock time points
// in nanoseconds, which "now + timedelta.max" would overflow into the past.
constexpr std::chrono::milliseconds kMaxTimeout{std::chrono::hours(24 * 365 * 10)};
std::chrono::milliseconds clampTimeout(std::chrono::milliseconds timeout);

// PYCOMM_CHECK for the input of a collective, inside it on the worker: a failed check rejects the
// op (rejectCollective) before it throws InvalidUsageError, so the peers fail it too.
#define PYCOMM_CHECK_OP(cond, ...)                                       \
  do {                                                                   \
    if (!(cond)) {                                                       \
      const std::string pycommMessage_ = ::pycomm::strCat(__VA_ARGS__);  \
      rejectCollective(pycommMessage_);                                  \
      throw InvalidUsageError(pycommMessage_);                           \
    }                                                                    \
  } while (0)

class Communicator {
 public:
  Communicator(const Config& config, Store& store);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return config_.rank; }
  int size() const { return config_.size; }
  const Config& config() const { return config_; }
  // What a group formed from this one inherits (config.h: Lineage). `key` tells apart the groups
  // formed from this one and must be the same on every member.
  Lineage lineageFor(const std::string& key) const;
  const Logger& logger() const { return logger_; }

  // Runs `task` on the worker thread after every task enqueued before it. Called from inside a
  // running task (a completion callback), both run `task` at once on the calling thread.
  void enqueue(std::function<void()> task);
  // For a caller that will wait anyway: runs `task` on the calling thread when nothing is queued
  // or running (so issue order holds), which saves two thread hand-offs; otherwise enqueues it.
  // Returns whether it ran here (then it is over).
  bool runOrEnqueue(std::function<void()> task);
  // Stops the worker after the queued tasks, then closes the transport. Idempotent.
  void shutdown();
  // Fails everything pending and in flight at once. Idempotent.
  void abort(const std::string& reason);
  void setTimeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeoutMs_.load()); }
  // Worker thread only (queue it with enqueue() so it applies in issue order on every rank).
  void setAlgorithm(Algorithm algorithm);

  // Fails this rank's next collective with `message` (its input was invalid) the way a failure
  // inside it would: it takes its sequence number and the peers are told, so their op fails at
  // once instead of waiting, and the ranks stay in step. Worker thread only, in issue order.
  void rejectCollective(const std::string& message);

  // The number of collectives issued so far on this rank (the next one gets this + 1).
  uint64_t sequenceNumber() const { return seq_.load(); }

  // What went wrong last (Backend::getError), and the ranks lost so far: those this rank lost or
  // waited for past the timeout, and those its peers reported lost (pycomm.failed_ranks).
  OpLedger::Fault lastFault() const { return ledger_.lastFault(); }
  std::vector<int> lostRanks() const { return ledger_.lostRanks(); }
  // Whether shutdown() ended the group (an abort leaves it to be shrunk or destroyed).
  bool shutDown() const;

  // Collectives. Blocking; call them from an enqueued task so every rank runs them in one order.
  // The reducing ones take a ReduceSpec (reduce_spec.h): PREMUL_SUM's factor scales the inputs
  // (this rank's `data` in place where the op writes its result there, a copy otherwise) and AVG
  // divides the result by size(), as torch computes both.
  void allreduce(void* data, size_t count, DataType dtype, const ReduceSpec& spec);
  // All-reduces a buffer in pieces (a bucket of tensors) without packing it, when this group's
  // ranks share one host's memory; returns false, having done nothing (not even the pre-scale),
  // when they do not (then the caller packs the pieces and calls allreduce). The pieces may not
  // overlap.
  bool allreducePieces(const std::vector<BufferList::Piece>& pieces, DataType dtype, const ReduceSpec& spec);
  // Whether allreducePieces runs now. Worker thread (tasks) only, like the ops.
  bool allreducesInSharedMemory() { return shm_ && sharedMemoryFor(seq_.load() + 1); }
  void broadcast(void* data, size_t count, DataType dtype, int root);
  // The reduction lands in `data` at `root`; other ranks' `data` is left unchanged.
  void reduce(void* data, size_t count, DataType dtype, const ReduceSpec& spec, int root);
  // out holds size() * count elements, rank i's at i * count.
  void allgather(const void* in, void* out, size_t count, DataType dtype);
  // in holds size() * count elements (left as they were where out does not overlap them); this rank's
  // reduced block lands in out.
  void reduceScatter(const void* in, void* out, size_t count, DataType dtype, const ReduceSpec& spec);
  void gather(const void* in, void* out, size_t count, DataType dtype, int root);
  void scatter(const void* in, void* out, size_t count, DataType dtype, int root);
  // Counts and offsets in elements, one per peer.
  void alltoall(const void* in, const std::vector<size_t>& sendCounts,
                const std::vector<size_t>& sendOffsets, void* out,
                const std::vector<size_t>& recvCounts, const std::vector<size_t>& recvOffsets,
                DataType dtype);
  void barrier();

  // Compressed fp32 collectives (algorithms/compressed.h): rounding twice at any world size.
  // `residual`: error feedback (algorithms/compressed.h), count floats this rank keeps between calls.
  void allreduceCompressed(float* data, size_t count, codecs::Codec codec, bool average, float* residual = nullptr);
  void reduceScatterCompressed(const float* in, float* out, size_t count, codecs::Codec codec, bool average);
  void allgatherCompressed(const float* in, float* out, size_t count, codecs::Codec codec);

  // Counters per op and codec ("allreduce", "allreduce/fp16", "send", ...), since creation.
  struct OpStats {
    uint64_t calls = 0;
    uint64_t bytesSent = 0;
    uint64_t bytesReceived = 0;
    double seconds = 0;
  };
  std::map<std::string, OpStats> stats() const;
  // Counts an op that ran on another route (the NCCL link) under the key its signature gives.
  void recordRouted(const transport::OpSignature& signature, uint64_t sent, uint64_t received, double seconds) {
    record(signature, sent, received, seconds);
  }

  // Point-to-point, from any thread; tags keep separate streams apart.
  std::shared_ptr<Request> send(const void* data, size_t nbytes, int peer, uint64_t tag);
  // peer may be transport::Transport::kAnyPeer.
  std::shared_ptr<Request> recv(void* data, size_t nbytes, int peer, uint64_t tag);
  // Runs `callback` once `request` (a point-to-point one) is done: on the completing thread, or,
  // when that thread is the transport's event loop or inside a collective, on the group's
  // completion thread (a callback on the loop that waits for another receive of the group would
  // stop the loop that is to deliver it), unless `awaited()` says a thread waits to complete it
  // itself: waking the completion thread for nothing costs a context switch per message.
  void onComplete(const std::shared_ptr<Request>& request, std::function<void()> callback,
                  std::function<bool()> awaited = nullptr);
  // Waits for a point-to-point request up to `timeout`; detaches it if that passes.
  void waitPointToPoint(const std::shared_ptr<Request>& request, const std::string& what,
                        std::chrono::milliseconds timeout);

 private:
  // `viaShm`: the body runs steps of shm_ (runShm).
  template <typename Body>
  void runCollective(transport::OpSignature signature, const char* algorithm, Body body,
                     const char* transportName = nullptr, bool viaShm = false);
  // States the op in the group's shared memory, if it has some (transport/shm/group.h); an op
  // of another path compares it with the peers' at once and throws on a mismatch.
  void announce(const algorithms::Op& op, bool viaShm);
  transport::shm::StepWait shmWait(const algorithms::Op& op);
  // The group's shared memory: shm_ for one host, this host's part of the hierarchy, or null.
  transport::shm::Group* localGroup() const;
  // Whether op `seq` runs in localGroup(): not once the host gave shared memory up. Worker thread only.
  bool sharedMemoryFor(uint64_t seq);
  // Runs `body` over shared memory if this group has it; on failure the group falls back to TCP.
  template <typename Body>
  bool runShm(transport::OpSignature signature, const char* algorithm, Body body);
  void setupSharedMemory(Store& store);
  // The body of setupSharedMemory; `segmentName(i)` names host i's segment.
  void formSharedMemoryGroups(Store& store, const std::function<std::string(int)>& segmentName);
  // Each rank's host id as it is now: through the store (each rank publishes its own) for a group
  // formed afresh, and as a digest over the connections for one formed from another (Lineage). A
  // host id is not inherited: it can change under a process (PYCOMM_HOST_ID, a /dev/shm mount).
  std::vector<std::string> hostIdsOfRanks(Store& store);
  // An all-gather over the connections during setup, one op of one step: `rows` holds size() rows
  // of `rowBytes`, this rank's filled in.
  void allgatherForSetup(void* rows, size_t rowBytes, const char* what);
  // The vote that ends shared-memory setup, over the connections (so also the barrier after which
  // the rings may carry frames): empty if every rank mapped its host's segment, every host's ranks
  // had one creator, and chunk_bytes is the same everywhere; otherwise why not, the same on every
  // rank. `hostOf[q]`: rank q's host index.
  std::string voteOnSharedMemory(bool mappedHere, bool createdHere, const std::string& why, const std::vector<int>& hostOf);
  // Runs `body(cross, host)` as one op over the hierarchy (shared memory inside this host, `cross`
  // among the ranks of this local index); returns false, having done nothing, without a hierarchy.
  template <typename Body>
  bool runHierarchical(transport::OpSignature signature, const char* algorithm, Body body);
  // The plain-op bodies of the reducing collectives, which the public ones wrap in the spec.
  void allreduceOp(void* data, size_t count, DataType dtype, ReduceOp op);
  void reduceOp(void* data, size_t count, DataType dtype, ReduceOp op, int root);
  void reduceScatterOp(const void* in, void* out, size_t count, DataType dtype, ReduceOp op);
  // PYCOMM_CHECK_OP that `spec` can reduce `dtype`, naming `what`.
  void checkReducible(const ReduceSpec& spec, DataType dtype, const char* what);
  void hierarchicalAllreduce(algorithms::Op& cross, const algorithms::HostGrid& host, uint8_t* data, size_t count,
                             DataType dtype, ReduceOp op, Algorithm algorithm);
  uint8_t* scratch(size_t bytes);
  const std::string& prefix() const { return prefix_; }

  Config config_;
  const std::string prefix_;  // "[rank r/p]": errors start with it; made once, ops are hot
  Logger logger_;
  OpLedger ledger_;  // the fate of each collective; outlives transport_, which reads it
  std::unique_ptr<transport::Transport> transport_;
  transport::RingLinks* links_ = nullptr;  // transport_, for moving same-host peers to rings
  std::array<uint8_t, 16> token_{};        // the secret the connections proved (handshake.h)
  bool formed_ = false;                    // setup is over; set before the worker starts
  std::unique_ptr<transport::shm::Group> shm_;  // ranks all on one host; null otherwise
  // Several hosts with the same number of ranks each: shared memory among this host's ranks, and
  // a view of the group with the ranks of the same local index on every host.
  struct Hierarchy {
    std::unique_ptr<transport::shm::Group> local;
    std::unique_ptr<transport::Transport> cross;
    int localRank = 0;
    int localSize = 1;
    std::vector<int> grid;  // grid[h * localSize + l]: the rank of local rank l on host h
  };
  std::unique_ptr<Hierarchy> hierarchy_;
  bool shmBroken_ = false;                     // worker thread only
  uint64_t shmDecidedFor_ = 0;                 // worker thread only: the op sharedMemoryFor decided
  std::atomic<int64_t> timeoutMs_;
  std::atomic<uint64_t> seq_{0};    // written by the worker thread only
  std::vector<uint8_t> scratch_;    // worker thread only
  std::vector<uint8_t> staging_;    // worker thread only: hierarchical reduce-scatter and all-gather

  // The collectives' counters by kind and codec, named (statsKey) only when read: a key built and
  // looked up per op costs an allocation and string compares, a share of a small op's time.
  static constexpr size_t kStatsKinds = static_cast<size_t>(transport::OpKind::kSend) + 1;
  static constexpr size_t kStatsCodecs = 5;  // none, fp16, bf16, fp8_e4m3, fp8_e5m2
  mutable std::mutex statsMutex_;
  std::map<std::string, OpStats> stats_;  // by name: point-to-point
  std::array<std::array<OpStats, kStatsCodecs>, kStatsKinds> collectiveStats_{};
  void record(const std::string& key, uint64_t sent, uint64_t received, double seconds);
  void record(const transport::OpSignature& signature, uint64_t sent, uint64_t received, double seconds);
  // "allreduce", "allreduce/fp8_e4m3", ...: the op's kind and codec.
  static std::string statsKey(const transport::OpSignature& signature);
  // The op's codec as the stats count it: one they do not know counts as none.
  static size_t statsCodec(const transport::OpSignature& signature) {
    return signature.codec < kStatsCodecs ? signature.codec : 0;
  }

  mutable std::mutex stateMutex_;
  bool shutDown_ = false;
  std::shared_ptr<TaskQueue> tasks_;        // the worker: collectives in issue order
  std::shared_ptr<TaskQueue> completions_;  // point-to-point completions
};

}  // namespace pycomm
