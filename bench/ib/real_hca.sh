#!/usr/bin/env bash
# shellcheck disable=SC2029  # the ssh command lines are meant to expand here
# real_hca.sh -- the ib tests and the ib benchmark on real HCAs, for the first user who has
# them (these machines have only soft-RoCE in a VM: tests/ib/vm.sh).
#
#   bench/ib/real_hca.sh [--build DIR] [--out DIR] [--hosts HOST1,HOST2] [--skip-tests]
#
# On this host: the ib suite (tests/ib/ib_suite.sh: ib-only tests, the transport-generic
# suite, every collective at n = 2 and 4, kill -9), all ranks on this host's HCA. With
# --hosts (passwordless ssh, the same build path on every host): perftest's ib_write_bw and
# ib_send_lat between the first two hosts, then khor-bench allreduce at one rank per host
# over ib and over tcp, side by side, from 8 B to 256 MiB. Everything is also written under
# --out (default ./ib-results-<date>). KHOR_IB_HCA, KHOR_IB_GID_INDEX and
# KHOR_SOCKET_IFNAME are passed to every rank when set. Exit status: the number of failed
# steps.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=$repo/build
out=ib-results-$(date +%Y%m%d-%H%M%S)
hosts=""
skip_tests=0
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$(cd "$2" && pwd); shift 2 ;;
    --out) out=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --skip-tests) skip_tests=1; shift ;;
    *) echo "usage: bench/ib/real_hca.sh [--build DIR] [--out DIR] [--hosts H1,H2,...] [--skip-tests]" >&2
       exit 2 ;;
  esac
done
mkdir -p "$out"
failed=0
step() { echo "== real_hca: $*"; }

if ! ls /sys/class/infiniband/ >/dev/null 2>&1 || [ -z "$(ls /sys/class/infiniband/ 2>/dev/null)" ]; then
  echo "real_hca.sh: no RDMA device in /sys/class/infiniband on this host" >&2
  exit 1
fi
ibv_devinfo > "$out/ibv_devinfo.txt" 2>&1 || true
step "devices: $(find /sys/class/infiniband -mindepth 1 -maxdepth 1 -printf '%f ')"

if [ "$skip_tests" = 0 ]; then
  step "ib suite on this host (log: $out/ib_suite.log)"
  "$repo/tests/ib/ib_suite.sh" "$build" full 2>&1 | tee "$out/ib_suite.log" || failed=$((failed + 1))
fi

[ -n "$hosts" ] || { step "no --hosts: cross-host benchmark skipped"; exit "$failed"; }
IFS=, read -r -a hl <<< "$hosts"
[ "${#hl[@]}" -ge 2 ] || { echo "real_hca.sh: --hosts needs at least two hosts" >&2; exit 2; }

# perftest between the first two hosts (the ceiling of these HCAs).
dev=${KHOR_IB_HCA:+-d ${KHOR_IB_HCA%%:*}}
gid=${KHOR_IB_GID_INDEX:+-x $KHOR_IB_GID_INDEX}
for t in "ib_write_bw -s 8388608 -n 1000 --report_gbits" "ib_send_lat -s 8 -n 10000"; do
  step "$t between ${hl[0]} and ${hl[1]}"
  # shellcheck disable=SC2086
  ssh "${hl[1]}" "timeout 120 $t $dev $gid" > "$out/${t%% *}.server.txt" 2>&1 &
  sleep 2
  # shellcheck disable=SC2086
  ssh "${hl[0]}" "timeout 120 $t $dev $gid ${hl[1]}" 2>&1 | tee "$out/${t%% *}.txt" || failed=$((failed + 1))
  wait
done

# khor-bench at one rank per host, over ib then tcp. The store is on the first host; the
# secret goes over ssh's stdin, never on a command line.
secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
port=$((20000 + RANDOM % 20000))
n=${#hl[@]}
for tp in ib tcp; do
  step "khor-bench allreduce over $tp, $n ranks (one per host)"
  pids=()
  for r in $(seq 0 $((n - 1))); do
    envs="RANK=$r WORLD_SIZE=$n MASTER_ADDR=${hl[0]} MASTER_PORT=$port KHOR_TRANSPORT=$tp"
    for v in KHOR_IB_HCA KHOR_IB_GID_INDEX KHOR_SOCKET_IFNAME; do
      [ -n "${!v:-}" ] && envs="$envs $v=${!v}"
    done
    csv=""
    [ "$r" = 0 ] && csv="--csv $(pwd)/$out/khor_allreduce_$tp.csv"
    echo "$secret" | ssh "${hl[$r]}" "read -r KHOR_SECRET; export KHOR_SECRET; cd $repo && \
      env $envs timeout 900 $build/khor-bench allreduce -b 8 -e 256M -n 20 $csv" \
      > "$out/khor_allreduce_$tp.rank$r.txt" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || failed=$((failed + 1)); done
  cat "$out/khor_allreduce_$tp.rank0.txt"
  port=$((port + 1))
done
step "results in $out; $failed step(s) failed"
exit "$failed"
