#include "compressed.h"

#include <cstring>

#include "direct.h"
#include "ring.h"

namespace pycomm::algorithms {
namespace {

size_t alignUp(size_t n) { return (n + 63) & ~size_t{63}; }

// Byte offsets of each segment's encoding when the segments are encoded one after another.
Segments encodedLayout(const Segments& segments, int p, codecs::Codec codec) {
  std::vector<size_t> offsets(p + 1, 0);
  for (int i = 0; i < p; ++i) offsets[i + 1] = offsets[i] + codecs::encodedBytes(codec, segments.length(i));
  return Segments(std::move(offsets));
}

// Encodes every segment, all-to-all's the encodings, and sums this rank's segment in fp32 into acc:
// own contribution first, then the others in rank order (the same order on every rank).
void reduceScatterEncoded(Op& op, const float* in, const Segments& segments, codecs::Codec codec,
                          uint8_t* encoded, const Segments& layout, uint8_t* received, float* acc) {
  const int p = op.size();
  const int r = op.rank();
  for (int i = 0; i < p; ++i) codecs::encode(codec, in + segments.offset(i), segments.length(i), encoded + layout.offset(i));
  const size_t mine = layout.length(r);
  std::vector<size_t> sendOffsets(p), sendBytes(p), recvOffsets(p), recvBytes(p);
  for (int q = 0; q < p; ++q) {
    sendOffsets[q] = layout.offset(q);
    sendBytes[q] = layout.length(q);
    recvOffsets[q] = q * mine;
    recvBytes[q] = mine;
  }
  directAlltoall(op, encoded, sendOffsets, sendBytes, received, recvOffsets, recvBytes);
  const size_t n = segments.length(r);
  codecs::decode(codec, received + r * mine, n, acc);
  for (int q = 0; q < p; ++q) {
    if (q != r) codecs::decodeAdd(codec, received + q * mine, n, acc);
  }
}

void scale(float* data, size_t n, float factor) {
  for (size_t i = 0; i < n; ++i) data[i] *= factor;
}

}  // namespace

void compressedAllreduce(Op& op, float* data, size_t count, codecs::Codec codec, bool average,
                         size_t chunkBytes, std::vector<uint8_t>& scratch) {
  const int p = op.size();
  const int r = op.rank();
  Segments segments(count, p);
  Segments layout = encodedLayout(segments, p, codec);
  const size_t total = layout.offset(p);
  const size_t mine = layout.length(r);
  const size_t n = segments.length(r);
  scratch.resize(alignUp(total) + alignUp(p * mine) + alignUp(n * sizeof(float)) + 64);
  uint8_t* encoded = scratch.data();
  uint8_t* received = encoded + alignUp(total);
  auto* acc = reinterpret_cast<float*>(received + alignUp(p * mine));
  reduceScatterEncoded(op, data, segments, codec, encoded, layout, received, acc);
  if (average) scale(acc, n, 1.0f / static_cast<float>(p));
  // The sum is encoded once, into its slot of the encoded buffer, and gathered by everyone.
  codecs::encode(codec, acc, n, encoded + layout.offset(r));
  ringAllgather(op, encoded, layout, 1, chunkBytes);
  for (int i = 0; i < p; ++i) codecs::decode(codec, encoded + layout.offset(i), segments.length(i), data + segments.offset(i));
}

void compressedReduceScatter(Op& op, const float* in, float* out, size_t count, codecs::Codec codec,
                             bool average, std::vector<uint8_t>& scratch) {
  const int p = op.size();
  const int r = op.rank();
  Segments segments(count, p, true);
  Segments layout = encodedLayout(segments, p, codec);
  const size_t total = layout.offset(p);
  const size_t mine = layout.length(r);
  scratch.resize(alignUp(total) + alignUp(p * mine) + 64);
  uint8_t* encoded = scratch.data();
  uint8_t* received = encoded + alignUp(total);
  reduceScatterEncoded(op, in, segments, codec, encoded, layout, received, out);
  if (average) scale(out, count, 1.0f / static_cast<float>(p));
}

void compressedAllgather(Op& op, const float* in, float* out, size_t count, codecs::Codec codec,
                         size_t chunkBytes, std::vector<uint8_t>& scratch) {
  const int p = op.size();
  const int r = op.rank();
  const size_t each = codecs::encodedBytes(codec, count);
  scratch.resize(alignUp(each * p) + 64);
  uint8_t* encoded = scratch.data();
  codecs::encode(codec, in, count, encoded + r * each);
  ringAllgather(op, encoded, Segments(each, p, true), 1, chunkBytes);
  for (int i = 0; i < p; ++i) codecs::decode(codec, encoded + i * each, count, out + i * count);
}

}  // namespace pycomm::algorithms
