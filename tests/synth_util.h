// The small synthetic checkpoint the synth and layout tests write: 8 experts, a 256-wide model,
// every block of V4 at a size that synthesizes in well under a second.
#pragma once

#include <string>

#include "dsv4/synth/synth.h"

namespace dsv4::test {

inline SynthOptions small_synth(const std::string& out, int layers) {
  SynthOptions o;
  o.out = out;
  o.layers = layers;
  o.experts = 8;
  o.experts_per_token = 2;
  o.hidden = 256;
  o.heads = 4;
  o.head_dim = 64;
  o.rope_dim = 16;
  o.q_lora = 64;
  o.o_groups = 2;
  o.o_lora = 32;
  o.moe_inter = 128;
  o.vocab = 300;
  o.index_heads = 4;
  o.index_head_dim = 32;
  o.index_topk = 8;
  o.sliding_window = 16;
  o.drop_page_cache = false;
  return o;
}

}  // namespace dsv4::test
