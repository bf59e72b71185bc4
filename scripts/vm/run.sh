#!/usr/bin/env bash
# Boots the test guest (scripts/vm/build-guest.sh) under QEMU, runs a shell script in it and
# prints the script's output; exits with the script's exit status (124: the guest gave none:
# timeout or crash). Without a script: an interactive shell on the console (Ctrl-A X quits).
#
#   scripts/vm/run.sh [options] [-e 'COMMAND' | SCRIPT]
#
#   -V UDS        guest vsock through vhost-device-vsock, guest CID 3: a guest connection to
#                 CID 2 port P reaches the host Unix socket UDS_P (serve --listen vsock-unix:UDS_P)
#   -p PORT       QEMU user networking (slirp, restrict=on: the guest reaches nothing but the
#                 forwarded ports), guest 10.0.2.15; a guest connection to 10.0.2.100:PORT
#                 reaches host 127.0.0.1:PORT, one host connection per guest one (repeatable)
#   -n            the network without forwarded ports
#   -d IMAGE      attach IMAGE (a raw disk image) as the guest's virtio disk /dev/vda
#   -f SRC[:DEST] copy host file SRC into the guest at DEST (default /tether-vm/NAME)
#                 (repeatable; -f fstab:/etc/fstab makes init run mount -a)
#   -t SECONDS    give up after this long (default 300)
#   -m MEM        guest memory (default 512M)
#   -v            show the whole console (kernel messages, init) as well
#
# The script runs as root in /root with PATH holding busybox and tether (also as
# /sbin/mount.tether). Console lines between the markers TETHER_VM_START and
# TETHER_VM_EXIT=<status> are printed. TETHER_VM_CACHE as for build-guest.sh; temporary
# files go in $TMPDIR (default /tmp) and are removed on exit. TETHER_VM_ACCEL=kvm tries KVM
# (default tcg: a stock kernel does not boot under some nested KVMs).
set -uo pipefail

cache=${TETHER_VM_CACHE:-/var/tmp/tether-vm}
guest=$cache/guest
vsock_uds= net= ports=() files=() disk= timeout=300 mem=512M verbose= cmd= script=
usage() {
    sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
while getopts "V:p:nd:f:t:m:ve:h" o; do
    case $o in
        V) vsock_uds=$OPTARG ;;
        p) ports+=("$OPTARG") net=1 ;;
        n) net=1 ;;
        d) disk=$OPTARG ;;
        f) files+=("$OPTARG") ;;
        t) timeout=$OPTARG ;;
        m) mem=$OPTARG ;;
        v) verbose=1 ;;
        e) cmd=$OPTARG ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
script=${1:-}
[ -f "$guest/vmlinuz" ] && [ -f "$guest/initramfs.cpio" ] ||
    { echo "run.sh: no guest in $guest: run scripts/vm/build-guest.sh first" >&2; exit 2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tether-vm-run.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# This run's files, as a second cpio archive after the guest's: the kernel unpacks both.
mkdir -p "$tmp/add/tether-vm"
{
    [ -n "$net" ] && echo "TETHER_VM_NET=1"
    :
} >"$tmp/add/tether-vm/env"
if [ -n "$cmd" ]; then
    printf '%s\n' "$cmd" >"$tmp/add/tether-vm/cmd"
elif [ -n "$script" ]; then
    cp "$script" "$tmp/add/tether-vm/cmd" || exit 2
fi
for f in "${files[@]}"; do
    src=${f%%:*}
    dest=/tether-vm/$(basename "$src")
    [ "$src" != "$f" ] && dest=${f#*:}
    mkdir -p "$tmp/add/$(dirname "$dest")"
    cp "$src" "$tmp/add/$dest" || exit 2
done
(cd "$tmp/add" && find . | cpio -o -H newc --quiet -R 0:0) | cat "$guest/initramfs.cpio" - >"$tmp/initrd"

case ${TETHER_VM_ACCEL:-tcg} in
    kvm) accel=(-accel kvm -cpu host) ;;
    *) accel=(-accel tcg -cpu max) ;;
esac
q=(qemu-system-x86_64 "${accel[@]}" -smp 1 -nodefaults -no-user-config -display none -no-reboot
    -kernel "$guest/vmlinuz" -initrd "$tmp/initrd")
append="console=ttyS0 panic=-1 $([ -n "$verbose" ] && echo loglevel=7 || echo 'quiet loglevel=1')"

if [ -n "$vsock_uds" ]; then
    vdv=${VHOST_DEVICE_VSOCK:-$cache/cargo/bin/vhost-device-vsock}
    "$vdv" --guest-cid 3 --socket "$tmp/vhost-vsock.sock" --uds-path "$vsock_uds" >"$tmp/vhost-vsock.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do
        [ -S "$tmp/vhost-vsock.sock" ] && break
        sleep 0.1
    done
    [ -S "$tmp/vhost-vsock.sock" ] ||
        { echo "run.sh: vhost-device-vsock did not start:" >&2; cat "$tmp/vhost-vsock.log" >&2; exit 2; }
    # vhost-user needs the guest's memory shared with the device process.
    q+=(-m "$mem" -object "memory-backend-memfd,id=mem,size=$mem,share=on" -numa node,memdev=mem
        -chardev "socket,id=vsock0,path=$tmp/vhost-vsock.sock" -device vhost-user-vsock-pci,chardev=vsock0)
else
    q+=(-m "$mem")
fi
if [ -n "$disk" ]; then
    [ -f "$disk" ] || { echo "run.sh: no disk image $disk" >&2; exit 2; }
    q+=(-drive "file=$disk,format=raw,if=virtio,cache=unsafe")
fi
if [ -n "$net" ]; then
    # cmd: forwards make one host connection per guest connection, when the guest connects
    # (a tcp: forward connects once, when QEMU starts).
    fwd=
    for p in "${ports[@]}"; do fwd+=",guestfwd=tcp:10.0.2.100:$p-cmd:socat STDIO TCP:127.0.0.1:$p"; done
    q+=(-netdev "user,id=n0,restrict=on$fwd" -device virtio-net-pci,netdev=n0)
fi

if [ -z "$cmd" ] && [ -z "$script" ]; then
    "${q[@]}" -serial mon:stdio -append "$append"
    exit $?
fi
# timeout --foreground: stays in this process group, so that killing the group (as the
# tests do) reaches QEMU too.
timeout --foreground "$timeout" "${q[@]}" -serial stdio -append "$append" </dev/null 2>&1 |
    awk -v all="$verbose" -v rcfile="$tmp/rc" '
        { sub(/\r$/, "") }
        /TETHER_VM_EXIT=/ { sub(/.*TETHER_VM_EXIT=/, ""); print $1 + 0 > rcfile; on = 0; next }
        on || all { print; fflush() }
        /TETHER_VM_START/ { on = 1 }'
if [ ! -s "$tmp/rc" ]; then
    echo "run.sh: the guest reported no exit status (timeout after ${timeout}s, or a crash; -v shows the console)" >&2
    [ -n "$vsock_uds" ] && sed 's/^/vhost-device-vsock: /' "$tmp/vhost-vsock.log" >&2
    exit 124
fi
exit "$(cat "$tmp/rc")"
