#!/usr/bin/env bash
# perftest_vm.sh -- perftest's verbs baseline on soft-RoCE, in one boot of tests/ib/vm.sh.
#
# Runs ib_write_bw at 1 MiB and 8 MiB (8 MiB is rxe's max_msg_sz) and ib_send_lat at 8 B,
# server and client on the one rxe0 device of the VM (two rxe devices on one host never
# reach RTR), then EXTRA COMMAND in the same VM, so that khor's own benchmark can run next
# to the baseline it is compared with:
#
#   bench/ib/perftest_vm.sh                                   # the perftest reports only
#   bench/ib/perftest_vm.sh -- ./build/khorrun -np 2 ./build/khor-bench allreduce -e 8M
#   bench/ib/perftest_vm.sh --timeout 1800 -- bench/some_sweep.sh
#
# The VM runs under TCG, so the numbers are low and noisy: they say what the verbs path can
# do in this VM, not on hardware. Exit status: that of EXTRA COMMAND when it fails, else 1
# when a perftest run failed, else 0; vm.sh's 77 (cannot run here) and 124 (timed out) pass
# through.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

# Iterations per run: enough for a stable average at TCG speed (about 30 MB/s) in ~10 s each.
write_bw_runs=("1048576 200" "8388608 50")
send_lat_iters=1000
port=18515

usage() {
  echo "usage: bench/ib/perftest_vm.sh [--timeout SECONDS] [-- EXTRA COMMAND [ARGS...]]" >&2
  exit 2
}

# Starts the server, waits until it listens, then runs the client against 198.18.1.1 (the
# address of rxe0's netdev; 127.0.0.1 works as well, the TCP connection only swaps QP data).
run_pair() {
  local tool=$1 gid=$IB_VM_GID_INDEX spid rc=0 src=0
  shift
  echo "== $tool -d rxe0 -x $gid $*"
  "$tool" -d rxe0 -x "$gid" -F -p "$port" "$@" > /tmp/perftest-server.log 2>&1 &
  spid=$!
  for _ in $(seq 100); do
    ss -Hltn "sport = :$port" | grep -q . && break
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.1
  done
  "$tool" -d rxe0 -x "$gid" -F -p "$port" "$@" 198.18.1.1 || rc=$?
  wait "$spid" || src=$?
  [ "$rc" -ne 0 ] || rc=$src
  if [ "$rc" -ne 0 ]; then
    echo "perftest_vm.sh: $tool $* failed (status $rc); its server said:" >&2
    cat /tmp/perftest-server.log >&2
  fi
  return "$rc"
}

in_guest() {
  local failed=0 run size iters rc=0
  for run in "${write_bw_runs[@]}"; do
    read -r size iters <<< "$run"
    run_pair ib_write_bw -s "$size" -n "$iters" || failed=1
  done
  run_pair ib_send_lat -s 8 -n "$send_lat_iters" || failed=1
  if [ ${#extra[@]} -gt 0 ]; then
    echo "== ${extra[*]}"
    "${extra[@]}" || rc=$?
  fi
  [ "$rc" -ne 0 ] || rc=$failed
  return "$rc"
}

if [ "${1:-}" = --in-guest ]; then
  shift
  extra=("$@")
  in_guest
  exit
fi

timeout_s=600
while [ $# -gt 0 ]; do
  case $1 in
    --timeout) [ $# -ge 2 ] || usage; timeout_s=$2; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
case $(pwd -P)/ in
  "$repo"/*) ;;
  *) cd "$repo" ;;
esac
exec "$repo/tests/ib/vm.sh" --timeout "$timeout_s" -- bash "$here/perftest_vm.sh" --in-guest "$@"
