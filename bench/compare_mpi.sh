#!/usr/bin/env bash
# compare_mpi.sh -- khor-bench against its OpenMPI twin, as a markdown table per rank count.
#
# Runs khor (under khorrun) and mpi-bench (under mpirun) alternately, R times each, so that a
# noisy neighbour or a frequency change hits both sides alike instead of whichever ran second,
# then keeps the median (or best) time per size. Both programs write --csv, so nothing here
# depends on the layout of their printed columns.
#
#   bench/compare_mpi.sh                         # allreduce, 8 B..64 MiB, n=2 and 4, MPI over TCP
#   bench/compare_mpi.sh -t vader -n 4 -e 1M     # MPI over shared memory instead
#   bench/compare_mpi.sh -- -d double -o max     # anything after -- goes to both benchmarks
#
# Every flag has an environment twin (in brackets in the usage), so CI can set them instead.
# KHOR_* variables in the environment reach khor-bench through khorrun unchanged: that is how
# to pick khor's transport or algorithm for a run.
set -euo pipefail

usage() {
	cat <<EOF
usage: $0 [flags] [-- extra khor-bench/mpi-bench flags]
  -c COLL     collective (allreduce) [COLL]
  -n "N..."   rank counts (2 4) [NPS]
  -b SIZE     smallest size (8) [MINBYTES]
  -e SIZE     largest size (64M) [MAXBYTES]
  -f N        step factor (2) [STEPFACTOR]
  -i N        timed iterations per size (20) [ITERS]
  -w N        warm-up iterations per size (5) [WARMUP]
  -R N        alternating repetitions of each program (3) [REPEATS]
  -s STAT     median or best time of the repetitions (median) [STAT]
  -t BTL      MPI transport: tcp (loopback) or vader (shared memory) (tcp) [BTL]
  -B DIR      build directory with khorrun, khor-bench, mpi-bench (build) [BUILD]
  -m          MPI only: skip khor (its columns show -) [MPI_ONLY=1]
  -h          this text
EOF
}

COLL=${COLL:-allreduce}
NPS=${NPS:-"2 4"}
MINBYTES=${MINBYTES:-8}
MAXBYTES=${MAXBYTES:-64M}
STEPFACTOR=${STEPFACTOR:-2}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
REPEATS=${REPEATS:-3}
STAT=${STAT:-median}
BTL=${BTL:-tcp}
BUILD=${BUILD:-build}
MPI_ONLY=${MPI_ONLY:-0}

while getopts ":c:n:b:e:f:i:w:R:s:t:B:mh" opt; do
	case $opt in
	c) COLL=$OPTARG ;;
	n) NPS=$OPTARG ;;
	b) MINBYTES=$OPTARG ;;
	e) MAXBYTES=$OPTARG ;;
	f) STEPFACTOR=$OPTARG ;;
	i) ITERS=$OPTARG ;;
	w) WARMUP=$OPTARG ;;
	R) REPEATS=$OPTARG ;;
	s) STAT=$OPTARG ;;
	t) BTL=$OPTARG ;;
	B) BUILD=$OPTARG ;;
	m) MPI_ONLY=1 ;;
	h) usage; exit 0 ;;
	:) echo "$0: -$OPTARG needs a value" >&2; usage >&2; exit 2 ;;
	*) echo "$0: unknown flag -$OPTARG" >&2; usage >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
EXTRA=("$@")

case $BTL in
# pml ob1 pins MPI to the BTL named here: left to itself it may pick UCX, which ignores --mca btl.
tcp) MPI_NET=(--mca pml ob1 --mca btl "tcp,self" --mca btl_tcp_if_include lo) ;;
vader) MPI_NET=(--mca pml ob1 --mca btl "vader,self") ;;
*) echo "$0: -t must be tcp or vader, not '$BTL'" >&2; exit 2 ;;
esac
case $STAT in median | best) ;; *) echo "$0: -s must be median or best" >&2; exit 2 ;; esac
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || { echo "$0: -R must be a positive integer" >&2; exit 2; }

need() {
	[[ -x $1 ]] || { echo "$0: $1 not found; build it first ($2)" >&2; exit 2; }
}
need "$BUILD/mpi-bench" "cmake --build $BUILD --target mpi-bench"
if [[ $MPI_ONLY != 1 ]]; then
	need "$BUILD/khorrun" "cmake --build $BUILD --target khorrun"
	need "$BUILD/khor-bench" "cmake --build $BUILD --target khor-bench"
fi
command -v mpirun >/dev/null || { echo "$0: mpirun not found (apt-get install openmpi-bin)" >&2; exit 2; }

MPIRUN=(mpirun --oversubscribe "${MPI_NET[@]}")
[[ $(id -u) == 0 ]] && MPIRUN+=(--allow-run-as-root)

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
BENCH_FLAGS=(-b "$MINBYTES" -e "$MAXBYTES" -f "$STEPFACTOR" -n "$ITERS" -w "$WARMUP" "${EXTRA[@]}")

# Runs one benchmark into a CSV; on failure shows its output and stops: a benchmark that
# fails or computes wrong results has nothing to compare.
run_one() {
	local name=$1 csv=$2
	shift 2
	if ! "$@" "$COLL" "${BENCH_FLAGS[@]}" --csv "$csv" >"$csv.log" 2>&1; then
		echo "$0: $name failed: $*" >&2
		# The programs' own lines name the cause; launcher noise and usage text follow them.
		grep -m 10 -E '^(\[[0-9]+\] )?(khor-bench|mpi-bench|khorrun)' "$csv.log" >&2 || tail -n 20 "$csv.log" >&2
		exit 1
	fi
}

for np in $NPS; do
	for ((r = 1; r <= REPEATS; r++)); do
		if [[ $MPI_ONLY != 1 ]]; then
			run_one "khor-bench (n=$np, run $r)" "$TMP/khor-$np-$r.csv" \
				"$BUILD/khorrun" -np "$np" "$BUILD/khor-bench"
		fi
		run_one "mpi-bench (n=$np, run $r)" "$TMP/mpi-$np-$r.csv" \
			"${MPIRUN[@]}" -np "$np" "$BUILD/mpi-bench"
	done
done

/usr/bin/python3 - "$TMP" "$STAT" "$BTL" "$NPS" <<'EOF'
# Merges the CSVs into one markdown table per rank count.
import csv, glob, os, statistics, sys

tmp, stat, btl, nps = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split()
pick = min if stat == "best" else statistics.median

def load(kind, np):
    """size -> list of (time_us, busbw) over the repetitions, plus the first row seen."""
    runs, first = {}, None
    for path in sorted(glob.glob(os.path.join(tmp, f"{kind}-{np}-*.csv"))):
        with open(path) as f:
            for row in csv.DictReader(f):
                first = first or row
                runs.setdefault(int(row["size"]), []).append(
                    (float(row["time_us"]), float(row["busbw_gbs"])))
    return runs, first

def summarise(samples):
    """The chosen time, and the busbw that goes with it: busbw is size/time times a constant."""
    if not samples:
        return None, None
    t = pick([s[0] for s in samples])
    ref_t, ref_bw = samples[0]
    return t, (ref_bw * ref_t / t if t > 0 else 0.0)

def fmt(v, spec):
    return "-" if v is None else format(v, spec)

def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"

for np in nps:
    khor, krow = load("khor", np)
    mpi, mrow = load("mpi", np)
    row = krow or mrow
    if row is None:
        continue
    what = row["collective"]
    if row["redop"] != "none":
        what += f", {row['type']} {row['redop']}"
    elif row["type"] != "none":
        what += f", {row['type']}"
    nrep = max((len(v) for v in list(khor.values()) + list(mpi.values())), default=0)
    print(f"### {what}, {np} ranks: {krow['library'] if krow else 'khor (not run)'} vs "
          f"{mrow['library'] if mrow else 'MPI (not run)'} (btl {btl}), {stat} of {nrep} runs\n")
    print("| size (B) | khor time (us) | mpi time (us) | khor busbw (GB/s) | mpi busbw (GB/s) "
          "| busbw khor/mpi | time mpi/khor |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for size in sorted(set(khor) | set(mpi)):
        kt, kb = summarise(khor.get(size, []))
        mt, mb = summarise(mpi.get(size, []))
        print(f"| {size} | {fmt(kt, '.2f')} | {fmt(mt, '.2f')} | {fmt(kb, '.4g')} "
              f"| {fmt(mb, '.4g')} | {ratio(kb, mb)} | {ratio(mt, kt)} |")
    print()
EOF
