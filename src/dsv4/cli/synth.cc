// dsv4 synth: writes a synthetic checkpoint (real V4 Flash geometry by default) or, with
// --demo, the small deterministic demo model with a tokenizer.
#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "dsv4/cli/commands.h"
#include "dsv4/synth/synth.h"
#include "dsv4/util/error.h"

namespace dsv4::cli {

namespace {

// The preset's geometry with every flag the user set (non-zero; hash layers >= 0) on top.
SynthOptions with_overrides(const SynthCliOptions& o) {
  SynthOptions s = synth_preset(o.preset == "pro" ? SynthPreset::kPro : SynthPreset::kFlash);
  const SynthOptions& f = o.options;
  s.out = f.out;
  s.layers = f.layers;
  s.seed = f.seed;
  s.shard_bytes = f.shard_bytes;
  s.mtp_layers = f.mtp_layers;
  if (f.hash_layers >= 0) s.hash_layers = f.hash_layers;
  if (!o.compress_ratios.empty()) {
    if (o.compress_ratios.size() != size_t(f.layers))
      fail("--compress-ratios gives {} ratios for --layers {}", o.compress_ratios.size(), f.layers);
    s.compress_ratios.clear();
    for (int64_t r : o.compress_ratios) {
      if (r != 0 && r != 4 && r != 128) fail("--compress-ratios: {} is not 0, 4 or 128", r);
      s.compress_ratios.push_back(static_cast<int>(r));
    }
  }
  auto set = [](auto& field, auto value) {
    if (value != 0) field = value;
  };
  set(s.experts, f.experts);
  set(s.experts_per_token, f.experts_per_token);
  set(s.hidden, f.hidden);
  set(s.moe_inter, f.moe_inter);
  set(s.heads, f.heads);
  set(s.head_dim, f.head_dim);
  set(s.rope_dim, f.rope_dim);
  set(s.q_lora, f.q_lora);
  set(s.o_groups, f.o_groups);
  set(s.o_lora, f.o_lora);
  set(s.index_heads, f.index_heads);
  set(s.index_head_dim, f.index_head_dim);
  set(s.index_topk, f.index_topk);
  set(s.vocab, f.vocab);
  return s;
}

}  // namespace

int synth(const SynthCliOptions& o) {
  SynthOptions s = o.demo ? demo_synth_options(o.options.out) : with_overrides(o);
  s.layout = parse_tensor_layout(o.layout);
  if (o.routing_skew == "real") {
    if (o.demo) fail("--routing-skew applies to a synthetic checkpoint, not --demo");
    s.routing = real_routing_skew();
  }
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
