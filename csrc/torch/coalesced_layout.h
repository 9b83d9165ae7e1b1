// The one transfer schedule of a coalesced block of all-gathers or reduce-scatters: every tensor of
// the block packed into one buffer laid out as the core's single op reads it (rank-major blocks),
// and the result unpacked into the caller's tensors. torch's _coalescing_manager hands pycomm such
// a block (FSDP2's per-parameter all-gathers and reduce-scatters); one exchange replaces one per
// tensor.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "core/communicator.h"
#include "core/reduce_spec.h"

namespace pycomm::torch_adapter {

// all_gather_into_tensor of every (outputs[i], inputs[i]) at once, as bytes whatever the dtypes:
// rank r's block of the one all-gather is its inputs end to end.
void allgatherCoalesced(Communicator& comm, const std::vector<at::Tensor>& outputs,
                        const std::vector<at::Tensor>& inputs);

// reduce_scatter_tensor of every (outputs[i], inputs[i]) with `specs[i]`, one reduce-scatter per
// dtype (in the order each dtype first appears, the same on every rank): rank r's block holds the
// r-th slice of each input of that dtype, in order.
void reduceScatterCoalesced(Communicator& comm, const std::vector<at::Tensor>& outputs,
                            const std::vector<at::Tensor>& inputs, const std::vector<DataType>& dtypes,
                            const std::vector<ReduceSpec>& specs);

}  // namespace pycomm::torch_adapter
