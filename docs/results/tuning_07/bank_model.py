#!/usr/bin/env python3
"""Round 13 (tuning_07/README.md): shared-memory wavefronts of every read
(and the score stores) of the atomic dkdv_kernel's pass, from the addresses
each lane supplies, for the 2-D warp tiles (d = 128 and, atomic, d = 64).

The address math mirrors the kernel's (stages/common/smem_tile_sm80.cuh,
stages/07_tensor_core/tensor_core_backward{.cuh,_tiles.h}): the swizzle
tile_offset (chunk ^ row % 8 in each span of 8 chunks), the ldmatrix lane
points a_point, k_point and v_point, LaneOffsets, dst_lane_offset, the
shared-memory layout of dkdv_block and each product's warp tiling. The
constants are those of BackwardConfig<bucket, atomic>.

Bank model (32 banks of 4 bytes): an instruction's lanes split into phases
(ldmatrix: one 8 x 8 matrix, its 8 lanes' 16-byte rows, per phase; a
64-bit LDS: two half-warps; a 32-bit LDS / STS: the warp); a phase takes
as many wavefronts as the most distinct 4-byte words any one bank holds
(lanes reading the same word share it). ncu's ideal for ldmatrix.x4 is 4
wavefronts, for LDS.64 2 (ablation16.csv's counts reproduce it, below).

    python3 bank_model.py          # every site, both buckets, every warp

What it shows: every read site of every warp takes its ideal wavefronts (4
an ldmatrix.x4, 2 an LDS.64) and every score store 1, at d = 128 and 64;
the ideal sums, times ablation16.csv's passes, are exactly ncu's load
wavefronts less its load bank conflicts (620.8 M at d = 128 both before and
after round 12, 637.5 M at d = 64). So the conflicts ncu counts (18.7 M ->
41 M at d = 128) are not in any instruction's own addresses: most likely
wavefronts lost to other traffic at the data banks at the time (the dQ
reductions, which the deterministic kernel, 69 conflicts, lacks), and they
grew when round 12 moved the dQ reductions among the dV product's ldmatrix
reads.
"""
import itertools

BANKS, BANK_BYTES = 32, 4
ELEM_BYTES = 2               # bf16 / fp16
CHUNK = 8                    # kChunkElems: 16 bytes
SPAN = 8 * CHUNK             # kSwizzleSpan
MMA_M, MMA_N, MMA_K = 16, 8, 16
WARP = 32
BR = 64                      # kBr
TILE_KEY_WARPS, TILE_SIDE_WARPS = 4, 2


def tile_offset(cols, row, col):
    """Element offset of (row, col) in a swizzled [rows][cols] tile."""
    chunk = col // CHUNK
    swizzled = (chunk & ~7) | ((chunk & 7) ^ (row & 7))
    return row * cols + swizzled * CHUNK + col % CHUNK


def a_point(lane):
    return lane % 16, lane // 16 * CHUNK


def k_point(lane):
    return lane % 8 + lane // 16 * 8, lane // 8 % 2 * CHUNK


def v_point(lane):
    return lane % 8 + lane // 8 % 2 * 8, lane // 16 * CHUNK


def lane_offsets(cols, point):
    """LaneOffsets<cols>(point) as a function (row0, col0) -> offset."""
    prow, pcol = point
    at = [tile_offset(cols, prow, b * MMA_K + pcol) for b in range(SPAN // MMA_K)]
    return lambda row0, col0: row0 * cols + col0 // SPAN * SPAN + at[col0 % SPAN // MMA_K]


class Config:
    """BackwardConfig<bucket, true> with the 2-D warp tiles."""

    def __init__(self, d):
        self.d = d
        self.br = 2 * BR if d == 64 else BR              # q_block
        self.bc = 128                                    # block_keys
        self.dq_row_groups = 2 if d == 128 else 4
        self.warps = 8
        self.dq_cols = d * self.dq_row_groups // self.warps
        self.dq_row_tiles = self.br // self.dq_row_groups // MMA_M
        self.key_tiles = self.bc // TILE_KEY_WARPS // MMA_M
        self.grad_tiles = d // TILE_SIDE_WARPS // MMA_N
        self.tile_q_tiles = self.br // TILE_SIDE_WARPS // MMA_N
        # dkdv_block's shared memory, in bytes
        kv, q, ds = self.bc * d, self.br * d, self.br * self.bc
        self.Kj = 0
        self.Vj = kv * ELEM_BYTES
        self.Qbuf = 2 * kv * ELEM_BYTES
        self.dObuf = self.Qbuf + 2 * q * ELEM_BYTES
        self.Lbuf = self.dObuf + 2 * q * ELEM_BYTES
        self.Dbuf = self.Lbuf + 2 * self.br * 4
        self.dS = self.Dbuf + 2 * self.br * 4
        self.PT = self.dS + ds * ELEM_BYTES


def wavefronts(phases):
    """phases: lists of (byte address, bytes) of one phase each."""
    total = 0
    for phase in phases:
        words = {}
        for addr, size in phase:
            for w in range(addr // BANK_BYTES, (addr + size) // BANK_BYTES):
                words.setdefault(w % BANKS, set()).add(w)
        total += max(len(s) for s in words.values())
    return total


def ldmatrix(addrs):
    """ldmatrix.x4: lane l's 16-byte row, matrix l / 8 a phase."""
    return wavefronts([[(addrs[l], 16) for l in range(m * 8, m * 8 + 8)] for m in range(4)])


def lds(addrs, size):
    """A plain LDS / STS of `size` bytes a lane: 128 bytes of lanes a phase."""
    per = 128 // size
    return wavefronts([[(addrs[l], size) for l in range(p, p + per)]
                       for p in range(0, WARP, per)])


def sites(c, warp):
    """(site, wavefronts, ideal) of every shared access of `warp` in one pass
    (buffer 0 of Qi, dOi, L, D)."""
    out = []
    key_row0 = warp % TILE_KEY_WARPS * c.key_tiles * MMA_M
    q_col0 = warp // TILE_KEY_WARPS * c.tile_q_tiles * MMA_N
    col0 = warp // TILE_KEY_WARPS * c.grad_tiles * MMA_N
    col_in_table = c.grad_tiles * MMA_N < SPAN
    E = ELEM_BYTES

    def ld(site, addrs):
        out.append((site, ldmatrix(addrs), 4))

    # S^T = Kw Qw^T and dP^T = Vw dOw^T (product_abt_2d)
    for name, A, B in (("S^T", c.Kj, c.Qbuf), ("dP^T", c.Vj, c.dObuf)):
        for ks in range(c.d // MMA_K):
            for mt in range(c.key_tiles):
                ld(f"{name} A (Kw/Vw, ldmatrix)",
                   [A + E * lane_offsets(c.d, a_point(l))(key_row0 + mt * MMA_M, ks * MMA_K)
                    for l in range(WARP)])
            for np_ in range(c.tile_q_tiles // 2):
                ld(f"{name} B (Qw/dOw, ldmatrix)",
                   [B + E * (q_col0 * c.d + lane_offsets(c.d, k_point(l))(np_ * 2 * MMA_N,
                                                                          ks * MMA_K))
                    for l in range(WARP)])
    # L and D of the warp's queries: Ls[q], Ls[q + 1] as one LDS.64
    t = [l % 4 for l in range(WARP)]
    for name, base in (("L", c.Lbuf), ("D", c.Dbuf)):
        for nt in range(c.tile_q_tiles):
            out.append((f"{name}s[q] (LDS.64)",
                        lds([base + 4 * (q_col0 + nt * MMA_N + 2 * t[l]) for l in range(WARP)], 8),
                        2))
    # P^T and dS^T stores (store_scores_transposed): a lane's two queries, 32 bits
    for name, base in (("P^T", c.PT), ("dS^T", c.dS)):
        for mt, nt, h in itertools.product(range(c.key_tiles), range(c.tile_q_tiles), range(2)):
            out.append((f"{name} store (STS.32)",
                        lds([base + E * tile_offset(c.br, key_row0 + mt * MMA_M + l // 4 + 8 * h,
                                                    q_col0 + nt * MMA_N + 2 * (l % 4))
                             for l in range(WARP)], 4), 1))
    # dV += P^T dOi and dK += dS^T Qi (product_ab_2d)
    for name, A, B in (("dV", c.PT, c.dObuf), ("dK", c.dS, c.Qbuf)):
        grad_col0 = 0 if col_in_table else col0
        for kk in range(c.br // MMA_K):
            for mt in range(c.key_tiles):
                ld(f"{name} A (P^T/dS^T, ldmatrix)",
                   [A + E * lane_offsets(c.br, a_point(l))(key_row0 + mt * MMA_M, kk * MMA_K)
                    for l in range(WARP)])
            for np_ in range(c.grad_tiles // 2):
                def addr(l):
                    vr, vc = v_point(l)
                    at = lane_offsets(c.d, (vr, vc + (col0 if col_in_table else 0)))
                    return B + E * (grad_col0 + at(kk * MMA_K, np_ * 2 * MMA_N))
                ld(f"{name} B (dOi/Qi, ldmatrix.trans)", [addr(l) for l in range(WARP)])
    # dQ += dS Kj (dq_step)
    q_row0 = warp % c.dq_row_groups * c.dq_row_tiles * MMA_M
    dq_col0 = warp // c.dq_row_groups * c.dq_cols
    for kk in range(c.bc // MMA_K):
        for mt in range(c.dq_row_tiles):
            def ds_addr(l):  # dst_lane_offset<Br>(q_row0 + 16 mt) + k0 Br
                prow, pcol = k_point(l)
                return c.dS + E * (tile_offset(c.br, prow, q_row0 + mt * MMA_M + pcol)
                                   + kk * MMA_K * c.br)
            ld("dQ A (dS^T, ldmatrix.trans)", [ds_addr(l) for l in range(WARP)])
        for np_ in range(c.dq_cols // MMA_N // 2):
            def k_addr(l):
                vr, vc = v_point(l)
                return c.Kj + E * lane_offsets(c.d, (vr, vc + dq_col0))(kk * MMA_K,
                                                                        np_ * 2 * MMA_N)
            ld("dQ B (Kj, ldmatrix.trans)", [k_addr(l) for l in range(WARP)])
    return out


def main():
    for d in (128, 64):
        c = Config(d)
        print(f"== d = {d}: atomic dkdv_kernel, Br = {c.br}, Bc = {c.bc}, 8 warps; "
              "per warp and pass, all warps")
        print(f"{'site':36} {'instr':>6} {'wavefronts':>10} {'ideal':>6} {'max/instr':>9}")
        rows = {}
        for warp in range(c.warps):
            for site, wf, ideal in sites(c, warp):
                r = rows.setdefault(site, [0, 0, 0, 0])
                r[0] += 1
                r[1] += wf
                r[2] += ideal
                r[3] = max(r[3], wf)
        total = [0, 0, 0]
        for site, (n, wf, ideal, worst) in rows.items():
            print(f"{site:36} {n / c.warps:6.0f} {wf / c.warps:10.1f} {ideal / c.warps:6.0f} "
                  f"{worst:9d}")
            if "store" not in site:
                total[0] += n
                total[1] += wf
                total[2] += ideal
        print(f"{'loads, all sites':36} {total[0] / c.warps:6.0f} {total[1] / c.warps:10.1f} "
              f"{total[2] / c.warps:6.0f}   excess (conflict) wavefronts: "
              f"{(total[1] - total[2]) / c.warps:.1f} a warp-pass")
        # ablation16.csv's shapes, N = 4096, B = 4, not causal: 32 K/V blocks,
        # B H of them each, N / Br passes, 8 warps.
        heads, measured = ((64, "ncu: 639.5 M - 18.7 M conflicts before round 12, "
                                "661.7 M - 41.0 M after: 620.8 M both")
                           if d == 128 else (128, "ncu: 640.8 M - 3.3 M conflicts: 637.5 M"))
        warp_passes = 32 * heads * (4096 // c.br) * c.warps
        print(f"N = 4096, B = 4, H = {heads // 4}: ideal shared-load wavefronts "
              f"{total[2] / c.warps * warp_passes / 1e6:.1f} M ({measured})")
        print()
    # The model sees conflicts where there are some: S^T's A read of Kj
    # (rows 256 bytes) without the swizzle is 8-way, 32 wavefronts.
    unswizzled = [ELEM_BYTES * (a_point(l)[0] * 128 + a_point(l)[1]) for l in range(WARP)]
    print(f"check: Kw read without the swizzle, {ldmatrix(unswizzled)} wavefronts (8-way)")


if __name__ == "__main__":
    main()
