#!/usr/bin/env bash
# netns_hosts.sh -- K "hosts" on this machine, each a network namespace with its own sshd,
# for testing `khorrun -H` / `--hostfile` over real ssh.
#
#   root ns (khorrun)    khh<T>-h0 (eth0)   khh<T>-h1 (ens5)   khh<T>-h2 (enp129s0f1)  ...
#   veth khh<T>r           198.19.T.1         198.19.T.2         198.19.T.3
#   198.19.T.254             |                  |                  |
#        +------------------ br0, in namespace khh<T>-sw ------------+
#
# Each host names its interface differently (eth0, ens5, enp129s0f1, eno1, ...), as real
# clusters do, and runs Debian's /usr/sbin/sshd on its own address with a host key, a client
# key and authorized_keys made here (root login by key only, no PAM). Namespaces share the
# pid space and the file system with the root namespace: the hosts run this build's khorrun
# at the same path, and a test sees every host's processes with `ip netns pids NS`.
# T (the third octet, and part of every name) comes from the pid, so two runs do not meet;
# 198.19.0.0/16 keeps clear of bench/cluster/netns_cluster.sh's 198.18.0.0/24.
#
# Sourced (tests/hosts/test_hosts.sh, bench_startup.sh):
#     . netns_hosts.sh; hosts_up 4 || exit 1; trap hosts_down EXIT
#   then HOSTS_ADDR[i], HOSTS_NS[i], HOSTS_SSH_CONFIG (good key), HOSTS_SSH_CONFIG_BADKEY (a key
#   the hosts do not accept), HOSTS_ROOT_ADDR, HOSTS_CIDR, HOSTS_DIR are set.
# Run:
#     netns_hosts.sh [-k N] -- command args...   runs the command with the hosts up (and the
#                                                  variables above exported, HOSTS_ADDRS as a
#                                                  space-separated list), then removes them
#     netns_hosts.sh --cleanup                     removes what a killed run left (khh* names)
# Needs root, iproute2, openssh-server and openssh-client (.ci/packages --hosts).

HOSTS_IFNAMES=(eth0 ens5 enp129s0f1 eno1 ib0x enp5s0 eth1 ens3)
HOSTS_K=0
HOSTS_NS=()
HOSTS_ADDR=()
HOSTS_SSHD_PID=()
HOSTS_DIR=
HOSTS_SW=
HOSTS_T=

hosts_log() { echo "netns_hosts: $*" >&2; }

# Kills every process still inside namespace $1 (by pid, from `ip netns pids`).
hosts_kill_ns() {
	local ns=$1 p
	p=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
	[ -n "$p" ] && kill -9 $p 2>/dev/null
	return 0
}

hosts_down() {
	local i ns
	for i in "${!HOSTS_SSHD_PID[@]}"; do
		kill -9 "${HOSTS_SSHD_PID[$i]}" 2>/dev/null
	done
	for ns in "${HOSTS_NS[@]}" "$HOSTS_SW"; do
		[ -n "$ns" ] || continue
		hosts_kill_ns "$ns"
	done
	for i in "${!HOSTS_SSHD_PID[@]}"; do # gone before the namespaces go (bounded)
		for _ in $(seq 1 20); do
			kill -0 "${HOSTS_SSHD_PID[$i]}" 2>/dev/null || break
			sleep 0.05
		done
	done
	# Deleting the namespaces deletes every veth with them (the root one's peer is in sw).
	for ns in "${HOSTS_NS[@]}" "$HOSTS_SW"; do
		[ -n "$ns" ] || continue
		ip netns del "$ns" 2>/dev/null || hosts_log "could not delete namespace $ns"
	done
	[ -n "$HOSTS_T" ] && ip link del "khh${HOSTS_T}r" 2>/dev/null
	[ -n "$HOSTS_DIR" ] && rm -rf "$HOSTS_DIR"
	HOSTS_NS=() HOSTS_SSHD_PID=() HOSTS_SW= HOSTS_DIR= HOSTS_T=
	return 0
}

# What a killed run left behind: every khh* namespace and root veth (and what runs in them).
hosts_cleanup_all() {
	local ns l
	for ns in $(ip netns list 2>/dev/null | awk '{ print $1 }' | grep -E '^khh[0-9]+-(h[0-9]+|sw)$'); do
		hosts_kill_ns "$ns"
		ip netns del "$ns" 2>/dev/null && hosts_log "removed namespace $ns"
	done
	for l in $(ip -o link show 2>/dev/null | awk -F': ' '{ print $2 }' | sed 's/@.*//' | grep -E '^khh[0-9]+r$'); do
		ip link del "$l" 2>/dev/null && hosts_log "removed link $l"
	done
	return 0
}

# hosts_up K: builds K hosts (1..8) and waits until each sshd accepts connections.
hosts_up() {
	local k=${1:-4} i ns addr up
	HOSTS_K=$k
	HOSTS_T=$(( $$ % 250 + 1 ))
	HOSTS_SW="khh${HOSTS_T}-sw"
	HOSTS_CIDR="198.19.${HOSTS_T}.0/24"
	HOSTS_ROOT_ADDR="198.19.${HOSTS_T}.254"
	HOSTS_DIR=$(mktemp -d /tmp/khor-hosts.XXXXXX) || return 1
	chmod 700 "$HOSTS_DIR"

	# Keys: a host key for every sshd, the client's key, and one the hosts do not accept.
	ssh-keygen -q -t ed25519 -N '' -f "$HOSTS_DIR/host_key" || return 1
	ssh-keygen -q -t ed25519 -N '' -f "$HOSTS_DIR/id_ed25519" || return 1
	ssh-keygen -q -t ed25519 -N '' -f "$HOSTS_DIR/bad_ed25519" || return 1
	cp "$HOSTS_DIR/id_ed25519.pub" "$HOSTS_DIR/authorized_keys"
	cat >"$HOSTS_DIR/sshd_config" <<EOF
Port 22
HostKey $HOSTS_DIR/host_key
AuthorizedKeysFile $HOSTS_DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
PrintLastLog no
LogLevel ERROR
MaxStartups 200
MaxSessions 200
EOF
	for i in good bad; do
		local key=$HOSTS_DIR/id_ed25519
		[ $i = bad ] && key=$HOSTS_DIR/bad_ed25519
		cat >"$HOSTS_DIR/ssh_config_$i" <<EOF
Host *
  User root
  IdentityFile $key
  IdentitiesOnly yes
  UserKnownHostsFile /dev/null
  StrictHostKeyChecking no
  BatchMode yes
  LogLevel ERROR
EOF
	done
	HOSTS_SSH_CONFIG=$HOSTS_DIR/ssh_config_good
	HOSTS_SSH_CONFIG_BADKEY=$HOSTS_DIR/ssh_config_bad
	mkdir -p /run/sshd # sshd's privilege separation directory

	ip netns add "$HOSTS_SW" || return 1
	ip -n "$HOSTS_SW" link set lo up
	ip -n "$HOSTS_SW" link add br0 type bridge stp_state 0 forward_delay 0 || return 1
	ip -n "$HOSTS_SW" link set br0 up
	# The root namespace's port, where khorrun runs.
	ip link add "khh${HOSTS_T}r" type veth peer name pr netns "$HOSTS_SW" || return 1
	ip -n "$HOSTS_SW" link set pr master br0 up || return 1
	ip addr add "$HOSTS_ROOT_ADDR/24" dev "khh${HOSTS_T}r" || return 1
	ip link set "khh${HOSTS_T}r" up || return 1
	for ((i = 0; i < k; i++)); do
		ns="khh${HOSTS_T}-h$i"
		addr="198.19.${HOSTS_T}.$((i + 1))"
		HOSTS_NS[$i]=$ns
		HOSTS_ADDR[$i]=$addr
		ip netns add "$ns" || return 1
		ip -n "$ns" link set lo up
		ip link add "${HOSTS_IFNAMES[$i]}" netns "$ns" type veth peer name "p$i" netns "$HOSTS_SW" || return 1
		ip -n "$HOSTS_SW" link set "p$i" master br0 up || return 1
		ip -n "$ns" addr add "$addr/24" dev "${HOSTS_IFNAMES[$i]}" || return 1
		ip -n "$ns" link set "${HOSTS_IFNAMES[$i]}" up || return 1
		ip netns exec "$ns" /usr/sbin/sshd -D -f "$HOSTS_DIR/sshd_config" \
			-o "ListenAddress=$addr" -o "PidFile=$HOSTS_DIR/sshd$i.pid" \
			-E "$HOSTS_DIR/sshd$i.log" &
		HOSTS_SSHD_PID[$i]=$!
		disown $! # no "Killed" notice from the shell when hosts_down kills it
	done
	# Bounded wait for every sshd to accept a connection (the links come up meanwhile).
	for ((up = 0; up < 100; up++)); do
		local ready=0
		for ((i = 0; i < k; i++)); do
			timeout 0.5 bash -c "exec 3<>/dev/tcp/${HOSTS_ADDR[$i]}/22" 2>/dev/null && ready=$((ready + 1))
		done
		[ $ready -eq "$k" ] && return 0
		for ((i = 0; i < k; i++)); do
			if ! kill -0 "${HOSTS_SSHD_PID[$i]}" 2>/dev/null; then
				hosts_log "sshd of ${HOSTS_NS[$i]} died: $(cat "$HOSTS_DIR/sshd$i.log" 2>/dev/null)"
				return 1
			fi
		done
		sleep 0.1
	done
	hosts_log "after 10 s only $ready of $k sshd accept connections"
	return 1
}

# The processes on host i other than its sshd listener (sshd's own session processes
# included: after a job, there must be none left).
hosts_pids() {
	ip netns pids "${HOSTS_NS[$1]}" 2>/dev/null | grep -vx "${HOSTS_SSHD_PID[$1]}"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	set -u
	if [ "${1:-}" = --cleanup ]; then
		hosts_cleanup_all
		exit 0
	fi
	K=4
	while [ $# -gt 0 ]; do
		case $1 in
		-k) K=$2; shift 2 ;;
		--) shift; break ;;
		*) echo "usage: $0 [-k N] -- command args... | --cleanup" >&2; exit 2 ;;
		esac
	done
	[ $# -gt 0 ] || { echo "usage: $0 [-k N] -- command args... | --cleanup" >&2; exit 2; }
	[ "$(id -u)" -eq 0 ] || { echo "$0: needs root (network namespaces)" >&2; exit 77; }
	trap hosts_down EXIT
	trap 'exit 130' INT TERM
	hosts_up "$K" || exit 1
	export HOSTS_SSH_CONFIG HOSTS_SSH_CONFIG_BADKEY HOSTS_ROOT_ADDR HOSTS_CIDR HOSTS_DIR
	export HOSTS_ADDRS="${HOSTS_ADDR[*]}"
	"$@"
	exit $?
fi
