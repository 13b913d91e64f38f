#!/usr/bin/env bash
# perf_record.sh -- the runs behind docs/PERFORMANCE.md, in one place, so every number there
# can be reproduced with one command. Each step writes into OUT (default docs/data/): the
# markdown tables, CSVs and plots the document quotes. Run on a quiet machine; each step is
# interleaved and repeated, but a 2-core VM still moves by tens of percent between runs.
#
#   bench/perf_record.sh [OUT]            all steps (about 40 minutes on 2 cores)
#   STEPS="tcp shm" bench/perf_record.sh  some of: tcp shm kernels colls algos peers
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/data}
steps=${STEPS:-"tcp shm kernels colls algos peers"}
py=/usr/bin/python3
mkdir -p "$out"
log() { printf '[perf_record %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

for step in $steps; do
  case $step in
  tcp) # issue 2: khor over TCP loopback vs OpenMPI's TCP BTL, 8 B and 64 MiB
    log "tcp: 8 B"
    $py bench/compare.py -c allreduce -n 2 4 -b 8 -e 8 -i 3000 -w 200 -R 7 --khor tcp \
      --peers mpi-tcp -o "$out/tcp-8B" >/dev/null
    log "tcp: 64 MiB"
    $py bench/compare.py -c allreduce -n 2 4 -b 64M -e 64M -i 10 -w 2 -R 5 --khor tcp \
      --peers mpi-tcp -o "$out/tcp-64M" >/dev/null ;;
  shm) # issue 4: khor over shared memory vs OpenMPI's vader, plus memcpy in the same run
    log "shm: memcpy at 64 MiB"
    ./build/kernel-bench -b 64M -e 64M -d float > "$out/shm-memcpy.txt"
    log "shm: 8 B"
    $py bench/compare.py -c allreduce -n 2 4 -b 8 -e 8 -i 20000 -w 500 -R 7 --khor shm \
      --peers mpi-shm -o "$out/shm-8B" >/dev/null
    log "shm: 64 MiB"
    $py bench/compare.py -c allreduce -n 2 4 -b 64M -e 64M -i 10 -w 2 -R 5 --khor shm \
      --peers mpi-shm -o "$out/shm-64M" >/dev/null
    ./build/kernel-bench -b 64M -e 64M -d float >> "$out/shm-memcpy.txt" ;;
  kernels) # issue 3: reduction kernels against memcpy
    log "kernels"
    ./build/kernel-bench > "$out/kernels.txt" ;;
  colls) # issue 3: every collective against OpenMPI over TCP
    log "colls: every collective, n=4"
    $py bench/compare.py -c all -n 4 -b 8 -e 16M -f 16 -i 10 -w 2 -R 3 --khor tcp \
      --peers mpi-tcp -o "$out/colls-tcp" >/dev/null ;;
  algos) # issue 3: every allreduce algorithm and auto, interleaved
    log "algos: n=2 4 8, 8 B .. 256 MiB, every power of two"
    $py bench/algo_sweep.py -n 2 4 8 -b 8 -e 256M -f 2 -R 5 --extra "--transport tcp" \
      --csv "$out/algos-tcp.csv" > "$out/algos-tcp.md" ;;
  peers) # issue 5: khor's transports against OpenMPI (tcp, vader) and gloo, with a plot
    log "peers: allreduce and allgather, n=2 4"
    $py bench/compare.py -c allreduce allgather -n 2 4 -b 8 -e 16M -f 8 -i 10 -w 2 -R 3 \
      --khor tcp shm --peers mpi-tcp mpi-shm gloo -o "$out/peers" >/dev/null ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
log "done: $out"
