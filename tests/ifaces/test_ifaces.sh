#!/usr/bin/env bash
# test_ifaces.sh -- a job across hosts whose network interfaces are named differently and
# where not every network reaches every host: with no KHOR_SOCKET_IFNAME it must just run.
#
# Three network-namespace "hosts", each with two NICs. The management NIC (eno1, created
# first, so the lowest index: the "first interface that is up") leads to a dead end: a
# veth whose other side sits, address-less, in a namespace of its own. Hosts 0 and 2 put it
# on the same subnet (198.19.20.0/24) without it joining them; host 1 on a subnet of its
# own (198.19.21.0/24). The fast NIC, named eth0, ens5 and enp129s0f1 on hosts 0, 1 and 2,
# is on a bridge (198.19.10.0/24) in a switch namespace.
#
#    khif<pid>h0          khif<pid>h1          khif<pid>h2
#    eno1  eth0           eno1  ens5           eno1  enp129s0f1
#     |     |              |     |              |     |
#   dead    +-------- br0 (khif<pid>sw) --------+     dead         (dead: khif<pid>dead)
#
# Ranks are started directly (ip netns exec, one rank per host, MASTER_ADDR/MASTER_PORT so
# that rank 0 serves the store), running khor-bench allreduce and broadcast with every
# result checked:
#   A. the store on host 0's fast address: every rank publishes its fast address first
#      (the store's subnet) and every link uses it;
#   B. the store on an address of host 0 that no host has a subnet for (a /32 reached by a
#      route), so hosts 1 and 2 publish their addresses in interface order, the dead one
#      first: connectors still pick the address on a subnet they share, and rank 0, whose
#      dead eno1 shares a subnet with host 2's, tries it, gives up after the attempt time
#      and takes the fast one;
#   C. KHOR_SOCKET_IFNAME=eno1 on every host: it still wins, so the job fails, within its
#      timeouts, with an error naming the peer and the address tried.
# KHOR_LOG=info must show each host's published addresses and each link's choice.
# Everything is removed at the end, whatever happens (trap). Needs root and `ip netns`:
# exit 77 (a skip) with the reason otherwise.
#
# Usage: test_ifaces.sh [path/to/khor-bench]   (default $KHOR_BENCH)
#        TEST_IFACES_LOGS=DIR keeps every rank's log there.
set -u -o pipefail

BENCH=${1:-${KHOR_BENCH:-}}
NS=khif$$
HOSTS=(h0 h1 h2)
FAST=(eth0 ens5 enp129s0f1)
FAST_IP=(198.19.10.1 198.19.10.2 198.19.10.3)
MGMT_IP=(198.19.20.1/24 198.19.21.2/24 198.19.20.3/24)
STORE_B=198.19.99.1
WORK=
PIDS=()
FAILS=0

say() { echo "test_ifaces: $*"; }
skip() { echo "test_ifaces: skipped: $*"; exit 77; }

[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null 2>&1 || skip "no ip command (iproute2)"
[ -n "$BENCH" ] && [ -x "$BENCH" ] || { echo "test_ifaces: no khor-bench (give its path, or set KHOR_BENCH)" >&2; exit 2; }
ip netns add "${NS}probe" 2>/dev/null || skip "ip netns add does not work here"
ip netns del "${NS}probe"

cleanup() {
	local p ns
	# Each rank runs under timeout, which leads a process group of its own: end the group
	# (timeout, ip netns exec's child, khor-bench), not just timeout.
	for p in "${PIDS[@]+"${PIDS[@]}"}"; do
		kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null
	done
	for p in "${PIDS[@]+"${PIDS[@]}"}"; do
		wait "$p" 2>/dev/null
	done
	for ns in h0 h1 h2 sw dead; do
		ip netns del "$NS$ns" 2>/dev/null
	done
	if [ -n "$WORK" ]; then
		[ -n "${TEST_IFACES_LOGS:-}" ] && mkdir -p "$TEST_IFACES_LOGS" &&
			cp "$WORK"/*.log "$TEST_IFACES_LOGS"/ 2>/dev/null
		rm -rf "$WORK"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

WORK=$(mktemp -d /tmp/test_ifaces.XXXXXX)

setup() {
	local k ns
	for ns in sw dead h0 h1 h2; do
		ip netns add "$NS$ns" || return 1
		ip -n "$NS$ns" link set lo up || return 1
	done
	ip -n "${NS}sw" link add br0 type bridge && ip -n "${NS}sw" link set br0 up || return 1
	for k in 0 1 2; do
		ns=$NS${HOSTS[k]}
		# The management NIC first: it gets the lower interface index.
		ip link add eno1 netns "$ns" type veth peer name "m$k" netns "${NS}dead" || return 1
		ip link add "${FAST[k]}" netns "$ns" type veth peer name "p$k" netns "${NS}sw" || return 1
		ip -n "${NS}dead" link set "m$k" up || return 1
		ip -n "${NS}sw" link set "p$k" master br0 up || return 1
		ip -n "$ns" addr add "${MGMT_IP[k]}" dev eno1 && ip -n "$ns" link set eno1 up || return 1
		ip -n "$ns" addr add "${FAST_IP[k]}/24" dev "${FAST[k]}" &&
			ip -n "$ns" link set "${FAST[k]}" up || return 1
	done
	# A veth has its carrier (IFF_RUNNING, which khor asks of an address it publishes) a
	# moment after both ends are up: wait for it, or the first job sees a NIC missing.
	local t
	for t in $(seq 50); do
		local down=0
		for k in 0 1 2; do
			for dev in eno1 "${FAST[k]}"; do
				ip -n "$NS${HOSTS[k]}" -br link show dev "$dev" | grep -q ' UP ' || down=1
			done
		done
		[ $down -eq 0 ] && break
		sleep 0.1
	done
	# Scenario B's store: an address of host 0 on no host's subnet, reached by a route.
	ip -n "${NS}h0" addr add "$STORE_B/32" dev eth0 || return 1
	ip -n "${NS}h1" route add "$STORE_B/32" via "${FAST_IP[0]}" || return 1
	ip -n "${NS}h2" route add "$STORE_B/32" via "${FAST_IP[0]}" || return 1
}

setup || { say "FAIL: could not build the namespaces"; exit 1; }

JOB=0
# run_job NAME STORE_IP EXTRA_ENV... -- BENCH_ARGS...: starts one rank per host, waits for
# all (each bounded by timeout), leaves logs in $WORK/NAME.rankK.log and statuses in RC[].
run_job() {
	local name=$1 store=$2; shift 2
	local envs=() args=() k port secret
	while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
	shift
	args=("$@")
	JOB=$((JOB + 1))
	port=$((31000 + ($$ % 2000) * 8 + JOB))
	secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
	PIDS=()
	for k in 0 1 2; do
		timeout -k 5 60 ip netns exec "$NS${HOSTS[k]}" env -i PATH="$PATH" \
			KHOR_RANK=$k KHOR_SIZE=3 MASTER_ADDR="$store" MASTER_PORT=$port \
			KHOR_JOB_ID="ifaces-$$-$JOB" KHOR_SECRET="$secret" KHOR_HOSTNAME="host$k" \
			KHOR_LOG=info KHOR_TIMEOUT=10s KHOR_INIT_TIMEOUT=20s \
			"${envs[@]+"${envs[@]}"}" \
			"$BENCH" "${args[@]}" >"$WORK/$name.rank$k.log" 2>&1 &
		PIDS+=($!)
	done
	RC=()
	for k in 0 1 2; do
		wait "${PIDS[k]}"
		RC[k]=$?
	done
	PIDS=()
}

fail() {
	say "FAIL: $*"
	FAILS=$((FAILS + 1))
}

show_logs() {
	local f
	for f in "$WORK/$1".rank*.log; do
		echo "---- $(basename "$f")"
		tail -n 40 "$f"
	done
}

# expect_ok NAME: every rank exited 0.
expect_ok() {
	local k bad=
	for k in 0 1 2; do
		[ "${RC[k]}" -eq 0 ] || bad="$bad rank $k: status ${RC[k]}"
	done
	if [ -n "$bad" ]; then
		fail "$1:$bad"
		show_logs "$1"
		return 1
	fi
	return 0
}

# expect_log NAME RANK TEXT WHAT: the rank's log has the fixed string TEXT.
expect_log() {
	if ! grep -qF -- "$3" "$WORK/$1.rank$2.log"; then
		fail "$1: rank $2's log lacks '$3' ($4)"
		show_logs "$1"
	fi
}

CHECKS=(-b 8 -e 256K -f 8 -n 2 -w 1 -c all)
t_start=$SECONDS

# --- A: the store on host 0's fast address ------------------------------------------------
for coll in allreduce broadcast; do
	extra=()
	[ $coll = broadcast ] && extra=(-r 2)
	run_job "A-$coll" "${FAST_IP[0]}" -- $coll "${CHECKS[@]}" "${extra[@]+"${extra[@]}"}"
	expect_ok "A-$coll" || continue
	for k in 0 1 2; do
		expect_log "A-$coll" $k "publishes ${FAST_IP[k]}:" "the published addresses"
		expect_log "A-$coll" $k "(${FAST[k]}, the store's subnet 198.19.10.0/24)" \
			"the fast NIC first, as the store's subnet"
	done
	expect_log "A-$coll" 0 "link to rank 1 uses tcp: ${FAST_IP[1]}:" "rank 0 dials host 1's fast NIC"
	expect_log "A-$coll" 0 "(same subnet as ${FAST_IP[0]}/24 on eth0)" "and says why"
	expect_log "A-$coll" 1 "link to rank 2 uses tcp: ${FAST_IP[2]}:" "rank 1 dials host 2's fast NIC"
done
grep -h "publishes\|uses tcp" "$WORK"/A-allreduce.rank*.log | sed 's/^/  A: /'

# --- B: a store on no host's subnet: the published order is the interfaces' ---------------
run_job B-allreduce "$STORE_B" -- allreduce "${CHECKS[@]}"
if expect_ok B-allreduce; then
	expect_log B-allreduce 1 "publishes 198.19.21.2:" "host 1 publishes its eno1 first (interface order)"
	expect_log B-allreduce 0 "link to rank 1 uses tcp: ${FAST_IP[1]}:" "rank 0 skips host 1's unrouted eno1"
	expect_log B-allreduce 0 "link to rank 2 uses tcp: ${FAST_IP[2]}:" "rank 0 falls back from host 2's dead eno1"
	expect_log B-allreduce 0 "198.19.20.3:" "and names the address it gave up on"
	expect_log B-allreduce 1 "link to rank 2 uses tcp: ${FAST_IP[2]}:" "rank 1 skips host 2's eno1"
fi
grep -h "publishes\|uses tcp" "$WORK"/B-allreduce.rank*.log | sed 's/^/  B: /'

# --- C: KHOR_SOCKET_IFNAME still wins, and then the job cannot run --------------------------
t0=$SECONDS
run_job C-ifname "${FAST_IP[0]}" KHOR_SOCKET_IFNAME=eno1 -- allreduce "${CHECKS[@]}"
took=$((SECONDS - t0))
for k in 0 1 2; do
	if [ "${RC[k]}" -eq 0 ]; then
		fail "C-ifname: rank $k succeeded over KHOR_SOCKET_IFNAME=eno1, which reaches no host"
	elif [ "${RC[k]}" -ge 124 ]; then
		fail "C-ifname: rank $k hung (status ${RC[k]}) instead of failing"
	fi
	expect_log C-ifname $k "publishes ${MGMT_IP[k]%/*}:" "KHOR_SOCKET_IFNAME=eno1 chose eno1"
done
[ $took -le 30 ] || fail "C-ifname: took ${took}s, more than the timeouts allow"
if grep -qF "no address of rank" "$WORK"/C-ifname.rank*.log &&
	grep -qF "KHOR_SOCKET_IFNAME chose these addresses" "$WORK"/C-ifname.rank*.log; then
	grep -hF "no address of rank" "$WORK"/C-ifname.rank*.log | head -n 1 | cut -c1-400 | sed 's/^/  C: /'
else
	fail "C-ifname: no rank named the addresses it tried"
	show_logs C-ifname
fi

if [ $FAILS -gt 0 ]; then
	say "$FAILS check(s) failed"
	exit 1
fi
say "ok: three hosts, NICs named eth0/ens5/enp129s0f1, dead management NICs ($((SECONDS - t_start))s)"
exit 0
