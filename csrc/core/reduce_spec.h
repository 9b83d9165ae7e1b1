// A reduction as torch.distributed states it: a reduce op, PREMUL_SUM's factor applied to every
// input before the sum, and AVG's division by the world size applied to the result. The
// reduction kernels know only the plain ops (dtype.h); the communicator's reducing collectives
// take a ReduceSpec and apply the rest here, once, for every caller.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "dtype.h"

namespace pycomm {

struct ReduceSpec {
  ReduceSpec() = default;
  ReduceSpec(ReduceOp reduceOp) : op(reduceOp) {}  // NOLINT: a plain op is a spec

  ReduceOp op = ReduceOp::kSum;
  std::optional<double> preScale;  // PREMUL_SUM: every input times this before the sum
  bool average = false;            // AVG: the sum divided by the world size
};

// Empty if `spec` can reduce `dtype`, else why not (bitwise ops on floats, PREMUL_SUM on
// integers, AVG on bool).
std::string reduceSpecError(const ReduceSpec& spec, DataType dtype);

// buf[i] *= spec.preScale, as torch's `t.mul_(factor)` computes it (codecs::scaleBuffer); nothing
// without a factor.
void applyPreScale(const ReduceSpec& spec, void* buf, size_t count, DataType dtype);

// buf[i] /= size when spec.average, as torch's AVG does it: `t.div_(size)` for floating dtypes (the
// quotient in the element type, fp16/bf16 through fp32, never a multiplication by 1/size, which
// rounds differently), `t.div_(size, rounding_mode="trunc")` for integers (the divisor converted
// to the element type first, as torch converts the scalar).
void applyAverage(const ReduceSpec& spec, void* buf, size_t count, DataType dtype, int size);

}  // namespace pycomm
