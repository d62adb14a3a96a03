"""Run 13 (README.md): CUPTI kernel timeline (torch.profiler) after a read flush of stage 09 through the C ABI and SDPA's cuDNN and flash backends, bf16 decode points; the host time a call beside. Ran on the H200 from the repository root after building libflashstep.so (cmake --build build --target flashstep_capi): python3 docs/results/tuning_09/run13_timeline.py > run13_timeline.txt."""
import json, statistics as st, sys, time
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from torch.profiler import profile, ProfilerActivity
sys.path.insert(0, "notebooks")
import flashstep as fs
TRACE = "/tmp/run13_trace.json"  # scratch: the profiler writes its trace here
flush = torch.zeros(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4, dtype=torch.float32, device="cuda")
def runner(name, q, k, v):
    if name == "09":
        return lambda: fs.forward(q, k, v, stage="09_split_kv")
    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[name]
    def f():
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=k.shape[1] != q.shape[1])
    return f
def short(n): return n.split("(")[0].split("<")[0].split("::")[-1][-26:]
for (hkv, b, nk) in [(1, 1, 1024), (1, 8, 1024), (1, 1, 4096), (8, 1, 1024), (1, 64, 1024), (1, 1, 32768)]:
    q = torch.randn(b, 32, 1, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, hkv, nk, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(b, hkv, nk, 128, dtype=torch.bfloat16, device="cuda")
    for name in ["09", "cudnn", "flash"]:
        f = runner(name, q, k, v)
        for _ in range(5): f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200): f()
        host = (time.perf_counter() - t0) / 200 * 1e6
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(30):
                flush.sum(); f()
            torch.cuda.synchronize()
        prof.export_chrome_trace(TRACE)
        ev = sorted([e for e in json.load(open(TRACE))["traceEvents"] if e.get("cat") == "kernel"], key=lambda e: e["ts"])
        its, cur = [], None
        for e in ev:
            if "reduce_kernel" in e["name"]:
                if cur is not None: its.append(cur)
                cur = [e]
            elif cur is not None: cur.append(e)
        if cur: its.append(cur)
        n = max(len(it) for it in its); its = [it for it in its if len(it) == n][3:]
        parts = []
        for i in range(1, n):
            gap = st.median(it[i]["ts"] - it[i-1]["ts"] - it[i-1]["dur"] for it in its)
            parts.append(f"gap {gap:.1f} {short(its[0][i]['name'])} {st.median(it[i]['dur'] for it in its):.1f}")
        span = st.median(it[-1]["ts"] + it[-1]["dur"] - it[1]["ts"] for it in its)
        print(f"Hkv{hkv} B{b} Nk{nk} {name:5s} host {host:5.1f} us/call | span {span:5.1f} | " + " ; ".join(parts), flush=True)
