"""Held-out quality of the demo model, after and before quantization, and of its MTP head.

    /usr/bin/python3 tools/demo_model/evaluate.py --model models/demo --data scratch/demo_data \
        [--state scratch/demo_train/state.pt] [--json OUT]

* bits per byte over the held-out chapters (each scored whole from its BOS, as `dsv4 score`
  would): the exported checkpoint (FP8/FP4/BF16, dequantized) and, with --state, the float
  master weights it was quantized from; `xz -9` on the same text;
* MTP (mtp.0): top-1 agreement of its prediction for token t+2 with the real token t+2, beside
  the main head's top-1 accuracy for token t+1.
"""
import argparse
import json
import math
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint  # noqa: E402
import model as M  # noqa: E402


def score(model, held, with_mtp):
    nll, n_bytes, n_tok = 0.0, 0, 0
    top1 = mtp_hits = mtp_n = 0
    with torch.no_grad():
        for text, ids in zip(held["text"], held["ids"]):
            t = torch.tensor([[model.cfg.bos] + ids])
            X = model.trunk(t[:, :-1])
            logits = model.logits_from_streams(X)[0]
            nll += float(F.cross_entropy(logits, t[0, 1:], reduction="sum"))
            top1 += int((logits.argmax(-1) == t[0, 1:]).sum())
            n_tok += len(ids)
            n_bytes += len(text.encode("utf-8"))
            if with_mtp:
                ml = model.mtp_logits(X, t[:, :-1])[0]  # position i predicts token i+2
                mtp_hits += int((ml.argmax(-1) == t[0, 2:]).sum())
                mtp_n += ml.shape[0]
    r = {"bits_per_byte": nll / math.log(2) / n_bytes, "nats_per_token": nll / n_tok, "tokens": n_tok,
         "bytes": n_bytes, "next_token_top1": top1 / n_tok}
    if with_mtp:
        r["mtp_next_next_top1"] = mtp_hits / mtp_n
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--state", help="training state.pt: also score the float weights")
    ap.add_argument("--json")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chapters", type=int, default=0, help="only the first N held-out chapters (0: all)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    held = json.load(open(os.path.join(a.data, "heldout.json")))
    if a.chapters:
        held = {k: v[:a.chapters] for k, v in held.items()}
    text = "".join(held["text"]).encode()
    xz = subprocess.run(["xz", "-9", "-c"], input=text, capture_output=True, check=True).stdout
    out = {"chapters": len(held["text"]), "xz9_bits_per_byte": len(xz) * 8 / len(text)}
    out["quantized"] = score(checkpoint.load(a.model), held, True)
    if a.state:
        st = torch.load(a.state)
        fm = M.Transformer(checkpoint.load(a.model).cfg)
        fm.load_state_dict(st["model"])
        fm.eval()
        M._FAKE_QUANT["on"] = False
        out["float"] = score(fm, held, True)
        out["float_step"] = st["step"]
        out["quantized_vs_float"] = out["quantized"]["bits_per_byte"] / out["float"]["bits_per_byte"] - 1
    out["quantized_vs_xz9"] = 1 - out["quantized"]["bits_per_byte"] / out["xz9_bits_per_byte"]
    print(json.dumps(out, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
