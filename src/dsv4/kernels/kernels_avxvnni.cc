// The AVX2 path with AVX-VNNI (this file is compiled with -mavx2 -mfma -mf16c -mbmi2
// -mavxvnni): the AVX2 code with its integer products fused, for cores that have AVX-VNNI but
// no AVX-512 (Intel client cores from Alder Lake on). The FP4 matrix-vector kernel's span
// takes four `vpdpbusd` and a shift where AVX2 needs four `vpmaddubsw`, two `vpaddw`, two
// `vpmaddwd` and a `vpaddd`; the batched kernels' `vpmaddwd` + `vpaddd` become one
// `vpdpwssd`. The integer sums are exact either way: the same bits.
#define DSV4_SIMD_VNNI 1
#include "dsv4/kernels/kernels_x86.inc"

namespace dsv4::kernels::detail {

const Table& avxvnni_table() {
  static const Table t{"avxvnni",       dsv4_simd::matmul_rows<dsv4_simd::kRouting256>, dsv4_simd::quantize_rows,
                       dsv4_simd::dot,  dsv4_simd::axpy,      dsv4_simd::dot_many,      dsv4_simd::axpy_many,
                       dsv4_simd::fma_probe, dsv4_simd::read_probe, ""};
  return t;
}

}  // namespace dsv4::kernels::detail
