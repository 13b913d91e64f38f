#!/usr/bin/env bash
# test_hosts.sh -- khorrun across hosts over real ssh: 4 network-namespace hosts, each with
# its own sshd and a differently named interface (netns_hosts.sh). Checks what a user of
# `khorrun -H` sees: collectives right across hosts, each rank's identity and working
# directory, -x forwarding, the launching shell's environment (PATH, PYTHONPATH, less
# SSH_*), both hostfile forms, the first failure named with its host,
# nothing left on any host after a kill -9, a Ctrl-C, a SIGSTOP (khorrun kills the stopped
# rank through its host's helper) or a failed start, start-up errors
# (unreachable host, refused key) within --start-timeout naming the host and ssh's error,
# the job secret on no command line of any process, and an elastic job that loses a host.
#
# usage: test_hosts.sh KHORRUN KHOR_BENCH EXAMPLE_ALLREDUCE [ELASTIC_WORKER]
# Exits 77 (CTest's skip) with one line why when it cannot run here: not root, no sshd,
# no network namespaces.
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KHORRUN=${1:?usage: $0 KHORRUN KHOR_BENCH EXAMPLE_ALLREDUCE}
BENCH=${2:?usage}
EXAMPLE=${3:?usage}
WORKER=${4:-} # tests/elastic/elastic_worker: the elastic case runs with it

skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root for network namespaces"
[ -x /usr/sbin/sshd ] || skip "no /usr/sbin/sshd (install openssh-server: .ci/packages --hosts)"
command -v ssh >/dev/null && command -v ssh-keygen >/dev/null || skip "no ssh / ssh-keygen (openssh-client)"
probe="khhprobe$$"
ip netns add "$probe" 2>/dev/null || skip "cannot make network namespaces here"
ip netns del "$probe"

. "$HERE/netns_hosts.sh"
WORK=
cleanup() {
	hosts_down
	[ -n "$WORK" ] && rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
hosts_up 4 || { echo "FAIL: could not build the namespace hosts"; exit 1; }
WORK=$(mktemp -d /tmp/khor-hosts-test.XXXXXX)
cd "$WORK" || exit 1

H0=${HOSTS_ADDR[0]} H1=${HOSTS_ADDR[1]} H2=${HOSTS_ADDR[2]} H3=${HOSTS_ADDR[3]}
SSH="ssh -F $HOSTS_SSH_CONFIG"
# Ranks pick their addresses inside the hosts' subnet, whatever the interface is called.
KR=("$KHORRUN" --ssh-command "$SSH" -x "KHOR_SOCKET_IFNAME=$HOSTS_CIDR")
npass=0 nfail=0
OUT=$WORK/out ERR=$WORK/err

pass() { echo "ok - $1"; npass=$((npass + 1)); }
fail() {
	echo "FAIL - $1"
	echo "--- stdout:"; tail -n 40 "$OUT" 2>/dev/null
	echo "--- stderr:"; tail -n 40 "$ERR" 2>/dev/null
	nfail=$((nfail + 1))
}
now() { date +%s.%N; }
elapsed() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.3f", a - b }'; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

# Every process of every host, sshd's listener aside, and anything anywhere carrying this
# job's marker in its command line or environment: none may be left once khorrun is gone.
leftovers() {
	local marker=$1 i p out=""
	for i in 0 1 2 3; do
		p=$(hosts_pids $i | tr '\n' ' ')
		[ -n "$p" ] && out+="host $i: $p ($(for q in $p; do { tr '\0' ' ' </proc/$q/cmdline; } 2>/dev/null; echo -n '; '; done)) "
	done
	printf '%s\n' "$marker" >"$WORK/marker" # (from a file: grep's argv must not match)
	for p in /proc/[0-9]*; do
		if grep -qaFf "$WORK/marker" "$p/cmdline" "$p/environ" 2>/dev/null; then
			[ "${p#/proc/}" = $$ ] || out+="pid ${p#/proc/} has $marker: $({ tr '\0' ' ' <$p/cmdline; } 2>/dev/null) "
		fi
	done
	echo "$out"
}

# Waits (bounded) until sshd's session processes are gone too, then says what is left.
no_leftovers() {
	local marker=$1 left t
	for t in $(seq 1 30); do
		left=$(leftovers "$marker")
		[ -z "$left" ] && return 0
		sleep 0.1
	done
	echo "left behind: $left"
	return 1
}

# bg COMMAND...: runs it in the background as a terminal would (job control on), so that
# SIGINT is not ignored in it as it is in a non-interactive shell's background jobs.
bg() {
	set -m
	"$@" >"$OUT" 2>"$ERR" &
	kpid=$!
	set +m
}

wait_lines() { # wait_lines FILE PATTERN N SECONDS PID
	local t
	for t in $(seq 1 $(($4 * 10))); do
		[ "$(grep -c -- "$2" "$1" 2>/dev/null)" -ge "$3" ] && return 0
		kill -0 "$5" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

# ---- 1. collectives across 4 hosts -------------------------------------------------------
t0=$(now)
if "${KR[@]}" -H "$H0:4,$H1:4,$H2:4,$H3:4" "$EXAMPLE" >"$OUT" 2>"$ERR" &&
	[ "$(grep -c 'of 16: grad\[999\] = 1006.5 (expected 1006.5)' "$OUT")" -eq 16 ]; then
	pass "example-allreduce, 16 ranks on 4 hosts ($(printf %.2f "$(elapsed "$t0")") s)"
else
	fail "example-allreduce, 16 ranks on 4 hosts"
fi
if "${KR[@]}" -np 8 -H "$H0:2,$H1:2,$H2:2,$H3:2" "$BENCH" broadcast -b 8 -e 1M -f 16 -n 3 -w 1 --check >"$OUT" 2>"$ERR" &&
	"${KR[@]}" -H "$H0:2,$H1:2,$H2:2,$H3:2" "$BENCH" allreduce -b 8 -e 1M -f 16 -n 3 -w 1 --check >>"$OUT" 2>>"$ERR"; then
	pass "khor-bench broadcast and allreduce --check, 8 ranks on 4 hosts"
else
	fail "khor-bench broadcast and allreduce --check, 8 ranks on 4 hosts"
fi

# The same job with no KHOR_SOCKET_IFNAME: each host's NIC has another name (eth0, ens5,
# enp129s0f1, eno1) and every rank publishes what it has; peers dial what they reach.
if "$KHORRUN" --ssh-command "$SSH" -H "$H0:2,$H1:2,$H2:2,$H3:2" "$BENCH" allreduce -b 8 -e 1M \
	-f 16 -n 3 -w 1 --check >"$OUT" 2>"$ERR"; then
	pass "khor-bench allreduce --check on 4 hosts whose NICs are named differently, no KHOR_SOCKET_IFNAME"
else
	fail "khor-bench allreduce --check on 4 hosts whose NICs are named differently, no KHOR_SOCKET_IFNAME"
fi

# ---- 2. identity, working directory, -x, both hostfile forms, a local host among them ----
cat >"$WORK/hostfile" <<EOF
# two forms, comments and blank lines
$H0 slots=2

$H1:1   # horovodrun's form
localhost slots=1 max_slots=4
$H2
EOF
export FWD_ME=forwarded-value
if "${KR[@]}" --hostfile "$WORK/hostfile" -x FWD_ME -x SET_ME=set-value \
	/bin/sh -c 'echo "id $KHOR_RANK/$KHOR_SIZE local $KHOR_LOCAL_RANK/$KHOR_LOCAL_SIZE cross $KHOR_CROSS_RANK/$KHOR_CROSS_SIZE host $KHOR_HOSTNAME pwd $(pwd) x $FWD_ME $SET_ME"' \
	>"$OUT" 2>"$ERR"; then
	want="[0] id 0/5 local 0/2 cross 0/4 host $H0 pwd $WORK x forwarded-value set-value
[1] id 1/5 local 1/2 cross 0/1 host $H0 pwd $WORK x forwarded-value set-value
[2] id 2/5 local 0/1 cross 1/4 host $H1 pwd $WORK x forwarded-value set-value
[3] id 3/5 local 0/1 cross 2/4 host localhost pwd $WORK x forwarded-value set-value
[4] id 4/5 local 0/1 cross 3/4 host $H2 pwd $WORK x forwarded-value set-value"
	if [ "$(sort "$OUT")" = "$want" ]; then
		pass "hostfile forms: placement, local/cross ranks, cwd, -x VAR and -x VAR=value"
	else
		echo "wanted:"; echo "$want"
		fail "hostfile forms: placement, local/cross ranks, cwd, -x VAR and -x VAR=value"
	fi
else
	fail "hostfile forms (khorrun failed)"
fi

# ---- 2b. the launching shell's environment reaches remote ranks, host-local variables not --
# A "virtualenv": a program found only on the forwarded PATH, a module only on PYTHONPATH.
mkdir -p "$WORK/venv/bin" "$WORK/pp"
printf '#!/bin/sh\necho "tool path=${PATH%%%%:*} foo=$FOO ssh=${SSH_CONNECTION%%%% *} unbuf=$PYTHONUNBUFFERED"\n' >"$WORK/venv/bin/khorfwd-tool"
chmod +x "$WORK/venv/bin/khorfwd-tool"
printf 'import os\nprint("py", os.environ["KHOR_RANK"], os.environ["FOO"])\n' >"$WORK/pp/khorfwd.py"
if PATH="$WORK/venv/bin:$PATH" PYTHONPATH="$WORK/pp" FOO=bar SSH_CONNECTION="198.51.100.9 1 2 3" \
	"${KR[@]}" -H "$H1:1,$H2:1" khorfwd-tool >"$OUT" 2>"$ERR" &&
	PATH="$WORK/venv/bin:$PATH" PYTHONPATH="$WORK/pp" FOO=bar \
	"${KR[@]}" -H "$H1:1,$H2:1" python3 -c 'import khorfwd' >>"$OUT" 2>>"$ERR"; then
	# SSH_CONNECTION there is the remote sshd's (the client's address on the hosts' net).
	n_tool=$(grep -c "^\[[01]\] tool path=$WORK/venv/bin foo=bar ssh=198\.19\.[0-9.]* unbuf=1\$" "$OUT")
	n_py=$(grep -cx "\[[01]\] py [01] bar" "$OUT")
	if [ "$n_tool" = 2 ] && [ "$n_py" = 2 ] && ! grep -q "198.51.100.9" "$OUT"; then
		pass "remote ranks get PATH, PYTHONPATH, FOO=bar from the launching shell, not its SSH_*"
	else
		fail "environment forwarding (tool lines $n_tool, python lines $n_py)"
	fi
else
	fail "environment forwarding (khorrun failed)"
fi

# ---- 3. the secret is on no command line; Ctrl-C leaves nothing anywhere ------------------
MARK=khhmark$$a
bg "${KR[@]}" --job-id "$MARK" --grace 500ms -H "$H0:2,$H1:2,$H2:2,$H3:2" \
	/bin/sh -c 'trap "" INT; echo ready; sleep 1000 & wait'
if wait_lines "$OUT" ready 8 15 $kpid; then
	# The secret, from one remote rank's environment (where it belongs).
	rpid=$(for p in $(hosts_pids 3); do grep -qa "KHOR_JOB_ID=$MARK" /proc/$p/environ 2>/dev/null && echo $p; done | head -1)
	secret=$(tr '\0' '\n' </proc/$rpid/environ 2>/dev/null | sed -n 's/^KHOR_SECRET=//p')
	if [ ${#secret} -ge 32 ]; then
		# From a file: on grep's own command line the secret would find itself.
		printf '%s\n' "$secret" >"$WORK/secret"
		shown=$(grep -laFf "$WORK/secret" /proc/[0-9]*/cmdline 2>/dev/null)
		if [ -z "$shown" ]; then
			pass "the secret is on no process's command line ($(ls -d /proc/[0-9]* | wc -l) processes)"
		else
			fail "the secret is on the command line of: $shown"
		fi
	else
		fail "could not read the secret from a remote rank (pid '$rpid')"
	fi
	t0=$(now)
	kill -INT $kpid
	wait $kpid
	st=$?
	if [ $st -eq 130 ] && grep -q "interrupted by SIGINT" "$ERR" && no_leftovers "$MARK"; then
		pass "Ctrl-C: exit 130 in $(printf %.2f "$(elapsed "$t0")") s, nothing left on any host"
	else
		fail "Ctrl-C (exit $st)"
	fi
else
	kill -9 $kpid 2>/dev/null
	fail "ranks did not start for the secret / Ctrl-C test"
fi

# ---- 4. kill -9 of a remote rank: named with its host, everything else ends --------------
MARK=khhmark$$b
bg "${KR[@]}" --job-id "$MARK" -H "$H0:2,$H1:2,$H2:2,$H3:2" \
	/bin/sh -c 'echo "pid=$$"; exec sleep 1000'
if wait_lines "$OUT" "pid=" 8 15 $kpid; then
	victim=$(sed -n 's/^\[5\] pid=//p' "$OUT")
	t0=$(now)
	kill -9 "$victim"
	wait $kpid
	st=$?
	if [ $st -eq 137 ] && grep -q "rank 5 on $H2 (pid $victim) failed first: killed by signal SIGKILL (9)" "$ERR" &&
		no_leftovers "$MARK"; then
		pass "kill -9 of rank 5 on $H2: named, exit 137 in $(printf %.2f "$(elapsed "$t0")") s, nothing left"
	else
		fail "kill -9 of a remote rank (exit $st)"
	fi
else
	kill -9 $kpid 2>/dev/null
	fail "ranks did not start for the kill -9 test"
fi

# ---- 4b. kill -9 of khorrun itself: ssh's end of the session stops every remote rank ------
MARK=khhmark$$d
bg "${KR[@]}" --job-id "$MARK" -H "$H0:2,$H1:2,$H2:2,$H3:2" /bin/sh -c 'echo ready; exec sleep 1000'
if wait_lines "$OUT" ready 8 15 $kpid; then
	t0=$(now)
	kill -9 $kpid
	wait $kpid 2>/dev/null
	if no_leftovers "$MARK"; then
		pass "kill -9 of khorrun: nothing left on any host after $(printf %.2f "$(elapsed "$t0")") s"
	else
		fail "kill -9 of khorrun"
	fi
else
	kill -9 $kpid 2>/dev/null
	fail "ranks did not start for the kill -9 of khorrun test"
fi

# ---- 4c. kill -9 of a host's helper (its connection gone): its ranks are lost and die -----
MARK=khhmark$$e
bg "${KR[@]}" --job-id "$MARK" -H "$H0:2,$H1:2" /bin/sh -c 'echo ready; exec sleep 1000'
if wait_lines "$OUT" ready 4 15 $kpid; then
	helper=$(for p in $(hosts_pids 1); do
		{ tr '\0' ' ' </proc/$p/cmdline; } 2>/dev/null | grep -q -- '--remote-helper $' && echo $p
	done | head -1)
	kill -9 "$helper"
	wait $kpid
	st=$?
	if [ $st -eq 255 ] && grep -q "rank 2 on $H1 was lost first: its ssh connection ended" "$ERR" &&
		no_leftovers "$MARK"; then
		pass "kill -9 of the helper on $H1: its ranks lost (exit 255), nothing left"
	else
		fail "kill -9 of a helper (exit $st, helper pid '$helper')"
	fi
else
	kill -9 $kpid 2>/dev/null
	fail "ranks did not start for the helper test"
fi

# ---- 4d. a remote rank stopped (SIGSTOP): khorrun kills it through its helper --------------
MARK=khhmark$$f
bg "${KR[@]}" --job-id "$MARK" -x KHOR_LOG=info -x KHOR_TIMEOUT=1s -x KHOR_HEARTBEAT_TIMEOUT=2s \
	-H "$H0:2,$H1:2,$H2:2,$H3:2" "$BENCH" allreduce -b 8 -e 8 -n 100000000 -w 1 -c 0
if wait_lines "$ERR" "joined job '$MARK' as rank" 8 20 $kpid; then
	victim=$(for p in $(hosts_pids 2); do
		tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx KHOR_RANK=5 &&
			tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx "KHOR_JOB_ID=$MARK" && echo $p
	done | head -1)
	sleep 1 # a beat or two in the store first
	t0=$(now)
	kill -STOP "$victim"
	wait $kpid
	st=$?
	dt=$(elapsed "$t0")
	if [ $st -eq 137 ] && grep -q "khorrun: rank 5 on $H2 stopped answering: no heartbeat for" "$ERR" &&
		grep -q "rank 5 on $H2 failed first: it stopped answering" "$ERR" && no_leftovers "$MARK"; then
		pass "SIGSTOP of rank 5 on $H2: killed and named, exit 137 in $(printf %.2f "$dt") s, nothing left"
	else
		fail "SIGSTOP of a remote rank (exit $st after $dt s, pid '$victim')"
	fi
else
	kill -9 $kpid 2>/dev/null
	fail "ranks did not start for the SIGSTOP test"
fi

# ---- 5. start-up errors: within --start-timeout, the host and ssh's error named ----------
NOBODY=198.19.${HOSTS_T}.99
MARK=khhmark$$c
t0=$(now)
"${KR[@]}" --job-id "$MARK" --start-timeout 5 -H "$H0:1,$NOBODY:1" /bin/sh -c 'exec sleep 1000' >"$OUT" 2>"$ERR"
st=$?
dt=$(elapsed "$t0")
if [ $st -ne 0 ] && lt "$dt" 8 && grep -q "cannot start rank 1 on $NOBODY: " "$ERR" &&
	no_leftovers "$MARK"; then
	pass "unreachable host: exit $st in $(printf %.2f "$dt") s: $(grep "cannot start" "$ERR" | head -1)"
else
	fail "unreachable host (exit $st after $dt s)"
fi
t0=$(now)
"$KHORRUN" --ssh-command "ssh -F $HOSTS_SSH_CONFIG_BADKEY" --job-id "$MARK" --start-timeout 5 \
	-H "$H0:1,$H1:1" /bin/sh -c 'exec sleep 1000' >"$OUT" 2>"$ERR"
st=$?
dt=$(elapsed "$t0")
if [ $st -ne 0 ] && lt "$dt" 8 &&
	grep -Eq "cannot start rank [01] on ($H0|$H1): .*Permission denied \(publickey" "$ERR" &&
	no_leftovers "$MARK"; then
	pass "refused key: exit $st in $(printf %.2f "$dt") s: $(grep "cannot start" "$ERR" | head -1)"
else
	fail "refused key (exit $st after $dt s)"
fi
"${KR[@]}" -H "$H0:2,$H1:x" true >"$OUT" 2>"$ERR"
st=$?
if [ $st -eq 2 ] && grep -q "host '$H1' wants a slot count from 1 to 65536, not 'x'" "$ERR"; then
	pass "bad slot count: $(head -1 "$ERR")"
else
	fail "bad slot count (exit $st)"
fi
"${KR[@]}" -np 10 -H "$H0:4,$H1:4" true >"$OUT" 2>"$ERR"
st=$?
if [ $st -eq 2 ] && grep -q -- "-np 10 but the hosts give 8 slots: $H0:4, $H1:4" "$ERR"; then
	pass "more ranks than slots: $(head -1 "$ERR")"
else
	fail "more ranks than slots (exit $st)"
fi

# ---- 6. --output-filename with remote ranks ----------------------------------------------
if "${KR[@]}" --output-filename "$WORK/logs" -H "$H0:1,$H1:1" /bin/sh -c 'echo "out $KHOR_RANK"; echo "err $KHOR_RANK" >&2' >"$OUT" 2>"$ERR" &&
	[ "$(cat "$WORK/logs/rank.1/stdout")" = "out 1" ] && [ "$(cat "$WORK/logs/rank.1/stderr")" = "err 1" ] &&
	grep -qx "\[1\] out 1" "$OUT"; then
	pass "--output-filename: DIR/rank.N/stdout and stderr, remote ranks too"
else
	fail "--output-filename"
fi

# ---- 7. elastic over ssh: a worker killed on one host, the job goes on on the others -----
if [ -n "$WORKER" ]; then
	MARK=khhmark$$e
	rm -f "$WORK/stop"
	bg "${KR[@]}" --job-id "$MARK" -H "$H0:2,$H1:2,$H2:2" --min-np 2 -np 6 \
		-x "EW_STOP=$WORK/stop" -x KHOR_COST_ALPHA_US=5 -x KHOR_COST_BETA_GBPS=2 \
		-x KHOR_COST_GAMMA_GBPS=4 "$WORKER" 1000000 5
	if wait_lines "$OUT" " gen 1 rank " 6 30 $kpid; then
		victim=$(sed -n "s/^\[$H1:1\] up $H1:1 pid \([0-9]*\).*/\1/p" "$OUT")
		kill -9 "$victim"
		ok=0
		wait_lines "$OUT" "join $H2:1 gen 2 rank 3 size 4" 1 30 $kpid &&
			wait_lines "$OUT" "removed $H1:0: " 1 30 $kpid && ok=1
		touch "$WORK/stop"
		wait $kpid
		st=$?
		if [ $ok = 1 ] && [ $st -eq 0 ] &&
			grep -q "generation 1: rank 3 on $H1 (worker $H1:1) was lost: killed by signal 9 (SIGKILL); host $H1 blacklisted" "$ERR" &&
			grep -q "generation 2: 4 ranks on 2 hosts ($H0:2, $H2:2); 1 dropped" "$ERR" &&
			no_leftovers "$MARK"; then
			pass "elastic: kill -9 on $H1 blacklists it, 4 ranks go on on 2 hosts, exit 0, nothing left"
		else
			fail "elastic over ssh (exit $st)"
		fi
	else
		kill -9 $kpid 2>/dev/null
		fail "elastic workers did not start over ssh"
	fi
fi

echo "$npass passed, $nfail failed"
[ $nfail -eq 0 ]
