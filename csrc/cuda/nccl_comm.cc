#include "nccl_comm.h"

#include <cstring>
#include <memory>
#include <thread>

#include "core/error.h"
#include "current_device.h"

namespace pycomm::cuda {

NcclComm::NcclComm(const NcclLibrary& nccl, Store& store, const std::string& key, int rank, int size, int device,
                   std::chrono::milliseconds timeout)
    : nccl_(nccl), rank_(rank), size_(size), device_(device) {
  // Before the check-in below: a rank that fails here must not leave the others in NCCL's setup,
  // which has no timeout, but in the store's waits, which have.
  stamps_ = std::make_unique<OpStamps>(device);
  NcclUniqueId id{};
  if (rank == 0) {
    nccl_.check(nccl_.getUniqueId(&id), strCat(prefix(), " ncclGetUniqueId"));
    store.set(key, std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal)));
  } else {
    const auto value = store.get(key, timeout);
    PYCOMM_CHECK(value.size() == sizeof(id.internal), Error, prefix(), " NCCL id under ", key, " has ", value.size(),
                 " bytes, expected ", sizeof(id.internal));
    std::memcpy(id.internal, value.data(), value.size());
  }
  // ncclCommInitRank blocks until every rank called it: start only once all of them are here.
  store.set(strCat(key, "/", rank), {1});
  for (int r = 0; r < size; ++r) store.get(strCat(key, "/", r), timeout);
  const CurrentDevice current(device);
  nccl_.check(nccl_.commInitRank(&comm_, size, id, rank), strCat(prefix(), " ncclCommInitRank"));
}

NcclComm::~NcclComm() {
  const CurrentDevice current(device_, false);
  // Destroy waits for work in flight; after an abort (or an error) there may be work that never
  // ends, and freeing the stamps' memory would wait for it too.
  bool healthy = !aborted_.load();  // else abort() released the communicator
  if (healthy && comm_ != nullptr) {
    int status = kNcclSuccess;
    nccl_.commGetAsyncError(comm_, &status);
    healthy = status == kNcclSuccess;
    if (healthy) {
      nccl_.commDestroy(comm_);
    } else {
      nccl_.commAbort(comm_);
    }
  }
  if (!healthy) stamps_->abandon();
}

std::string NcclComm::prefix() const { return strCat("[rank ", rank_, "/", size_, ", cuda:", device_, ", nccl]"); }

void NcclComm::post(const std::vector<Transfer>& transfers, cudaStream_t stream, const std::string& what) {
  PYCOMM_CHECK(!aborted_.load(), Error, prefix(), " ", what, ": the NCCL communicator was aborted");
  for (const auto& t : transfers) {  // before the group opens: a throw inside would leave it open
    PYCOMM_CHECK(t.peer >= 0 && t.peer < size_ && t.peer != rank_, InternalError, prefix(), " ", what,
                 ": transfer with peer ", t.peer);
  }
  nccl_.check(nccl_.groupStart(), strCat(prefix(), " ", what, ": ncclGroupStart"));
  int first = kNcclSuccess;
  for (const auto& t : transfers) {
    if (t.bytes == 0) continue;
    const int result = t.kind == Transfer::Kind::kSend
                           ? nccl_.send(t.data, t.bytes, kNcclUint8, t.peer, comm_, stream)
                           : nccl_.recv(t.data, t.bytes, kNcclUint8, t.peer, comm_, stream);
    if (first == kNcclSuccess) first = result;
  }
  // The group is closed whatever happened inside it.
  const int ended = nccl_.groupEnd();
  nccl_.check(first, strCat(prefix(), " ", what, ": ncclSend/ncclRecv"));
  nccl_.check(ended, strCat(prefix(), " ", what, ": ncclGroupEnd"));
}

void NcclComm::waitFor(cudaStream_t stream, std::chrono::milliseconds timeout, const std::string& what) {
  const CurrentDevice current(device_);
  cudaEvent_t raw = nullptr;
  checkCuda(cudaEventCreateWithFlags(&raw, cudaEventDisableTiming), strCat(prefix(), " ", what, ": cudaEventCreate"));
  const std::unique_ptr<CUevent_st, cudaError_t (*)(cudaEvent_t)> event(raw, cudaEventDestroy);
  checkCuda(cudaEventRecord(event.get(), stream), strCat(prefix(), " ", what, ": cudaEventRecord"));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const cudaError_t status = cudaEventQuery(event.get());
    if (status == cudaSuccess) return;
    PYCOMM_CHECK(status == cudaErrorNotReady, Error, prefix(), " ", what, ": CUDA error ", cudaGetErrorString(status));
    int asyncError = kNcclSuccess;
    nccl_.commGetAsyncError(comm_, &asyncError);
    if (asyncError != kNcclSuccess && asyncError != kNcclInProgress) {
      abort();  // NCCL's kernels keep running after an error until the communicator is aborted
      nccl_.check(asyncError, strCat(prefix(), " ", what));
    }
    if (abortRequested_.load()) {
      abort();
      throw Error(strCat(prefix(), " ", what, ": the process group was aborted"));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      abort();
      throw TimeoutError(strCat(prefix(), " ", what, ": not done after ", timeout.count(),
                                " ms (a peer is missing or running another op); the NCCL communicator was aborted"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void NcclComm::abort() {
  if (aborted_.exchange(true) || comm_ == nullptr) return;
  const CurrentDevice current(device_, false);
  nccl_.commAbort(comm_);
}

}  // namespace pycomm::cuda
