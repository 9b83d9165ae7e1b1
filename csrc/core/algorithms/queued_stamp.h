// Agreement across ranks on the op a queued schedule runs.
//
// NCCL's transfers carry no header. A rank that runs another op than its peers (another count,
// another reduce op, its ops in another order) pairs its transfers with the wrong ones: the group
// hangs until the timeout or, where the byte counts happen to agree, the op gives wrong results
// with no error. Over TCP every frame carries the op's signature (transport/frame.h); a queued op
// instead begins with one group of its own, in which each rank sends a stamp of its op to the next
// rank and receives the previous rank's. That group pairs whatever the op's later groups do, so the
// previous rank's stamp is there to compare when the op has run, or when it timed out, to say why.
// Around the ring every stamp is compared with one other, so if the ranks disagree, at least one
// of them fails with both ops named (the same guarantee as the TCP frames').
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "../config.h"
#include "../transport/frame.h"
#include "queued_link.h"

namespace pycomm::algorithms {

struct QueuedStamp {
  uint32_t magic = 0;     // kQueuedStampMagic once made: a stamp that never arrived reads as zeros
  uint8_t average = 0;    // AVG: the sum divided by the world size
  uint8_t algorithm = 0;  // Algorithm, for the ops whose transfers depend on it; 0 for the others
  uint16_t reserved = 0;
  transport::OpSignature signature;  // kind, dtype, reduce op, codec, root, count
  uint64_t seq = 0;                  // the op's number among the group's queued ops, from 1
  uint64_t chunkBytes = 0;
};
// Stamps travel as raw bytes between ranks of one build: no padding, so every byte sent is defined.
static_assert(sizeof(transport::OpSignature) == 16 && std::is_trivially_copyable_v<QueuedStamp>);
static_assert(sizeof(QueuedStamp) == 40 && offsetof(QueuedStamp, signature) == 8 && offsetof(QueuedStamp, seq) == 24);

constexpr uint32_t kQueuedStampMagic = 0x51535450;  // "QSTP"

// A stamp of `signature` (transport/frame.h) and `average`; algorithm, chunkBytes and seq are the
// caller's to fill in.
QueuedStamp makeQueuedStamp(const transport::OpSignature& signature, bool average);
std::string describe(const QueuedStamp& stamp);
bool sameOp(const QueuedStamp& a, const QueuedStamp& b);

namespace queued {

// One group: `mine` to rank + 1, rank - 1's into `previous`, sizeof(QueuedStamp) bytes each, in
// the link's memory. Nothing at world 1. Post it before the op's first group.
void exchangeStamps(QueuedLink& link, void* mine, void* previous);

// Throws InvalidUsageError naming both ops unless `previous`, rank - 1's stamp as exchangeStamps
// received it, is the same op as `mine`. `ran`: the op's stream ran to its end, so `previous`
// arrived. Otherwise (the op failed or timed out) a stamp that did not arrive, all zeros, proves
// nothing and passes: the caller reports its own error. `what` names the op in the message.
void checkStamps(int rank, int size, const QueuedStamp& mine, const QueuedStamp& previous, bool ran,
                 const std::string& what);

}  // namespace queued
}  // namespace pycomm::algorithms
