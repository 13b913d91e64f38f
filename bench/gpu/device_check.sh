#!/usr/bin/env bash
# device_check.sh -- the one prepared run for the device machine (one H200, 16 cores), issue
# 18: build with CUDA, run the GPU tests and benchmarks, probe for RDMA devices and run the
# ib tests on them, and settle the CPU allreduce sweep at n = 8 with one core per rank, which
# this 2-core machine cannot. Everything goes under $OUT (default ./device-out), with a
# summary.txt; each step is bounded so the whole stays inside about 8 minutes.
#
#   bash bench/gpu/device_check.sh            # on the device machine, from the repository root
#
# Steps that cannot run there say why in summary.txt and the script goes on; the exit
# status is the number of failed steps. It is safe to run here (no GPU): the GPU steps then
# report "no GPU" and the rest runs at this machine's size.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
B=$OUT/build
failed=0
t_start=$SECONDS
say() { echo "== device_check [$((SECONDS - t_start)) s]: $*" | tee -a "$OUT/summary.txt"; }
step() { # step NAME SECONDS CMD...: runs CMD with a time limit, its output in $OUT/NAME.log
  local name=$1 limit=$2 rc
  shift 2
  say "$name: $*"
  timeout --signal=TERM --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then
    say "$name: ok"
  else
    say "$name: FAILED (exit $rc; last lines below)"
    tail -n 15 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$OUT/summary.txt"
    failed=$((failed + 1))
  fi
  return "$rc"
}

{
  date -u
  uname -a
  nproc
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  ls /sys/class/infiniband 2>&1 || echo "no /sys/class/infiniband"
} > "$OUT/machine.txt" 2>&1
say "machine: $(nproc) CPUs; GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo none)"

# 1. Build with CUDA (the summary line says what was found).
step configure 120 cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKHOR_WERROR=ON ||
  { say "cannot configure: stopping"; exit 1; }
grep -E "CUDA|NCCL|verbs" "$OUT/configure.log" | tee -a "$OUT/summary.txt"
step build 300 cmake --build "$B" -j"$(nproc)" || { say "cannot build: stopping"; exit 1; }

# 2. The GPU tests (CTest label gpu; they skip with the reason where no GPU is usable).
step gpu_tests 120 ctest --test-dir "$B" -L gpu --output-on-failure
grep -hE "SKIP|PASS|FAIL|Synthesis" "$OUT/gpu_tests.log" | head -20 >> "$OUT/summary.txt"

# 3. The GPU benchmarks that exist in this build.
if [ -x "$B/tests/cuda_reduce_bench" ]; then
  step cuda_reduce_bench 120 "$B/tests/cuda_reduce_bench"
  cat "$OUT/cuda_reduce_bench.log" >> "$OUT/summary.txt"
else
  say "cuda_reduce_bench: not built (no CUDA toolkit at configure time?)"
fi

# 4. RDMA devices: the ib suite on them, all ranks on this host's first active port.
if [ -n "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
  step ib_suite 180 tests/ib/ib_suite.sh "$B" full
  grep "== ib suite" "$OUT/ib_suite.log" >> "$OUT/summary.txt"
else
  say "ib: no RDMA device in /sys/class/infiniband; ib tests not run"
fi

# 5. The CPU allreduce sweep at n = 8, one core per rank, every schedule and auto side by
#    side in one job per transport (PERFORMANCE 4's open n = 8 question).
ranks=8
[ "$(nproc)" -lt 8 ] && ranks=2 && say "cpu_sweep: only $(nproc) CPUs; n = $ranks here"
for tp in shm tcp; do
  step "cpu_sweep_$tp" 150 "$B/khorrun" -np "$ranks" --bind cores "$B/khor-bench" allreduce \
    --transport "$tp" --algo ring,tree,rd,hd,auto -b 8 -e 256M -f 4 -n 5 -w 1 -c 0 \
    --csv "$OUT/cpu_sweep_$tp.csv"
done

say "done in $((SECONDS - t_start)) s; $failed step(s) failed; results in $OUT"
exit "$failed"
