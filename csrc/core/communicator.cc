#include "communicator.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "algorithms/allreduce_plan.h"
#include "algorithms/binomial.h"
#include "algorithms/chain.h"
#include "algorithms/compressed.h"
#include "algorithms/cost_model.h"
#include "algorithms/direct.h"
#include "algorithms/hierarchical_compressed.h"
#include "algorithms/op.h"
#include "algorithms/ring.h"
#include "algorithms/shm_collectives.h"
#include "checked.h"
#include "error.h"
#include "transport/shm/segment_group.h"
#include "transport/subset_transport.h"
#include "transport/tcp/sha256.h"
#include "transport/tcp/tcp_transport.h"

namespace pycomm {

using algorithms::Op;
using algorithms::Segments;
using transport::Clock;
using transport::OpKind;
using transport::OpSignature;
using transport::shm::StepWait;

const char* algorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kRing: return "ring";
    case Algorithm::kTree: return "tree";
    case Algorithm::kRhd: return "rhd";
    default: return "auto";
  }
}

Algorithm parseAlgorithm(const std::string& name) {
  for (Algorithm a : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kTree, Algorithm::kRhd}) {
    if (name == algorithmName(a)) return a;
  }
  throw InvalidUsageError(strCat("unknown algorithm '", name, "' (valid: auto, ring, tree, rhd)"));
}

namespace {

OpSignature makeSignature(OpKind kind, DataType dtype, ReduceOp op, int root, size_t count) {
  OpSignature s;
  s.kind = kind;
  s.dtype = static_cast<uint8_t>(dtype);
  s.reduceOp = static_cast<uint8_t>(op);
  s.root = root;
  s.count = count;
  return s;
}

size_t alignUp(size_t n) { return (n + 63) & ~size_t{63}; }

// The user's settings, made safe to compute with: a chunk past 1 TiB cuts nothing a chunk of 1 TiB
// would not, and keeps chunk x world far from overflowing (a wrap to 0 would never end a cutting loop).
constexpr size_t kMaxChunkBytes = size_t{1} << 40;

Config withClampedLimits(Config config) {
  config.timeout = clampTimeout(config.timeout);
  config.chunkBytes = std::min(config.chunkBytes, kMaxChunkBytes);
  return config;
}

// Below this, broadcast and reduce use binomial trees (latency bound); above, pipelined chain/ring.
constexpr size_t kShortMessageBytes = 64 * 1024;

}  // namespace

Communicator::Communicator(const Config& config, Store& store)
    : config_(withClampedLimits(config)),
      prefix_(strCat("[rank ", config.rank, "/", config.size, "]")),
      logger_(config.logLevel, strCat("[rank ", config.rank, "/", config.size, " group ",
                                      config.groupName.empty() ? "default" : config.groupName, "]")),
      ledger_(prefix_),
      timeoutMs_(config_.timeout.count()) {
  PYCOMM_CHECK(config.size >= 1 && config.rank >= 0 && config.rank < config.size, InvalidUsageError,
               "invalid rank ", config.rank, " for a group of ", config.size);
  PYCOMM_CHECK(config.chunkBytes >= 64, InvalidUsageError, "chunk_bytes must be at least 64, got ",
               config.chunkBytes);
  transport::tcp::TcpOptions options;
  options.rank = config.rank;
  options.size = config.size;
  options.bindHost = config.bindHost;
  options.timeout = config_.timeout;
  options.linger = config.tcpLinger;
  options.unexpectedBytes = config.unexpectedBytes;
  options.logger = logger_;
  auto tcp = std::make_unique<transport::tcp::TcpTransport>(options, store, ledger_);
  links_ = tcp.get();
  transport_ = std::move(tcp);
  if (config.transport != TransportKind::kTcp && config.size > 1) setupSharedMemory(store);
  tasks_ = TaskQueue::start(prefix_, "collective", logger_);
  completions_ = TaskQueue::start(prefix_, "point-to-point completion", logger_);
  logger_.log(LogLevel::kInfo, strCat("connected over ", transport_->name(), ", listening on ",
                                      config.bindHost, ", chunk ", config.chunkBytes, " B"));
}

Communicator::~Communicator() {
  shutdown();
  // Completions of requests the abort failed are still queued: they wake their waiters first.
  completions_->stop();
}

std::chrono::milliseconds clampTimeout(std::chrono::milliseconds timeout) {
  // Not positive: what an overflow upstream leaves of a huge timeout (torch wraps timedelta.max).
  return timeout.count() <= 0 ? kMaxTimeout : std::min(timeout, kMaxTimeout);
}

void Communicator::setTimeout(std::chrono::milliseconds timeout) { timeoutMs_.store(clampTimeout(timeout).count()); }

void Communicator::rejectCollective(const std::string& message) {
  // No ledger_.begin: frames the peers already sent for this op must not turn this rank's report into
  // a mismatch message, since the reason is the input, which the peers should read.
  const uint64_t seq = ++seq_;
  // The peers may be in a step of this op in shared memory, which this rank never joins: their
  // published flags would pair with this rank's next op. The group leaves shared memory first.
  if (transport::shm::Group* group = localGroup(); group != nullptr && !shmBroken_) {
    group->abandon(seq + 1);
    shmBroken_ = true;
  }
  ledger_.recordOwnFailure(seq, message);
  transport_->reportFailure(seq, message);
  ledger_.retire(seq, false);
}

void Communicator::setupSharedMemory(Store& store) {
  const std::string mine = config_.hostId;
  if (mine.empty()) return;
  // A host's segment is named after the group's random token, so any rank can remove it. The token
  // is read before this rank publishes its host id: no segment exists before every host id is
  // published, so whenever one may exist this rank knows its name, even once the store is gone.
  const auto token = store.get("pycomm/token", timeout());
  // From a hash of the token, not the token: /dev/shm names are visible to everyone on the host.
  std::vector<uint8_t> labelled = {'p', 'y', 'c', 'o', 'm', 'm', '-', 's', 'h', 'm'};
  labelled.insert(labelled.end(), token.begin(), token.end());
  const auto digest = transport::tcp::sha256(labelled.data(), labelled.size());
  std::string tokenHex;
  for (size_t i = 0; i < 12; ++i) tokenHex += strCat(std::hex, (digest[i] >> 4) & 0xf, digest[i] & 0xf);
  auto segmentName = [&](int hostIndex) { return strCat("/pycomm-", tokenHex, "-", hostIndex); };
  try {
    formSharedMemoryGroups(store, segmentName);
  } catch (const transport::shm::SharedMemoryUnavailable& e) {
    for (int hostIndex = 0; hostIndex < size(); ++hostIndex) transport::shm::Segment::unlinkName(segmentName(hostIndex));
    PYCOMM_CHECK(config_.transport != TransportKind::kShm, InvalidUsageError, prefix(), " transport=shm: ", e.what());
    shm_.reset();
    hierarchy_.reset();
  } catch (...) {
    // A creator that died (store and all) after creating its segment leaves it to us; a rank that
    // failed before it knew its host index does not know which name is ours, so it removes them all.
    for (int hostIndex = 0; hostIndex < size(); ++hostIndex) transport::shm::Segment::unlinkName(segmentName(hostIndex));
    throw;
  }
}

void Communicator::formSharedMemoryGroups(Store& store, const std::function<std::string(int)>& segmentName) {
  const std::string mine = config_.hostId;
  store.set(strCat("pycomm/host/", rank()), std::vector<uint8_t>(mine.begin(), mine.end()));
  // chunk_bytes cuts the shared-memory steps of the hierarchical schedules: ranks that disagree on
  // it would pair steps of different lengths, which no signature tells apart.
  const std::string chunk = std::to_string(config_.chunkBytes);
  store.set(strCat("pycomm/chunk_bytes/", rank()), std::vector<uint8_t>(chunk.begin(), chunk.end()));
  std::vector<std::string> hosts(size());
  std::string otherChunk;
  int otherRank = -1;
  for (int q = 0; q < size(); ++q) {
    auto id = store.get(strCat("pycomm/host/", q), timeout());
    hosts[q] = std::string(id.begin(), id.end());
    auto theirs = store.get(strCat("pycomm/chunk_bytes/", q), timeout());
    if (otherRank < 0 && std::string(theirs.begin(), theirs.end()) != chunk) {
      otherRank = q;
      otherChunk.assign(theirs.begin(), theirs.end());
    }
  }
  if (otherRank >= 0) {
    // Every rank sees some disagreement, so all go without shared memory; the connections' frames
    // carry their lengths, so a schedule cut differently fails there with a clear error.
    logger_.log(LogLevel::kWarn, strCat("chunk_bytes differs between ranks (rank ", otherRank, ": ", otherChunk,
                                        ", this rank: ", chunk, "): the group runs without shared memory"));
    return;
  }
  // Hosts in order of their first rank; each host's ranks in rank order.
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> members;
  for (int q = 0; q < size(); ++q) {
    if (members.count(hosts[q]) == 0) order.push_back(hosts[q]);
    members[hosts[q]].push_back(q);
  }
  if (config_.transport == TransportKind::kShm && order.size() != 1) {
    // Every rank sees the same host list and raises the same error. The store usually lives in rank
    // 0's process, so no rank raises before all have read the list: a rank that left early would
    // turn the others' clear error into a lost store connection. A failure of this wait is only
    // logged, since this rank already knows its error.
    store.set(strCat("pycomm/host_read/", rank()), {1});
    try {
      for (int q = 0; q < size(); ++q) store.get(strCat("pycomm/host_read/", q), timeout());
    } catch (const std::exception& error) {
      logger_.log(LogLevel::kWarn, strCat("waiting for the other ranks to read the host list: ", error.what()));
    }
    throw InvalidUsageError(strCat(prefix(), " transport=shm needs every rank on one host, but this group spans ",
                                   order.size(), " hosts (host id of rank 0: '", hosts[0], "', of this rank: '", mine,
                                   "'); use transport=auto for shared memory inside hosts and TCP across them"));
  }
  const auto& local = members[mine];
  const int localRank = static_cast<int>(std::find(local.begin(), local.end(), rank()) - local.begin());
  const int hostIndex = static_cast<int>(std::find(order.begin(), order.end(), mine) - order.begin());
  bool uniform = true;
  for (const auto& host : order) uniform = uniform && members[host].size() == local.size();
  if (order.size() > 1 && (!uniform || local.size() < 2)) return;  // plain TCP serves best

  // Every rank runs exactly one barrier below, so sequence numbers stay equal across the group.
  // `members` maps a host group rank to its rank in this group. Every rank attaches its rings before
  // the barrier and moves its connections onto them after it, so a peer that reads a move frame
  // has its rings already.
  auto makeGroup = [&](int groupRank, int groupSize, const std::string& key, transport::Transport& barrierOver,
                       const std::vector<int>& groupMembers) {
    auto group = std::make_unique<transport::shm::SegmentGroup>(
        groupRank, groupSize, config_.shmSlotBytes, config_.shmRingBytes, segmentName(hostIndex),
        [&](bool created) { store.set(key, {static_cast<uint8_t>(created ? 1 : 0)}); },
        [&] { return store.get(key, timeout()) == std::vector<uint8_t>{1}; },
        [&](bool mappedHere, const std::string& why) {
          // Every rank of the communicator, on every host, votes once: all go without shared
          // memory if any lacks it, so the hosts keep one shape of all-reduce.
          const std::string mine = mappedHere ? "1" : "0" + why;
          store.set(strCat("pycomm/shm_mapped/", rank()), std::vector<uint8_t>(mine.begin(), mine.end()));
          bool all = true;
          for (int q = 0; q < size(); ++q) {
            const auto vote = store.get(strCat("pycomm/shm_mapped/", q), timeout());
            if (!vote.empty() && vote[0] == '1') continue;
            if (all) {
              logger_.log(LogLevel::kInfo, strCat("rank ", q, " has no shared memory with its host's ranks (",
                                                  std::string(vote.begin() + std::min<size_t>(vote.size(), 1), vote.end()),
                                                  "): the group runs over its connections"));
            }
            all = false;
          }
          return all;
        },
        [&](const transport::shm::SegmentGroup& g) {
          for (int q = 0; q < groupSize; ++q) {
            if (q != groupRank) links_->attachRings(groupMembers[q], g.ring(groupRank, q), g.ring(q, groupRank), g.memory());
          }
        },
        [&] {
          runCollective(makeSignature(OpKind::kBarrier, DataType::kUInt8, ReduceOp::kSum, -1, 0), "dissemination",
                        [&](Op& o) {
                          Op sub(barrierOver, ledger_, o.seq(), o.signature(), o.context(), o.deadline(), timeout());
                          algorithms::disseminationBarrier(sub);
                        });
        },
        groupMembers);
    for (int q = 0; q < groupSize; ++q) {
      if (q != groupRank) links_->moveToSharedMemory(groupMembers[q]);
    }
    return group;
  };
  if (order.size() == 1) {
    shm_ = makeGroup(rank(), size(), "pycomm/shm", *transport_, local);
    logger_.log(LogLevel::kInfo, "all ranks share this host: collectives use shared memory");
    return;
  }
  auto hierarchy = std::make_unique<Hierarchy>();
  hierarchy->localRank = localRank;
  hierarchy->localSize = static_cast<int>(local.size());
  std::vector<int> cross;
  for (const auto& host : order) cross.push_back(members[host][localRank]);
  for (const auto& host : order) hierarchy->grid.insert(hierarchy->grid.end(), members[host].begin(), members[host].end());
  hierarchy->cross = std::make_unique<transport::SubsetTransport>(*transport_, cross);
  transport::SubsetTransport localView(*transport_, local);
  hierarchy->local = makeGroup(localRank, hierarchy->localSize, strCat("pycomm/shm/", hostIndex), localView, local);
  hierarchy_ = std::move(hierarchy);
  logger_.log(LogLevel::kInfo, strCat(order.size(), " hosts of ", local.size(),
                                      " ranks: all-reduce is hierarchical (shared memory inside a host, TCP across)"));
}

template <typename Body>
bool Communicator::runShm(OpSignature signature, const char* algorithm, Body body) {
  if (!shm_ || !sharedMemoryFor(seq_.load() + 1)) return false;
  runCollective(signature, algorithm, [&](Op& o) {
    const StepWait wait = shmWait(o);
    try {
      body(wait);
    } catch (const std::exception&) {
      // The ranks' steps may now disagree: the group leaves shared memory from the next op on,
      // before anyone hears of this failure (op.fail reports it), so that a peer that hears it
      // finds the group's decision made when it starts its next op.
      shm_->abandon(o.seq() + 1);
      shmBroken_ = true;
      throw;
    }
  }, "shm", true);
  return true;
}

StepWait Communicator::shmWait(const Op& o) {
  return StepWait{o.deadline(), o.context(), [this](int q) { return transport_->peerFailure(q); }, o.seq(),
                  [this](uint64_t seq) { return ledger_.failure(seq); }};
}

transport::shm::Group* Communicator::localGroup() const {
  return shm_ ? shm_.get() : hierarchy_ ? hierarchy_->local.get() : nullptr;
}

bool Communicator::sharedMemoryFor(uint64_t seq) {
  transport::shm::Group* group = localGroup();
  if (group == nullptr || shmBroken_) return false;
  // Decided once per op: the adapter asks (allreducesInSharedMemory) before the op asks again.
  if (shmDecidedFor_ != seq) {
    shmDecidedFor_ = seq;
    if (group->abandonedAt(seq)) {
      shmBroken_ = true;
      logger_.log(LogLevel::kInfo, strCat("op #", seq, " and later run over the connections: the group gave shared "
                                          "memory up after a failure"));
    }
  }
  return !shmBroken_;
}

// ---------------------------------------------------------------------------------------------
// The worker

void Communicator::enqueue(std::function<void()> task) { tasks_->enqueue(std::move(task)); }

void Communicator::runOrEnqueue(std::function<void()> task) { tasks_->runOrEnqueue(std::move(task)); }

void Communicator::postCompletion(std::function<void()> completion) { completions_->post(std::move(completion)); }

bool Communicator::drain(std::chrono::milliseconds timeout) { return tasks_->drain(timeout); }

void Communicator::shutdown() {
  {
    std::lock_guard<std::mutex> lock(stateMutex_);
    if (shutDown_) return;
    shutDown_ = true;
  }
  // Ops already queued get a bounded grace to finish; a shutdown must not hang on a dead peer. From
  // inside a task (a completion callback) there is nothing to wait for: the tasks behind it cannot
  // run before it returns.
  const auto grace = std::min<std::chrono::milliseconds>(timeout(), std::chrono::seconds(30));
  if (!tasks_->insideTask() && !tasks_->onOwnThread() && !drain(grace)) {
    logger_.warn("shutdown: ops still pending after the grace period; aborting them");
  }
  abort("the process group was shut down");
}

void Communicator::abort(const std::string& reason) {
  transport_->abort(reason);
  tasks_->stop();
}

uint8_t* Communicator::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

template <typename Body>
void Communicator::runCollective(OpSignature signature, const char* algorithm, Body body,
                                 const char* transportName, bool viaShm) {
  const uint64_t seq = ++seq_;
  const auto start = Clock::now();
  if (transportName == nullptr) transportName = transport_->name();
  // Appended, not streamed: the streams (three per op, with the stats key and the prefix) cost
  // about a microsecond, a tenth of a 4 KiB all-reduce over shared memory.
  std::string context = prefix_;
  context.append(" ").append(transport::opKindName(signature.kind)).append("/").append(algorithm);
  context.append(" ").append(transportName).append(" seq=").append(std::to_string(seq));
  Op op(*transport_, ledger_, seq, signature, std::move(context), start + timeout(), timeout());
  try {
    ledger_.begin(seq, signature);
    announce(op, viaShm);
    body(op);
    op.finish();
  } catch (const std::exception& e) {
    op.fail(e.what());
    throw;
  }
  // This op completed everywhere it could; an earlier one that had completed here failed on a
  // peer. Raise that now, after this op, so the ranks stay in step and every rank hears of it.
  if (std::string late = ledger_.takeLateFailure(); !late.empty()) throw RemoteError(late);
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
  static const char* const kCodecs[] = {"", "/fp16", "/bf16", "/fp8_e4m3", "/fp8_e5m2"};
  record(std::string(transport::opKindName(signature.kind)).append(kCodecs[signature.codec <= 4 ? signature.codec : 0]),
         op.bytesSent(), op.bytesReceived(), us * 1e-6);
  if (logger_.enabled(LogLevel::kInfo)) {
    logger_.log(LogLevel::kInfo,
                strCat(" seq=", seq, " ", transport::opKindName(signature.kind), " ",
                       signature.count * elementSize(static_cast<DataType>(signature.dtype)), " B ",
                       algorithm, " ", transportName, " sent ", op.bytesSent(), " B ", us, " us"));
  }
}

void Communicator::announce(const Op& op, bool viaShm) {
  transport::shm::Group* group = shm_ && !shmBroken_ ? shm_.get() : hierarchy_ ? hierarchy_->local.get() : nullptr;
  if (group == nullptr) return;
  group->announce(op.seq(), op.signature());
  if (viaShm) return;  // a step that waits compares the announcements then (transport/shm/group.h)
  std::string mismatch = group->conflict(op.seq(), op.signature(), op.context());
  if (mismatch.empty()) return;
  // The peer is in a step of this op in shared memory and fails it too: both leave it.
  if (group == shm_.get()) {
    group->abandon(op.seq() + 1);
    shmBroken_ = true;
  }
  throw InvalidUsageError(mismatch);
}

void Communicator::record(const std::string& key, uint64_t sent, uint64_t received, double seconds) {
  std::lock_guard<std::mutex> lock(statsMutex_);
  OpStats& s = stats_[key];
  ++s.calls;
  s.bytesSent += sent;
  s.bytesReceived += received;
  s.seconds += seconds;
}

std::map<std::string, Communicator::OpStats> Communicator::stats() const {
  std::map<std::string, OpStats> out;
  {
    std::lock_guard<std::mutex> lock(statsMutex_);
    out = stats_;
  }
  // Frame bytes (headers included) by the path they took; shared-memory collectives add to neither.
  out["transport/socket"].bytesSent = links_->socketBytesSent();
  out["transport/socket"].bytesReceived = links_->socketBytesReceived();
  out["transport/shm_ring"].bytesSent = links_->ringBytesSent();
  // Of the socket bytes received, those the op's own thread read while it waited.
  out["transport/socket_by_waiter"].bytesReceived = links_->callerBytesReceived();
  return out;
}

// ---------------------------------------------------------------------------------------------
// Collectives

void Communicator::checkReducible(const ReduceSpec& spec, DataType dtype, const char* what) {
  const std::string error = reduceSpecError(spec, dtype);
  PYCOMM_CHECK_OP(error.empty(), prefix(), " ", what, ": ", error);
}

bool Communicator::allreducePieces(const std::vector<BufferList::Piece>& pieces, DataType dtype,
                                   const ReduceSpec& spec) {
  checkReducible(spec, dtype, "allreduce");
  // Asked before the pre-scale, which writes the pieces: a declined bucket is packed and scaled
  // by the caller's allreduce.
  if (!allreducesInSharedMemory()) return false;
  const size_t esize = elementSize(dtype);
  for (const auto& piece : pieces) applyPreScale(spec, piece.data, piece.bytes / esize, dtype);
  const BufferList list(pieces);
  const size_t count = list.bytes() / esize;
  const OpSignature signature = makeSignature(OpKind::kAllreduce, dtype, spec.op, -1, count);
  const bool ran = runShm(signature,
                          list.bytes() <= algorithms::kShmShortAllreduceBytes ? "shm-all-in-place"
                                                                              : "shm-slices-in-place",
                          [&](const StepWait& w) { algorithms::shmAllreduce(*shm_, list, count, dtype, spec.op, signature, w); });
  PYCOMM_CHECK(ran, InternalError, prefix(), " allreduce: shared memory declined a bucket it had accepted");
  for (const auto& piece : pieces) applyAverage(spec, piece.data, piece.bytes / esize, dtype, size());
  return true;
}

void Communicator::allreduce(void* data, size_t count, DataType dtype, const ReduceSpec& spec) {
  checkReducible(spec, dtype, "allreduce");
  applyPreScale(spec, data, count, dtype);
  allreduceOp(data, count, dtype, spec.op);
  applyAverage(spec, data, count, dtype, size());
}

void Communicator::allreduceOp(void* data, size_t count, DataType dtype, ReduceOp op) {
  const size_t nbytes = count * elementSize(dtype);
  const algorithms::AllreducePlan plan =
      algorithms::planAllreduce(config_.algorithm, &config_.costModel, nbytes, size(), dtype, config_.chunkBytes);
  auto* buf = static_cast<uint8_t*>(data);
  const OpSignature signature = makeSignature(OpKind::kAllreduce, dtype, op, -1, count);
  if (runShm(signature, nbytes <= algorithms::kShmShortAllreduceBytes ? "shm-all" : "shm-slices",
             [&](const StepWait& w) { algorithms::shmAllreduce(*shm_, data, count, dtype, op, signature, w); })) {
    return;
  }
  if (runHierarchical(signature, "hierarchical", [&](Op& cross, const algorithms::HostGrid& host) {
        hierarchicalAllreduce(cross, host, buf, count, dtype, op, plan.algorithm);
      })) {
    return;
  }
  runCollective(signature, algorithmName(plan.algorithm), [&](Op& o) {
    if (size() == 1) return;
    algorithms::OpSteps steps(o);
    algorithms::runAllreduce(
        steps, plan, buf, scratch(algorithms::allreduceScratchBytes<algorithms::OpSteps>(plan, count, size(), dtype)),
        count, dtype, op);
  });
}

void Communicator::broadcast(void* data, size_t count, DataType dtype, int root) {
  PYCOMM_CHECK_OP(root >= 0 && root < size(), prefix(), " broadcast: invalid root ", root);
  const size_t nbytes = count * elementSize(dtype);
  // Short messages: log2 p hops of a binomial tree; long ones: the pipelined chain, at link speed.
  const bool shortMessage = nbytes <= kShortMessageBytes;
  const OpSignature signature = makeSignature(OpKind::kBroadcast, dtype, ReduceOp::kSum, root, count);
  if (runShm(signature, "shm",
             [&](const StepWait& w) { algorithms::shmBroadcast(*shm_, data, nbytes, root, signature, w); })) {
    return;
  }
  runCollective(signature,
                shortMessage ? "binomial" : "chain", [&](Op& o) {
                  if (size() == 1) return;
                  if (shortMessage) {
                    algorithms::binomialBroadcast(o, static_cast<uint8_t*>(data), nbytes, root);
                  } else {
                    algorithms::chainBroadcast(o, static_cast<uint8_t*>(data), nbytes, root, config_.chunkBytes);
                  }
                });
}

void Communicator::reduce(void* data, size_t count, DataType dtype, const ReduceSpec& spec, int root) {
  PYCOMM_CHECK_OP(root >= 0 && root < size(), prefix(), " reduce: invalid root ", root);
  checkReducible(spec, dtype, "reduce");
  if (spec.preScale) {
    // A scaled copy, so that a non-root rank's input stays as it was.
    const size_t bytes = checkedMul(count, elementSize(dtype), strCat(prefix(), " reduce: bytes"));
    std::vector<uint8_t> scaled(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + bytes);
    applyPreScale(spec, scaled.data(), count, dtype);
    reduceOp(scaled.data(), count, dtype, spec.op, root);
    if (rank() == root && bytes > 0) std::memcpy(data, scaled.data(), bytes);
  } else {
    reduceOp(data, count, dtype, spec.op, root);
  }
  if (rank() == root) applyAverage(spec, data, count, dtype, size());
}

void Communicator::reduceOp(void* data, size_t count, DataType dtype, ReduceOp op, int root) {
  const size_t esize = elementSize(dtype);
  const size_t bytes = count * esize;
  const bool shortMessage = bytes <= kShortMessageBytes;
  runCollective(makeSignature(OpKind::kReduce, dtype, op, root, count), shortMessage ? "binomial" : "ring",
                [&](Op& o) {
    const int p = size();
    const int r = rank();
    if (p == 1) return;
    if (shortMessage) {
      uint8_t* work = scratch(2 * alignUp(bytes));
      algorithms::binomialReduce(o, static_cast<uint8_t*>(data), work, work + alignUp(bytes), count, dtype,
                                 op, root);
      return;
    }
    Segments segments(count, p);
    const size_t chunkElems = std::max<size_t>(1, config_.chunkBytes / esize);
    // Reduce-scatter a copy, so that non-root ranks keep their input as it was.
    uint8_t* work = scratch(alignUp(bytes) + algorithms::ringScratchBytes(segments, chunkElems, dtype));
    uint8_t* tmp = work + alignUp(bytes);
    if (bytes > 0) std::memcpy(work, data, bytes);
    algorithms::ringAllreduce(o, {work, tmp}, segments, dtype, op, chunkElems, false);
    const uint32_t slot = static_cast<uint32_t>(2 * (p - 1) * algorithms::ringChunkCount(segments, chunkElems));
    auto* out = static_cast<uint8_t*>(data);
    if (r == root) {
      std::memcpy(out + segments.offset(r) * esize, work + segments.offset(r) * esize,
                  segments.length(r) * esize);
      for (int peer = 0; peer < p; ++peer) {
        if (peer != r) o.recv(peer, slot, out + segments.offset(peer) * esize, segments.length(peer) * esize);
      }
    } else {
      o.send(root, slot, work + segments.offset(r) * esize, segments.length(r) * esize);
    }
    o.waitAll();
  });
}

void Communicator::allgather(const void* in, void* out, size_t count, DataType dtype) {
  const OpSignature signature = makeSignature(OpKind::kAllgather, dtype, ReduceOp::kSum, -1, count);
  if (runShm(signature, "shm", [&](const StepWait& w) {
        algorithms::shmAllgather(*shm_, in, out, count * elementSize(dtype), signature, w);
      })) {
    return;
  }
  runCollective(signature, "ring", [&](Op& o) {
    const size_t esize = elementSize(dtype);
    auto* dst = static_cast<uint8_t*>(out);
    if (count > 0 && dst + rank() * count * esize != in) {
      std::memmove(dst + rank() * count * esize, in, count * esize);
    }
    const size_t chunkElems = std::max<size_t>(1, config_.chunkBytes / esize);
    algorithms::ringAllgather(o, dst, Segments(count, size(), true), esize, chunkElems);
  });
}

void Communicator::reduceScatter(const void* in, void* out, size_t count, DataType dtype, const ReduceSpec& spec) {
  checkReducible(spec, dtype, "reduce_scatter");
  if (spec.preScale) {
    // A scaled copy: the caller's input is left as it was.
    const size_t n = checkedMul(count, static_cast<size_t>(size()), strCat(prefix(), " reduce_scatter: elements"));
    const size_t bytes = checkedMul(n, elementSize(dtype), strCat(prefix(), " reduce_scatter: bytes"));
    std::vector<uint8_t> scaled(static_cast<const uint8_t*>(in), static_cast<const uint8_t*>(in) + bytes);
    applyPreScale(spec, scaled.data(), n, dtype);
    reduceScatterOp(scaled.data(), out, count, dtype, spec.op);
  } else {
    reduceScatterOp(in, out, count, dtype, spec.op);
  }
  applyAverage(spec, out, count, dtype, size());
}

void Communicator::reduceScatterOp(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) {
  const OpSignature signature = makeSignature(OpKind::kReduceScatter, dtype, op, -1, count);
  if (runShm(signature, "shm", [&](const StepWait& w) {
        algorithms::shmReduceScatter(*shm_, in, out, count, dtype, op, signature, w);
      })) {
    return;
  }
  runCollective(signature, "ring", [&](Op& o) {
    const size_t esize = elementSize(dtype);
    const size_t bytes = count * esize * size();
    Segments segments(count, size(), true);
    const size_t chunkElems = std::max<size_t>(1, config_.chunkBytes / esize);
    uint8_t* work = scratch(alignUp(bytes) + algorithms::ringScratchBytes(segments, chunkElems, dtype));
    if (bytes > 0) std::memcpy(work, in, bytes);
    algorithms::ringAllreduce(o, {work, work + alignUp(bytes)}, segments, dtype, op, chunkElems, false);
    if (count > 0) std::memcpy(out, work + rank() * count * esize, count * esize);
  });
}

void Communicator::gather(const void* in, void* out, size_t count, DataType dtype, int root) {
  PYCOMM_CHECK_OP(root >= 0 && root < size(), prefix(), " gather: invalid root ", root);
  runCollective(makeSignature(OpKind::kGather, dtype, ReduceOp::kSum, root, count), "direct", [&](Op& o) {
    algorithms::directGather(o, static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out),
                             count * elementSize(dtype), root);
  });
}

void Communicator::scatter(const void* in, void* out, size_t count, DataType dtype, int root) {
  PYCOMM_CHECK_OP(root >= 0 && root < size(), prefix(), " scatter: invalid root ", root);
  runCollective(makeSignature(OpKind::kScatter, dtype, ReduceOp::kSum, root, count), "direct", [&](Op& o) {
    algorithms::directScatter(o, static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out),
                              count * elementSize(dtype), root);
  });
}

void Communicator::alltoall(const void* in, const std::vector<size_t>& sendCounts,
                            const std::vector<size_t>& sendOffsets, void* out,
                            const std::vector<size_t>& recvCounts,
                            const std::vector<size_t>& recvOffsets, DataType dtype) {
  const size_t p = static_cast<size_t>(size());
  PYCOMM_CHECK_OP(sendCounts.size() == p && sendOffsets.size() == p && recvCounts.size() == p &&
                      recvOffsets.size() == p,
                  prefix(), " alltoall: expected ", p, " counts and offsets");
  PYCOMM_CHECK_OP(sendCounts[rank()] == recvCounts[rank()], prefix(),
               " alltoall: this rank sends ", sendCounts[rank()], " elements to itself but expects ",
               recvCounts[rank()]);
  // Per-peer counts may legitimately differ, so the signature carries none; each frame's size is
  // still checked against the receive it lands in.
  runCollective(makeSignature(OpKind::kAlltoall, dtype, ReduceOp::kSum, -1, 0), "direct", [&](Op& o) {
    const size_t esize = elementSize(dtype);
    auto bytes = [&](const std::vector<size_t>& v) {
      std::vector<size_t> out(v.size());
      for (size_t i = 0; i < v.size(); ++i) out[i] = checkedMul(v[i], esize, strCat(prefix(), " alltoall: bytes of block ", i));
      return out;
    };
    algorithms::directAlltoall(o, static_cast<const uint8_t*>(in), bytes(sendOffsets), bytes(sendCounts),
                               static_cast<uint8_t*>(out), bytes(recvOffsets), bytes(recvCounts));
  });
}

void Communicator::setAlgorithm(Algorithm algorithm) { config_.algorithm = algorithm; }

// A failure inside the op moves this host to the flat path, every rank of it (abandon); a failure
// a peer reported afterwards, of an op that completed here, leaves the steps in agreement. The
// other hosts cannot see this host's segment; their ranks fail the op too and leave their own
// host's shared memory the same way: docs/RELIABILITY.md.
template <typename Body>
bool Communicator::runHierarchical(OpSignature signature, const char* algorithm, Body body) {
  if (!hierarchy_ || !sharedMemoryFor(seq_.load() + 1)) return false;
  runCollective(signature, algorithm, [&](Op& o) {
    Hierarchy& h = *hierarchy_;
    const StepWait wait = shmWait(o);
    // Same signature as the whole op: frames of one seq must all agree (OpLedger::begin).
    Op cross(*h.cross, ledger_, o.seq(), o.signature(), o.context() + " (across hosts)", o.deadline(), timeout());
    try {
      body(cross, algorithms::HostGrid{*h.local, wait, o.signature(), h.grid});
      cross.waitAll();
    } catch (const std::exception& e) {
      // The host's ranks may now disagree about this op (a local index whose cross op failed
      // while the others' completed): the host leaves shared memory from the next op on, before
      // anyone hears of this failure, as runShm does.
      h.local->abandon(o.seq() + 1);
      shmBroken_ = true;
      cross.fail(e.what());
      throw;
    }
    o.countBytesOf(cross);
  }, "shm+tcp", true);
  return true;
}

// Reduce inside the host over shared memory, all-reduce one slice per local rank across hosts over
// TCP (so every rank of a host carries its share of the inter-host traffic), then gather the
// slices inside the host.
void Communicator::hierarchicalAllreduce(Op& cross, const algorithms::HostGrid& host, uint8_t* data, size_t count,
                                         DataType dtype, ReduceOp op, Algorithm algorithm) {
  const Hierarchy& h = *hierarchy_;
  const size_t esize = elementSize(dtype);
  algorithms::shmAllreduce(host.local, data, count, dtype, op, host.sig, host.wait);
  Segments slices(count, h.localSize);
  uint8_t* slice = data + slices.offset(h.localRank) * esize;
  const size_t n = slices.length(h.localRank);
  // The algorithm was planned for the whole op (allreduce()); the rest of the plan is the slice's.
  const algorithms::AllreducePlan plan = algorithms::planAllreduce(algorithm, nullptr, n * esize, h.cross->size(), dtype,
                                                                   config_.chunkBytes);
  algorithms::OpSteps steps(cross);
  algorithms::runAllreduce(
      steps, plan, slice,
      scratch(algorithms::allreduceScratchBytes<algorithms::OpSteps>(plan, n, h.cross->size(), dtype)), n, dtype, op);
  cross.waitAll();
  std::vector<size_t> offsets(h.localSize + 1);
  for (int q = 0; q <= h.localSize; ++q) offsets[q] = (q < h.localSize ? slices.offset(q) : count) * esize;
  algorithms::shmAllgatherParts(host.local, data, offsets, host.sig, host.wait);
}

namespace {
OpSignature compressedSignature(OpKind kind, size_t count, codecs::Codec codec, bool average) {
  OpSignature s = makeSignature(kind, DataType::kFloat32, ReduceOp::kSum, -1, count);
  s.codec = transport::signatureCodec(codec);
  s.root = average ? -2 : -1;  // AVG and SUM must not be mixed across ranks either
  return s;
}
}  // namespace

void Communicator::allreduceCompressed(float* data, size_t count, codecs::Codec codec, bool average, float* residual) {
  const OpSignature signature = compressedSignature(OpKind::kAllreduce, count, codec, average);
  if (runHierarchical(signature, "hierarchical-compressed", [&](Op& cross, const algorithms::HostGrid& host) {
        algorithms::hierarchicalCompressedAllreduce(cross, host, data, count, codec, average, config_.chunkBytes,
                                                    scratch_, residual);
      })) {
    return;
  }
  runCollective(signature, "compressed", [&](Op& o) {
    if (size() == 1) {
      // One rank still rounds the way the group would, so results do not depend on the world size.
      std::vector<uint8_t> encoded(codecs::encodedBytes(codec, count));
      if (residual != nullptr) {
        std::vector<float> decoded(count);
        algorithms::encodeWithFeedback(codec, data, residual, count, encoded.data(), decoded.data());
        std::copy(decoded.begin(), decoded.end(), data);
        return;
      }
      codecs::encode(codec, data, count, encoded.data());
      codecs::decode(codec, encoded.data(), count, data);
      return;
    }
    algorithms::compressedAllreduce(o, data, count, codec, average, config_.chunkBytes, scratch_, residual);
  });
}

void Communicator::reduceScatterCompressed(const float* in, float* out, size_t count, codecs::Codec codec,
                                           bool average) {
  const OpSignature signature = compressedSignature(OpKind::kReduceScatter, count, codec, average);
  if (runHierarchical(signature, "hierarchical-compressed", [&](Op& cross, const algorithms::HostGrid& host) {
        algorithms::hierarchicalCompressedReduceScatter(cross, host, in, out, count, codec, average, scratch_, staging_);
      })) {
    return;
  }
  runCollective(signature, "compressed", [&](Op& o) {
    algorithms::compressedReduceScatter(o, in, out, count, codec, average, scratch_);
  });
}

void Communicator::allgatherCompressed(const float* in, float* out, size_t count, codecs::Codec codec) {
  const OpSignature signature = compressedSignature(OpKind::kAllgather, count, codec, false);
  if (runHierarchical(signature, "hierarchical-compressed", [&](Op& cross, const algorithms::HostGrid& host) {
        algorithms::hierarchicalCompressedAllgather(cross, host, in, out, count, codec, config_.chunkBytes, scratch_,
                                                    staging_);
      })) {
    return;
  }
  runCollective(signature, "compressed", [&](Op& o) {
    algorithms::compressedAllgather(o, in, out, count, codec, config_.chunkBytes, scratch_);
  });
}

void Communicator::barrier() {
  const OpSignature signature = makeSignature(OpKind::kBarrier, DataType::kUInt8, ReduceOp::kSum, -1, 0);
  if (runShm(signature, "shm", [&](const StepWait& w) { algorithms::shmBarrier(*shm_, signature, w); })) return;
  runCollective(signature,
                "dissemination", [&](Op& o) { algorithms::disseminationBarrier(o); });
}

// ---------------------------------------------------------------------------------------------
// Point-to-point

std::shared_ptr<Request> Communicator::send(const void* data, size_t nbytes, int peer, uint64_t tag) {
  record("send", nbytes, 0, 0);
  transport::FrameInfo info;
  info.channel = transport::Channel::kP2P;
  info.seq = tag;
  info.signature = makeSignature(OpKind::kSend, DataType::kUInt8, ReduceOp::kSum, -1, nbytes);
  return transport_->isend(peer, info, data, nbytes);
}

std::shared_ptr<Request> Communicator::recv(void* data, size_t nbytes, int peer, uint64_t tag) {
  record("recv", 0, nbytes, 0);
  transport::FrameInfo info;
  info.channel = transport::Channel::kP2P;
  info.seq = tag;
  info.signature = makeSignature(OpKind::kSend, DataType::kUInt8, ReduceOp::kSum, -1, nbytes);
  return transport_->irecv(peer, info, data, nbytes);
}

void Communicator::onComplete(const std::shared_ptr<Request>& request, std::function<void()> callback,
                              std::function<bool()> awaited) {
  std::weak_ptr<TaskQueue> completions = completions_;
  std::weak_ptr<TaskQueue> tasks = tasks_;
  transport::Transport* transport = transport_.get();  // alive while it completes requests
  request->onDone([completions, tasks, transport, callback = std::move(callback), awaited = std::move(awaited)] {
    // Not on the event loop, and not in the middle of a collective that read this frame off its
    // socket either: a callback that issued an op there would run it nested, out of step.
    const auto worker = tasks.lock();
    const bool inCollective = worker && (worker->insideTask() || worker->onOwnThread());
    if (!transport->onIoThread() && !inCollective) return callback();
    if (awaited && awaited()) return;  // the waiter completes it (and must, once it was asked)
    if (auto queue = completions.lock()) return queue->post(callback);
    callback();
  });
}

void Communicator::waitPointToPoint(const std::shared_ptr<Request>& request, const std::string& what,
                                    std::chrono::milliseconds timeout) {
  timeout = clampTimeout(timeout);
  const auto deadline = Clock::now() + timeout;
  try {
    transport_->wait(request, deadline, strCat(prefix(), " ", what));
  } catch (const TimeoutError& e) {
    const TimeoutError error(strCat(e.what(), " after ", timeout.count(), " ms"));
    // Detached (or done meanwhile): failing it now runs its callback, which would otherwise hold
    // its Work (and the Work the request) forever, and keeps a late copy out of the caller's tensor.
    if (transport_->cancel(request, Clock::now() + std::chrono::seconds(5))) request->fail(std::make_exception_ptr(error));
    throw error;
  }
}

}  // namespace pycomm
