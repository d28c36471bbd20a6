#include "dsv4/model/workspace.h"

#include <algorithm>
#include <type_traits>

#include "dsv4/model/rope.h"
#include "dsv4/util/error.h"

namespace dsv4 {
namespace {

struct Shape {
  int64_t T, D, hc, QL, H, hd, W, G, R, IH, Id, topk, E, K, I, half, max_ratio;
  int64_t attend_rows, index_entries, comp_width;
  int slots;
};

Shape shape_of(const ModelConfig& c, int64_t rows, int64_t context, int threads) {
  Shape s{};
  s.T = rows;
  s.D = c.hidden_size;
  s.hc = c.hc_mult;
  s.QL = c.q_lora_rank;
  s.H = c.num_heads;
  s.hd = c.head_dim;
  s.W = c.sliding_window;
  s.G = c.o_groups;
  s.R = c.o_lora_rank;
  s.IH = c.index_n_heads;
  s.Id = c.index_head_dim;
  s.topk = c.index_topk;
  s.E = c.n_routed_experts;
  s.K = c.n_experts_per_token;
  s.I = c.moe_intermediate;
  s.half = c.rope_dim / 2;
  s.max_ratio = 1;
  int64_t entries = 0;  // most compressed entries one query attends to
  for (const LayerSpec& l : c.layers) {
    if (l.compress_ratio == 0) continue;
    s.max_ratio = std::max<int64_t>(s.max_ratio, l.compress_ratio);
    if (l.kind == AttentionKind::kCSA) {
      entries = std::max<int64_t>(entries, s.topk);
      s.index_entries = std::max<int64_t>(s.index_entries, context / l.compress_ratio + 1);
    } else {
      entries = std::max<int64_t>(entries, context / l.compress_ratio + 1);
    }
  }
  s.attend_rows = s.W + entries;
  s.comp_width = std::max(2 * s.hd, 2 * s.Id);
  s.slots = std::max(1, 8 * threads);
  return s;
}

// The widest input of an attention or indexer projection (wq_a/wkv: D, wq_b: q_lora, wo_a:
// hd*H/G, wo_b: G*R): what ForwardWorkspace::dense_in is sized for.
int64_t dense_cols(const Shape& s) { return std::max({s.D, s.QL, s.hd * s.H / s.G, s.G * s.R}); }

}  // namespace

// The one list of buffers: the constructor sizes them, bytes() adds them up.
template <typename Visit>
void ForwardWorkspace::for_each_buffer(ForwardWorkspace* ws, const ModelConfig& c, int64_t rows, int64_t context,
                                       int threads, bool mtp, Visit&& visit) {
  const Shape s = shape_of(c, rows, context, threads);
  const int64_t T = s.T;
  auto v = [&](auto member, int64_t n) { visit(ws ? &(ws->*member) : nullptr, static_cast<size_t>(n)); };
  using W = ForwardWorkspace;
  v(&W::X, T * s.hc * s.D);
  v(&W::x, T * s.D);
  v(&W::y, T * s.D);
  v(&W::embed_raw, s.D);
  v(&W::mix_pre, T * s.hc);
  v(&W::mix_post, T * s.hc);
  v(&W::mix_comb, T * s.hc * s.hc);
  v(&W::mix_m, T * (2 + s.hc) * s.hc);
  v(&W::mix_normed, T * s.hc * s.D);
  v(&W::mix_out, s.hc * s.D);
  for (int k = 0; k < 2; ++k) {
    visit(ws ? &ws->rope_cos[k] : nullptr, static_cast<size_t>(T * s.half));
    visit(ws ? &ws->rope_sin[k] : nullptr, static_cast<size_t>(T * s.half));
  }
  v(&W::entry_cos, s.half);
  v(&W::entry_sin, s.half);
  v(&W::qr, T * s.QL);
  v(&W::q, T * s.H * s.hd);
  v(&W::kv_rows, (s.W - 1 + T) * s.hd);
  v(&W::o, T * s.H * s.hd);
  v(&W::og, T * (s.H / s.G) * s.hd);
  v(&W::z, T * s.G * s.R);
  v(&W::attend_scores, s.slots * ForwardWorkspace::kAttendHeadBlock * s.attend_rows);
  v(&W::attend_row_ptrs, s.slots * s.attend_rows);
  v(&W::comp_kv, T * s.comp_width);
  v(&W::comp_gate, T * s.comp_width);
  v(&W::pool_slots, 2 * s.max_ratio);
  v(&W::pooled, std::max(s.hd, s.Id));
  v(&W::index_q, T * s.IH * s.Id);
  v(&W::index_weight, T * s.IH);
  v(&W::index_scores, s.slots * s.index_entries);
  v(&W::index_order, s.slots * s.index_entries);
  v(&W::picks, T * s.topk);
  v(&W::pick_count, T);
  v(&W::router_logits, T * s.E);
  v(&W::router_score, s.E);
  v(&W::router_biased, s.E);
  v(&W::router_order, s.E);
  v(&W::route_experts, T * s.K);
  v(&W::route_weights, T * s.K);
  v(&W::user_offset, s.E + 1);
  v(&W::users, T * s.K);
  v(&W::needed, s.E);
  v(&W::pending, s.E);
  v(&W::shared_out, T * s.D);
  v(&W::routed_out, T * s.K * s.D);
  v(&W::expert_x, T * s.D);
  v(&W::expert_y, T * s.D);
  v(&W::ffn_g, T * s.I);
  v(&W::ffn_u, T * s.I);
  v(&W::slot_order, s.K);
  v(&W::ranked, T * 2 * s.K);
  v(&W::guess, s.E);
  v(&W::guessed, s.E);
  v(&W::pass_tokens, T);
  v(&W::kv_all, T * s.hd);
  v(&W::batch_logits, std::min<int64_t>(T, kHeadRows) * c.vocab_size);
  if (!mtp) return;
  v(&W::mtp_next, T);
  v(&W::mtp_chain, s.hc * s.D);
  v(&W::mtp_logits, c.vocab_size);
  v(&W::mtp_saved, kMtpMaxChain * (s.hd + s.hc * s.D));
}

ForwardWorkspace::ForwardWorkspace(const ModelConfig& c, int64_t rows, int64_t ctx, int threads, bool mtp) {
  if (rows < 1) fail("internal: a forward workspace needs at least one row, got {}", rows);
  const Shape s = shape_of(c, rows, ctx, threads);
  max_rows = rows;
  context = ctx;
  scratch_slots = s.slots;
  attend_rows = s.attend_rows;
  index_entries = s.index_entries;
  for_each_buffer(this, c, rows, ctx, threads, mtp, [](auto* buffer, size_t n) { buffer->assign(n, {}); });
  // The quantized activations grow to their largest shape now, never during a pass.
  std::vector<float> zeros(static_cast<size_t>(rows * std::max({s.D, s.I, dense_cols(s)})), 0.0f);
  kernels::prepare_input(zeros.data(), rows, s.D, kernels::Numerics::kFast, &ffn_in);
  kernels::prepare_input(zeros.data(), rows, s.I, kernels::Numerics::kFast, &down_in);
  kernels::prepare_input(zeros.data(), rows, dense_cols(s), kernels::Numerics::kFast, &dense_in);
}

uint64_t ForwardWorkspace::bytes(const ModelConfig& c, int64_t rows, int64_t ctx, int threads, bool mtp) {
  uint64_t total = 0;
  for_each_buffer(nullptr, c, rows, ctx, threads, mtp, [&](auto* buffer, size_t n) {
    using Element = typename std::remove_pointer_t<decltype(buffer)>::value_type;
    total += n * sizeof(Element);
  });
  return total + kernels::quantized_input_bytes(rows, c.hidden_size) +
         kernels::quantized_input_bytes(rows, c.moe_intermediate) +
         kernels::quantized_input_bytes(rows, dense_cols(shape_of(c, rows, ctx, threads)));
}

Pass Pass::part(size_t i) const {
  if (parts.empty()) return *this;
  const PassPart& r = parts[i];
  Pass q = *this;
  q.T = r.T;
  q.pos0 = r.pos0;
  q.undo = r.undo;
  q.parts = {};
  q.row0 = r.row0;
  return q;
}

size_t Pass::part_of_row(int64_t r) const {
  if (parts.empty()) return 0;
  // Parts are in row order: the last one starting at or before r.
  const auto after = std::upper_bound(parts.begin(), parts.end(), r,
                                      [](int64_t row, const PassPart& part) { return row < part.row0; });
  return static_cast<size_t>(after - parts.begin()) - 1;
}

const float* Pass::cos(const LayerSpec& l, int64_t t) const {
  return ws.rope_cos[rope_variant(l)].data() + row(t) * (c.rope_dim / 2);
}
const float* Pass::sin(const LayerSpec& l, int64_t t) const {
  return ws.rope_sin[rope_variant(l)].data() + row(t) * (c.rope_dim / 2);
}

}  // namespace dsv4
