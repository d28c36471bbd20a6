// dsv4 synth: writes a synthetic checkpoint (real V4 Flash geometry by default) or, with
// --demo, the small deterministic demo model with a tokenizer.
#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "dsv4/cli/commands.h"
#include "dsv4/synth/synth.h"

namespace dsv4::cli {

int synth(const SynthCliOptions& o) {
  SynthOptions s = o.demo ? demo_synth_options(o.options.out) : o.options;
  if (o.demo) s.out = o.options.out;
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  synthesize(s, [&](uint64_t done, uint64_t total) {
    if (!o.quiet)
      std::fprintf(stderr, "dsv4 synth: %.2f / %.2f GB written (%.0f s)\n", done / 1e9, total / 1e9, seconds());
  });
  if (!o.quiet)
    std::fprintf(stderr, "dsv4 synth: wrote %s%s in %.1f s\n", s.out.c_str(),
                 o.demo ? " (demo model with random weights)" : "", seconds());
  return 0;
}

}  // namespace dsv4::cli
