// The step interface a collective schedule is written against once, and what its two executors
// promise. A schedule is a function template over `Steps`, the executor type:
//
//   template <class Steps> void ringSchedule(Steps& x, ...);
//
// and calls only these members (all inline, resolved at compile time: no virtual call, no
// std::function, no step list in memory):
//
//   x.rank(), x.size()
//   Handle x.recv(peer, slot, data, bytes)  a receive into `data`; it lands at some point between
//                                           this call and x.arrived(handle)
//   Handle x.send(peer, slot, data, bytes)  a send of `data`; it reads `data` at some point between
//                                           this call and x.left(handle)
//   x.arrived(handle)    before the schedule reads (reduces, forwards) what a receive brought
//   x.left(handle)       before the schedule overwrites what a send reads
//   x.step()             the transfers posted so far belong together (one exchange): they may
//                        all be in flight at once, and none of them waits for a later one
//   x.drain()            every transfer posted so far is done (the schedule's end)
//   x.phase(what)        names the steps that follow, for errors
//   x.reduce(dst, src, count, dtype, op)    dst = dst op src elementwise (codecs/reduce.h)
//   x.copy(dst, src, bytes)
//   x.encode(codec, in, count, out), x.decode(codec, in, count, out), x.decodeAdd(codec, in, count, acc),
//   x.scale(data, count, factor)            the codecs of codecs/block_codec.h, and data[i] *= factor
//   x.decodeAddEncode(codec, in, acc, count, out, factor)
//                                           out = encode((acc + decode(in)) * factor); acc is scratch after
//   x.encodeWithFeedback(codec, data, residual, count, out, decoded)
//                                           compressed.h's error feedback: data += residual, out =
//                                           encode(data), decoded = decode(out), residual = data - decoded
//   Steps::kReceiveAhead  how many steps ahead a receive may be posted into a scratch area: a
//                         schedule cycles through that many areas per chunk
//   Steps::kPipelinesChunks  whether cutting a stretch into chunks buys overlap (else a schedule
//                            moves each stretch whole)
//   Steps::kTaggedTransfers  whether transfers match by (peer, slot), so that a schedule may post
//                            every receive up front (else each goes out in the step it pairs in)
//
// The schedule states dataflow (what each step reads and writes, and when a buffer is needed);
// each executor turns it into its own kind of progress:
//
//   OpSteps (op_steps.h), the CPU: recv and send become the transport's irecv and isend at once,
//   tagged with the slot; arrived and left wait on that request; step and phase do nothing. So the
//   receives a schedule posts early are on the wire early, and the reduction of chunk c runs while
//   chunk c+1 is in flight, exactly as a hand-written CPU schedule would.
//
//   QueuedSteps (queued_steps.h), a stream-ordered link (NCCL, the native tests' in-memory link):
//   slots are ignored (the link pairs transfers by order); sends join the open group; receives
//   are held back until the schedule needs them (arrived, step or drain) and then join the open
//   group, which is posted; kernels post the open group first, so they run after it. Holding
//   receives back is what keeps a schedule that posts receives early deadlock-free on a link whose
//   groups complete as a whole: each group holds only the receive the next kernel waits for and
//   the sends issued since the previous group.
//
// Both executors see the same transfers and the same reductions in the same order of reduction
// (where a schedule asks kTaggedTransfers, the CPU posts its receives earlier), so a schedule gives
// the same bits on either (tests/native/test_queued_collectives.cc).
// Transfers of zero bytes are skipped by the queued executor, as the link skips them on both sides.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pycomm::algorithms {

// Scratch for receives that will be reduced into the caller's buffer, cut into areas of one chunk
// each: area (k, c) is for chunk c of a step whose index is k modulo the areas in flight. Each area
// has 16 bytes to spare so that a receive can land at the address of its reduction target modulo
// 16 (the reduce kernels' vector path wants dst and src to share it; element alignment follows,
// 16 being a multiple of every element size).
struct ReceiveAreas {
  static size_t stride(size_t chunkBytes) { return ((chunkBytes + 15) & ~size_t{15}) + 16; }
  static size_t bytes(size_t steps, size_t chunks, size_t chunkBytes) { return steps * chunks * stride(chunkBytes); }

  uint8_t* base;
  size_t chunks;
  size_t strideBytes;

  // Where to receive chunk c of step-area k that will be reduced into `target`.
  uint8_t* at(size_t k, size_t c, const uint8_t* target) const {
    uint8_t* area = base + (k * chunks + c) * strideBytes;
    return area + ((reinterpret_cast<uintptr_t>(target) - reinterpret_cast<uintptr_t>(area)) & 15);
  }
};

}  // namespace pycomm::algorithms
