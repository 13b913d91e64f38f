#!/usr/bin/env bash
# device_check.sh -- the one prepared run for the device machine (one H200, 16 cores), issue
# 18: build with CUDA; the gpu-labelled tests; the f32 sum kernel against cudaMemcpy; khor-bench
# allreduce on device buffers beside host buffers over shm at n = 2 (target: device busbw
# >= 0.8x host at 64 MiB), and again with KHOR_NCCL=on on two pretend hosts; the ib suite if
# there is an RDMA device; the CPU allreduce sweep at n = 8 with one core per rank (ring, tree,
# rd, hd, auto side by side) over shm and tcp, which a 2-core machine cannot settle. Issue 27
# adds khor.torch on CUDA tensors: tests/python/test_torch_cuda.py, bench/gpu/torch_gpu.py
# (the binding's 64 MiB allreduce against khor-bench's, a ResNet-50 step at n = 1 with and
# without DistributedOptimizer) and Horovod's own test_torch.py and
# examples/pytorch/pytorch_synthetic_benchmark.py through the alias, from a carried tree:
#   mkdir -p build-devdeps/horovod && git -C HOROVOD archive HEAD test/parallel/test_torch.py \
#     test/utils examples/pytorch/pytorch_synthetic_benchmark.py | tar x -C build-devdeps/horovod
#
#   bash bench/gpu/device_check.sh                  # on the device machine, from anywhere
#   OUT=/tmp/devcheck bash bench/gpu/device_check.sh --quick --build /tmp/build-x   # a dry run
#
# Every step has a time limit, and the whole run a budget (--budget, default 520 s, inside the
# 8 minutes it is given): a step that would start past it is recorded "skipped: out of time",
# the CPU sweep last, since it needs no GPU. A failed step is recorded and the next one runs;
# the exit status is the number of failed steps. Where no GPU is usable (khor-bench --mem cuda
# exits 77 on one rank, saying why) the GPU steps are recorded "skipped: no GPU" at once.
#
# What comes back: the device tool returns at most 8 files from $OUT, so the step logs, CSVs
# and JSONs go into $OUT/logs.tar.gz (rewritten after every step, so a run cut short still
# returns what it did), beside $OUT/summary.txt (a line per step, pass/fail/skip, the key
# numbers, the last lines of each failed step's log) and $OUT/machine.txt. The build tree is
# outside $OUT (default /tmp/khor-device-build).
#
# The image there has CUDA, nvcc, CMake and NCCL (a pip wheel) but may lack OpenSSL's and
# Criterion's headers, and nothing can be installed there: bench/gpu/make_deps.sh gathers
# them here into build-devdeps/, which the run carries (carry: ["build-devdeps"]) and this
# script uses when it is there (--deps DIR for another folder).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD

usage() {
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  cat <<'EOF'
options:
  --quick        a short run (sizes to 4 MiB, 5 iterations, n = 2 sweep): for a dry run here
  --build DIR    the build tree (default /tmp/khor-device-build; an existing one is reused)
  --budget SEC   time for the whole run (default 520)
  --deps DIR     carried build dependencies (default build-devdeps, used if present)
  --no-build     use the build tree as it is (no configure, no build)
EOF
}

QUICK=0 BUILD=1
B=${DEVICE_CHECK_BUILD:-/tmp/khor-device-build}
BUDGET=${DEVICE_CHECK_BUDGET:-520}
DEPS=${DEVICE_CHECK_DEPS:-build-devdeps}
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1 ;;
    --build) B=${2:?--build needs a directory}; shift ;;
    --budget) BUDGET=${2:?--budget needs seconds}; shift ;;
    --deps) DEPS=${2:?--deps needs a directory}; shift ;;
    --no-build) BUILD=0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "device_check.sh: unknown option $1 (--help lists them)" >&2; exit 2 ;;
  esac
  shift
done
case $BUDGET in ''|*[!0-9]*) echo "device_check.sh: --budget needs whole seconds" >&2; exit 2 ;; esac

OUT=${OUT:-/tmp/khor-device-out}
mkdir -p "$OUT" || exit 1
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/khor-device-logs.XXXXXX") || exit 1
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
t_start=$SECONDS
failed=0
RESULTS=() # "status|name|note", in order, for the table at the end

say() { echo "== device_check [$((SECONDS - t_start)) s]: $*" | tee -a "$SUMMARY"; }
# Key numbers: into the summary as they come, indented under their step.
note() { sed 's/^/    /' | tee -a "$SUMMARY"; }
pack() { tar -czf "$OUT/logs.tar.gz.new" -C "$LOGS" . 2>/dev/null && mv "$OUT/logs.tar.gz.new" "$OUT/logs.tar.gz"; }
left() { echo $((BUDGET - (SECONDS - t_start))); }
record() { RESULTS+=("$1|$2|$3"); }
skip() { # skip NAME WHY
  say "$1: skipped: $2"
  record skipped "$1" "$2"
}

# step NAME LIMIT CMD...: CMD under a time limit (LIMIT, or what is left of the budget), its
# output in $LOGS/NAME.log. Exit 77 is a skip (the program said why on its last line).
step() {
  local name=$1 limit=$2 rc t0=$SECONDS remain
  shift 2
  remain=$(($(left) - 10))
  if [ "$remain" -lt 20 ]; then
    skip "$name" "out of time ($(left) s of the ${BUDGET} s budget left)"
    return 99
  fi
  [ "$limit" -gt "$remain" ] && limit=$remain
  say "$name (limit $limit s): $*"
  timeout --signal=TERM --kill-after=10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then
    say "$name: ok ($((SECONDS - t0)) s)"
    record ok "$name" "$((SECONDS - t0)) s"
  elif [ "$rc" -eq 77 ]; then
    local why
    why=$(grep -v '^\s*$' "$LOGS/$name.log" | tail -n 1 | sed 's/^\[[0-9]*\] //')
    say "$name: skipped: $why"
    record skipped "$name" "$why"
  else
    local what="exit $rc"
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && what="timed out after $limit s"
    say "$name: FAILED ($what; last lines of its log below)"
    tail -n 15 "$LOGS/$name.log" | note
    record FAILED "$name" "$what"
    failed=$((failed + 1))
  fi
  pack
  return "$rc"
}

# The busbw of host and cuda rows of a khor-bench --mem both CSV at one size, and their ratio.
mem_ratio() { # mem_ratio CSV SIZE LABEL [TARGET]
  awk -F, -v size="$2" -v label="$3" -v target="${4:-}" '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    $col["size"] == size { bw[$col["mem"]] = $col["busbw_gbs"]; wrong += $col["wrong"] }
    END {
      if (!("host" in bw) || !("cuda" in bw)) { printf "%s: no row of %d B\n", label, size; exit }
      r = 0
      if (bw["host"] > 0) r = bw["cuda"] / bw["host"]
      verdict = ""
      if (target != "") verdict = sprintf(" (target >= %.2f: %s)", target, r >= target ? "met" : "MISSED")
      bad = ""
      if (wrong > 0) bad = ", WRONG RESULTS"
      printf "%s: host %.2f GB/s, cuda %.2f GB/s, cuda/host %.2f%s%s\n", label, bw["host"], \
             bw["cuda"], r, verdict, bad
    }' "$1"
}

{
  date -u
  uname -a
  echo "CPUs: $(nproc)"
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  nvcc --version 2>&1 || echo "nvcc: not on PATH"
  cmake --version 2>&1 | head -1
  ls /sys/class/infiniband 2>&1 || echo "no /sys/class/infiniband"
} > "$OUT/machine.txt" 2>&1
cp "$OUT/machine.txt" "$LOGS/"
say "machine: $(nproc) CPUs; GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 | grep . || echo none); budget ${BUDGET} s$([ "$QUICK" = 1 ] && echo '; --quick')"

# ---- 1. build --------------------------------------------------------------------------------
cfg=(-S "$ROOT" -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKHOR_WERROR=ON)
# Make where there is make: with OpenMPI found, the mpi-bench custom target breaks Ninja.
[ ! -f "$B/CMakeCache.txt" ] && ! command -v make > /dev/null && command -v ninja > /dev/null &&
  cfg+=(-G Ninja)
if [ -d "$DEPS" ]; then
  D=$(cd "$DEPS" && pwd)
  # The carried libraries reach the programs built here by rpath (DT_RPATH, which also
  # covers the libraries they load), never LD_LIBRARY_PATH: cmake, nvcc and python keep the
  # image's own.
  link="-Wl,--disable-new-dtags,-rpath,$D/lib,-rpath-link,$D/lib"
  cfg+=(-DOPENSSL_ROOT_DIR="$D" -DCMAKE_PREFIX_PATH="$D" -DCMAKE_EXE_LINKER_FLAGS="$link"
        -DCMAKE_SHARED_LINKER_FLAGS="$link" -DCMAKE_MODULE_LINKER_FLAGS="$link")
  export PKG_CONFIG_PATH=$D/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  command -v pkg-config > /dev/null || cfg+=(-DPKG_CONFIG_EXECUTABLE="$D/bin/pkg-config")
  libs=("$D"/lib/*.so*)
  say "deps: using carried $DEPS (${#libs[@]} libraries)"
fi
# NCCL: the image's may be a pip wheel (nvidia-nccl-cu13), outside CUDA's tree. khor loads
# libnccl.so.2 at run time: the NCCL step gets its folder on LD_LIBRARY_PATH.
NCCL_LIBDIR=
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2' && [ ! -e /usr/local/cuda/lib64/libnccl.so.2 ]; then
  nccl_py=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  if [ -n "$nccl_py" ] && [ -e "$nccl_py/lib/libnccl.so.2" ]; then
    NCCL_LIBDIR=$nccl_py/lib
    [ -e "$nccl_py/include/nccl.h" ] &&
      cfg+=(-DKHOR_NCCL_INC="$nccl_py/include" -DKHOR_NCCL_LIB="$nccl_py/lib/libnccl.so.2")
    say "nccl: the pip wheel's, $NCCL_LIBDIR"
  fi
fi

if [ "$BUILD" = 1 ]; then
  step configure 120 cmake "${cfg[@]}" || {
    grep -iE "could not find|not found|error" "$LOGS/configure.log" | head -5 | note
    say "cannot configure: stopping (OpenSSL or Criterion missing? bench/gpu/make_deps.sh)"
    BUDGET=0
  }
  grep -E "^-- +(CUDA|NCCL|verbs|Criterion|OpenMPI)" "$LOGS/configure.log" 2>/dev/null | note
  [ "$BUDGET" -gt 0 ] && { step build 300 cmake --build "$B" -j"$(nproc)" || {
    grep -E "error|Error" "$LOGS/build.log" | head -5 | note
    say "cannot build: stopping"
    BUDGET=0
  }; }
fi
if [ ! -x "$B/khor-bench" ] || [ ! -x "$B/khorrun" ]; then
  say "no khor-bench or khorrun in $B: nothing more can run"
  BUDGET=0
fi

# ---- 2. is a GPU usable? khor-bench says, on one rank, with the reason -------------------------
GPU=0 NOGPU_WHY="not probed"
if [ "$BUDGET" -gt 0 ]; then
  step gpu_probe 60 "$B/khor-bench" allreduce --mem cuda -b 8 -e 1M -f 32 -n 2 -w 1 --check
  case $? in
    0) GPU=1 ;;
    77) NOGPU_WHY=$(tail -n 1 "$LOGS/gpu_probe.log" | sed 's/^khor-bench: --mem cuda: //') ;;
    99) ;;
    *) GPU=1; say "gpu_probe failed, but not for want of a GPU: the GPU steps run anyway" ;;
  esac
fi
gpu_step() { # gpu_step NAME LIMIT CMD...: a step that needs a GPU
  if [ "$GPU" = 1 ]; then
    step "$@"
  else
    skip "$1" "no GPU ($NOGPU_WHY)"
    return 77
  fi
}

if [ "$QUICK" = 1 ]; then
  MAXB=4M ITERS=(-n 5 -w 1)
else
  MAXB=256M ITERS=(-n 20 -w 3)
fi

# ---- 3. the gpu-labelled tests (test_cuda_reduce, test_cuda_mem, test_nccl: what is registered)
if [ "$BUDGET" -gt 0 ]; then
  ctest --test-dir "$B" -N -L gpu > "$LOGS/gpu_tests_list.log" 2>&1
  say "gpu tests registered: $(grep -oE 'Test +#[0-9]+: [^ ]+' "$LOGS/gpu_tests_list.log" | awk '{print $3}' | paste -sd' ' - | grep . || echo none)"
  gpu_step gpu_tests 180 ctest --test-dir "$B" -L gpu -V --no-tests=error --timeout 170
  [ -f "$LOGS/gpu_tests.log" ] &&
    grep -hE "tests passed|Test +#[0-9]+: .*(Passed|Failed|Not Run|Timeout)|Synthesis|SKIP" \
      "$LOGS/gpu_tests.log" | sed 's/^[0-9]*: //' | head -30 | note
fi

# ---- 4. the kernel against cudaMemcpy, 64 MiB to 1 GiB -----------------------------------------
if [ "$BUDGET" -gt 0 ]; then
  if [ -x "$B/tests/cuda_reduce_bench" ]; then
    if [ "$QUICK" = 1 ]; then
      gpu_step cuda_reduce_bench 60 "$B/tests/cuda_reduce_bench" 64
    else
      gpu_step cuda_reduce_bench 120 "$B/tests/cuda_reduce_bench"
    fi
    [ "$GPU" = 1 ] && grep -vE '^\s*$' "$LOGS/cuda_reduce_bench.log" | tail -n 8 | note
  else
    skip cuda_reduce_bench "not built (no nvcc at configure time, or no Criterion: tests/ not built)"
  fi
fi

# ---- 5. allreduce on device buffers beside host buffers, shm, n = 2 ----------------------------
# -b 16 -f 4: the sweep passes 64 MiB and 256 MiB.
if [ "$BUDGET" -gt 0 ]; then
  gpu_step mem_both_shm 150 "$B/khorrun" -np 2 --timeout 60s "$B/khor-bench" allreduce \
    --transport shm --mem both -b 16 -e "$MAXB" -f 4 "${ITERS[@]}" \
    --csv "$LOGS/mem_both_shm.csv" --json "$LOGS/mem_both_shm.json"
  if [ -s "$LOGS/mem_both_shm.csv" ]; then
    for size in 67108864 268435456 4194304; do
      mem_ratio "$LOGS/mem_both_shm.csv" "$size" "shm n=2 $((size >> 20)) MiB" \
        "$([ "$size" = 67108864 ] && echo 0.8)"
    done | grep -v "no row" | note
  fi
fi

# ---- 6. the same with NCCL inside each node: two pretend hosts, one rank (one GPU) each ---------
# NCCL refuses two ranks on one GPU, so each rank is a host of its own (KHOR_HOSTNAME=h<rank>):
# NCCL then runs on one-rank node comms, khor between the pretend hosts (KHOR_NCCL=on takes
# one rank per node; auto would not). khorrun's local and cross ranks describe the one real
# host, so the wrapper drops them and khor works them out from the names.
if [ "$BUDGET" -gt 0 ]; then
  cat > "$LOGS/pretend_host.sh" <<'EOF'
#!/bin/sh
unset KHOR_LOCAL_RANK KHOR_LOCAL_SIZE KHOR_CROSS_RANK KHOR_CROSS_SIZE
KHOR_HOSTNAME=h$KHOR_RANK exec "$@"
EOF
  chmod +x "$LOGS/pretend_host.sh"
  gpu_step nccl_pretend_hosts 150 env KHOR_NCCL=on \
    LD_LIBRARY_PATH="${NCCL_LIBDIR}${NCCL_LIBDIR:+${LD_LIBRARY_PATH:+:}}${LD_LIBRARY_PATH:-}" \
    "$B/khorrun" -np 2 --timeout 60s "$LOGS/pretend_host.sh" "$B/khor-bench" allreduce \
    --mem both -b 16 -e "$MAXB" -f 4 "${ITERS[@]}" \
    --csv "$LOGS/nccl_pretend_hosts.csv" --json "$LOGS/nccl_pretend_hosts.json"
  if [ -s "$LOGS/nccl_pretend_hosts.csv" ]; then
    for size in 67108864 268435456 4194304; do
      mem_ratio "$LOGS/nccl_pretend_hosts.csv" "$size" "NCCL=on, 2 pretend hosts $((size >> 20)) MiB"
    done | grep -v "no row" | note
    grep -i "nccl" "$LOGS/nccl_pretend_hosts.log" | grep -v '^\[0\] #' | head -5 | note
  fi
fi

# ---- 6b. khor.torch on CUDA tensors (issue 27): khor's own GPU tests, the binding's allreduce
# beside the C device allreduce of the same size, a ResNet-50 step with and without
# DistributedOptimizer at n = 1, and Horovod's own test_torch.py and synthetic benchmark
# through the alias when a Horovod tree is carried ($DEPS/horovod: test/parallel/test_torch.py,
# test/utils and examples/pytorch/pytorch_synthetic_benchmark.py).
PYENV=(env PYTHONPATH="$ROOT/bindings/python:$ROOT/bindings/python/horovod_compat" \
       KHOR_LIBRARY_PATH="$B/libkhor.so" PYTHONUNBUFFERED=1 \
       LD_LIBRARY_PATH="${NCCL_LIBDIR}${NCCL_LIBDIR:+${LD_LIBRARY_PATH:+:}}${LD_LIBRARY_PATH:-}")
if [ "$BUDGET" -gt 0 ]; then
  gpu_step torch_cuda_tests 120 "${PYENV[@]}" "$B/khorrun" -np 2 --timeout 60s python3 -m pytest \
    -q -p no:cacheprovider "$ROOT/tests/python/test_torch_cuda.py"
  grep -E "passed|failed|error" "$LOGS/torch_cuda_tests.log" | tail -n 2 | note
  gpu_step torch_allreduce 90 "${PYENV[@]}" "$B/khorrun" -np 2 --timeout 60s python3 \
    "$ROOT/bench/gpu/torch_gpu.py" allreduce --bytes 64M --iters 20
  gpu_step c_allreduce_64m 90 "$B/khorrun" -np 2 --timeout 60s "$B/khor-bench" allreduce \
    --mem cuda -b 64M -e 64M -n 20 -w 3 --csv "$LOGS/c_allreduce_64m.csv"
  py_us=$(grep -o 'median_us=[0-9.]*' "$LOGS/torch_allreduce.log" 2>/dev/null | cut -d= -f2)
  c_us=$(awk -F, 'NR > 1 { print $10 }' "$LOGS/c_allreduce_64m.csv" 2>/dev/null | head -1)
  [ -n "$py_us" ] && [ -n "$c_us" ] &&
    awk -v p="$py_us" -v c="$c_us" 'BEGIN { printf "64 MiB allreduce n=2: khor.torch %.0f us, C %.0f us, ratio %.3f (target <= 1.10: %s)\n", p, c, p / c, p / c <= 1.10 ? "met" : "MISSED" }' | note
  gpu_step torch_step_resnet50 150 "${PYENV[@]}" python3 "$ROOT/bench/gpu/torch_gpu.py" step \
    --model resnet50 --batch 32 --steps 10 --blocks 3
  grep torch_step "$LOGS/torch_step_resnet50.log" | note
  if [ -f "$DEPS/horovod/test/parallel/test_torch.py" ]; then
    HVD=$(cd "$DEPS/horovod" && pwd)
    gpu_step horovod_test_torch 300 "${PYENV[@]}" python3 "$ROOT/tests/horovod/conformance.py" \
      --horovod-src "$HVD" --np 2 --mode file --peers khor --python python3 \
      --khorrun "$B/khorrun" --library "$B/libkhor.so" --file-timeout 280 \
      --json "$LOGS/horovod_test_torch.json"
    grep -A3 "^peer np mode" "$LOGS/horovod_test_torch.log" | note
    gpu_step horovod_synthetic 120 "${PYENV[@]}" "$B/khorrun" -np 2 --timeout 60s python3 \
      "$HVD/examples/pytorch/pytorch_synthetic_benchmark.py" --num-iters 3 \
      --num-batches-per-iter 5 --num-warmup-batches 2
    grep -E "Img/sec|Total img" "$LOGS/horovod_synthetic.log" | tail -n 3 | note
  else
    skip horovod_test_torch "no Horovod tree at $DEPS/horovod (see the comment above)"
  fi
fi

# ---- 7. RDMA devices: the ib suite on them ------------------------------------------------------
if [ "$BUDGET" -gt 0 ]; then
  if [ -n "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
    step ib_suite 180 tests/ib/ib_suite.sh "$B" "$([ "$QUICK" = 1 ] && echo quick || echo full)"
    grep "== ib suite" "$LOGS/ib_suite.log" | note
  else
    skip ib_suite "no RDMA device in /sys/class/infiniband"
  fi
fi

# ---- 8. the CPU allreduce sweep, n = 8, one core per rank, every schedule side by side ----------
ranks=8
[ "$QUICK" = 1 ] && ranks=2
[ "$(nproc)" -lt "$ranks" ] && ranks=$(nproc)
[ "$ranks" -lt 2 ] && ranks=2
for tp in shm tcp; do
  [ "$BUDGET" -gt 0 ] || break
  step "cpu_sweep_$tp" 150 "$B/khorrun" -np "$ranks" --bind cores --timeout 120s \
    "$B/khor-bench" allreduce --transport "$tp" --algo ring,tree,rd,hd,auto \
    -b 16 -e "$MAXB" -f 4 -n 5 -w 1 -c 0 --csv "$LOGS/cpu_sweep_$tp.csv"
  # The table's rows from 64 KiB up: each schedule's time, the best and auto/best.
  grep -E '^\[0\] #( +size|.*Avg bus)|^\[0\] +[0-9]' "$LOGS/cpu_sweep_$tp.log" |
    awk '/#/ || $2 >= 65536' | sed "s/^\[0\] /n=$ranks $tp: /" | note
done

# ---- the table -----------------------------------------------------------------------------------
{
  echo
  echo "== device_check: $failed step(s) failed, in $((SECONDS - t_start)) s; logs in logs.tar.gz"
  for r in "${RESULTS[@]}"; do
    IFS='|' read -r status name why <<< "$r"
    printf '  %-8s %-20s %s\n' "$status" "$name" "$why"
  done
} | tee -a "$SUMMARY"
cp "$SUMMARY" "$LOGS/"
pack
rm -rf "$LOGS"
exit "$failed"
