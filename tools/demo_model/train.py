"""Trains the demo model and exports it in the official hub format.

    OMP_WAIT_POLICY=PASSIVE chrt -i 0 /usr/bin/python3 tools/demo_model/train.py --data scratch/demo_data \
        --work scratch/demo_train --out models/demo --minutes 70

Fixed seed; two threads; a checkpoint every --save-every steps in WORK (a rerun resumes from
it); the curve goes to WORK/log.jsonl (per step: loss, MTP loss, indexer KL, learning rate,
QAT flag, elapsed time). With --minutes the schedule runs on wall-clock progress; --lr-from
that log replays the same schedule step by step. The last --qat share of the steps trains with the
weights fake-quantized exactly as the export stores them (FP8 / FP4 / BF16), so the exported
model is the trained one.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint  # noqa: E402
import hubformat  # noqa: E402
import model as M  # noqa: E402

VOCAB = 4096
CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": VOCAB - 16, "eos_token_id": VOCAB - 15, "expert_dtype": "fp4", "hc_eps": 1e-6, "hc_mult": 4,
    "hc_sinkhorn_iters": 20, "head_dim": 64, "hidden_act": "silu", "hidden_size": 256, "index_head_dim": 32,
    "index_n_heads": 4, "index_topk": 16, "initializer_range": 0.02, "max_position_embeddings": 1048576,
    "model_type": "deepseek_v4", "moe_intermediate_size": 64, "n_routed_experts": 128, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_attention_heads": 4, "num_experts_per_tok": 6, "num_hidden_layers": 6,
    "num_hash_layers": 3, "num_key_value_heads": 1, "num_nextn_predict_layers": 1, "o_groups": 2, "o_lora_rank": 64,
    "q_lora_rank": 128, "qk_rope_head_dim": 16,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "scale_fmt": "ue8m0",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-6,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16, "original_max_position_embeddings": 65536,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "sliding_window": 128,
    "swiglu_limit": 10.0, "tie_word_embeddings": False, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.57.1", "use_cache": True, "vocab_size": VOCAB, "compress_rope_theta": 160000,
    "compress_ratios": [0, 0, 4, 128, 4, 128, 0],
}
SEQ = 256
MTP_WEIGHT = 0.3
INDEXER_WEIGHT = 0.1
BIAS_RATE = 1e-3


def set_qat(on):
    M._FAKE_QUANT["on"] = on
    M._FAKE_QUANT["fn"] = hubformat.fake_quant


def losses(model, batch, aux):
    """(main next-token loss, MTP next-next-token loss) in nats per token."""
    x, y = batch[:, :-1], batch[:, 1:]
    X = model.trunk(x, aux)
    logits = model.logits_from_streams(X)
    main = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    mtp_logits = model.mtp_logits(X, x, aux)
    mtp = F.cross_entropy(mtp_logits.reshape(-1, mtp_logits.shape[-1]), y[:, 1:].reshape(-1))
    return main, mtp


def heldout_loss(model, held, n_docs, max_len=SEQ):
    """Mean nats per token on the first n_docs held-out chapters (bos + text, truncated)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for ids in held["ids"][:n_docs]:
            t = torch.tensor([[CONFIG["bos_token_id"]] + ids[:max_len]])
            logits = model(t[:, :-1])
            total += float(F.cross_entropy(logits[0], t[0, 1:], reduction="sum"))
            count += t.shape[1] - 1
    return total / count


def lr_at(step, progress, peak, warmup):
    """Linear warmup over `warmup` steps, then cosine from peak to peak/10 over progress 0..1."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3000, help="at most this many steps")
    ap.add_argument("--minutes", type=float, default=0,
                    help="wall-clock budget: the schedule's progress is the larger of steps and time used (the "
                         "machine is shared, so a step budget alone cannot promise when training ends)")
    ap.add_argument("--lr-from", help="a log.jsonl: replay its per-step learning rates and QAT switch (reproduces a "
                                      "--minutes run exactly)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--qat", type=float, default=0.25, help="share of the last steps trained quantization-aware")
    ap.add_argument("--save-every", type=int, default=25)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)
    os.makedirs(a.work, exist_ok=True)

    stream = torch.from_numpy(np.load(os.path.join(a.data, "train.npy")).astype(np.int64))
    held = json.load(open(os.path.join(a.data, "heldout.json")))
    torch.manual_seed(a.seed)
    model = M.Transformer(M.Config(CONFIG))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and not n.endswith("_fn")]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and not n.endswith("_fn"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    state_path = os.path.join(a.work, "state.pt")
    step, elapsed = 0, 0.0
    if os.path.exists(state_path):
        st = torch.load(state_path)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, elapsed = st["step"], st["elapsed"]
        torch.set_rng_state(st["rng"])
        print(f"resumed at step {step}", flush=True)
    log = open(os.path.join(a.work, "log.jsonl"), "a")
    replay = [json.loads(line) for line in open(a.lr_from)] if a.lr_from else None
    if replay:
        a.steps = len(replay)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params / 1e6:.2f}M parameters, {len(stream)} training tokens, batches of {a.batch}x{SEQ}, at most "
          f"{a.steps} steps" + (f" or {a.minutes:g} minutes" if a.minutes else ""), flush=True)

    model.train()
    t_last = time.time()
    progress = 0.0
    while step < a.steps and progress < 1.0:
        if replay:
            lr, qat = replay[step]["lr"], replay[step]["qat"]
        else:
            progress = max(step / a.steps, elapsed / (60 * a.minutes) if a.minutes else 0.0)
            lr, qat = lr_at(step, progress, a.lr, a.warmup), progress >= 1 - a.qat
        set_qat(qat)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(stream) - SEQ - 2, (a.batch,))
        batch = torch.stack([stream[s:s + SEQ + 1] for s in starts.tolist()])
        aux = []
        main_loss, mtp_loss = losses(model, batch, aux)
        idx_loss = torch.stack(aux).mean() if aux else torch.zeros(())
        loss = main_loss + MTP_WEIGHT * mtp_loss + INDEXER_WEIGHT * idx_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        opt.step()
        # Auxiliary-loss-free balancing (noaux_tc): nudge each scored layer's selection bias
        # toward equal load.
        with torch.no_grad():
            for moe in model.moe_layers():
                if not moe.gate.hashed and moe.load is not None:
                    load = moe.load.float()
                    moe.gate.bias += BIAS_RATE * torch.sign(load.mean() - load)
        step += 1
        now = time.time()
        elapsed += now - t_last
        t_last = now
        rec = {"step": step, "loss": round(float(main_loss), 4), "mtp": round(float(mtp_loss), 4),
               "indexer_kl": round(float(idx_loss), 4), "lr": lr,
               "gnorm": round(gnorm, 3), "qat": qat, "elapsed_s": round(elapsed, 1)}
        if step % a.eval_every == 0 or step == a.steps or (a.minutes and elapsed >= 60 * a.minutes):
            model.eval()
            rec["heldout_loss"] = round(heldout_loss(model, held, 8), 4)
            model.train()
        log.write(json.dumps(rec) + "\n")
        log.flush()
        if step % 10 == 0 or "heldout_loss" in rec:
            print(json.dumps(rec), flush=True)
        done = step == a.steps or (not replay and a.minutes and elapsed >= 60 * a.minutes)
        if done:
            progress = 1.0
        if step % a.save_every == 0 or done:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "elapsed": elapsed,
                        "rng": torch.get_rng_state()}, state_path + ".tmp")
            os.replace(state_path + ".tmp", state_path)
            t_last = time.time()

    set_qat(False)
    model.eval()
    checkpoint.export(model, a.out)
    print(f"exported to {a.out} after {elapsed / 60:.1f} min of training", flush=True)


if __name__ == "__main__":
    main()
