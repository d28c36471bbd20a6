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

// The matrix-vector kernels differ by core. fp4_matvec512 and fp8_rows512 (16 rows per
// 512-bit step) were chosen on Intel, where they beat the AVX2 kernels of the time; the 256-bit
// kernels compiled here (VNNI, 32 registers) have not been measured there or on Zen 5, so
// those keep them. Zen 4 splits each 512-bit operation into two 256-bit halves and has a
// 32 KiB L1d:
// - FP4: fp4_matvec512's 16 interleaved row streams ran at about 60 % of the two-phase kernel's
//   speed (one linear stream, prefetched into L2): two threads from DRAM, alternating `bench
//   kernels --n 1` runs, medians 14.3 / 12.9 GB/s (w1/w3 / w2) against 22.8 / 22.4;
// - FP8: fp8_rows (8 rows per step) took 0.87x, 0.92x and 0.93x of fp8_rows512's time for
//   1-3 activation rows (one thread, in cache), and the tiles 0.75-1.0x for 4-8 rows (two
//   threads from DRAM), so these cores route FP8 as the AVX2 table does.
const Table& avx512_table(bool split_512) {
  static const Table wide{"avx512",        dsv4_simd::matmul_rows<true>, dsv4_simd::quantize_rows, dsv4_simd::dot,
                          dsv4_simd::axpy, dsv4_simd::dot_many,          dsv4_simd::axpy_many,     dsv4_simd::fma_probe512,
                          dsv4_simd::read_probe, ""};
  static const Table split = [] {  // the same table but for the matrix-vector kernels
    Table t = wide;
    t.matmul_rows = dsv4_simd::matmul_rows<false>;
    t.tuning = "256-bit FP4 and FP8 matrix-vector kernels, for cores that split 512-bit operations";
    return t;
  }();
  return split_512 ? split : wide;
}

}  // namespace dsv4::kernels::detail
