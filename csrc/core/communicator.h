// A communicator: one group's rank, size, transport, and the worker that runs its ops.
//
// Collectives are queued with enqueue() and run on the worker thread in the order they were issued
// (the same order on every rank, as with NCCL and Gloo); each runs to completion, overlapping its
// own chunks' sends, receives and reductions. Point-to-point sends and receives bypass the queue:
// they are posted to the transport at once and complete asynchronously, so a receive never waits
// behind an unrelated collective.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "buffer_list.h"
#include "codecs/block_codec.h"
#include "config.h"
#include "dtype.h"
#include "store.h"
#include "algorithms/op.h"
#include "algorithms/shm_collectives.h"
#include "transport/transport.h"

namespace pycomm::transport::tcp {
class TcpTransport;
}

namespace pycomm {

using transport::Request;

class Communicator {
 public:
  Communicator(const Config& config, Store& store);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return config_.rank; }
  int size() const { return config_.size; }
  const Config& config() const { return config_; }
  const Logger& logger() const { return logger_; }

  // Runs `task` on the worker thread after every task enqueued before it. Called from inside a
  // running task (a completion callback), both run `task` at once on the calling thread.
  void enqueue(std::function<void()> task);
  // For a caller that will wait anyway: runs `task` on the calling thread when nothing is queued
  // or running (so issue order holds), which saves two thread hand-offs; otherwise enqueues it.
  void runOrEnqueue(std::function<void()> task);
  // Waits until every enqueued task ran, or the timeout passes (then returns false).
  bool drain(std::chrono::milliseconds timeout);
  // Stops the worker after the queued tasks, then closes the transport. Idempotent.
  void shutdown();
  // Fails everything pending and in flight at once. Idempotent.
  void abort(const std::string& reason);
  void setTimeout(std::chrono::milliseconds timeout) { timeoutMs_.store(timeout.count()); }
  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeoutMs_.load()); }
  // Worker thread only (queue it with enqueue() so it applies in issue order on every rank).
  void setAlgorithm(Algorithm algorithm);

  // The number of collectives issued so far on this rank (the next one gets this + 1).
  uint64_t sequenceNumber() const { return seq_.load(); }

  // Collectives. Blocking; call them from an enqueued task so every rank runs them in one order.
  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op);
  // All-reduces a buffer in pieces (a bucket of tensors) without packing it, when this group's
  // ranks share one host's memory; returns false, having done nothing, when they do not (then the
  // caller packs the pieces and calls allreduce).
  bool allreducePieces(const BufferList& pieces, DataType dtype, ReduceOp op);
  // Whether allreducePieces runs now. Worker thread (tasks) only, like the ops.
  bool allreducesInSharedMemory() const { return shm_ && !shmBroken_; }
  void broadcast(void* data, size_t count, DataType dtype, int root);
  // The reduction lands in `data` at `root`; other ranks' `data` is left unchanged.
  void reduce(void* data, size_t count, DataType dtype, ReduceOp op, int root);
  // out holds size() * count elements, rank i's at i * count.
  void allgather(const void* in, void* out, size_t count, DataType dtype);
  // in holds size() * count elements; this rank's reduced block lands in out.
  void reduceScatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op);
  void gather(const void* in, void* out, size_t count, DataType dtype, int root);
  void scatter(const void* in, void* out, size_t count, DataType dtype, int root);
  // Counts and offsets in elements, one per peer.
  void alltoall(const void* in, const std::vector<size_t>& sendCounts,
                const std::vector<size_t>& sendOffsets, void* out,
                const std::vector<size_t>& recvCounts, const std::vector<size_t>& recvOffsets,
                DataType dtype);
  void barrier();

  // Compressed fp32 collectives (algorithms/compressed.h): rounding twice at any world size.
  void allreduceCompressed(float* data, size_t count, codecs::Codec codec, bool average);
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

  // Point-to-point, from any thread; tags keep separate streams apart.
  std::shared_ptr<Request> send(const void* data, size_t nbytes, int peer, uint64_t tag);
  // peer may be transport::Transport::kAnyPeer.
  std::shared_ptr<Request> recv(void* data, size_t nbytes, int peer, uint64_t tag);
  // Waits for a point-to-point request with the group's timeout; detaches it if that passes.
  void waitPointToPoint(const std::shared_ptr<Request>& request, const std::string& what);

 private:
  template <typename Body>
  void runCollective(transport::OpSignature signature, const char* algorithm, Body body,
                     const char* transportName = nullptr);
  // Runs `body` over shared memory if this group has it; on failure the group falls back to TCP.
  template <typename Body>
  bool runShm(transport::OpSignature signature, const char* algorithm, Body body);
  void setupSharedMemory(Store& store);
  // The body of setupSharedMemory; `segmentName(i)` names host i's segment.
  void formSharedMemoryGroups(Store& store, const std::function<std::string(int)>& segmentName);
  void hierarchicalAllreduce(algorithms::Op& o, uint8_t* data, size_t count, DataType dtype, ReduceOp op,
                             Algorithm algorithm);
  uint8_t* scratch(size_t bytes);
  void workerLoop();
  // Runs `task` as this communicator's (see runIfNested); what escapes it is logged, named `kind`.
  void runTask(const std::function<void()>& task, const char* kind);
  // Runs `task` now and returns true if this thread is running one of this communicator's tasks.
  bool runIfNested(const std::function<void()>& task);
  const std::string& prefix() const { return prefix_; }

  Config config_;
  const std::string prefix_;  // "[rank r/p]": errors start with it; made once, ops are hot
  Logger logger_;
  std::unique_ptr<transport::Transport> transport_;
  transport::tcp::TcpTransport* tcp_ = nullptr;  // transport_, for moving same-host peers to rings
  std::unique_ptr<algorithms::ShmGroup> shm_;  // ranks all on one host; null otherwise
  // Several hosts with the same number of ranks each: shared memory among this host's ranks, and
  // a view of the group with the ranks of the same local index on every host.
  struct Hierarchy {
    std::unique_ptr<algorithms::ShmGroup> local;
    std::unique_ptr<transport::Transport> cross;
    int localRank = 0;
    int localSize = 1;
  };
  std::unique_ptr<Hierarchy> hierarchy_;
  bool shmBroken_ = false;                     // worker thread only
  std::atomic<int64_t> timeoutMs_;
  std::atomic<uint64_t> seq_{0};    // written by the worker thread only
  std::vector<uint8_t> scratch_;    // worker thread only

  mutable std::mutex statsMutex_;
  std::map<std::string, OpStats> stats_;
  void record(const std::string& key, uint64_t sent, uint64_t received, double seconds);

  std::mutex queueMutex_;
  std::condition_variable queueCv_;
  std::condition_variable idleCv_;
  std::deque<std::function<void()>> queue_;
  bool running_ = false;  // a task is executing
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace pycomm
