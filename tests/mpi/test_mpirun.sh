#!/usr/bin/env bash
# test_mpirun.sh -- khor jobs started by real MPI launchers, khor linking no MPI: OpenMPI's
# mpirun and MPICH's Hydra (mpiexec.hydra) at np 2 and 4 with MASTER_ADDR and MASTER_PORT
# (rank 0 serves the store there) are one job each, with the right sum; without them every
# rank fails at init within seconds, naming the launcher and what to set (before this,
# `mpirun -np 4 prog` ran four one-rank jobs); and a Python rank under mpirun.
#
#   test_mpirun.sh EXAMPLE_ALLREDUCE LIBKHOR SOURCE_DIR [PYTHON]
#
# PYTHON (with numpy) runs the Python case; without it that case is skipped.
#
# Exit 0 all passed, 1 a failure, 77 (CTest's skip) when neither launcher is installed
# (OpenMPI comes with .ci/packages, Hydra with .ci/packages --mpi; a missing one is skipped
# saying so). TEST_MPIRUN_VERBOSE=1 prints every case's output.
set -u
example=${1:?usage: test_mpirun.sh EXAMPLE_ALLREDUCE LIBKHOR SOURCE_DIR}
lib=${2:?usage: test_mpirun.sh EXAMPLE_ALLREDUCE LIBKHOR SOURCE_DIR}
src=${3:?usage: test_mpirun.sh EXAMPLE_ALLREDUCE LIBKHOR SOURCE_DIR}
python=${4:-}

ompi=$(command -v mpirun.openmpi || true)
hydra=$(command -v mpiexec.hydra || true)
if [ -z "$ompi" ] && [ -z "$hydra" ]; then
	echo "test_mpirun: skipped: neither mpirun.openmpi nor mpiexec.hydra is installed" \
		"(.ci/packages --mpi)"
	exit 77
fi
[ -n "$ompi" ] || echo "test_mpirun: no mpirun.openmpi: its cases are skipped"
[ -n "$hydra" ] || echo "test_mpirun: no mpiexec.hydra (.ci/packages --mpi): its cases are skipped"

# What the tests' own environment may carry from a launcher must not decide the rank.
unset KHOR_RANK KHOR_SIZE KHOR_STORE_ADDR RANK WORLD_SIZE MASTER_ADDR MASTER_PORT \
	JOB_COMPLETION_INDEX KHOR_K8S_SIZE KHOR_JOB_ID SLURM_PROCID SLURM_NTASKS SLURM_STEP_ID \
	SLURM_STEPID TORCHELASTIC_RUN_ID PMI_RANK PMI_SIZE PMIX_RANK OMPI_COMM_WORLD_RANK \
	OMPI_COMM_WORLD_SIZE
export KHOR_LOG=info KHOR_TIMEOUT=20s
# OpenMPI refuses root without these; 4 ranks on fewer cores need --oversubscribe.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
d=$(mktemp -d /tmp/khor-mpirun.XXXXXX)
trap 'rm -rf "$d"' EXIT

CASES_VERBOSE=${TEST_MPIRUN_VERBOSE:-0}
# shellcheck source=../support/cases.sh
. "$(dirname "$0")/../support/cases.sh"
# A port free now on 127.0.0.1 for rank 0's store.
free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# launch LAUNCHER NP ARGS...: the launcher's command line for NP local ranks.
launch() {
	local which=$1 np=$2
	shift 2
	if [ "$which" = openmpi ]; then
		# -x: what reaches ranks on other hosts (local ones inherit it anyway).
		local x=()
		[ -z "${MASTER_ADDR:-}" ] || x+=(-x MASTER_ADDR)
		[ -z "${MASTER_PORT:-}" ] || x+=(-x MASTER_PORT)
		timeout 60 "$ompi" --oversubscribe -np "$np" "${x[@]}" "$@"
	else
		timeout 60 "$hydra" -n "$np" "$@"
	fi
}

# np ranks, one job: each prints the right average and joined as rank r of np via source.
allreduce_case() {
	local which=$1 np=$2 source=$3 r out=$d/$1-$2.out
	MASTER_ADDR=127.0.0.1 MASTER_PORT=$(free_port) launch "$which" "$np" "$example" >"$out" 2>&1
	local rc=$?
	cat "$out"
	[ $rc -eq 0 ] || why "$which -np $np exited $rc" || return
	local want
	want=$(awk -v n="$np" 'BEGIN { printf "%g", (n - 1) / 2 + 999 }')
	for r in $(seq 0 $((np - 1))); do
		grep -q "^rank $r of $np: grad\[999\] = $want (expected $want)" "$out" ||
			why "rank $r of $np: no right result (want $want)" || return
		grep -q "as rank $r of $np (local $r/$np, cross 0/1) via $source" "$out" ||
			why "rank $r: did not join as rank $r of $np (local $r/$np) via $source" || return
	done
	[ "$(grep -c "serving the rendezvous store" "$out")" = 1 ] ||
		why "not one rank serving the store"
}

# No MASTER_ADDR: every rank fails by itself, at once, with the launcher's name. Each rank
# runs under a wrapper that keeps its exit status and exits 0, so that the launcher does not
# kill the others when the first one fails.
no_store_case() {
	local which=$1 np=4 name=$2 rankvar=$3 t0 r
	rm -f "$d"/ns.*
	t0=$(date +%s%N)
	# $3 names the launcher's rank variable, read by each rank's own shell.
	launch "$which" "$np" sh -c 'eval "r=\${$3}"; "$1" >"$2/ns.out.$r" 2>&1; echo $? >"$2/ns.rc.$r"' \
		- "$example" "$d" "$rankvar" >"$d/ns.launcher" 2>&1
	local ms=$((($(date +%s%N) - t0) / 1000000))
	echo "all ranks ended after $ms ms"
	cat "$d/ns.launcher"
	for r in $(seq 0 $((np - 1))); do
		[ -s "$d/ns.rc.$r" ] || why "rank $r left no exit status" || return
		echo "rank $r: exit $(cat "$d/ns.rc.$r"): $(cat "$d/ns.out.$r")"
		[ "$(cat "$d/ns.rc.$r")" != 0 ] || why "rank $r exited 0 with no store" || return
		grep -q "rank $r of $np: started by $name" "$d/ns.out.$r" ||
			why "rank $r's error does not say 'rank $r of $np: started by $name'" || return
		grep -q "set MASTER_ADDR and MASTER_PORT" "$d/ns.out.$r" ||
			why "rank $r's error does not say what to set" || return
	done
	[ $ms -lt 10000 ] || why "the ranks took $ms ms to fail (a wait, not a refusal)"
}

t_openmpi_np2() { allreduce_case openmpi 2 openmpi; }
t_openmpi_np4() { allreduce_case openmpi 4 openmpi; }
t_hydra_np2() { allreduce_case hydra 2 pmi; }
t_hydra_np4() { allreduce_case hydra 4 pmi; }
t_openmpi_no_store() { no_store_case openmpi "OpenMPI's mpirun" OMPI_COMM_WORLD_RANK; }
t_hydra_no_store() { no_store_case hydra "a PMI launcher (MPICH's Hydra mpiexec" PMI_RANK; }

# Python under mpirun: khor.init() takes OpenMPI's ranks, the sum is over both.
t_openmpi_python() {
	# Each rank writes its line to a file of its own: mpirun's forwarded stdout may cut
	# one rank's line in two around another's.
	MASTER_ADDR=127.0.0.1 MASTER_PORT=$(free_port) PYTHONPATH=$src/bindings/python \
		KHOR_LIBRARY_PATH=$lib PYOUT=$d launch openmpi 2 "$python" -c '
import os, khor, numpy as np
khor.init()
x = khor.allreduce(np.full(4, khor.rank() + 1, np.float32), op=khor.Sum)
with open(os.path.join(os.environ["PYOUT"], "py.%d" % khor.rank()), "w") as f:
    print("py rank %d of %d: %s" % (khor.rank(), khor.size(), x.tolist()), file=f)
khor.shutdown()
' >"$d/py.out" 2>&1
	local rc=$?
	cat "$d/py.out" "$d"/py.[01]
	[ $rc -eq 0 ] || why "mpirun -np 2 python3 exited $rc" || return
	local r
	for r in 0 1; do
		grep -q "^py rank $r of 2: \[3.0, 3.0, 3.0, 3.0\]" "$d/py.$r" ||
			why "python rank $r of 2: no right sum" || return
	done
}

cases=""
[ -n "$ompi" ] && cases="$cases openmpi_np2 openmpi_np4 openmpi_no_store"
if [ -n "$ompi" ] && [ -n "$python" ]; then
	cases="$cases openmpi_python"
else
	echo "test_mpirun: no PYTHON argument (or no mpirun.openmpi): the Python case is skipped"
fi
[ -n "$hydra" ] && cases="$cases hydra_np2 hydra_np4 hydra_no_store"
for c in $cases; do
	run "$c" "t_$c"
done
echo "test_mpirun: $passed passed, $failed failed"
[ $failed -eq 0 ]
