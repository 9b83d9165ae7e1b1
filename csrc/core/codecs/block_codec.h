// Lossy compression codecs for fp32 buffers on the wire: fp16, bf16, and block-scaled fp8.
//
// Encoded formats (all multi-byte words in host byte order, which is little-endian on every platform
// pycomm supports; ranks of one group share it):
//
//   kFp16, kBf16   count 2-byte codes, element i at bytes [2i, 2i+2): IEEE binary16 / bfloat16 bits of
//                  in[i], round to nearest even (bit-identical to torch's .to(float16/bfloat16)).
//                  Overflow to +-Inf, Inf and NaN kept (the formats have them). No header.
//
//   kFp8E4M3,      ceil(count / 256) blocks, back to back; block b covers elements [256b, 256b + n)
//   kFp8E5M2       with n = min(256, count - 256b) (only the last block may be partial) and is
//                  4 + n bytes:
//                      bytes [0, 4)      fp32 scale word S
//                      bytes [4, 4 + n)  n one-byte fp8 codes, element 256b + j at byte 4 + j
//                  so block b starts at byte 260b and encodedBytes = count + 4 * ceil(count / 256).
//
// FP8 encoding of one block (MAX = 448 for E4M3, 57344 for E5M2; all arithmetic in fp32):
//   amax = max |x| over the block's finite elements (0 if there are none)
//   s    = amax / MAX                       (one fp32 division, as torch computes it)
//   d    = s > 0 ? s : 1                    (the divisor: never divide by zero)
//   code = fp8(x / d) for finite x          (round to nearest even; fp8.h)
// For a block whose s is a normal fp32 number (amax >= MAX * 2^-126, i.e. every block that is not
// absurdly tiny) x / d exceeds MAX by at most one fp32 rounding, far less than half an fp8 step, so
// code == (x / s).to(torch.float8_e4m3fn / e5m2) bit for bit.
// With a subnormal s (amax below ~5e-36 for E4M3, ~7e-34 for E5M2) x / s can round above MAX; such
// finite values saturate to +-MAX rather than becoming Inf/NaN. A block whose s underflows to 0
// (including an all-zero block) has only +-0 codes.
//   S = s       if every element of the block is finite (so an all-zero block stores S = 0 and
//               decodes to (signed) zeros);
//   S = d       if the block holds a NaN or an Inf (so S > 0 and Inf * S stays Inf), except:
//   S = -d      for E4M3 when the block holds a +-Inf ("Inf block", flagged by the sign bit of S).
//
// Decoding: out = fp8value(code) * S (one fp32 multiplication); in E4M3 Inf blocks (S < 0) the three
// special codes below give +-Inf/NaN and every other code fp8value(code) * |S|.
//
// NaN / Inf rule (never turned into a finite value, never a finite value turned into one):
//   E5M2  native: NaN -> code 0x7f|sign -> NaN, +-Inf -> 0x7c|sign -> +-Inf.
//   E4M3  NaN in a block without Inf: native NaN code 0x7f|sign -> NaN.
//         E4M3FN has no Inf, so a block holding +-Inf stores S = -d and reinterprets three codes:
//            0x7f -> +Inf,  0xff -> -Inf,  0x80 -> NaN,
//         and codes every zero (and every value that underflows to zero) of that block as 0x00, i.e.
//         the sign of zero is lost in Inf blocks only. All other codes keep their meaning, so the
//         finite values of an Inf block decode exactly as in any other block.
//
// decodeAdd(acc) computes acc[i] = acc[i] + decoded[i] with decoded[i] rounded first, exactly as
// decode followed by an addition (no fused multiply-add), so both paths of a reduction agree.
//
// Inputs are float32 only.
// All functions are thread-safe (pure) and accept count == 0 (no bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "../dtype.h"

namespace pycomm::codecs {

enum class Codec : uint8_t {
  kFp16 = 0,
  kBf16,
  kFp8E4M3,
  kFp8E5M2,
};

constexpr size_t kFp8BlockElements = 256;
constexpr size_t kFp8ScaleBytes = 4;

// "fp16", "bf16", "fp8_e4m3", "fp8_e5m2".
const char* codecName(Codec codec);
// Inverse of codecName; throws InvalidUsageError for an unknown name.
Codec codecFromName(const std::string& name);

size_t encodedBytes(Codec codec, size_t count);

// out must hold encodedBytes(codec, count) bytes; in/out/acc must not overlap.
void encode(Codec codec, const float* in, size_t count, uint8_t* out);
void decode(Codec codec, const uint8_t* in, size_t count, float* out);
void decodeAdd(Codec codec, const uint8_t* in, size_t count, float* acc);

}  // namespace pycomm::codecs
