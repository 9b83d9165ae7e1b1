// Compressed collectives over several hosts with several ranks each: full precision inside a host
// (shared memory), compression only across hosts, and every local rank carrying its own slice
// across, as ZeRO++'s hierarchical quantized gradients do.
//
// All-reduce: the data is cut into chunks of world x segment elements. For each chunk the host's
// ranks reduce it in fp32 so that local rank l holds the host's sum of slice l; slice l is then a
// piece of a compressed all-reduce among the ranks of local index l on every host (encoded once,
// summed in fp32, encoded once more: still exactly two roundings, whatever the number of hosts and
// ranks per host); the host then gathers the decoded slices. Chunks are pipelined: as chunk k is
// reduced inside the host and sent, the sums of chunk k-1 are made and chunk k-2 is gathered.
//
// Reduce-scatter rounds once (each rank's block is encoded once, after the host's fp32 sum), and
// all-gather once (each rank's input is encoded once; the host shares the decoded blocks).
//
// `grid[h * L + l]` is the group rank of local rank l on host h (hosts in the order the cross op
// numbers them); `cross` is the op among the ranks of this rank's local index, `local` its host's
// shared-memory group, and `sig` the whole op's signature, which every shared-memory step carries.
#pragma once

#include <cstdint>
#include <vector>

#include "../codecs/block_codec.h"
#include "../transport/shm/group.h"
#include "compressed.h"
#include "op.h"

namespace pycomm::algorithms {

struct HostGrid {
  transport::shm::Group& local;
  const transport::shm::StepWait& wait;
  const OpSignature& sig;
  const std::vector<int>& grid;
  int worldSize() const { return static_cast<int>(grid.size()); }
};

// The pieces of slice `localRank` of every chunk, as the cross op's ranks all cut them, and the
// chunks' slice boundaries (elements, relative to the chunk) for the shared-memory steps.
struct HierarchicalCut {
  std::vector<CompressedPiece> pieces;              // piece k: this rank's slice of chunk k
  std::vector<size_t> chunkBegin;                   // chunk k starts here
  std::vector<std::vector<size_t>> sliceOffsets;    // chunk k: localSize + 1 element offsets
};
HierarchicalCut hierarchicalCut(size_t count, int localRank, int localSize, int hosts, codecs::Codec codec,
                                size_t chunkBytes);

void hierarchicalCompressedAllreduce(Op& cross, const HostGrid& host, float* data, size_t count,
                                     codecs::Codec codec, bool average, size_t chunkBytes,
                                     std::vector<uint8_t>& scratch, float* residual = nullptr);
// in holds world * count floats; this rank's block lands in out.
void hierarchicalCompressedReduceScatter(Op& cross, const HostGrid& host, const float* in, float* out, size_t count,
                                         codecs::Codec codec, bool average, std::vector<uint8_t>& scratch,
                                         std::vector<uint8_t>& staging);
// out holds world * count floats.
void hierarchicalCompressedAllgather(Op& cross, const HostGrid& host, const float* in, float* out, size_t count,
                                     codecs::Codec codec, size_t chunkBytes, std::vector<uint8_t>& scratch,
                                     std::vector<uint8_t>& staging);

}  // namespace pycomm::algorithms
