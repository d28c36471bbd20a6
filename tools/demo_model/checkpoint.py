"""The model ↔ official hub checkpoint: export (quantize + shard + index + configs) and load
(dequantize into the torch model)."""
import json
import os

import torch

import hubformat as hf
from model import Config, Transformer

# Checkpoint dtype of each non-FP8 tensor kind (spec §2.2): BF16 embed/head/norms/router/
# compressor projections/indexer weights_proj; F32 hc_*, attn_sink, ape, gate.bias; I64 tid2eid.
F32_SUFFIXES = ("_fn", "_base", "_scale", "attn_sink", ".ape", "gate.bias")


def hub_tensors(model):
    """[(hub name, float32 or int tensor, kind)] with kind in fp8 / fp4 / bf16 / f32 / i64."""
    out = []
    for name, p in list(model.named_parameters()) + list(model.named_buffers()):
        if name.endswith("inv_freq"):
            continue
        m = name.split(".")
        if m[-1] in ("w1", "w2", "w3") and "shared_experts" not in name:  # stacked routed experts
            prefix = ".".join(m[:-1])
            for e in range(p.shape[0]):
                out.append((f"{prefix}.experts.{e}.{m[-1]}.weight", p[e], "fp4"))
            continue
        if name.endswith("tid2eid"):
            out.append((name, p, "i64"))
        elif name.endswith(F32_SUFFIXES):
            out.append((name, p, "f32"))
        elif name.endswith(".weight") and p.dim() == 2:
            mod = model.get_submodule(name[:-7])
            out.append((name, p, getattr(mod, "quant", "bf16")))
        else:
            out.append((name, p, "bf16"))  # norms
    return out


def stored(name, t, kind):
    """{name: (dtype, shape, bytes)} as the checkpoint stores the tensor."""
    if kind == "fp8":
        codes, scale = hf.quantize_fp8(t)
        return {name: hf.to_bytes(codes, "F8_E4M3"), name[:-7] + ".scale": hf.to_bytes(scale, "F8_E8M0")}
    if kind == "fp4":
        packed, scale = hf.quantize_fp4(t)
        return {name: hf.to_bytes(packed, "I8"), name[:-7] + ".scale": hf.to_bytes(scale, "F8_E8M0")}
    dtype = {"bf16": "BF16", "f32": "F32", "i64": "I64"}[kind]
    return {name: hf.to_bytes(t, dtype)}


def config_json(cfg_dict):
    keys = ["architectures", "attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "expert_dtype",
            "hc_eps", "hc_mult", "hc_sinkhorn_iters", "head_dim", "hidden_act", "hidden_size", "index_head_dim",
            "index_n_heads", "index_topk", "initializer_range", "max_position_embeddings", "model_type",
            "moe_intermediate_size", "n_routed_experts", "n_shared_experts", "norm_topk_prob", "num_attention_heads",
            "num_experts_per_tok", "num_hidden_layers", "num_hash_layers", "num_key_value_heads",
            "num_nextn_predict_layers", "o_groups", "o_lora_rank", "q_lora_rank", "qk_rope_head_dim",
            "quantization_config", "rms_norm_eps", "rope_scaling", "rope_theta", "routed_scaling_factor",
            "scoring_func", "sliding_window", "swiglu_limit", "tie_word_embeddings", "topk_method", "torch_dtype",
            "transformers_version", "use_cache", "vocab_size", "compress_rope_theta", "compress_ratios"]
    return {k: cfg_dict[k] for k in keys}


def export(model, out_dir, shard_bytes=16 << 20, temperature=0.8, top_p=0.9):
    """Writes the hub checkpoint: shards (main model, then mtp.* alone in the last shard, as the
    official checkpoint), index, config.json, generation_config.json. The sampling defaults
    are the demo's (the real V4 ships 1.0 / 1.0; a tiny model reads better a little cooler)."""
    os.makedirs(out_dir, exist_ok=True)
    main, mtp = {}, {}
    for name, t, kind in hub_tensors(model):
        (mtp if name.startswith("mtp.") else main).update(stored(name, t, kind))
    shards, cur, size = [], {}, 0
    for name, v in main.items():
        if cur and size + len(v[2]) > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = v
        size += len(v[2])
    if cur:
        shards.append(cur)
    shards.append(mtp)
    n = len(shards)
    weight_map, total = {}, 0
    for i, s in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        hf.write_safetensors(os.path.join(out_dir, fname), s)
        for k, v in s.items():
            weight_map[k] = fname
            total += len(v[2])
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    _write_json(os.path.join(out_dir, "model.safetensors.index.json"), index)
    cfg = model.cfg.raw
    _write_json(os.path.join(out_dir, "config.json"), config_json(cfg))
    _write_json(os.path.join(out_dir, "generation_config.json"),
                {"_from_model_config": True, "bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
                 "do_sample": True, "temperature": temperature, "top_p": top_p, "transformers_version": "4.46.3"})


def _write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def load(dirname):
    """The torch model with the checkpoint's dequantized weights (float32, exact)."""
    cfg_d = json.load(open(os.path.join(dirname, "config.json")))
    model = Transformer(Config(cfg_d))
    deq = hf.dequantized(hf.read_checkpoint(dirname))
    params = dict(model.named_parameters())
    params.update(dict(model.named_buffers()))
    used = set()
    with torch.no_grad():
        for name, p in params.items():
            if name.endswith("inv_freq"):
                continue
            m = name.split(".")
            if m[-1] in ("w1", "w2", "w3") and "shared_experts" not in name:
                prefix = ".".join(m[:-1])
                keys = [f"{prefix}.experts.{e}.{m[-1]}.weight" for e in range(p.shape[0])]
                p.copy_(torch.stack([deq[k] for k in keys]))
                used.update(keys)
            else:
                src = deq[name]
                if tuple(src.shape) != tuple(p.shape):
                    raise ValueError(f"{dirname}: {name} has shape {list(src.shape)}, the model wants {list(p.shape)}")
                p.copy_(src.to(p.dtype))
                used.add(name)
    missing = set(deq) - used
    if missing:
        raise ValueError(f"{dirname}: tensors the model does not use: {sorted(missing)[:5]}")
    return model.eval()
