# Round 11 (tuning_07/README.md): per-opcode warp-stall samples from ncu --page source --csv --print-source sass
# exports of one dkdv kernel launch (ncu --clock-control none, SourceCounters), d = 64, N = 4096, B = 4, H = 32, bf16.
# usage: python3 run11_stalls.py EXPORT.csv [...]
import csv,sys,collections,re
def load(f):
    lines=open(f).read().splitlines()
    rows=list(csv.DictReader(lines[1:]))
    return rows
cols=["stall_barrier","stall_long_sb","stall_math","stall_mio","stall_short_sb","stall_wait","stall_dispatch","stall_not_selected","stall_selected","stall_lg","stall_branch_resolving"]
for f in sys.argv[1:]:
    rows=load(f)
    tot=collections.Counter(); byop=collections.defaultdict(collections.Counter); n=0
    for r in rows:
        src=r['Source'].strip()
        op=re.sub(r'^@!?U?P\w+\s+','',src).split(' ')[0]
        try: s=int(r['Warp Stall Sampling (All Samples)'].replace(',','') or 0)
        except: continue
        n+=s
        for c in cols:
            v=int((r.get(c) or '0').replace(',',''))
            tot[c]+=v; byop[op][c]+=v
        byop[op]['all']+=s; byop[op]['inst']+=int((r['Instructions Executed'] or '0').replace(',',''))
    print("==",f,"samples",n)
    print(' '.join(f"{c[6:]}={tot[c]/n*100:.1f}%" for c in cols))
    for op,c in sorted(byop.items(),key=lambda kv:-kv[1]['all'])[:14]:
        print(f"{op:22s} samp={c['all']/n*100:5.1f}% inst={c['inst']/1e6:7.1f}M " + ' '.join(f"{k[6:]}={c[k]/n*100:.1f}" for k in cols if c[k]/n>0.01))
