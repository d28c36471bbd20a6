"""Routing statistics of a model from the engine's own expert trace.

    dsv4 tokenize -t models/demo/tokenizer.json < text > ids.txt
    dsv4 bench -m models/demo --ram 1G --prompt-file ids.txt --chunk 1 --gen-tokens 1 \
        --ssd-probe-bytes 4M --trace-out trace.txt
    /usr/bin/python3 tools/demo_model/routing_stats.py --trace trace.txt --config models/demo/config.json

With --chunk 1 every prompt token is its own forward pass, so the trace's acquire events
(`A layer expert`, in the order the engine asked for them) split into tokens where the layer
index goes back down. Reports per layer: the share of routed requests that go to the top 10 %
of experts (popularity skew), how many of a token's experts the previous token also used, and
an LRU cache over all (layer, expert) pairs at 7 / 12 / 17.5 % of them (the real V4 Flash
figures: 46 / 57 / 68 % on a code trace), split into hash-routed and scored layers — beside
uniformly random routing with the same shape as the baseline.
"""
import argparse
import collections
import json
import random


def tokens_from_trace(path):
    """[[(layer, [experts])...] per token] from the acquire events."""
    toks, cur, last_layer = [], collections.OrderedDict(), -1
    for line in open(path):
        parts = line.split()
        if not parts or parts[0] != "A":
            continue
        layer, expert = int(parts[1]), int(parts[2])
        if layer < last_layer:
            toks.append(cur)
            cur = collections.OrderedDict()
        cur.setdefault(layer, []).append(expert)
        last_layer = layer
    if cur:
        toks.append(cur)
    return toks


def lru(requests, slots):
    """Hit rates (all, and per layer) of an LRU cache of `slots` (layer, expert) entries."""
    cache = collections.OrderedDict()
    hits = collections.Counter()
    total = collections.Counter()
    for key in requests:
        total[key[0]] += 1
        if key in cache:
            hits[key[0]] += 1
            cache.move_to_end(key)
        else:
            cache[key] = True
            if len(cache) > slots:
                cache.popitem(last=False)
    return hits, total


def stats(toks, n_layers, n_experts, k, hash_layers, label):
    top_n = max(1, round(0.1 * n_experts))
    per_layer = []
    for layer in range(n_layers):
        counts = collections.Counter()
        overlap, pairs = 0, 0
        prev = None
        for t in toks:
            es = t.get(layer, [])
            counts.update(es)
            if prev is not None and es:
                overlap += len(set(es) & set(prev))
                pairs += 1
            prev = es
        n = sum(counts.values())
        top = sum(c for _, c in counts.most_common(top_n))
        per_layer.append({"layer": layer, "hash": layer < hash_layers, "requests": n,
                          "top10pct_share": top / n if n else 0.0,
                          "prev_token_overlap": overlap / (pairs * k) if pairs else 0.0})
    requests = [(layer, e) for t in toks for layer, es in t.items() for e in es]
    total_experts = n_layers * n_experts
    lru_rates = {}
    for share in (0.07, 0.12, 0.175):
        slots = max(1, round(share * total_experts))
        hits, total = lru(requests, slots)
        h_hash = sum(hits[l] for l in range(hash_layers))
        t_hash = sum(total[l] for l in range(hash_layers))
        lru_rates[f"{share * 100:g}%"] = {
            "slots": slots, "hit_rate": sum(hits.values()) / max(1, len(requests)),
            "hash_layers": h_hash / max(1, t_hash),
            "scored_layers": (sum(hits.values()) - h_hash) / max(1, len(requests) - t_hash)}
    return {"label": label, "tokens": len(toks), "top10pct_experts": top_n, "layers": per_layer, "lru": lru_rates}


def uniform_baseline(n_tokens, n_layers, n_experts, k, seed=1):
    rng = random.Random(seed)
    return [collections.OrderedDict((l, rng.sample(range(n_experts), k)) for l in range(n_layers))
            for _ in range(n_tokens)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--json")
    a = ap.parse_args()
    cfg = json.load(open(a.config))
    L, E, K, Hh = cfg["num_hidden_layers"], cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["num_hash_layers"]
    toks = tokens_from_trace(a.trace)
    bad = [i for i, t in enumerate(toks) if len(t) != L or any(len(v) != K for v in t.values())]
    if bad:
        raise SystemExit(f"{a.trace}: {len(bad)} tokens without {K} experts in each of {L} layers (use --chunk 1)")
    out = {"trained": stats(toks, L, E, K, Hh, "trained model, engine trace"),
           "uniform": stats(uniform_baseline(len(toks), L, E, K), L, E, K, Hh, "uniformly random routing")}
    for r in out.values():
        print(f"== {r['label']}: {r['tokens']} tokens; top {r['top10pct_experts']} of {E} experts = 10 %")
        for l in r["layers"]:
            print(f"  layer {l['layer']} ({'hash' if l['hash'] else 'scored'}): top-10% share "
                  f"{l['top10pct_share']:.3f}, previous token's experts reused {l['prev_token_overlap']:.3f}")
        for share, v in r["lru"].items():
            print(f"  LRU {share} of experts ({v['slots']} slots): hit {v['hit_rate']:.3f} "
                  f"(hash layers {v['hash_layers']:.3f}, scored layers {v['scored_layers']:.3f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
