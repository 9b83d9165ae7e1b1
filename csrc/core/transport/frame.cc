#include "frame.h"

#include "../dtype.h"
#include "../error.h"

namespace pycomm::transport {

const char* opKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce: return "allreduce";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kReduce: return "reduce";
    case OpKind::kAllgather: return "allgather";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kGather: return "gather";
    case OpKind::kScatter: return "scatter";
    case OpKind::kAlltoall: return "alltoall";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kSend: return "send";
    default: return "none";
  }
}

std::string OpSignature::describe() const {
  std::string out = strCat(opKindName(kind), " of ", count, " ",
                           dtypeName(static_cast<DataType>(dtype)), " elements");
  if (kind == OpKind::kAllreduce || kind == OpKind::kReduce || kind == OpKind::kReduceScatter) {
    out += strCat(" (op ", reduceOpName(static_cast<ReduceOp>(reduceOp)), ")");
  }
  if (root >= 0) out += strCat(" with root ", root);
  if (const auto c = codecOfSignature(codec)) out += strCat(" compressed as ", codecs::codecName(*c));
  return out;
}

uint8_t signatureCodec(std::optional<codecs::Codec> codec) {
  return codec ? static_cast<uint8_t>(1 + static_cast<int>(*codec)) : 0;
}

std::optional<codecs::Codec> codecOfSignature(uint8_t codec) {
  if (codec == 0 || codec > 1 + static_cast<int>(codecs::Codec::kFp8E5M2)) return std::nullopt;
  return static_cast<codecs::Codec>(codec - 1);
}

FrameHeader makeHeader(FrameKind kind, const FrameInfo& info, uint64_t nbytes) {
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.version = kFrameVersion;
  h.kind = static_cast<uint8_t>(kind);
  h.channel = static_cast<uint8_t>(info.channel);
  h.opKind = static_cast<uint8_t>(info.signature.kind);
  h.dtype = info.signature.dtype;
  h.reduceOp = info.signature.reduceOp;
  h.codec = info.signature.codec;
  h.root = info.signature.root;
  h.seq = info.seq;
  h.slot = info.slot;
  h.count = info.signature.count;
  h.nbytes = nbytes;
  return h;
}

OpSignature signatureOf(const FrameHeader& h) {
  OpSignature s;
  s.kind = static_cast<OpKind>(h.opKind);
  s.dtype = h.dtype;
  s.reduceOp = h.reduceOp;
  s.codec = h.codec;
  s.root = h.root;
  s.count = h.count;
  return s;
}

std::string validateHeader(const FrameHeader& h) {
  if (h.magic != kFrameMagic) return strCat("bad magic 0x", std::hex, h.magic);
  if (h.version != kFrameVersion) return strCat("unsupported frame version ", int(h.version));
  if (h.kind < static_cast<uint8_t>(FrameKind::kData) || h.kind > static_cast<uint8_t>(FrameKind::kPong)) {
    return strCat("unknown frame kind ", int(h.kind));
  }
  if ((h.kind == static_cast<uint8_t>(FrameKind::kPing) || h.kind == static_cast<uint8_t>(FrameKind::kPong)) &&
      h.nbytes != 0) {
    return strCat("a probe frame with ", h.nbytes, " bytes of payload");
  }
  if (h.channel != static_cast<uint8_t>(Channel::kCollective) &&
      h.channel != static_cast<uint8_t>(Channel::kP2P)) {
    return strCat("unknown channel ", int(h.channel));
  }
  if (h.opKind > static_cast<uint8_t>(OpKind::kSend)) return strCat("unknown op kind ", int(h.opKind));
  if (h.dtype >= static_cast<uint8_t>(DataType::kCount)) return strCat("unknown dtype ", int(h.dtype));
  if (h.codec > 4) return strCat("unknown codec ", int(h.codec));
  if (h.nbytes > kMaxFrameBytes) return strCat("frame of ", h.nbytes, " bytes exceeds the limit");
  return {};
}

std::string describeFrame(const FrameHeader& h) {
  return strCat(h.kind == static_cast<uint8_t>(FrameKind::kError)                ? "error"
                : h.kind == static_cast<uint8_t>(FrameKind::kMoveToSharedMemory) ? "move to shared memory"
                : h.kind == static_cast<uint8_t>(FrameKind::kPing)               ? "ping"
                : h.kind == static_cast<uint8_t>(FrameKind::kPong)               ? "pong"
                                                                                 : "data",
                h.channel == static_cast<uint8_t>(Channel::kP2P) ? " p2p tag=" : " seq=", h.seq,
                " slot=", h.slot, " op=", opKindName(static_cast<OpKind>(h.opKind)), " count=", h.count,
                " bytes=", h.nbytes);
}

}  // namespace pycomm::transport
