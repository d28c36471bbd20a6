// The AVX-512 path (compiled with -mavx512f/bw/vl/dq/vnni). It is the AVX2 code recompiled
// (EVEX encodings, 32 vector registers: no spills in the register tiles) with the fast FP4
// integer products done by AVX-512 VNNI (vpdpbusd instead of vpmaddubsw + vpmaddwd in the
// matrix-vector kernel, vpdpwssd instead of vpmaddwd + vpaddd in the batched one) on 512-bit
// registers (16 rows per register), the batched float kernel on 512-bit registers (two rows
// per register, same lanes), and a
// 512-bit FMA probe so the machine limit it reports is this path's real FP32 peak. The
// results are the same bits (integer block sums are exact; the float order is unchanged).
// gcc 12's AVX-512 headers build results from _mm*_undefined_*() values (cast, broadcast and
// extract intrinsics), which -Wuninitialized reports as used uninitialized once inlined; they are
// don't-care lanes by design. clang does not warn.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define DSV4_SIMD_VNNI 1
#define DSV4_SIMD_AVX512 1
#include "dsv4/kernels/kernels_x86.inc"

namespace dsv4_simd {
namespace {

double fma_probe512(int64_t iters) {
  const __m512 m = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
  __m512 a0 = _mm512_set1_ps(1.0f), a1 = _mm512_set1_ps(1.1f), a2 = _mm512_set1_ps(1.2f), a3 = _mm512_set1_ps(1.3f),
         a4 = _mm512_set1_ps(1.4f), a5 = _mm512_set1_ps(1.5f), a6 = _mm512_set1_ps(1.6f), a7 = _mm512_set1_ps(1.7f),
         a8 = _mm512_set1_ps(1.8f), a9 = _mm512_set1_ps(1.9f), a10 = _mm512_set1_ps(2.0f), a11 = _mm512_set1_ps(2.1f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = _mm512_fmadd_ps(a0, m, c), a1 = _mm512_fmadd_ps(a1, m, c), a2 = _mm512_fmadd_ps(a2, m, c);
    a3 = _mm512_fmadd_ps(a3, m, c), a4 = _mm512_fmadd_ps(a4, m, c), a5 = _mm512_fmadd_ps(a5, m, c);
    a6 = _mm512_fmadd_ps(a6, m, c), a7 = _mm512_fmadd_ps(a7, m, c), a8 = _mm512_fmadd_ps(a8, m, c);
    a9 = _mm512_fmadd_ps(a9, m, c), a10 = _mm512_fmadd_ps(a10, m, c), a11 = _mm512_fmadd_ps(a11, m, c);
  }
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                           _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
  // (the reduce/extract intrinsics trip a false -Wuninitialized in gcc 12's headers)
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  volatile float sink = out[0] + out[15];
  (void)sink;
  return 2.0 * 16 * 12 * static_cast<double>(iters);
}

}  // namespace
}  // namespace dsv4_simd

namespace dsv4::kernels::detail {

// The few-row kernels differ by core (FewRowRouting in x86/routing.inc has the measurements).
// Intel keeps the 512-bit matrix-vector kernels it was tuned on, and so does any core not
// named here; Zen 4 routes as the AVX2 table does; Zen 5 takes the 256-bit kernels for up to
// 3 rows and fp8_rows512 for 4-8 FP8 rows.
const Table& avx512_table(Avx512Core core) {
  static const Table intel{"avx512",        dsv4_simd::matmul_rows<dsv4_simd::kRoutingIntel>, dsv4_simd::quantize_rows,
                           dsv4_simd::dot,  dsv4_simd::axpy,                dsv4_simd::dot_many,
                           dsv4_simd::axpy_many, dsv4_simd::fma_probe512,   dsv4_simd::read_probe,
                           ""};
  static const Table zen4 = [] {  // the same table but for the few-row kernels
    Table t = intel;
    t.matmul_rows = dsv4_simd::matmul_rows<dsv4_simd::kRouting256>;
    t.tuning = "256-bit FP4 and FP8 matrix-vector kernels, for cores that split 512-bit operations";
    return t;
  }();
  static const Table zen5 = [] {
    Table t = intel;
    t.matmul_rows = dsv4_simd::matmul_rows<dsv4_simd::kRoutingZen5>;
    t.tuning = "256-bit FP4 and FP8 matrix-vector kernels up to 3 rows, 512-bit FP8 for 4-8 rows (Zen 5)";
    return t;
  }();
  switch (core) {
    case Avx512Core::kZen4: return zen4;
    case Avx512Core::kZen5: return zen5;
    case Avx512Core::kIntel: break;
  }
  return intel;
}

}  // namespace dsv4::kernels::detail
