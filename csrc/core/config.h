// Everything a communicator is told when it is created. The Python layer fills it from
// pycomm.Options and the environment; the core never reads the environment itself.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "codecs/block_codec.h"
#include "logging.h"

namespace pycomm {

enum class Algorithm { kAuto, kRing, kTree, kRhd };
// auto: shared memory among ranks on one host, TCP otherwise; tcp: sockets everywhere; shm: shared
// memory, and an error at setup if the group's ranks are not all on one host.
enum class TransportKind { kAuto, kTcp, kShm };
// How the adapter moves CUDA tensors: NCCL point-to-point when it can (kAuto), always (kNccl), or
// through host memory and the transports above (kStaged). The core itself never sees a device.
enum class DeviceTransport { kAuto, kNccl, kStaged };

// Fitted constants of one all-reduce algorithm: seconds per step and per byte a rank moves.
struct AlgorithmCost {
  double alpha = 0;
  double beta = 0;
};

// The constants of every algorithm for all-reduces of up to upToBytes bytes (and more than the
// previous band's limit). Defaults are placeholders of the right shape; the Python layer passes
// the measured table.
struct CostBand {
  size_t upToBytes = SIZE_MAX;
  AlgorithmCost ring{30e-6, 1.0e-9};
  AlgorithmCost tree{30e-6, 1.2e-9};
  AlgorithmCost rhd{30e-6, 1.1e-9};
  const AlgorithmCost& of(Algorithm a) const {
    return a == Algorithm::kTree ? tree : a == Algorithm::kRhd ? rhd : ring;
  }
};

// Bands in increasing upToBytes; the last one also covers larger sizes.
struct CostModel {
  std::vector<CostBand> bands{CostBand{}};
  const CostBand& bandFor(size_t nbytes) const {
    for (const CostBand& band : bands) {
      if (nbytes <= band.upToBytes) return band;
    }
    return bands.back();
  }
};

// What a group formed from another one (torch's new_group from the default group, a split, a
// shrink) takes from it instead of from a fresh rendezvous: its secret, derived from the other's.
// Every member derives the same (Communicator::lineageFor), so none reads it from the store; such
// a group also exchanges its ranks' host ids over its new connections rather than the store.
struct Lineage {
  std::array<uint8_t, 16> token{};
};

struct Config {
  int rank = 0;
  int size = 1;
  std::string groupName;
  std::chrono::milliseconds timeout{300000};
  // Address to listen on; the adapter resolves it from the interface or the rendezvous host.
  std::string bindHost = "127.0.0.1";
  TransportKind transport = TransportKind::kAuto;
  DeviceTransport deviceTransport = DeviceTransport::kAuto;
  // Ranks with equal host ids share memory (the Python layer derives it from the host, its boot and
  // its network namespace; PYCOMM_HOST_ID overrides).
  std::string hostId;
  size_t shmSlotBytes = 1024 * 1024;
  // Capacity of each shared-memory byte ring between two ranks of a host (see transport/shm/ring.h),
  // at most: a host group of p ranks has p * p rings and gives each 16 MiB / p^2 (at least 256 KiB).
  size_t shmRingBytes = 2 * 1024 * 1024;
  Algorithm algorithm = Algorithm::kAuto;
  // Pipelining grain: large ops are cut into chunks of this many bytes (measured default).
  size_t chunkBytes = 512 * 1024;
  // The grain of ops on a queued link (the NCCL route), which runs a chunk's transfers and kernels
  // one after another: a chunk there buys no overlap, only one more NCCL latency (measured default).
  size_t deviceChunkBytes = 16 * 1024 * 1024;
  CostModel costModel;
  // allreduce_coalesced fuses tensors into buckets of at most this many bytes (DDP's default).
  size_t bucketBytes = 25 * 1024 * 1024;
  // How long a socket a waiting thread drained stays out of the TCP event loop's sight; 0: none.
  std::chrono::milliseconds tcpLinger{10};
  // Bytes of frames that arrived before their receive was posted that a rank holds per peer, at
  // most; a peer that sends more is failed with an error saying so.
  uint64_t unexpectedBytes = uint64_t{4} << 30;
  // When set, fp32 all-reduce (SUM/AVG), reduce-scatter and all-gather travel compressed.
  std::optional<codecs::Codec> compression;
  LogLevel logLevel = LogLevel::kWarn;
  // Set for a group formed from another (see Lineage); a group formed afresh has none.
  std::optional<Lineage> lineage;
};

const char* algorithmName(Algorithm algorithm);
// Throws InvalidUsageError listing the valid names.
Algorithm parseAlgorithm(const std::string& name);

}  // namespace pycomm
