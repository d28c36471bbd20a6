// The GPU tier's kernels against the CPU kernels (issue 45), on whatever Vulkan device the
// machine has: in CI Mesa's lavapipe (a CPU device). The validation layer is on and any message
// it reports fails the test. Skipped, saying why, only when there is no Vulkan device (or the
// binary was built without Vulkan); docs/numerics.md ("GPU tier") has what is compared how.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dsv4/gpu/backend.h"
#include "dsv4/kernels/formats.h"
#include "dsv4/kernels/kernels.h"
#include "dsv4/model/ops.h"
#include "dsv4/util/error.h"

namespace dsv4 {
namespace {

using kernels::Matrix;
using kernels::Numerics;
using kernels::WeightFormat;

class Gpu : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string why;
    if (gpu::list_devices(&why).empty()) {
      skip_reason() = why;
      return;
    }
    gpu::OpenOptions o;
    o.validation = true;
    o.on_message = [](const std::string& m) { messages().push_back(m); };
    backend() = gpu::open(o, &open_error());
  }
  static void TearDownTestSuite() { backend().reset(); }

  void SetUp() override {
    if (!skip_reason().empty()) GTEST_SKIP() << "no Vulkan device: " << skip_reason();
    ASSERT_TRUE(backend()) << "a Vulkan device exists but the tier did not open: " << open_error();
    messages().clear();
  }
  void TearDown() override {
    std::string all;
    for (const std::string& m : messages()) all += "\n  " + m;
    EXPECT_TRUE(messages().empty()) << "the validation layer reported:" << all;
  }

  static std::unique_ptr<gpu::Backend>& backend() {
    static std::unique_ptr<gpu::Backend> b;
    return b;
  }
  static std::vector<std::string>& messages() {
    static std::vector<std::string> m;
    return m;
  }
  static std::string& skip_reason() {
    static std::string s;
    return s;
  }
  static std::string& open_error() {
    static std::string s;
    return s;
  }
};

// A random matrix in `format` with its storage. FP8 codes include the NaN codes only when
// `nan_codes` (the fast numerics read them as +-480; the reference numerics give NaN, which a
// Vulkan device need not propagate). Scales stay in a range whose products are normal floats
// (a device may flush subnormals: docs/numerics.md).
struct TestMatrix {
  Matrix m;
  std::vector<uint8_t> data, scales;
  std::vector<uint16_t> bf16;
  std::vector<float> f32;
};

TestMatrix random_matrix(WeightFormat f, int64_t rows, int64_t cols, std::mt19937& rng, bool nan_codes) {
  TestMatrix t;
  t.m.format = f;
  t.m.rows = rows;
  t.m.cols = cols;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255), exponent(118, 134);
  switch (f) {
    case WeightFormat::kF32:
      t.f32.resize(static_cast<size_t>(rows * cols));
      for (float& v : t.f32) v = normal(rng);
      t.m.data = t.f32.data();
      break;
    case WeightFormat::kBF16:
      t.bf16.resize(static_cast<size_t>(rows * cols));
      for (uint16_t& v : t.bf16) v = f32_to_bf16(normal(rng));
      t.m.data = t.bf16.data();
      break;
    case WeightFormat::kFP8:
    case WeightFormat::kFP4:
      t.data.resize(static_cast<size_t>(t.m.data_bytes()));
      for (uint8_t& v : t.data) {
        v = static_cast<uint8_t>(byte(rng));
        if (f == WeightFormat::kFP8 && !nan_codes && (v & 0x7f) == 0x7f) v ^= 1;
      }
      t.scales.resize(static_cast<size_t>(t.m.scale_bytes()));
      for (uint8_t& v : t.scales) v = static_cast<uint8_t>(exponent(rng));
      t.m.data = t.data.data();
      t.m.scales = t.scales.data();
      break;
  }
  return t;
}

// Activations: Gaussian with a few large values and an all-zero 32-column block per row.
std::vector<float> random_activations(int64_t n, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (float& v : x) v = pick(rng) == 0 ? 40.0f * normal(rng) : normal(rng);
  for (int64_t i = 0; i < n && cols >= 64; ++i)
    for (int64_t c = 32; c < 64; ++c) x[static_cast<size_t>(i * cols + c)] = 0.0f;
  return x;
}

bool same_bits(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return std::memcmp(&a, &b, 4) == 0;
}

// Distance in units in the last place (same-sign finite floats).
int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if ((ia < 0) != (ib < 0)) return (a == b) ? 0 : INT64_MAX;
  return std::abs(static_cast<int64_t>(ia) - static_cast<int64_t>(ib));
}

struct Shape {
  int64_t rows, cols, n;
};

// Edge blocks (partial 32- and 128-column blocks, partial 128-row scale blocks), more than 64
// blocks per row (the integer shader's second pass), more than 8 activation rows (a second
// workgroup row), and a row longer than the scalar CPU path's 8192-column chunk.
const Shape kShapes[] = {{37, 200, 1}, {130, 394, 3}, {64, 2144, 8}, {33, 512, 11}, {3, 8256, 2}};

void expect_matmul_bits(gpu::Backend& gpu, WeightFormat f, Numerics numerics, uint32_t seed) {
  std::mt19937 rng(seed);
  for (const Shape& s : kShapes) {
    TestMatrix w = random_matrix(f, s.rows, s.cols, rng, numerics == Numerics::kFast);
    const std::vector<float> x = random_activations(s.n, s.cols, rng);
    std::vector<float> want(static_cast<size_t>(s.n * s.rows)), got(want.size(), -1.0f);
    kernels::matmul(w.m, x.data(), s.n, want.data(), numerics, nullptr);
    const gpu::BufferId id = gpu.upload(w.m);
    gpu.matmul(id, x.data(), s.n, got.data(), numerics);
    gpu.release(id);
    int64_t differ = 0;
    size_t first = 0;
    for (size_t k = 0; k < want.size(); ++k)
      if (!same_bits(want[k], got[k]) && differ++ == 0) first = k;
    EXPECT_EQ(differ, 0) << kernels::format_name(f) << " " << kernels::numerics_name(numerics) << " [" << s.rows
                         << ", " << s.cols << "] x " << s.n << ": " << differ << " of " << want.size()
                         << " outputs differ, first at " << first << ": cpu " << want[first] << " gpu " << got[first];
  }
}

TEST_F(Gpu, Fp4MatmulIsBitIdenticalInBothNumerics) {
  expect_matmul_bits(*backend(), WeightFormat::kFP4, Numerics::kFast, 1);
  expect_matmul_bits(*backend(), WeightFormat::kFP4, Numerics::kReference, 2);
}

TEST_F(Gpu, Fp8MatmulIsBitIdenticalInBothNumerics) {
  expect_matmul_bits(*backend(), WeightFormat::kFP8, Numerics::kFast, 3);
  expect_matmul_bits(*backend(), WeightFormat::kFP8, Numerics::kReference, 4);
}

TEST_F(Gpu, Bf16AndF32MatmulAreBitIdentical) {
  expect_matmul_bits(*backend(), WeightFormat::kBF16, Numerics::kFast, 5);
  expect_matmul_bits(*backend(), WeightFormat::kBF16, Numerics::kReference, 6);
  expect_matmul_bits(*backend(), WeightFormat::kF32, Numerics::kReference, 7);
}

// Outputs rows y_stride apart: the gaps keep what the caller had there.
TEST_F(Gpu, MatmulWritesOnlyItsRowsOfAStridedOutput) {
  std::mt19937 rng(8);
  TestMatrix w = random_matrix(WeightFormat::kFP4, 40, 96, rng, false);
  const std::vector<float> x = random_activations(3, 96, rng);
  const int64_t stride = 50;
  std::vector<float> want(static_cast<size_t>(3 * stride), 7.0f), got(want);
  kernels::matmul(w.m, x.data(), 3, want.data(), Numerics::kFast, nullptr, stride);
  const gpu::BufferId id = backend()->upload(w.m);
  backend()->matmul(id, x.data(), 3, got.data(), Numerics::kFast, stride);
  backend()->release(id);
  for (size_t k = 0; k < want.size(); ++k) ASSERT_TRUE(same_bits(want[k], got[k])) << k;
}

// Weights are held in their own formats: the device memory an upload takes is the checkpoint
// bytes of data and scales, nothing widened.
TEST_F(Gpu, UploadsKeepTheNativeFormat) {
  std::mt19937 rng(9);
  const uint64_t before = backend()->memory_used();
  TestMatrix fp4 = random_matrix(WeightFormat::kFP4, 64, 256, rng, false);
  TestMatrix fp8 = random_matrix(WeightFormat::kFP8, 130, 300, rng, false);
  TestMatrix bf16 = random_matrix(WeightFormat::kBF16, 8, 40, rng, false);
  const gpu::BufferId a = backend()->upload(fp4.m), b = backend()->upload(fp8.m), c = backend()->upload(bf16.m);
  EXPECT_EQ(backend()->memory_used() - before, static_cast<uint64_t>(64 * 128 + 64 * 8 + 130 * 300 + 2 * 3 + 8 * 40 * 2));
  backend()->release(a);
  backend()->release(b);
  backend()->release(c);
  EXPECT_EQ(backend()->memory_used(), before);
}

// RMSNorm: the sum follows the CPU's order exactly; the division and square root are the
// device's (Vulkan allows 2.5 and 3 ulps), so the bound is a few ulps, not bits.
TEST_F(Gpu, RmsNormIsWithinFourUlpsOfTheCpu) {
  std::mt19937 rng(10);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const int64_t n : {1, 7, 64, 1000, 4096}) {
    const int64_t rows = 3;
    std::vector<float> x(static_cast<size_t>(rows * n)), weight(static_cast<size_t>(n));
    for (float& v : x) v = 3.0f * normal(rng);
    for (float& v : weight) v = 1.0f + 0.1f * normal(rng);
    const gpu::BufferId wid = backend()->upload(weight.data(), n);
    for (const bool weighted : {true, false}) {
      std::vector<float> want(x.size()), got(x.size());
      ops::rms_norm_rows(x.data(), weighted ? weight.data() : nullptr, rows, n, 1e-6f, want.data());
      backend()->rms_norm(x.data(), weighted ? wid : gpu::kNoBuffer, rows, n, 1e-6f, got.data());
      int64_t worst = 0, identical = 0;
      for (size_t k = 0; k < want.size(); ++k) {
        worst = std::max(worst, ulps(want[k], got[k]));
        identical += same_bits(want[k], got[k]);
      }
      EXPECT_LE(worst, 4) << "n " << n << (weighted ? " weighted" : "");
      RecordProperty("rms_norm_identical_" + std::to_string(n), std::to_string(identical) + "/" + std::to_string(want.size()));
    }
    backend()->release(wid);
  }
}

TEST_F(Gpu, AnUploadOverTheMemoryLimitIsRefusedNamingTheNumbers) {
  gpu::OpenOptions o;
  o.validation = true;
  o.on_message = [](const std::string& m) { messages().push_back(m); };
  o.selection.memory_limit = 1000;
  std::string why;
  std::unique_ptr<gpu::Backend> small = gpu::open(o, &why);
  ASSERT_TRUE(small) << why;
  std::mt19937 rng(11);
  TestMatrix w = random_matrix(WeightFormat::kFP8, 64, 64, rng, false);  // 4096 + 1 bytes
  try {
    small->upload(w.m);
    FAIL() << "an upload over the limit was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4097 bytes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1000-byte limit"), std::string::npos) << e.what();
  }
  EXPECT_EQ(small->memory_used(), 0u);
}

TEST_F(Gpu, ADeviceNumberThatDoesNotExistIsRefused) {
  gpu::OpenOptions o;
  o.selection = gpu::parse_selection("99", 0);
  std::string why;
  EXPECT_FALSE(gpu::open(o, &why));
  EXPECT_NE(why.find("numbered from 0"), std::string::npos) << why;
  o.selection.mode = gpu::Selection::Mode::kAuto;
  o.selection.memory_limit = uint64_t{1} << 62;
  EXPECT_FALSE(gpu::open(o, &why));
  EXPECT_NE(why.find("--gpu-mem"), std::string::npos) << why;
}

// Runs everywhere (no device needed).
TEST(GpuSelection, ParsesAutoOffAndDeviceNumbers) {
  EXPECT_EQ(gpu::parse_selection("auto", 0).mode, gpu::Selection::Mode::kAuto);
  EXPECT_EQ(gpu::parse_selection("off", 0).mode, gpu::Selection::Mode::kOff);
  const gpu::Selection two = gpu::parse_selection("2", 1 << 20);
  EXPECT_EQ(two.mode, gpu::Selection::Mode::kIndex);
  EXPECT_EQ(two.index, 2);
  EXPECT_EQ(two.memory_limit, uint64_t{1} << 20);
  EXPECT_THROW(gpu::parse_selection("gpu0", 0), Error);
  EXPECT_THROW(gpu::parse_selection("-1", 0), Error);
  std::string why;
  gpu::OpenOptions off;
  off.selection.mode = gpu::Selection::Mode::kOff;
  EXPECT_FALSE(gpu::open(off, &why));
  EXPECT_EQ(why, "--gpu off");
  EXPECT_EQ(gpu::describe().rfind("gpu: ", 0), 0u) << gpu::describe();
}

}  // namespace
}  // namespace dsv4
