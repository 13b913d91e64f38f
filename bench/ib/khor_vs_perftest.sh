#!/usr/bin/env bash
# khor_vs_perftest.sh -- PERFORMANCE section 12: khor's allreduce over ib and over tcp at
# n = 2, next to perftest's ib_write_bw and ib_send_lat, all in one boot of the soft-RoCE VM
# (their ratios mean something only within one boot: the VM runs under TCG).
#
#   bench/ib/khor_vs_perftest.sh [BUILD_DIR] [OUT_DIR]     (defaults: build, docs/data/ib)
#
# Also: perftest's ib_write_bw in both directions at once, and the transports alone
# (shm-pingpong over ib and tcp: one-way time of a message, no collective on top).
# Writes perftest.txt (the perftest reports and khor-bench's tables), pingpong_ib.txt,
# pingpong_tcp.txt, allreduce_ib.csv,
# allreduce_tcp.csv, allreduce_ib_1qp.csv (one QP per link) and latency_ib.csv /
# latency_tcp.csv (8 B, 2000 calls) under OUT_DIR.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

if [ "${1:-}" = --in-guest ]; then
  b=$2 out=$3
  echo "== ib_write_bw -b (both directions at once), 8 MiB"
  ib_write_bw -d rxe0 -x "$IB_VM_GID_INDEX" -F -b -s 8388608 -n 50 -p 18600 > /tmp/bw-b.log 2>&1 &
  sleep 1
  ib_write_bw -d rxe0 -x "$IB_VM_GID_INDEX" -F -b -s 8388608 -n 50 -p 18600 198.18.1.1
  wait
  for tp in ib tcp; do
    echo "== transport ping-pong (bench/shm_pingpong.c) over $tp"
    "$b/shm-pingpong" 8388608 "$tp" | tee "$out/pingpong_$tp.txt"
  done
  for tp in ib tcp; do
    echo "== khor-bench allreduce --transport $tp, n = 2"
    "$b/khorrun" -np 2 "$b/khor-bench" allreduce --transport "$tp" -b 8 -e 64M -n 10 -w 2 \
      --csv "$out/allreduce_$tp.csv"
  done
  echo "== khor-bench allreduce --transport ib, n = 2, KHOR_IB_QPS_PER_CONN=1"
  KHOR_IB_QPS_PER_CONN=1 "$b/khorrun" -np 2 "$b/khor-bench" allreduce --transport ib -b 1M \
    -e 64M -f 8 -n 10 -w 2 --csv "$out/allreduce_ib_1qp.csv"
  for tp in ib tcp; do
    echo "== khor-bench allreduce 8 B --transport $tp, n = 2, 2000 calls"
    "$b/khorrun" -np 2 "$b/khor-bench" allreduce --transport "$tp" -b 8 -e 8 -n 2000 -w 200 \
      --csv "$out/latency_$tp.csv"
  done
  exit 0
fi

b=$(cd "${1:-$repo/build}" && pwd)
out=${2:-$repo/docs/data/ib}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$repo"
"$here/perftest_vm.sh" --timeout 1500 -- "$here/khor_vs_perftest.sh" --in-guest "$b" "$out" \
  2>&1 | tee "$out/perftest.txt"
