#include "compressed.h"

#include <algorithm>

#include "compressed_schedule.h"
#include "op_steps.h"

namespace pycomm::algorithms {
namespace {

// Byte offsets of each segment's encoding when the segments are encoded one after another.
Segments encodedLayout(const Segments& segments, int p, codecs::Codec codec) {
  std::vector<size_t> offsets(p + 1, 0);
  for (int i = 0; i < p; ++i) offsets[i + 1] = offsets[i] + codecs::encodedBytes(codec, segments.length(i));
  return Segments(std::move(offsets));
}

}  // namespace

size_t compressedSegmentElems(size_t chunkBytes) {
  return std::max<size_t>(codecs::kFp8BlockElements,
                          (chunkBytes / sizeof(float)) / codecs::kFp8BlockElements * codecs::kFp8BlockElements);
}

CompressedPiece makeCompressedPiece(size_t begin, Segments segments, codecs::Codec codec) {
  const int p = static_cast<int>(segments.parts());
  Segments layout = encodedLayout(segments, p, codec);
  return CompressedPiece{begin, std::move(segments), std::move(layout)};
}

std::vector<CompressedPiece> compressedPieces(size_t count, int p, codecs::Codec codec, size_t chunkBytes) {
  const size_t segmentElems = compressedSegmentElems(chunkBytes);
  const size_t pieceElems = segmentElems * p;
  std::vector<CompressedPiece> pieces;
  for (size_t begin = 0; begin < count || pieces.empty(); begin += pieceElems) {
    const size_t n = std::min(pieceElems, count - begin);
    pieces.push_back(makeCompressedPiece(begin, n == pieceElems ? Segments(segmentElems, p, true) : Segments(n, p), codec));
    if (count == 0) break;
  }
  return pieces;
}

void encodeWithFeedback(codecs::Codec codec, float* data, float* residual, size_t n, uint8_t* out, float* decoded) {
  for (size_t i = 0; i < n; ++i) data[i] += residual[i];
  codecs::encode(codec, data, n, out);
  codecs::decode(codec, out, n, decoded);
  for (size_t i = 0; i < n; ++i) residual[i] = data[i] - decoded[i];
}

void compressedAllreduce(Op& op, float* data, size_t count, codecs::Codec codec, bool average,
                         size_t chunkBytes, std::vector<uint8_t>& scratch, float* residual) {
  compressedAllreducePieces(op, data, compressedPieces(count, op.size(), codec, chunkBytes), codec, average,
                            1.0f / static_cast<float>(op.size()), scratch, residual);
}

void compressedAllreducePieces(Op& op, float* data, const std::vector<CompressedPiece>& pieces, codecs::Codec codec,
                               bool average, float factor, std::vector<uint8_t>& scratch, float* residual,
                               const PieceStages& stages) {
  scratch.resize(compressedAllreduceScratchFor<OpSteps>(pieces, op.size(), op.rank(), residual != nullptr).bytes());
  OpSteps steps(op);
  compressedAllreduceSchedule(steps, data, pieces, codec, average, factor, scratch.data(), residual, stages);
}

void compressedReduceScatter(Op& op, const float* in, float* out, size_t count, codecs::Codec codec,
                             bool average, float factor, std::vector<uint8_t>& scratch) {
  scratch.resize(compressedReduceScatterScratchFor(count, op.size(), codec));
  OpSteps steps(op);
  compressedReduceScatterSchedule(steps, in, out, scratch.data(), count, codec, average, factor);
}

void compressedAllgather(Op& op, const float* in, float* out, size_t count, codecs::Codec codec,
                         size_t chunkBytes, std::vector<uint8_t>& scratch) {
  scratch.resize(compressedAllgatherScratchFor(count, op.size(), codec));
  OpSteps steps(op);
  compressedAllgatherSchedule(steps, in, out, scratch.data(), count, codec, chunkBytes);
}

}  // namespace pycomm::algorithms
