#include "compressed.h"

#include <algorithm>
#include <cstring>

#include "compressed_schedule.h"
#include "op_steps.h"

namespace pycomm::algorithms {
namespace {

size_t alignUp(size_t n) { return (n + 63) & ~size_t{63}; }

// Byte offsets of each segment's encoding when the segments are encoded one after another.
Segments encodedLayout(const Segments& segments, int p, codecs::Codec codec) {
  std::vector<size_t> offsets(p + 1, 0);
  for (int i = 0; i < p; ++i) offsets[i + 1] = offsets[i] + codecs::encodedBytes(codec, segments.length(i));
  return Segments(std::move(offsets));
}

void scale(float* data, size_t n, float factor) {
  for (size_t i = 0; i < n; ++i) data[i] *= factor;
}

}  // namespace

namespace {

// A piece of a pipelined compressed all-reduce and where its bytes sit in the scratch buffers.
struct Piece {
  CompressedPiece shape;
  size_t encodedOffset;  // into the encoded-input and gathered buffers
  size_t receivedOffset; // into the all-to-all receive buffer: p encodings of this rank's segment
};

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

void compressedAllreducePieces(Op& op, float* data, const std::vector<CompressedPiece>& shapes, codecs::Codec codec,
                               bool average, float factor, std::vector<uint8_t>& scratch, float* residual,
                               const PieceStages& stages) {
  const int p = op.size();
  const int r = op.rank();
  std::vector<Piece> pieces;
  size_t encodedTotal = 0;
  size_t receivedTotal = 0;
  size_t accElems = 0;  // this rank's largest segment (not the chunk: chunk_bytes may be huge)
  for (const auto& shape : shapes) {
    const size_t encodedBytes = shape.layout.offset(p);
    const size_t mine = shape.layout.length(r);
    // With error feedback acc also takes the decoded copy of any segment this rank encodes.
    accElems = std::max(accElems, residual != nullptr ? shape.segments.maxLength() : shape.segments.length(r));
    pieces.push_back(Piece{shape, encodedTotal, receivedTotal});
    encodedTotal += encodedBytes;
    receivedTotal += p * mine;
  }
  scratch.resize(2 * alignUp(encodedTotal) + alignUp(receivedTotal) + alignUp(accElems * sizeof(float)) + 64);
  uint8_t* encoded = scratch.data();
  uint8_t* gathered = encoded + alignUp(encodedTotal);
  uint8_t* received = gathered + alignUp(encodedTotal);
  auto* acc = reinterpret_cast<float*>(received + alignUp(receivedTotal));

  // Two slots per piece: its all-to-all of encoded inputs, then its all-gather of encoded sums.
  auto exchangeSlot = [](size_t k) { return static_cast<uint32_t>(2 * k); };
  auto gatherSlot = [](size_t k) { return static_cast<uint32_t>(2 * k + 1); };
  const size_t numPieces = pieces.size();
  std::vector<std::vector<std::shared_ptr<Request>>> exchangeRecvs(numPieces), gatherRecvs(numPieces);
  for (size_t k = 0; k < numPieces; ++k) {
    const Piece& piece = pieces[k];
    const size_t mine = piece.shape.layout.length(r);
    for (int i = 1; i < p; ++i) {
      const int peer = (r - i + p) % p;
      exchangeRecvs[k].push_back(op.recv(peer, exchangeSlot(k), received + piece.receivedOffset + peer * mine, mine));
      gatherRecvs[k].push_back(op.recv(peer, gatherSlot(k), gathered + piece.encodedOffset + piece.shape.layout.offset(peer),
                                       piece.shape.layout.length(peer)));
    }
  }

  auto encodeAndExchange = [&](size_t k) {
    if (stages.before) stages.before(k);
    const Piece& piece = pieces[k];
    uint8_t* out = encoded + piece.encodedOffset;
    for (int i = 0; i < p; ++i) {
      const size_t at = piece.shape.begin + piece.shape.segments.offset(i);
      if (residual != nullptr) {
        // data's copy of the piece is free now: what comes back overwrites it (decodeGathered).
        encodeWithFeedback(codec, data + at, residual + at, piece.shape.segments.length(i),
                           out + piece.shape.layout.offset(i), acc);
      } else {
        codecs::encode(codec, data + at, piece.shape.segments.length(i), out + piece.shape.layout.offset(i));
      }
    }
    // Start with the next rank, so that not every rank sends to rank 0 first.
    for (int i = 1; i < p; ++i) {
      const int peer = (r + i) % p;
      op.send(peer, exchangeSlot(k), out + piece.shape.layout.offset(peer), piece.shape.layout.length(peer));
    }
  };
  // Sums this rank's segment in fp32, own contribution first and then the others in rank order,
  // encodes the sum once and sends it to everyone.
  auto reduceAndGather = [&](size_t k) {
    const Piece& piece = pieces[k];
    for (auto& recv : exchangeRecvs[k]) op.wait(recv);
    const size_t n = piece.shape.segments.length(r);
    const size_t mine = piece.shape.layout.length(r);
    codecs::decode(codec, encoded + piece.encodedOffset + piece.shape.layout.offset(r), n, acc);
    for (int q = 0; q < p; ++q) {
      if (q != r) codecs::decodeAdd(codec, received + piece.receivedOffset + q * mine, n, acc);
    }
    if (average) scale(acc, n, factor);
    uint8_t* sum = gathered + piece.encodedOffset + piece.shape.layout.offset(r);
    codecs::encode(codec, acc, n, sum);
    for (int i = 1; i < p; ++i) op.send((r + i) % p, gatherSlot(k), sum, mine);
  };
  auto decodeGathered = [&](size_t k) {
    const Piece& piece = pieces[k];
    for (auto& recv : gatherRecvs[k]) op.wait(recv);
    for (int i = 0; i < p; ++i) {
      codecs::decode(codec, gathered + piece.encodedOffset + piece.shape.layout.offset(i), piece.shape.segments.length(i),
                     data + piece.shape.begin + piece.shape.segments.offset(i));
    }
    if (stages.after) stages.after(k);
  };
  // Software pipeline: while piece k's encodings travel, piece k-1 is reduced and piece k-2 decoded.
  for (size_t k = 0; k < numPieces + 2; ++k) {
    if (k < numPieces) encodeAndExchange(k);
    if (k >= 1 && k - 1 < numPieces) reduceAndGather(k - 1);
    if (k >= 2) decodeGathered(k - 2);
  }
  op.waitAll();
}

void compressedReduceScatter(Op& op, const float* in, float* out, size_t count, codecs::Codec codec,
                             bool average, std::vector<uint8_t>& scratch) {
  compressedReduceScatter(op, in, out, count, codec, average, 1.0f / static_cast<float>(op.size()), scratch);
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
