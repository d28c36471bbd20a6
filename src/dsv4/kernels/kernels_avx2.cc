// The AVX2 + FMA + F16C path (this file is compiled with -mavx2 -mfma -mf16c -mbmi2).
#include "dsv4/kernels/kernels_x86.inc"

namespace dsv4::kernels::detail {

const Table& avx2_table() {
  static const Table t{"avx2",          dsv4_simd::matmul_rows<dsv4_simd::kRouting256>, dsv4_simd::quantize_rows, dsv4_simd::dot,
                       dsv4_simd::axpy, dsv4_simd::dot_many,    dsv4_simd::axpy_many,     dsv4_simd::fma_probe,
                       dsv4_simd::read_probe,   ""};
  return t;
}

}  // namespace dsv4::kernels::detail
