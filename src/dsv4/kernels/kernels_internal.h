// Helpers here are `static inline` on purpose: each translation unit (scalar, AVX2, AVX-512)
// gets its own copy compiled with its own flags, never a linker-merged one.
//
// Shared between the kernel front end (kernels.cc), the dispatcher (dispatch.cc), the per
// instruction-set implementations and the tests. Not part of the model-facing interface.
//
// The canonical accumulation orders (docs/kernels.md) are defined by the scalar code in
// kernels_scalar.cc; every SIMD path reproduces them bit for bit.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "dsv4/kernels/formats.h"
#include "dsv4/kernels/kernels.h"

namespace dsv4::kernels::detail {

// a * b + c rounded once, as the FMA instructions of the SIMD paths compute it, without relying
// on the C library: MinGW-w64's fmaf is not correctly rounded. The product of two floats is
// exact in double; the double sum is made round-to-odd (TwoSum gives its exact error), and a
// round-to-odd value with 29 spare bits rounds to float exactly as the exact sum would.
static inline float exact_fma(float a, float b, float c) {
  const double p = double(a) * double(b), q = double(c);
  double s = p + q;
  if (s - s != 0) return static_cast<float>(s);  // inf or NaN: nothing to correct
  const double bv = s - p;
  const double e = (p - (s - bv)) + (q - bv);
  uint64_t bits;
  std::memcpy(&bits, &s, 8);
  if (e != 0 && (bits & 1) == 0) {
    bits += ((e > 0) == (s > 0)) ? 1 : uint64_t(-1);  // the odd neighbour on the exact side
    std::memcpy(&s, &bits, 8);
  }
  return static_cast<float>(s);
}

inline constexpr int kLanes = 8;        // float accumulation lanes: lane = column mod 8
inline constexpr int kQBlock = 32;      // fast-mode activation quantization block
inline constexpr int kSpan = 64;        // activation layout span: 32 even columns, then 32 odd
inline constexpr int kFp8Block = 128;   // FP8 scale block (rows and columns)

// The fixed reduction of the 8 lane accumulators: what a 256-bit horizontal sum computes
// (upper half + lower half, then +2, then +1).
static inline float tree8(const float* a) {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

static inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Position of column c inside its 64-column span in the quantized activation layout.
static inline int64_t span_pos(int64_t c) {
  int64_t s = c & ~int64_t{63}, j = c & 63;
  return s + ((j & 1) ? 32 + (j >> 1) : (j >> 1));
}

// E8M0 as float, and half of it (FP4 fast mode uses doubled E2M1 values {0,1,2,3,4,6,8,12}).
static inline float e8m0_half(uint8_t e) { return e8m0_to_f32(e) * 0.5f; }  // exact, 2^-128 is a denormal

// Fast-mode activations are 16-bit integers Q per 32-column block, |Q| <= kQMax = 127 * 256,
// kept as two int8 planes: Q = 256 * hi + lo with hi in [-127, 127] and lo in [-128, 127].
inline constexpr int32_t kQMax = 32512;

// Quantization of one 32-column activation block in fast mode (definition; SIMD must match):
//   amax = max |x|  (as the integer maximum of the magnitude bits: exact, order-free)
//   not finite -> d = NaN, Q = 0;  d = amax / 32512;  d == 0 -> Q = 0;
//   otherwise Q = clamp(round_half_even(x / d), -32512, 32512).
static inline void quantize_block_ref(const float* x, int len, int32_t* q, float* d) {
  uint32_t amax_bits = 0;
  for (int k = 0; k < len; ++k) {
    uint32_t b;
    std::memcpy(&b, &x[k], 4);
    b &= 0x7fffffffu;
    if (b > amax_bits) amax_bits = b;
  }
  float amax;
  std::memcpy(&amax, &amax_bits, 4);
  if (amax_bits >= 0x7f800000u) {
    *d = std::numeric_limits<float>::quiet_NaN();
    for (int k = 0; k < len; ++k) q[k] = 0;
    return;
  }
  const float lim = static_cast<float>(kQMax);
  float dd = amax / lim;
  *d = dd;
  for (int k = 0; k < len; ++k) {
    if (dd == 0.0f) {
      q[k] = 0;
      continue;
    }
    float v = std::nearbyint(x[k] / dd);
    v = v > lim ? lim : (v < -lim ? -lim : v);
    q[k] = static_cast<int32_t>(v);
  }
}

// Fast FP8 weights: integers per (row, 32-column block), so that the products with the 16-bit
// activations are exact int32 sums, as for FP4 (definition; SIMD must match; docs/kernels.md):
//   u(code) = 2^(max(e, 8) - 8), e the E4M3 exponent field: |fp8(code)| < 4 u(code), a bound
//     from the exponent alone that fits a byte (1..128);
//   B = the sum of u over the block's 32 columns (columns past the row's end count as code 0);
//   k = min(9, 14 - ceil(log2 B)), so B 2^k <= 2^14;
//   w = round_half_even(fp8(code) * 2^k), the NaN codes 0x7f / 0xff counting as +-480.
// Then |w| <= 30720 (int16) and sum |w| <= 15/16 * 4 B 2^k + 16 <= 61456, so with |Q| <= 32512
// every block sum stays below 2^31. The block's scale is e8m0(s) * 2^-k, exact. k = 9 makes
// every E4M3 value an integer; smaller k round only the weights below 2^(e_max - 7 ...) of the
// block's largest (docs/kernels.md has the error analysis).
static inline int fp8_fast_ubyte(uint8_t code) {
  const int e = (code >> 3) & 15;
  return 1 << ((e > 8 ? e : 8) - 8);
}

static inline int fp8_fast_shift(const uint8_t* codes, int len) {
  int b = 32 - len;  // missing columns: code 0, u = 1
  for (int c = 0; c < len; ++c) b += fp8_fast_ubyte(codes[c]);
  int ceil_log2 = 0;
  while ((1 << ceil_log2) < b) ++ceil_log2;
  const int k = 14 - ceil_log2;
  return k < 9 ? k : 9;
}

static inline int32_t fp8_fast_weight(uint8_t code, int k) {
  float v = (code & 0x7f) == 0x7f ? ((code & 0x80) ? -480.0f : 480.0f) : fp8_e4m3_to_f32(code);
  return static_cast<int32_t>(std::nearbyint(std::ldexp(v, k)));  // exact product, then round
}

// 2^-k for the block scale (exact).
static inline float pow2_neg(int k) {
  const uint32_t bits = static_cast<uint32_t>(127 - k) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The two planes of Q: hi = floor((Q + 128) / 256), lo = Q - 256 * hi.
static inline int8_t q_hi(int32_t q) { return static_cast<int8_t>((q + 128) >> 8); }
static inline int8_t q_lo(int32_t q) { return static_cast<int8_t>(q - 256 * ((q + 128) >> 8)); }

// The batched FP4 kernel's activation layout (QuantizedInput::qg): Q as int16, activation rows
// in groups of 8; per group and pair of columns (2p, 2p+1) the 8 rows' two values side by side
// (32 bytes), so a register tile reads one contiguous stream however far apart the rows are.
inline constexpr int kActGroup = 8;

static inline int64_t qg_elems(int64_t n, int64_t padded_cols) {
  return ceil_div(n, kActGroup) * kActGroup * padded_cols;
}

// Activation row i's first column pair in the qg layout; its column pair p is 2 * kActGroup * p
// further on.
static inline int16_t* qg_row(int16_t* qg, int64_t padded_cols, int64_t i) {
  return qg + (i / kActGroup) * kActGroup * padded_cols + (i % kActGroup) * 2;
}

// Activation rows QuantizedInput::q16 holds (the FP8 kernels for a few rows read it).
constexpr int64_t kQ16Rows = 8;

// Position of column c in QuantizedInput::q16: per 16 columns [0-3, 8-11, 4-7, 12-15].
static inline int64_t q16_pos(int64_t c) {
  const int64_t o = c & 15;
  return (c & ~int64_t{15}) + (o < 4 || o >= 12 ? o : (o < 8 ? o + 4 : o - 4));
}

// Row i of the batched layout set to zero (the scalar quantizer clears each row it writes).
static inline void zero_qg_row(int64_t padded_cols, int64_t i, int16_t* qg) {
  int16_t* base = qg_row(qg, padded_cols, i);
  for (int64_t p = 0; p < padded_cols / 2; ++p) std::memset(base + p * 2 * kActGroup, 0, 4);
}

// Output of quantize_rows: whole-array base pointers (see QuantizedInput).
struct QuantPlanes {
  int8_t* q;
  int8_t* ql;
  int16_t* qg;
  float* d;
  int32_t* qsum12;
};

// Raw pointers only: the SIMD translation units must not instantiate std::vector members.
struct MatmulJob {
  Matrix w;
  const float* x = nullptr;     // [n, cols]
  const int8_t* q = nullptr;    // [n, padded_cols] high plane (fast FP4 only)
  const int8_t* ql = nullptr;   // [n, padded_cols] low plane
  const int16_t* qg = nullptr;  // Q, batched layout (qg_elems)
  const int16_t* q16 = nullptr; // [n, padded_cols] Q, FP8 matrix-vector order (n <= kQ16Rows only)
  const float* d = nullptr;     // [n, ceil(cols/32)]
  const int32_t* qsum12 = nullptr;  // [n, ceil(cols/32)] 12 * sum of Q per block
  int64_t n = 0;
  int64_t padded_cols = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
  Numerics numerics = Numerics::kReference;
};

// Row i of a job's activations as a one-row job (the quantized planes, their block scales and
// the output row; the batched layouts qg and q16 are left out).
inline MatmulJob row_job(const MatmulJob& job, int64_t i) {
  const int64_t nb = ceil_div(job.w.cols, kQBlock);
  MatmulJob one = job;
  one.n = 1;
  one.x = job.x ? job.x + i * job.w.cols : nullptr;
  one.q = job.q ? job.q + i * job.padded_cols : nullptr;
  one.ql = job.ql ? job.ql + i * job.padded_cols : nullptr;
  one.qg = nullptr;
  one.q16 = nullptr;
  one.d = job.d ? job.d + i * nb : nullptr;
  one.qsum12 = job.qsum12 ? job.qsum12 + i * nb : nullptr;
  one.y = job.y + i * job.y_stride;
  return one;
}

// One instruction-set path. Filled once; never changes afterwards.
struct Table {
  const char* name;
  // Computes y[i, r] for all i < n and r in [r0, r1) completely (no cross-call reduction).
  void (*matmul_rows)(const MatmulJob& job, int64_t r0, int64_t r1);
  // Quantizes activation rows [i0, i1) of x [*, cols] into the planes q, ql [*, padded_cols],
  // Q in the batched layout qg, d and qsum12 [*, ceil(cols/32)] (whole-array base pointers).
  void (*quantize_rows)(const float* x, int64_t cols, int64_t padded_cols, int64_t i0, int64_t i1,
                        const QuantPlanes& out);
  float (*dot)(const float* a, const float* b, int64_t n);
  void (*axpy)(float a, const float* x, float* y, int64_t n);
  void (*dot_many)(const float* q, int64_t q_stride, int64_t nq, const float* r, int64_t n, float* out);
  void (*axpy_many)(const float* p, int64_t p_stride, int64_t nh, const float* const* rows, int64_t nrows,
                    int64_t n, float* o, int64_t o_stride);
  // Machine-limit probes for the benchmarks: `iters` rounds of independent FMA chains
  // (returns the FLOP count done), and a vectorized read of [p, p + bytes) (returns a checksum).
  double (*fma_probe)(int64_t iters);
  double (*read_probe)(const void* p, int64_t bytes);
  // What this table does differently from others of the same name (for the benchmarks'
  // reports), "" if nothing: one path may have a variant tuned for some cores.
  const char* tuning;
};

const Table& scalar_table();
#if defined(__x86_64__)
const Table& avx2_table();    // kernels_avx2.cc (the x86 files are built only for x86-64)
const Table& avxvnni_table();  // kernels_avxvnni.cc
// kernels_avx512.cc: one table per core family, with the same name and bits; they differ in
// which kernel takes a product of few activation rows (measured per core). kIntel is also
// the one for cores not known otherwise.
enum class Avx512Core { kIntel, kZen4, kZen5 };
const Table& avx512_table(Avx512Core core);
#endif
#if defined(__aarch64__)
const Table& neon_table();    // kernels_neon.cc (built only for aarch64)
#endif
bool cpu_supports(const std::string& path);

// The path chosen at start-up (DSV4_KERNELS or CPUID). Thread-safe static init.
const Table& active_table();
// A path by name; throws Error if unknown, not compiled in, or not supported by this CPU.
const Table& table_by_name(const std::string& name);

// Columns [c0, c0 + len) of row r as floats (decode_row is the whole row).
void decode_cols(const Matrix& w, int64_t r, int64_t c0, int64_t len, float* out);

// The front end with an explicit path (tests run every path through this).
void matmul_with(const Table& t, const Matrix& w, const QuantizedInput& in, float* y,
                 Numerics numerics, ThreadPool* pool, int64_t y_stride);
void matmul_batch_with(const Table& t, const MatmulTask* tasks, int64_t count, Numerics numerics,
                       ThreadPool* pool);
void prepare_input_with(const Table& t, const float* x, int64_t n, int64_t cols, Numerics numerics,
                        QuantizedInput* in, ThreadPool* pool);

}  // namespace dsv4::kernels::detail
