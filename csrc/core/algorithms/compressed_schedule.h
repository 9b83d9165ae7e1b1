// The compressed collectives of compressed.h, written once against the step interface (steps.h):
// the CPU runs them through compressed.h, a stream-ordered link through queued_collectives.h.
//
// All-reduce: piece by piece (compressedPieces), each rank encodes the piece's p segments (with
// error feedback where a residual is given), an all-to-all hands each rank every encoding of its
// segment, which it decodes and sums in fp32 in rank order (its own first), scales if averaging and
// encodes once (fused with the last addition), and an all-gather of the encoded sums follows, which
// every rank decodes, its own too. On the CPU, which matches transfers by slot, every receive is
// posted up front, each piece has its own scratch, and the pieces go through a software pipeline:
// while piece k's encodings travel, piece k-1 is reduced and piece k-2 decoded. A link runs piece
// after piece, reusing one scratch place. At world 1 each piece is rounded once, as a group would.
//
// Reduce-scatter: every rank encodes its p blocks once, an all-to-all (alltoall_schedule.h) hands
// each rank every rank's encoding of its block, which it decodes and sums in fp32 in rank order
// (its own first), then scales by `factor` if `average`: one rounding. All-gather: each rank
// encodes its block once, the encodings go round the ring (ring_schedule.h), and every rank decodes
// all of them, its own too, so all ranks end with the same bits.
#pragma once

#include <algorithm>
#include <vector>

#include "../codecs/block_codec.h"
#include "alltoall_schedule.h"
#include "compressed.h"
#include "op.h"
#include "ring_schedule.h"
#include "steps.h"

namespace pycomm::algorithms {

inline size_t compressedAlignUp(size_t n) { return (n + 63) & ~size_t{63}; }

// Scratch of compressedReduceScatterSchedule: the p encoded blocks, then p encodings of ours.
inline size_t compressedReduceScatterScratchFor(size_t count, int size, codecs::Codec codec) {
  return 2 * compressedAlignUp(size * codecs::encodedBytes(codec, count));
}

// `in`: p blocks of `count` floats; this rank's block, reduced, lands in `out`.
template <class Steps>
void compressedReduceScatterSchedule(Steps& x, const float* in, float* out, uint8_t* scratch, size_t count,
                                     codecs::Codec codec, bool average, float factor) {
  const int p = x.size();
  const int r = x.rank();
  const size_t each = codecs::encodedBytes(codec, count);
  uint8_t* encoded = scratch;                                   // block i's encoding at i * each
  uint8_t* received = scratch + compressedAlignUp(p * each);    // rank q's encoding of block r at q * each
  x.phase("compressed reduce-scatter");
  for (int i = 0; i < p; ++i) x.encode(codec, in + i * count, count, encoded + i * each);
  std::vector<size_t> sendOffsets(p), sendBytes(p, each), recvOffsets(p), recvBytes(p, each);
  for (int q = 0; q < p; ++q) {
    sendOffsets[q] = q * each;
    recvOffsets[q] = q * each;
  }
  recvBytes[r] = 0;  // our own encoding is decoded where it was written, not copied first
  directAlltoallSchedule(x, encoded, sendOffsets, sendBytes, received, recvOffsets, recvBytes);
  x.decode(codec, encoded + r * each, count, out);
  for (int q = 0; q < p; ++q) {
    if (q != r) x.decodeAdd(codec, received + q * each, count, out);
  }
  if (average) x.scale(out, count, factor);
}

// Scratch of compressedAllgatherSchedule: the p encodings.
inline size_t compressedAllgatherScratchFor(size_t count, int size, codecs::Codec codec) {
  return compressedAlignUp(size * codecs::encodedBytes(codec, count));
}

// `out`: p blocks of `count` floats. `in` may be block r of `out`: it is encoded before anything is
// written. `chunkBytes`: the ring's chunk where the executor pipelines chunks.
template <class Steps>
void compressedAllgatherSchedule(Steps& x, const float* in, float* out, uint8_t* scratch, size_t count,
                                 codecs::Codec codec, size_t chunkBytes) {
  const int p = x.size();
  const size_t each = codecs::encodedBytes(codec, count);
  x.encode(codec, in, count, scratch + x.rank() * each);
  const Segments blocks(each, p, true);
  ringAllgatherSchedule(x, scratch, blocks, 1,
                        Steps::kPipelinesChunks ? chunkBytes : ringChunkFor<Steps>(blocks, chunkBytes));
  for (int i = 0; i < p; ++i) x.decode(codec, scratch + i * each, count, out + i * count);
}

// Where a compressed all-reduce keeps each piece's bytes: encoded inputs and gathered sums (each
// `encoded` bytes), every rank's encoding of this rank's segment (`received`), and an fp32
// accumulator, which with error feedback also takes the decoded copy of any segment this rank
// encodes. `separate`: each piece its own place (pieces in flight together), else one place reused.
// At world 1 nothing is received and the gathered sums are the encoded inputs themselves.
struct CompressedAllreduceScratch {
  std::vector<size_t> encodedAt, receivedAt;  // per piece
  size_t encoded = 0, received = 0, accElems = 0;
  bool single;  // world 1

  CompressedAllreduceScratch(const std::vector<CompressedPiece>& pieces, int p, int r, bool separate, bool feedback)
      : single(p == 1) {
    separate = separate && !single;  // world 1 runs piece after piece
    for (const auto& piece : pieces) {
      const size_t pieceEncoded = piece.layout.offset(p);
      const size_t pieceReceived = p * piece.layout.length(r);
      encodedAt.push_back(separate ? encoded : 0);
      receivedAt.push_back(separate ? received : 0);
      encoded = separate ? encoded + pieceEncoded : std::max(encoded, pieceEncoded);
      received = separate ? received + pieceReceived : std::max(received, pieceReceived);
      accElems = std::max(accElems, feedback ? piece.segments.maxLength() : piece.segments.length(r));
    }
  }
  size_t gatheredOffset() const { return single ? 0 : compressedAlignUp(encoded); }
  size_t receivedOffset() const { return single ? compressedAlignUp(encoded) : 2 * compressedAlignUp(encoded); }
  size_t accOffset() const { return receivedOffset() + (single ? 0 : compressedAlignUp(received)); }
  size_t bytes() const { return accOffset() + compressedAlignUp(accElems * sizeof(float)) + 64; }
};

template <class Steps>
CompressedAllreduceScratch compressedAllreduceScratchFor(const std::vector<CompressedPiece>& pieces, int size, int rank,
                                                         bool feedback) {
  return CompressedAllreduceScratch(pieces, size, rank, Steps::kTaggedTransfers, feedback);
}

// The pieces (every rank passes the same) need not cover `data`: their begins are relative to
// `data` and to `residual` (nullptr: no error feedback). `average`: sums times `factor` before their
// encoding. `stages` run around each piece (compressed.h). `scratch`: compressedAllreduceScratchFor's.
template <class Steps>
void compressedAllreduceSchedule(Steps& x, float* data, const std::vector<CompressedPiece>& pieces,
                                 codecs::Codec codec, bool average, float factor, uint8_t* scratch, float* residual,
                                 const PieceStages& stages = {}) {
  using Handle = typename Steps::Handle;
  constexpr bool kEarly = Steps::kTaggedTransfers;
  const int p = x.size();
  const int r = x.rank();
  const CompressedAllreduceScratch place = compressedAllreduceScratchFor<Steps>(pieces, p, r, residual != nullptr);
  uint8_t* encoded = scratch;
  // At world 1 the gathered sums are this rank's own encodings, decoded in place: one rounding.
  uint8_t* gathered = scratch + place.gatheredOffset();
  uint8_t* received = scratch + place.receivedOffset();
  auto* acc = reinterpret_cast<float*>(scratch + place.accOffset());
  // Two slots per piece: its all-to-all of encoded inputs, then its all-gather of encoded sums.
  auto exchangeSlot = [](size_t k) { return static_cast<uint32_t>(2 * k); };
  auto gatherSlot = [](size_t k) { return static_cast<uint32_t>(2 * k + 1); };
  std::vector<std::vector<Handle>> exchangeRecvs(pieces.size()), gatherRecvs(pieces.size());
  auto postExchange = [&](size_t k) {
    const size_t mine = pieces[k].layout.length(r);
    for (int i = 1; i < p; ++i) {
      const int peer = (r - i + p) % p;
      exchangeRecvs[k].push_back(x.recv(peer, exchangeSlot(k), received + place.receivedAt[k] + peer * mine, mine));
    }
  };
  auto postGather = [&](size_t k) {
    const Segments& layout = pieces[k].layout;
    for (int i = 1; i < p; ++i) {
      const int peer = (r - i + p) % p;
      gatherRecvs[k].push_back(
          x.recv(peer, gatherSlot(k), gathered + place.encodedAt[k] + layout.offset(peer), layout.length(peer)));
    }
  };
  // Encodes each segment of piece k once (the first rounding) and hands segment q to rank q,
  // starting with the next rank, so that not every rank sends to rank 0 first.
  auto encodeAndExchange = [&](size_t k) {
    if (stages.before) stages.before(k);
    const CompressedPiece& piece = pieces[k];
    uint8_t* out = encoded + place.encodedAt[k];
    // At world 1 the sum is this rank's input: averaged before its one rounding, not after.
    if (p == 1 && average && factor != 1.0f) x.scale(data + piece.begin, piece.segments.length(0), factor);
    for (int i = 0; i < p; ++i) {
      float* at = data + piece.begin + piece.segments.offset(i);
      if (residual != nullptr) {
        // data's copy of the piece is free now: what comes back overwrites it.
        x.encodeWithFeedback(codec, at, residual + (at - data), piece.segments.length(i), out + piece.layout.offset(i), acc);
      } else {
        x.encode(codec, at, piece.segments.length(i), out + piece.layout.offset(i));
      }
    }
    if (!kEarly) postExchange(k);
    for (int i = 1; i < p; ++i) {
      const int peer = (r + i) % p;
      x.send(peer, exchangeSlot(k), out + piece.layout.offset(peer), piece.layout.length(peer));
    }
    x.step();
  };
  // Sums this rank's segment in fp32, own contribution first and then the others in rank order,
  // encodes the sum once (the second rounding) and sends it to everyone.
  auto reduceAndGather = [&](size_t k) {
    const CompressedPiece& piece = pieces[k];
    for (const auto& h : exchangeRecvs[k]) x.arrived(h);
    const size_t n = piece.segments.length(r);
    const size_t mine = piece.layout.length(r);
    const uint8_t* from = received + place.receivedAt[k];
    x.decode(codec, encoded + place.encodedAt[k] + piece.layout.offset(r), n, acc);
    const int last = r == p - 1 ? p - 2 : p - 1;
    for (int q = 0; q < last; ++q) {
      if (q != r) x.decodeAdd(codec, from + q * mine, n, acc);
    }
    uint8_t* sum = gathered + place.encodedAt[k] + piece.layout.offset(r);
    x.decodeAddEncode(codec, from + last * mine, acc, n, sum, average ? factor : 1.0f);
    if (!kEarly) postGather(k);
    for (int i = 1; i < p; ++i) x.send((r + i) % p, gatherSlot(k), sum, mine);
    x.step();
  };
  auto decodeGathered = [&](size_t k) {
    const CompressedPiece& piece = pieces[k];
    for (const auto& h : gatherRecvs[k]) x.arrived(h);
    for (int i = 0; i < p; ++i) {
      x.decode(codec, gathered + place.encodedAt[k] + piece.layout.offset(i), piece.segments.length(i),
               data + piece.begin + piece.segments.offset(i));
    }
    if (stages.after) stages.after(k);
  };

  x.phase("compressed all-reduce");
  const size_t count = pieces.size();
  if (p == 1) {
    for (size_t k = 0; k < count; ++k) {
      encodeAndExchange(k);
      decodeGathered(k);
    }
    return;
  }
  for (size_t k = 0; kEarly && k < count; ++k) {
    postExchange(k);
    postGather(k);
  }
  // On the CPU a software pipeline; on a link piece after piece.
  const size_t lag = kEarly ? 1 : 0;
  for (size_t k = 0; k < count + 2 * lag; ++k) {
    if (k < count) encodeAndExchange(k);
    if (k >= lag && k - lag < count) reduceAndGather(k - lag);
    if (k >= 2 * lag) decodeGathered(k - 2 * lag);
  }
  x.drain();
}

}  // namespace pycomm::algorithms
