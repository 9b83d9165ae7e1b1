// The wire format: every message is one fixed header followed by `nbytes` of payload.
//
// The header says what the sender thinks it is doing (op kind, dtype, reduce op, root, element
// count, sequence number), so that a receiver whose own op differs detects it on the first frame and
// fails with both sides' views instead of reducing garbage or waiting forever.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "../codecs/block_codec.h"

namespace pycomm::transport {

constexpr uint32_t kFrameMagic = 0x4d435950;  // "PYCM"
constexpr uint8_t kFrameVersion = 1;
// A frame larger than this is malformed: no single message of ours gets near it.
constexpr uint64_t kMaxFrameBytes = uint64_t{1} << 40;

// kMoveToSharedMemory: the sender's later frames come through its shared-memory ring.
// kPing asks the peer's transport for a kPong at once (a liveness probe after a timeout: a frozen
// process answers nothing, a live one answers even while its own op waits).
enum class FrameKind : uint8_t { kData = 1, kError = 2, kMoveToSharedMemory = 3, kPing = 4, kPong = 5 };
enum class Channel : uint8_t { kCollective = 1, kP2P = 2 };

// What operation a collective frame belongs to. Order matters: it is on the wire.
enum class OpKind : uint8_t {
  kNone = 0,
  kAllreduce,
  kBroadcast,
  kReduce,
  kAllgather,
  kReduceScatter,
  kGather,
  kScatter,
  kAlltoall,
  kBarrier,
  kSend,
};
const char* opKindName(OpKind kind);

// What the sender says about the op; the receiver compares it field by field with its own.
struct OpSignature {
  OpKind kind = OpKind::kNone;
  uint8_t dtype = 0;
  uint8_t reduceOp = 0;
  uint8_t codec = 0;  // 0: uncompressed; 1 + codecs::Codec otherwise
  int32_t root = -1;
  uint64_t count = 0;  // elements per rank as the op defines it (0 where counts may differ)

  bool operator==(const OpSignature& o) const {
    return kind == o.kind && dtype == o.dtype && reduceOp == o.reduceOp && codec == o.codec &&
           root == o.root && count == o.count;
  }
  bool operator!=(const OpSignature& o) const { return !(*this == o); }
  std::string describe() const;
};

#pragma pack(push, 1)
struct FrameHeader {
  uint32_t magic;
  uint8_t version;
  uint8_t kind;     // FrameKind
  uint8_t channel;  // Channel
  uint8_t opKind;   // OpKind
  uint8_t dtype;
  uint8_t reduceOp;
  uint8_t codec;
  uint8_t reserved;
  int32_t root;
  uint64_t seq;  // collective: op sequence number; p2p: user tag
  uint32_t slot; // collective: step and chunk index within the op
  uint32_t reserved2;
  uint64_t count;
  uint64_t nbytes;
};
#pragma pack(pop)
static_assert(sizeof(FrameHeader) == 48, "the frame header is part of the wire format");

// Identity of one message: the channel, the op (or tag) and the slot inside the op.
struct FrameInfo {
  Channel channel = Channel::kCollective;
  uint64_t seq = 0;
  uint32_t slot = 0;
  OpSignature signature;
};

FrameHeader makeHeader(FrameKind kind, const FrameInfo& info, uint64_t nbytes);
OpSignature signatureOf(const FrameHeader& header);
// OpSignature::codec for an op: 0 when uncompressed, 1 + the codec otherwise; and back (nullopt for
// 0 and for a byte that names no codec).
uint8_t signatureCodec(std::optional<codecs::Codec> codec);
std::optional<codecs::Codec> codecOfSignature(uint8_t codec);
// The header in words, for traces and errors: "data seq=3 slot=1 op=allreduce count=8 bytes=32".
std::string describeFrame(const FrameHeader& header);
// Empty string if the header is well formed, otherwise why not.
std::string validateHeader(const FrameHeader& header);

}  // namespace pycomm::transport
