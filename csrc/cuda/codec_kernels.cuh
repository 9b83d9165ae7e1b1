// The lossy codecs of csrc/core/codecs/block_codec.h (fp16, bf16, block-scaled fp8 E4M3 / E5M2) on
// device buffers. Same encoded format, same bits: an encoding made here decodes on the CPU and
// vice versa, and encode(x) here equals codecs::encode(x) there byte for byte, NaN/Inf rules, scale
// words and the sign of zero included (block_codec.h is the specification).
//
//   encode(codec, in, count, out)         out: codecs::encodedBytes(codec, count) bytes
//   decode(codec, in, count, out)         out[i] = decoded value of element i
//   decodeAdd(codec, in, count, acc)      acc[i] = acc[i] + decoded[i] (decoded rounded first, no FMA)
//   decodeAddEncode(codec, in, acc, count, out, stream, scale)
//       out = encode((acc + decode(in)) * scale), acc read-only; the product with `scale` is skipped
//       when scale == 1. Bit-identical to the CPU sequence
//           tmp = acc; codecs::decodeAdd(codec, in, count, tmp);
//           if (scale != 1) for (i) tmp[i] *= scale;      (compressedAllreduce's AVG scaling)
//           codecs::encode(codec, tmp, count, out);
//       This is the step of a compressed reduce-scatter that turns an incoming encoded partial sum
//       and the local fp32 contribution into the encoded partial sum to send on (a ring), or that
//       adds the last incoming contribution and encodes the owned segment for the all-gather (the
//       all-to-all scheme of csrc/core/algorithms/compressed.cc). Fused it reads E + 4 bytes and
//       writes E bytes per element (E: encoded bytes per element, 2 for fp16/bf16, ~1.016 for fp8);
//       decodeAdd into an fp32 buffer followed by encode moves E + 12 + E: the fp32 sum never goes
//       through memory. The other fused form, two encoded inputs, would need the local fp32 data to
//       be encoded first: one more pass and one more rounding.
//       `out` may be `in` itself (in place: each block/element is read completely before it is
//       written); otherwise in, acc and out must not overlap.
//
// Inputs are float32 only (device pointers, 4-byte aligned); encoded buffers have no alignment
// requirement. The kernels use 16-byte vector accesses when the float pointers are 16-byte aligned
// and the encoded ones 16-byte (fp16/bf16, relative to the element offset) or 4-byte (fp8) aligned,
// scalar accesses otherwise. fp8: one warp per 256-element block (amax by warp reduction), eight
// blocks per CTA, grid-stride; fp16/bf16: elementwise, eight elements per thread per step.
//
// Asynchronous on `stream`: no synchronization, no allocation (capturable in a CUDA graph).
// count == 0 launches nothing. Throws pycomm::InvalidUsageError for an unknown codec and
// pycomm::Error if a launch fails.
//
// Plain C++ header: includable from host code compiled by any C++17 compiler with the CUDA runtime
// headers on its include path.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/codecs/block_codec.h"

namespace pycomm::cuda {

using codecs::Codec;

void encode(Codec codec, const float* in, size_t count, uint8_t* out, cudaStream_t stream);
void decode(Codec codec, const uint8_t* in, size_t count, float* out, cudaStream_t stream);
void decodeAdd(Codec codec, const uint8_t* in, size_t count, float* acc, cudaStream_t stream);
void decodeAddEncode(Codec codec, const uint8_t* in, const float* acc, size_t count, uint8_t* out,
                     cudaStream_t stream, float scale = 1.0f);
// data[i] *= factor, one correctly rounded fp32 product with x86's NaN bits (the CPU's
// `x *= factor`): the AVG of a compressed reduce-scatter, whose sum stays in fp32.
void scale(float* data, size_t count, float factor, cudaStream_t stream);

}  // namespace pycomm::cuda
