# Accuracy of fast-mode activation quantization for FP4 (E2M1 + E8M0/32) products.
#
# 1. Kernel level (default): an expert-shape product (512 x 4096 weights, 64 activation rows)
#    with each scheme's quantized activations against float64, for Gaussian and heavy-tailed
#    activations. Justifies the 16-bit activations (two int8 planes) of docs/kernels.md.
#      /usr/bin/python3 tools/kernels_quant_accuracy.py            (needs numpy)
# 2. Model level: fast and reference numerics of a dsv4 binary against each fixture's Hugging
#    Face reference (argmax agreement, max |dlogit|, greedy agreement length); docs/numerics.md.
#      /usr/bin/python3 tools/kernels_quant_accuracy.py --model build/release/dsv4 \
#          ../shared/fixtures/tiny-a ../shared/fixtures/flashlike
import json, os, struct, subprocess, sys, tempfile
import numpy as np

from safetensors_f32 import read_safetensors


def kernel_level():
    rng = np.random.default_rng(0)
    K = 4096; R = 512; N = 64
    fp4 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, 0, -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
    codes = rng.integers(0, 16, size=(R, K)); scl = 2.0 ** rng.integers(-8, -3, size=(R, K // 32))
    W = (fp4[codes] * np.repeat(scl, 32, axis=1)).astype(np.float32)

    def acts(kind):
        x = rng.standard_normal((N, K)).astype(np.float32)
        if kind == 'heavy':  # heavy tails + a few large channels, as LLM activations have
            x *= np.exp(rng.standard_normal((N, K)) * 0.8).astype(np.float32)
            ch = rng.choice(K, 8, replace=False); x[:, ch] *= 30
        return x

    def blocks(x, blk):
        return x.reshape(N, K // blk, blk)

    def q_int(x, blk, qmax, pow2=False):
        # Q = clamp(rint(x / d), +-qmax) with d = amax / qmax, in float32 as the kernels do it.
        xb = blocks(x, blk); amax = np.abs(xb).max(-1, keepdims=True).astype(np.float32)
        if pow2:
            d = (2.0 ** np.ceil(np.log2(amax / qmax))).astype(np.float32)
        else:
            d = (amax / np.float32(qmax)).astype(np.float32)
        with np.errstate(divide='ignore', invalid='ignore'):
            q = np.where(d > 0, np.clip(np.rint(xb / d), -qmax, qmax), 0)
        return (q.astype(np.float64) * d).reshape(N, K)

    def q_two_planes_k(x, blk, k):
        # The alternative of the brief: hi = rint(x / d), lo = rint((x / d - hi) * k), d = amax/127.
        xb = blocks(x, blk); amax = np.abs(xb).max(-1, keepdims=True).astype(np.float32)
        d = (amax / np.float32(127)).astype(np.float32)
        t = (xb / d).astype(np.float32); hi = np.clip(np.rint(t), -127, 127)
        lo = np.clip(np.rint((t - hi).astype(np.float32) * np.float32(k)), -127, 127)
        return ((hi + lo / k) * d).reshape(N, K)

    def e4m3(v):
        v = np.clip(v, -448, 448); a = np.abs(v); e = np.floor(np.log2(np.maximum(a, 2 ** -9))); e = np.maximum(e, -6)
        step = 2.0 ** (e - 3); return np.sign(v) * np.rint(a / step) * step

    def q_fp8(x, blk):
        xb = blocks(x, blk); amax = np.maximum(np.abs(xb).max(-1, keepdims=True), 1e-4)
        s = 2.0 ** np.ceil(np.log2(amax / 448)); return (e4m3(xb / s) * s).reshape(N, K)

    schemes = [
        ('int16/32 (two int8 planes), chosen', lambda x: q_int(x, 32, 32512)),
        ('two int8 planes, lo = rint(r*254)', lambda x: q_two_planes_k(x, 32, 254)),
        ('int12/32 float scale', lambda x: q_int(x, 32, 2047)),
        ('int8/32 float scale (before)', lambda x: q_int(x, 32, 127)),
        ('int8/32 pow2 scale', lambda x: q_int(x, 32, 127, pow2=True)),
        ('int8/128 float scale', lambda x: q_int(x, 128, 127)),
        ('fp8 e4m3/128 pow2 (official)', lambda x: q_fp8(x, 128)),
    ]
    for kind in ['gauss', 'heavy']:
        x = acts(kind); ref = x.astype(np.float64) @ W.T.astype(np.float64)
        print(kind)
        for name, f in schemes:
            y = f(x) @ W.T.astype(np.float64)
            rel = np.sqrt(((y - ref) ** 2).mean() / (ref ** 2).mean())
            print(f'  {name:38s} rms rel err {rel:.2e}  max rel {np.abs(y - ref).max() / np.abs(ref).max():.2e}')




def model_level(binary, fixtures):
    for fx in fixtures:
        ref = json.load(open(os.path.join(fx, 'reference.json')))
        logits = read_safetensors(os.path.join(fx, 'reference_logits.safetensors'))
        for numerics in ['fast', 'reference']:
            agree = total = 0; worst = 0.0
            with tempfile.TemporaryDirectory() as tmp:
                for seq in ref['sequences']:
                    tf = os.path.join(tmp, 'tokens.txt'); out = os.path.join(tmp, 'logits.bin')
                    open(tf, 'w').write(' '.join(str(t) for t in seq['tokens']))
                    subprocess.run([binary, 'score', '-m', fx, '--tokens-file', tf, '--logits-out', out,
                                    '--numerics', numerics], check=True, capture_output=True)
                    want = logits[seq['logits_tensor']]
                    got = np.fromfile(out, dtype='<f4').reshape(want.shape)
                    agree += int((got.argmax(1) == np.array(seq['argmax'])).sum()); total += len(want)
                    worst = max(worst, float(np.abs(got - want).max()))
            lengths = []
            for g in ref['greedy']:
                r = subprocess.run([binary, 'generate', '-m', fx, '--tokens', ','.join(str(t) for t in g['prompt']),
                                    '-n', str(len(g['new_tokens'])), '--greedy', '--print-ids', '--numerics', numerics],
                                   check=True, capture_output=True, text=True)
                ids = [int(t) for t in r.stdout.strip().split(',')]
                n = 0
                while n < len(ids) and n < len(g['new_tokens']) and ids[n] == g['new_tokens'][n]:
                    n += 1
                lengths.append(n)
            print(f'{os.path.basename(fx.rstrip("/")):10s} {numerics:9s} argmax {agree}/{total} ({100.0 * agree / total:.1f} %)'
                  f'  max |dlogit| {worst:.3g}  greedy agreement {lengths} of {[len(g["new_tokens"]) for g in ref["greedy"]]}')


if __name__ == '__main__':
    if len(sys.argv) > 1 and sys.argv[1] == '--model':
        model_level(sys.argv[2], sys.argv[3:])
    else:
        kernel_level()
