# A model of how evenly stage 08's persistent blocks share a causal problem
# at d = 64 (192-row Q blocks, 128-key tiles, Nq = Nk = N, B H = 8 x 32 heads
# at N = 2048, the heads halved as N doubles; 132 SMs): a block's time is the
# sum of its items' costs, an item's cost its K/V tiles plus a fixed
# `overhead` in tiles (first softmax alone, last P~V, the epilogue). Printed:
# the last block's end over the mean block's end (1 = no tail), for
# - pairs: WsCursor, units of Q blocks r and Tr - 1 - r of one head, head by
#   head, the odd Tr's middle items last, block b taking units b, b + 132, ...;
# - lpt: LptCursor, FlashAttention-3's DynamicPersistentTileScheduler: items in
#   sections of heads whose K and V fit 32 MiB, heaviest rank first within a
#   section, each block taking the next item from a counter when it starts one
#   (a block finishing first takes first).
# Run: python3 lpt_schedule_model.py
import heapq

SMS, ROWS, KEYS, D = 132, 192, 128, 64


def tiles_per_rank(N):
    """K/V tiles of Q block i (0 = the first, lightest) under a causal mask."""
    Tr = (N - 1) // ROWS + 1
    return Tr, [(min(ROWS * (i + 1), N) - 1) // KEYS + 1 for i in range(Tr)]


def pairs(N, heads, overhead):
    Tr, nb = tiles_per_rank(N)
    units = [nb[Tr - 1 - r] + nb[r] + 2 * overhead for _ in range(heads) for r in range(Tr // 2)]
    units += [nb[Tr // 2] + overhead] * (heads if Tr % 2 else 0)
    ends = [0.0] * SMS
    for u, cost in enumerate(units):
        ends[u % SMS] += cost
    return max(ends)


def lpt(N, heads, overhead):
    Tr, nb = tiles_per_rank(N)
    head_bytes = N * 2 * D * 2
    section = 1
    while 2 * section * head_bytes <= 32 * 2**20:
        section *= 2
    order = [nb[Tr - 1 - r] + overhead
             for first in range(0, heads, section)
             for r in range(Tr) for _ in range(min(section, heads - first))]
    ends = [(0.0, b) for b in range(SMS)]
    for cost in order:  # the block that is free first takes the next item
        t, b = heapq.heappop(ends)
        heapq.heappush(ends, (t + cost, b))
    return max(t for t, _ in ends)


for overhead in (0.5, 1.0, 1.5):
    for N in (2048, 4096, 8192, 16384):
        heads = 256 * 2048 // N
        Tr, nb = tiles_per_rank(N)
        mean = heads * (sum(nb) + Tr * overhead) / SMS
        print(f"overhead {overhead} N {N:5d}: pairs x{pairs(N, heads, overhead) / mean:.3f}"
              f"  lpt x{lpt(N, heads, overhead) / mean:.3f}")
