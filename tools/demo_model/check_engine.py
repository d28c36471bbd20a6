"""The trainer's torch forward on the dequantized exported weights against the engine.

    /usr/bin/python3 tools/demo_model/check_engine.py [--fixtures ../shared/fixtures] \
        [--dsv4 build/release/dsv4 --model models/demo [--text FILE] [--tokens 300] [--sequences 2]] [--tolerance 1e-4]

Tokenizes held-out text with the engine (`dsv4 tokenize`), runs `dsv4 score --numerics
reference` and the independent torch model (model.py, loaded by checkpoint.py from the same
files), and compares every logit, of the main head and of the MTP layer
(`--mtp-logits-out`). Exits 1 when max |Δlogit| exceeds the tolerance. Also checks
the torch model against the Hugging Face references of ../shared/fixtures (--fixtures DIR).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint  # noqa: E402
import hubformat  # noqa: E402


def engine_logits(dsv4, model_dir, ids, vocab, threads, chunk):
    """(main logits [n, V], MTP logits [n-1, V]) from `dsv4 score --mtp-logits-out`."""
    with tempfile.TemporaryDirectory() as tmp:
        tf, lf, mf = (os.path.join(tmp, n) for n in ("tokens.txt", "logits.f32", "mtp.f32"))
        with open(tf, "w") as f:
            f.write(",".join(map(str, ids)))
        subprocess.run([dsv4, "score", "-m", model_dir, "--numerics", "reference", "--threads", str(threads),
                        "--chunk", str(chunk), "--tokens-file", tf, "--logits-out", lf, "--mtp-logits-out", mf],
                       check=True, capture_output=True)
        return (np.fromfile(lf, dtype="<f4").reshape(len(ids), vocab),
                np.fromfile(mf, dtype="<f4").reshape(len(ids) - 1, vocab))


def tokenize(dsv4, tokenizer, text):
    r = subprocess.run([dsv4, "tokenize", "-t", tokenizer], input=text.encode(), capture_output=True, check=True)
    return [int(x) for x in r.stdout.decode().strip().split(",") if x]


def check_fixtures(fixtures):
    """max |Δlogit| of the torch model against each fixture's HF float32 references."""
    worst = 0.0
    for name in ("tiny-a", "flashlike"):
        d = os.path.join(fixtures, name)
        model = checkpoint.load(d)
        ref = json.load(open(os.path.join(d, "reference.json")))
        logits = hubformat.read_safetensors(os.path.join(d, "reference_logits.safetensors"))
        for s in ref["sequences"]:
            with torch.no_grad():
                out = model(torch.tensor([s["tokens"]]))[0]
            diff = float((out - logits[s["logits_tensor"]][1]).abs().max())
            print(f"fixture {name} {s.get('name', '')} ({len(s['tokens'])} tokens): max |Δlogit| vs HF {diff:.2e}")
            worst = max(worst, diff)
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsv4")
    ap.add_argument("--model", help="a checkpoint to compare with the engine (needs --dsv4)")
    ap.add_argument("--text", help="held-out text (default: MODEL/heldout_sample.txt)")
    ap.add_argument("--tokens", type=int, default=300, help="tokens per sequence")
    ap.add_argument("--sequences", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fixtures", help="also check against the HF references in this fixtures directory")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    worst = 0.0
    if a.fixtures:
        worst = check_fixtures(a.fixtures)
    if a.model:
        worst = max(worst, check_model(a))
    print(f"worst max |Δlogit| {worst:.2e} (tolerance {a.tolerance:g})")
    sys.exit(0 if worst <= a.tolerance else 1)


def check_model(a):
    worst = 0.0
    model = checkpoint.load(a.model)
    cfg = model.cfg
    text = open(a.text or os.path.join(a.model, "heldout_sample.txt")).read()
    ids = tokenize(a.dsv4, os.path.join(a.model, "tokenizer.json"), text)
    for i in range(a.sequences):
        seq = [cfg.bos] + ids[i * a.tokens:(i + 1) * a.tokens - 1]
        if len(seq) < 2:
            break
        # Odd chunks: the engine's passes (and its MTP passes) split the sequence differently.
        want, want_mtp = engine_logits(a.dsv4, a.model, seq, cfg.vocab, a.threads, chunk=97 if i % 2 else 0)
        x = torch.tensor([seq])
        with torch.no_grad():
            streams = model.trunk(x)
            got = model.logits_from_streams(streams)[0].numpy()
            got_mtp = model.mtp_logits(streams, x)[0].numpy()
        diff = float(np.abs(got - want).max())
        agree = float((got.argmax(-1) == want.argmax(-1)).mean())
        print(f"{a.model} sequence {i} ({len(seq)} tokens): max |Δlogit| torch vs dsv4 score {diff:.2e}, "
              f"argmax agreement {agree:.3f}")
        diff_mtp = float(np.abs(got_mtp - want_mtp).max())
        agree_mtp = float((got_mtp.argmax(-1) == want_mtp.argmax(-1)).mean())
        print(f"{a.model} sequence {i}: MTP (mtp.0) max |Δlogit| torch vs dsv4 score --mtp-logits-out "
              f"{diff_mtp:.2e}, argmax agreement {agree_mtp:.3f}")
        worst = max(worst, diff, diff_mtp)
    return worst


if __name__ == "__main__":
    main()
