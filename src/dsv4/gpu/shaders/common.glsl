// Shared by the GPU tier's compute shaders: the checkpoint formats decoded exactly, as
// src/dsv4/kernels/formats.h does on the CPU (every value below is built from its bits, no
// transcendental function is involved), and the CPU's fixed float reductions.
//
// Weights and scales arrive as the checkpoint's bytes in 32-bit words (little-endian), so no
// 8- or 16-bit storage feature is needed.

const uint kF32 = 0u;
const uint kBF16 = 1u;
const uint kFP8 = 2u;
const uint kFP4 = 3u;

float nan_value() { return uintBitsToFloat(0x7fc00000u); }

// The byte at `off` of an array of words.
uint byte_in(uint word, uint off) { return (word >> ((off & 3u) * 8u)) & 255u; }

// E8M0: 2^(e - 127); 255 is NaN; 0 is the float32 subnormal 2^-127 (a device that flushes
// subnormals reads it as 0: docs/numerics.md).
float e8m0(uint e) {
  if (e == 255u) return nan_value();
  if (e == 0u) return uintBitsToFloat(0x00400000u);
  return uintBitsToFloat(e << 23);
}

// 2^-k for 0 <= k < 127 (exact).
float pow2_neg(int k) { return uintBitsToFloat(uint(127 - k) << 23); }
float pow2(int k) { return uintBitsToFloat(uint(127 + k) << 23); }

// E4M3 (e4m3fn): bias 7, subnormals man/8 * 2^-6, 0x7f / 0xff NaN.
float fp8_value(uint code) {
  const uint e = (code >> 3) & 15u, m = code & 7u;
  if (e == 15u && m == 7u) return nan_value();
  float mag;
  if (e == 0u) {
    mag = float(m) * uintBitsToFloat(uint(127 - 9) << 23);  // m * 2^-9, exact
  } else {
    mag = uintBitsToFloat(((e + 120u) << 23) | (m << 20));  // (1 + m/8) * 2^(e-7)
  }
  return (code & 128u) != 0u ? -mag : mag;
}

const float kFp4Values[16] = float[16](0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0);
// Doubled E2M1 values: integers, so the fast numerics' block sums are exact.
const int kFp4Doubled[16] = int[16](0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);

// kernels_internal.h: fp8_fast_ubyte / fp8_fast_shift / fp8_fast_weight.
int fp8_fast_ubyte(uint code) {
  const int e = int((code >> 3) & 15u);
  return 1 << (max(e, 8) - 8);
}
int fp8_fast_shift_of_sum(int b) {
  int ceil_log2 = 0;
  while ((1 << ceil_log2) < b) ++ceil_log2;
  return min(14 - ceil_log2, 9);
}
int fp8_fast_weight(uint code, int k) {
  precise float v = (code & 127u) == 127u ? ((code & 128u) != 0u ? -480.0 : 480.0) : fp8_value(code);
  precise float scaled = v * pow2(k);  // exact: a power-of-two scaling of a normal value
  return int(roundEven(scaled));
}

// kernels_internal.h tree8: what a 256-bit horizontal sum computes.
float tree8(float a0, float a1, float a2, float a3, float a4, float a5, float a6, float a7) {
  precise float r = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7));
  return r;
}

// fma(a, b, c) with one rounding, on every device. Vulkan lets fma() be a multiply and an add
// (two roundings: its precision is "inherited from OpFMul followed by OpFAdd", and lavapipe
// does exactly that), so the CPU's fused chains are reproduced in float64: a * b is exact
// there (48 bits), TwoSum gives s + e = a * b + c exactly, s is moved to the odd neighbour on
// the side of e when inexact (round to odd: 53 >= 24 + 2 bits, so the final conversion, which
// Vulkan requires correctly rounded, rounds the exact value once).
float fma_exact(float a, float b, float c) {
  precise double p = double(a) * double(b);
  precise double s = p + double(c);
  precise double bb = s - p;
  precise double e = (p - (s - bb)) + (double(c) - bb);
  if (e != 0.0) {
    uvec2 bits = unpackDouble2x32(s);
    if ((bits.x & 1u) == 0u) {
      if ((e > 0.0) == (s > 0.0)) {
        bits.x += 1u;
        if (bits.x == 0u) bits.y += 1u;
      } else {
        if (bits.x == 0u) bits.y -= 1u;
        bits.x -= 1u;
      }
      s = packDouble2x32(bits);
    }
  }
  return float(s);
}
