// Compressed collectives over fp32 buffers that round exactly twice at any world size above one
// (once at world 1, where nothing is summed).
//
// All-reduce: each rank encodes its input once (one rounding); an all-to-all hands every rank the
// encoded copies of its own segment; it decodes them and sums in fp32 in rank order, encodes that sum
// once (the second rounding) and an all-gather of the encoded segments follows, which every rank
// decodes, its own segment too, so all ranks end with identical bits. Summing encoded partial sums
// hop by hop, as a plain fp16 ring does, would round p-1 times and let the error grow with p.
//
// Reduce-scatter is the first half (one rounding: the sum stays fp32); all-gather encodes once.
// All three are compressed_schedule.h's, run here by the CPU executor.
#pragma once

#include <functional>
#include <vector>

#include "../codecs/block_codec.h"
#include "op.h"

namespace pycomm::algorithms {

// A compressed all-reduce works on pieces of p segments of whole 256-element blocks (the last piece
// takes the rest), so block scales never straddle two messages. The pieces depend on count, p,
// codec and chunkBytes only: every flat schedule that splits this way (the CPU one below, the
// stream-ordered one of queued_collectives.h) rounds at the same places and gives the same bits.
// (The hierarchical one, hierarchical_compressed.h, rounds host sums instead: other bits.)
struct CompressedPiece {
  size_t begin;      // first element of the piece
  Segments segments; // its p segments, in elements relative to begin
  Segments layout;   // byte offsets of the segments' encodings laid one after another
};
std::vector<CompressedPiece> compressedPieces(size_t count, int p, codecs::Codec codec, size_t chunkBytes);
// The elements of one segment of a full piece: chunkBytes of fp32 in whole blocks, at least one.
size_t compressedSegmentElems(size_t chunkBytes);
// A piece at `begin` cut into `segments` (one per rank of the op), with its encoded layout.
CompressedPiece makeCompressedPiece(size_t begin, Segments segments, codecs::Codec codec);

// What a caller runs around each piece of compressedAllreducePieces, in piece order on every rank:
// `before(k)` just before piece k is encoded, `after(k)` once it is decoded. The hierarchical
// all-reduce reduces a chunk inside the host there, and gathers it, while other pieces travel.
struct PieceStages {
  std::function<void(size_t)> before;
  std::function<void(size_t)> after;
};

// Error feedback, where `residual` (count floats, zero at first) is given: what this rank's first
// encoding drops is kept there and added to the data it encodes next time, element for element:
//   x = data + residual;  code = encode(x);  residual = x - decode(code)
// In a hierarchical op local rank l encodes the host's sum of slice l, so its residual holds the
// host's error on that slice (and zeros elsewhere): every rounding of the first kind is fed back once.
void encodeWithFeedback(codecs::Codec codec, float* data, float* residual, size_t n, uint8_t* out, float* decoded);

// `average`: the sums are multiplied by `factor` (1 / the number of contributions) before their
// one encoding; the caller says how many there are, as a hierarchical op has more than op.size().
void compressedAllreduce(Op& op, float* data, size_t count, codecs::Codec codec, bool average,
                         size_t chunkBytes, std::vector<uint8_t>& scratch, float* residual = nullptr);
// The same over pieces that need not cover `data` (every piece's begin is relative to `data`, and
// to `residual`); the op's ranks must pass the same pieces.
void compressedAllreducePieces(Op& op, float* data, const std::vector<CompressedPiece>& pieces, codecs::Codec codec,
                               bool average, float factor, std::vector<uint8_t>& scratch, float* residual = nullptr,
                               const PieceStages& stages = {});
// in holds p * count floats; this rank's reduced block lands in out.
void compressedReduceScatter(Op& op, const float* in, float* out, size_t count, codecs::Codec codec,
                             bool average, float factor, std::vector<uint8_t>& scratch);
// out holds p * count floats.
void compressedAllgather(Op& op, const float* in, float* out, size_t count, codecs::Codec codec,
                         size_t chunkBytes, std::vector<uint8_t>& scratch);

}  // namespace pycomm::algorithms
