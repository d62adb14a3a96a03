"""Run 13 (README.md): host time a call of a loop of 2000 decode calls (MQA, B 1, Nq 1, Nk 1024, H 32, d 128, bf16), stage 09 through notebooks/flashstep.py beside SDPA's cuDNN backend; the second half of run13_host_cost.txt. Ran on the H200 from the repository root after building libflashstep.so: python3 docs/results/tuning_09/run13_host_loop.py"""
import sys, time, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
sys.path.insert(0, "notebooks")
import flashstep as fs
q = torch.randn(1, 32, 1, 128, dtype=torch.bfloat16, device="cuda")
k = torch.randn(1, 1, 1024, 128, dtype=torch.bfloat16, device="cuda")
v = torch.randn(1, 1, 1024, 128, dtype=torch.bfloat16, device="cuda")
def sd():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
for name, f in [("09 C ABI", lambda: fs.forward(q, k, v, stage="09_split_kv")), ("cudnn", sd)]:
    for _ in range(20): f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(2000): f()
    torch.cuda.synchronize()
    print(f"{name}: {(time.perf_counter() - t0) / 2000 * 1e6:.1f} us/call (host-bound loop)")
