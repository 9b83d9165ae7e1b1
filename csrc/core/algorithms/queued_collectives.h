// pycomm's collectives over a stream-ordered link (queued_link.h): what runs on GPUs over NCCL's
// point-to-point. Every one is the CPU's own schedule (ring_schedule.h, tree_schedule.h,
// rhd_schedule.h, chain_schedule.h, alltoall_schedule.h, compressed_schedule.h) run by the queued
// executor (queued_steps.h): the same segments, the same pieces, the same order of reduction. With
// kernels that match the CPU's bits, a queued all-reduce gives the bits the CPU algorithm of the
// same name gives.
//
// Everything is posted to the link; nothing waits on the host. Every rank posts the same sequence
// of steps, and a step's group pairs only with the same step's groups on other ranks, so the
// schedules cannot deadlock whatever the link's buffering. Scratch is the caller's, its sizes from
// the *ScratchBytes functions; the host side keeps only the transfer lists of the groups.
//
// Differences from the CPU runs, all about overlap, none about results: a link runs its groups and
// kernels one after another, so the ring does not cut segments into chunks (reduction and transfer
// would not overlap anyway); the tree keeps its chunks, which lets the levels of a tree work on
// different chunks at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../codecs/block_codec.h"
#include "../dtype.h"
#include "allreduce_plan.h"
#include "op.h"
#include "queued_link.h"

namespace pycomm::algorithms::queued {

size_t ringScratchBytes(const Segments& segments, DataType dtype);
// Ring reduce-scatter in place: rank r ends with segment r of `data` reduced over every rank (the
// other segments hold partial results).
void ringReduceScatter(QueuedLink& link, uint8_t* data, uint8_t* scratch, const Segments& segments, DataType dtype,
                       ReduceOp op);
// Ring all-gather in place: segment r of `data` holds rank r's part; every rank ends with all parts.
void ringAllgather(QueuedLink& link, uint8_t* data, const Segments& segments, size_t elementBytes);

// The all-reduce allreduce_plan.h planned (planAllreduce with no cost model on a link): the
// algorithm's bits are the CPU's for the same plan.
size_t allreduceScratchBytes(const AllreducePlan& plan, size_t count, int size, DataType dtype);
void allreduce(QueuedLink& link, const AllreducePlan& plan, uint8_t* data, uint8_t* scratch, size_t count,
               DataType dtype, ReduceOp op);

// All-to-all as one group, as direct.h's: sendBytes[q] bytes at in + sendOffsets[q] go to rank q,
// recvBytes[q] bytes from rank q land at out + recvOffsets[q], and this rank's own block is copied.
// Every rank's sendBytes[q] must equal q's recvBytes[r] (nothing on the wire checks it). `in` and
// `out` must not overlap.
void directAlltoall(QueuedLink& link, const uint8_t* in, const std::vector<size_t>& sendOffsets,
                    const std::vector<size_t>& sendBytes, uint8_t* out, const std::vector<size_t>& recvOffsets,
                    const std::vector<size_t>& recvBytes);

// Root's `bytes` to every rank down the chain root, root+1, ... in chunks of chunkBytes: a rank
// forwards chunk c while it receives chunk c+1.
void chainBroadcast(QueuedLink& link, uint8_t* data, size_t bytes, int root, size_t chunkBytes);

size_t compressedScratchBytes(size_t count, int size, int rank, codecs::Codec codec, size_t chunkBytes);
// compressed.h's all-reduce (two roundings at any world size; one at world 1), piece by piece:
// compressed_schedule.h's, without error feedback.
void compressedAllreduce(QueuedLink& link, float* data, uint8_t* scratch, size_t count, codecs::Codec codec,
                         bool average, size_t chunkBytes);

size_t compressedReduceScatterScratchBytes(size_t count, int size, codecs::Codec codec);
// compressed.h's reduce-scatter: `in` holds p blocks of count floats; block r, summed in fp32 in rank
// order over the encoded blocks (one rounding), lands in `out`, times the float 1/p if `average`.
void compressedReduceScatter(QueuedLink& link, const float* in, float* out, uint8_t* scratch, size_t count,
                             codecs::Codec codec, bool average);

size_t compressedAllgatherScratchBytes(size_t count, int size, codecs::Codec codec);
// compressed.h's all-gather: every rank encodes its count floats once, the encodings go round the
// ring, and every rank decodes all of them (its own too) into `out` (p blocks). `in` may be block r
// of `out`: it is encoded before anything is written.
void compressedAllgather(QueuedLink& link, const float* in, float* out, uint8_t* scratch, size_t count,
                         codecs::Codec codec);

}  // namespace pycomm::algorithms::queued
