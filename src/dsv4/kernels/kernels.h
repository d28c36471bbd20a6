// The one compute interface the model uses. Weights stay in their checkpoint formats:
//
//   kF32   float32 [rows, cols]
//   kBF16  bfloat16 [rows, cols]
//   kFP8   E4M3 bytes [rows, cols] + E8M0 scales [ceil(rows/128), ceil(cols/128)]
//   kFP4   E2M1 nibbles [rows, cols/2] (low nibble = even column) + E8M0 scales [rows, ceil(cols/32)]
//
// matmul computes y[i, r] = sum_c W[r, c] * x[i, c] for i < n with float32 accumulation.
// Numerics::kReference multiplies float32 activations by the exactly decoded weights;
// Numerics::kFast quantizes activations per block first (see kernels docs).
//
// Every instruction-set path must give the same bits as the scalar reference for a given
// numerics mode, and the result must not depend on the thread count.
#pragma once

#include <cstdint>
#include <string>

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

// y[n, w.rows] = x[n, w.cols] * W^T. y rows are y_stride floats apart (>= w.rows).
void matmul(const Matrix& w, const float* x, int64_t n, float* y, Numerics numerics,
            ThreadPool* pool, int64_t y_stride = 0);

// Dense float helpers used by attention and the compressors (same determinism contract).
float dot(const float* a, const float* b, int64_t n);
void axpy(float a, const float* x, float* y, int64_t n);  // y += a * x

// The instruction-set path in use ("scalar", "avx2", "avx512"), chosen once at start-up.
// DSV4_KERNELS=scalar|avx2|avx512 forces one (an unavailable choice is an error).
std::string active_path();

}  // namespace dsv4::kernels
