#!/usr/bin/env bash
# The VM benchmark (issue 36): boots ONE QEMU guest (TCG unless TETHER_VM_ACCEL=kvm) with a
# Debian userland and measures, inside it and in the same run, every way it can see a host
# folder beside its own disk:
#
#   disk             the guest's own ext4 disk (virtio-blk, cache=none): the baseline
#   9p-loose         virtio-9p, cache=loose        9p-mmap  virtio-9p, cache=mmap
#   virtiofs-auto    virtiofsd -o cache=auto       virtiofs-always  virtiofsd -o cache=always
#   tether-vsock     tether mount vsock:2:7070 (vhost-device-vsock; host: serve --listen vsock-unix:)
#   tether-tcp       tether mount tcp:10.0.2.2:PORT (QEMU user networking to host loopback; --forward)
#
# Parts (--parts, default all): rtt (`tether check --ping` over vsock and TCP: the bare
# round trip; 4 KiB written-through writes with dd on each file system), coherence (a host
# edit after a warm read in the guest: time until the guest sees it, several trials,
# median/p99, "never" after the timeout), bench (`tether bench`'s workloads on all of them,
# interleaved). Prints a markdown report: ratios to the guest's disk, machine, kernel,
# accelerator, date and command.
#
#   bench/vm.sh                   quick sizes (1,000-file tree, 16 MiB dd), 3 runs, 11 workloads
#                                 (about 30 min under TCG on 2 shared cores)
#   bench/vm.sh --quick           quick sizes, 1 run, 9 workloads, fewer trials (about 10 min)
#   bench/vm.sh --full            tether bench's full sizes (many hours under TCG)
#   options: --runs N  --only W1,W2  --all-workloads  --trials N  --timeout SECS
#            --pings N  --dd-count N  --fs "disk tether-vsock ..."  --parts "rtt coherence bench"
#            --mem 2G  --cpus 1  --out FILE.md  --forward MODE  --keep
#
# --forward: how the guest's TCP connection reaches the host's `tether serve` (the 44 ms
# stall of a written-through 4 KiB write lives here; bench/journal/2026-11-28-vm-bench.md):
#   direct        (default) QEMU user networking as users have it: the guest connects to
#                 10.0.2.2:PORT, libslirp connects to host 127.0.0.1:PORT itself
#   socat         restrict=on, guestfwd=tcp:10.0.2.100:PORT-cmd:socat STDIO TCP:127.0.0.1:PORT,nodelay
#                 (a process per connection, as scripts/vm/run.sh -p does it)
#   socat-plain   the same without nodelay
#
# Run as root on Debian 12. It installs what it needs, saying so: Debian packages
# (qemu-system-x86, mmdebstrap, the guest kernel linux-image-amd64, busybox-static, cpio,
# kmod, e2fsprogs, socat, gcc, python3), vhost-device-vsock (cargo install), and builds the
# static tether for the guest and the release tether for the host. Cached in
# $TETHER_VM_CACHE (default /var/tmp/tether-vm): the Debian root file system
# (bench/rootfs.img, mmdebstrap: git, make, gcc), the initramfs, the static build. Every
# process it starts is stopped and its work directory removed on exit (--keep keeps the
# directory: console log, shares).
#
# TETHER_VM_TETHER=PATH: the guest's (static) tether; TETHER_HOST_TETHER=PATH: the host's.
# For latency work: TETHER_VM_GUEST_LOG=FILTER runs the guest's tether mounts with
# RUST_LOG=FILTER and prints their logs ("GLOG " lines) and every guest thread's CPU time
# before and after the coherence part ("CPUSNAP " lines) to the console log (--keep keeps
# it); TETHER_VM_MOUNT_ARGS adds options to the guest's tether mounts (--no-watch-events).
# The host's servers take RUST_LOG from the environment; ctl.py logs each edit's host
# time to ctl.log, coherence.c each trial's guest time ("COHT " lines).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${TETHER_VM_CACHE:-/var/tmp/tether-vm}
bcache=$cache/bench
command_line="bench/vm.sh $*"

quick= full= runs=3 only=default trials=10 timeout=5 pings=1000 dd_count=200
fslist="disk 9p-loose 9p-mmap virtiofs-auto virtiofs-always tether-vsock tether-tcp"
parts="rtt coherence bench" mem=2G cpus=1 out= forward=direct keep=
usage() { sed -n '2,/^set -e/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
    case $1 in
        --quick) quick=1 runs=1 trials=5 timeout=3 pings=300 dd_count=50 ;;
        --full) full=1 ;;
        --runs) runs=$2; shift ;;
        --only) only=$2; shift ;;
        --all-workloads) only= ;;
        --trials) trials=$2; shift ;;
        --timeout) timeout=$2; shift ;;
        --pings) pings=$2; shift ;;
        --dd-count) dd_count=$2; shift ;;
        --fs) fslist=$2; shift ;;
        --parts) parts=$2; shift ;;
        --mem) mem=$2; shift ;;
        --cpus) cpus=$2; shift ;;
        --out) out=$2; shift ;;
        --forward) forward=$2; shift ;;
        --keep) keep=1 ;;
        -h | --help) usage 0 ;;
        *) echo "vm.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
# The default workload set: tether bench's, less what takes longest under TCG for least
# news (copy_out is read_warm plus a native write; the 1 and 16 KiB dd rows bracket the
# 4 KiB ones; compile_clean and compile_noop's setup are gcc's own CPU time, tens of
# seconds per file system and run under TCG). --all-workloads runs them all.
if [ "$only" = default ]; then
    only=tree_create,stat_cold,stat_warm,read_cold,read_warm,grep_warm,git_status,noop_make,small_write,dd_write_4k,dd_read_4k
    [ -n "$quick" ] && only=tree_create,stat_cold,stat_warm,read_warm,grep_warm,git_status,small_write,dd_write_4k,dd_read_4k
fi

say() { printf 'vm.sh: %s\n' "$*" >&2; }
# shellcheck source=scripts/vm/initramfs-lib.sh
. "$(dirname "$0")/../scripts/vm/initramfs-lib.sh"
die() { say "error: $*"; exit 1; }
[ "$(id -u)" -eq 0 ] || die "run as root (packages, the guest's devices, dropping caches)"
[ "$(uname -m)" = x86_64 ] || die "the guest is an x86_64 one"
mkdir -p "$bcache"

# --- what it needs -------------------------------------------------------------------
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /usr/lib/qemu/virtiofsd ] || need+=(qemu-system-x86) # Debian 12 ships it with QEMU
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
ls /boot/vmlinuz-*-amd64 >/dev/null 2>&1 || need+=(linux-image-amd64)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v depmod >/dev/null || need+=(kmod)
command -v mke2fs >/dev/null || need+=(e2fsprogs)
command -v socat >/dev/null || need+=(socat)
command -v gcc >/dev/null && [ -f /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(gcc libc6-dev)
command -v python3 >/dev/null || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
    say "installing with apt-get: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${need[@]}" >&2 ||
        { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "${need[@]}" >&2; }
fi
vdv=${VHOST_DEVICE_VSOCK:-$cache/cargo/bin/vhost-device-vsock}
if [ ! -x "$vdv" ]; then
    say "installing vhost-device-vsock: cargo install --root $cache/cargo (a few minutes, once)"
    cargo install --locked vhost-device-vsock --root "$cache/cargo" >&2 || die "cargo install vhost-device-vsock failed"
fi

# --- the two tethers -----------------------------------------------------------------
guest_tether=${TETHER_VM_TETHER:-}
if [ -z "$guest_tether" ]; then
    say "building the guest's static tether: scripts/build-static.sh x86_64 (CARGO_TARGET_DIR=$bcache/target)"
    CARGO_TARGET_DIR=$bcache/target "$root/scripts/build-static.sh" x86_64 >&2 || die "static build failed"
    guest_tether=$bcache/target/x86_64-unknown-linux-musl/release/tether
fi
host_tether=${TETHER_HOST_TETHER:-}
if [ -z "$host_tether" ]; then
    say "building the host's tether: cargo build --release -p tether"
    (cd "$root" && cargo build --release --locked -p tether >&2) || die "release build failed"
    host_tether=${CARGO_TARGET_DIR:-$root/target}/release/tether
fi
[ -x "$guest_tether" ] && [ -x "$host_tether" ] || die "no tether at $guest_tether or $host_tether"

# --- the Debian root file system (cached): git, make, gcc for the workloads ---------
rootfs=$bcache/rootfs.img
packages=git,make,gcc,libc6-dev
if [ ! -f "$rootfs" ] || [ "$(cat "$bcache/rootfs.packages" 2>/dev/null)" != "$packages" ]; then
    say "building the guest's Debian root file system: mmdebstrap --variant=minbase --include=$packages bookworm (about 150 MB of packages, once)"
    rm -rf "$bcache/rootfs.tree"
    mmdebstrap --variant=minbase --include="$packages" bookworm "$bcache/rootfs.tree" \
        http://deb.debian.org/debian >&2 || die "mmdebstrap failed"
    mkdir -p "$bcache/rootfs.tree/tether-vm" "$bcache/rootfs.tree/mnt"
    rm -f "$rootfs.tmp"
    truncate -s 3G "$rootfs.tmp"
    mke2fs -q -t ext4 -L tether-vm-root -d "$bcache/rootfs.tree" "$rootfs.tmp" || die "mke2fs failed"
    mv "$rootfs.tmp" "$rootfs"
    rm -rf "$bcache/rootfs.tree"
    echo "$packages" >"$bcache/rootfs.packages"
fi

# --- the kernel and an initramfs that loads the modules and runs the Debian userland ---
kver=${TETHER_VM_KVER:-$(cd /boot && ls vmlinuz-*-amd64 | sed 's/^vmlinuz-//' | sort -V | tail -1)}
modules="virtio_pci virtio_blk virtio_net virtio_console virtio_rng ext4 crc32c_generic 9pnet_virtio 9p virtiofs fuse vsock vmw_vsock_virtio_transport"
initramfs=$bcache/initramfs.cpio
stamp="$kver $(sha256sum <"$0" | cut -c1-16) $modules"
if [ ! -f "$initramfs" ] || [ "$(cat "$bcache/initramfs.stamp" 2>/dev/null)" != "$stamp" ]; then
    say "building the initramfs: busybox and modules ($kver)"
    tree=$(mktemp -d "$bcache/initramfs.XXXXXX")
    mkdir -p "$tree"/{bin,sbin,dev,proc,sys,tmp,newroot,tether-vm} "$tree/lib/modules/$kver"
    busybox_into "$tree"
    # shellcheck disable=SC2086 # $modules is a list
    modules_into "$tree" "$kver" $modules 2>/dev/null
    cat >"$tree/init" <<'EOF'
#!/bin/sh
# bench/vm.sh's guest init: modules, the Debian root file system (/dev/vda), then
# /tether-vm/guest.sh chrooted into it; powers off after.
export PATH=/sbin:/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
stty -onlcr -echo 2>/dev/null </dev/console
for m in virtio_pci virtio_blk virtio_net virtio_console virtio_rng crc32c_generic ext4 \
         9pnet_virtio 9p virtiofs fuse vsock vmw_vsock_virtio_transport; do
    modprobe "$m" 2>/dev/null || echo "init: modprobe $m failed"
done
for _ in $(seq 50); do [ -b /dev/vda ] && [ -b /dev/vdb ] && break; sleep 0.1; done
mount -t ext4 /dev/vda /newroot || echo "init: cannot mount the root file system"
mount -t proc proc /newroot/proc; mount -t sysfs sys /newroot/sys
mount -o bind /dev /newroot/dev; mkdir -p /newroot/dev/pts; mount -t devpts pts /newroot/dev/pts
mount -t tmpfs -o size=25% tmp /newroot/tmp; mount -t tmpfs run /newroot/run
cp -a /tether-vm/. /newroot/tether-vm/
cp /tether-vm/tether /newroot/usr/local/bin/tether
ln -sf /usr/local/bin/tether /newroot/sbin/mount.tether
hostname guest
ip link set lo up
ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 && ip route add default via 10.0.2.2
echo TETHER_VM_START
chroot /newroot /bin/sh /tether-vm/guest.sh
echo "TETHER_VM_EXIT=$?"
sync
poweroff -f
EOF
    chmod 755 "$tree/init"
    (cd "$tree" && find . | sort | cpio -o -H newc --quiet -R 0:0) >"$initramfs.tmp"
    mv "$initramfs.tmp" "$initramfs"
    rm -rf "$tree"
    echo "$stamp" >"$bcache/initramfs.stamp"
fi

# --- this run ------------------------------------------------------------------------
work=$(mktemp -d /var/tmp/tether-vmbench.XXXXXX)
pids=() qemu_pid=
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    [ -n "$qemu_pid" ] && kill "$qemu_pid" 2>/dev/null
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}" $qemu_pid; do wait "$p" 2>/dev/null; done
    if [ -n "$keep" ]; then say "kept $work"; else rm -rf "$work"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

shares=$work/share
for fs in 9p-loose 9p-mmap virtiofs-auto virtiofs-always tether-vsock tether-tcp; do
    mkdir -p "$shares/$fs/coherence"
    python3 -c 'import sys; s=b"v0"; sys.stdout.buffer.write(s + b"." * (63 - len(s)) + b"\n")' >"$shares/$fs/coherence/file"
done
mkdir -p "$work/disk.tree/coherence"
truncate -s 4G "$work/disk.img"
mke2fs -q -t ext4 -L tether-vm-disk "$work/disk.img"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/secret"
echo >>"$work/secret"
chmod 600 "$work/secret"
tcp_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# Host servers: virtiofsd twice, tether twice, vhost-device-vsock.
for mode in auto always; do
    /usr/lib/qemu/virtiofsd --socket-path="$work/vfs-$mode.sock" -o source="$shares/virtiofs-$mode" \
        -o cache=$mode -o sandbox=chroot >"$work/virtiofsd-$mode.log" 2>&1 &
    pids+=($!)
done
"$host_tether" serve "$shares/tether-vsock" --listen "vsock-unix:$work/vsock_7070" \
    --secret-file "$work/secret" >"$work/serve-vsock.log" 2>&1 &
pids+=($!)
"$host_tether" serve "$shares/tether-tcp" --listen "tcp:127.0.0.1:$tcp_port" \
    --secret-file "$work/secret" >"$work/serve-tcp.log" 2>&1 &
pids+=($!)
"$vdv" --guest-cid 3 --socket "$work/vhost-vsock.sock" --uds-path "$work/vsock" >"$work/vhost-vsock.log" 2>&1 &
pids+=($!)
for s in vfs-auto.sock vfs-always.sock vhost-vsock.sock vsock_7070; do
    for _ in $(seq 100); do [ -S "$work/$s" ] && break; sleep 0.1; done
    [ -S "$work/$s" ] || { cat "$work"/*.log >&2; die "$s did not appear"; }
done

# The guest's TCP connection to tether serve (--forward).
case $forward in
    direct) netdev="user,id=n0" tcp_addr=tcp:10.0.2.2:$tcp_port ;;
    socat) netdev="user,id=n0,restrict=on,guestfwd=tcp:10.0.2.100:$tcp_port-cmd:socat STDIO TCP:127.0.0.1:$tcp_port,,nodelay"
        tcp_addr=tcp:10.0.2.100:$tcp_port ;;
    socat-plain) netdev="user,id=n0,restrict=on,guestfwd=tcp:10.0.2.100:$tcp_port-cmd:socat STDIO TCP:127.0.0.1:$tcp_port"
        tcp_addr=tcp:10.0.2.100:$tcp_port ;;
    *) die "--forward: direct, socat or socat-plain, not $forward" ;;
esac

# What the guest runs.
files=$work/files/tether-vm
mkdir -p "$files"
cp "$guest_tether" "$files/tether"
cp "$root/bench/vm/guest.sh" "$files/guest.sh"
cp "$work/secret" "$files/secret"
gcc -static -O2 -o "$files/vmbench-coherence" "$root/bench/vm/coherence.c" || die "cannot build coherence.c"
bench_args="--runs $runs"
[ -z "$full" ] && bench_args+=" --quick"
[ -n "$only" ] && bench_args+=" --only $only"
cat >"$files/env" <<EOF
FSLIST="$fslist"
PARTS="$parts"
TCP_ADDR=$tcp_addr
PINGS=$pings
DD_COUNT=$dd_count
TRIALS=$trials
TIMEOUT_MS=$((timeout * 1000))
BENCH_ARGS="$bench_args"
GUEST_RUST_LOG="${TETHER_VM_GUEST_LOG:-}"
MOUNT_ARGS="${TETHER_VM_MOUNT_ARGS:-}"
EOF
(cd "$work/files" && find tether-vm | cpio -o -H newc --quiet -R 0:0) | cat "$initramfs" - >"$work/initrd"

case ${TETHER_VM_ACCEL:-tcg} in
    kvm) accel=(-accel kvm -cpu host) accel_name=KVM ;;
    *) accel=(-accel tcg -cpu max) accel_name="TCG (-cpu max)" ;;
esac
q=(qemu-system-x86_64 "${accel[@]}" -smp "$cpus" -m "$mem" -nodefaults -no-user-config -display none -no-reboot
    -object "memory-backend-memfd,id=mem,size=$mem,share=on" -numa node,memdev=mem
    -kernel "/boot/vmlinuz-$kver" -initrd "$work/initrd"
    -append "console=ttyS0 panic=-1 quiet loglevel=1"
    -serial stdio -device virtio-rng-pci
    -drive "file=$rootfs,format=raw,if=none,id=root,snapshot=on" -device virtio-blk-pci,drive=root
    -drive "file=$work/disk.img,format=raw,if=none,id=disk,cache=none,aio=threads" -device virtio-blk-pci,drive=disk
    -fsdev "local,id=p9l,path=$shares/9p-loose,security_model=none" -device virtio-9p-pci,fsdev=p9l,mount_tag=p9loose
    -fsdev "local,id=p9m,path=$shares/9p-mmap,security_model=none" -device virtio-9p-pci,fsdev=p9m,mount_tag=p9mmap
    -chardev "socket,id=vfa,path=$work/vfs-auto.sock" -device vhost-user-fs-pci,chardev=vfa,tag=vfsauto
    -chardev "socket,id=vfw,path=$work/vfs-always.sock" -device vhost-user-fs-pci,chardev=vfw,tag=vfsalways
    -chardev "socket,id=vsk,path=$work/vhost-vsock.sock" -device vhost-user-vsock-pci,chardev=vsk
    -netdev "$netdev"
    -device virtio-net-pci,netdev=n0
    -device virtio-serial-pci -chardev "socket,id=ctl,path=$work/ctl.sock,server=on,wait=off"
    -device virtserialport,chardev=ctl,name=tether.ctl)

start=$(date -u '+%Y-%m-%d %H:%M UTC')
say "booting the guest ($accel_name, $cpus vCPU, $mem; console: $work/console.log); parts: $parts"
"${q[@]}" </dev/null >"$work/console.log" 2>&1 &
qemu_pid=$!
python3 "$root/bench/vm/ctl.py" "$work/ctl.sock" "$shares" >"$work/ctl.log" 2>&1 &
pids+=($!)
# Progress: the guest's "== " lines.
tail -n +1 -f "$work/console.log" --pid="$qemu_pid" 2>/dev/null | sed -un 's/\r$//; s/^== /vm.sh: guest: /p' >&2 &
tail_pid=$!
wait "$qemu_pid" || true
qemu_pid=
wait "$tail_pid" 2>/dev/null || true
tr -d '\r' <"$work/console.log" >"$work/console.txt"
grep -q '^TETHER_VM_EXIT=0' "$work/console.txt" || {
    say "the guest did not finish cleanly; its console:"
    tail -50 "$work/console.txt" >&2
    keep=1
}
qemu_version=$(qemu-system-x86_64 --version | head -1)
cpu_model=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)
report=$(python3 "$root/bench/vm/report.py" "$work/console.txt" \
    --command "$command_line" --date "$start" --accel "$accel_name" --qemu "$qemu_version" \
    --host "$(nproc) CPUs ($cpu_model), $(($(sed -n 's/^MemTotal: *\([0-9]*\).*/\1/p' /proc/meminfo) / 1024 / 1024)) GiB, kernel $(uname -r), $(. /etc/os-release && echo "$PRETTY_NAME")" \
    --guest-kernel "$kver" --forward "$forward")
printf '%s\n' "$report"
[ -n "$out" ] && printf '%s\n' "$report" >"$out"
exit 0
