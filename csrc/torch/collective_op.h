// A c10d collective as one descriptor: its tensors (what it reads and writes), its check and
// mapping to the core's terms, and its run over the CPU transports or, for the ops that have one,
// over the group's NCCL link. PycommBackend::dispatch (dispatch.cc) takes every collective the
// same way:
//
//   devices of the op's tensors (Validator::deviceOf)
//   CUDA tensors and an NCCL form: the group's route (cuda/nccl_route.h), the same on every rank
//   prepare(): checks the arguments once and maps them (ReduceSpec, dtype, counts)
//   CUDA over NCCL: runOnDevice() on the communication stream, the tensors used in place
//   CUDA staged: every tensor replaced by a pinned host stand-in (DeviceStaging), then as CPU
//   CPU: run() on the group's worker, in issue order
//
// Each override in reduce_ops.cc and data_ops.cc makes its op's descriptor and dispatches it; the
// queued task holds the descriptor until it ran.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <vector>

#include "core/algorithms/queued_link.h"
#include "core/algorithms/queued_stamp.h"
#include "core/communicator.h"
#include "device_staging.h"
#include "tensor_checks.h"

namespace pycomm::torch_adapter {

// The op's tensors, each with whether the op reads and writes it (what staging copies in and back).
// Holds pointers to the descriptor's own copies, which staging replaces by their host stand-ins.
class OpTensors {
 public:
  void add(at::Tensor& t, bool read, bool write) { slots_.push_back({&t, read, write}); }
  void add(std::vector<at::Tensor>& list, bool read, bool write);
  void add(std::vector<std::vector<at::Tensor>>& lists, bool read, bool write);
  // Lists built per op (the route's device check, the flight recorder's sizes): no heap allocation
  // for an op of a few tensors.
  using List = c10::SmallVector<at::Tensor, 4>;
  List all() const;
  // The inputs the profiler records (torch's record_shapes): the tensors the op reads, or, for an op
  // that reads none (a receiving rank), the ones it writes.
  List profiled() const;
  // The tensors the op writes (the flight recorder's output sizes).
  List written() const;
  void stage(DeviceStaging& staging);
  void recordUse(DeviceStaging& staging) const;

 private:
  struct Slot {
    at::Tensor* tensor;
    bool read;
    bool write;
  };
  std::vector<Slot> slots_;
};

class CollectiveOp {
 public:
  // `name` is what errors say ("allreduce"), `title` the profiler's ("pycomm:all_reduce").
  // `inlineOk`: a synchronous op, which may run on the caller's thread. `deviceForm`: NCCL runs it.
  CollectiveOp(::c10d::OpType type, const char* name, const char* title, bool inlineOk = false,
               bool deviceForm = false)
      : type_(type), name_(name), title_(title), inlineOk_(inlineOk), deviceForm_(deviceForm) {}
  virtual ~CollectiveOp() = default;
  CollectiveOp(const CollectiveOp&) = delete;
  CollectiveOp& operator=(const CollectiveOp&) = delete;

  // Checks the arguments (their devices are checked already) and maps them to the core's terms
  // under the group's `config`. On the caller's thread.
  virtual void prepare(const Validator& v, const Config& config) = 0;
  // The op over the CPU transports, on the worker, on the tensors as they are then (host stand-ins
  // when staged).
  virtual void run(Communicator& comm) = 0;
  // The NCCL form: what the route adds to prepare() (on the caller's thread), the op's stamp
  // (core/algorithms/queued_stamp.h), and its schedule on the communication stream (the worker).
  virtual void prepareForDevice(const Validator&) {}
  // Whether prepare() runs before the route of a CUDA op is decided: a failed check then raises on
  // this rank alone, before any rank agrees on the route or creates an NCCL communicator.
  virtual bool checksBeforeRoute() const { return false; }
  virtual algorithms::QueuedStamp stamp() const;
  virtual void runOnDevice(algorithms::QueuedLink& link, const Config& config);

  ::c10d::OpType type() const { return type_; }
  const char* name() const { return name_; }
  const char* title() const { return title_; }
  bool inlineOk() const { return inlineOk_; }
  bool hasDeviceForm() const { return deviceForm_; }
  OpTensors& tensors() { return tensors_; }
  const OpTensors& tensors() const { return tensors_; }
  const c10::IValue& outputs() const { return outputs_; }
  const c10::TypePtr& outputType() const { return outputType_; }

 protected:
  // What the op's future yields: the caller's tensors (device ones, for a staged op).
  void setOutputs(std::vector<at::Tensor> outputs);
  void setOutputs(std::vector<std::vector<at::Tensor>> outputs);
  void setOutputs(const at::Tensor& output) { setOutputs(std::vector<at::Tensor>{output}); }
  // The op reads `in` (the descriptor's copies) and writes `out`, which its future yields.
  template <typename In, typename Out>
  void readsInto(In& in, Out& out) {
    tensors_.add(in, true, false);
    tensors_.add(out, false, true);
    setOutputs(out);
  }

  OpTensors tensors_;

 private:
  ::c10d::OpType type_;
  const char* name_;
  const char* title_;
  bool inlineOk_;
  bool deviceForm_;
  c10::IValue outputs_;
  c10::TypePtr outputType_;
};

// Copies `tensors` end to end into `flat` (their total size), and back.
void packInto(const std::vector<at::Tensor>& tensors, const at::Tensor& flat);
void scatterInto(const at::Tensor& flat, const std::vector<at::Tensor>& tensors);
at::Tensor flatten(const std::vector<at::Tensor>& tensors);

}  // namespace pycomm::torch_adapter
