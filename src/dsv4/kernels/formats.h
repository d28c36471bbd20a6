// The checkpoint's number formats, decoded exactly (every conversion here is exact in float32).
//   BF16     upper half of an IEEE float32.
//   FP8 E4M3 (e4m3fn) sign, 4-bit exponent (bias 7), 3-bit mantissa; 0x7F/0xFF are NaN; max 448.
//   E8M0     one unsigned byte e meaning 2^(e-127); 255 is NaN.
//   FP4 E2M1 codes 0..7 = 0, .5, 1, 1.5, 2, 3, 4, 6; codes 8..15 are their negatives.
//            Two per byte: low nibble = even element, high nibble = odd element.
// The functions are `static inline`: the SIMD kernel translation units are compiled with wider
// instruction sets, and a linker-merged inline copy from one of them must never end up in code
// that runs on a CPU without those instructions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace dsv4 {

static inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
static inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

static inline float fp8_e4m3_to_f32(uint8_t code) {
  uint32_t sign = code >> 7, exp = (code >> 3) & 0xF, man = code & 7;
  float mag;
  if (exp == 0xF && man == 7) return std::numeric_limits<float>::quiet_NaN();
  if (exp == 0) {
    mag = std::ldexp(static_cast<float>(man), -9);  // subnormal: man/8 * 2^-6
  } else {
    mag = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, static_cast<int>(exp) - 7);
  }
  return sign ? -mag : mag;
}

static inline float e8m0_to_f32(uint8_t e) {
  if (e == 255) return std::numeric_limits<float>::quiet_NaN();
  // 2^(e-127): e = 0 gives the subnormal 2^-127, which float32 represents exactly.
  if (e == 0) return std::ldexp(1.0f, -127);
  uint32_t bits = uint32_t{e} << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline constexpr float kFp4Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static inline float fp4_e2m1_to_f32(uint8_t code) { return kFp4Values[code & 15]; }

}  // namespace dsv4
