#include "communicator.h"

#include <algorithm>
#include <utility>

#include "communicator_run.h"
#include "error.h"
#include "transport/tcp/sha256.h"
#include "transport/tcp/tcp_transport.h"

namespace pycomm {

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

// The user's settings, made safe to compute with: a chunk past 1 TiB cuts nothing a chunk of 1 TiB
// would not, and keeps chunk x world far from overflowing (a wrap to 0 would never end a cutting loop).
constexpr size_t kMaxChunkBytes = size_t{1} << 40;

Config withClampedLimits(Config config) {
  config.timeout = clampTimeout(config.timeout);
  config.chunkBytes = std::min(config.chunkBytes, kMaxChunkBytes);
  config.deviceChunkBytes = std::min(config.deviceChunkBytes, kMaxChunkBytes);
  return config;
}

}  // namespace

Communicator::Communicator(const Config& config, Store& store)
    : config_(withClampedLimits(config)),
      prefix_(strCat("[rank ", config.rank, "/", config.size, "]")),
      logger_(config.logLevel, strCat("[rank ", config.rank, "/", config.size, " group ",
                                      config.groupName.empty() ? "default" : config.groupName, "]")),
      ledger_(config.rank, prefix_),
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
  if (config.lineage) options.token = config.lineage->token;
  auto tcp = std::make_unique<transport::tcp::TcpTransport>(options, store, ledger_);
  token_ = tcp->token();
  links_ = tcp.get();
  transport_ = std::move(tcp);
  if (config.transport != TransportKind::kTcp && config.size > 1) setupSharedMemory(store);
  formed_ = true;
  tasks_ = TaskQueue::start(prefix_, "collective", logger_);
  completions_ = TaskQueue::start(prefix_, "point-to-point completion", logger_);
  logger_.log(LogLevel::kInfo, strCat("connected over ", transport_->name(), ", listening on ",
                                      config.bindHost, ", chunk ", config_.chunkBytes, " B, CUDA chunk ",
                                      config_.deviceChunkBytes, " B"));
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

Lineage Communicator::lineageFor(const std::string& key) const {
  Lineage lineage;
  // A keyed hash of the key: distinct for every group formed from this one, never in the store,
  // and as hard to learn as this group's own.
  transport::tcp::HmacSha256 mac(token_.data(), token_.size());
  const std::string label = "pycomm-lineage|" + key;
  mac.update(label.data(), label.size());
  const auto digest = mac.finish();
  std::copy_n(digest.begin(), lineage.token.size(), lineage.token.begin());
  return lineage;
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
  transport_->reportFailure(seq, message, {});
  ledger_.retire(seq, false);
}

// ---------------------------------------------------------------------------------------------
// The worker

void Communicator::enqueue(std::function<void()> task) { tasks_->enqueue(std::move(task)); }

bool Communicator::runOrEnqueue(std::function<void()> task) { return tasks_->runOrEnqueue(std::move(task)); }

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
  if (!tasks_->insideTask() && !tasks_->onOwnThread() && !tasks_->drain(grace)) {
    logger_.warn("shutdown: ops still pending after the grace period; aborting them");
  }
  abort("the process group was shut down");
}

bool Communicator::shutDown() const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  return shutDown_;
}

void Communicator::abort(const std::string& reason) {
  transport_->abort(reason);
  tasks_->stop();
}

uint8_t* Communicator::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

namespace {

void add(Communicator::OpStats& into, const Communicator::OpStats& s) {
  into.calls += s.calls;
  into.bytesSent += s.bytesSent;
  into.bytesReceived += s.bytesReceived;
  into.seconds += s.seconds;
}

}  // namespace

void Communicator::record(const std::string& key, uint64_t sent, uint64_t received, double seconds) {
  std::lock_guard<std::mutex> lock(statsMutex_);
  add(stats_[key], {1, sent, received, seconds});
}

void Communicator::record(const transport::OpSignature& signature, uint64_t sent, uint64_t received,
                          double seconds) {
  const auto kind = static_cast<size_t>(signature.kind);
  const OpStats s{1, sent, received, seconds};
  std::lock_guard<std::mutex> lock(statsMutex_);
  add(kind < kStatsKinds ? collectiveStats_[kind][statsCodec(signature)] : stats_[statsKey(signature)], s);
}

std::string Communicator::statsKey(const transport::OpSignature& signature) {
  static const char* const kCodecs[] = {"", "/fp16", "/bf16", "/fp8_e4m3", "/fp8_e5m2"};
  static_assert(std::size(kCodecs) == kStatsCodecs, "a name for each codec the stats count");
  return std::string(transport::opKindName(signature.kind)).append(kCodecs[statsCodec(signature)]);
}

std::map<std::string, Communicator::OpStats> Communicator::stats() const {
  std::map<std::string, OpStats> out;
  {
    std::lock_guard<std::mutex> lock(statsMutex_);
    out = stats_;
    for (size_t kind = 0; kind < kStatsKinds; ++kind) {
      for (size_t codec = 0; codec < kStatsCodecs; ++codec) {
        const OpStats& s = collectiveStats_[kind][codec];
        if (s.calls == 0) continue;
        transport::OpSignature signature;
        signature.kind = static_cast<transport::OpKind>(kind);
        signature.codec = static_cast<uint8_t>(codec);
        add(out[statsKey(signature)], s);
      }
    }
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

void Communicator::setAlgorithm(Algorithm algorithm) { config_.algorithm = algorithm; }

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
    // Not judged (Transport::judgeTimeout): a point-to-point wait's timeout is the caller's choice,
    // often short, and says nothing about the peer's health.
    const TimeoutError error(strCat(e.what(), " after ", timeout.count(), " ms"));
    // Detached (or done meanwhile): failing it now runs its callback, which would otherwise hold
    // its Work (and the Work the request) forever, and keeps a late copy out of the caller's tensor.
    if (transport_->cancel(request, Clock::now() + std::chrono::seconds(5))) request->fail(std::make_exception_ptr(error));
    throw error;
  }
}

}  // namespace pycomm
