#!/bin/bash
# ab8.sh R SIZE ITERS: allreduce at 2 ranks, interleaved per round: khor built in $BASE
# (the build before), khor built in $NEW (default: build) and, beside shm, OpenMPI's vader;
# T=tcp|shm (default shm). Prints medians and the per-round ratios (med.py).
#   BASE=/tmp/base/build docs/data/shm-small/ab8.sh 9 8 20000
R=${1:-7}; S=${2:-8}; I=${3:-20000}; T=${T:-shm}
BASE=${BASE:?set BASE to the build directory of the build before}; NEW=${NEW:-build}
OUT=${OUT:-/tmp/ab/out.$T.$S}; rm -rf "$OUT"; mkdir -p "$OUT"
for r in $(seq "$R"); do
  for b in base new; do
    B=$BASE; [ $b = new ] && B=$NEW
    "$B/khorrun" -np 2 "$B/khor-bench" --transport "$T" --algo auto allreduce -b "$S" -e "$S" \
      -n "$I" -w 500 -c 1 --csv "$OUT/$b.$r.csv" -q >/dev/null 2>&1 || echo "$b run $r failed"
  done
  [ "$T" = shm ] && mpirun --oversubscribe --allow-run-as-root --mca pml ob1 \
    --mca btl vader,self -np 2 "$NEW/mpi-bench" allreduce -b "$S" -e "$S" -f 2 -n "$I" -w 500 \
    --csv "$OUT/mpi.$r.csv" -q >/dev/null 2>&1
done
python3 "$(dirname "$0")/med.py" "$OUT" base new mpi
