// The adapter's one place for checking an op's tensors and mapping torch's terms (dtypes, reduce
// ops) to the core's. Every check throws torch's typed errors (ValueError, TypeError) with the
// rank and the op in front: "pycomm [rank 1/4] allreduce: ...".
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <optional>
#include <string>
#include <vector>

#include "core/codecs/block_codec.h"
#include "core/config.h"
#include "core/reduce_spec.h"

namespace pycomm::torch_adapter {

std::optional<DataType> mapDtype(at::ScalarType type);

// How the core sees a tensor's elements. Ops that only move data accept any dtype, as bytes.
struct Layout {
  DataType dtype;
  size_t scale;  // core elements per tensor element (element size when moved as bytes)
  size_t count(const at::Tensor& t) const { return static_cast<size_t>(t.numel()) * scale; }
};
Layout movable(const at::Tensor& t);

// A contiguous tensor for the core; results are copied back if the caller's was not contiguous.
struct Contiguous {
  at::Tensor original;
  at::Tensor flat;
  explicit Contiguous(const at::Tensor& t) : original(t), flat(t.is_contiguous() ? t : t.contiguous()) {}
  void copyBack() const {
    if (!flat.is_same(original)) original.copy_(flat);
  }
};

// The group's codec if a tensor of `type` and `op` (null: an op that reduces nothing) qualify for
// compression: float32, SUM or AVG.
std::optional<codecs::Codec> compressionFor(const Config& config, at::ScalarType type, const ::c10d::ReduceOp* op);

class Validator {
 public:
  Validator(int rank, int size, const char* op) : rank_(rank), size_(size), op_(op) {}

  std::string where() const;

  // The device of an op's tensors if they are not on the CPU: then all on one CUDA device.
  // `sawDevice` is set at the first tensor not on the CPU, before it is checked.
  std::optional<c10::Device> deviceOf(c10::ArrayRef<at::Tensor> tensors, bool& sawDevice) const;
  // Defined and strided (deviceOf checked the device).
  void tensor(const at::Tensor& t) const;
  // The one tensor of a list, checked.
  const at::Tensor& single(const std::vector<at::Tensor>& tensors) const;
  // `b` checked, of `a`'s dtype.
  void sameType(const at::Tensor& a, const at::Tensor& b) const;
  // Each of `list` checked, of `like`'s dtype and element count.
  void allLike(const at::Tensor& like, const std::vector<at::Tensor>& list, const char* listName,
               const char* likeName) const;
  // all_gather_into_tensor's output, reduce_scatter_tensor's input: one `each` per rank.
  void holdsOnePerRank(const at::Tensor& whole, const char* wholeName, const at::Tensor& each,
                       const char* eachName) const;
  // The coalesced forms of those: as many outputs as inputs, and each `wholes[i]` holding one
  // `parts[i]` per rank (`wholesAreOutputs`: all-gather; else reduce-scatter).
  void holdOnePerRank(const std::vector<at::Tensor>& wholes, const std::vector<at::Tensor>& parts,
                      bool wholesAreOutputs) const;
  void root(int64_t root) const;
  DataType reducible(const at::Tensor& t) const;
  // torch's reduce op as the core's reduction (PREMUL_SUM's factor, AVG) for tensors like `t`.
  ReduceSpec reduceSpec(const ::c10d::ReduceOp& op, const at::Tensor& t) const;

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  int rank_;
  int size_;
  const char* op_;
};

}  // namespace pycomm::torch_adapter
