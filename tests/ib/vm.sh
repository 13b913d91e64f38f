#!/usr/bin/env bash
# Runs one command as root in a qemu VM that boots Debian's own kernel with soft-RoCE
# (rdma_rxe), so the verbs tests and benchmarks meet a real libibverbs + rxe provider on
# hosts whose kernel has no RDMA.
#
#   tests/ib/vm.sh [--timeout SECONDS] [--share DIR] -- COMMAND [ARGS...]
#
# The guest sees the host's / read-only over 9p and DIR (default: the repository) writable
# at the same path, so a build tree works unchanged; COMMAND runs in the caller's working
# directory (which must be under DIR). Its stdout and stderr stream to ours through two
# virtio serial ports, apart from the kernel's console, and its exit status is ours.
# Exit 77: the VM cannot run here (CTest skip); 124: --timeout (default 600 s, boot
# included) ran out; 1: the VM failed (the console's last 50 lines go to stderr).
#
# In the guest: rxe0 on va (198.18.1.1/24, veth peer vb), lo up, ulimit -l unlimited,
# HOME=/tmp, KHOR_IB_HCA=rxe0, KHOR_SOCKET_IFNAME=va and IB_VM_GID_INDEX (the RoCE v2 GID of
# 198.18.1.1 on rxe0); the caller's KHOR_*, CTEST_*, CI and *SAN_OPTIONS pass through, but
# the two KHOR_ values above always name the guest's devices. KHOR_IB_VM_CONSOLE=FILE keeps
# the guest's console log (kernel and set-up messages) in FILE. Every process must use rxe0:
# two rxe devices on one host never reach RTR, since the route between them is local.
#
# Why TCG and not KVM: a nested KVM guest hangs early in boot on the machines we tried and
# -cpu host fails on MSR 0x10a. TCG boots to the command in about 5 s; verbs speed under it
# is low and noisy, good for correctness, not for performance numbers.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache_dir=/tmp/khor-ib-vm-cache
packages=(qemu-system-x86 linux-image-amd64 busybox-static rdma-core ibverbs-providers
          ibverbs-utils rdmacm-utils perftest libibverbs-dev librdmacm-dev)

usage() {
  echo "usage: tests/ib/vm.sh [--timeout SECONDS] [--share DIR] -- COMMAND [ARGS...]" >&2
  exit 2
}
skip() { echo "vm.sh: skipped: $*" >&2; exit 77; }

timeout_s=600
share=$repo
while [ $# -gt 0 ]; do
  case $1 in
    --timeout) [ $# -ge 2 ] || usage; timeout_s=$2; shift 2 ;;
    --timeout=*) timeout_s=${1#*=}; shift ;;
    --share) [ $# -ge 2 ] || usage; share=$2; shift 2 ;;
    --share=*) share=${1#*=}; shift ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
[ $# -gt 0 ] || usage
if ! [[ $timeout_s =~ ^[0-9]+$ ]] || [ "$timeout_s" -eq 0 ]; then
  echo "vm.sh: bad --timeout '$timeout_s'" >&2
  exit 2
fi
share=$(cd "$share" 2>/dev/null && pwd -P) || { echo "vm.sh: no such directory: $share" >&2; exit 2; }
[ "$share" != / ] || { echo "vm.sh: --share / is not allowed (/ is already shared read-only)" >&2; exit 2; }
cwd=$(pwd -P)
case $cwd/ in
  "$share"/*) ;;
  *) echo "vm.sh: the working directory $cwd is not under the shared $share (use --share)" >&2; exit 2 ;;
esac

# Newest kernel that has both its image and rxe; the host may run another one.
pick_kernel() {
  local d v
  for v in $(for d in /lib/modules/*/; do d=${d%/}; echo "${d##*/}"; done | sort -rV); do
    if [ -r "/boot/vmlinuz-$v" ] && [ -d "/lib/modules/$v/kernel/drivers/infiniband/sw/rxe" ]; then
      echo "$v"
      return 0
    fi
  done
  return 1
}

missing_packages() {
  local p
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

missing=$(missing_packages | tr '\n' ' ')
if [ -n "$missing" ]; then
  echo "vm.sh: installing $missing" >&2
  bash "$repo/.ci/packages" --ib >&2 || true
  missing=$(missing_packages | tr '\n' ' ')
  [ -z "$missing" ] || skip "missing packages that could not be installed: $missing"
fi
[ "$(id -u)" -eq 0 ] || skip "must run as root (the guest's 9p share of / needs it)"
kver=$(pick_kernel) || skip "no kernel with /boot/vmlinuz-<ver> and rdma_rxe under /lib/modules (install linux-image-amd64)"
for t in qemu-system-x86_64 modprobe cpio gzip; do
  command -v "$t" >/dev/null || skip "$t not found"
done
case $(ldd /bin/busybox 2>&1 || true) in
  *"not a dynamic"*) ;;
  *) skip "/bin/busybox is not static (install busybox-static)" ;;
esac

tmp=$(mktemp -d /tmp/khor-ib-vm.XXXXXX)
qpid=""
cat_pids=()
# shellcheck disable=SC2317  # run by the trap
cleanup() {
  local p
  if [ -n "$qpid" ] && kill -0 "$qpid" 2>/dev/null; then
    kill "$qpid" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$qpid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$qpid" 2>/dev/null || true
  fi
  for p in "${cat_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

# The guest's /init. It runs in the initramfs (busybox), mounts the host's / read-only at
# /root and builds a chroot there; the set-up and the command then run in the chroot with the
# host's own tools. The kernel's module helper runs in the initramfs, which has no modules
# but the boot ones, so it is pointed at a script that runs the chroot's modprobe.
# shellcheck disable=SC2016  # expanded in the guest
init_script='#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
die() { echo "khor-vm: $*"; sync; poweroff -f; }
mount -t proc proc /proc && mount -t sysfs sys /sys && mount -t devtmpfs dev /dev || die "cannot mount /proc /sys /dev"
while read -r m; do insmod "/mod/$m" || die "insmod $m failed"; done < /modules
o=trans=virtio,version=9p2000.L,msize=512000
R=/root
mount -t 9p -o "$o,ro,cache=loose" hostroot $R || die "cannot mount the host root"
mount -t tmpfs -o mode=1777 tmp $R/tmp && mount -t tmpfs -o mode=755 run $R/run &&
  mount -t devtmpfs dev $R/dev && mkdir -p $R/dev/shm $R/dev/pts &&
  mount -t tmpfs -o mode=1777 shm $R/dev/shm && mount -t devpts devpts $R/dev/pts &&
  mount -t proc proc $R/proc && mount -t sysfs sys $R/sys || die "cannot mount the chroot file systems"
C=$R/run/khor-vm
mkdir -p $C && mount -t 9p -o "$o,cache=mmap" ctl $C || die "cannot mount the control share"
share=$(cat $C/share)
# A share under /tmp or /run has no mount point in the guest tmpfs yet.
mkdir -p "$R$share" 2>/dev/null
mount -t 9p -o "$o,cache=mmap" share "$R$share" || die "cannot mount the share at $share"
echo /sbin/modprobe-chroot > /proc/sys/kernel/modprobe
out="" err=""
for p in /sys/class/virtio-ports/*; do
  case $(cat $p/name) in out) out=/dev/${p##*/} ;; err) err=/dev/${p##*/} ;; esac
done
[ -n "$out" ] && [ -n "$err" ] || die "no virtio serial ports out and err"
hostname khor-ib-vm
chroot $R /bin/bash /run/khor-vm/setup.sh || die "set-up of rxe0 failed"
: > $C/ready
ulimit -l unlimited
chroot $R /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/tmp LANG=C.UTF-8 /bin/bash /run/khor-vm/run.sh < /dev/null > $out 2> $err
echo $? > $C/rc
sync
poweroff -f
'
# shellcheck disable=SC2016
modprobe_helper='#!/bin/sh
exec /bin/busybox chroot /root /sbin/modprobe "$@"
'
boot_modules=(virtio_pci 9pnet_virtio 9p virtio_console)

# Boot modules in load order, as modprobe resolves them for the guest kernel.
module_paths() {
  modprobe -S "$kver" --show-depends -a "${boot_modules[@]}" | awk '$1 == "insmod" && !seen[$2]++ { print $2 }'
}

# The initramfs is cached per kernel and per content of what goes in.
build_initramfs() {
  local root=$tmp/initramfs out=$1 path name
  mkdir -p "$root"/{bin,sbin,dev,proc,sys,root,mod}
  cp /bin/busybox "$root/bin/busybox"
  printf '%s' "$init_script" > "$root/init"
  printf '%s' "$modprobe_helper" > "$root/sbin/modprobe-chroot"
  chmod 755 "$root/init" "$root/sbin/modprobe-chroot"
  : > "$root/modules"
  while read -r path; do
    name=${path##*/}
    # busybox insmod reads plain .ko only.
    case $name in
      *.ko.xz) name=${name%.xz}; xz -dc "$path" > "$root/mod/$name" ;;
      *.ko.zst) name=${name%.zst}; zstd -qdc "$path" > "$root/mod/$name" ;;
      *.ko.gz) name=${name%.gz}; gzip -dc "$path" > "$root/mod/$name" ;;
      *) cp "$path" "$root/mod/$name" ;;
    esac
    echo "$name" >> "$root/modules"
  done < <(module_paths)
  (cd "$root" && find . | cpio -o -H newc --quiet) | gzip -1 > "$out.$$"
  local old
  for old in "$cache_dir/initramfs-$kver-"*.cpio.gz; do
    [ "$old" = "$out" ] || rm -f "$old"
  done
  mv -f "$out.$$" "$out"
}

paths=$(module_paths) || skip "modprobe cannot resolve the boot modules of $kver"
key=$(printf '%s\n' "$init_script" "$modprobe_helper" "$paths" | cat - /bin/busybox | sha256sum | cut -c1-12)
initrd=$cache_dir/initramfs-$kver-$key.cpio.gz
if [ ! -s "$initrd" ]; then
  mkdir -p "$cache_dir"
  build_initramfs "$initrd"
fi

# What the chroot runs: set-up (output to the console), then the command.
ctl=$tmp/ctl
mkdir "$ctl"
printf '%s\n' "$share" > "$ctl/share"
cat > "$ctl/setup.sh" <<'EOF'
set -eu
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
modprobe -a veth crc32_generic rdma_rxe ib_uverbs rdma_ucm
ip link set lo up
ip link add va type veth peer name vb
ip addr add 198.18.1.1/24 dev va
# Jumbo frames, as RoCE fabrics run them: rxe's active MTU follows the netdev's (9000 gives
# 4096; 1500 gave 1024, and a quarter of the packets costs rxe's software path a quarter).
ip link set va mtu 9000
ip link set vb mtu 9000
ip link set va up
ip link set vb up
rdma link add rxe0 type rxe netdev va
# The GID table fills from a work queue: wait for the RoCE v2 GID of 198.18.1.1.
port=/sys/class/infiniband/rxe0/ports/1
for _ in $(seq 200); do
  for g in "$port"/gids/*; do
    i=${g##*/}
    if [ "$(cat "$g")" = 0000:0000:0000:0000:0000:ffff:c612:0101 ] &&
       [ "$(cat "$port/gid_attrs/types/$i" 2>/dev/null)" = "RoCE v2" ] &&
       grep -q ACTIVE "$port/state"; then
      echo "export IB_VM_GID_INDEX=$i" > /run/khor-vm/gid
      exit 0
    fi
  done
  sleep 0.05
done
echo "khor-vm: rxe0 has no active RoCE v2 GID for 198.18.1.1"
exit 1
EOF
{
  echo "ulimit -l unlimited"
  while IFS= read -r name; do
    printf 'export %s=%q\n' "$name" "${!name}"
  done < <(compgen -e | grep -E '^(KHOR_|CTEST_|CI$|CI_|[A-Z]+SAN_OPTIONS$)' || true)
  echo "export KHOR_IB_HCA=rxe0 KHOR_SOCKET_IFNAME=va"
  echo ". /run/khor-vm/gid"
  printf 'cd -- %q || exit 126\n' "$cwd"
  printf 'exec'
  printf ' %q' "$@"
  printf '\n'
} > "$ctl/run.sh"

# The command's output comes through FIFOs that cat copies to our stdout and stderr, which
# works whatever they are (tty, pipe, file, socket).
mkfifo "$tmp/out" "$tmp/err"
cat "$tmp/out" &
cat_pids+=($!)
cat "$tmp/err" >&2 &
cat_pids+=($!)

# Milliseconds since the epoch; EPOCHREALTIME's decimal point follows the locale.
now_ms() { local t=${EPOCHREALTIME//[.,]/}; echo $((t / 1000)); }
start=$(now_ms)
deadline=$((start + timeout_s * 1000))
qemu-system-x86_64 -accel tcg -cpu max -m 2048 -smp 2 -nodefaults -no-user-config \
  -display none -no-reboot \
  -kernel "/boot/vmlinuz-$kver" -initrd "$initrd" \
  -append "console=ttyS0 panic=-1 8250.nr_uarts=1" \
  -serial "file:$tmp/console.log" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs "local,path=$share,mount_tag=share,security_model=none,multidevs=remap" \
  -virtfs "local,path=$ctl,mount_tag=ctl,security_model=none" \
  -device virtio-serial-pci \
  -chardev "file,id=out,path=$tmp/out" -device virtserialport,chardev=out,name=out \
  -chardev "file,id=err,path=$tmp/err" -device virtserialport,chardev=err,name=err \
  < /dev/null > "$tmp/qemu.log" 2>&1 &
qpid=$!

timed_out=0
while kill -0 "$qpid" 2>/dev/null; do
  if [ "$(now_ms)" -ge "$deadline" ]; then
    timed_out=1
    kill "$qpid" 2>/dev/null || true
    break
  fi
  sleep 0.2
done
wait "$qpid" 2>/dev/null || true
if [ "$timed_out" -eq 1 ]; then
  for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$qpid" 2>/dev/null || break; sleep 0.2; done
  kill -9 "$qpid" 2>/dev/null || true
fi
qpid=""

# Let the cats drain and stop: opening a FIFO read-write never blocks, and gives a cat
# still waiting for a writer (qemu failed before opening it) its end of file.
for f in "$tmp/out" "$tmp/err"; do
  exec 3<> "$f"
  exec 3>&-
done
wait "${cat_pids[@]}" 2>/dev/null || true
cat_pids=()

[ -z "${KHOR_IB_VM_CONSOLE:-}" ] || cp "$tmp/console.log" "$KHOR_IB_VM_CONSOLE" 2>/dev/null || true
console_tail() {
  echo "--- last 50 lines of the VM console (kernel $kver) ---" >&2
  tail -n 50 "$tmp/console.log" 2>/dev/null | tr -d '\r' >&2 || true
  [ ! -s "$tmp/qemu.log" ] || { echo "--- qemu ---" >&2; tail -n 20 "$tmp/qemu.log" >&2; }
}

if [ "$timed_out" -eq 1 ]; then
  if [ -e "$ctl/ready" ]; then
    echo "vm.sh: timed out after ${timeout_s} s; killed the VM and the command: $*" >&2
  else
    echo "vm.sh: timed out after ${timeout_s} s while the VM was booting" >&2
    console_tail
  fi
  exit 124
fi
if [ -s "$ctl/rc" ]; then
  exit "$(cat "$ctl/rc")"
fi
if [ -e "$ctl/ready" ]; then
  echo "vm.sh: the VM stopped before the command finished ($((($(now_ms) - start) / 1000)) s)" >&2
else
  reason=$(grep -a "khor-vm:" "$tmp/console.log" 2>/dev/null | tail -n 1 || true)
  echo "vm.sh: the VM failed to boot${reason:+: ${reason#*khor-vm: }}" >&2
fi
console_tail
exit 1
