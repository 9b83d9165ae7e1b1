// The communicator's collectives: each checks its input, picks its path (shared memory, the
// hierarchy, or a schedule over the connections) and runs as one op (communicator_run.h).
#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/allreduce_plan.h"
#include "algorithms/binomial.h"
#include "algorithms/chain.h"
#include "algorithms/compressed.h"
#include "algorithms/direct.h"
#include "algorithms/hierarchical_compressed.h"
#include "algorithms/ring.h"
#include "algorithms/shm_collectives.h"
#include "checked.h"
#include "communicator.h"
#include "communicator_run.h"

namespace pycomm {
namespace {

size_t alignUp(size_t n) { return (n + 63) & ~size_t{63}; }

// Below this, broadcast and reduce use binomial trees (latency bound); above, pipelined chain/ring.
constexpr size_t kShortMessageBytes = 64 * 1024;

}  // namespace

void Communicator::checkReducible(const ReduceSpec& spec, DataType dtype, const char* what) {
  const std::string error = reduceSpecError(spec, dtype);
  PYCOMM_CHECK_OP(error.empty(), prefix(), " ", what, ": ", error);
}

bool Communicator::allreducePieces(const std::vector<BufferList::Piece>& pieces, DataType dtype,
                                   const ReduceSpec& spec) {
  checkReducible(spec, dtype, "allreduce");
  // Asked before the pre-scale, which writes the pieces: a declined bucket is packed and scaled
  // by the caller's allreduce.
  if (!allreducesInSharedMemory()) return false;
  const size_t esize = elementSize(dtype);
  for (const auto& piece : pieces) applyPreScale(spec, piece.data, piece.bytes / esize, dtype);
  const BufferList list(pieces);
  const size_t count = list.bytes() / esize;
  const OpSignature signature = makeSignature(OpKind::kAllreduce, dtype, spec.op, -1, count);
  const bool ran = runShm(signature,
                          list.bytes() <= algorithms::kShmShortAllreduceBytes ? "shm-all-in-place"
                                                                              : "shm-slices-in-place",
                          [&](const StepWait& w) { algorithms::shmAllreduce(*shm_, list, count, dtype, spec.op, signature, w); });
  PYCOMM_CHECK(ran, InternalError, prefix(), " allreduce: shared memory declined a bucket it had accepted");
  for (const auto& piece : pieces) applyAverage(spec, piece.data, piece.bytes / esize, dtype, size());
  return true;
}

void Communicator::allreduce(void* data, size_t count, DataType dtype, const ReduceSpec& spec) {
  checkReducible(spec, dtype, "allreduce");
  applyPreScale(spec, data, count, dtype);
  allreduceOp(data, count, dtype, spec.op);
  applyAverage(spec, data, count, dtype, size());
}

void Communicator::allreduceOp(void* data, size_t count, DataType dtype, ReduceOp op) {
  const size_t nbytes = count * elementSize(dtype);
  auto* buf = static_cast<uint8_t*>(data);
  const OpSignature signature = makeSignature(OpKind::kAllreduce, dtype, op, -1, count);
  if (runShm(signature, nbytes <= algorithms::kShmShortAllreduceBytes ? "shm-all" : "shm-slices",
             [&](const StepWait& w) { algorithms::shmAllreduce(*shm_, data, count, dtype, op, signature, w); })) {
    return;
  }
  // Planned only for the connections: the cost model's evaluation is a share of a small op's cost.
  const algorithms::AllreducePlan plan =
      algorithms::planAllreduce(config_.algorithm, &config_.costModel, nbytes, size(), dtype, config_.chunkBytes);
  if (runHierarchical(signature, "hierarchical", [&](Op& cross, const algorithms::HostGrid& host) {
        hierarchicalAllreduce(cross, host, buf, count, dtype, op, plan.algorithm);
      })) {
    return;
  }
  runCollective(signature, algorithmName(plan.algorithm), [&](Op& o) {
    if (size() == 1) return;
    algorithms::OpSteps steps(o);
    algorithms::runAllreduce(
        steps, plan, buf, scratch(algorithms::allreduceScratchBytes<algorithms::OpSteps>(plan, count, size(), dtype)),
        count, dtype, op);
  });
}

void Communicator::broadcast(void* data, size_t count, DataType dtype, int root) {
  PYCOMM_CHECK_OP(root >= 0 && root < size(), prefix(), " broadcast: invalid root ", root);
  const size_t nbytes = count * elementSize(dtype);
  // Short messages: log2 p hops of a binomial tree; long ones: the pipelined chain, at link speed.
  const bool shortMessage = nbytes <= kShortMessageBytes;
  const OpSignature signature = makeSignature(OpKind::kBroadcast, dtype, ReduceOp::kSum, root, count);
  if (runShm(signature, "shm",
             [&](const StepWait& w) { algorithms::shmBroadcast(*shm_, data, nbytes, root, signature, w); })) {
    return;
  }
  runCollective(signature,
                shortMessage ? "binomial" : "chain", [&](Op& o) {
                  if (size() == 1) return;
                  if (shortMessage) {
                    algorithms::binomialBroadcast(o, static_cast<uint8_t*>(data), nbytes, root);
                  } else {
                    algorithms::chainBroadcast(o, static_cast<uint8_t*>(data), nbytes, root, config_.chunkBytes);
                  }
                });
}

void Communicator::reduce(void* data, size_t count, DataType dtype, const ReduceSpec& spec, int root) {
  PYCOMM_CHECK_OP(root >= 0 && root < size(), prefix(), " reduce: invalid root ", root);
  checkReducible(spec, dtype, "reduce");
  if (spec.preScale) {
    // A scaled copy, so that a non-root rank's input stays as it was.
    const size_t bytes = checkedMul(count, elementSize(dtype), strCat(prefix(), " reduce: bytes"));
    std::vector<uint8_t> scaled(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + bytes);
    applyPreScale(spec, scaled.data(), count, dtype);
    reduceOp(scaled.data(), count, dtype, spec.op, root);
    if (rank() == root && bytes > 0) std::memcpy(data, scaled.data(), bytes);
  } else {
    reduceOp(data, count, dtype, spec.op, root);
  }
  if (rank() == root) applyAverage(spec, data, count, dtype, size());
}

void Communicator::reduceOp(void* data, size_t count, DataType dtype, ReduceOp op, int root) {
  const size_t esize = elementSize(dtype);
  const size_t bytes = count * esize;
  const bool shortMessage = bytes <= kShortMessageBytes;
  runCollective(makeSignature(OpKind::kReduce, dtype, op, root, count), shortMessage ? "binomial" : "ring",
                [&](Op& o) {
    const int p = size();
    const int r = rank();
    if (p == 1) return;
    if (shortMessage) {
      uint8_t* work = scratch(2 * alignUp(bytes));
      algorithms::binomialReduce(o, static_cast<uint8_t*>(data), work, work + alignUp(bytes), count, dtype,
                                 op, root);
      return;
    }
    Segments segments(count, p);
    const size_t chunkElems = std::max<size_t>(1, config_.chunkBytes / esize);
    // Reduce-scatter a copy, so that non-root ranks keep their input as it was.
    uint8_t* work = scratch(alignUp(bytes) + algorithms::ringScratchBytes(segments, chunkElems, dtype));
    uint8_t* tmp = work + alignUp(bytes);
    if (bytes > 0) std::memcpy(work, data, bytes);
    algorithms::ringAllreduce(o, {work, tmp}, segments, dtype, op, chunkElems, false);
    const uint32_t slot = static_cast<uint32_t>(2 * (p - 1) * algorithms::ringChunkCount(segments, chunkElems));
    auto* out = static_cast<uint8_t*>(data);
    if (r == root) {
      std::memcpy(out + segments.offset(r) * esize, work + segments.offset(r) * esize,
                  segments.length(r) * esize);
      for (int peer = 0; peer < p; ++peer) {
        if (peer != r) o.recv(peer, slot, out + segments.offset(peer) * esize, segments.length(peer) * esize);
      }
    } else {
      o.send(root, slot, work + segments.offset(r) * esize, segments.length(r) * esize);
    }
    o.waitAll();
  });
}

void Communicator::allgather(const void* in, void* out, size_t count, DataType dtype) {
  const OpSignature signature = makeSignature(OpKind::kAllgather, dtype, ReduceOp::kSum, -1, count);
  if (runShm(signature, "shm", [&](const StepWait& w) {
        algorithms::shmAllgather(*shm_, in, out, count * elementSize(dtype), signature, w);
      })) {
    return;
  }
  runCollective(signature, "ring", [&](Op& o) {
    const size_t esize = elementSize(dtype);
    auto* dst = static_cast<uint8_t*>(out);
    if (count > 0 && dst + rank() * count * esize != in) {
      std::memmove(dst + rank() * count * esize, in, count * esize);
    }
    const size_t chunkElems = std::max<size_t>(1, config_.chunkBytes / esize);
    algorithms::ringAllgather(o, dst, Segments(count, size(), true), esize, chunkElems);
  });
}

void Communicator::reduceScatter(const void* in, void* out, size_t count, DataType dtype, const ReduceSpec& spec) {
  checkReducible(spec, dtype, "reduce_scatter");
  if (spec.preScale) {
    // A scaled copy: the caller's input is left as it was.
    const size_t n = checkedMul(count, static_cast<size_t>(size()), strCat(prefix(), " reduce_scatter: elements"));
    const size_t bytes = checkedMul(n, elementSize(dtype), strCat(prefix(), " reduce_scatter: bytes"));
    std::vector<uint8_t> scaled(static_cast<const uint8_t*>(in), static_cast<const uint8_t*>(in) + bytes);
    applyPreScale(spec, scaled.data(), n, dtype);
    reduceScatterOp(scaled.data(), out, count, dtype, spec.op);
  } else {
    reduceScatterOp(in, out, count, dtype, spec.op);
  }
  applyAverage(spec, out, count, dtype, size());
}

void Communicator::reduceScatterOp(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) {
  const OpSignature signature = makeSignature(OpKind::kReduceScatter, dtype, op, -1, count);
  if (runShm(signature, "shm", [&](const StepWait& w) {
        algorithms::shmReduceScatter(*shm_, in, out, count, dtype, op, signature, w);
      })) {
    return;
  }
  runCollective(signature, "ring", [&](Op& o) {
    const size_t esize = elementSize(dtype);
    const size_t bytes = count * esize * size();
    Segments segments(count, size(), true);
    const size_t chunkElems = std::max<size_t>(1, config_.chunkBytes / esize);
    uint8_t* work = scratch(alignUp(bytes) + algorithms::ringScratchBytes(segments, chunkElems, dtype));
    if (bytes > 0) std::memcpy(work, in, bytes);
    algorithms::ringAllreduce(o, {work, work + alignUp(bytes)}, segments, dtype, op, chunkElems, false);
    if (count > 0) std::memcpy(out, work + rank() * count * esize, count * esize);
  });
}

void Communicator::gather(const void* in, void* out, size_t count, DataType dtype, int root) {
  PYCOMM_CHECK_OP(root >= 0 && root < size(), prefix(), " gather: invalid root ", root);
  runCollective(makeSignature(OpKind::kGather, dtype, ReduceOp::kSum, root, count), "direct", [&](Op& o) {
    algorithms::directGather(o, static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out),
                             count * elementSize(dtype), root);
  });
}

void Communicator::scatter(const void* in, void* out, size_t count, DataType dtype, int root) {
  PYCOMM_CHECK_OP(root >= 0 && root < size(), prefix(), " scatter: invalid root ", root);
  runCollective(makeSignature(OpKind::kScatter, dtype, ReduceOp::kSum, root, count), "direct", [&](Op& o) {
    algorithms::directScatter(o, static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out),
                              count * elementSize(dtype), root);
  });
}

void Communicator::alltoall(const void* in, const std::vector<size_t>& sendCounts,
                            const std::vector<size_t>& sendOffsets, void* out,
                            const std::vector<size_t>& recvCounts,
                            const std::vector<size_t>& recvOffsets, DataType dtype) {
  const size_t p = static_cast<size_t>(size());
  PYCOMM_CHECK_OP(sendCounts.size() == p && sendOffsets.size() == p && recvCounts.size() == p &&
                      recvOffsets.size() == p,
                  prefix(), " alltoall: expected ", p, " counts and offsets");
  PYCOMM_CHECK_OP(sendCounts[rank()] == recvCounts[rank()], prefix(),
               " alltoall: this rank sends ", sendCounts[rank()], " elements to itself but expects ",
               recvCounts[rank()]);
  // Per-peer counts may legitimately differ, so the signature carries none; each frame's size is
  // still checked against the receive it lands in.
  runCollective(makeSignature(OpKind::kAlltoall, dtype, ReduceOp::kSum, -1, 0), "direct", [&](Op& o) {
    const size_t esize = elementSize(dtype);
    auto bytes = [&](const std::vector<size_t>& v) {
      std::vector<size_t> out(v.size());
      for (size_t i = 0; i < v.size(); ++i) out[i] = checkedMul(v[i], esize, strCat(prefix(), " alltoall: bytes of block ", i));
      return out;
    };
    algorithms::directAlltoall(o, static_cast<const uint8_t*>(in), bytes(sendOffsets), bytes(sendCounts),
                               static_cast<uint8_t*>(out), bytes(recvOffsets), bytes(recvCounts));
  });
}

namespace {
OpSignature compressedSignature(OpKind kind, size_t count, codecs::Codec codec, bool average) {
  OpSignature s = makeSignature(kind, DataType::kFloat32, ReduceOp::kSum, -1, count);
  s.codec = transport::signatureCodec(codec);
  s.root = average ? -2 : -1;  // AVG and SUM must not be mixed across ranks either
  return s;
}
}  // namespace

void Communicator::allreduceCompressed(float* data, size_t count, codecs::Codec codec, bool average, float* residual) {
  const OpSignature signature = compressedSignature(OpKind::kAllreduce, count, codec, average);
  if (runHierarchical(signature, "hierarchical-compressed", [&](Op& cross, const algorithms::HostGrid& host) {
        algorithms::hierarchicalCompressedAllreduce(cross, host, data, count, codec, average, config_.chunkBytes,
                                                    scratch_, residual);
      })) {
    return;
  }
  runCollective(signature, "compressed", [&](Op& o) {
    algorithms::compressedAllreduce(o, data, count, codec, average, config_.chunkBytes, scratch_, residual);
  });
}

void Communicator::reduceScatterCompressed(const float* in, float* out, size_t count, codecs::Codec codec,
                                           bool average) {
  const OpSignature signature = compressedSignature(OpKind::kReduceScatter, count, codec, average);
  if (runHierarchical(signature, "hierarchical-compressed", [&](Op& cross, const algorithms::HostGrid& host) {
        algorithms::hierarchicalCompressedReduceScatter(cross, host, in, out, count, codec, average, scratch_, staging_);
      })) {
    return;
  }
  runCollective(signature, "compressed", [&](Op& o) {
    const float factor = 1.0f / static_cast<float>(o.size());
    algorithms::compressedReduceScatter(o, in, out, count, codec, average, factor, scratch_);
  });
}

void Communicator::allgatherCompressed(const float* in, float* out, size_t count, codecs::Codec codec) {
  const OpSignature signature = compressedSignature(OpKind::kAllgather, count, codec, false);
  if (runHierarchical(signature, "hierarchical-compressed", [&](Op& cross, const algorithms::HostGrid& host) {
        algorithms::hierarchicalCompressedAllgather(cross, host, in, out, count, codec, config_.chunkBytes, scratch_,
                                                    staging_);
      })) {
    return;
  }
  runCollective(signature, "compressed", [&](Op& o) {
    algorithms::compressedAllgather(o, in, out, count, codec, config_.chunkBytes, scratch_);
  });
}

void Communicator::barrier() {
  const OpSignature signature = makeSignature(OpKind::kBarrier, DataType::kUInt8, ReduceOp::kSum, -1, 0);
  if (runShm(signature, "shm", [&](const StepWait& w) { algorithms::shmBarrier(*shm_, signature, w); })) return;
  runCollective(signature,
                "dissemination", [&](Op& o) { algorithms::disseminationBarrier(o); });
}

}  // namespace pycomm
