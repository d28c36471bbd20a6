// The fast numerics' FP4 and FP8 products (kernels_scalar.cc matmul_rows_scalar, integer
// branch). Activations arrive quantized (Q, 16-bit integers per 32-column block, and the block
// scales d, as kernels::prepare_input makes them). Per weight row and 32-column block b:
//   FP4  wq = doubled E2M1 value, sc = e8m0 / 2;
//   FP8  k = fp8_fast_shift(block), wq = round_half_even(fp8 * 2^k), sc = e8m0 * 2^-k;
//   isum = sum of wq * Q over the block (exact int32: any order gives the same integer),
// then one float chain per output in block order: acc = fma_exact(float(isum), d[b] * sc, acc).
// One workgroup per weight row and group of 8 activation rows: invocation t computes block
// b0 + t's integer sums for every activation row, then invocation j runs activation j's chain
// over those 64 blocks. Same bits as the CPU: the fma is exact (common.glsl fma_exact).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer Weights { uint w[]; };
layout(std430, set = 0, binding = 1) readonly buffer Scales { uint s[]; };
layout(std430, set = 0, binding = 2) readonly buffer Q { int q[]; };       // [n, blocks * 32], zero padded
layout(std430, set = 0, binding = 3) readonly buffer D { float d[]; };     // [n, blocks]
layout(std430, set = 0, binding = 4) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Params {
  uint rows, cols, n, format, y_stride;
} p;

shared int isum[8][64];
shared float sc[64];

void main() {
  const uint r = gl_WorkGroupID.x, t = gl_LocalInvocationID.x;
  const uint base = gl_WorkGroupID.y * 8u;
  const uint nh = min(8u, p.n - base);
  const uint nb = (p.cols + 31u) / 32u, qcols = nb * 32u;
  precise float acc = 0.0;
  for (uint b0 = 0u; b0 < nb; b0 += 64u) {
    const uint b = b0 + t;
    if (b < nb) {
      const uint len = min(32u, p.cols - b * 32u);
      int wq[32];
      float scale;
      if (p.format == kFP4) {
        for (uint k = 0u; k < len; ++k) {
          const uint c = b * 32u + k, off = r * (p.cols / 2u) + c / 2u;
          const uint byte = byte_in(w[off >> 2], off);
          wq[k] = kFp4Doubled[(c & 1u) != 0u ? (byte >> 4) : (byte & 15u)];
        }
        const uint soff = r * nb + b;
        precise float half_scale = e8m0(byte_in(s[soff >> 2], soff)) * 0.5;
        scale = half_scale;
      } else {
        int usum = int(32u - len);  // columns past the row's end count as code 0
        for (uint k = 0u; k < len; ++k) {
          const uint off = r * p.cols + b * 32u + k;
          usum += fp8_fast_ubyte(byte_in(w[off >> 2], off));
        }
        const int shift = fp8_fast_shift_of_sum(usum);
        for (uint k = 0u; k < len; ++k) {
          const uint off = r * p.cols + b * 32u + k;
          wq[k] = fp8_fast_weight(byte_in(w[off >> 2], off), shift);
        }
        const uint soff = (r / 128u) * ((p.cols + 127u) / 128u) + (b * 32u) / 128u;
        precise float block_scale = e8m0(byte_in(s[soff >> 2], soff)) * pow2_neg(shift);
        scale = block_scale;
      }
      for (uint j = 0u; j < nh; ++j) {
        int sum = 0;
        const uint qo = (base + j) * qcols + b * 32u;
        for (uint k = 0u; k < len; ++k) sum += wq[k] * q[qo + k];
        isum[j][t] = sum;
      }
      sc[t] = scale;
    }
    barrier();
    if (t < nh) {
      const uint count = min(64u, nb - b0);
      for (uint k = 0u; k < count; ++k) {
        precise float m = d[(base + t) * nb + b0 + k] * sc[k];
        acc = fma_exact(float(isum[t][k]), m, acc);
      }
    }
    barrier();
  }
  if (t < nh) y[(base + t) * p.y_stride + r] = acc;
}
