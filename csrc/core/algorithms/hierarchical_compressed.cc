#include "hierarchical_compressed.h"

#include <algorithm>
#include <cstring>

#include "../checked.h"
#include "shm_collectives.h"

namespace pycomm::algorithms {
namespace {

constexpr size_t kBlock = codecs::kFp8BlockElements;

// Byte offsets of the slices of a chunk, for the shared-memory steps.
std::vector<size_t> byteOffsets(const std::vector<size_t>& elements) {
  std::vector<size_t> bytes(elements.size());
  for (size_t i = 0; i < elements.size(); ++i) bytes[i] = elements[i] * sizeof(float);
  return bytes;
}

float* stagingFloats(std::vector<uint8_t>& buffer, size_t count) {
  buffer.resize(checkedMul(count, sizeof(float), "hierarchical compressed staging"));
  return reinterpret_cast<float*>(buffer.data());
}

}  // namespace

HierarchicalCut hierarchicalCut(size_t count, int localRank, int localSize, int hosts, codecs::Codec codec,
                                size_t chunkBytes) {
  const size_t segmentElems = compressedSegmentElems(chunkBytes);
  const size_t sliceElems = segmentElems * hosts;
  const size_t chunkElems = sliceElems * localSize;
  HierarchicalCut cut;
  for (size_t begin = 0; begin < count || cut.pieces.empty(); begin += chunkElems) {
    const size_t n = std::min(chunkElems, count - begin);
    const bool full = n == chunkElems;
    // Slices of whole blocks (the last one takes the rest), so a block scale never spans two slices.
    const size_t per = full ? sliceElems : (n / localSize + kBlock - 1) / kBlock * kBlock;
    std::vector<size_t> offsets(localSize + 1);
    for (int l = 0; l <= localSize; ++l) offsets[l] = std::min(n, l * per);
    offsets[localSize] = n;
    const size_t mine = offsets[localRank + 1] - offsets[localRank];
    cut.pieces.push_back(makeCompressedPiece(begin + offsets[localRank],
                                             full ? Segments(segmentElems, hosts, true) : Segments(mine, hosts), codec));
    cut.chunkBegin.push_back(begin);
    cut.sliceOffsets.push_back(std::move(offsets));
    if (count == 0) break;
  }
  return cut;
}

void hierarchicalCompressedAllreduce(Op& cross, const HostGrid& host, float* data, size_t count,
                                     codecs::Codec codec, bool average, size_t chunkBytes,
                                     std::vector<uint8_t>& scratch, float* residual) {
  const HierarchicalCut cut =
      hierarchicalCut(count, host.local.rank(), host.local.size(), cross.size(), codec, chunkBytes);
  PieceStages stages;
  stages.before = [&](size_t k) {
    shmReduceScatterParts(host.local, data + cut.chunkBegin[k], byteOffsets(cut.sliceOffsets[k]),
                          DataType::kFloat32, ReduceOp::kSum, host.sig, host.wait);
  };
  stages.after = [&](size_t k) {
    shmAllgatherParts(host.local, data + cut.chunkBegin[k], byteOffsets(cut.sliceOffsets[k]), host.sig, host.wait);
  };
  compressedAllreducePieces(cross, data, cut.pieces, codec, average, 1.0f / static_cast<float>(host.worldSize()),
                            scratch, residual, stages);
}

void hierarchicalCompressedReduceScatter(Op& cross, const HostGrid& host, const float* in, float* out, size_t count,
                                         codecs::Codec codec, bool average, std::vector<uint8_t>& scratch,
                                         std::vector<uint8_t>& staging) {
  if (count == 0) return;  // the same on every rank: nothing to cut, no step to pair
  const int hosts = cross.size();
  const int localSize = host.local.size();
  const size_t blockBytes = count * sizeof(float);
  // Local rank l reduces the blocks of the ranks of local index l, in host order: lay the input out
  // so that those are contiguous, then the host's reduce-scatter hands each its hosts x count.
  const size_t world = static_cast<size_t>(host.worldSize());
  float* ordered = stagingFloats(staging, checkedAdd(checkedMul(world, count, "hierarchical reduce-scatter"), hosts * count,
                                              "hierarchical reduce-scatter"));
  float* hostSum = ordered + world * count;
  for (int l = 0; l < localSize; ++l) {
    for (int h = 0; h < hosts; ++h) {
      std::memcpy(ordered + (static_cast<size_t>(l) * hosts + h) * count, in + host.grid[h * localSize + l] * count,
                  blockBytes);
    }
  }
  shmReduceScatter(host.local, ordered, hostSum, hosts * count, DataType::kFloat32, ReduceOp::kSum, host.sig,
                   host.wait);
  compressedReduceScatter(cross, hostSum, out, count, codec, average, 1.0f / static_cast<float>(world), scratch);
}

void hierarchicalCompressedAllgather(Op& cross, const HostGrid& host, const float* in, float* out, size_t count,
                                     codecs::Codec codec, size_t chunkBytes, std::vector<uint8_t>& scratch,
                                     std::vector<uint8_t>& staging) {
  if (count == 0) return;  // the same on every rank
  const int hosts = cross.size();
  const int localSize = host.local.size();
  const size_t world = static_cast<size_t>(host.worldSize());
  float* mine = stagingFloats(staging, checkedAdd(checkedMul(world, count, "hierarchical all-gather"), hosts * count,
                                           "hierarchical all-gather"));
  float* gathered = mine + hosts * count;
  // The blocks of this rank's local index, decoded (rounded once); the host then shares them as they are.
  compressedAllgather(cross, in, mine, count, codec, chunkBytes, scratch);
  shmAllgather(host.local, mine, gathered, hosts * count * sizeof(float), host.sig, host.wait);
  for (int l = 0; l < localSize; ++l) {
    for (int h = 0; h < hosts; ++h) {
      std::memcpy(out + host.grid[h * localSize + l] * count,
                  gathered + (static_cast<size_t>(l) * hosts + h) * count, count * sizeof(float));
    }
  }
}

}  // namespace pycomm::algorithms
