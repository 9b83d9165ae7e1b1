// The communicator's shared memory: finding the ranks that share a host, forming their group
// (transport/shm) or the hierarchy of several hosts, and what every op asks of it (whether it runs
// there, its wait, its announcement); and the hierarchical all-reduce, shared memory inside a host
// and the connections across hosts.
#include <algorithm>
#include <map>

#include "algorithms/allreduce_plan.h"
#include "algorithms/direct.h"
#include "algorithms/shm_collectives.h"
#include "communicator.h"
#include "communicator_run.h"
#include "transport/shm/segment_group.h"
#include "transport/subset_transport.h"
#include "transport/tcp/sha256.h"

namespace pycomm {
namespace {

// The first `bytes` bytes of a digest in hex: for names and keys that are compared, not read.
std::string hexPrefix(const transport::tcp::Digest& digest, size_t bytes) {
  std::string hex;
  for (size_t i = 0; i < bytes; ++i) hex += strCat(std::hex, digest[i] >> 4, digest[i] & 0xf);
  return hex;
}

}  // namespace

void Communicator::setupSharedMemory(Store& store) {
  if (config_.hostId.empty()) return;
  // From a hash of the token, not the token: /dev/shm names are visible to everyone on the host.
  std::vector<uint8_t> labelled = {'p', 'y', 'c', 'o', 'm', 'm', '-', 's', 'h', 'm'};
  labelled.insert(labelled.end(), token_.begin(), token_.end());
  const std::string tokenHex = hexPrefix(transport::tcp::sha256(labelled.data(), labelled.size()), 12);
  auto segmentName = [&](int hostIndex) { return strCat("/pycomm-", tokenHex, "-", hostIndex); };
  // Rings attached to a segment the group gave up must not keep it mapped. A rank that failed
  // before it knew its host index does not know which segment name is its host's: it removes them
  // all (a peer that died after creating one leaves it to us).
  auto giveUp = [&] {
    for (int q = 0; q < size(); ++q) {
      if (q != rank()) links_->attachRings(q, {}, {}, nullptr);
    }
    for (int hostIndex = 0; hostIndex < size(); ++hostIndex) transport::shm::Segment::unlinkName(segmentName(hostIndex));
    shm_.reset();
    hierarchy_.reset();
  };
  try {
    formSharedMemoryGroups(store, segmentName);
  } catch (const transport::shm::SharedMemoryUnavailable& e) {
    giveUp();
    PYCOMM_CHECK(config_.transport != TransportKind::kShm, InvalidUsageError, prefix(), " transport=shm: ", e.what());
    logger_.log(LogLevel::kWarn, strCat(e.what(), ": the group runs over its connections"));
  } catch (...) {
    giveUp();
    throw;
  }
}

void Communicator::allgatherForSetup(void* rows, size_t rowBytes, const char* what) {
  // Every rank sends its row straight to every other: one step, all of it posted at once. A ring
  // takes p - 1 steps one after the other, each waking the next rank, which with more ranks than
  // cores cost as much as the store round it replaced.
  const size_t own = static_cast<size_t>(rank()) * rowBytes;
  std::vector<size_t> rowOf(size()), sendFrom(size(), own), bytes(size(), rowBytes);
  for (int q = 0; q < size(); ++q) rowOf[q] = static_cast<size_t>(q) * rowBytes;
  auto* data = static_cast<uint8_t*>(rows);
  runCollective(makeSignature(OpKind::kAllgather, DataType::kUInt8, ReduceOp::kSum, -1, rowBytes), what,
                [&](Op& o) { algorithms::directAlltoall(o, data, sendFrom, bytes, data, rowOf, bytes); });
}

std::vector<std::string> Communicator::hostIdsOfRanks(Store& store) {
  const std::string& mine = config_.hostId;
  if (config_.lineage) {
    // Fixed-size rows: each id as its digest, which every rank compares alike.
    std::vector<transport::tcp::Digest> digests(size());
    digests[rank()] = transport::tcp::sha256(mine.data(), mine.size());
    allgatherForSetup(digests.data(), sizeof(transport::tcp::Digest), "host ids");
    std::vector<std::string> hosts(size());
    for (int q = 0; q < size(); ++q) hosts[q] = "sha256:" + hexPrefix(digests[q], 16);
    return hosts;
  }
  store.set(strCat("pycomm/host/", rank()), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> keys;
  for (int q = 0; q < size(); ++q) keys.push_back(strCat("pycomm/host/", q));
  const auto values = store.getAll(keys, timeout());
  std::vector<std::string> hosts(size());
  for (int q = 0; q < size(); ++q) hosts[q].assign(values[q].begin(), values[q].end());
  return hosts;
}

std::string Communicator::voteOnSharedMemory(bool mappedHere, bool createdHere, const std::string& why,
                                             const std::vector<int>& hostOf) {
  struct Ballot {
    uint64_t chunkBytes;
    uint8_t mapped;
    uint8_t created;
    uint8_t unused[6];
  };
  static_assert(sizeof(Ballot) == 16, "a ballot has no padding of the compiler's");
  std::vector<Ballot> ballots(size());
  ballots[rank()] = Ballot{config_.chunkBytes, mappedHere, createdHere, {}};
  allgatherForSetup(ballots.data(), sizeof(Ballot), "setup vote");
  std::vector<int> creators(size(), 0);
  for (int q = 0; q < size(); ++q) creators[hostOf[q]] += ballots[q].created != 0 ? 1 : 0;
  // Every rank reads the same ballots, so all reach the same verdict (each names what it sees first).
  for (int q = 0; q < size(); ++q) {
    const Ballot& ballot = ballots[q];
    if (ballot.mapped == 0) {
      return strCat("rank ", q, " has no mapping", mappedHere ? "" : " (here: " + why + ")");
    }
    if (creators[hostOf[q]] != 1) {
      return strCat("rank ", q, "'s host's ranks created ", creators[hostOf[q]],
                    " segments of that name: they do not share one /dev/shm");
    }
    // chunk_bytes cuts the shared-memory steps of the hierarchical schedules: ranks that disagree
    // on it would pair steps of different lengths, which no signature tells apart. The
    // connections' frames carry their lengths, so a schedule cut differently fails there clearly.
    if (ballot.chunkBytes != config_.chunkBytes) {
      return strCat("chunk_bytes differs between ranks (rank ", q, ": ", ballot.chunkBytes, ", this rank: ",
                    config_.chunkBytes, ")");
    }
  }
  return {};
}

void Communicator::formSharedMemoryGroups(Store& store, const std::function<std::string(int)>& segmentName) {
  const std::vector<std::string> hosts = hostIdsOfRanks(store);
  const std::string& mine = hosts[rank()];
  // Hosts in order of their first rank; each host's ranks in rank order.
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> members;
  std::map<std::string, int> indexOf;
  std::vector<int> hostOf(size());  // rank -> host index
  for (int q = 0; q < size(); ++q) {
    if (indexOf.emplace(hosts[q], static_cast<int>(order.size())).second) order.push_back(hosts[q]);
    members[hosts[q]].push_back(q);
    hostOf[q] = indexOf[hosts[q]];
  }
  if (config_.transport == TransportKind::kShm && order.size() != 1) {
    // Every rank sees the same host list and raises the same error. The store usually lives in rank
    // 0's process, so no rank raises before all have read the list: a rank that left early would
    // turn the others' clear error into a lost store connection. A failure of this wait is only
    // logged, since this rank already knows its error.
    store.set(strCat("pycomm/host_read/", rank()), {1});
    try {
      std::vector<std::string> read;
      for (int q = 0; q < size(); ++q) read.push_back(strCat("pycomm/host_read/", q));
      store.getAll(read, timeout());
    } catch (const std::exception& error) {
      logger_.log(LogLevel::kWarn, strCat("waiting for the other ranks to read the host list: ", error.what()));
    }
    throw InvalidUsageError(strCat(prefix(), " transport=shm needs every rank on one host, but this group spans ",
                                   order.size(), " hosts (host id of rank 0: '", hosts[0], "', of this rank: '", mine,
                                   mine == config_.hostId ? "" : "' = '" + config_.hostId, "'); use transport=auto for shared memory inside hosts and TCP across them"));
  }
  const auto& local = members[mine];
  const int localRank = static_cast<int>(std::find(local.begin(), local.end(), rank()) - local.begin());
  const int hostIndex = hostOf[rank()];
  bool uniform = true;
  for (const auto& host : order) uniform = uniform && members[host].size() == local.size();
  if (order.size() > 1 && (!uniform || local.size() < 2)) return;  // plain TCP serves best

  // Every rank votes exactly once below (one op), so sequence numbers stay equal across the group.
  // `groupMembers` maps a host group rank to its rank in this group. Every rank attaches its rings
  // before it votes and moves its connections onto them after the vote, so a peer that reads a
  // move frame has its rings already.
  auto makeGroup = [&](int groupRank, int groupSize, const std::vector<int>& groupMembers) {
    auto group = std::make_unique<transport::shm::SegmentGroup>(
        groupRank, groupSize, config_.shmSlotBytes, config_.shmRingBytes, segmentName(hostIndex),
        [&](const transport::shm::SegmentGroup& g) {
          for (int q = 0; q < groupSize; ++q) {
            if (q != groupRank) links_->attachRings(groupMembers[q], g.ring(groupRank, q), g.ring(q, groupRank), g.memory());
          }
        },
        // Every rank of the communicator, on every host, votes once: all go without shared memory
        // if any lacks it, so the hosts keep one shape of all-reduce.
        [&](bool mappedHere, bool createdHere, const std::string& why) -> std::string {
          return voteOnSharedMemory(mappedHere, createdHere, why, hostOf);
        },
        groupMembers);
    for (int q = 0; q < groupSize; ++q) {
      if (q != groupRank) links_->moveToSharedMemory(groupMembers[q]);
    }
    return group;
  };
  if (order.size() == 1) {
    shm_ = makeGroup(rank(), size(), local);
    logger_.log(LogLevel::kInfo, "all ranks share this host: collectives use shared memory");
    return;
  }
  auto hierarchy = std::make_unique<Hierarchy>();
  hierarchy->localRank = localRank;
  hierarchy->localSize = static_cast<int>(local.size());
  std::vector<int> cross;
  for (const auto& host : order) cross.push_back(members[host][localRank]);
  for (const auto& host : order) hierarchy->grid.insert(hierarchy->grid.end(), members[host].begin(), members[host].end());
  hierarchy->cross = std::make_unique<transport::SubsetTransport>(*transport_, cross);
  hierarchy->local = makeGroup(localRank, hierarchy->localSize, local);
  hierarchy_ = std::move(hierarchy);
  logger_.log(LogLevel::kInfo, strCat(order.size(), " hosts of ", local.size(),
                                      " ranks: all-reduce is hierarchical (shared memory inside a host, TCP across)"));
}

StepWait Communicator::shmWait(const Op& o) {
  return StepWait{o.deadline(), o.context(), [this](int q) { return transport_->peerFailure(q); }, o.seq(),
                  [this](uint64_t seq) { return ledger_.failure(seq); },
                  [this](int q) { return transport_->judgeTimeout(q); }};
}

transport::shm::Group* Communicator::localGroup() const {
  return shm_ ? shm_.get() : hierarchy_ ? hierarchy_->local.get() : nullptr;
}

bool Communicator::sharedMemoryFor(uint64_t seq) {
  transport::shm::Group* group = localGroup();
  if (group == nullptr || shmBroken_) return false;
  // Decided once per op: the adapter asks (allreducesInSharedMemory) before the op asks again.
  if (shmDecidedFor_ != seq) {
    shmDecidedFor_ = seq;
    if (group->abandonedAt(seq)) {
      shmBroken_ = true;
      logger_.log(LogLevel::kInfo, strCat("op #", seq, " and later run over the connections: the group gave shared "
                                          "memory up after a failure"));
    }
  }
  return !shmBroken_;
}

void Communicator::announce(const Op& op, bool viaShm) {
  transport::shm::Group* group = shm_ && !shmBroken_ ? shm_.get() : hierarchy_ ? hierarchy_->local.get() : nullptr;
  if (group == nullptr) return;
  group->announce(op.seq(), op.signature());
  if (viaShm) return;  // a step that waits compares the announcements then (transport/shm/group.h)
  std::string mismatch = group->conflict(op.seq(), op.signature(), op.context());
  if (mismatch.empty()) return;
  // The peer is in a step of this op in shared memory and fails it too: both leave it.
  if (group == shm_.get()) {
    group->abandon(op.seq() + 1);
    shmBroken_ = true;
  }
  throw InvalidUsageError(mismatch);
}

// Reduce inside the host over shared memory, all-reduce one slice per local rank across hosts over
// TCP (so every rank of a host carries its share of the inter-host traffic), then gather the
// slices inside the host.
void Communicator::hierarchicalAllreduce(Op& cross, const algorithms::HostGrid& host, uint8_t* data, size_t count,
                                         DataType dtype, ReduceOp op, Algorithm algorithm) {
  const Hierarchy& h = *hierarchy_;
  const size_t esize = elementSize(dtype);
  algorithms::shmAllreduce(host.local, data, count, dtype, op, host.sig, host.wait);
  Segments slices(count, h.localSize);
  uint8_t* slice = data + slices.offset(h.localRank) * esize;
  const size_t n = slices.length(h.localRank);
  // The algorithm was planned for the whole op (allreduce()); the rest of the plan is the slice's.
  const algorithms::AllreducePlan plan = algorithms::planAllreduce(algorithm, nullptr, n * esize, h.cross->size(), dtype,
                                                                   config_.chunkBytes);
  algorithms::OpSteps steps(cross);
  algorithms::runAllreduce(
      steps, plan, slice,
      scratch(algorithms::allreduceScratchBytes<algorithms::OpSteps>(plan, n, h.cross->size(), dtype)), n, dtype, op);
  cross.waitAll();
  std::vector<size_t> offsets(h.localSize + 1);
  for (int q = 0; q <= h.localSize; ++q) offsets[q] = (q < h.localSize ? slices.offset(q) : count) * esize;
  algorithms::shmAllgatherParts(host.local, data, offsets, host.sig, host.wait);
}

}  // namespace pycomm
