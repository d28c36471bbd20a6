// Kernels: the scalar reference against a double-precision matmul, every runnable SIMD path
// against the scalar reference bit for bit (both numerics modes, ragged shapes, odd batch sizes,
// 1 and 2 threads), fast mode against reference within its stated bound, and the decoders
// against the fixture's exact dequantisation.
#include <gtest/gtest.h>


#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsv4/io/checkpoint.h"
#include "dsv4/io/safetensors.h"
#include "dsv4/kernels/formats.h"
#include "dsv4/kernels/kernels.h"
#include "dsv4/platform/platform.h"
#include "dsv4/kernels/kernels_internal.h"
#include "dsv4/util/error.h"
#include "dsv4/util/thread_pool.h"
#include "test_util.h"

namespace dsv4::kernels {
namespace {

using detail::ceil_div;

// A weight matrix with its own storage.
struct TestMatrix {
  Matrix m;
  std::vector<uint8_t> data;
  std::vector<uint8_t> scales;
};

// kNormal: random codes (FP8: every finite code equally likely); kAll: every code (incl. FP8
// NaN) and the widest scales; kGaussian (FP8): Gaussian weights quantized as the official
// checkpoints are (each 128 x 128 block's largest magnitude mapped near 448).
enum class Codes { kNormal, kAll, kGaussian };

// The E4M3 code nearest to v (|v| <= 448; ties to the smaller magnitude): positive codes
// 0..126 are ordered by value.
uint8_t fp8_encode(float v) {
  const float a = std::fabs(v);
  int lo = 0, hi = 126;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (fp8_e4m3_to_f32(static_cast<uint8_t>(mid)) <= a) lo = mid; else hi = mid - 1;
  }
  if (lo < 126 && fp8_e4m3_to_f32(static_cast<uint8_t>(lo + 1)) - a < a - fp8_e4m3_to_f32(static_cast<uint8_t>(lo))) ++lo;
  return static_cast<uint8_t>(lo | (v < 0 ? 0x80 : 0));
}

TestMatrix make_matrix(WeightFormat f, int64_t rows, int64_t cols, std::mt19937& rng, Codes codes,
                       int scale_lo = 118, int scale_hi = 126) {
  TestMatrix t;
  t.m.format = f;
  t.m.rows = rows;
  t.m.cols = cols;
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  t.data.resize(static_cast<size_t>(t.m.data_bytes()));
  switch (f) {
    case WeightFormat::kF32: {
      std::vector<float> v(static_cast<size_t>(rows * cols));
      for (auto& e : v) e = gauss(rng);
      std::memcpy(t.data.data(), v.data(), t.data.size());
      break;
    }
    case WeightFormat::kBF16: {
      std::vector<uint16_t> v(static_cast<size_t>(rows * cols));
      for (auto& e : v) e = f32_to_bf16(gauss(rng));
      std::memcpy(t.data.data(), v.data(), t.data.size());
      break;
    }
    case WeightFormat::kFP8:
      if (codes == Codes::kGaussian) {  // sigma ~107: the block maxima land near 448
        for (auto& e : t.data) e = fp8_encode(std::clamp(gauss(rng) * 107.0f, -448.0f, 448.0f));
        break;
      }
      for (size_t k = 0; k < t.data.size(); ++k) {
        uint8_t c = static_cast<uint8_t>(codes == Codes::kAll ? k % 256 : byte(rng));
        if (codes == Codes::kNormal && (c & 0x7f) == 0x7f) c ^= 1;  // no NaN codes
        t.data[k] = c;
      }
      if (codes == Codes::kAll) std::shuffle(t.data.begin(), t.data.end(), rng);
      break;
    case WeightFormat::kFP4:
      for (auto& e : t.data) e = static_cast<uint8_t>(byte(rng));
      break;
  }
  t.scales.resize(static_cast<size_t>(t.m.scale_bytes()));
  std::uniform_int_distribution<int> sc(scale_lo, scale_hi);
  for (auto& s : t.scales) s = static_cast<uint8_t>(sc(rng));
  t.m.data = t.data.data();
  t.m.scales = t.scales.empty() ? nullptr : t.scales.data();
  return t;
}

std::vector<float> random_x(int64_t n, int64_t cols, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> gauss(0.0f, scale);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (auto& e : x) e = gauss(rng);
  // A few outliers and exact zeros, as real activations have.
  std::uniform_int_distribution<int64_t> pos(0, n * cols - 1);
  for (int k = 0; k < 3 && n * cols > 0; ++k) x[static_cast<size_t>(pos(rng))] *= 40.0f;
  for (int k = 0; k < 3 && n * cols > 0; ++k) x[static_cast<size_t>(pos(rng))] = 0.0f;
  return x;
}

// Bitwise equality, except that any NaN equals any NaN (NaN payloads are not specified).
bool same_bits(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

std::vector<float> run(const detail::Table& t, const Matrix& w, const std::vector<float>& x, int64_t n,
                       Numerics num, ThreadPool* pool, int64_t extra_stride = 0) {
  int64_t stride = w.rows + extra_stride;
  std::vector<float> y(static_cast<size_t>(n * stride), -7.0f);
  QuantizedInput in;
  detail::prepare_input_with(t, x.data(), n, w.cols, num, &in, pool);
  detail::matmul_with(t, w, in, y.data(), num, pool, stride);
  std::vector<float> out(static_cast<size_t>(n * w.rows));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = 0; r < w.rows; ++r) out[i * w.rows + r] = y[i * stride + r];
    for (int64_t r = w.rows; r < stride; ++r) EXPECT_EQ(y[i * stride + r], -7.0f) << "wrote past rows";
  }
  return out;
}

// A table's name for failure messages: the path, and its tuning where it has one.
std::string table_label(const detail::Table& t) {
  return *t.tuning ? std::string(t.name) + " (" + t.tuning + ")" : std::string(t.name);
}

// Every SIMD table this CPU runs, each path's variants for other cores included (every AVX-512
// variant's kernels run on any AVX-512 CPU).
std::vector<const detail::Table*> simd_tables() {
  std::vector<const detail::Table*> out;
  for (const auto& name : runnable_paths())
    if (name != "scalar") out.push_back(&detail::table_by_name(name));
#if defined(__x86_64__)
  using detail::Avx512Core;
  if (detail::cpu_supports("avx512"))
    for (Avx512Core core : {Avx512Core::kIntel, Avx512Core::kZen4, Avx512Core::kZen5})
      if (&detail::avx512_table(core) != &detail::table_by_name("avx512")) out.push_back(&detail::avx512_table(core));
#endif
  return out;
}

const WeightFormat kFormats[] = {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kFP8, WeightFormat::kFP4};

TEST(KernelDispatch, PathsAndNames) {
  auto paths = runnable_paths();
  ASSERT_FALSE(paths.empty());
  EXPECT_EQ(paths[0], "scalar");
#if defined(__aarch64__)
  // Advanced SIMD is part of every ARMv8-A core: the aarch64 build always tests NEON.
  EXPECT_NE(std::find(paths.begin(), paths.end(), "neon"), paths.end());
#endif
  std::string active = active_path();
  const char* env = std::getenv("DSV4_KERNELS");
  if (env && *env) {
    EXPECT_EQ(active, env);
  } else {
    EXPECT_EQ(active, paths.back());
  }
  EXPECT_THROW(detail::table_by_name("sse9"), Error);
  try {
    detail::table_by_name("neon");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DSV4_KERNELS"), std::string::npos) << e.what();
  }
}

// The scalar reference is a correct matmul: compare with a double-precision product of the
// exactly decoded weights. float32 accumulation error is bounded by ~cols * eps * sum |w x|.
TEST(KernelReference, MatchesDoublePrecision) {
  std::mt19937 rng(1);
  const detail::Table& s = detail::scalar_table();
  for (WeightFormat f : kFormats) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{5, 96}, {130, 258}, {33, 64}, {7, 1000}}) {
      TestMatrix t = make_matrix(f, rows, cols, rng, Codes::kNormal);
      const int64_t n = 3;
      auto x = random_x(n, cols, rng);
      auto y = run(s, t.m, x, n, Numerics::kReference, nullptr);
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = 0; r < rows; ++r) {
        decode_row(t.m, r, row.data());
        for (int64_t i = 0; i < n; ++i) {
          double ref = 0, mag = 0;
          for (int64_t c = 0; c < cols; ++c) {
            ref += double(row[c]) * double(x[i * cols + c]);
            mag += std::fabs(double(row[c]) * double(x[i * cols + c]));
          }
          double err = std::fabs(double(y[i * rows + r]) - ref);
          ASSERT_LE(err, 1e-6 * mag + 1e-30) << format_name(f) << " r=" << r << " i=" << i;
        }
      }
    }
  }
}

TEST(KernelReference, DotAndAxpyMatchDouble) {
  std::mt19937 rng(2);
  for (int64_t n : {0, 1, 7, 31, 32, 33, 64, 100, 512}) {
    auto a = random_x(1, n, rng), b = random_x(1, n, rng);
    double ref = 0, mag = 0;
    for (int64_t k = 0; k < n; ++k) ref += double(a[k]) * b[k], mag += std::fabs(double(a[k]) * b[k]);
    EXPECT_LE(std::fabs(detail::scalar_table().dot(a.data(), b.data(), n) - ref), 1e-6 * mag + 1e-30);
    std::vector<float> y = b;
    detail::scalar_table().axpy(0.5f, a.data(), y.data(), n);
    // 0.5f * a is exact, so one float add is the correctly rounded fma (std::fma is not correctly
    // rounded on every libm: MinGW's is not).
    for (int64_t k = 0; k < n; ++k) EXPECT_EQ(y[k], 0.5f * a[k] + b[k]);
  }
}

// Every SIMD path gives the scalar bits: all formats, both modes, ragged shapes, n = 1 .. 5
// (the matrix-vector kernels for a few rows, then the tiled ones), 17, 64 and 1 or 2 threads,
// with y written at a stride.
TEST(KernelPaths, BitExactAgainstScalar) {
  auto tables = simd_tables();
  if (tables.empty()) GTEST_SKIP() << "no SIMD path runs on this CPU";
  std::mt19937 rng(3);
  ThreadPool pool2(2);
  const detail::Table& s = detail::scalar_table();
  struct Shape {
    int64_t rows, cols;
  };
  // {9, 8200}: past the 8,192 columns the AVX2 FP4 matrix-vector kernel takes in one chunk.
  const Shape shapes[] = {{1, 2}, {3, 30}, {96, 256}, {192, 96}, {37, 200}, {130, 394}, {64, 2048}, {9, 8200}};
  for (WeightFormat f : kFormats) {
    for (const Shape& sh : shapes) {
      TestMatrix t = make_matrix(f, sh.rows, sh.cols, rng, Codes::kNormal);
      for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 64}) {  // every few-row kernel (n <= 8), then tiles
        // n = 17 there too: the batched integer kernel on one whole 2,048-column chunk and, at
        // 8,200 columns, across several, on every path (AVX-512 takes FP8 n <= 8 elsewhere).
        if (sh.cols >= 2048 && n > 17) continue;  // keep the test fast
        auto x = random_x(n, sh.cols, rng);
        for (Numerics num : {Numerics::kReference, Numerics::kFast}) {
          auto want = run(s, t.m, x, n, num, nullptr, 3);
          for (const detail::Table* tab : tables) {
            for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2}) {
              auto got = run(*tab, t.m, x, n, num, pool, 3);
              for (size_t k = 0; k < want.size(); ++k)
                ASSERT_TRUE(same_bits(got[k], want[k]))
                    << table_label(*tab) << " " << format_name(f) << " " << numerics_name(num) << " [" << sh.rows << ","
                    << sh.cols << "] n=" << n << " threads=" << (pool ? 2 : 1) << " at " << k << ": " << got[k]
                    << " vs " << want[k];
            }
          }
        }
      }
    }
  }
}

// The batched integer kernels with more activation rows than one pass takes (512 on x86) and
// several column chunks, so the float chains wait between chunks and passes start over: the
// scalar bits, for ragged rows, columns and activation counts.
TEST(KernelPaths, ManyActivationRowsAcrossChunks) {
  auto tables = simd_tables();
  if (tables.empty()) GTEST_SKIP() << "no SIMD path runs on this CPU";
  std::mt19937 rng(11);
  ThreadPool pool2(2);
  const int64_t rows = 37, cols = 4200, n = 1029;
  for (WeightFormat f : {WeightFormat::kFP8, WeightFormat::kFP4}) {
    TestMatrix t = make_matrix(f, rows, cols, rng, Codes::kNormal);
    auto x = random_x(n, cols, rng);
    auto want = run(detail::scalar_table(), t.m, x, n, Numerics::kFast, &pool2, 3);
    for (const detail::Table* tab : tables) {
      auto got = run(*tab, t.m, x, n, Numerics::kFast, &pool2, 3);
      for (size_t k = 0; k < want.size(); ++k)
        ASSERT_TRUE(same_bits(got[k], want[k]))
            << table_label(*tab) << " " << format_name(f) << " at " << k << ": " << got[k] << " vs " << want[k];
    }
  }
}

// A given activation row gives the same bits whether it is multiplied alone, in a sub-batch or
// in the whole batch (prefill chunking must not change logits), on every path, with 1 and 2
// threads: ragged rows, several 1024-column chunks and activation groups of the batched kernels.
TEST(KernelPaths, RowsIndependentOfBatch) {
  std::mt19937 rng(10);
  ThreadPool pool2(2);
  const detail::Table& s = detail::scalar_table();
  const int64_t rows = 45, cols = 2112, n = 19;
  for (WeightFormat f : kFormats) {
    TestMatrix t = make_matrix(f, rows, cols, rng, Codes::kNormal);
    auto x = random_x(n, cols, rng);
    for (Numerics num : {Numerics::kReference, Numerics::kFast}) {
      auto want = run(s, t.m, x, n, num, nullptr, 5);
      for (const auto& name : runnable_paths()) {
        const detail::Table& tab = detail::table_by_name(name);
        const std::string what = name + " " + format_name(f) + " " + numerics_name(num);
        for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2}) {
          auto got = run(tab, t.m, x, n, num, pool, 5);
          for (size_t k = 0; k < want.size(); ++k)
            ASSERT_TRUE(same_bits(got[k], want[k])) << what << " batch at " << k;
        }
        for (int64_t i = 0; i < n; ++i) {
          std::vector<float> xi(x.begin() + i * cols, x.begin() + (i + 1) * cols);
          auto got = run(tab, t.m, xi, 1, num, &pool2);
          for (int64_t r = 0; r < rows; ++r)
            ASSERT_TRUE(same_bits(got[r], want[i * rows + r])) << what << " row " << i << " alone, output " << r;
        }
        const int64_t i0 = 5, i1 = 14;  // a sub-batch that straddles activation groups of 8
        std::vector<float> xs(x.begin() + i0 * cols, x.begin() + i1 * cols);
        auto got = run(tab, t.m, xs, i1 - i0, num, &pool2);
        for (size_t k = 0; k < got.size(); ++k)
          ASSERT_TRUE(same_bits(got[k], want[i0 * rows + k])) << what << " sub-batch at " << k;
      }
    }
  }
}

// All 256 FP8 codes (incl. subnormals, -0 and the NaN codes), all 16 FP4 codes, and scales
// from 2^-127 to 2^127 plus the E8M0 NaN: paths agree, NaN where the weights say so.
TEST(KernelPaths, AllCodesAndEdgeScales) {
  std::mt19937 rng(4);
  ThreadPool pool2(2);
  const detail::Table& s = detail::scalar_table();
  auto tables = simd_tables();
  for (WeightFormat f : {WeightFormat::kFP8, WeightFormat::kFP4}) {
    for (auto [lo, hi] : {std::pair<int, int>{0, 254}, {0, 3}, {250, 254}, {120, 135}, {255, 255}}) {
      TestMatrix t = make_matrix(f, 260, 384, rng, Codes::kAll, lo, hi);
      for (int64_t n : {1, 5}) {
        auto x = random_x(n, 384, rng);
        for (Numerics num : {Numerics::kReference, Numerics::kFast}) {
          auto want = run(s, t.m, x, n, num, nullptr);
          for (const detail::Table* tab : tables) {
            auto got = run(*tab, t.m, x, n, num, &pool2);
            for (size_t k = 0; k < want.size(); ++k)
              ASSERT_TRUE(same_bits(got[k], want[k])) << table_label(*tab) << " " << format_name(f) << " "
                                                      << numerics_name(num) << " scales " << lo << ".." << hi
                                                      << " n=" << n << " at " << k;
          }
        }
      }
    }
  }
  // Decoding: every code exactly, NaN codes as NaN, E8M0 255 as NaN; the fast FP8 integer
  // weight of every code at every shift is the rounded exact product (NaN codes as +-480).
  for (int c = 0; c < 256; ++c) {
    float v = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v));
      v = (c & 0x80) ? -480.0f : 480.0f;
    }
    EXPECT_LT(std::fabs(v), 4.0f * detail::fp8_fast_ubyte(static_cast<uint8_t>(c))) << c;
    for (int k = 0; k <= 9; ++k)
      EXPECT_EQ(detail::fp8_fast_weight(static_cast<uint8_t>(c), k), std::nearbyint(double(v) * std::ldexp(1.0, k)))
          << c << " k=" << k;
  }
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  // A NaN weight code in reference mode makes exactly the rows that hold it NaN.
  TestMatrix t = make_matrix(WeightFormat::kFP8, 16, 256, rng, Codes::kNormal);
  t.data[3 * 256 + 17] = 0xff;
  auto x = random_x(2, 256, rng);
  for (const auto& name : runnable_paths()) {
    auto y = run(detail::table_by_name(name), t.m, x, 2, Numerics::kReference, &pool2);
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t r = 0; r < 16; ++r) EXPECT_EQ(std::isnan(y[i * 16 + r]), r == 3) << name << " " << r;
  }
  // An E8M0 NaN scale makes the FP4 rows that use it NaN in both modes.
  TestMatrix t4 = make_matrix(WeightFormat::kFP4, 4, 64, rng, Codes::kNormal);
  t4.scales[2 * 2 + 1] = 255;
  auto x4 = random_x(1, 64, rng);
  for (const auto& name : runnable_paths())
    for (Numerics num : {Numerics::kReference, Numerics::kFast}) {
      auto y = run(detail::table_by_name(name), t4.m, x4, 1, num, nullptr);
      for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(std::isnan(y[r]), r == 2) << name << " " << r;
    }
}

// The fast FP8 shift keeps every block's integer weights in int16 and their absolute sum so
// small that no 16-bit activation block can overflow an int32 sum: random blocks, blocks of
// the largest codes, a single large code among small ones, short (partial) blocks.
TEST(KernelFast, Fp8ShiftCannotOverflow) {
  std::mt19937 rng(12);
  std::uniform_int_distribution<int> byte(0, 255), len(1, 32);
  auto check = [](const uint8_t* codes, int n) {
    const int k = detail::fp8_fast_shift(codes, n);
    int64_t sum = 0, big = 0;
    for (int c = 0; c < n; ++c) {
      const int64_t w = std::abs(detail::fp8_fast_weight(codes[c], k));
      sum += w, big = std::max(big, w);
    }
    EXPECT_LE(big, 30720) << "k=" << k;
    EXPECT_LE(sum * detail::kQMax, int64_t{2147483647}) << "k=" << k;
    EXPECT_GE(k, 2);
    EXPECT_LE(k, 9);
  };
  uint8_t codes[32];
  for (int trial = 0; trial < 20000; ++trial) {
    const int n = trial % 3 ? 32 : len(rng);
    const int kind = trial % 5;
    for (int c = 0; c < n; ++c) {
      int v = byte(rng);
      if (kind == 1) v = 0x7e | (v & 0x80);                           // the largest finite codes
      if (kind == 2) v = c == 0 ? (0x7f | (v & 0x80)) : (v & 0x87);  // one NaN-as-480 among tiny codes
      if (kind == 3) v = (v & 0x80) | (0x40 + (v & 0x3f));           // one exponent band
      codes[c] = static_cast<uint8_t>(v);
    }
    check(codes, n);
  }
}

TEST(KernelPaths, DotAndAxpyBitExact) {
  std::mt19937 rng(5);
  const detail::Table& s = detail::scalar_table();
  for (const detail::Table* tab : simd_tables()) {
    for (int64_t n : {0, 1, 7, 8, 31, 32, 33, 63, 64, 65, 128, 511, 512, 1000}) {
      auto a = random_x(1, n, rng), b = random_x(1, n, rng);
      ASSERT_TRUE(same_bits(tab->dot(a.data(), b.data(), n), s.dot(a.data(), b.data(), n))) << table_label(*tab) << n;
      std::vector<float> y1 = b, y2 = b;
      tab->axpy(-1.25f, a.data(), y1.data(), n);
      s.axpy(-1.25f, a.data(), y2.data(), n);
      if (n > 0) {
        ASSERT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * 4), 0) << table_label(*tab) << n;
      }
    }
  }
}

// The batched forms against the scalar definition (each result that of its single dot / axpy),
// with strides wider than the rows, odd sizes and every tile's tail.
TEST(KernelPaths, DotManyAndAxpyManyBitExact) {
  std::mt19937 rng(11);
  const detail::Table& s = detail::scalar_table();
  std::vector<const detail::Table*> tables = simd_tables();
  tables.push_back(&s);  // the scalar composite against single calls, too
  for (const detail::Table* tab : tables) {
    for (int64_t n : {1, 7, 8, 31, 32, 33, 100, 128, 511, 512, 513}) {
      for (int64_t nq : {1, 2, 3, 5, 8, 9, 16, 17, 64}) {
        const int64_t stride = n + 3;
        auto q = random_x(nq, stride, rng), r = random_x(1, n, rng);
        std::vector<float> got(size_t(nq), -1.0f);
        tab->dot_many(q.data(), stride, nq, r.data(), n, got.data());
        for (int64_t h = 0; h < nq; ++h)
          ASSERT_TRUE(same_bits(got[h], s.dot(q.data() + h * stride, r.data(), n))) << table_label(*tab) << " n=" << n << " nq=" << nq << " h=" << h;
      }
      for (int64_t nh : {1, 3, 4, 5, 8, 9, 12}) {
        for (int64_t nrows : {0, 1, 5, 17}) {
          const int64_t o_stride = n + 5, p_stride = nrows + 2;
          auto rows_data = random_x(std::max<int64_t>(nrows, 1), n + 1, rng);
          std::vector<const float*> rows;
          for (int64_t j = 0; j < nrows; ++j) rows.push_back(rows_data.data() + ((j * 7) % nrows) * (n + 1));
          auto p = random_x(nh, p_stride, rng);
          auto o1 = random_x(nh, o_stride, rng);
          std::vector<float> o2 = o1;
          tab->axpy_many(p.data(), p_stride, nh, rows.data(), nrows, n, o1.data(), o_stride);
          for (int64_t j = 0; j < nrows; ++j)
            for (int64_t h = 0; h < nh; ++h) s.axpy(p[h * p_stride + j], rows[j], o2.data() + h * o_stride, n);
          ASSERT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * 4), 0)
              << table_label(*tab) << " n=" << n << " nh=" << nh << " rows=" << nrows;  // the gaps between outputs untouched too
        }
      }
    }
  }
}

// Fast mode against reference. FP4 and FP8: activations are rounded to 16-bit integers per 32
// columns, so each product moves by at most |w| * d / 2 with d = amax / 32512; FP8 weights are
// also rounded to their block's integer grid. The bound below is that plus float rounding.
TEST(KernelFast, WithinStatedBoundOfReference) {
  std::mt19937 rng(6);
  const detail::Table& tab = detail::active_table();
  for (WeightFormat f : kFormats) {
    const int64_t rows = 70, cols = 300, n = 4;
    TestMatrix t = make_matrix(f, rows, cols, rng, Codes::kNormal);
    auto x = random_x(n, cols, rng);
    auto yr = run(tab, t.m, x, n, Numerics::kReference, nullptr);
    auto yf = run(tab, t.m, x, n, Numerics::kFast, nullptr);
    std::vector<float> row(static_cast<size_t>(cols));
    double worst = 0;
    for (int64_t r = 0; r < rows; ++r) {
      decode_row(t.m, r, row.data());
      for (int64_t i = 0; i < n; ++i) {
        double mag = 0, qbound = 0;
        for (int64_t b = 0; b < ceil_div(cols, 32); ++b) {
          double amax = 0, wsum = 0;
          for (int64_t c = b * 32; c < std::min(cols, b * 32 + 32); ++c) {
            amax = std::max(amax, std::fabs(double(x[i * cols + c])));
            wsum += std::fabs(double(row[c]));
            mag += std::fabs(double(row[c]) * x[i * cols + c]);
          }
          qbound += wsum * amax / 32512.0 * 0.5;
        }
        // FP8 also rounds each weight to its block's grid 2^-k (in units of the block scale):
        // at most half a grid step per weight, and the activation bound then holds for the
        // rounded weights (|w| + half a step).
        double wbound = 0;
        if (f == WeightFormat::kFP8) {
          const uint8_t* codes = t.data.data() + r * cols;
          qbound = 0;
          for (int64_t b = 0; b < ceil_div(cols, 32); ++b) {
            const int len = static_cast<int>(std::min<int64_t>(32, cols - b * 32));
            const int k = detail::fp8_fast_shift(codes + b * 32, len);
            const double step = e8m0_to_f32(t.scales[(r / 128) * ceil_div(cols, 128) + b / 4]) * std::ldexp(1.0, -k);
            double amax = 0, wsum = 0;
            for (int64_t c = b * 32; c < b * 32 + len; ++c) {
              amax = std::max(amax, std::fabs(double(x[i * cols + c])));
              wsum += std::fabs(double(row[c])) + step / 2;
              wbound += std::fabs(double(x[i * cols + c])) * step / 2;
            }
            qbound += wsum * amax / 32512.0 * 0.5;
          }
        }
        double err = std::fabs(double(yf[i * rows + r]) - double(yr[i * rows + r]));
        double bound = (f == WeightFormat::kFP4 || f == WeightFormat::kFP8 ? qbound * 1.001 : 0.0) + wbound * 1.001 +
                       1e-6 * mag + 1e-30;
        ASSERT_LE(err, bound) << format_name(f) << " r=" << r << " i=" << i;
        if (mag > 0) worst = std::max(worst, err / mag);
      }
    }
    if (f == WeightFormat::kF32 || f == WeightFormat::kBF16) {
      EXPECT_EQ(std::memcmp(yr.data(), yf.data(), yr.size() * 4), 0) << "fast is reference for float weights";
    }
    if (f == WeightFormat::kFP4 || f == WeightFormat::kFP8) {
      EXPECT_GT(worst, 0.0) << "fast " << format_name(f) << " should differ from reference";
    }
  }
}

// Fast FP4 and FP8 are precise enough for near-tie routing decisions: at an expert shape with
// Gaussian activations the RMS error against the exact product is ~2e-5 (FP4) and ~3e-5 (FP8,
// Gaussian weights as checkpoints have them) of the RMS output (the former single-plane int8
// activations gave 5e-3, which flipped top-k decisions of the test models).
TEST(KernelFast, RelativeErrorSmall) {
  for (WeightFormat f : {WeightFormat::kFP4, WeightFormat::kFP8}) {
  std::mt19937 rng(11);
  const int64_t rows = 256, cols = 4096, n = 4;
  TestMatrix t = make_matrix(f, rows, cols, rng, f == WeightFormat::kFP8 ? Codes::kGaussian : Codes::kNormal);
  auto x = random_x(n, cols, rng);
  auto y = run(detail::active_table(), t.m, x, n, Numerics::kFast, nullptr);
  std::vector<float> row(static_cast<size_t>(cols));
  double err2 = 0, ref2 = 0;
  for (int64_t r = 0; r < rows; ++r) {
    decode_row(t.m, r, row.data());
    for (int64_t i = 0; i < n; ++i) {
      double ref = 0;
      for (int64_t c = 0; c < cols; ++c) ref += double(row[c]) * double(x[i * cols + c]);
      err2 += (y[i * rows + r] - ref) * (y[i * rows + r] - ref);
      ref2 += ref * ref;
    }
  }
  const double rel = std::sqrt(err2 / ref2);
  std::printf("fast %s: RMS relative error %.3g\n", format_name(f), rel);
  EXPECT_LT(rel, f == WeightFormat::kFP4 ? 5e-5 : 6e-5) << format_name(f);
  EXPECT_GT(rel, 1e-7) << "fast " << format_name(f) << " is expected to quantize the activations";
  }
}

// The fast path reuses one prepared input for several matrices; results equal matmul(x).
TEST(KernelFast, PreparedInputReuse) {
  std::mt19937 rng(7);
  TestMatrix a = make_matrix(WeightFormat::kFP4, 64, 256, rng, Codes::kNormal);
  TestMatrix b = make_matrix(WeightFormat::kFP8, 48, 256, rng, Codes::kNormal);
  auto x = random_x(3, 256, rng);
  QuantizedInput in;
  prepare_input(x.data(), 3, 256, Numerics::kFast, &in);
  for (const TestMatrix* t : {&a, &b}) {
    std::vector<float> y1(static_cast<size_t>(3 * t->m.rows)), y2(y1.size());
    matmul(t->m, in, y1.data(), Numerics::kFast, nullptr);
    matmul(t->m, x.data(), 3, y2.data(), Numerics::kFast, nullptr);
    EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * 4), 0);
  }
  QuantizedInput ref;
  prepare_input(x.data(), 3, 256, Numerics::kReference, &ref);
  std::vector<float> y(3 * 64);
  EXPECT_THROW(matmul(a.m, ref, y.data(), Numerics::kFast, nullptr), Error);
  TestMatrix odd = make_matrix(WeightFormat::kFP4, 2, 64, rng, Codes::kNormal);
  odd.m.cols = 63;
  EXPECT_THROW(matmul(odd.m, x.data(), 1, y.data(), Numerics::kFast, nullptr), Error);
}

// A scratch QuantizedInput passed to every matmul(w, x, ...) keeps its buffers: after the largest
// call nothing grows, and the results are the bits of calls with a temporary one.
TEST(KernelFast, ScratchInputReuseAllocatesOnce) {
  std::mt19937 rng(8);
  ThreadPool pool2(2);
  TestMatrix a = make_matrix(WeightFormat::kFP4, 96, 256, rng, Codes::kNormal);
  TestMatrix b = make_matrix(WeightFormat::kFP8, 64, 256, rng, Codes::kNormal);
  auto x = random_x(20, 256, rng);
  auto capacity = [](const QuantizedInput& in) {
    return in.q.capacity() + in.ql.capacity() + 2 * in.qg.capacity() + 2 * in.q16.capacity() + 4 * in.d.capacity() + 4 * in.qsum12.capacity();
  };
  QuantizedInput scratch;
  size_t after_first = 0;
  for (int round = 0; round < 2; ++round) {
    for (int64_t n : {20, 1, 7, 20}) {
      for (const TestMatrix* t : {&a, &b}) {
        std::vector<float> y1(static_cast<size_t>(n * t->m.rows)), y2(y1.size());
        matmul(t->m, x.data(), n, y1.data(), Numerics::kFast, &pool2, 0, &scratch);
        matmul(t->m, x.data(), n, y2.data(), Numerics::kFast, &pool2);
        EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * 4), 0);
      }
      // The batched layout's padding rows hold zeros, whatever an earlier, larger n left there.
      const int64_t pc = scratch.padded_cols;
      for (int64_t i = n; i % 8; ++i)
        for (int64_t c = 0; c < pc; ++c)
          ASSERT_EQ(scratch.qg[(i / 8) * 8 * pc + (c / 2) * 16 + (i % 8) * 2 + (c % 2)], 0) << n << " " << i << " " << c;
      if (after_first == 0) after_first = capacity(scratch);
    }
  }
  EXPECT_GT(after_first, 0u);
  EXPECT_EQ(capacity(scratch), after_first);
  EXPECT_LE(after_first, quantized_input_bytes(20, 256));
}

// matmul_batch gives each task exactly the bits of its own matmul, on every path and thread count.
TEST(KernelFast, BatchEqualsSeparateCalls) {
  std::mt19937 rng(9);
  ThreadPool pool2(2);
  TestMatrix w1 = make_matrix(WeightFormat::kFP4, 96, 256, rng, Codes::kNormal);
  TestMatrix w3 = make_matrix(WeightFormat::kFP4, 96, 256, rng, Codes::kNormal);
  TestMatrix w2 = make_matrix(WeightFormat::kFP8, 200, 96, rng, Codes::kNormal);
  TestMatrix hb = make_matrix(WeightFormat::kBF16, 33, 256, rng, Codes::kNormal);
  for (int64_t n : {1, 5}) {
    auto x = random_x(n, 256, rng), h = random_x(n, 96, rng);
    for (Numerics num : {Numerics::kReference, Numerics::kFast}) {
      for (const auto& name : runnable_paths()) {
        const detail::Table& t = detail::table_by_name(name);
        QuantizedInput in, ih;
        detail::prepare_input_with(t, x.data(), n, 256, num, &in, nullptr);
        detail::prepare_input_with(t, h.data(), n, 96, num, &ih, nullptr);
        std::vector<float> a(n * 96), b(n * 100), c(n * 200), d(n * 33), ra(a.size()), rb(b.size()), rc(c.size()),
            rd(d.size());
        MatmulTask tasks[] = {{&w1.m, &in, a.data(), 0}, {&w3.m, &in, b.data(), 100}, {&w2.m, &ih, c.data(), 0},
                              {&hb.m, &in, d.data(), 0}};
        detail::matmul_batch_with(t, tasks, 4, num, &pool2);
        detail::matmul_with(t, w1.m, in, ra.data(), num, nullptr, 0);
        detail::matmul_with(t, w3.m, in, rb.data(), num, nullptr, 100);
        detail::matmul_with(t, w2.m, ih, rc.data(), num, nullptr, 0);
        detail::matmul_with(t, hb.m, in, rd.data(), num, nullptr, 0);
        EXPECT_EQ(std::memcmp(a.data(), ra.data(), a.size() * 4), 0) << name;
        for (int64_t i = 0; i < n; ++i)
          EXPECT_EQ(std::memcmp(b.data() + i * 100, rb.data() + i * 100, 96 * 4), 0) << name;
        EXPECT_EQ(std::memcmp(c.data(), rc.data(), c.size() * 4), 0) << name;
        EXPECT_EQ(std::memcmp(d.data(), rd.data(), d.size() * 4), 0) << name;
      }
    }
  }
  QuantizedInput bad;
  auto x = random_x(1, 64, rng);
  prepare_input(x.data(), 1, 64, Numerics::kFast, &bad);
  std::vector<float> y(96);
  MatmulTask t{&w1.m, &bad, y.data(), 0};
  EXPECT_THROW(matmul_batch(&t, 1, Numerics::kFast, nullptr), Error);
}

// Quantization follows its definition on every path, including zero, tiny and non-finite blocks.
TEST(KernelFast, QuantizationEdgeCases) {
  std::mt19937 rng(8);
  const int64_t cols = 200;
  auto x = random_x(4, cols, rng);
  for (int k = 0; k < 32; ++k) x[k] = 0.0f;                       // all-zero block
  for (int k = 32; k < 64; ++k) x[k] = 1e-44f * (k % 3);           // denormal block (d == 0)
  x[cols + 70] = std::numeric_limits<float>::infinity();          // inf block
  x[2 * cols + 5] = std::numeric_limits<float>::quiet_NaN();      // NaN block
  for (int k = 0; k < 32; ++k) x[3 * cols + 96 + k] = (k - 16) * 0.5f;  // exact halves
  QuantizedInput want;
  detail::prepare_input_with(detail::scalar_table(), x.data(), 4, cols, Numerics::kFast, &want, nullptr);
  EXPECT_EQ(want.d[0], 0.0f);
  EXPECT_TRUE(std::isnan(want.d[7 + 2]));
  // The definition: Q = 256 * q + ql = clamp(rint(x / d), +-32512) with d = amax / 32512, the
  // high plane in [-127, 127], the low one in [-128, 127]; qsum12 = 12 * sum Q per block.
  const int64_t nb = ceil_div(cols, 32);
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t b = 0; b < nb; ++b) {
      const float d = want.d[i * nb + b];
      float amax = 0;
      bool finite = true;
      for (int64_t c = b * 32; c < std::min(cols, b * 32 + 32); ++c) {
        amax = std::max(amax, std::fabs(x[i * cols + c]));
        finite = finite && std::isfinite(x[i * cols + c]);
      }
      if (finite) {
        EXPECT_EQ(d, amax / 32512.0f);
      } else {
        EXPECT_TRUE(std::isnan(d));
      }
      int32_t sum = 0;
      for (int64_t c = b * 32; c < std::min(cols, b * 32 + 32); ++c) {
        const int64_t p = i * want.padded_cols + detail::span_pos(c);
        const int32_t q = 256 * want.q[p] + want.ql[p];
        sum += q;
        // The batched layout: groups of 8 rows, per column pair the rows' two values side by side.
        ASSERT_EQ(want.qg[(i / 8) * 8 * want.padded_cols + (c / 2) * 16 + (i % 8) * 2 + (c % 2)], q) << i << " " << c;
        ASSERT_GE(want.q[p], -127);
        ASSERT_LE(want.q[p], 127);
        float expect = 0.0f;
        if (std::isfinite(d) && d > 0) expect = std::clamp(std::nearbyint(x[i * cols + c] / d), -32512.0f, 32512.0f);
        ASSERT_EQ(q, static_cast<int32_t>(expect)) << "row " << i << " col " << c;
      }
      EXPECT_EQ(want.qsum12[i * nb + b], 12 * sum);
    }
  // Exact halves round to even: x = k / 2 in units of d.
  {
    float h[32];
    for (int k = 0; k < 32; ++k) h[k] = k == 0 ? 32512.0f : 0.5f * static_cast<float>(k - 16);
    int32_t q[32];
    float d;
    detail::quantize_block_ref(h, 32, q, &d);
    ASSERT_EQ(d, 1.0f);
    for (int k = 1; k < 32; ++k) EXPECT_EQ(q[k], static_cast<int32_t>(std::nearbyint(0.5f * (k - 16)))) << k;
    EXPECT_EQ(detail::q_hi(32512), 127);
    EXPECT_EQ(detail::q_lo(32512), 0);
    EXPECT_EQ(detail::q_hi(-32512), -127);
    EXPECT_EQ(detail::q_hi(127), 0);
    EXPECT_EQ(detail::q_lo(127), 127);
    EXPECT_EQ(detail::q_hi(128), 1);
    EXPECT_EQ(detail::q_lo(128), -128);
  }
  // Up to 8 rows: Q also in the FP8 matrix-vector order (per 16 columns 0-3, 8-11, 4-7,
  // 12-15), each row padded_cols apart, zeros in the padding.
  {
    ASSERT_EQ(static_cast<int64_t>(want.q16.size()), detail::kQ16Rows * want.padded_cols);
    const int order[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};
    const int64_t pc = want.padded_cols;
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t c = 0; c < pc; ++c) {
        const int64_t col = c / 16 * 16 + order[c % 16];
        const int64_t p = i * pc + detail::span_pos(col);
        ASSERT_EQ(want.q16[i * pc + c], col < cols ? 256 * want.q[p] + want.ql[p] : 0) << i << " " << c;
      }
    // Every n sizes the plane for 8 rows (a buffer grown once never grows again).
    QuantizedInput many;
    auto x9 = random_x(9, cols, rng);
    detail::prepare_input_with(detail::scalar_table(), x9.data(), 9, cols, Numerics::kFast, &many, nullptr);
    EXPECT_EQ(static_cast<int64_t>(many.q16.size()), detail::kQ16Rows * many.padded_cols);
  }
  for (const auto& name : runnable_paths()) {
    QuantizedInput got;
    detail::prepare_input_with(detail::table_by_name(name), x.data(), 4, cols, Numerics::kFast, &got, nullptr);
    EXPECT_EQ(got.q, want.q) << name;
    EXPECT_EQ(got.ql, want.ql) << name;
    EXPECT_EQ(got.qg, want.qg) << name;
    EXPECT_EQ(got.qsum12, want.qsum12) << name;
    ASSERT_EQ(got.d.size(), want.d.size());
    for (size_t k = 0; k < got.d.size(); ++k) EXPECT_TRUE(same_bits(got.d[k], want.d[k])) << name << k;
  }
}

// The decoders against the fixture's exact float32 dequantisation of 12 storage tensors.
TEST(KernelDecode, MatchesFixtureDequantisation) {
  Checkpoint ck = Checkpoint::open(test::fixture("tiny-a"));
  SafetensorsFile ref = SafetensorsFile::open(test::fixture("tiny-a") + "/dequant_reference.safetensors");
  int checked = 0;
  for (const TensorInfo& info : ref.tensors()) {
    ASSERT_EQ(info.dtype, DType::kF32);
    std::vector<float> want(static_cast<size_t>(info.numel()));
    ref.read(info, want.data());
    const TensorRef& tr = ck.get(info.name);
    std::vector<uint8_t> data(tr.info->bytes), scales;
    tr.shard->read(*tr.info, data.data());
    Matrix m;
    m.rows = info.shape[0];
    m.cols = info.shape.size() > 1 ? info.shape[1] : 1;
    switch (tr.info->dtype) {
      case DType::kF32: m.format = WeightFormat::kF32; break;
      case DType::kBF16: m.format = WeightFormat::kBF16; break;
      case DType::kF8_E4M3: m.format = WeightFormat::kFP8; break;
      case DType::kI8: m.format = WeightFormat::kFP4; break;
      default: FAIL() << info.name << " has dtype " << dtype_name(tr.info->dtype);
    }
    if (m.format == WeightFormat::kFP8 || m.format == WeightFormat::kFP4) {
      std::string sname = info.name.substr(0, info.name.size() - std::string("weight").size()) + "scale";
      const TensorRef& sr = ck.get(sname);
      scales.resize(sr.info->bytes);
      sr.shard->read(*sr.info, scales.data());
      ASSERT_EQ(static_cast<int64_t>(scales.size()), m.scale_bytes()) << sname;
    }
    m.data = data.data();
    m.scales = scales.empty() ? nullptr : scales.data();
    ASSERT_EQ(m.data_bytes(), static_cast<int64_t>(data.size())) << info.name;
    std::vector<float> row(static_cast<size_t>(m.cols));
    for (int64_t r = 0; r < m.rows; ++r) {
      decode_row(m, r, row.data());
      ASSERT_EQ(std::memcmp(row.data(), want.data() + r * m.cols, row.size() * 4), 0) << info.name << " row " << r;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 12);
}

// The benchmark command: JSON with exactly the documented fields, and a forced unknown path is
// an error that names the variable.
TEST(KernelBench, JsonFieldsAndForcedPath) {
  auto r = test::run_dsv4("bench kernels --n 16 --format fp4 --seconds 0 --threads 2 --json", "", 300);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto doc = nlohmann::ordered_json::parse(r.out);
  ASSERT_EQ(doc.size(), 2u);  // w1/w3 and w2 shapes
  for (const auto& j : doc) {
    std::vector<std::string> keys;
    for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
    EXPECT_EQ(keys, (std::vector<std::string>{"format", "rows", "cols", "n", "mode", "path", "tuning", "seconds", "weight_gbps",
                                              "gflops", "dram_gbps", "fma_gflops"}));
    EXPECT_EQ(j["format"], "fp4");
    EXPECT_EQ(j["n"], 16);
    EXPECT_EQ(j["mode"], "fast");
    EXPECT_GT(j["gflops"].get<double>(), 0.0);
    EXPECT_GT(j["dram_gbps"].get<double>(), 0.0);
    EXPECT_GT(j["fma_gflops"].get<double>(), 0.0);
  }
  auto bad = test::run_dsv4("bench kernels --n nope");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--n"), std::string::npos) << bad.err;
}

TEST(KernelBench, UnknownForcedPathNamesTheVariable) {
  std::string out;
  const int status = platform::run_shell(std::string("DSV4_KERNELS=sse9 ") + DSV4_BINARY + " bench kernels --n 16 --format fp4 2>&1", &out);
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("DSV4_KERNELS=sse9: expected one of auto, scalar, avx2, avxvnni, avx512"), std::string::npos) << out;
}

}  // namespace
}  // namespace dsv4::kernels
