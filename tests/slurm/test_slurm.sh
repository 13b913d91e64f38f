#!/usr/bin/env bash
# test_slurm.sh -- khor jobs started by a real Slurm, with no khorrun: srun -n 4 finds the
# store from Slurm's variables (the step's first node; a port per job and step), sbatch
# --wait of a script that runs steps side by side, and a task killed with kill -9 named by
# the others within their KHOR_TIMEOUT. The one-node Slurm on 127.0.0.1 is tests/slurm/
# slurm_up.sh's, started and stopped here (about 1 s each way).
#
#   test_slurm.sh KHOR_BENCH EXAMPLE_ALLREDUCE [KHORRUN]
#
# Exit 0 all passed, 1 a failure, 77 (CTest's skip) when not root or Slurm/munge are not
# installed (.ci/packages --slurm installs them). TEST_SLURM_VERBOSE=1 prints every test's
# output, not only a failing one's.
set -u
bench=${1:?usage: test_slurm.sh KHOR_BENCH EXAMPLE_ALLREDUCE [KHORRUN]}
example=${2:?usage: test_slurm.sh KHOR_BENCH EXAMPLE_ALLREDUCE [KHORRUN]}
khorrun=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/slurm_up.sh"

start=$SECONDS
slurm_up
rc=$?
if [ $rc -ne 0 ]; then
	if [ $rc -eq 77 ]; then
		echo "test_slurm: skipped: $SLURM_UP_WHY"
		exit 77
	fi
	echo "test_slurm: FAIL: $SLURM_UP_WHY"
	slurm_down
	exit 1
fi
trap slurm_down EXIT
trap 'exit 130' INT TERM
d=$SLURM_UP_DIR
echo "slurm up in $((SECONDS - start)) s ($d)"
# What the tests' own environment may carry from a launcher must not decide the rank.
unset KHOR_RANK KHOR_SIZE KHOR_STORE_ADDR RANK WORLD_SIZE MASTER_ADDR MASTER_PORT \
	JOB_COMPLETION_INDEX KHOR_K8S_SIZE KHOR_JOB_ID
export KHOR_LOG=info KHOR_TIMEOUT=30s D=$d

CASES_VERBOSE=${TEST_SLURM_VERBOSE:-0}
# shellcheck source=../support/cases.sh
. "$here/../support/cases.sh"

# Every rank of the step joined through Slurm's variables, as rank r of n.
joined_via_slurm() {
	local out=$1 n=$2 r
	for r in $(seq 0 $((n - 1))); do
		grep -q "as rank $r of $n (local $r/$n, cross 0/1) via slurm" "$out" ||
			why "rank $r of $n: no 'as rank $r of $n (local $r/$n, cross 0/1) via slurm' in $out" ||
			return
	done
}

t_srun_allreduce_broadcast() {
	srun -l -n 4 "$bench" allreduce -b 16 -e 1M -f 16 -n 3 -w 1 --check >"$d/ar.out" 2>&1 ||
		{ cat "$d/ar.out"; why "srun -n 4 khor-bench allreduce --check failed"; return; }
	cat "$d/ar.out"
	joined_via_slurm "$d/ar.out" 4 || return
	[ "$(grep -c "serving the rendezvous store" "$d/ar.out")" = 1 ] ||
		why "not one rank serving the store" || return
	grep -q '^0: .*1048576' "$d/ar.out" || why "no 1M row from rank 0" || return
	srun -l -n 4 "$bench" broadcast -r 3 -b 16 -e 1M -f 16 -n 3 -w 1 --check >"$d/bc.out" 2>&1 ||
		{ cat "$d/bc.out"; why "srun -n 4 khor-bench broadcast --check failed"; return; }
	cat "$d/bc.out"
	joined_via_slurm "$d/bc.out" 4
}

# The batch script itself (a one-rank job), two steps at once on ports of their own,
# an 8-rank step, and khorrun inside the allocation (-np 4, and with neither -np nor -H the
# allocation's 8 slots); the output file checked line by line.
t_sbatch_wait() {
	cat >"$d/job.sh" <<'EOF'
#!/bin/bash
set -e
"$EXAMPLE"
srun --exact -n 4 "$BENCH" allreduce -b 8 -e 256K -f 8 -n 3 -w 1 --check >"$D/s1.out" 2>&1 &
a=$!
srun --exact -n 4 "$BENCH" broadcast -b 8 -e 256K -f 8 -n 3 -w 1 --check >"$D/s2.out" 2>&1 &
b=$!
wait $a
wait $b
echo "parallel steps done"
srun -n 8 "$EXAMPLE"
if [ -n "$KHORRUN" ]; then
	"$KHORRUN" -np 4 "$EXAMPLE"
fi
if [ "$KHORRUN_ALLOC" = 1 ]; then
	"$KHORRUN" "$EXAMPLE" >"$D/khorrun-alloc.out" 2>&1
fi
echo "batch done"
EOF
	chmod +x "$d/job.sh"
	# khorrun with neither -np nor -H takes the allocation's hosts where its --help says so.
	local alloc=0
	[ -n "$khorrun" ] && "$khorrun" --help 2>&1 | grep -q SLURM_JOB_NODELIST && alloc=1
	BENCH=$bench EXAMPLE=$example KHORRUN=$khorrun KHORRUN_ALLOC=$alloc \
		timeout 60 sbatch --wait -n 8 -o "$d/job.out" -D "$d" "$d/job.sh"
	local rc=$?
	cat "$d/job.out" "$d/s1.out" "$d/s2.out" 2>/dev/null
	[ $rc -eq 0 ] || { why "sbatch --wait exited $rc"; return; }
	grep -q "^rank 0 of 1: grad\[999\] = 999 (expected 999)" "$d/job.out" ||
		why "the batch script's own run was not a one-rank job" || return
	grep -q "parallel steps done" "$d/job.out" || why "the parallel steps did not finish" || return
	joined_via_slurm "$d/s1.out" 4 || return
	joined_via_slurm "$d/s2.out" 4 || return
	local p1 p2
	p1=$(grep -o "store on port [0-9]*" "$d/s1.out" | head -1)
	p2=$(grep -o "store on port [0-9]*" "$d/s2.out" | head -1)
	[ -n "$p1" ] && [ "$p1" != "$p2" ] || why "the two steps' stores: '$p1' and '$p2'" || return
	local r
	for r in $(seq 0 7); do
		grep -q "^rank $r of 8: grad\[999\] = 1002.5 (expected 1002.5)" "$d/job.out" ||
			why "rank $r of the 8-rank step: no right result in job.out" || return
	done
	if [ -n "$khorrun" ]; then
		for r in $(seq 0 3); do
			grep -q "rank $r of 4: grad\[999\] = 1000.5 (expected 1000.5)" "$d/job.out" ||
				why "khorrun -np 4 inside sbatch: rank $r not right" || return
		done
	fi
	if [ $alloc = 1 ]; then
		cat "$d/khorrun-alloc.out"
		# With neither -np nor -H: the allocation's hosts and slots, 8 on localhost.
		for r in $(seq 0 7); do
			grep -q "rank $r of 8: grad\[999\] = 1002.5 (expected 1002.5)" \
				"$d/khorrun-alloc.out" ||
				why "khorrun with no -np inside sbatch -n 8: rank $r of 8 not right" || return
		done
	fi
	grep -q "^batch done" "$d/job.out" || why "the batch script did not finish"
}

# kill -9 of task 2 mid-allreduce, over tcp as between nodes: srun -K0 leaves the others to
# khor, which must end each of them with an error naming rank 2 within KHOR_TIMEOUT (5 s).
# Each task's wrapper notes when its khor-bench ended.
t_kill9_names_the_rank() {
	rm -f "$d"/pid.* "$d"/end.*
	KHOR_TIMEOUT=5s KHOR_TRANSPORT=tcp srun -K0 -l -n 4 bash -c \
		'"$@" & echo $! >"$D/pid.$SLURM_PROCID"; wait $!; rc=$?
		 echo "$rc $(date +%s%N)" >"$D/end.$SLURM_PROCID"; exit $rc' \
		- "$bench" allreduce -b 256K -e 256K -n 100000000 -w 0 -c 0 --progress 0 \
		>"$d/kill.out" 2>&1 &
	local srun_pid=$! t
	for t in $(seq 150); do
		[ "$(grep -c "as rank .* of 4" "$d/kill.out")" = 4 ] && break
		sleep 0.1
	done
	[ "$(grep -c "as rank .* of 4" "$d/kill.out")" = 4 ] ||
		{ kill -9 $srun_pid; cat "$d/kill.out"; why "the 4 ranks did not join within 15 s"; return; }
	sleep 0.5
	local t0
	t0=$(date +%s%N)
	kill -9 "$(cat "$d/pid.2")"
	for t in $(seq 100); do
		[ -s "$d/end.0" ] && [ -s "$d/end.1" ] && [ -s "$d/end.3" ] && break
		sleep 0.1
	done
	# srun itself ends only when slurmstepd has reaped the step.
	for t in $(seq 50); do
		kill -0 $srun_pid 2>/dev/null || break
		sleep 0.1
	done
	kill -9 $srun_pid 2>/dev/null
	wait $srun_pid
	cat "$d/kill.out"
	local r rc end
	for r in 0 1 3; do
		[ -s "$d/end.$r" ] || why "rank $r still ran 10 s after kill -9 of rank 2" || return
		read -r rc end <"$d/end.$r"
		echo "rank $r: exit $rc, $(((end - t0) / 1000000)) ms after the kill"
		[ "$rc" -ne 0 ] || why "rank $r exited 0 after rank 2 was killed" || return
		[ $(((end - t0) / 1000000)) -lt 5000 ] ||
			why "rank $r took over KHOR_TIMEOUT (5 s) to fail" || return
		grep -v "joined job" "$d/kill.out" | grep -q "^$r: .*rank 2" ||
			why "rank $r's error does not name rank 2" || return
	done
}

run srun_allreduce_broadcast t_srun_allreduce_broadcast
run sbatch_wait t_sbatch_wait
run kill9_names_the_rank t_kill9_names_the_rank

echo "test_slurm: $passed passed, $failed failed ($((SECONDS - start)) s with Slurm's start)"
[ $failed -eq 0 ] || slurm_logs
[ $failed -eq 0 ]
