// ops::rms_norm (src/dsv4/model/ops.h) per row: out = weight * (x * scale) with
// scale = 1 / sqrt(sum / n + eps), sum = x0*x0 + x1*x1 + ... added in index order. The sum
// follows the CPU's order exactly (one invocation, `precise`: each product rounded, then
// added); the division and square root are Vulkan's (not required to be correctly rounded:
// docs/numerics.md), so the result is within a few ulps of the CPU's, not bit-identical.
// One workgroup per row.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Wt { float weight[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Out { float o[]; };
layout(push_constant) uniform Params {
  uint n, has_weight;
  float eps;
} p;

shared float scale_shared;

void main() {
  const uint row = gl_WorkGroupID.x, t = gl_LocalInvocationID.x, base = row * p.n;
  if (t == 0u) {
    precise float sum = 0.0;
    for (uint i = 0u; i < p.n; ++i) {
      precise float sq = x[base + i] * x[base + i];
      sum = sum + sq;
    }
    precise float mean = sum / float(p.n);
    precise float scale = 1.0 / sqrt(mean + p.eps);
    scale_shared = scale;
  }
  barrier();
  const float scale = scale_shared;
  for (uint i = t; i < p.n; i += 64u) {
    precise float v = x[base + i] * scale;
    if (p.has_weight != 0u) v = weight[i] * v;
    o[base + i] = v;
  }
}
