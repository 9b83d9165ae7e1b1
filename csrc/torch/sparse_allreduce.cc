#include "sparse_allreduce.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tensor_checks.h"

namespace pycomm::torch_adapter {

void allreduceSparse(Communicator& comm, const at::Tensor& tensor) {
  const int size = comm.size();
  const at::Tensor input = tensor.coalesce();
  const at::Tensor indices = input._indices().contiguous();  // [sparse_dim, nnz], int64
  const at::Tensor values = input._values().contiguous();    // [nnz, dense dims...]
  // Every rank's nnz and shape, so mismatched shapes fail here rather than in the sum.
  constexpr int kMaxDims = 8;
  std::vector<int64_t> header(4 + kMaxDims, -1);
  header[0] = values.size(0);
  header[1] = input.sparse_dim();
  header[2] = input.dense_dim();
  header[3] = input.dim();
  for (int64_t d = 0; d < input.dim(); ++d) header[4 + d] = input.size(d);
  std::vector<int64_t> headers(header.size() * size);
  comm.allgather(header.data(), headers.data(), header.size(), DataType::kInt64);
  const std::string where = Validator(comm.rank(), size, "allreduce (sparse)").where();
  const int64_t sparseDim = input.sparse_dim();
  // A coalesced tensor holds at most one entry per position of its sparse dims: a larger nnz from a
  // peer is not a tensor of this shape, and would size the buffers below.
  int64_t positions = 1;
  for (int64_t d = 0; d < sparseDim; ++d) {
    if (__builtin_mul_overflow(positions, input.size(d), &positions)) positions = INT64_MAX;
  }
  int64_t maxNnz = 0;
  for (int r = 0; r < size; ++r) {
    const int64_t* theirs = headers.data() + r * header.size();
    TORCH_CHECK_VALUE(std::equal(header.begin() + 1, header.end(), theirs + 1), where, "this rank's tensor has shape ",
                      input.sizes(), " with ", header[1], " sparse dims; rank ", r, "'s differs");
    TORCH_CHECK_VALUE(theirs[0] >= 0 && theirs[0] <= positions, where, "rank ", r, " announced ", theirs[0],
                      " entries for a tensor of shape ", input.sizes(), " with ", sparseDim, " sparse dims");
    maxNnz = std::max(maxNnz, theirs[0]);
  }
  // Indices and values of every rank, padded to the largest nnz, gathered in rank order.
  at::Tensor myIndices = at::zeros({sparseDim, maxNnz}, indices.options());
  myIndices.narrow(1, 0, indices.size(1)).copy_(indices);
  at::Tensor allIndices = at::empty({size, sparseDim, maxNnz}, indices.options());
  comm.allgather(myIndices.data_ptr(), allIndices.data_ptr(), static_cast<size_t>(myIndices.numel()),
                   DataType::kInt64);
  std::vector<int64_t> paddedShape = values.sizes().vec();
  paddedShape[0] = maxNnz;
  at::Tensor myValues = at::zeros(paddedShape, values.options());
  myValues.narrow(0, 0, values.size(0)).copy_(values);
  std::vector<int64_t> allShape = paddedShape;
  allShape.insert(allShape.begin(), size);
  at::Tensor allValues = at::empty(allShape, values.options());
  const Layout layout = movable(myValues);
  comm.allgather(myValues.data_ptr(), allValues.data_ptr(), layout.count(myValues), layout.dtype);
  std::vector<at::Tensor> indexParts, valueParts;
  for (int r = 0; r < size; ++r) {
    const int64_t nnz = headers[r * header.size()];
    indexParts.push_back(allIndices[r].narrow(1, 0, nnz));
    valueParts.push_back(allValues[r].narrow(0, 0, nnz));
    // An index outside the shape (a tensor made without torch's invariant check) would make the sum
    // below read and write out of bounds on every rank. All ranks judge the same gathered indices,
    // so all refuse alike, naming the first rank at fault, and no tensor is written.
    for (int64_t d = 0; d < sparseDim && nnz > 0; ++d) {
      const auto [low, high] = at::aminmax(indexParts.back()[d]);
      const int64_t lowest = low.item<int64_t>(), highest = high.item<int64_t>();
      TORCH_CHECK_VALUE(lowest >= 0 && highest < input.size(d), where, "rank ", r,
                        "'s sparse tensor has an index outside its shape ", input.sizes(), ": ",
                        lowest < 0 ? lowest : highest, " in sparse dim ", d);
    }
  }
  // The same concatenation on every rank, so coalesce() adds duplicates in the same order everywhere.
  const at::Tensor sum =
      at::_sparse_coo_tensor_unsafe(at::cat(indexParts, 1), at::cat(valueParts, 0), input.sizes(), values.options())
          .coalesce();
  tensor.copy_(sum);
}

}  // namespace pycomm::torch_adapter
