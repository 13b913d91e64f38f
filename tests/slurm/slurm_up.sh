# slurm_up.sh -- a real one-node Slurm on 127.0.0.1 for tests, sourced by a bash script.
# shellcheck shell=bash
#
#   . tests/slurm/slurm_up.sh
#   slurm_up || exit $?      # 77: not root or not installed; 1: it did not start (why:
#                            # $SLURM_UP_WHY)
#   trap slurm_down EXIT
#   srun -n 4 prog ...
#
# Debian's slurm-wlm and munge, started as root by pid: munged with its own key and socket,
# then slurmctld and slurmd in the foreground (-D) in the background, every file of theirs
# under one mktemp directory, found by the clients through SLURM_CONF (exported). The node
# declares SLURM_UP_CPUS CPUs (default 16) whatever the machine has: SlurmdParameters=
# config_overrides makes slurmd believe slurm.conf rather than the hardware, so a 2-CPU CI
# machine can run 4 + 4 task steps. The node is named localhost so that the nodelist Slurm
# hands its tasks (SLURM_JOB_NODELIST=localhost) resolves to 127.0.0.1 on any machine.
#
# MinJobAge=5: sbatch --wait lengthens its polling interval (2 s, then 8 s) only while that
# stays under MinJobAge/2; with MinJobAge=30 a job of 0.1 s took 10 s to wait for, with 5
# it takes 4 s (2 s of that is slurmctld's own delay before it schedules a batch job).
#
# Ports: slurmctld and slurmd listen on a pair picked from the script's pid, tried until
# both are free, so that two runs (or a system Slurm on 6817/6818) never meet.
#
# slurm_down cancels what is left, stops every daemon by its pid, kills any process that
# still carries this instance's SLURM_CONF (tasks and slurmstepd outlive slurmd) and removes
# the directory. A watchdog started by slurm_up does the same if the script that sourced this
# dies without running its traps (CTest's timeout kills with SIGKILL).

SLURM_UP_CPUS=${SLURM_UP_CPUS:-16}
SLURM_UP_DIR=""
SLURM_UP_WHY=""
SLURM_UP_PIDS=()

_slurm_free_port() {
	! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# The pids (other than ours) whose environment names this instance's slurm.conf.
_slurm_stragglers() {
	local p
	for p in /proc/[0-9]*; do
		p=${p#/proc/}
		[ "$p" = "$$" ] || [ "$p" = "$BASHPID" ] && continue
		tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" |
			grep -qxF "SLURM_CONF=$SLURM_UP_DIR/slurm.conf" && echo "$p"
	done
}

# Starts munged, slurmctld and slurmd; 0 once sinfo shows the node idle, else SLURM_UP_WHY
# says why and the status is 77 (not root, a package missing: a skip) or 1 (a failure;
# the daemons' logs are printed).
slurm_up() {
	local bin
	if [ "$(id -u)" -ne 0 ]; then
		SLURM_UP_WHY="needs root (slurmd starts tasks as their user)"
		return 77
	fi
	for bin in munged mungekey slurmctld slurmd srun sbatch sinfo squeue scancel; do
		if ! command -v "$bin" >/dev/null 2>&1 && ! [ -x "/usr/sbin/$bin" ]; then
			SLURM_UP_WHY="$bin not found: install slurm-wlm and munge (.ci/packages --slurm)"
			return 77
		fi
	done
	export PATH="$PATH:/usr/sbin"
	SLURM_UP_DIR=$(mktemp -d /tmp/khor-slurm.XXXXXX) || return 1
	local d=$SLURM_UP_DIR
	mkdir -p "$d/munge" "$d/state" "$d/spool" "$d/log" "$d/run"
	chmod 711 "$d/munge" # munged wants its socket's directory searchable by all

	if ! mungekey --create --keyfile="$d/munge/munge.key" >"$d/log/mungekey.log" 2>&1; then
		SLURM_UP_WHY="mungekey failed: $(cat "$d/log/mungekey.log")"
		return 1
	fi
	chmod 600 "$d/munge/munge.key"
	munged --force --socket="$d/munge/munge.socket" --key-file="$d/munge/munge.key" \
		--pid-file="$d/munge/munged.pid" --log-file="$d/log/munged.log" \
		--seed-file="$d/munge/munged.seed" >>"$d/log/munged.log" 2>&1
	local t
	for t in $(seq 50); do
		[ -S "$d/munge/munge.socket" ] && [ -s "$d/munge/munged.pid" ] && break
		sleep 0.1
	done
	if ! [ -s "$d/munge/munged.pid" ]; then
		SLURM_UP_WHY="munged did not start: $(tail -3 "$d/log/munged.log")"
		return 1
	fi
	SLURM_UP_PIDS+=("$(cat "$d/munge/munged.pid")")

	local base=$((20000 + ($$ * 2) % 10000)) ctl_port dport
	for t in $(seq 0 50); do
		ctl_port=$((base + 2 * t))
		dport=$((ctl_port + 1))
		_slurm_free_port "$ctl_port" && _slurm_free_port "$dport" && break
	done
	cat >"$d/slurm.conf" <<EOF
ClusterName=khortest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctl_port
SlurmdPort=$dport
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge/munge.socket
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/slurmd-%n
SlurmctldPidFile=$d/run/slurmctld.pid
SlurmdPidFile=$d/run/slurmd-%n.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SlurmctldTimeout=10
SlurmdTimeout=10
InactiveLimit=0
KillWait=2
MinJobAge=5
MessageTimeout=5
TmpFS=$d
NodeName=localhost NodeAddr=127.0.0.1 NodeHostname=localhost CPUs=$SLURM_UP_CPUS RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=10 State=UP OverSubscribe=NO
EOF
	export SLURM_CONF="$d/slurm.conf"
	# Nothing of the caller's job (when run inside another allocation) may leak in.
	unset SLURM_JOB_ID SLURM_JOBID SLURM_STEP_ID SLURM_PROCID SLURM_NTASKS SLURM_JOB_NODELIST

	slurmctld -D -i -f "$SLURM_CONF" >>"$d/log/slurmctld.out" 2>&1 &
	SLURM_UP_PIDS+=("$!")
	slurmd -D -N localhost -f "$SLURM_CONF" >>"$d/log/slurmd.out" 2>&1 &
	SLURM_UP_PIDS+=("$!")
	_slurm_watchdog "$$" &
	SLURM_UP_PIDS+=("$!")

	# Up when the node reports idle: usually well under a second; 15 s is a failure.
	local state=""
	for t in $(seq 150); do
		state=$(sinfo -h -N -o %t 2>/dev/null | head -1)
		[ "$state" = "idle" ] && return 0
		sleep 0.1
	done
	SLURM_UP_WHY="the node did not come up idle in 15 s (sinfo: '${state}')"
	slurm_logs
	return 1
}

slurm_logs() {
	local f
	for f in "$SLURM_UP_DIR"/log/*; do
		[ -s "$f" ] || continue
		echo "---- $f (last 20 lines)"
		tail -20 "$f"
	done >&2
}

_slurm_kill_all() {
	local p
	for p in "${SLURM_UP_PIDS[@]}" $(_slurm_stragglers); do
		[ "$p" = "$BASHPID" ] || kill -9 "$p" 2>/dev/null
	done
}

# Runs in the background: once the script that started Slurm is gone, stops what it left.
_slurm_watchdog() {
	local owner=$1
	exec </dev/null >/dev/null 2>&1
	while kill -0 "$owner" 2>/dev/null; do
		sleep 1
	done
	_slurm_kill_all
	rm -rf "$SLURM_UP_DIR"
}

slurm_down() {
	[ -n "$SLURM_UP_DIR" ] || return 0
	if [ ${#SLURM_UP_PIDS[@]} -ge 3 ]; then
		scancel --full --quiet --signal=KILL --user=root 2>/dev/null
		local t
		for t in $(seq 20); do
			[ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
			sleep 0.1
		done
	fi
	_slurm_kill_all
	local p
	for p in "${SLURM_UP_PIDS[@]}"; do
		wait "$p" 2>/dev/null
	done
	rm -rf "$SLURM_UP_DIR"
	SLURM_UP_DIR=""
	SLURM_UP_PIDS=()
}
