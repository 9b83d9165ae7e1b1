// SUM of a sparse COO tensor over the group, as gloo does it for sparse gradients (DDP with
// sparse embeddings): every rank's entries gathered, added up. CPU only, as in gloo.
#pragma once

#include <ATen/ATen.h>

#include "core/communicator.h"

namespace pycomm::torch_adapter {

// Written back into `tensor` (nnz may change). On the worker, as the op's task.
void allreduceSparse(Communicator& comm, const at::Tensor& tensor);

}  // namespace pycomm::torch_adapter
