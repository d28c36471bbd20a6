#!/usr/bin/python3
"""Formats the results of scripts/bench_all.sh as docs/benchmarks.md's tables (stdlib only).

  bench_table.py RESULTS_DIR                      the markdown, to stdout
  bench_table.py --mtp-acceptance MAIN.f32 MTP.f32  first-draft acceptance from `dsv4 score` logits
  bench_table.py --serve-client PORT TOKENS PID    one streamed completion against `dsv4 serve`

RESULTS_DIR holds, per command KEY: KEY.cmd (the command line), KEY.json or KEY.r<N>.json (its
stdout, one per round), KEY.fail (why it did not run or failed), and machine.txt.
"""
import array
import glob
import http.client
import json
import os
import statistics
import sys
import time

HEADER = "| figure | measured | vs same-run limit | target | machine, path | date | cmd |"
RULE = "|---|---|---|---|---|---|---|"


class Results:
    def __init__(self, d):
        self.d = d
        self.meta = {}
        with open(os.path.join(d, "machine.txt")) as f:
            for line in f:
                k, _, v = line.rstrip("\n").partition("=")
                self.meta[k] = v
        self.quick = self.meta.get("quick") == "1"
        self.date = self.meta.get("date", "?")

    def runs(self, key):
        """The parsed JSON of every round of KEY (empty when it failed or did not run)."""
        files = sorted(glob.glob(os.path.join(self.d, key + ".r*.json")))
        one = os.path.join(self.d, key + ".json")
        if os.path.exists(one):
            files = [one] + files
        out = []
        for f in files:
            if os.path.exists(f[: -len(".json")] + ".fail"):
                continue
            try:
                with open(f) as fh:
                    out.append(json.load(fh))
            except (ValueError, OSError):
                pass
        return out

    def why(self, key):
        fails = sorted(glob.glob(os.path.join(self.d, key + "*.fail")))
        if fails:
            with open(fails[0]) as f:
                return "n/a (" + f.read().strip().replace("|", "/")[:160] + ")"
        if not glob.glob(os.path.join(self.d, key + "*.cmd")):
            return "n/a (not run)"
        return "n/a (no figure in its output)"

    def cmds(self, label):
        out = []
        for f in sorted(glob.glob(os.path.join(self.d, label + "*.cmd"))):
            with open(f) as fh:
                out.append(fh.read().strip())
        return out

    def machine(self, path=""):
        m = self.meta
        s = "this machine"
        return s + (", " + path if path else "")


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def f(x, nd=2):
    return "—" if x is None else f"{x:.{nd}f}"


def fl(xs, nd=2, sep=", "):
    return sep.join(f(x, nd) for x in xs)


def dig(j, *path):
    for p in path:
        if j is None:
            return None
        j = j.get(p) if isinstance(j, dict) else None
    return j


class Table:
    def __init__(self, res, anchor, title, intro):
        self.res, self.rows = res, []
        self.title, self.intro, self.labels = title, intro, []

    def row(self, figure, measured, vs="—", target="—", path="", cmd=""):
        self.rows.append((figure, measured, vs, target, self.res.machine(path), self.res.date, cmd))

    def na(self, figure, key, target="—", cmd="", path=""):
        self.row(figure, self.res.why(key), "—", target, path, cmd)

    def print(self, labels):
        print(f"## {self.title}\n")
        if self.intro:
            print(self.intro + "\n")
        block = False
        for lab in labels:
            cs = self.res.cmds(lab)
            if cs:
                block = True
                print(f"    # {lab}")
                for c in cs:
                    print("    " + c)
        if block:
            print()
        print(HEADER)
        print(RULE)
        for r in self.rows:
            print("| " + " | ".join(str(c) for c in r) + " |")
        print()


def short_tuning(t):
    """The kernel table's name: the last parenthesis of its description ("Zen 5"), or all of it."""
    if t and "(" in t and t.endswith(")"):
        return t[t.rfind("(") + 1:-1] + " table"
    return t


def kpath(rows):
    if not rows:
        return ""
    r = rows[0]
    return r["path"] + (f" ({short_tuning(r['tuning'])})" if r.get("tuning") else "")


def kfind(rows, fmt, nrows, n):
    for r in rows:
        if r["format"] == fmt and r["rows"] == nrows and r["n"] == n:
            return r
    return None


KPATH = {"k1": "avx2", "k3": "avx2", "k3t1": "avx2", "k4a": "avx2", "k2": "default path", "k2t1": "default path",
         "k4": "default path", "k5": "default path", "k6": "default path"}
SHAPE = {"w1/w3": ("fp4", 2048), "w2": ("fp4", 4096), "wq_b": ("fp8", 32768), "wo_b": ("fp8", 4096), "head": ("bf16", 129280)}


def kernels(res):
    t = Table(res, "kernels", "Kernels", "`kernels::matmul` at V4 Flash shapes; n = 1 against the DRAM read rate, "
              "n ≥ 128 against the FP32 FMA peak, both re-measured right after each case.")
    def k(key):
        v = res.runs(key)
        return v[0] if v else None

    def matvec(key, name, threads, target):
        rows = k(key)
        fmt, nr = SHAPE[name]
        r = kfind(rows or [], fmt, nr, 1)
        if not r:
            return t.na(f"{fmt.upper()} matvec n=1, {name}, {threads}", key, target, key, KPATH[key])
        t.row(f"{fmt.upper()} matvec n=1, {name}, {threads}", f"{r['weight_gbps']:.1f} GB/s ({r['seconds'] * 1e3:.3f} ms)",
              f"{100 * r['weight_gbps'] / r['dram_gbps']:.0f} % of DRAM ({r['dram_gbps']:.1f} GB/s)", target, kpath(rows), key)

    for name in ("w1/w3", "w2"):
        matvec("k1", name, "2 threads", "≥ 70 % of DRAM")
    for name in ("w1/w3", "w2"):
        matvec("k2", name, "2 threads", "—")
    for key in ("k3t1", "k2t1"):
        for name in ("w1/w3", "w2"):
            matvec(key, name, "1 thread", "—")
    for key in ("k4", "k4a"):
        for name in ("wq_b", "wo_b"):
            matvec(key, name, "2 threads", "—")
    rows = k("k4")
    for name in ("wq_b", "wo_b"):
        fmt, nr = SHAPE[name]
        few = sorted((r for r in rows or [] if r["format"] == fmt and r["rows"] == nr and r["n"] > 1), key=lambda r: r["n"])
        if few:
            t.row(f"FP8 few rows, {name} n = " + " / ".join(str(r["n"]) for r in few),
                  " / ".join(f"{r['seconds'] * 1e3:.2f}" for r in few) + " ms", "—", "—", kpath(rows), "k4")
        else:
            t.na(f"FP8 few rows, {name}", "k4", cmd="k4", path="default path")
    for key, target in (("k3", "≥ 120 %"), ("k5", "—")):
        rows = k(key)
        ns = sorted({r["n"] for r in rows or [] if r["n"] >= 128})
        if not ns:
            t.na("GEMMs n ≥ 128", key, target, key, KPATH[key])
        for n in ns:
            for fmt, names in (("fp4", ("w1/w3", "w2")), ("fp8", ("wq_b", "wo_b"))):
                rs = [kfind(rows, fmt, SHAPE[nm][1], n) for nm in names]
                if not all(rs):
                    continue
                t.row(f"{fmt.upper()} GEMM {', '.join(names)}, n = {n}", ", ".join(f"{r['gflops']:.1f}" for r in rs) + " GFLOP/s",
                      ", ".join(f"{100 * r['gflops'] / r['fma_gflops']:.0f} %" for r in rs) + " of FMA", target, kpath(rows), key)
    rows = k("k6")
    hs = sorted((r for r in rows or [] if r["format"] == "bf16"), key=lambda r: r["n"])
    if hs:
        h1 = hs[0]
        t.row("BF16 head n = " + " / ".join(str(r["n"]) for r in hs), " / ".join(f"{r['seconds'] * 1e3:.1f}" for r in hs) + " ms",
              f"n = 1: {100 * h1['weight_gbps'] / h1['dram_gbps']:.0f} % of DRAM ({h1['dram_gbps']:.1f} GB/s)" if h1["n"] == 1 else "—",
              "—", kpath(rows), "k6")
    else:
        t.na("BF16 head", "k6", cmd="k6", path="default path")
    t.print(["k1", "k2", "k3", "k4", "k5", "k6"])


def mpath(j):
    d = j.get("details", {})
    return d.get("kernels", "") + (f" ({short_tuning(d['kernel_tuning'])})" if d.get("kernel_tuning") else "")


def prefill(res):
    t = Table(res, "prefill", "Prefill", "")
    for path in ("default", "avx2"):
        res1, str1 = res.runs(f"p1.{path}"), res.runs(f"p2.{path}")
        if res1:
            j = res1[0]
            t.row(f"{j['details']['prompt_tokens']:,} tokens resident", f"TTFT {j['ttft_s']:.2f} s, {j['prefill_tok_s']:.1f} tok/s, "
                  f"{j['prefill_gflops']:.0f} GFLOP/s effective", f"{100 * j['prefill_vs_fma']:.0f} % of FMA ({j['fma_gflops']:.0f} GFLOP/s)",
                  "≥ 60 %", mpath(j), "p1")
        else:
            t.na("prefill resident", f"p1.{path}", "≥ 60 %", "p1", path)
        if str1:
            j = str1[0]
            d = j["details"]
            ps = d.get("prefill_stats", {})
            vs = f"{j['ttft_s'] / res1[0]['ttft_s']:.2f}x the resident TTFT" if res1 else "—"
            t.row(f"{d['prompt_tokens']:,} tokens streamed, {d['expert_slots']} of {d['total_experts']} cached "
                  f"({100 * d['expert_slots'] / d['total_experts']:.1f} %)",
                  f"TTFT {j['ttft_s']:.2f} s; {ps.get('reads', 0):,} expert reads, {ps.get('bytes_read', 0) / 1e9:.1f} GB",
                  vs, "≤ 1.25x", mpath(j), "p2 vs p1")
        else:
            t.na("prefill streamed", f"p2.{path}", "≤ 1.25x", "p2", path)
    for path in ("default", "avx2"):
        s, l = res.runs(f"p3.{path}.short"), res.runs(f"p3.{path}.long")
        if s and l:
            s, l = s[0], l[0]
            t.row(f"{l['details']['prompt_tokens']:,} against {s['details']['prompt_tokens']:,} tokens (csa1)",
                  f"{l['prefill_tok_s']:.1f} / {s['prefill_tok_s']:.1f} tok/s", f"{l['prefill_tok_s'] / s['prefill_tok_s']:.2f}x",
                  "≥ 0.70x", mpath(l), "p3")
        else:
            t.na("long against short prompt (csa1)", f"p3.{path}", "≥ 0.70x", "p3", path)
    sb = [(nm, res.runs(k)) for nm, k in (("flash", "p1.default"), ("csa1", "p3.default.short"))]
    if all(v for _, v in sb):
        t.row("session state per token of context", ", ".join(f"{v[0]['session_bytes_per_token']:,.0f} B ({nm})" for nm, v in sb),
              "plan: " + ", ".join(f"{v[0]['details']['planned_session_bytes_per_token']:,.0f} B" for _, v in sb), "—", "", "p1, p3")
    t.print(["p1", "p2", "p3"])


def decode(res):
    t = Table(res, "decode", "Decode", "")
    d2 = res.runs("d2")
    if d2:
        j = d2[0]
        t.row("resident decode", f"{j['decode_tok_s']:.2f} tok/s ({1e3 * j['decode_s_per_token']:.1f} ms per token)", "—", "—", mpath(j), "d2")
    else:
        t.na("resident decode", "d2", cmd="d2")
    for sfx, label in (("", "2 threads"), ("1", "1 thread")):
        r, s = res.runs("d3.res" + sfx), res.runs("d3.str" + sfx)
        if r and s:
            rs = med([j["decode_s_per_token"] for j in r])
            ss = med([j["decode_s_per_token"] for j in s])
            d = s[0]["details"]
            ratios = [b["decode_s_per_token"] / a["decode_s_per_token"] for a, b in zip(r, s)]
            t.row(f"streamed decode, {d['expert_slots']} of {d['total_experts']} cached ({100 * d['expert_slots'] / d['total_experts']:.1f} %), {label}",
                  f"{ss:.4f} s/token; {med([j['details']['decode_blocked_s_per_token'] for j in s]):.3f} s blocked on I/O; "
                  f"{med([j['bytes_read_per_token'] for j in s]) / 1e6:.0f} MB read per token",
                  f"{ss / rs:.2f}x resident ({rs:.4f} s/token; rounds {fl(ratios)}); SSD probe "
                  f"{med([j['ssd_gbps_measured'] for j in s]):.1f} GB/s, store's reads {med([j['details']['achieved_read_gbps'] for j in s]):.1f} GB/s",
                  "≤ 1.15x", mpath(s[0]), "d3" + (" `--threads 1`" if sfx else ""))
        else:
            t.na(f"streamed decode, {label}", "d3.str" + sfx, "≤ 1.15x", "d3")
    r, s, x = res.runs("d3.res"), res.runs("d3.str"), res.runs("d3.strx")
    if r and x:
        rs, xs = med([j["decode_s_per_token"] for j in r]), med([j["decode_s_per_token"] for j in x])
        t.row("streamed decode, `--lookahead exact` (hash layers only)", f"{xs:.4f} s/token; "
              f"{med([j['details']['decode_blocked_s_per_token'] for j in x]):.3f} s blocked; "
              f"{med([j['bytes_read_per_token'] for j in x]) / 1e6:.0f} MB read per token", f"{xs / rs:.2f}x resident", "—",
              mpath(x[0]), "d3 `--lookahead exact`")
    if r and s:
        t.row("load, streamed / resident", f"{med([j['load_s'] for j in s]):.1f} / {med([j['load_s'] for j in r]):.1f} s", "—", "—", "", "d3")
        t.row("peak RSS, streamed", f"{max(j['peak_rss_bytes'] for j in s) / 2**30:.2f} GiB",
              f"for a {s[0]['details']['budget_bytes'] / 2**30:.2f} GiB budget", "≤ budget", "", "d3")
    t.print(["d2", "d3"])


CEILING = {4: 2.71, 8: 3.82}  # flash4's bytes ceiling (perf-model.md); not computed for other checkpoints


def sessions(res):
    t = Table(res, "sessions", "Sessions", "")
    for key, kind in (("s1", "resident"), ("s2", "streamed")):
        v = res.runs(key)
        if not v:
            t.na(f"sessions, {kind}", key, cmd=key)
            continue
        j = v[0]
        cached = "" if j["all_resident"] else f" ({j['expert_slots']} of {j['total_experts']}, {100 * j['expert_slots'] / j['total_experts']:.1f} %)"
        for b in j["by_sessions"]:
            n = b["sessions"]
            vs = "—"
            if n > 1 and j["all_resident"] and not res.quick and n in CEILING:
                vs = f"{100 * b['vs_one_session'] / CEILING[n]:.0f} % of the {CEILING[n]:.2f}x bytes ceiling"
            target = {("resident", 4): "≥ 2x", ("streamed", 4): "≥ 1.3x at ≤ 25 % cached"}.get((kind, n), "—")
            t.row(f"{n} session{'s' if n > 1 else ''}, {kind}{cached}",
                  f"{b['aggregate_tok_s']:.2f} tok/s aggregate = {b['vs_one_session']:.2f}x one session; ITL p50 / p99 "
                  f"{b['itl_s_p50']:.3f} / {b['itl_s_p99']:.3f} s; {b['bytes_read_per_token'] / 1e6:.0f} MB read per token",
                  vs, target, j["kernels"], key)
    v = res.runs("s3")
    if v:
        a = [j["admission"] for j in v]
        t.row(f"ITL p99 while a {a[0]['prompt_tokens']:,}-token prompt is admitted",
              ", ".join(f"{x['itl_s_p99_while_admitted']:.3f} s" for x in a) + "; admission " + ", ".join(f"{x['admit_s']:.0f} s" for x in a),
              ", ".join(f"{x['p99_admitted_vs_p50_without']:.2f}x" for x in a) + " the p50 without it (" +
              ", ".join(f"{x['itl_s_p50_without']:.3f} s" for x in a) + ")", "≤ 2x", v[0]["kernels"], "s3")
    else:
        t.na("ITL p99 while a prompt is admitted", "s3", "≤ 2x", "s3")
    t.print(["s1", "s2", "s3"])


def spec_row(t, res, key, figure, target="—", cmd=""):
    v = res.runs(key)
    if not v or "spec" not in v[0]:
        return t.na(figure, key, target, cmd, "avx2" if "avx2" in key else "default path")
    j = v[0]
    s = j["spec"]
    t.row(f"{figure} ({s['tokens_per_pass']:.2f} tokens per pass)",
          f"{s['decode_tok_s']:.2f} / {s['off_decode_tok_s']:.2f} tok/s; {s['bytes_read_per_token'] / 1e6:.0f} / "
          f"{s['off_bytes_read_per_token'] / 1e6:.0f} MB read per token", f"{s['speedup']:.2f}x plain", target, mpath(j), cmd)


def spec(res):
    t = Table(res, "speculative-decoding", "Speculative decoding", "")
    spec_row(t, res, "x1.avx2.k1", "oracle k = 1, resident", cmd="x1")
    spec_row(t, res, "x1.avx2.k2", "oracle k = 2, resident", "≥ 1.8x", "x1")
    spec_row(t, res, "x1.default.k2", "oracle k = 2, resident", "≥ 1.8x", "x1")
    spec_row(t, res, "x2.res", "oracle k = 3, resident", "≥ 1.8x", "x2")
    spec_row(t, res, "x2.str", "oracle k = 3, streamed", cmd="x2")
    spec_row(t, res, "x2.auto", "auto on random weights", "no loss", "x2")
    spec_row(t, res, "x3.mtp1", "demo, MTP k = 1", "≥ 1.5x", "x3")
    spec_row(t, res, "x3.mtp2", "demo, MTP k = 2", "≥ 1.5x", "x3")
    spec_row(t, res, "x3.oracle1", "demo, oracle k = 1", cmd="x3")
    spec_row(t, res, "x3.auto4", "demo, auto (n-gram) k ≤ 4", cmd="x3")
    acc = os.path.join(res.d, "x4.acc")
    if os.path.exists(acc) and open(acc).read().strip():
        a = json.loads(open(acc).read())
        t.row("demo, MTP first-draft acceptance, teacher-forced", f"{a['acceptance']:.2f} ({a['tokens']:,} tokens)", "—", "—", "", "x4")
    else:
        t.na("demo, MTP first-draft acceptance", "x4", cmd="x4")
    t.print(["x1", "x2", "x3", "x4"])


def gbench(res, key):
    """Google Benchmark JSON: {name without aggregate suffix: entry}, medians when repeated."""
    v = res.runs(key)
    out = {}
    for b in (v[0].get("benchmarks", []) if v else []):
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        name = b.get("run_name", b["name"])
        if b.get("run_type") == "aggregate" or name not in out:
            out[name] = b
    return out


def by_prefix(bs, prefix):
    for name, b in bs.items():
        if name.startswith(prefix):
            return b
    return None


def tokenizer(res):
    t = Table(res, "tokenizer", "Tokenizer", "")
    bs = gbench(res, "t1")
    load = by_prefix(bs, "BM_TokenizerLoadV3")
    if load:
        t.row("load tokenizer.json", f"{load['real_time']:.0f} {load['time_unit']}", "—", "< 300 ms", "1 thread", "t1")
    else:
        t.na("load tokenizer.json", "t1", "< 300 ms", "t1")
    times = os.path.join(res.d, "t2.times")
    if os.path.exists(times):
        w = [float(e) - float(s) for s, e in (line.split() for line in open(times))]
        t.row("process start + load + exit", f"{min(w):.2f}-{max(w):.2f} s wall (median {med(w):.2f})", "—", "< 0.3 s", "", "t2")
    else:
        t.na("process start + load + exit", "t2", "< 0.3 s", "t2")
    for prefix, fig, target in (("BM_TokenizerEncodeEnglishWarm", "encode English, word cache warm", 5),
                                ("BM_TokenizerEncodeEnglishCold", "encode English, empty cache", 5),
                                ("BM_TokenizerDecodeEnglish", "decode English", None)):
        b = by_prefix(bs, prefix)
        if b and b.get("bytes_per_second"):
            mb = b["bytes_per_second"] / 1e6
            t.row(fig, f"{mb:.0f} MB/s", f"{mb / target:.1f}x the target" if target else "—", f"≥ {target} MB/s" if target else "—", "1 thread", "t1")
        else:
            t.na(fig, "t1", cmd="t1")
    t.print(["t1", "t2"])


def constrained(res):
    t = Table(res, "constrained-decoding", "Constrained decoding", "")
    plain, schema = res.runs("c1.plain"), res.runs("c1.schema")
    if schema:
        st = [j["stats"] for j in schema]
        t.row("mask time during a schema decode", ", ".join(f"{s['constraint_s']:.3f} s of {s['decode_s']:.2f} s" for s in st),
              ", ".join(f"{100 * s['constraint_s'] / s['decode_s']:.2f} %" for s in st if s["decode_s"] > 0) + " of decode time", "≤ 5 %", "", "c1")
        t.row("decode tok/s plain / with schema", f"median {f(med([j['stats']['decode_tok_s'] for j in plain]))} / "
              f"{f(med([s['decode_tok_s'] for s in st]))}", "—", "—", "", "c1")
    else:
        t.na("mask time during a schema decode", "c1.schema", "≤ 5 %", "c1")
    bs = gbench(res, "c2")
    for prefix, fig in (("BM_ConstrainCompileSchema", "compile the bench's schema to its automaton"),
                        ("BM_ConstrainVocabularyTrie", "vocabulary trie, once per process"),
                        ("BM_ConstrainMaskColdInString", "a mask inside a string, cold"),
                        ("BM_ConstrainMaskCached", "a mask from the per-state cache"),
                        ("BM_ConstrainWholeValue/0", "a whole value, masks cold"),
                        ("BM_ConstrainWholeValue/1", "a whole value, masks cached")):
        b = by_prefix(bs, prefix)
        if b:
            t.row(fig, f"{b['real_time']:.3g} {b['time_unit'].replace('us', 'µs')}", "—", "—", "1 thread", "c2")
        else:
            t.na(fig, "c2", cmd="c2")
    t.print(["c1", "c2"])


def storage(res):
    t = Table(res, "storage", "Storage", "")
    one, two = res.runs("g1.one"), res.runs("g1.two")
    if one and two:
        r1 = med([j["details"]["achieved_read_gbps"] for j in one])
        r2 = med([j["details"]["achieved_read_gbps"] for j in two])
        d1 = med([j["decode_s_per_token"] for j in one])
        d2 = med([j["decode_s_per_token"] for j in two])
        t.row("two folders against one: store's read rate", f"{r2:.3f} GB/s against {r1:.3f}", f"{r2 / r1:.2f}x", "≥ 1.8x", mpath(two[0]), "g1")
        t.row("two folders against one: streamed decode", f"{d2:.3f} / {d1:.3f} s/token", f"{d1 / d2:.2f}x faster", "—", mpath(two[0]), "g1")
    else:
        t.na("two folders against one", "g1", "≥ 1.8x", "g1")
    off, on = res.runs("g2.off"), res.runs("g2.on")
    if off and on:
        a, b = med([j["decode_s_per_token"] for j in on]), med([j["decode_s_per_token"] for j in off])
        t.row("hash-layer early reads, on / off", f"decode {a:.3f} / {b:.3f} s/token, blocked "
              f"{med([j['details']['decode_blocked_s_per_token'] for j in on]):.3f} / {med([j['details']['decode_blocked_s_per_token'] for j in off]):.3f} s",
              f"{a / b:.2f}x", "—", mpath(on[0]), "g2")
    else:
        t.na("hash-layer early reads", "g2", cmd="g2")
    g3 = res.runs("g3")
    if g3 and "soak" in g3[0]:
        s = g3[0]["soak"]
        a, b = s["decode_tok_s_first_quarter"], s["decode_tok_s_last_quarter"]
        t.row(f"soak, {s['minutes']:g} minutes ({len(s['cycles'])} cycles)",
              f"decode {a:.2f} → {b:.2f} tok/s, read rate {s['read_gbps_first_quarter']:.2f} → {s['read_gbps_last_quarter']:.2f} GB/s, "
              f"RSS {s['rss_bytes_first'] / 2**30:.2f} → {s['rss_bytes_last'] / 2**30:.2f} GiB",
              f"{100 * (b - a) / a:+.1f} %" if a else "—", "no leak, no drift", mpath(g3[0]), "g3")
    else:
        t.na("soak", "g3", "no leak, no drift", "g3")
    probes = [g for k in ("d3.str", "g2.on", "g2.off") for j in res.runs(k) for g in [j.get("ssd_gbps_measured")] if g]
    if probes:
        t.row("SSD O_DIRECT (the probe of the streamed runs)", f"{min(probes):.2f}-{max(probes):.2f} GB/s", "—", "—", "", "d3, g2")
    else:
        t.row("SSD O_DIRECT", "n/a (no streamed run)", "—", "—", "", "d3")
    t.print(["g1", "g2", "g3"])


def server(res):
    t = Table(res, "server", "Server", "")
    v = res.runs("v1")
    if v:
        j = v[0]
        t.row("TTFT, one streamed completion", f"{j['ttft_s']:.2f} s ({j['prompt_chars']} prompt characters)", "—", "—", "", "v1")
        t.row("decode tok/s seen by the client", f"{j['decode_tok_s']:.2f} tok/s ({j['chunks']} streamed chunks)", "—", "—", "", "v1")
    else:
        t.na("TTFT, one streamed completion", "v1", cmd="v1")
    a = res.runs("a1")
    if a:
        j, rows = a[0], a[0]["requests"]
        by = {r["label"]: r for r in rows}
        t.row(f"tokens prefilled over the agent trace ({len(rows)} requests, {sum(r['prompt'] for r in rows):,} prompt tokens)",
              f"{j['prefilled']:,}", f"{j['ratio']:.3f}x the ideal ({j['ideal']:,})", "≤ 1.05x", "demo model", "a1")
        if "1k prompt again" in by and "1k prompt after the restart" in by:
            t.row(f"the {by['1k prompt']['prompt']:,}-token prompt again / after a restart",
                  f"{by['1k prompt again']['cached']:,} / {by['1k prompt after the restart']['cached']:,} tokens reused", "—",
                  "≥ 1,000", "", "a1")
        if "4k document, question 2" in by:
            q = by["4k document, question 2"]
            t.row(f"the {q['prompt']:,}-token document, second question", f"{q['cached']:,} tokens reused",
                  f"{q['prefilled']} prefilled, ideal {q['ideal']}", "≥ 4,000", "", "a1")
        mib = lambda b: f"{b / 2**20:.1f} MiB"
        t.row("prefix cache RAM / disk at the end", f"{mib(j['cache_ram_bytes'])} / {mib(j['cache_disk_bytes'])}",
              f"peak RSS {mib(j['peak_rss_bytes'])} vs {mib(j['planned_peak_bytes'])} planned", "within both", "", "a1")
    else:
        t.na("tokens prefilled over the agent trace", "a1", "≤ 1.05x", "a1")
    t.print(["v1", "a1"])


def pro(res):
    t = Table(res, "v4-pro-geometry", "V4 Pro geometry", "")
    for key, name in (("r1.pro", "Pro"), ("r1.flash", "Flash")):
        v = res.runs(key)
        cfg = os.path.join(res.d, key.split(".")[1] + ".config.json")
        if not v or not os.path.exists(cfg):
            t.na(f"{name} geometry: decode", key, cmd="r1")
            continue
        layers = json.load(open(cfg))["num_hidden_layers"]
        per = [j["decode_s_per_token"] for j in v]
        comp = [j["details"]["decode_compute_s_per_token"] / layers for j in v]
        t.row(f"{name}, {layers} layer{'s' if layers > 1 else ''}: decode", f"{fl(per, 3, ' / ')} s/token ({fl([p / layers for p in per], 3, ' / ')} s per layer; "
              f"compute {fl(comp, 3, ' / ')} s per layer)",
              f"SSD probe {fl([j['ssd_gbps_measured'] for j in v], 1, ' / ')} GB/s; {med([j['bytes_read_per_token'] for j in v]) / layers / 1e6:.0f} MB "
              f"read per token per layer, {100 * med([j['hit_rate'] for j in v]):.0f} % hits", "runs" if name == "Pro" else "—", mpath(v[0]), "r1")
    t.print(["r1"])


def markdown(d):
    res = Results(d)
    m = res.meta
    print("# Benchmarks on this machine\n")
    print(f"Made by `scripts/bench_all.sh{' --quick' if res.quick else ''}` on {res.date} at commit {m.get('commit', '?')}; "
          "same sections and columns as docs/benchmarks.md.\n")
    if res.quick:
        print("**Quick mode:** small checkpoints, few tokens and tiny sizes; the figures test the script, they are not "
              "comparable with the doc's.\n")
    print(f"* Machine: {m.get('cpu', '?')} (family {m.get('family', '?')} model {m.get('model', '?')}), {m.get('cpus', '?')} CPUs, "
          f"{m.get('mem', '?')}; SIMD flags: {m.get('flags', '').strip() or 'none of avx2/avx512'}; load average {m.get('load', '?')} at the start.")
    print(f"* Checkpoints: {m.get('flash', '')} ({'quick' if res.quick else 'flash4'}), {m.get('csa', '')}, {m.get('pro', '')}; "
          "`dsv4` is build/release/dsv4; the path is the kernel path the run used (`DSV4_KERNELS=avx2` rows say avx2).\n")
    for section in (tokenizer, kernels, prefill, decode, sessions, spec, constrained, storage, server, pro):
        try:
            section(res)
        except Exception as e:  # a malformed result costs its section, not the whole table
            print(f"(section {section.__name__}: could not be formatted: {type(e).__name__}: {e})\n")


def mtp_acceptance(main_path, mtp_path):
    a, b = os.path.getsize(main_path), os.path.getsize(mtp_path)
    V = (a - b) // 4
    n = a // 4 // V

    def argmaxes(path, rows):
        out = []
        with open(path, "rb") as fh:
            for _ in range(rows):
                r = array.array("f")
                r.fromfile(fh, V)
                out.append(max(range(V), key=r.__getitem__))
        return out

    main, mtp = argmaxes(main_path, n), argmaxes(mtp_path, n - 1)
    hits = sum(1 for i in range(n - 1) if mtp[i] == main[i + 1])
    print(json.dumps({"acceptance": hits / (n - 1), "tokens": n}))


def serve_client(port, tokens, pid):
    deadline = time.time() + 600
    while True:  # the server answers /health once the model is loaded
        try:
            os.kill(pid, 0)
        except OSError:
            sys.exit("the server exited before it answered /health")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        if time.time() > deadline:
            sys.exit("no /health answer in 600 s")
        time.sleep(1)
    prompt = "The history of the printing press begins"
    body = json.dumps({"model": "dsv4", "prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.time()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        sys.exit(f"HTTP {r.status}: {r.read()[:200]!r}")
    times = []
    for line in r:
        line = line.strip()
        if not line.startswith(b"data:") or line == b"data: [DONE]":
            continue
        ch = json.loads(line[5:])
        if any(c.get("text") for c in ch.get("choices", [])):
            times.append(time.time())
    if not times:
        sys.exit("no streamed text")
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0
    print(json.dumps({"ttft_s": times[0] - t0, "decode_tok_s": rate, "chunks": len(times), "prompt_chars": len(prompt)}))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--mtp-acceptance":
        mtp_acceptance(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 5 and sys.argv[1] == "--serve-client":
        serve_client(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    elif len(sys.argv) == 2:
        markdown(sys.argv[1])
    else:
        sys.exit(__doc__)
