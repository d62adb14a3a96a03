# Run 11 (tuning_09/README.md): the kernel timeline behind run11_timeline.txt, as it ran on the H200 from the repository root after building libflashstep.so (cmake --build build --target flashstep_capi): python3 docs/results/tuning_09/run11_timeline.py /tmp/tl. Its L2 flush is the write flush (fill_) the run examined; the summary table was made from the traces it writes.
"""Kernel timeline (CUPTI through torch.profiler) of stage 09 and SDPA's bf16 backends on decode points."""
import json, os, statistics as st, sys
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from torch.profiler import profile, ProfilerActivity
sys.path.insert(0, "notebooks")
import flashstep as fs
out = sys.argv[1]
points = [(1, 8, 1, 32768), (1, 1, 1, 32768), (1, 1, 1, 524288), (1, 32, 1, 16384), (1, 1, 64, 32768), (1, 8, 1, 262144), (4, 1, 8, 32768)]
flush = torch.empty(2 * 60 * 2**20, dtype=torch.uint8, device="cuda")
def runner(name, q, k, v):
    if name.startswith("09"):
        return lambda: fs.forward(q, k, v, stage=name)
    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[name]
    def f():
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=k.shape[1] != q.shape[1])
    return f
for (nq, hkv, b, nk) in points:
    torch.manual_seed(0)
    q = torch.randn(b, 32, nq, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, hkv, nk, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, hkv, nk, 128, dtype=torch.bfloat16, device="cuda")
    for name in ["09_split_kv", "cudnn", "flash"]:
        f = runner(name, q, k, v)
        try:
            for _ in range(3): f()
        except Exception as e:
            print(f"nq{nq} hkv{hkv} b{b} nk{nk} {name}: {type(e).__name__}: {str(e)[:80]}"); continue
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                flush.zero_()
                f()
            torch.cuda.synchronize()
        path = f"{out}/tl_nq{nq}_hkv{hkv}_b{b}_nk{nk}_{name}.json"
        prof.export_chrome_trace(path)
        ev = [e for e in json.load(open(path))["traceEvents"] if e.get("cat") == "kernel"]
        ev.sort(key=lambda e: e["ts"])
        its, cur = [], None
        for e in ev:
            if "FillFunctor" in e["name"]:
                if cur: its.append(cur)
                cur = []
            elif cur is not None:
                cur.append(e)
        if cur: its.append(cur)
        names = {}
        for it in its:
            for e in it:
                names.setdefault(e["name"].split("(")[0].split("<")[0][-40:], []).append(e["dur"])
        span = st.median([it[-1]["ts"] + it[-1]["dur"] - it[0]["ts"] for it in its if it])
        gaps = st.median([sum(b2["ts"] - (a["ts"] + a["dur"]) for a, b2 in zip(it, it[1:])) for it in its if it])
        ks = "; ".join(f"{n} x{len(d)//len(its)} {st.median(d):.1f}us" for n, d in names.items())
        print(f"nq{nq} hkv{hkv} b{b} nk{nk} {name:12s} span={span:.1f}us gaps={gaps:.1f}us | {ks}")
