#!/usr/bin/env bash
# bench_startup.sh -- khorrun's start-up, from the command to every rank inside khor_init
# returning (init_time.c prints when it returns), median of N runs:
#   local:  khorrun -np P                      (P ranks on this host)
#   ssh:    khorrun -H h0:P,h1:P,...,h(K-1):P  (K namespace hosts of netns_hosts.sh, each
#                                               reached over its own sshd)
# usage: bench_startup.sh BUILD_DIR [-k HOSTS] [-p RANKS_PER_HOST] [-n RUNS]
# BUILD_DIR holds khorrun and libkhor.so; init_time.c is compiled against them here. Root.
set -u -o pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD=${1:?usage: $0 BUILD_DIR [-k HOSTS] [-p RANKS_PER_HOST] [-n RUNS]}
shift
K=4 P=4 N=5
while [ $# -gt 0 ]; do
	case $1 in
	-k) K=$2; shift 2 ;;
	-p) P=$2; shift 2 ;;
	-n) N=$2; shift 2 ;;
	*) echo "usage: $0 BUILD_DIR [-k HOSTS] [-p RANKS_PER_HOST] [-n RUNS]" >&2; exit 2 ;;
	esac
done
[ "$(id -u)" -eq 0 ] || { echo "$0: needs root (network namespaces)" >&2; exit 77; }
KHORRUN=$BUILD/khorrun
. "$HERE/netns_hosts.sh"
TMP=$(mktemp -d /tmp/khor-startup.XXXXXX)
trap 'hosts_down; rm -rf "$TMP"' EXIT
cc -O2 -I"$REPO/include" -o "$TMP/init_time" "$HERE/init_time.c" -L"$BUILD" -lkhor \
	-Wl,-rpath,"$(cd "$BUILD" && pwd)" || exit 1
hosts_up "$K" || exit 1

# one_run ARGS...: seconds from the command to the last rank's khor_init return.
one_run() {
	local t0 last
	t0=$(date +%s.%N)
	"$KHORRUN" "$@" "$TMP/init_time" >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err" >&2; return 1; }
	last=$(sed -n 's/.*init_done //p' "$TMP/out" | sort -n | tail -1)
	awk -v a="$last" -v b="$t0" 'BEGIN { printf "%.3f\n", a - b }'
}
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

hlist=
for ((i = 0; i < K; i++)); do hlist+="${hlist:+,}${HOSTS_ADDR[$i]}:$P"; done
for mode in local ssh; do
	times=()
	for ((r = 0; r < N; r++)); do
		if [ $mode = local ]; then
			t=$(one_run -np "$P") || exit 1
		else
			t=$(one_run --ssh-command "ssh -F $HOSTS_SSH_CONFIG" -x "KHOR_SOCKET_IFNAME=$HOSTS_CIDR" -H "$hlist") || exit 1
		fi
		times+=("$t")
	done
	med=$(printf '%s\n' "${times[@]}" | median)
	if [ $mode = local ]; then
		echo "local: 1 host x $P ranks: median ${med} s of ${times[*]}"
	else
		echo "ssh:   $K hosts x $P ranks: median ${med} s of ${times[*]}"
	fi
done
