#include "split_layout.h"

#include "core/checked.h"
#include "core/error.h"

namespace pycomm::torch_adapter {
namespace {

std::string listOf(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += strCat(i == 0 ? "" : ", ", values[i]);
  return out + "]";
}

// The arithmetic's own error, restated as a ValueError about the user's splits.
template <typename F>
size_t checkedOrValueError(F&& f, const std::string& where, const char* what, const std::vector<int64_t>& splits) {
  try {
    return f();
  } catch (const InvalidUsageError& e) {
    TORCH_CHECK_VALUE(false, where, what, " split sizes ", listOf(splits), " describe more elements than fit in ",
                      "memory (", e.what(), ")");
  }
}

}  // namespace

void splitLayout(const at::Tensor& t, const std::vector<int64_t>& splits, int size, const std::string& where,
                 const char* what, size_t scale, std::vector<size_t>& counts, std::vector<size_t>& offsets) {
  counts.assign(size, 0);
  offsets.assign(size, 0);
  // A 0-dim tensor is one row of one element.
  const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
  const size_t rowElems = rows == 0 ? 0 : static_cast<size_t>(t.numel() / rows);
  if (splits.empty()) {
    // Equal blocks of whole rows, as gloo requires: splitting numel instead would cut rows apart.
    TORCH_CHECK_VALUE(rows % size == 0, where, what, " has ", rows, " rows (dim 0), not divisible by the group size ",
                      size, " (pass split sizes)");
    const size_t block = static_cast<size_t>(rows / size) * rowElems * scale;
    for (int i = 0; i < size; ++i) {
      counts[i] = block;
      offsets[i] = static_cast<size_t>(i) * block;
    }
    return;
  }
  TORCH_CHECK_VALUE(splits.size() == static_cast<size_t>(size), where, what, " split sizes ", listOf(splits), " have ",
                    splits.size(), " entries for a group of ", size);
  TORCH_CHECK_VALUE(t.dim() > 0, where, what, " must have a first dimension to split");
  size_t total = 0;
  for (const int64_t s : splits) {
    TORCH_CHECK_VALUE(s >= 0, where, what, " split sizes ", listOf(splits), " must be non-negative");
    total = checkedOrValueError([&] { return checkedAdd(total, static_cast<size_t>(s), "split sizes"); }, where, what,
                                splits);
  }
  TORCH_CHECK_VALUE(total == static_cast<size_t>(rows), where, what, " split sizes ", listOf(splits), " add up to ",
                    total, " rows but the tensor has ", rows);
  size_t offset = 0;
  for (int i = 0; i < size; ++i) {
    // Each split is at most `rows` here, so these products fit; checked all the same.
    counts[i] = checkedOrValueError(
        [&] { return checkedMul(checkedMul(static_cast<size_t>(splits[i]), rowElems, "split"), scale, "split"); },
        where, what, splits);
    offsets[i] = offset;
    offset = checkedOrValueError([&] { return checkedAdd(offset, counts[i], "split offsets"); }, where, what, splits);
  }
}

void toBytes(std::vector<size_t>& values, size_t elementBytes, const std::string& where) {
  for (auto& v : values) v = checkedMul(v, elementBytes, where + "bytes of an all-to-all block");
}

}  // namespace pycomm::torch_adapter
