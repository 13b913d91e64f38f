# med.py OUT SERIES...: medians of ab8.sh's CSVs, and per-round ratios new/base, new/mpi
import csv,glob,sys,statistics
out=sys.argv[1]
for b in sys.argv[2:]:
    ts=[];bw=[]
    for f in sorted(glob.glob(f"{out}/{b}.*.csv")):
        rows=list(csv.DictReader(open(f)))
        if rows: ts.append(float(rows[-1]['time_us'])); bw.append(float(rows[-1]['busbw_gbs']))
    if ts: print(f"{b:5s} median {statistics.median(ts):.3f} us  busbw {statistics.median(bw):.3f} GB/s  all: "+" ".join(f"{t:.3f}" for t in sorted(ts)))
def t(b,r):
    try:
        rows=list(csv.DictReader(open(f"{out}/{b}.{r}.csv"))); return float(rows[-1]['time_us'])
    except Exception: return None
rs=sorted({int(f.split('.')[-2]) for f in glob.glob(f"{out}/new.*.csv")})
rat=[t('new',r)/t('base',r) for r in rs if t('new',r) and t('base',r)]
ratm=[t('new',r)/t('mpi',r) for r in rs if t('new',r) and t('mpi',r)]
if rat: print("new/base per round: median %.3f  " % statistics.median(rat) + " ".join("%.2f"%x for x in rat))
if ratm: print("new/mpi per round: median %.3f  " % statistics.median(ratm) + " ".join("%.2f"%x for x in ratm))
