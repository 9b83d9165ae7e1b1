// The last N ops of every pycomm group in this process, dumped in the format torch's flight-recorder
// analyzer reads (python -m torch.distributed.flight_recorder.fr_trace): a pickled dict of
// version, pg_config and entries, one file per rank at ${TORCH_FR_DUMP_TEMP_FILE}<rank>.
//
// Not torch's own c10d::FlightRecorder: libtorch exports none of its instance's symbols, and an
// extension instantiating the template must ship the JSON header it includes and pays a Python
// stack capture per op (2.7 us a record measured, against this recorder's budget of 1 us). This one
// keeps what the analyzer reads: sequence numbers, op, sizes and dtypes, state and timestamps.
//
// torch's variables: TORCH_FR_BUFFER_SIZE (entries kept, 2000 by default, 0 turns recording off)
// and TORCH_FR_DUMP_TEMP_FILE (the dump's path prefix; automatic dumps on a collective's timeout and
// on abort() happen only when it is set). A dump on request (dump()) works either way.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace pycomm::torch_adapter {

// An op's name in a dump, from its profiler title ("pycomm:all_gather_into_tensor"): the name
// torch's analyzer knows the op by ("_all_gather_base"), behind the "gloo:" prefix, since the
// analyzer accepts only the prefixes of torch's own backends and pycomm's CPU ops are gloo's.
std::string traceName(const char* title);

class FlightRecorder {
 public:
  // A group as the dump's pg_config names it: torch's group name, and its global ranks.
  struct Group {
    std::string name;
    std::string desc;
    std::vector<int64_t> ranks;
  };

  // One per process, like torch's: a dump holds every group's entries in the order they were issued.
  static FlightRecorder& instance();

  bool enabled() const { return capacity_ > 0 && recording_.load(std::memory_order_relaxed); }
  // Pauses or resumes recording (a ring of size 0 stays off): for measuring what recording costs.
  void setRecording(bool on) { recording_.store(on, std::memory_order_relaxed); }
  // Records an op as scheduled; the id marks it started and completed. Nothing when disabled.
  // `title`: the op's profiler title (a literal: kept as a pointer, named at dump time); `p2pName`:
  // a send or receive's "send 0->1" / "recv 1<-0" (group ranks), empty for a collective.
  std::optional<uint64_t> record(const std::shared_ptr<const Group>& group, uint64_t collectiveSeq, uint64_t p2pSeq,
                                 const char* title, std::string p2pName, bool isP2P,
                                 c10::ArrayRef<at::Tensor> inputs, c10::ArrayRef<at::Tensor> outputs, int64_t timeoutMs);
  void started(const std::optional<uint64_t>& id);
  void completed(const std::optional<uint64_t>& id);
  void addGroup(const std::shared_ptr<const Group>& group);

  // The pickled dump (what the analyzer's loader reads with pickle.load).
  std::string dump();
  // Writes the dump to `path` (temporary file, then renamed); throws naming the path on failure.
  void dumpTo(const std::string& path);
  // ${TORCH_FR_DUMP_TEMP_FILE}<rank>, or empty when the variable is not set.
  static std::string defaultPath(int64_t rank);
  // An automatic dump (a timeout, an abort): to defaultPath(rank) when set; a failure is logged,
  // never thrown (the caller is failing an op already).
  void dumpOnFault(int64_t rank, const std::string& reason);

 private:
  FlightRecorder();

  struct Entry {
    uint64_t id = 0;
    const Group* group = nullptr;  // one of groups_
    uint64_t collectiveSeq = 0;
    uint64_t p2pSeq = 0;
    const char* title = "";
    std::string p2pName;
    bool isP2P = false;
    int64_t timeCreatedNs = 0;
    int64_t timeoutMs = 0;
    std::optional<int64_t> timeStartedNs;
    std::optional<int64_t> timeCompletedNs;
    c10::SmallVector<int64_t, 8> inputDims;  // per tensor: its number of dims; sizes in inputSizes
    c10::SmallVector<int64_t, 8> inputSizes;
    c10::SmallVector<c10::ScalarType, 4> inputDtypes;
    c10::SmallVector<int64_t, 8> outputDims;
    c10::SmallVector<int64_t, 8> outputSizes;
    c10::SmallVector<c10::ScalarType, 4> outputDtypes;
  };
  Entry* find(uint64_t id);  // under mutex_; null once overwritten

  const size_t capacity_;
  std::atomic<bool> recording_{true};
  std::mutex mutex_;
  std::mutex dumpMutex_;  // one dump file written at a time
  std::vector<Entry> entries_;  // a ring: entry id lives at id % capacity_
  uint64_t nextId_ = 0;
  std::vector<std::shared_ptr<const Group>> groups_;
};

}  // namespace pycomm::torch_adapter
