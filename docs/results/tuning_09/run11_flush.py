# Run 11 (tuning_09/README.md): the flush comparison behind run11_flush.txt, as it ran on the H200 from the repository root after building libflashstep.so (cmake --build build --target flashstep_capi).
"""Does the L2 flush's dirty write-back land in the timed decode? Time stage 09 and cuDNN with a write flush vs a write-then-read flush."""
import statistics as st, sys
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
sys.path.insert(0, "notebooks")
import flashstep as fs
l2 = torch.cuda.get_device_properties(0).L2_cache_size
a = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")
b = torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda").fill_(1)
def dirty(): a.fill_(7)
def clean(): a.fill_(7); b.sum()
def t(fn, flush, iters=30):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3): flush(); fn()
    v = []
    for _ in range(iters):
        flush(); s.record(); fn(); e.record(); e.synchronize(); v.append(s.elapsed_time(e) * 1000)
    return st.median(v)
print("L2", l2)
x = torch.empty(2**30 // 4, device="cuda"); y = torch.empty_like(x)
for name, fl in (("dirty", dirty), ("clean", clean)):
    print("copy 1 GiB", name, "%.1f us" % t(lambda: y.copy_(x), fl, 10))
for (nq, hkv, bb, nk) in [(1, 8, 1, 32768), (1, 1, 1, 32768), (1, 32, 1, 16384), (1, 8, 1, 262144), (1, 1, 64, 32768), (1, 32, 8, 1024)]:
    q = torch.randn(bb, 32, nq, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(bb, hkv, nk, 128, dtype=torch.bfloat16, device="cuda"); v = torch.randn_like(k)
    mb = 2 * k.numel() * 2 / 1e6
    ours = lambda: fs.forward(q, k, v, stage="09_split_kv")
    def cud():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, enable_gqa=hkv != 32)
    # bytes a flush-free kernel could read of a 2 GiB-copy-like stream:
    row = []
    for name, fn in (("09", ours), ("cudnn", cud)):
        for fl_name, fl in (("dirty", dirty), ("clean", clean)):
            us = t(fn, fl)
            row.append(f"{name}/{fl_name} {us:.1f}us ({mb/us/4.23*100:.0f}% of 4.23 TB/s)")
    print(f"nq{nq} hkv{hkv} b{bb} nk{nk} {mb:.0f} MB | " + " | ".join(row))
