#!/usr/bin/env bash
# test_cluster.sh -- CTest check of netns_cluster.sh: a 3-host cluster at 1 Gbit/s, one short
# allreduce sweep per algorithm with results checked, and proof that nothing is left behind.
#
# Why a test: the cluster script creates kernel objects (namespaces, veth pairs, a bridge,
# qdiscs) as root; a script like that which leaks on failure poisons the next run and the
# machine. So besides "0 wrong, exit 0" it asserts that no namespace or link of its prefix
# survives, and that --cleanup finds nothing to do.
#
#   test_cluster.sh [path/to/khor-bench]      (default: $KHOR_BENCH or build/khor-bench)
#
# Exit 77 (CTest SKIP_RETURN_CODE) with the reason when not root, when network namespaces
# are unavailable, or when khor-bench has not been built; 0 on success; 1 on failure.
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BENCH=${1:-${KHOR_BENCH:-$REPO/build/khor-bench}}
PREFIX=khort-   # not the benchmark's khor-: a test must not collide with a benchmark run

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || skip "not root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
command -v ip >/dev/null || skip "iproute2 'ip' not installed"
command -v tc >/dev/null || skip "iproute2 'tc' not installed"
ip netns list >/dev/null 2>&1 || skip "'ip netns' unavailable"
# Creating one proves the kernel allows it (containers often refuse).
probe=${PREFIX}probe$$
ip netns add "$probe" 2>/dev/null || skip "cannot create a network namespace here"
ip netns del "$probe"
[ -x "$BENCH" ] || skip "khor-bench not built at $BENCH"

leftovers() {
	ip netns list 2>/dev/null | awk '{ print $1 }' | grep -E "^${PREFIX}" || true
	ip -o link show 2>/dev/null | grep -E ': (khor-p[0-9]|khorbr0)' || true
}
[ -z "$(leftovers)" ] || "$HERE/netns_cluster.sh" --cleanup --prefix "$PREFIX" >/dev/null

OUT=$(mktemp -d "${TMPDIR:-/tmp}/khor-cluster-test.XXXXXX") || fail "mktemp"
trap 'rm -rf "$OUT"' EXIT

rc=0
"$HERE/netns_cluster.sh" -k 3 --rate 1gbit --prefix "$PREFIX" --bench "$BENCH" \
	--algos ring,tree,rd --lat-args "-b 8 -e 4K -f 8 -n 5 -w 1" --lat-repeat 1 \
	--bw-args "-b 64K -e 1M -f 4 -n 2 -w 1" -c 1 --timeout 120 --no-checks --out "$OUT" || rc=$?
[ $rc -eq 0 ] || { cat "$OUT"/logs/*.log 2>/dev/null | tail -n 40 >&2; fail "netns_cluster.sh exited with $rc"; }

RES=$OUT/results.csv
[ -s "$RES" ] || fail "no $RES"
rows=$(awk -F, 'NR > 1' "$RES" | wc -l)
[ "$rows" -ge 9 ] || fail "expected >= 9 result rows (3 algorithms x sizes), got $rows"
wrong=$(awk -F, 'NR > 1 { w += $12 } END { print w + 0 }' "$RES")
[ "$wrong" -eq 0 ] || fail "$wrong wrong elements"
awk -F, 'NR > 1 && $3 != 3 { bad = 1 } END { exit bad }' "$RES" || fail "a run did not have 3 ranks"

left=$(leftovers)
[ -z "$left" ] || fail "left behind after the run: $left"
"$HERE/netns_cluster.sh" --cleanup --prefix "$PREFIX" | grep -q 'removed nothing' ||
	fail "--cleanup found something to remove after a clean run"
echo "PASS: 3 hosts at 1gbit, $rows sizes x algorithms, 0 wrong, nothing left behind"
