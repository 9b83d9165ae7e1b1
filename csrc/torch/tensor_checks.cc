#include "tensor_checks.h"

#include "core/error.h"

namespace pycomm::torch_adapter {

std::optional<DataType> mapDtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return DataType::kFloat32;
    case at::kDouble: return DataType::kFloat64;
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    case at::kChar: return DataType::kInt8;
    case at::kByte: return DataType::kUInt8;
    case at::kShort: return DataType::kInt16;
    case at::kInt: return DataType::kInt32;
    case at::kLong: return DataType::kInt64;
    case at::kBool: return DataType::kBool;
    default: return std::nullopt;
  }
}

Layout movable(const at::Tensor& t) {
  if (auto dtype = mapDtype(t.scalar_type())) return {*dtype, 1};
  return {DataType::kUInt8, static_cast<size_t>(t.element_size())};
}

std::optional<codecs::Codec> compressionFor(const Config& config, at::ScalarType type, const ::c10d::ReduceOp* op) {
  if (!config.compression || type != at::kFloat) return std::nullopt;
  if (op != nullptr && op->op_ != ::c10d::ReduceOp::SUM && op->op_ != ::c10d::ReduceOp::AVG) return std::nullopt;
  return config.compression;
}

std::string Validator::where() const { return strCat("pycomm [rank ", rank_, "/", size_, "] ", op_, ": "); }

std::optional<c10::Device> Validator::deviceOf(c10::ArrayRef<at::Tensor> tensors, bool& sawDevice) const {
  std::optional<c10::Device> device;
  bool anyCpu = false;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    if (t.device().is_cpu()) {
      anyCpu = true;
      continue;
    }
    sawDevice = true;
    TORCH_CHECK_VALUE(t.device().is_cuda(), where(), "got a tensor on ", t.device(),
                      "; pycomm supports CPU and CUDA tensors");
    TORCH_CHECK_VALUE(t.layout() == at::kStrided, where(), "sparse tensors are not supported");
    TORCH_CHECK_VALUE(!device || *device == t.device(), where(), "got tensors on ", *device, " and ", t.device(),
                      "; an op's tensors must be on one device");
    device = t.device();
  }
  TORCH_CHECK_VALUE(!(device && anyCpu), where(), "got tensors on cpu and on ", *device,
                    "; an op's tensors must be on one device");
  return device;
}

void Validator::tensor(const at::Tensor& t) const {
  TORCH_CHECK_VALUE(t.defined(), where(), "got an undefined tensor");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, where(), "sparse tensors are not supported");
}

const at::Tensor& Validator::single(const std::vector<at::Tensor>& tensors) const {
  TORCH_CHECK_VALUE(tensors.size() == 1, where(), "expects exactly one tensor per rank, got ", tensors.size());
  tensor(tensors[0]);
  return tensors[0];
}

void Validator::sameType(const at::Tensor& a, const at::Tensor& b) const {
  tensor(b);
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), where(), "input dtype ", a.scalar_type(),
                   " differs from output dtype ", b.scalar_type());
}

void Validator::allLike(const at::Tensor& like, const std::vector<at::Tensor>& list, const char* listName,
                        const char* likeName) const {
  for (const auto& t : list) {
    sameType(like, t);
    TORCH_CHECK_VALUE(t.numel() == like.numel(), where(), listName, " tensors must have the ", likeName, "'s ",
                      like.numel(), " elements, got ", t.numel());
  }
}

void Validator::holdsOnePerRank(const at::Tensor& whole, const char* wholeName, const at::Tensor& each,
                                const char* eachName) const {
  TORCH_CHECK_VALUE(whole.defined() && each.defined(), where(), "got an undefined tensor");
  TORCH_CHECK_VALUE(whole.numel() == each.numel() * size_, where(), wholeName, " has ", whole.numel(),
                    " elements but the group of ", size_, " ranks with ", each.numel(), " ", eachName,
                    " elements each needs ", each.numel() * size_);
}

void Validator::holdOnePerRank(const std::vector<at::Tensor>& wholes, const std::vector<at::Tensor>& parts,
                               bool wholesAreOutputs) const {
  const auto& outputs = wholesAreOutputs ? wholes : parts;
  const auto& inputs = wholesAreOutputs ? parts : wholes;
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), where(), "got ", outputs.size(), " outputs for ", inputs.size(),
                    " inputs");
  for (size_t i = 0; i < parts.size(); ++i) {
    tensor(parts[i]);
    sameType(parts[i], wholes[i]);
    TORCH_CHECK_VALUE(wholes[i].numel() == parts[i].numel() * size_, where(), wholesAreOutputs ? "output " : "input ",
                      i, " has ", wholes[i].numel(), " elements, needs ", parts[i].numel() * size_);
  }
}

void Validator::root(int64_t root) const {
  TORCH_CHECK_VALUE(root >= 0 && root < size_, where(), "root rank ", root, " is outside the group of ", size_);
}

DataType Validator::reducible(const at::Tensor& t) const {
  auto dtype = mapDtype(t.scalar_type());
  TORCH_CHECK_TYPE(dtype.has_value(), where(), "unsupported dtype ", t.scalar_type(),
                   " for a reduction (supported: float64, float32, float16, bfloat16, int8, "
                   "uint8, int16, int32, int64, bool)");
  return *dtype;
}

ReduceSpec Validator::reduceSpec(const ::c10d::ReduceOp& op, const at::Tensor& t) const {
  const DataType dtype = reducible(t);
  const bool floating = isFloating(dtype);
  ReduceSpec spec;
  switch (op.op_) {
    case ::c10d::ReduceOp::SUM: spec.op = ReduceOp::kSum; break;
    case ::c10d::ReduceOp::PRODUCT: spec.op = ReduceOp::kProduct; break;
    case ::c10d::ReduceOp::MIN: spec.op = ReduceOp::kMin; break;
    case ::c10d::ReduceOp::MAX: spec.op = ReduceOp::kMax; break;
    case ::c10d::ReduceOp::BAND: spec.op = ReduceOp::kBand; break;
    case ::c10d::ReduceOp::BOR: spec.op = ReduceOp::kBor; break;
    case ::c10d::ReduceOp::BXOR: spec.op = ReduceOp::kBxor; break;
    case ::c10d::ReduceOp::AVG:
      TORCH_CHECK_TYPE(dtype != DataType::kBool, where(), "AVG is not defined for bool");
      spec.average = true;
      break;
    case ::c10d::ReduceOp::PREMUL_SUM: {
      TORCH_CHECK_TYPE(floating, where(), "PREMUL_SUM needs a floating dtype, got ", t.scalar_type());
      // Newer torch (2.13) calls it PreMulSumSupplement and keeps the old name as an alias;
      // torch 2.11 has only the old name.
      auto* supplement = dynamic_cast<::c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK_VALUE(supplement != nullptr, where(), "PREMUL_SUM without a factor");
      spec.preScale =
          supplement->tensor_factor.defined() ? supplement->tensor_factor.item<double>() : supplement->double_factor;
      break;
    }
    default: TORCH_CHECK_VALUE(false, where(), "unsupported reduce op ", static_cast<int>(op.op_));
  }
  const bool bitwise = spec.op == ReduceOp::kBand || spec.op == ReduceOp::kBor || spec.op == ReduceOp::kBxor;
  TORCH_CHECK_TYPE(!(bitwise && floating), where(), "bitwise reduce ops need an integer or bool dtype, got ",
                   t.scalar_type());
  return spec;
}

}  // namespace pycomm::torch_adapter
