// Checks on the raw bytes of weights and activations: encodings that decode to NaN or
// infinity, and scales that no trained weight has. A corrupt or hostile file would otherwise
// turn every logit into NaN without an error. Each finder returns the index of the first bad
// element, or -1, and costs a fraction of reading the bytes: full blocks of constant length
// with no exit are vectorized, and only a block with a bad value is searched one by one.
#pragma once

#include <bit>
#include <cstdint>
#include <string>

namespace dsv4 {

// The largest E8M0 scale code accepted: 127 + 32, a scale of 2^32. Block scales of trained
// weights are the block's largest magnitude over the format's largest value (6 for FP4,
// 448 for FP8), so real ones lie far below 2^0; a scale of 2^32 already means weights of
// ~2.6e10. Larger codes (0xFE is 2^127, which times an FP4 6 is already infinite in
// float32; 0xFF is NaN) come only from corruption and would make the products non-finite,
// so they are refused where the bytes enter the engine.
inline constexpr uint8_t kMaxScaleCode = 127 + 32;

template <typename T, typename Bad>
int64_t first_bad(const T* v, int64_t n, Bad bad) {
  constexpr int64_t kBlock = 4096;
  auto search = [&](int64_t begin, int64_t end) -> int64_t {
    for (int64_t i = begin; i < end; ++i)
      if (bad(v[i])) return i;
    return -1;
  };
  int64_t b = 0;
  for (; b + kBlock <= n; b += kBlock) {
    unsigned any = 0;
    for (int64_t i = 0; i < kBlock; ++i) any |= bad(v[b + i]) ? 1u : 0u;
    if (any) return search(b, b + kBlock);
  }
  return search(b, n);
}

// FP8 E4M3 (the "fn" variant): S.1111.111 is NaN; there is no infinity.
inline int64_t find_nan_e4m3(const uint8_t* codes, int64_t n) {
  return first_bad(codes, n, [](uint8_t c) { return (c & 0x7F) == 0x7F; });
}
// E8M0 scales above kMaxScaleCode (NaN, 0xFF, included).
inline int64_t find_bad_e8m0(const uint8_t* codes, int64_t n) {
  return first_bad(codes, n, [](uint8_t c) { return c > kMaxScaleCode; });
}
// BF16 / F32 with an all-ones exponent: infinity or NaN.
inline int64_t find_nonfinite_bf16(const uint16_t* v, int64_t n) {
  return first_bad(v, n, [](uint16_t x) { return (x & 0x7F80) == 0x7F80; });
}
inline int64_t find_nonfinite_f32(const float* v, int64_t n) {
  return first_bad(v, n, [](float x) { return (std::bit_cast<uint32_t>(x) & 0x7F800000u) == 0x7F800000u; });
}

// "0xFE (2^127)", "0xFF (NaN)": an E8M0 code for messages.
std::string describe_e8m0(uint8_t code);

}  // namespace dsv4
