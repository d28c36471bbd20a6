"""DeepSeek V4 in compact PyTorch (float32), written from ../shared/docs/dsv4-spec.md §3-4.

One module per block, named as in the spec; parameter names are the hub checkpoint's names
(`layers.L.attn.wq_a.weight`, …) except the routed experts, which are stacked per layer
(`ffn.w1` [E, I, D] ↔ hub `ffn.experts.e.w1.weight`). Semantics are those of the Hugging Face
reference in float32 (no activation quantization, no Hadamard), which `dsv4 --numerics
reference` reproduces:

* mHC: 4 residual streams; per sub-block 24 mixes from the RMS-normalized flattened streams →
  pre (sigmoid + eps), post (2·sigmoid), a 4×4 combination made doubly stochastic by Sinkhorn
  (softmax rows + eps, then 20 column / 19 row normalizations, column last).
* Attention: low-rank q with per-head RMS scaling, one shared K=V head, interleaved RoPE on the
  last rope dims (θ=rope_theta on sliding-only layers, θ=compress_rope_theta with YaRN on
  compressed layers), a sliding window that includes the current token, compressed entries
  (HCA: all completed windows; CSA: top-k of the lightning indexer), a per-head sink, inverse
  RoPE on the output and the grouped low-rank output projection.
* MoE: sqrt(softplus) router scores, hash routing through tid2eid on the first layers, biased
  top-k (bias for selection only) elsewhere, weights normalized and scaled, clamped SwiGLU
  experts plus one shared expert.
* MTP (mtp.0): predicts token t+2 from the trunk's pre-head streams at t and the embedding of
  token t+1.

Training extras (not in the checkpoint semantics): the indexer is trained by a KL loss towards
the main attention's distribution over compressed entries (its inputs detached, as in DSA);
fake quantization of the weights (quant.py) for quantization-aware training.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Config:
    def __init__(self, d):
        self.raw = dict(d)
        self.vocab = d["vocab_size"]
        self.dim = d["hidden_size"]
        self.n_layers = d["num_hidden_layers"]
        self.n_heads = d["num_attention_heads"]
        self.head_dim = d["head_dim"]
        self.rope_dim = d["qk_rope_head_dim"]
        self.q_lora = d["q_lora_rank"]
        self.o_groups = d["o_groups"]
        self.o_lora = d["o_lora_rank"]
        self.n_experts = d["n_routed_experts"]
        self.top_k = d["num_experts_per_tok"]
        self.inter = d["moe_intermediate_size"]
        self.n_hash = d["num_hash_layers"]
        self.route_scale = d["routed_scaling_factor"]
        self.swiglu_limit = d["swiglu_limit"]
        self.hc = d["hc_mult"]
        self.sinkhorn_iters = d["hc_sinkhorn_iters"]
        self.hc_eps = d["hc_eps"]
        self.index_heads = d["index_n_heads"]
        self.index_dim = d["index_head_dim"]
        self.index_topk = d["index_topk"]
        self.window = d["sliding_window"]
        self.eps = d["rms_norm_eps"]
        self.rope_theta = d["rope_theta"]
        self.compress_theta = d["compress_rope_theta"]
        self.yarn = d["rope_scaling"]
        self.ratios = d["compress_ratios"]
        self.bos = d["bos_token_id"]
        self.eos = d["eos_token_id"]


def rms_norm(x, weight, eps):
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x if weight is None else x * weight


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, fake_quant(self.weight, "bf16"), self.eps)


class Linear(nn.Module):
    """y = x·Wᵀ; `quant` names the checkpoint format ('fp8', 'bf16', 'f32') for QAT and export."""

    def __init__(self, n_in, n_out, quant, std=None):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) * (std if std is not None else n_in ** -0.5))
        self.quant = quant

    def forward(self, x):
        return F.linear(x, fake_quant(self.weight, self.quant))


# Fake quantization hook: quant.py installs the real function when QAT is on.
_FAKE_QUANT = {"on": False, "fn": None}


def fake_quant(w, kind):
    if not _FAKE_QUANT["on"] or kind == "f32":
        return w
    return _FAKE_QUANT["fn"](w, kind)


def rope_inv_freq(cfg, compressed):
    """float32 inverse frequencies, as the reference builds them (YaRN on compressed layers)."""
    r = cfg.rope_dim
    theta = cfg.compress_theta if compressed else cfg.rope_theta
    pos_freq = torch.tensor([float(theta) ** (2 * i / r) for i in range(r // 2)], dtype=torch.float64).float()
    inv = 1.0 / pos_freq
    if not compressed:
        return inv
    y = cfg.yarn
    orig, factor = y["original_max_position_embeddings"], y["factor"]

    def corr(rot):
        return r * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))

    low = max(0.0, math.floor(corr(y["beta_fast"])))
    high = min(float(r - 1), math.ceil(corr(y["beta_slow"])))
    if low == high:
        high += 0.001
    ramp = ((torch.arange(r // 2, dtype=torch.float64) - low) / (high - low)).float().clamp(0, 1)
    extrapolation = 1.0 - ramp
    interpolated = 1.0 / (float(factor) * pos_freq)
    return interpolated * (1.0 - extrapolation) + inv * extrapolation


def rope_table(inv_freq, positions):
    """cos, sin [n, r/2] for integer positions (angle rounded once to float32)."""
    ang = positions.float()[:, None] * inv_freq[None, :]
    return torch.cos(ang.double()).float(), torch.sin(ang.double()).float()


def apply_rope(x, cos, sin, r, inverse=False):
    """Interleaved rotation of the last r dims of x [..., n, heads?, d]; cos/sin broadcast to
    [..., n, 1?, r/2] by the caller's shapes."""
    head, tail = x[..., :-r], x[..., -r:]
    re, im = tail[..., 0::2], tail[..., 1::2]
    s = -sin if inverse else sin
    out = torch.stack([re * cos - im * s, re * s + im * cos], dim=-1).flatten(-2)
    return torch.cat([head, out], dim=-1)


# ---- mHC -------------------------------------------------------------------------------------

def sinkhorn(c, iters, eps):
    c = torch.softmax(c, dim=-1) + eps
    c = c / (c.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + eps)
        c = c / (c.sum(-2, keepdim=True) + eps)
    return c


class HyperConnection(nn.Module):
    """hc_pre / hc_post around one sub-block (spec §3.3); parameters live on the block."""

    @staticmethod
    def mixes(X, fn, eps):
        f = X.flatten(-2)  # [B, T, hc·D]
        return F.linear(rms_norm(f, None, eps), fn)

    @staticmethod
    def pre(cfg, X, fn, base, scale):
        hc = cfg.hc
        m = HyperConnection.mixes(X, fn, cfg.eps)
        pre = torch.sigmoid(m[..., :hc] * scale[0] + base[:hc]) + cfg.hc_eps
        post = 2.0 * torch.sigmoid(m[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])
        comb = m[..., 2 * hc:] * scale[2] + base[2 * hc:]
        comb = sinkhorn(comb.unflatten(-1, (hc, hc)), cfg.sinkhorn_iters, cfg.hc_eps)
        x = (pre.unsqueeze(-1) * X).sum(-2)
        return x, post, comb

    @staticmethod
    def post(y, X, post, comb):
        # X'_k = post_k·y + Σ_j C[j,k]·X_j
        out = post.unsqueeze(-1) * y.unsqueeze(-2)
        for j in range(X.shape[-2]):
            out = out + comb[..., j, :].unsqueeze(-1) * X[..., j:j + 1, :]
        return out

    @staticmethod
    def head(cfg, X, fn, base, scale):
        m = HyperConnection.mixes(X, fn, cfg.eps)
        pre = torch.sigmoid(m * scale[0] + base) + cfg.hc_eps
        return (pre.unsqueeze(-1) * X).sum(-2)


def hc_params(module, prefix, cfg, rows):
    hc, D = cfg.hc, cfg.dim
    fn = nn.Parameter(torch.randn(rows, hc * D) * 0.02)
    base = torch.zeros(rows)
    if rows == (2 + hc) * hc:
        base[:hc] = math.log(1 / (hc - 1))  # pre ≈ 1/hc each
        base[2 * hc:] = (torch.eye(hc) * 4.0).flatten()  # combination ≈ identity
    else:
        base[:] = math.log(1 / (hc - 1))
    setattr(module, prefix + "_fn", fn)
    setattr(module, prefix + "_base", nn.Parameter(base))
    setattr(module, prefix + "_scale", nn.Parameter(torch.ones(1 if rows == hc else 3)))


# ---- attention -------------------------------------------------------------------------------

class Compressor(nn.Module):
    """Pools each window of `ratio` tokens into one entry (spec §3.6). ratio 4 overlaps."""

    def __init__(self, cfg, ratio, dim):
        super().__init__()
        self.ratio, self.dim, self.overlap = ratio, dim, ratio == 4
        c = 2 if self.overlap else 1
        self.ape = nn.Parameter(torch.zeros(ratio, c * dim))
        self.wkv = Linear(cfg.dim, c * dim, "bf16")
        self.wgate = Linear(cfg.dim, c * dim, "bf16", std=0.02)
        self.norm = RMSNorm(dim, cfg.eps)
        self.cfg = cfg

    def forward(self, x, inv_freq):
        """x [B, T, D] → entries [B, T//ratio, dim], roped at the window start."""
        B, T, _ = x.shape
        m, d = self.ratio, self.dim
        N = T // m
        if N == 0:
            return x.new_zeros(B, 0, d)
        x = x[:, :N * m]
        kv = self.wkv(x).view(B, N, m, -1)
        g = (self.wgate(x).view(B, N, m, -1) + self.ape)
        if self.overlap:
            # Entry w pools slots [A-half of window w-1 ; B-half of window w].
            kv_a, kv_b = kv[..., :d], kv[..., d:]
            g_a, g_b = g[..., :d], g[..., d:]
            prev_kv = torch.cat([kv_a.new_zeros(B, 1, m, d), kv_a[:, :-1]], dim=1)
            prev_g = torch.cat([g_a.new_full((B, 1, m, d), float("-inf")), g_a[:, :-1]], dim=1)
            kv = torch.cat([prev_kv, kv_b], dim=2)
            g = torch.cat([prev_g, g_b], dim=2)
        p = torch.softmax(g, dim=2)
        e = (p * kv).sum(2)
        e = self.norm(e)
        cos, sin = rope_table(inv_freq, torch.arange(N) * m)
        return apply_rope(e, cos, sin, self.cfg.rope_dim)


class Indexer(nn.Module):
    """Lightning indexer (spec §3.7): scores compressed entries for each query."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wq_b = Linear(cfg.q_lora, cfg.index_heads * cfg.index_dim, "fp8")
        self.weights_proj = Linear(cfg.dim, cfg.index_heads, "bf16")
        self.compressor = Compressor(cfg, 4, cfg.index_dim)

    def forward(self, x, qr, inv_freq, cos, sin):
        """scores [B, T, N] (−inf where not yet visible)."""
        cfg = self.cfg
        B, T, _ = x.shape
        k = self.compressor(x, inv_freq)  # [B, N, Id]
        q = self.wq_b(qr).view(B, T, cfg.index_heads, cfg.index_dim)
        q = apply_rope(q, cos[:, None], sin[:, None], cfg.rope_dim)
        w = self.weights_proj(x) * cfg.index_heads ** -0.5  # [B, T, IH]
        dots = torch.relu(torch.einsum("bthd,bnd->bthn", q, k)) * cfg.index_dim ** -0.5
        return torch.einsum("bthn,bth->btn", dots, w)


def top_k_lowest_index(scores, k):
    """Indices of the k largest scores; equal scores keep the lower index (the engine's rule;
    torch.topk leaves tie order unspecified, and ReLU sums tie at exactly 0)."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]


def visible_compressed(T, N, ratio):
    """[T, N] bool: entry w is visible to query t iff w < (t+1)//ratio."""
    t = torch.arange(T)[:, None]
    w = torch.arange(N)[None, :]
    return w < (t + 1) // ratio


class Attention(nn.Module):
    def __init__(self, cfg, ratio):
        super().__init__()
        self.cfg, self.ratio = cfg, ratio
        H, hd = cfg.n_heads, cfg.head_dim
        self.wq_a = Linear(cfg.dim, cfg.q_lora, "fp8")
        self.q_norm = RMSNorm(cfg.q_lora, cfg.eps)
        self.wq_b = Linear(cfg.q_lora, H * hd, "fp8")
        self.wkv = Linear(cfg.dim, hd, "fp8")
        self.kv_norm = RMSNorm(hd, cfg.eps)
        self.wo_a = Linear(H * hd // cfg.o_groups, cfg.o_groups * cfg.o_lora, "fp8")
        self.wo_b = Linear(cfg.o_groups * cfg.o_lora, cfg.dim, "fp8", std=(cfg.o_groups * cfg.o_lora) ** -0.5 * 0.5)
        self.attn_sink = nn.Parameter(torch.zeros(H))
        self.compressor = Compressor(cfg, ratio, hd) if ratio else None
        self.indexer = Indexer(cfg) if ratio == 4 else None
        self.register_buffer("inv_freq", rope_inv_freq(cfg, ratio != 0), persistent=False)

    def forward(self, x, aux):
        cfg = self.cfg
        B, T, _ = x.shape
        H, hd, r, W = cfg.n_heads, cfg.head_dim, cfg.rope_dim, cfg.window
        cos, sin = rope_table(self.inv_freq, torch.arange(T))
        qr = self.q_norm(self.wq_a(x))
        q = self.wq_b(qr).view(B, T, H, hd)
        q = rms_norm(q, None, cfg.eps)
        q = apply_rope(q, cos[:, None], sin[:, None], r)
        kv = self.kv_norm(self.wkv(x))
        kv = apply_rope(kv, cos, sin, r)  # [B, T, hd]

        scale = hd ** -0.5
        t = torch.arange(T)
        win = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - W)  # [T, T]
        s_win = torch.einsum("bthd,bsd->bhts", q, kv) * scale
        s_win = s_win.masked_fill(~win, float("-inf"))
        keys = [kv]
        scores = [s_win]
        if self.compressor is not None:
            comp = self.compressor(x, self.inv_freq)  # [B, N, hd]
            N = comp.shape[1]
            vis = visible_compressed(T, N, self.ratio)  # [T, N]
            s_comp = torch.einsum("bthd,bnd->bhtn", q, comp) * scale
            mask = vis[None, None]
            if self.indexer is not None and N > 0:
                # The indexer learns from detached inputs (its own loss); the selection itself has no gradient.
                iscore = self.indexer(x.detach(), qr.detach(), self.inv_freq, cos, sin)  # [B, T, N]
                iscore = iscore.masked_fill(~vis[None], float("-inf"))
                k = min(cfg.index_topk, N)
                top = top_k_lowest_index(iscore, k)
                chosen = torch.zeros_like(iscore, dtype=torch.bool).scatter_(-1, top, True) & vis[None]
                mask = chosen[:, None]
                if aux is not None and self.training:
                    # Target: the main attention's probability mass per entry over all visible entries.
                    with torch.no_grad():
                        full = torch.cat([s_win, s_comp.masked_fill(~vis[None, None], float("-inf"))], dim=-1)
                        p = torch.softmax(full, dim=-1)[..., T:].sum(1)  # [B, T, N]
                        p = p / p.sum(-1, keepdim=True).clamp_min(1e-9)
                    rows = vis.any(-1)  # queries with at least one entry
                    logq = torch.log_softmax(iscore[:, rows], dim=-1)
                    pt = p[:, rows]
                    kl = (pt * (torch.log(pt.clamp_min(1e-9)) - logq.masked_fill(pt == 0, 0.0))).sum(-1).mean()
                    aux.append(kl)
            scores.append(s_comp.masked_fill(~mask, float("-inf")))
            keys.append(comp)
        s = torch.cat(scores + [self.attn_sink.view(1, H, 1, 1).expand(B, H, T, 1)], dim=-1)
        p = torch.softmax(s, dim=-1)[..., :-1]
        allkeys = torch.cat(keys, dim=1)  # [B, T+N, hd]
        o = torch.einsum("bhts,bsd->bthd", p, allkeys)
        o = apply_rope(o, cos[:, None], sin[:, None], r, inverse=True)
        G = cfg.o_groups
        og = o.reshape(B, T, G, H // G * hd)
        wa = fake_quant(self.wo_a.weight, "fp8").view(G, cfg.o_lora, H // G * hd)
        z = torch.einsum("btgi,gri->btgr", og, wa).reshape(B, T, G * cfg.o_lora)
        return self.wo_b(z)


# ---- MoE -------------------------------------------------------------------------------------

def swiglu(g, u, limit):
    if limit > 0:
        g = g.clamp(max=limit)
        u = u.clamp(-limit, limit)
    return F.silu(g) * u


class Gate(nn.Module):
    def __init__(self, cfg, hashed, seed):
        super().__init__()
        self.cfg, self.hashed = cfg, hashed
        self.weight = nn.Parameter(torch.randn(cfg.n_experts, cfg.dim) * cfg.dim ** -0.5 * 0.1)
        self.quant = "bf16"
        if hashed:
            gen = torch.Generator().manual_seed(seed)
            t = torch.stack([torch.randperm(cfg.n_experts, generator=gen)[:cfg.top_k] for _ in range(cfg.vocab)])
            self.register_buffer("tid2eid", t.long())
        else:
            self.register_buffer("bias", torch.zeros(cfg.n_experts))

    def forward(self, x, tokens):
        cfg = self.cfg
        logits = F.linear(x, fake_quant(self.weight, "bf16"))
        score = torch.sqrt(F.softplus(logits))
        if self.hashed:
            idx = self.tid2eid[tokens]
        else:
            idx = top_k_lowest_index(score + self.bias, cfg.top_k)
        w = score.gather(-1, idx)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * cfg.route_scale
        return idx, w


class MoE(nn.Module):
    def __init__(self, cfg, hashed, seed):
        super().__init__()
        self.cfg = cfg
        E, I, D = cfg.n_experts, cfg.inter, cfg.dim
        self.gate = Gate(cfg, hashed, seed)
        self.w1 = nn.Parameter(torch.randn(E, I, D) * D ** -0.5)
        self.w3 = nn.Parameter(torch.randn(E, I, D) * D ** -0.5)
        self.w2 = nn.Parameter(torch.randn(E, D, I) * I ** -0.5 * 0.5)
        self.shared_experts = nn.Module()
        self.shared_experts.w1 = Linear(D, I, "fp8")
        self.shared_experts.w3 = Linear(D, I, "fp8")
        self.shared_experts.w2 = Linear(I, D, "fp8", std=I ** -0.5 * 0.5)
        self.load = None  # tokens per expert of the last forward (bias balancing)

    def forward(self, x, tokens):
        cfg = self.cfg
        B, T, D = x.shape
        xf = x.reshape(-1, D)
        idx, w = self.gate(xf, tokens.reshape(-1))
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=cfg.n_experts)
        self.load = counts.detach()
        tok = order // cfg.top_k
        xs = xf[tok]
        # split / unbind (not slicing) so the backward pass assembles each gradient once.
        w1 = fake_quant(self.w1, "fp4").unbind(0)
        w3 = fake_quant(self.w3, "fp4").unbind(0)
        w2 = fake_quant(self.w2, "fp4").unbind(0)
        sizes = counts.tolist()
        outs = []
        for e, xe in enumerate(torch.split(xs, sizes)):
            if sizes[e] == 0:
                continue
            h = swiglu(xe @ w1[e].t(), xe @ w3[e].t(), cfg.swiglu_limit)
            outs.append(h @ w2[e].t())
        ys = torch.cat(outs, dim=0) * w.reshape(-1)[order, None]
        y = torch.zeros_like(xf).index_add_(0, tok, ys)
        se = self.shared_experts
        y = y + se.w2(swiglu(se.w1(xf), se.w3(xf), cfg.swiglu_limit))
        return y.view(B, T, D)


# ---- blocks ----------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, cfg, layer_id, ratio, hashed):
        super().__init__()
        self.cfg = cfg
        hc_params(self, "hc_attn", cfg, (2 + cfg.hc) * cfg.hc)
        hc_params(self, "hc_ffn", cfg, (2 + cfg.hc) * cfg.hc)
        self.attn_norm = RMSNorm(cfg.dim, cfg.eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.eps)
        self.attn = Attention(cfg, ratio)
        self.ffn = MoE(cfg, hashed, seed=1000 + layer_id)

    def forward(self, X, tokens, aux):
        cfg = self.cfg
        x, post, comb = HyperConnection.pre(cfg, X, self.hc_attn_fn, self.hc_attn_base, self.hc_attn_scale)
        X = HyperConnection.post(self.attn(self.attn_norm(x), aux), X, post, comb)
        x, post, comb = HyperConnection.pre(cfg, X, self.hc_ffn_fn, self.hc_ffn_base, self.hc_ffn_scale)
        X = HyperConnection.post(self.ffn(self.ffn_norm(x), tokens), X, post, comb)
        return X


class MTPBlock(Block):
    def __init__(self, cfg, layer_id):
        super().__init__(cfg, layer_id, cfg.ratios[layer_id], hashed=False)
        D = cfg.dim
        self.e_proj = Linear(D, D, "fp8")
        self.h_proj = Linear(D, D, "fp8")
        self.enorm = RMSNorm(D, cfg.eps)
        self.hnorm = RMSNorm(D, cfg.eps)
        self.norm = RMSNorm(D, cfg.eps)
        hc_params(self, "hc_head", cfg, cfg.hc)

    def forward(self, H, next_emb, tokens, aux):
        cfg = self.cfg
        X = self.h_proj(self.hnorm(H)) + self.e_proj(self.enorm(next_emb)).unsqueeze(-2)
        X = super().forward(X, tokens, aux)
        return self.norm(HyperConnection.head(cfg, X, self.hc_head_fn, self.hc_head_base, self.hc_head_scale))


class Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        nn.init.normal_(self.embed.weight, std=1.0)
        self.layers = nn.ModuleList(
            [Block(cfg, i, cfg.ratios[i], hashed=i < cfg.n_hash) for i in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.dim, cfg.eps)
        self.head = Linear(cfg.dim, cfg.vocab, "bf16", std=cfg.dim ** -0.5 * 0.5)
        hc_params(self, "hc_head", cfg, cfg.hc)
        self.mtp = nn.ModuleList([MTPBlock(cfg, cfg.n_layers)])

    def moe_layers(self):
        return [l.ffn for l in self.layers] + [m.ffn for m in self.mtp]

    def trunk(self, tokens, aux=None):
        """Pre-head streams [B, T, hc, D]."""
        e = F.embedding(tokens, fake_quant(self.embed.weight, "bf16"))
        X = e.unsqueeze(-2).expand(*e.shape[:-1], self.cfg.hc, self.cfg.dim)
        for layer in self.layers:
            X = layer(X, tokens, aux)
        return X

    def logits_from_streams(self, X):
        cfg = self.cfg
        h = self.norm(HyperConnection.head(cfg, X, self.hc_head_fn, self.hc_head_base, self.hc_head_scale))
        return self.head(h)

    def forward(self, tokens, aux=None):
        return self.logits_from_streams(self.trunk(tokens, aux))

    def mtp_logits(self, X, tokens, aux=None):
        """Logits for token t+2 at positions 0..T-2 from streams X [B, T, hc, D] and tokens [B, T]."""
        emb = F.embedding(tokens[:, 1:], fake_quant(self.embed.weight, "bf16"))
        h = self.mtp[0](X[:, :-1], emb, tokens[:, :-1], aux)
        return self.head(h)
