// Element counts and offsets per peer for an all-to-all over dimension 0, from torch's split sizes.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace pycomm::torch_adapter {

// `splits` (rows per peer, as the user passed them; empty: equal blocks) of tensor `t`, as core
// element counts and offsets (`scale` core elements per tensor element). Every sum and product is
// overflow-checked: split sizes that wrap around int64 must not pass for a small tensor. A
// ValueError names `where` (the rank and op), `what` ("input"/"output") and the splits.
void splitLayout(const at::Tensor& t, const std::vector<int64_t>& splits, int size, const std::string& where,
                 const char* what, size_t scale, std::vector<size_t>& counts, std::vector<size_t>& offsets);

// Counts or offsets in core elements to bytes, overflow-checked.
void toBytes(std::vector<size_t>& values, size_t elementBytes, const std::string& where);

}  // namespace pycomm::torch_adapter
