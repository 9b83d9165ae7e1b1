#include "flight_recorder.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "core/error.h"
#include "core/logging.h"
#include "core/shrink.h"

namespace pycomm::torch_adapter {
namespace {

// The entries' layout of torch 2.13's dumps, which its analyzer checks (it refuses other versions'
// layouts for coalesced ops).
constexpr const char* kDumpVersion = "2.10";
constexpr size_t kDefaultCapacity = 2000;
constexpr size_t kMaxCapacity = size_t{1} << 20;

void warn(const std::string& message) { Logger(LogLevel::kWarn, " flight recorder").warn(message); }

size_t capacityFromEnvironment() {
  const char* value = std::getenv("TORCH_FR_BUFFER_SIZE");
  // torch's older name, which it still reads when the new one is not set.
  if (value == nullptr || *value == '\0') value = std::getenv("TORCH_NCCL_TRACE_BUFFER_SIZE");
  if (value == nullptr || *value == '\0') return kDefaultCapacity;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || n < 0) {
    warn(strCat("TORCH_FR_BUFFER_SIZE=", value, " is not a count of entries: keeping ", kDefaultCapacity));
    return kDefaultCapacity;
  }
  if (static_cast<unsigned long long>(n) > kMaxCapacity) {
    warn(strCat("TORCH_FR_BUFFER_SIZE=", value, " is more than ", kMaxCapacity, " entries: keeping ", kMaxCapacity));
    return kMaxCapacity;
  }
  return static_cast<size_t>(n);
}

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

template <typename Dims, typename Sizes, typename Dtypes>
void describe(c10::ArrayRef<at::Tensor> tensors, Dims& dims, Sizes& sizes, Dtypes& dtypes) {
  for (const auto& t : tensors) {
    const auto s = t.sizes();
    dims.push_back(static_cast<int64_t>(s.size()));
    sizes.append(s.begin(), s.end());
    dtypes.push_back(t.scalar_type());
  }
}

c10::Dict<c10::IValue, c10::IValue> newDict() { return c10::Dict<c10::IValue, c10::IValue>(c10::AnyType::get(), c10::AnyType::get()); }

template <typename Dims, typename Sizes>
c10::List<c10::IValue> sizesList(const Dims& dims, const Sizes& sizes) {
  c10::List<c10::IValue> out(c10::AnyType::get());
  size_t at = 0;
  for (int64_t n : dims) {
    std::vector<int64_t> one(sizes.begin() + static_cast<std::ptrdiff_t>(at),
                             sizes.begin() + static_cast<std::ptrdiff_t>(at + static_cast<size_t>(n)));
    out.push_back(c10::IValue(one));
    at += static_cast<size_t>(n);
  }
  return out;
}

template <typename Dtypes>
c10::List<c10::IValue> dtypesList(const Dtypes& dtypes) {
  c10::List<c10::IValue> out(c10::AnyType::get());
  for (auto d : dtypes) out.push_back(c10::IValue(std::string(c10::toString(d))));
  return out;
}

c10::IValue optionalNs(const std::optional<int64_t>& ns) { return ns ? c10::IValue(*ns) : c10::IValue(); }

}  // namespace

std::string traceName(const char* title) {
  static const std::unordered_map<std::string, std::string> kAnalyzerNames = {
      {"all_reduce_compressed", "all_reduce"},
      {"all_reduce_sparse", "all_reduce"},
      {"all_reduce_coalesced", "allreduce_coalesced"},
      {"all_gather_coalesced", "ALLGATHER_coalesced"},
      {"all_gather_into_tensor", "_all_gather_base"},
      {"reduce_scatter_tensor", "_reduce_scatter_base"},
      // The analyzer lets ranks' input sizes differ only for "all_to_all", gloo's name for both forms.
      {"all_to_all_single", "all_to_all"},
  };
  std::string op(title);
  if (const auto colon = op.find(':'); colon != std::string::npos) op.erase(0, colon + 1);
  const auto it = kAnalyzerNames.find(op);
  return "gloo:" + (it == kAnalyzerNames.end() ? op : it->second);
}

FlightRecorder& FlightRecorder::instance() {
  // Never destroyed: groups may record from their threads while the process exits.
  static FlightRecorder* recorder = new FlightRecorder();  // NOLINT: a process-lifetime singleton
  return *recorder;
}

FlightRecorder::FlightRecorder() : capacity_(capacityFromEnvironment()) {}

std::optional<uint64_t> FlightRecorder::record(const std::shared_ptr<const Group>& group, uint64_t collectiveSeq,
                                               uint64_t p2pSeq, const char* title, std::string p2pName, bool isP2P,
                                               c10::ArrayRef<at::Tensor> inputs, c10::ArrayRef<at::Tensor> outputs,
                                               int64_t timeoutMs) {
  if (!enabled()) return std::nullopt;
  const int64_t created = nowNs();
  std::lock_guard<std::mutex> lock(mutex_);
  // The whole ring at once: growing it under this lock would move every entry while each group's
  // threads wait for it. An entry is overwritten in place, its vectors' room reused: building
  // one and moving it in cost a third of a record.
  if (entries_.capacity() < capacity_) entries_.reserve(capacity_);
  const uint64_t id = nextId_++;
  const size_t slot = static_cast<size_t>(id % capacity_);
  if (slot == entries_.size()) entries_.emplace_back();  // the first lap: ids come in order
  Entry& e = entries_[slot];
  e.id = id;
  e.group = group.get();  // groups_ keeps every group alive (addGroup)
  e.collectiveSeq = collectiveSeq;
  e.p2pSeq = p2pSeq;
  e.title = title;
  e.p2pName = std::move(p2pName);
  e.isP2P = isP2P;
  e.timeCreatedNs = created;
  e.timeoutMs = timeoutMs;
  e.timeStartedNs.reset();
  e.timeCompletedNs.reset();
  e.inputDims.clear();
  e.inputSizes.clear();
  e.inputDtypes.clear();
  e.outputDims.clear();
  e.outputSizes.clear();
  e.outputDtypes.clear();
  describe(inputs, e.inputDims, e.inputSizes, e.inputDtypes);
  describe(outputs, e.outputDims, e.outputSizes, e.outputDtypes);
  return id;
}

FlightRecorder::Entry* FlightRecorder::find(uint64_t id) {
  const size_t slot = static_cast<size_t>(id % capacity_);
  return slot < entries_.size() && entries_[slot].id == id ? &entries_[slot] : nullptr;
}

void FlightRecorder::started(const std::optional<uint64_t>& id) {
  if (!id) return;
  const int64_t now = nowNs();
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(*id); e != nullptr && !e->timeStartedNs) e->timeStartedNs = now;
}

void FlightRecorder::completed(const std::optional<uint64_t>& id) {
  if (!id) return;
  const int64_t now = nowNs();
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(*id); e != nullptr && !e->timeCompletedNs) {
    if (!e->timeStartedNs) e->timeStartedNs = now;
    e->timeCompletedNs = now;
  }
}

void FlightRecorder::addGroup(const std::shared_ptr<const Group>& group) {
  std::lock_guard<std::mutex> lock(mutex_);
  groups_.push_back(group);
}

std::string FlightRecorder::dump() {
  std::vector<Entry> entries;
  std::vector<std::shared_ptr<const Group>> groups;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Oldest first: the ring's slots from the next one to overwrite, around.
    const size_t start = entries_.size() < capacity_ || capacity_ == 0 ? 0 : static_cast<size_t>(nextId_ % capacity_);
    for (size_t i = 0; i < entries_.size(); ++i) entries.push_back(entries_[(start + i) % entries_.size()]);
    groups = groups_;
  }
  auto pgConfig = newDict();
  for (const auto& g : groups) {
    auto config = newDict();
    config.insert("name", g->name);
    config.insert("desc", g->desc);
    config.insert("ranks", describeRanks(std::vector<int>(g->ranks.begin(), g->ranks.end())));
    pgConfig.insert_or_assign(g->name, config);
  }
  c10::List<c10::IValue> list(c10::AnyType::get());
  for (const auto& e : entries) {
    auto d = newDict();
    d.insert("record_id", static_cast<int64_t>(e.id));
    d.insert("pg_id", static_cast<int64_t>(0));
    d.insert("process_group", c10::ivalue::Tuple::create({c10::IValue(e.group->name), c10::IValue(e.group->desc)}));
    d.insert("collective_seq_id", static_cast<int64_t>(e.collectiveSeq));
    d.insert("p2p_seq_id", static_cast<int64_t>(e.p2pSeq));
    d.insert("op_id", static_cast<int64_t>(e.isP2P ? e.p2pSeq : e.collectiveSeq));
    d.insert("profiling_name", e.isP2P ? "gloo:" + e.p2pName : traceName(e.title));
    d.insert("time_created_ns", e.timeCreatedNs);
    d.insert("input_sizes", sizesList(e.inputDims, e.inputSizes));
    d.insert("input_dtypes", dtypesList(e.inputDtypes));
    d.insert("output_sizes", sizesList(e.outputDims, e.outputSizes));
    d.insert("output_dtypes", dtypesList(e.outputDtypes));
    d.insert("state", std::string(e.timeCompletedNs ? "completed" : e.timeStartedNs ? "started" : "scheduled"));
    d.insert("time_discovered_started_ns", optionalNs(e.timeStartedNs));
    d.insert("time_discovered_completed_ns", optionalNs(e.timeCompletedNs));
    d.insert("retired", e.timeCompletedNs.has_value());
    d.insert("timeout_ms", e.timeoutMs);
    d.insert("is_p2p", e.isP2P);
    if (e.timeStartedNs && e.timeCompletedNs) {
      d.insert("duration_ms", static_cast<double>(*e.timeCompletedNs - *e.timeStartedNs) / 1e6);
    }
    d.insert("frames", c10::List<c10::IValue>(c10::AnyType::get()));
    list.push_back(d);
  }
  auto out = newDict();
  out.insert("version", std::string(kDumpVersion));
  out.insert("comm_lib_version", std::string("pycomm"));
  out.insert("pg_config", pgConfig);
  out.insert("entries", list);
  const std::vector<char> bytes = torch::jit::pickle(c10::IValue(out));
  return std::string(bytes.begin(), bytes.end());
}

void FlightRecorder::dumpTo(const std::string& path) {
  const std::string bytes = dump();
  // One dump at a time per process (two groups timing out together, an abort beside a timeout),
  // through a temporary file whose name the analyzer never takes for a dump (it reads every file
  // whose name holds the prefix), renamed over the dump only once whole.
  std::lock_guard<std::mutex> lock(dumpMutex_);
  const auto slash = path.rfind('/');
  const std::string folder = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
  const std::string partial = strCat(folder, ".pycomm-flight-recorder-", ::getpid(), ".tmp");
  FILE* file = std::fopen(partial.c_str(), "wb");
  TORCH_CHECK(file != nullptr, "pycomm flight recorder: cannot write a dump next to ", path, " (", partial, ": ",
              std::strerror(errno), "): expected a writable path prefix (TORCH_FR_DUMP_TEMP_FILE)");
  const size_t written = std::fwrite(bytes.data(), 1, bytes.size(), file);
  int error = written == bytes.size() ? 0 : errno;
  if (std::fclose(file) != 0 && error == 0) error = errno;
  if (written != bytes.size() || error != 0) {
    std::remove(partial.c_str());
    TORCH_CHECK(false, "pycomm flight recorder: writing ", bytes.size(), " bytes to ", partial, " failed (",
                std::strerror(error), ")");
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    error = errno;
    std::remove(partial.c_str());
    TORCH_CHECK(false, "pycomm flight recorder: cannot rename ", partial, " to ", path, " (", std::strerror(error), ")");
  }
}

std::string FlightRecorder::defaultPath(int64_t rank) {
  const char* prefix = std::getenv("TORCH_FR_DUMP_TEMP_FILE");
  if (prefix == nullptr || *prefix == '\0') return {};
  return std::string(prefix) + std::to_string(rank);
}

void FlightRecorder::dumpOnFault(int64_t rank, const std::string& reason) {
  if (!enabled()) return;
  const std::string path = defaultPath(rank);
  if (path.empty()) return;
  try {
    dumpTo(path);
    warn(strCat("rank ", rank, ": dumped to ", path, " (", reason, ")"));
  } catch (const std::exception& e) {
    warn(strCat("rank ", rank, ": the dump after ", reason, " failed: ", e.what()));
  }
}

}  // namespace pycomm::torch_adapter
