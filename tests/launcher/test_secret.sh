#!/usr/bin/env bash
# test_secret.sh -- the job secret shows up in none of what a job leaves for people to read:
# its output and logs at KHOR_LOG=trace, the engine's timelines, the error texts of a job
# that fails (a rank killed mid-allreduce, which every other rank reports), and khorrun's
# own lines; nor in what a stranger that tries the store with a wrong secret is told. Each
# job's ranks write the secret khorrun made into a file first, so the test knows what to
# look for (khorrun makes a fresh one per job); every file is then searched for it, and for
# its first half (a truncated copy would be a leak too). Last, the core dumps (gcore) and
# /proc/<pid>/environ of a running job's ranks, of khor-bench and of Python: the secret lives
# in one page that dumps leave out, and the environment's copies (the C one, and Python's
# os.environ) are wiped once init has read it.
#
#   test_secret.sh KHORRUN KHOR_BENCH [PYTHON]
#
# With PYTHON (an interpreter that imports khor and numpy: PYTHONPATH, KHOR_LIBRARY_PATH),
# a job of Python ranks is dumped too.
set -u
KR=${1:?usage: test_secret.sh KHORRUN KHOR_BENCH [PYTHON]}
KB=${2:?usage: test_secret.sh KHORRUN KHOR_BENCH [PYTHON]}
PY=${3:-}
WORK=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
failed=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failed=1; }

# Rank command: note the secret, then run the rest.
note='printf %s "$KHOR_SECRET" > "$0.secret.$KHOR_RANK"; shift; exec "$@"'

# 1. An engine job at full logging, with a timeline per rank.
timeout 120 "$KR" -np 2 -x KHOR_LOG=trace -x "KHOR_TIMELINE=$WORK/tl.%r.json" \
	sh -c "$note" "$WORK/j1" x "$KB" step --set small -n 2 -w 1 \
	>"$WORK/j1.out" 2>"$WORK/j1.err"
rc=$?
[ $rc -eq 0 ] || fail "the engine job exited $rc: $(tail -3 "$WORK/j1.err")"
ls "$WORK"/tl.*.json >/dev/null 2>&1 || fail "the engine job wrote no timeline"

# 2. A job that fails: rank 2's process is killed mid-allreduce (its shell lives on, so
# khorrun does not stop the job first) and the others report it in their errors.
timeout 120 "$KR" -np 3 -x KHOR_LOG=debug \
	sh -c "$note" "$WORK/j2" x sh -c \
	'if [ "$KHOR_RANK" = 2 ]; then "$0" allreduce -b 16M -e 16M -n 100000 -w 1 -c 0 & p=$!; sleep 1; kill -9 $p; sleep 20; exit 0; fi; exec "$0" allreduce -b 16M -e 16M -n 100000 -w 1 -c 0' \
	"$KB" >"$WORK/j2.out" 2>"$WORK/j2.err"
rc=$?
[ $rc -ne 0 ] || fail "the job with a killed rank exited 0"
grep -v " INFO \| DEBUG " "$WORK/j2.err" | grep -q "^\[[01]\] .*rank 2" ||
	fail "the other ranks' errors do not name rank 2: $(tail -3 "$WORK/j2.err")"

# 3. A stranger with a wrong secret at a job's store: what it is told, and what is logged.
timeout 60 "$KR" -np 2 -x KHOR_LOG=debug sh -c "$note" "$WORK/j3" x sh -c \
	'if [ "$KHOR_RANK" = 0 ]; then KHOR_SECRET=not-the-secret KHOR_RANK=1 KHOR_INIT_TIMEOUT=3s "$0" allreduce -b 8 -e 8 -n 1 -w 0 -c 0 > "$1.stranger" 2>&1; fi; exec "$0" allreduce -b 8 -e 8 -n 5 -w 1 -c 1' \
	"$KB" "$WORK/j3" >"$WORK/j3.out" 2>"$WORK/j3.err"
grep -qi "secret" "$WORK/j3.stranger" 2>/dev/null ||
	fail "the stranger was not told its secret was refused: $(tail -2 "$WORK/j3.stranger" 2>/dev/null)"

# 4. Core dumps and /proc of live ranks: gcore (gdb's, which leaves out what the kernel's
# dump would: madvise(MADV_DONTDUMP)) of each rank of a running job, after its init, and
# each one's /proc/<pid>/environ. The ranks' environments carried the secret until init
# read it.
# dump_ranks JOB: gcore and /proc/<pid>/environ of ranks 0 and 1 of the running job whose
# ranks wrote JOB.pid.R; READY: the file each rank writes once its init is done (else 5 s).
dump_ranks() {
	local job=$1 r pid
	for _ in $(seq 1 300); do
		[ -s "$job.pid.0" ] && [ -s "$job.pid.1" ] && break
		sleep 0.1
	done
	if [ -n "${READY:-}" ]; then
		for _ in $(seq 1 600); do
			[ -e "$job.ready.0" ] && [ -e "$job.ready.1" ] && break
			sleep 0.1
		done
		sleep 0.5
	else
		sleep 5 # init: under a second here, 5 s under ASan
	fi
	for r in 0 1; do
		pid=$(cat "$job.pid.$r" 2>/dev/null)
		if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
			fail "rank $r of $(basename "$job") is not running: $(tail -2 "$job.err")"
			continue
		fi
		timeout 60 gcore -o "$job.core.$r" "$pid" >/dev/null 2>&1 ||
			fail "gcore of rank $r of $(basename "$job") (pid $pid) failed"
		ls "$job.core.$r".* >/dev/null 2>&1 || fail "gcore left no core of rank $r"
		tr '\0' '\n' < "/proc/$pid/environ" > "$job.environ.$r" 2>/dev/null ||
			fail "cannot read rank $r's /proc/$pid/environ"
	done
}

pidnote='printf %s "$$" > "$0.pid.$KHOR_RANK"; '"$note"
pyjobs=0
if ldd "$KB" 2>/dev/null | grep -q 'libasan\|libtsan'; then
	echo "SKIP: core dumps (a sanitizer build: gcore would dump its shadow memory)"
elif command -v gcore >/dev/null 2>&1; then
	timeout 120 "$KR" -np 2 sh -c "$pidnote" "$WORK/j4" x "$KB" allreduce -b 1M -e 1M \
		-n 1000000 -w 1 -c 0 >"$WORK/j4.out" 2>"$WORK/j4.err" &
	job=$!
	dump_ranks "$WORK/j4"
	kill "$job" 2>/dev/null
	wait "$job" 2>/dev/null
	# 5. The same of Python ranks (khor's numpy API): os.environ holds a copy of its own.
	if [ -n "$PY" ] && "$PY" -c 'import khor, numpy' 2>/dev/null; then
		timeout 120 "$KR" -np 2 sh -c "$pidnote" "$WORK/j5" x "$PY" -c '
import os, sys, time
import numpy as np
import khor
khor.init()
open("%s.ready.%d" % (sys.argv[1], khor.rank()), "w").close()
x = np.ones(1024, np.float32)
for _ in range(12000):
    khor.allreduce(x, op=khor.Sum)
    time.sleep(0.005)
' "$WORK/j5" >"$WORK/j5.out" 2>"$WORK/j5.err" &
		job=$!
		READY=1 dump_ranks "$WORK/j5"
		kill "$job" 2>/dev/null
		wait "$job" 2>/dev/null
		pyjobs=1
	else
		echo "SKIP: a Python rank's core dump (no PYTHON given, or it cannot import khor and numpy)"
	fi
else
	echo "SKIP: core dumps (no gcore: apt-get install gdb)"
fi
cores=$(ls "$WORK"/*.core.* 2>/dev/null | wc -l)

n=0
for f in "$WORK"/j*.secret.*; do
	s=$(cat "$f")
	if [ ${#s} -lt 16 ]; then
		fail "$f: no secret was handed to the rank (${#s} bytes)"
		continue
	fi
	n=$((n + 1))
	printf '%s\n%s\n' "$s" "${s:0:$((${#s} / 2))}" >"$WORK/pattern"
	# Every file the jobs left but the secret notes themselves.
	hits=$(find "$WORK" -type f ! -name '*.secret.*' ! -name pattern -print0 |
		xargs -0 grep -laFf "$WORK/pattern" 2>/dev/null)
	if [ -n "$hits" ]; then
		fail "the secret of $(basename "$f") is in: $hits"
	fi
done
files=$(find "$WORK" -type f ! -name '*.secret.*' ! -name pattern | wc -l)
lines=$(cat "$WORK"/j*.out "$WORK"/j*.err "$WORK"/*.stranger 2>/dev/null | wc -l)
want=$((7 + (cores > 0 ? 2 : 0) + pyjobs * 2))
[ $n -ge $want ] || fail "only $n of the $want ranks noted their secret"
[ $failed -eq 0 ] && pass "$n ranks' secrets ($(( 3 + (cores > 0) + pyjobs )) jobs) are in none of $files files ($lines lines of output and logs, $(ls "$WORK"/tl.*.json | wc -l) timelines, $cores core dumps of live ranks and their /proc environments)"
exit $failed
