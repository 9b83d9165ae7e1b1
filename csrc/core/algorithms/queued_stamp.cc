#include "queued_stamp.h"

#include "../error.h"

namespace pycomm::algorithms {

QueuedStamp makeQueuedStamp(const transport::OpSignature& signature, bool average) {
  QueuedStamp stamp;
  stamp.magic = kQueuedStampMagic;
  stamp.average = average ? 1 : 0;
  stamp.signature = signature;
  return stamp;
}

std::string describe(const QueuedStamp& stamp) {
  if (stamp.magic != kQueuedStampMagic) return "nothing recognisable (not a pycomm op stamp)";
  // 0 (auto) where the algorithm does not decide the transfers; past kRhd, not an Algorithm at all
  // (a stamp from elsewhere), named by number.
  const std::string schedule =
      stamp.algorithm == 0 ? ""
      : stamp.algorithm <= static_cast<uint8_t>(Algorithm::kRhd)
          ? strCat("algorithm ", algorithmName(static_cast<Algorithm>(stamp.algorithm)), ", ")
          : strCat("algorithm #", int(stamp.algorithm), ", ");
  return strCat("op #", stamp.seq, ", ", stamp.signature.describe(), stamp.average ? " averaged" : "", " (", schedule,
                "cuda_chunk_bytes ", stamp.chunkBytes, ")");
}

bool sameOp(const QueuedStamp& a, const QueuedStamp& b) {
  return a.magic == b.magic && a.signature == b.signature && a.average == b.average &&
         a.algorithm == b.algorithm && a.seq == b.seq && a.chunkBytes == b.chunkBytes;
}

namespace queued {

void exchangeStamps(QueuedLink& link, void* mine, void* previous) {
  const int p = link.size();
  if (p == 1) return;
  const int r = link.rank();
  link.post({{QueuedTransfer::Kind::kSend, (r + 1) % p, mine, sizeof(QueuedStamp)},
             {QueuedTransfer::Kind::kRecv, (r + p - 1) % p, previous, sizeof(QueuedStamp)}},
            "op stamps");
}

void checkStamps(int rank, int size, const QueuedStamp& mine, const QueuedStamp& previous, bool ran,
                 const std::string& what) {
  if (size == 1 || sameOp(mine, previous)) return;
  if (!ran && previous.magic != kQueuedStampMagic) return;
  throw InvalidUsageError(strCat("[rank ", rank, "/", size, "] ", what,
                                 ": mismatched collectives across ranks: this rank runs ", describe(mine), " but rank ",
                                 (rank + size - 1) % size, " runs ", describe(previous),
                                 "; every rank must issue the same collectives, in the same order"));
}

}  // namespace queued
}  // namespace pycomm::algorithms
