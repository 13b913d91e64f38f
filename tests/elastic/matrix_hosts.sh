#!/usr/bin/env bash
# matrix_hosts.sh -- the elastic fault matrix across hosts over real ssh (CTest
# elastic_matrix_hosts): 4 network-namespace hosts, each with its own sshd
# (tests/hosts/netns_hosts.sh), built once for every case of matrix_hosts.py, which runs
# tests/elastic/train_matrix.py under khorrun's elastic driver and injects the faults from
# outside: kill -9 of a worker and of rank 0, SIGSTOP (fenced) then SIGCONT, a host's link
# cut, a host's sshd killed, hosts removed and added by a discovery script, below --min-np
# and back.
#
# usage: matrix_hosts.sh KHORRUN PYTHON [CASE...]
# Exits 77 (CTest's skip) with one line why when it cannot run here: not root, no sshd, no
# network namespaces, or another test holding /tmp/khor-heavy.lock for too long.
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KHORRUN=${1:?usage: $0 KHORRUN PYTHON [CASE...]}
PYTHON=${2:?usage: $0 KHORRUN PYTHON [CASE...]}
shift 2

skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root for network namespaces"
[ -x /usr/sbin/sshd ] || skip "no /usr/sbin/sshd (install openssh-server: .ci/packages --hosts)"
command -v ssh >/dev/null && command -v ssh-keygen >/dev/null || skip "no ssh / ssh-keygen (openssh-client)"
# Namespaces are made one test at a time on this machine (a bounded wait for the others).
exec 9>/tmp/khor-heavy.lock
flock -w 120 9 || skip "/tmp/khor-heavy.lock was held for 120 s by another test"
probe="khhprobe$$"
ip netns add "$probe" 2>/dev/null || skip "cannot make network namespaces here"
ip netns del "$probe"

. "$HERE/../hosts/netns_hosts.sh"
trap hosts_down EXIT
trap 'exit 130' INT TERM
hosts_up 4 || { echo "FAIL: could not build the namespace hosts"; exit 1; }
export HOSTS_SSH_CONFIG HOSTS_CIDR HOSTS_DIR
export HOSTS_ADDRS="${HOSTS_ADDR[*]}" HOSTS_NSS="${HOSTS_NS[*]}"
export HOSTS_IFS="${HOSTS_IFNAMES[*]:0:4}" HOSTS_SSHD_PIDS="${HOSTS_SSHD_PID[*]}"
"$PYTHON" "$HERE/matrix_hosts.py" "$KHORRUN" "$PYTHON" "$@"
