// The one compute interface the model uses. Weights stay in their checkpoint formats:
//
//   kF32   float32 [rows, cols]
//   kBF16  bfloat16 [rows, cols]
//   kFP8   E4M3 bytes [rows, cols] + E8M0 scales [ceil(rows/128), ceil(cols/128)]
//   kFP4   E2M1 nibbles [rows, cols/2] (low nibble = even column) + E8M0 scales [rows, ceil(cols/32)]
//
// matmul computes y[i, r] = sum_c W[r, c] * x[i, c] for i < n with float32 accumulation.
// Numerics::kReference multiplies float32 activations by the exactly decoded weights;
// Numerics::kFast is cheaper (see docs/kernels.md for the exact definition of each mode):
//   FP4  activations quantized to 16-bit integers per block of 32 with a float scale (kept as
//        two int8 planes), exact integer block sums, float32 accumulation of the scaled block
//        sums;
//   FP8  the same 16-bit activations; weights as integers per (row, 32-column block) at a
//        power-of-two shift chosen so the block sums cannot overflow, exact integer block sums,
//        the same float32 chain;
//   BF16/F32  the same as kReference.
//
// Every instruction-set path gives the same bits as the scalar reference for a given numerics
// mode (the accumulation order is fixed, docs/kernels.md), and the result does not depend on the
// thread count: each output element is computed entirely by one task.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsv4 {
class ThreadPool;
}

namespace dsv4::kernels {

enum class WeightFormat : uint8_t { kF32, kBF16, kFP8, kFP4 };
enum class Numerics : uint8_t { kReference, kFast };

const char* format_name(WeightFormat f);
const char* numerics_name(Numerics n);

struct Matrix {
  WeightFormat format = WeightFormat::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  const uint8_t* scales = nullptr;  // FP8 / FP4 only

  int64_t data_bytes() const;
  int64_t scale_bytes() const;
};

// Decodes row r of W into out[cols] as float32 (exact). For tests and small lookups.
void decode_row(const Matrix& w, int64_t r, float* out);

struct QuantizedInput;

// y[n, w.rows] = x[n, w.cols] * W^T. y rows are y_stride floats apart (>= w.rows). x is
// prepared for w into `scratch` (quantized for fast FP4 and FP8); a caller that keeps one, grown once
// to its largest shape (quantized_input_bytes), makes the call allocate nothing. nullptr: a
// temporary one (allocates per call in fast mode: tests and one-off products).
void matmul(const Matrix& w, const float* x, int64_t n, float* y, Numerics numerics,
            ThreadPool* pool, int64_t y_stride = 0, QuantizedInput* scratch = nullptr);

// Activations prepared once for several matrices that share the same input (wq_a and wkv,
// expert w1 and w3, ...). In fast mode the FP4 and FP8 kernels need x quantized per block of 32; doing
// it once per input instead of once per matrix saves that pass. The float activations are
// borrowed, not copied: `x` must stay alive and unchanged while the QuantizedInput is used.
struct QuantizedInput {
  const float* x = nullptr;  // [n, cols], borrowed
  int64_t n = 0;
  int64_t cols = 0;
  int64_t padded_cols = 0;      // cols rounded up to 64
  // x ~ Q * d with Q = 256 * q + ql a 16-bit integer (|Q| <= 32512), per 32-column block.
  std::vector<int8_t> q;        // [n, padded_cols] high int8 plane, kernel order (docs/kernels.md)
  std::vector<int8_t> ql;       // [n, padded_cols] low int8 plane, same order
  // Q as int16 in the batched kernel's layout: per group of 8 activation rows, per pair of
  // columns (natural order), the 8 rows' two values side by side (docs/kernels.md).
  std::vector<int16_t> qg;      // [ceil(n/8), padded_cols/2, 8, 2]
  // Q of each row as int16 in the FP8 matrix-vector kernel's order (per 16 columns
  // 0-3, 8-11, 4-7, 12-15: the order its int16 packs leave the weights in); filled and read
  // when n <= 8 (a decode pass of up to 8 sessions).
  std::vector<int16_t> q16;     // [8, padded_cols]
  std::vector<float> d;         // [n, ceil(cols/32)] block scales
  std::vector<int32_t> qsum12;  // [n, ceil(cols/32)] 12 * (sum of Q in the block), for the kernels
  bool quantized = false;
};

// Whether the product with `w` in `numerics` reads the quantized activations (fast FP4 and FP8);
// preparing an input with Numerics::kFast is wasted work for any other matrix.
inline bool uses_quantized_input(const Matrix& w, Numerics numerics) {
  return numerics == Numerics::kFast && (w.format == WeightFormat::kFP4 || w.format == WeightFormat::kFP8);
}

// Bytes a QuantizedInput prepared with Numerics::kFast holds for [n, cols] activations (what
// a caller that keeps one for reuse must budget; preparing a smaller input reuses it).
uint64_t quantized_input_bytes(int64_t n, int64_t cols);

// Prepares x for matmul(w, in, ...). Quantization only happens for Numerics::kFast (it is
// what every later fast FP4 product uses); for kReference this just records x.
void prepare_input(const float* x, int64_t n, int64_t cols, Numerics numerics, QuantizedInput* in,
                   ThreadPool* pool = nullptr);

// The same product as matmul(w, in.x, in.n, ...), reusing the prepared activations.
// `numerics` must match the one given to prepare_input (fast needs the quantized form).
void matmul(const Matrix& w, const QuantizedInput& in, float* y, Numerics numerics,
            ThreadPool* pool, int64_t y_stride = 0);

// Several independent products in one pass over the thread pool: each task is
// y = in.x * W^T exactly as matmul(w, in, y, numerics, pool, y_stride) computes it (same bits),
// but all tasks' row ranges share one parallel_for, so the pool wakes once instead of once per
// matrix (~10 us each on this machine; a decode token has ~260 expert matrices). Use it for an
// expert's w1 and w3, or for all routed experts of a layer. Outputs must not overlap.
struct MatmulTask {
  const Matrix* w = nullptr;
  const QuantizedInput* in = nullptr;
  float* y = nullptr;
  int64_t y_stride = 0;  // 0 = w->rows
};
void matmul_batch(const MatmulTask* tasks, int64_t count, Numerics numerics, ThreadPool* pool);

// Dense float products for attention and the indexer (same determinism contract): several
// heads against one kv row or key at a time. Each result has exactly the bits of one canonical
// single product (kernels_scalar.cc: dot = 32 lanes then a fixed tree, axpy = one FMA per
// element); the SIMD paths share the loads and the horizontal sums between them.
//   dot_many:  out[h] = dot(q + h * q_stride, r, n) for h < nq.
//   axpy_many: for each row j < nrows in order and each h < nh:
//              o[h * o_stride + c] = fma(p[h * p_stride + j], rows[j][c], o[h * o_stride + c]), c < n.
void dot_many(const float* q, int64_t q_stride, int64_t nq, const float* r, int64_t n, float* out);
void axpy_many(const float* p, int64_t p_stride, int64_t nh, const float* const* rows, int64_t nrows, int64_t n,
               float* o, int64_t o_stride);

// The instruction-set path in use ("scalar", "avx2", "avxvnni", "avx512", "neon"), chosen once
// at start-up. DSV4_KERNELS=scalar|avx2|avxvnni|avx512|neon forces one (an unavailable choice is
// an error).
std::string active_path();
// What the path in use does differently on this core (a variant tuned for it), "" if nothing.
std::string active_tuning();

// Paths this binary has and this CPU can run, best last (always starts with "scalar").
std::vector<std::string> runnable_paths();

}  // namespace dsv4::kernels
