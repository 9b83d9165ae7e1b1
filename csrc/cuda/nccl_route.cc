#include "nccl_route.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "core/codecs/block_codec.h"
#include "core/error.h"
#include "core/transport/frame.h"
#include "nccl_comm.h"

namespace pycomm::cuda {
namespace {

// What each rank brings to the decision: whether it can use NCCL, and which GPU on which host it has.
struct Record {
  char canUseNccl;
  char askedForNccl;  // cuda_transport=nccl
  char busId[30];
  char host[96];
  // The options the NCCL schedules depend on. Nothing on NCCL's wire says which schedule a
  // transfer belongs to, so ranks that disagree would pair wrong transfers; the TCP path catches
  // that in each frame's signature.
  uint8_t algorithm;
  uint8_t codec;  // transport::signatureCodec
  uint64_t chunkBytes;
};

std::string optionsOf(const Record& record) {
  const auto codec = transport::codecOfSignature(record.codec);
  return strCat("algorithm=", algorithmName(static_cast<Algorithm>(record.algorithm)), ", compression=",
                codec ? codecs::codecName(*codec) : record.codec == 0 ? "none" : "unknown", ", cuda_chunk_bytes=",
                record.chunkBytes);
}

}  // namespace

std::shared_ptr<NcclComm> NcclRoute::forDevice(Communicator& comm, Store& store, int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_) std::rethrow_exception(error_);
  if (!decided_) {
    try {
      std::atomic_store(&nccl_, decide(comm, store, device));
      decided_ = true;
    } catch (const std::exception&) {
      error_ = std::current_exception();
      throw;
    }
  }
  if (!nccl_) return nullptr;
  PYCOMM_CHECK(device == nccl_->device(), InvalidUsageError, "pycomm [rank ", comm.rank(), "/", comm.size(),
               "] this group's NCCL communicator is on cuda:", nccl_->device(), ", the op's tensors on cuda:",
               device, "; a group uses one GPU per rank");
  return nccl_;
}

void NcclRoute::requestAbort() {
  if (auto nccl = std::atomic_load(&nccl_)) nccl->requestAbort();
}

std::shared_ptr<NcclComm> NcclRoute::decide(Communicator& comm, Store& store, int device) {
  const int size = comm.size();
  const std::string where = strCat("pycomm [rank ", comm.rank(), "/", size, "] ");
  Record mine{};
  std::string why;
  const DeviceTransport setting = comm.config().deviceTransport;
  mine.askedForNccl = setting == DeviceTransport::kNccl;
  if (setting == DeviceTransport::kStaged) {
    why = "cuda_transport=staged";
  } else {
    try {
      NcclLibrary::load();
      mine.canUseNccl = 1;
    } catch (const Error& e) {
      why = e.what();  // every rank learns it from the exchange below, and all stage (or fail)
    }
  }
  PYCOMM_CHECK(cudaDeviceGetPCIBusId(mine.busId, sizeof(mine.busId), device) == cudaSuccess, Error, where,
               "cannot read the PCI bus id of cuda:", device);
  // The host identity the shared-memory transport uses (host, boot, network namespace).
  std::strncpy(mine.host, comm.config().hostId.c_str(), sizeof(mine.host) - 1);
  std::vector<Record> all(size);
  // Through the worker, in issue order with the group's other ops.
  std::promise<void> exchanged;
  comm.runOrEnqueue([&] {
    try {
      // Read here, on the worker: the options in effect at this point of the group's sequence.
      const Config& config = comm.config();
      mine.algorithm = static_cast<uint8_t>(config.algorithm);
      mine.codec = transport::signatureCodec(config.compression);
      mine.chunkBytes = config.deviceChunkBytes;
      comm.allgather(&mine, all.data(), sizeof(Record), DataType::kUInt8);
      exchanged.set_value();
    } catch (const std::exception&) {
      exchanged.set_exception(std::current_exception());
    }
  });
  exchanged.get_future().get();
  // Several ranks on one GPU is NCCL's one refusal that can be seen beforehand; auto stages then.
  // cuda_transport=nccl skips the check: NCCL runs ranks on one GPU when NCCL_HOSTID differs from
  // rank to rank (it takes them for separate hosts), which is how the tests run it on one GPU.
  // Decided from the gathered records only, so every rank decides alike.
  bool askedForNccl = false;
  for (const auto& record : all) askedForNccl = askedForNccl || record.askedForNccl;
  const bool allowSameGpu = askedForNccl;
  bool useNccl = true;
  for (int r = 0; r < size && useNccl; ++r) {
    if (!all[r].canUseNccl) {
      useNccl = false;
      if (why.empty()) why = strCat("rank ", r, " cannot use NCCL");
    }
    for (int q = 0; q < r && useNccl && !allowSameGpu; ++q) {
      if (std::strncmp(all[q].host, all[r].host, sizeof(Record::host)) == 0 &&
          std::strncmp(all[q].busId, all[r].busId, sizeof(Record::busId)) == 0) {
        useNccl = false;
        why = strCat("ranks ", q, " and ", r, " share the GPU ", all[r].busId, " (NCCL needs one per rank)");
      }
    }
  }
  PYCOMM_CHECK(useNccl || !askedForNccl, Error, where, "cuda_transport=nccl, but ", why);
  for (int r = 1; r < size && useNccl; ++r) {
    PYCOMM_CHECK(optionsOf(all[r]) == optionsOf(all[0]), InvalidUsageError, where, "ranks 0 and ", r,
                 " would run CUDA collectives over NCCL with different options (", optionsOf(all[0]), " vs ",
                 optionsOf(all[r]), "); every rank must pass the same Options");
  }
  if (!useNccl) {
    comm.logger().log(LogLevel::kInfo, strCat("CUDA collectives are staged through host memory: ", why));
    return nullptr;
  }
  const NcclLibrary& library = NcclLibrary::load();
  auto nccl = std::make_shared<NcclComm>(library, store, "pycomm/nccl", comm.rank(), size, device, comm.timeout());
  comm.logger().log(LogLevel::kInfo,
                    strCat("CUDA all-reduce (compressed too), broadcast, all_gather_into_tensor, "
                           "reduce_scatter_tensor and all_to_all_single run over NCCL point-to-point (",
                           library.path(), ", version ", library.version(), ")"));
  return nccl;
}

}  // namespace pycomm::cuda
