// Compressed collectives over fp32 buffers that round exactly twice, whatever the world size.
//
// All-reduce: each rank encodes its input once (one rounding); an all-to-all hands every rank the
// encoded copies of its own segment; it decodes them and sums in fp32 in rank order, encodes that sum
// once (the second rounding) and an all-gather of the encoded segments follows, which every rank
// decodes, its own segment too, so all ranks end with identical bits. Summing encoded partial sums
// hop by hop, as a plain fp16 ring does, would round p-1 times and let the error grow with p.
//
// Reduce-scatter is the first half (one rounding: the sum stays fp32); all-gather encodes once.
#pragma once

#include <vector>

#include "../codecs/block_codec.h"
#include "op.h"

namespace pycomm::algorithms {

// A compressed all-reduce works on pieces of p segments of whole 256-element blocks (the last piece
// takes the rest), so block scales never straddle two messages. The pieces depend on count, p,
// codec and chunkBytes only: every schedule that splits this way (the CPU one below, the
// stream-ordered one of queued_collectives.h) rounds at the same places and gives the same bits.
struct CompressedPiece {
  size_t begin;      // first element of the piece
  Segments segments; // its p segments, in elements relative to begin
  Segments layout;   // byte offsets of the segments' encodings laid one after another
};
std::vector<CompressedPiece> compressedPieces(size_t count, int p, codecs::Codec codec, size_t chunkBytes);

void compressedAllreduce(Op& op, float* data, size_t count, codecs::Codec codec, bool average,
                         size_t chunkBytes, std::vector<uint8_t>& scratch);
// in holds p * count floats; this rank's reduced block lands in out.
void compressedReduceScatter(Op& op, const float* in, float* out, size_t count, codecs::Codec codec,
                             bool average, std::vector<uint8_t>& scratch);
// out holds p * count floats.
void compressedAllgather(Op& op, const float* in, float* out, size_t count, codecs::Codec codec,
                         size_t chunkBytes, std::vector<uint8_t>& scratch);

}  // namespace pycomm::algorithms
