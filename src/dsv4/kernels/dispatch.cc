// Chooses the instruction-set path once, at first use: DSV4_KERNELS if set, else the best the
// CPU (CPUID) and the OS (XCR0) support. The choice is a pointer to an immutable table, initialized thread-safely.
#include <cstdlib>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <string>

#include "dsv4/kernels/kernels_internal.h"
#include "dsv4/util/error.h"

namespace dsv4::kernels::detail {

namespace {

#if defined(__x86_64__) || defined(__i386__)
// CPUID + XGETBV directly: clang 14's __builtin_cpu_supports knows neither "f16c" nor "bmi2",
// and the OS must also have enabled the AVX / AVX-512 register state (XCR0).
struct CpuFeatures {
  bool avx2 = false, avxvnni = false, avx512 = false;
  // Which AVX-512 variant: AMD family 19h is Zen 4 (Zen 3, the same family, has no AVX-512),
  // 1Ah is Zen 5; later AMD families get Zen 5's until measured.
  Avx512Core avx512_core = Avx512Core::kIntel;
};

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const bool amd = b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163;  // "AuthenticAMD"
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const unsigned base_family = (a >> 8) & 0xf;
  const unsigned family = base_family == 0xf ? base_family + ((a >> 20) & 0xff) : base_family;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28), f16c = c & (1u << 29);
  if (!osxsave || !avx) return f;
  unsigned xlo, xhi;
  __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
  const bool ymm_state = (xlo & 0x6u) == 0x6u, zmm_state = (xlo & 0xe6u) == 0xe6u;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const bool avx2 = b & (1u << 5), bmi2 = b & (1u << 8), avx512f = b & (1u << 16), avx512dq = b & (1u << 17),
             avx512bw = b & (1u << 30), avx512vl = b & (1u << 31), vnni = c & (1u << 11);
  f.avx2 = ymm_state && avx2 && fma && f16c && bmi2;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avxvnni = f.avx2 && (a & (1u << 4));
  f.avx512 = f.avx2 && zmm_state && avx512f && avx512dq && avx512bw && avx512vl && vnni;
  if (amd && family == 0x19) f.avx512_core = Avx512Core::kZen4;
  if (amd && family >= 0x1a) f.avx512_core = Avx512Core::kZen5;
  return f;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}
#endif

}  // namespace

bool cpu_supports(const std::string& path) {
  if (path == "scalar") return true;
#if defined(__aarch64__)
  if (path == "neon") return true;  // Advanced SIMD is part of every ARMv8-A core
#endif
#if defined(__x86_64__) || defined(__i386__)
  if (path == "avx2") return cpu_features().avx2;
  if (path == "avxvnni") return cpu_features().avxvnni;
  if (path == "avx512") return cpu_features().avx512;
#endif
  return false;
}

namespace {

const Table* compiled(const std::string& name) {
  if (name == "scalar") return &scalar_table();
#if defined(__x86_64__)
  if (name == "avx2") return &avx2_table();
  if (name == "avxvnni") return &avxvnni_table();
  if (name == "avx512") return &avx512_table(cpu_features().avx512_core);  // the variant for this core
#endif
#if defined(__aarch64__)
  if (name == "neon") return &neon_table();
#endif
  return nullptr;
}

// DSV4_KERNELS is read here, not passed in: the choice is fixed for the process at the first
// kernel call, and library users and tests never pass through the command line (which
// validates the variable against the settings table and forces this choice at start-up).
const Table& choose() {
  const char* env = std::getenv("DSV4_KERNELS");
  if (env && *env && std::string(env) != "auto") return table_by_name(env);
  for (const char* name : {"avx512", "avxvnni", "avx2", "neon"}) {
    const Table* t = compiled(name);
    if (t && cpu_supports(name)) return *t;
  }
  return scalar_table();
}

}  // namespace

const Table& table_by_name(const std::string& name) {
  if (name != "scalar" && name != "avx2" && name != "avxvnni" && name != "avx512" && name != "neon")
    fail("DSV4_KERNELS={}: unknown kernel path (use auto, scalar, avx2, avxvnni, avx512 or neon)", name);
  const Table* t = compiled(name);
  if (!t) fail("DSV4_KERNELS={}: this build has no {} kernels", name, name);
  if (!cpu_supports(name)) fail("DSV4_KERNELS={}: this CPU does not support {}", name, name);
  return *t;
}

const Table& active_table() {
  static const Table& t = choose();
  return t;
}

}  // namespace dsv4::kernels::detail

namespace dsv4::kernels {

std::vector<std::string> runnable_paths() {
  std::vector<std::string> out{"scalar"};
  for (const char* name : {"neon", "avx2", "avxvnni", "avx512"})
    if (detail::compiled(name) && detail::cpu_supports(name)) out.push_back(name);
  return out;
}

}  // namespace dsv4::kernels
