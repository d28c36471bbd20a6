# Routing statistics of a `dsv4 bench --trace-out` trace (decode tokens only): requests, distinct
# experts, infinite-cache ceiling, share of experts used once, LRU and Belady hit rates at 7 / 12 /
# 17.5 % of the experts cached (one global cache), hash vs scored layers. Used to calibrate
# `dsv4 synth --routing-skew real` (docs/benchmarks.md). Usage: routing_trace_stats.py TRACE [HASH_LAYERS]
import sys, collections
def load(path, E=256):
    seq=[]; tok=0
    for line in open(path):
        k=line.split()
        if k[0]=='A': seq.append((int(k[1]), int(k[2]), tok))
        elif k[0]=='T': tok+=1
    return seq
def lru(keys, slots):
    od=collections.OrderedDict(); h=0
    for k in keys:
        if k in od: h+=1; od.move_to_end(k)
        else:
            if len(od)>=slots: od.popitem(last=False)
            od[k]=1
    return h/len(keys)
def opt(keys, slots):
    import heapq
    nxt=[0]*len(keys); last={}
    for i in range(len(keys)-1,-1,-1):
        nxt[i]=last.get(keys[i], 1<<60); last[keys[i]]=i
    cache={}; heap=[]; h=0
    for i,k in enumerate(keys):
        if k in cache: h+=1
        elif len(cache)>=slots:
            while True:
                nu,kk=heapq.heappop(heap); nu=-nu
                if kk in cache and cache[kk]==nu: del cache[kk]; break
        cache[k]=nxt[i]; heapq.heappush(heap,(-nxt[i],k))
    return h/len(keys)
path=sys.argv[1]; hashl=int(sys.argv[2]) if len(sys.argv)>2 else 3
seq=[s for s in load(path) if s[2]>=1]
keys=[l*256+e for l,e,t in seq]
L=max(l for l,e,t in seq)+1; N=L*256
cnt=collections.Counter(keys)
toks=len(set(t for l,e,t in seq))
print(f"tokens {toks} requests {len(keys)} distinct {len(cnt)} ceiling {1-len(cnt)/len(keys):.3f} once {sum(1 for v in cnt.values() if v==1)/len(cnt):.3f}")
for frac in (0.07,0.12,0.175):
    s=int(round(frac*N))
    # per layer hash vs scored under lru global
    print(f"{frac:5.3f} slots {s}: LRU {lru(keys,s)*100:.1f} OPT {opt(keys,s)*100:.1f}")
# hash layer hit rate under LRU 7%
s=int(round(0.07*N)); od=collections.OrderedDict(); hh=[0,0]; sh=[0,0]
for k in keys:
    hit = k in od
    if hit: od.move_to_end(k)
    else:
        if len(od)>=s: od.popitem(last=False)
        od[k]=1
    (hh if k//256<hashl else sh)[0]+=hit; (hh if k//256<hashl else sh)[1]+=1
print(f"hash layers hit {hh[0]/max(1,hh[1])*100:.1f}% scored {sh[0]/sh[1]*100:.1f}%")
# per-layer: max uses of an expert in the layer, distinct per layer
per=collections.defaultdict(collections.Counter)
for l,e,t in seq: per[l][e]+=1
print("distinct/layer", [len(per[l]) for l in range(0,L,6)], "top use", [per[l].most_common(1)[0][1] for l in range(0,L,6)])
