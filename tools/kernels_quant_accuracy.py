# Accuracy of fast-mode activation quantization schemes for an FP4 (E2M1 + E8M0/32) matmul
# at an expert shape, against float64. Justifies int8 per 32 with a float scale (docs/kernels.md).
# Run: /usr/bin/python3 tools/kernels_quant_accuracy.py  (needs numpy)
import numpy as np
rng=np.random.default_rng(0)
K=4096; R=512; N=64
fp4=np.array([0,.5,1,1.5,2,3,4,6,0,-.5,-1,-1.5,-2,-3,-4,-6],dtype=np.float32)
codes=rng.integers(0,16,size=(R,K)); scl=2.0**rng.integers(-8,-3,size=(R,K//32))
W=(fp4[codes]*np.repeat(scl,32,axis=1)).astype(np.float32)
def acts(kind):
    x=rng.standard_normal((N,K)).astype(np.float32)
    if kind=='heavy':  # heavy tails + a few large channels, as LLM activations have
        x*=np.exp(rng.standard_normal((N,K))*0.8).astype(np.float32)
        ch=rng.choice(K,8,replace=False); x[:,ch]*=30
    return x
def q_int8(x,blk,pow2):
    xb=x.reshape(N,K//blk,blk); amax=np.abs(xb).max(-1,keepdims=True)
    d=amax/127 if not pow2 else 2.0**np.ceil(np.log2(amax/127))
    q=np.clip(np.rint(xb/d),-127,127); return (q*d).reshape(N,K)
def e4m3(v):
    v=np.clip(v,-448,448); a=np.abs(v); e=np.floor(np.log2(np.maximum(a,2**-9))); e=np.maximum(e,-6)
    step=2.0**(e-3); return np.sign(v)*np.rint(a/step)*step
def q_fp8(x,blk):
    xb=x.reshape(N,K//blk,blk); amax=np.maximum(np.abs(xb).max(-1,keepdims=True),1e-4)
    s=2.0**np.ceil(np.log2(amax/448)); return (e4m3(xb/s)*s).reshape(N,K)
for kind in ['gauss','heavy']:
    x=acts(kind); ref=x.astype(np.float64)@W.T.astype(np.float64)
    print(kind)
    for name,xq in [('int8/32 float scale (chosen)',q_int8(x,32,False)),('int8/32 pow2 scale',q_int8(x,32,True)),('int8/128 float scale',q_int8(x,128,False)),('fp8 e4m3/128 pow2 (official)',q_fp8(x,128)),('fp8 e4m3/32 pow2',q_fp8(x,32))]:
        y=xq.astype(np.float64)@W.T.astype(np.float64)
        rel=np.sqrt(((y-ref)**2).mean()/(ref**2).mean())
        print(f'  {name:32s} rms rel err {rel:.2e}  max rel {np.abs(y-ref).max()/np.abs(ref).max():.2e}')
