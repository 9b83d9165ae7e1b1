// What the communicator's implementation files share (communicator.cc, communicator_shm.cc,
// communicator_ops.cc): the names they use, and the templates that run one op, which live here so
// that each file instantiates them for its own ops.
#pragma once

#include <chrono>
#include <exception>
#include <string>

#include "algorithms/hierarchical_compressed.h"
#include "algorithms/op.h"
#include "communicator.h"
#include "error.h"
#include "transport/shm/group.h"

namespace pycomm {

using algorithms::Op;
using algorithms::Segments;
using transport::Clock;
using transport::OpKind;
using transport::OpSignature;
using transport::shm::StepWait;

// An op's signature, as every rank's frames and shared-memory steps of it carry it.
inline OpSignature makeSignature(OpKind kind, DataType dtype, ReduceOp op, int root, size_t count) {
  OpSignature s;
  s.kind = kind;
  s.dtype = static_cast<uint8_t>(dtype);
  s.reduceOp = static_cast<uint8_t>(op);
  s.root = root;
  s.count = count;
  return s;
}

template <typename Body>
void Communicator::runCollective(OpSignature signature, const char* algorithm, Body body,
                                 const char* transportName, bool viaShm) {
  const uint64_t seq = ++seq_;
  const auto start = Clock::now();
  if (transportName == nullptr) transportName = transport_->name();
  // Appended, not streamed: the streams (three per op, with the stats key and the prefix) cost
  // about a microsecond, a tenth of a 4 KiB all-reduce over shared memory.
  // One allocation: the room for the longest names reserved before anything is appended.
  std::string context;
  context.reserve(prefix_.size() + 80);
  context.append(prefix_).append(" ").append(transport::opKindName(signature.kind)).append("/").append(algorithm);
  context.append(" ").append(transportName).append(" seq=").append(std::to_string(seq));
  Op op(*transport_, ledger_, seq, signature, std::move(context), start + timeout(), timeout());
  try {
    ledger_.begin(seq, signature);
    announce(op, viaShm);
    body(op);
    op.finish();
  } catch (const std::exception& e) {
    op.fail(e.what());
    throw;
  }
  // This op completed everywhere it could; an earlier one that had completed here failed on a
  // peer. Raise that now, after this op, so the ranks stay in step and every rank hears of it.
  if (std::string late = ledger_.takeLateFailure(); !late.empty()) throw RemoteError(late);
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
  if (formed_) record(signature, op.bytesSent(), op.bytesReceived(), us * 1e-6);  // not the setup's
  if (logger_.enabled(LogLevel::kInfo)) {
    logger_.log(LogLevel::kInfo,
                strCat(" seq=", seq, " ", transport::opKindName(signature.kind), " ",
                       signature.count * elementSize(static_cast<DataType>(signature.dtype)), " B ",
                       algorithm, " ", transportName, " sent ", op.bytesSent(), " B ", us, " us"));
  }
}

template <typename Body>
bool Communicator::runShm(OpSignature signature, const char* algorithm, Body body) {
  if (!shm_ || !sharedMemoryFor(seq_.load() + 1)) return false;
  runCollective(signature, algorithm, [&](Op& o) {
    const StepWait wait = shmWait(o);
    try {
      body(wait);
    } catch (const std::exception&) {
      // The ranks' steps may now disagree: the group leaves shared memory from the next op on,
      // before anyone hears of this failure (op.fail reports it), so that a peer that hears it
      // finds the group's decision made when it starts its next op.
      shm_->abandon(o.seq() + 1);
      shmBroken_ = true;
      throw;
    }
  }, "shm", true);
  return true;
}

// A failure inside the op moves this host to the flat path, every rank of it (abandon); a failure
// a peer reported afterwards, of an op that completed here, leaves the steps in agreement. The
// other hosts cannot see this host's segment; their ranks fail the op too and leave their own
// host's shared memory the same way: docs/RELIABILITY.md.
template <typename Body>
bool Communicator::runHierarchical(OpSignature signature, const char* algorithm, Body body) {
  if (!hierarchy_ || !sharedMemoryFor(seq_.load() + 1)) return false;
  runCollective(signature, algorithm, [&](Op& o) {
    Hierarchy& h = *hierarchy_;
    const StepWait wait = shmWait(o);
    // Same signature as the whole op: frames of one seq must all agree (OpLedger::begin).
    Op cross(*h.cross, ledger_, o.seq(), o.signature(), o.context() + " (across hosts)", o.deadline(), timeout());
    try {
      body(cross, algorithms::HostGrid{*h.local, wait, o.signature(), h.grid});
      cross.waitAll();
    } catch (const std::exception& e) {
      // The host's ranks may now disagree about this op (a local index whose cross op failed
      // while the others' completed): the host leaves shared memory from the next op on, before
      // anyone hears of this failure, as runShm does.
      h.local->abandon(o.seq() + 1);
      shmBroken_ = true;
      cross.fail(e.what());
      throw;
    }
    o.countBytesOf(cross);
  }, "shm+tcp", true);
  return true;
}

}  // namespace pycomm
