"""The official hub checkpoint's number formats and files (spec §2.2, official-format.md §4).

* FP8 E4M3 (e4m3fn, max 448) weights with UE8M0 power-of-two scales per 128×128 block,
  shape [ceil(out/128), ceil(in/128)]: W = fp8 · 2^(e−127).
* FP4 E2M1 routed experts, two codes per byte along the input dim (low nibble = even element),
  stored as I8 [out, in/2], with E8M0 scales per 32 inputs [out, in/32].
* BF16 (round to nearest even), F32, I64.

quantize_* return exactly what the checkpoint stores; dequantize_* give float32 exactly. The
same rounding is used for quantization-aware training (fake_quant), so the trained weights and
the exported weights are the same numbers.
"""
import json
import os
import struct

import numpy as np
import torch

FP4_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _pow2_scale(amax, qmax):
    """UE8M0 scale exponent: 2^ceil(log2(amax/qmax)), amax floored so the exponent stays in range."""
    e = torch.ceil(torch.log2(amax.clamp_min(2.0 ** -100) / qmax))
    return e.clamp(-127, 127)


def round_e4m3(v):
    """Round float32 (already scaled, |v| ≤ 448) to the nearest e4m3fn value, ties to even."""
    a = v.abs()
    _, ex = torch.frexp(a)  # a = m·2^ex, m in [0.5, 1)
    exp = (ex - 1).clamp_min(-6)  # subnormals share the step of the smallest normal binade
    step = torch.pow(2.0, (exp - 3).float())
    q = torch.round(a / step) * step
    return torch.sign(v) * q.clamp_max(448.0)


def round_e2m1(v):
    """Round (already scaled, |v| ≤ 6) to the E2M1 grid, ties to the even code."""
    a = v.abs()
    # Boundaries between grid points; a tie goes to the even code (0, 1, 2, 4 / codes 0, 2, 4, 6).
    thresholds = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    code = torch.bucketize(a, thresholds, right=False)  # a == threshold → lower code
    # bucketize(right=False) maps a tie to the lower bucket; odd codes must round up on a tie.
    tie_up = torch.zeros_like(a, dtype=torch.bool)
    for lo, t in enumerate(thresholds.tolist()):
        if lo % 2 == 1:  # tie between odd code lo and even code lo+1 → the even one
            tie_up |= a == t
    code = code + tie_up.long()
    return code, torch.sign(v) * FP4_GRID[code]


def _blocks(w, br, bc):
    """Pads w [R, C] to whole blocks and views it [R/br, br, C/bc, bc]."""
    R, C = w.shape
    pr, pc = (-R) % br, (-C) % bc
    wp = torch.nn.functional.pad(w, (0, pc, 0, pr))
    return wp.view((R + pr) // br, br, (C + pc) // bc, bc), (R, C)


def fp8_fake(w):
    b, (R, C) = _blocks(w.detach().float(), 128, 128)
    e = _pow2_scale(b.abs().amax(dim=(1, 3), keepdim=True), 448.0)
    s = torch.pow(2.0, e)
    q = round_e4m3((b / s).clamp(-448, 448)) * s
    return q.reshape(b.shape[0] * 128, b.shape[2] * 128)[:R, :C]


def fp4_fake(w):
    """w [..., out, in] with in % 32 == 0, per-32 scales along in."""
    wd = w.detach().float()
    g = wd.reshape(*wd.shape[:-1], wd.shape[-1] // 32, 32)
    e = _pow2_scale(g.abs().amax(-1, keepdim=True), 6.0)
    s = torch.pow(2.0, e)
    _, q = round_e2m1((g / s).clamp(-6, 6))
    return (q * s).reshape(wd.shape)


def bf16_round(w):
    return w.detach().to(torch.bfloat16).float()


def fake_quant(w, kind):
    """Straight-through fake quantization: forward sees the stored values, backward is identity."""
    if kind == "fp8":
        q = fp8_fake(w)
    elif kind == "fp4":
        q = fp4_fake(w)
    elif kind == "bf16":
        q = bf16_round(w)
    else:
        return w
    return w + (q - w).detach()


# ---- encoding to stored bytes ----------------------------------------------------------------

def e4m3_codes(q):
    """Exact e4m3fn values (float32) → uint8 codes."""
    a = q.abs()
    sign = (q < 0) | ((q == 0) & (torch.signbit(q)))
    _, ex = torch.frexp(a)
    exp = ex - 1  # a = 1.f · 2^exp
    normal = exp >= -6
    mant_n = torch.round((a / torch.pow(2.0, exp.float()) - 1.0) * 8).long()
    e_field = torch.where(normal, exp + 7, torch.zeros_like(exp))
    mant_s = torch.round(a / 2.0 ** -9).long()
    m_field = torch.where(normal, mant_n, mant_s)
    zero = a == 0
    e_field = torch.where(zero, torch.zeros_like(e_field), e_field)
    m_field = torch.where(zero, torch.zeros_like(m_field), m_field)
    code = (sign.long() << 7) | (e_field.long() << 3) | m_field
    return code.to(torch.uint8)


def e4m3_decode(codes):
    c = codes.long()
    s = torch.where((c >> 7) == 1, -1.0, 1.0)
    e = (c >> 3) & 15
    m = (c & 7).float()
    v = torch.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * torch.pow(2.0, (e - 7).float()))
    return s * v


def quantize_fp8(w):
    """w [R, C] float → (codes uint8 [R, C], scale uint8 [ceil(R/128), ceil(C/128)])."""
    b, (R, C) = _blocks(w.detach().float(), 128, 128)
    e = _pow2_scale(b.abs().amax(dim=(1, 3), keepdim=True), 448.0)
    q = round_e4m3((b / torch.pow(2.0, e)).clamp(-448, 448))
    codes = e4m3_codes(q).reshape(b.shape[0] * 128, b.shape[2] * 128)[:R, :C].contiguous()
    return codes, (e.reshape(b.shape[0], b.shape[2]) + 127).to(torch.uint8)


def dequantize_fp8(codes, scale):
    R, C = codes.shape
    s = torch.pow(2.0, scale.float() - 127)
    s = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:R, :C]
    return e4m3_decode(codes) * s


def quantize_fp4(w):
    """w [R, C] → (packed int8 [R, C/2], scale uint8 [R, C/32])."""
    wd = w.detach().float()
    R, C = wd.shape
    g = wd.reshape(R, C // 32, 32)
    e = _pow2_scale(g.abs().amax(-1, keepdim=True), 6.0)
    code, q = round_e2m1((g / torch.pow(2.0, e)).clamp(-6, 6))
    neg = (q < 0) | ((q == 0) & torch.signbit(g))
    code = (code | (neg.long() << 3)).reshape(R, C)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8)
    return packed.view(torch.int8), (e.reshape(R, C // 32) + 127).to(torch.uint8)


def dequantize_fp4(packed, scale):
    p = packed.view(torch.uint8).long()
    R = p.shape[0]
    codes = torch.stack([p & 15, p >> 4], dim=-1).reshape(R, -1)
    v = FP4_GRID[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
    s = torch.pow(2.0, scale.float() - 127).repeat_interleave(32, 1)
    return v * s


# ---- safetensors ------------------------------------------------------------------------------

_DTYPES = {"F32": (np.float32, 4), "BF16": (np.int16, 2), "F8_E4M3": (np.uint8, 1), "F8_E8M0": (np.uint8, 1),
           "I8": (np.int8, 1), "I64": (np.int64, 8)}


def to_bytes(t, dtype):
    """(dtype, shape, raw bytes) for a tensor in checkpoint dtype."""
    if dtype == "BF16":
        b = t.detach().to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    elif dtype == "F32":
        b = t.detach().float().numpy().astype("<f4").tobytes()
    elif dtype == "I64":
        b = t.detach().long().numpy().astype("<i8").tobytes()
    elif dtype in ("F8_E4M3", "F8_E8M0"):
        b = t.detach().to(torch.uint8).numpy().tobytes()
    elif dtype == "I8":
        b = t.detach().to(torch.int8).numpy().tobytes()
    else:
        raise ValueError(dtype)
    return dtype, list(t.shape), b


def write_safetensors(path, tensors):
    """tensors: {name: (dtype, shape, bytes)} in the order given."""
    header, offset, blobs = {}, 0, []
    for name, (dtype, shape, b) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """{name: torch tensor in its stored dtype} (BF16 → float32 exactly, FP8/E8M0 → uint8)."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    hdr = json.loads(data[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        np_dtype, _ = _DTYPES[v["dtype"]]
        a = np.frombuffer(data[8 + n + s:8 + n + e], dtype=np_dtype).reshape(v["shape"]).copy()
        t = torch.from_numpy(a)
        if v["dtype"] == "BF16":
            t = ((t.int() & 0xFFFF) << 16).view(torch.float32)
        out[k] = (v["dtype"], t)
    return out


def read_checkpoint(dirname):
    """{name: (dtype, tensor)} over all shards named by the index."""
    idx = json.load(open(os.path.join(dirname, "model.safetensors.index.json")))
    out = {}
    for shard in sorted(set(idx["weight_map"].values())):
        out.update(read_safetensors(os.path.join(dirname, shard)))
    return out


def dequantized(ck):
    """{weight name: float32 tensor} with FP8/FP4 weights dequantized by their .scale siblings."""
    out = {}
    for name, (dtype, t) in ck.items():
        if name.endswith(".scale") and name[:-6] + ".weight" in ck:
            continue
        if dtype == "F8_E4M3":
            out[name] = dequantize_fp8(t, ck[name[:-7] + ".scale"][1])
        elif dtype == "I8":
            out[name] = dequantize_fp4(t, ck[name[:-7] + ".scale"][1])
        elif dtype in ("BF16", "F32"):
            out[name] = t.float()
        else:
            out[name] = t
    return out
