#include "sparse_allreduce.h"

#include <algorithm>
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
  int64_t maxNnz = 0;
  for (int r = 0; r < size; ++r) {
    const int64_t* theirs = headers.data() + r * header.size();
    TORCH_CHECK_VALUE(std::equal(header.begin() + 1, header.end(), theirs + 1),
                      Validator(comm.rank(), size, "allreduce (sparse)").where(), "this rank's tensor has shape ",
                      input.sizes(), " with ", header[1], " sparse dims; rank ", r, "'s differs");
    maxNnz = std::max(maxNnz, theirs[0]);
  }
  // Indices and values of every rank, padded to the largest nnz, gathered in rank order.
  const int64_t sparseDim = input.sparse_dim();
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
  }
  // The same concatenation on every rank, so coalesce() adds duplicates in the same order everywhere.
  const at::Tensor sum =
      at::_sparse_coo_tensor_unsafe(at::cat(indexParts, 1), at::cat(valueParts, 0), input.sizes(), values.options())
          .coalesce();
  tensor.copy_(sum);
}

}  // namespace pycomm::torch_adapter
