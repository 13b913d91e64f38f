#!/usr/bin/env bash
# soak.sh -- a soak of two jobs of n = 4 ranks at once, one over tcp and one over shm
# (khor-soak: collectives and engine traffic from two threads, 0 B to 64 MiB, comms made
# and freed, every result checked), for SECONDS. Each rank reports its calls, bytes, errors, RSS, open fds and
# threads every 10 s; this prints them per transport and fails unless every rank ended
# with no error and, from the end of the warm-up (120 s, or a third of a shorter run) to
# the end, its RSS grew under 1% (the median of the last third of those samples against
# that of the first third; SOAK_RSS_MAX sets another percentage) and its fds and threads not
# at all. The heap in use (mallinfo2) is printed beside RSS: RSS also holds what the
# allocator keeps after a free, which moves by a few MiB in a short run.
#
#   bench/soak.sh [SECONDS (300)] [BUILD_DIR (build)] [LOG_DIR (soak-logs)]
#
# CI runs it for 300 s beside its builds (.ci/test); docs/PERFORMANCE.md has a longer run.
set -uo pipefail
secs=${1:-300}
build=${2:-build}
logs=${3:-soak-logs}
every=10
for b in khorrun khor-soak; do
	[ -x "$build/$b" ] || { echo "soak: no $build/$b (build it first)" >&2; exit 2; }
done
mkdir -p "$logs"
# Both at once: 8 ranks for the whole time (a soak wants load, not speed).
declare -A pid
for tp in tcp shm; do
	echo "soak: $tp, 4 ranks, ${secs} s (log: $logs/soak-$tp.log)"
	# The run's own deadline: the run, its last decision and the engine's stop, with room.
	timeout $((secs + 300)) "$build/khorrun" -np 4 -x KHOR_TRANSPORT="$tp" \
		"$build/khor-soak" --seconds "$secs" --every "$every" >"$logs/soak-$tp.log" 2>&1 &
	pid[$tp]=$!
done
# Progress: every 30 s, rank 0's latest sample of each job.
while kill -0 "${pid[tcp]}" 2>/dev/null || kill -0 "${pid[shm]}" 2>/dev/null; do
	sleep 5
	if [ $((SECONDS % 30)) -lt 5 ]; then
		for tp in tcp shm; do
			l=$(grep '^\[0\] soak rank 0 at ' "$logs/soak-$tp.log" | tail -n 1)
			[ -n "$l" ] && echo "  $tp: ${l#\[0\] }"
		done
	fi
done
rc=0
for tp in tcp shm; do
	wait "${pid[$tp]}"
	st=$?
	log="$logs/soak-$tp.log"
	echo "soak: $tp:"
	if ! python3 - "$log" "$secs" "$tp" "$st" <<'EOF'; then
import os, re, sys
log, secs, tp, st = sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
warm = min(120.0, secs / 3)
rss_max = float(os.environ.get("SOAK_RSS_MAX", "1")) / 100
pat = re.compile(r"soak rank (\d+) (start|at|done) t (\d+) calls (\d+) bytes (\d+) errors (\d+) "
                 r"rss (-?\d+) fds (-?\d+) threads (-?\d+) heap (\d+)")
ranks = {}
for line in open(log, errors="replace"):
    m = pat.search(line)
    if m:
        r = int(m.group(1))
        ranks.setdefault(r, []).append((m.group(2), float(m.group(3)), int(m.group(4)),
                                        int(m.group(5)), int(m.group(6)), int(m.group(7)),
                                        int(m.group(8)), int(m.group(9)), int(m.group(10))))
ok = st == 0 and sorted(ranks) == [0, 1, 2, 3]
if st != 0:
    print("  FAIL: the job exited %d; the log's last lines:" % st)
    print("".join("    " + l for l in open(log, errors="replace").readlines()[-6:]))
print("  %-4s %8s %12s %6s %14s %10s %10s" % ("rank", "calls", "GB", "errors",
                                          "rss KiB", "fds", "threads"))
for r in sorted(ranks):
    s = ranks[r]
    done = [x for x in s if x[0] == "done"]
    at = [x for x in s if x[0] == "at" and x[1] >= warm]
    end = done[-1] if done else s[-1]
    if not at:
        print("  rank %d: no sample after the %.0f s warm-up" % (r, warm))
        ok = False
        continue
    first, last = at[0], at[-1]
    # RSS: the median of the window's last third against that of its first third, so
    # that the allocator's ups and downs (a few MiB either way) do not count as growth.
    k = max(1, len(at) // 3)
    med = lambda xs: sorted(xs)[len(xs) // 2]
    a, b = med([x[5] for x in at[:k]]), med([x[5] for x in at[-k:]])
    grow = (b - a) / a if a > 0 else 1.0
    ha, hb = med([x[8] for x in at[:k]]), med([x[8] for x in at[-k:]])
    hgrow = (hb - ha) / ha if ha > 0 else 0.0
    line = "  %-4d %8d %12.1f %6d %7d->%-7d %4d->%-4d %4d->%-4d rss %+.2f%% heap %+.2f%%" % (
        r, end[2], end[3] / 1e9, end[4], first[5], last[5], first[6], last[6], first[7],
        last[7], 100 * grow, 100 * hgrow)
    bad = []
    if not done:
        bad.append("no done line")
    if end[4] != 0:
        bad.append("errors")
    if grow >= rss_max:
        bad.append("RSS grew %.2f%% after the warm-up" % (100 * grow))
    if last[6] > first[6]:
        bad.append("fds grew")
    if last[7] > first[7]:
        bad.append("threads grew")
    print(line + ("  FAIL: " + ", ".join(bad) if bad else ""))
    ok = ok and not bad
print("  %s: %s, %.0f s, samples from %.0f s on" % ("PASS" if ok else "FAIL", tp, secs, warm))
sys.exit(0 if ok else 1)
EOF
		rc=1
	fi
done
exit $rc
