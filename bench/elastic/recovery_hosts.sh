#!/usr/bin/env bash
# recovery_hosts.sh -- bench/elastic/recovery.py's "hosts" layout: builds NP network-namespace
# hosts with an sshd each (tests/hosts/netns_hosts.sh, as the fault matrix's tests do), runs
# the bench across them, and takes the hosts down again.
#
#   bench/elastic/recovery_hosts.sh [--np 4] [recovery.py's flags...]
#
# Needs root (namespaces) and sshd (.ci/packages --hosts).
set -u -o pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
np=4
if [ "${1:-}" = --np ]; then np=${2:?--np needs a number}; shift 2; fi
[ "$(id -u)" -eq 0 ] || { echo "recovery_hosts.sh: needs root for network namespaces" >&2; exit 2; }
[ -x /usr/sbin/sshd ] || { echo "recovery_hosts.sh: no /usr/sbin/sshd (.ci/packages --hosts)" >&2; exit 2; }
exec 9>/tmp/khor-heavy.lock
flock -w 300 9 || { echo "recovery_hosts.sh: /tmp/khor-heavy.lock held for 300 s" >&2; exit 2; }
. "$HERE/../../tests/hosts/netns_hosts.sh"
trap hosts_down EXIT
trap 'exit 130' INT TERM
hosts_up "$np" || { echo "recovery_hosts.sh: could not build the namespace hosts" >&2; exit 1; }
export HOSTS_SSH_CONFIG HOSTS_CIDR HOSTS_ADDRS="${HOSTS_ADDR[*]}"
/usr/bin/python3 "$HERE/recovery.py" --np "$np" --layouts hosts "$@"
