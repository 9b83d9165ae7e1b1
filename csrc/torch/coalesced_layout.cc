#include "coalesced_layout.h"

#include "core/checked.h"
#include "tensor_checks.h"

namespace pycomm::torch_adapter {
namespace {

// A tensor's elements, contiguous and flat (a copy only if it was not contiguous).
at::Tensor flatView(const at::Tensor& t) { return t.contiguous().reshape({-1}); }

// Writes `values` (numel of `out`, contiguous) into the caller's `out`, whatever its strides.
void writeInto(const at::Tensor& out, const at::Tensor& values) { out.copy_(values.view(out.sizes())); }

}  // namespace

void allgatherCoalesced(Communicator& comm, const std::vector<at::Tensor>& outputs,
                        const std::vector<at::Tensor>& inputs) {
  const int64_t world = comm.size();
  std::vector<at::Tensor> bytes;
  bytes.reserve(inputs.size());
  size_t block = 0;
  for (const auto& in : inputs) {
    bytes.push_back(flatView(in).view(at::kByte));
    block = checkedAdd(block, static_cast<size_t>(bytes.back().numel()), "allgather_into_tensor_coalesced bytes");
  }
  const at::Tensor packed = at::cat(bytes);
  const at::Tensor gathered =
      at::empty({static_cast<int64_t>(checkedMul(block, static_cast<size_t>(world), "all-gathered bytes"))},
                at::TensorOptions().dtype(at::kByte));
  comm.allgather(packed.data_ptr(), gathered.data_ptr(), block, DataType::kUInt8);
  const at::Tensor byRank = gathered.view({world, static_cast<int64_t>(block)});
  int64_t offset = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const int64_t n = bytes[i].numel();
    // Output i is rank 0's input i, then rank 1's, ...: column range [offset, offset + n) of each row.
    const at::Tensor out = outputs[i].is_contiguous() ? outputs[i] : at::empty_like(outputs[i], at::MemoryFormat::Contiguous);
    out.reshape({-1}).view(at::kByte).view({world, n}).copy_(byRank.narrow(1, offset, n));
    if (!out.is_same(outputs[i])) outputs[i].copy_(out);
    offset += n;
  }
}

void reduceScatterCoalesced(Communicator& comm, const std::vector<at::Tensor>& outputs,
                            const std::vector<at::Tensor>& inputs, const std::vector<DataType>& dtypes,
                            const std::vector<ReduceSpec>& specs) {
  const int64_t world = comm.size();
  std::vector<bool> done(inputs.size(), false);
  for (size_t first = 0; first < inputs.size(); ++first) {
    if (done[first]) continue;
    std::vector<size_t> group;  // the block's tensors of this dtype, in order
    for (size_t i = first; i < inputs.size(); ++i) {
      if (!done[i] && dtypes[i] == dtypes[first]) {
        group.push_back(i);
        done[i] = true;
      }
    }
    std::vector<at::Tensor> flats;
    size_t total = 0;  // elements of this rank's result
    for (size_t i : group) {
      flats.push_back(flatView(inputs[i]));
      total = checkedAdd(total, static_cast<size_t>(outputs[i].numel()), "reduce_scatter_tensor_coalesced elements");
    }
    std::vector<at::Tensor> pieces;
    pieces.reserve(group.size() * static_cast<size_t>(world));
    for (int64_t r = 0; r < world; ++r) {
      for (size_t k = 0; k < group.size(); ++k) {
        const int64_t n = outputs[group[k]].numel();
        pieces.push_back(flats[k].narrow(0, r * n, n));
      }
    }
    const at::Tensor packed = at::cat(pieces);
    const at::Tensor reduced = at::empty({static_cast<int64_t>(total)}, packed.options());
    comm.reduceScatter(packed.data_ptr(), reduced.data_ptr(), total, dtypes[first], specs[first]);
    int64_t offset = 0;
    for (size_t i : group) {
      const int64_t n = outputs[i].numel();
      writeInto(outputs[i], reduced.narrow(0, offset, n));
      offset += n;
    }
  }
}

}  // namespace pycomm::torch_adapter
