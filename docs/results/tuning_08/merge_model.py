# CPU model of stage 08 step 5's hand-overs at d = 128 with kMergeItems
# (hopper.cuh, ping_pong_tiles: the next item's first S issued in this
# item's last turn): producer thread, two consumers taking turns, two Qi
# buffers (q_full[2], q_empty[2]), K/V buffers with full and empty mbarriers,
# under random interleavings; items with random n_blocks (0 too) and idle
# consumers (rows past Nq: pass_tiles). A consumer runs on into the next
# item only when both items run whole for every consumer (runs_whole).
# Asserts no double arrival on a turn barrier, no deadlock, no arrival left
# over. Run: python3 merge_model.py -> prints 0 and [], then the failing
# runs of the planted fault (a merge decided per consumer, so that the two
# take different numbers of turns: > 0).
import random
from handover_model import KS, Bar, Turn  # its mbarriers and turn counters
PER_CONSUMER_MERGE = False  # the planted fault
def producer(B, items):
    def copy(kind, t):
        b = t % KS; par = (t // KS) % 2 ^ 1
        while not B[kind + '_empty'][b].done(par): yield
        B[kind + '_full'][b].arrive()
    tiles = 0
    for k, (n, idle) in enumerate(items):
        while not B['q_empty'][k % 2].done((k // 2) % 2 ^ 1): yield
        B['q_full'][k % 2].arrive()
        for j in range(n - 1, -1, -1):
            yield from copy('k', tiles); yield from copy('v', tiles); tiles += 1
def consumer(B, T, items, w, nc):
    def my_turn():
        while T[w].pending == 0: yield
        T[w].pending -= 1
    def your_turn():
        nxt = (w + 1) % nc
        assert T[nxt].pending == 0, 'double arrive'
        T[nxt].pending += 1
        return; yield
    def wait(kind, t):
        while not B[kind + '_full'][t % KS].done((t // KS) % 2): yield
    def own(it, v): return 0 if v in it[1] else it[0]
    def whole(it):
        if it[0] == 0: return False
        if PER_CONSUMER_MERGE: return own(it, w) == it[0]
        return all(own(it, v) == it[0] for v in range(nc))
    rel = lambda k: B['q_empty'][k % 2].arrive()
    tiles = 0
    if w == nc - 1: yield from your_turn()
    k = 0
    while k < len(items):
        while not B['q_full'][k % 2].done((k // 2) % 2): yield
        n_block = items[k][0]; n = own(items[k], w)
        if n_block == 0: rel(k)
        elif n == 0:  # pass_tiles
            rel(k); first = tiles
            for kk in range(n_block + 1):
                t = first + kk
                if kk < n_block: yield from wait('k', t)
                if kk > 0: yield from wait('v', t - 1)
                yield from my_turn(); yield from your_turn()
                if kk < n_block: B['k_empty'][t % KS].arrive()
                if kk > 0: B['v_empty'][(t - 1) % KS].arrive()
            tiles = first + n_block
        else:
            yield from wait('k', tiles); yield from my_turn(); yield from your_turn()
            B['k_empty'][tiles % KS].arrive()
            if n == 1: rel(k)
            tiles += 1
            while True:
                for j in range(n - 2, -1, -1):
                    yield from wait('k', tiles); yield from wait('v', tiles - 1)
                    if j < n - 2: B['v_empty'][(tiles - 2) % KS].arrive()
                    yield from my_turn(); yield from your_turn()
                    B['k_empty'][tiles % KS].arrive()
                    if j == 0: rel(k)
                    tiles += 1
                if not (whole(items[k]) and k + 1 < len(items) and whole(items[k + 1])): break
                k += 1  # next_item: the boundary turn
                while not B['q_full'][k % 2].done((k // 2) % 2): yield
                yield from wait('k', tiles); yield from wait('v', tiles - 1)
                if n > 1: B['v_empty'][(tiles - 2) % KS].arrive()
                yield from my_turn(); yield from your_turn()
                B['k_empty'][tiles % KS].arrive()
                n = items[k][0]
                if n == 1: rel(k)
                tiles += 1
                B['v_empty'][(tiles - 2) % KS].arrive()
            yield from wait('v', tiles - 1)
            if n > 1: B['v_empty'][(tiles - 2) % KS].arrive()
            yield from my_turn(); yield from your_turn()
            B['v_empty'][(tiles - 1) % KS].arrive()
        k += 1
    if w == 0: yield from my_turn()
def run(seed):
    rnd = random.Random(seed); nc = 2
    items = []
    for _ in range(rnd.randint(1, 6)):
        n = rnd.choice([0, 1, 1, 2, 3, 4, 5])
        items.append((n, rnd.choice([set(), set(), set(), {1}])))
    B = {'q_full': [Bar(1), Bar(1)], 'q_empty': [Bar(nc), Bar(nc)],
         'k_full': [Bar(1) for _ in range(KS)], 'k_empty': [Bar(nc) for _ in range(KS)],
         'v_full': [Bar(1) for _ in range(KS)], 'v_empty': [Bar(nc) for _ in range(KS)]}
    T = [Turn() for _ in range(nc)]
    procs = [producer(B, items)] + [consumer(B, T, items, w, nc) for w in range(nc)]
    alive = list(range(len(procs))); stuck = 0
    while alive:
        i = rnd.choice(alive)
        try:
            next(procs[i]); stuck += 1
        except AssertionError as e:
            return (seed, items, str(e))
        except StopIteration:
            alive.remove(i); stuck = 0
            continue
        if stuck > 20000: return (seed, items, 'DEADLOCK', alive)
    if any(t.pending for t in T): return (seed, items, 'LEFTOVER')
    if any(b.arr for b in B['k_empty'] + B['v_empty'] + B['q_empty']): return (seed, items, 'PARTIAL')
    return None
bad = [r for r in (run(s) for s in range(4000)) if r]
print(len(bad)); print(bad[:3])
PER_CONSUMER_MERGE = True
print(len([r for r in (run(s) for s in range(4000)) if r]))
