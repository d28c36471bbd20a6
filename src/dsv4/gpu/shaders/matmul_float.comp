// The float products (kernels_scalar.cc matmul_rows_scalar, float branch): every format in the
// reference numerics, F32 and BF16 in the fast numerics. One workgroup per weight row and group
// of 8 activation rows; invocation (activation j, lane l) runs the CPU's lane chain
//   acc = fma_exact(W[r, c], x[c], acc) for c = l, l + 8, ... < cols rounded up to 8 (zero padded),
// in the same order, and tree8 of the 8 lanes is the result: the CPU's bits (the fma is exact:
// common.glsl fma_exact; the decoding is exact too; docs/numerics.md).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer Weights { uint w[]; };
layout(std430, set = 0, binding = 1) readonly buffer Scales { uint s[]; };
layout(std430, set = 0, binding = 2) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Params {
  uint rows, cols, n, format, y_stride;
} p;

shared float lanes[64];

float weight(uint r, uint c) {
  if (p.format == kF32) return uintBitsToFloat(w[r * p.cols + c]);
  if (p.format == kBF16) {
    const uint off = r * p.cols + c;
    return uintBitsToFloat(((w[off >> 1] >> ((off & 1u) * 16u)) & 0xffffu) << 16);
  }
  if (p.format == kFP8) {
    const uint off = r * p.cols + c, scale_cols = (p.cols + 127u) / 128u;
    const uint soff = (r / 128u) * scale_cols + c / 128u;
    precise float v = fp8_value(byte_in(w[off >> 2], off)) * e8m0(byte_in(s[soff >> 2], soff));
    return v;
  }
  const uint off = r * (p.cols / 2u) + c / 2u, soff = r * ((p.cols + 31u) / 32u) + c / 32u;
  const uint b = byte_in(w[off >> 2], off);
  precise float v = kFp4Values[(c & 1u) != 0u ? (b >> 4) : (b & 15u)] * e8m0(byte_in(s[soff >> 2], soff));
  return v;
}

void main() {
  const uint r = gl_WorkGroupID.x, t = gl_LocalInvocationID.x, lane = t & 7u;
  const uint i = gl_WorkGroupID.y * 8u + (t >> 3);
  const bool live = i < p.n;
  precise float acc = 0.0;
  if (live) {
    const uint padded = (p.cols + 7u) / 8u * 8u;
    for (uint c = lane; c < padded; c += 8u) {
      const bool inside = c < p.cols;
      const float wv = inside ? weight(r, c) : 0.0;
      const float xv = inside ? x[i * p.cols + c] : 0.0;
      acc = fma_exact(wv, xv, acc);
    }
  }
  lanes[t] = acc;
  barrier();
  if (live && lane == 0u)
    y[i * p.y_stride + r] = tree8(lanes[t], lanes[t + 1u], lanes[t + 2u], lanes[t + 3u], lanes[t + 4u],
                                  lanes[t + 5u], lanes[t + 6u], lanes[t + 7u]);
}
