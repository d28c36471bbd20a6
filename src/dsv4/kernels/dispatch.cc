// Chooses the instruction-set path once, at first use: DSV4_KERNELS if set, else the best the
// CPU supports. The choice is a pointer to an immutable table, initialized thread-safely.
#include <cstdlib>
#include <string>

#include "dsv4/kernels/kernels_internal.h"
#include "dsv4/util/error.h"

namespace dsv4::kernels::detail {

bool cpu_supports(const std::string& path) {
  if (path == "scalar") return true;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (path == "avx2")
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
           __builtin_cpu_supports("bmi2");
  if (path == "avx512")
    return cpu_supports("avx2") && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
#endif
  return false;
}

namespace {

const Table* compiled(const std::string& name) {
  if (name == "scalar") return &scalar_table();
  if (name == "avx2") return avx2_table();
  if (name == "avx512") return avx512_table();
  return nullptr;
}

const Table& choose() {
  const char* env = std::getenv("DSV4_KERNELS");
  if (env && *env) return table_by_name(env);
  for (const char* name : {"avx512", "avx2"}) {
    const Table* t = compiled(name);
    if (t && cpu_supports(name)) return *t;
  }
  return scalar_table();
}

}  // namespace

const Table& table_by_name(const std::string& name) {
  if (name != "scalar" && name != "avx2" && name != "avx512")
    fail("DSV4_KERNELS={}: unknown kernel path (use scalar, avx2 or avx512)", name);
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
  if (detail::avx2_table() && detail::cpu_supports("avx2")) out.push_back("avx2");
  if (detail::avx512_table() && detail::cpu_supports("avx512")) out.push_back("avx512");
  return out;
}

}  // namespace dsv4::kernels
