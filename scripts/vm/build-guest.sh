#!/usr/bin/env bash
# Builds the small Linux guest the VM tests boot (crates/tether/tests/vm.rs, docs/vm.md):
# Debian's kernel and an initramfs with busybox, a few kernel modules (FUSE, vsock, virtio
# network, virtio disks and ext4) and a static tether, plus vhost-device-vsock for the host side of guest vsock.
# Run as root on Debian 12. Installs what it needs; quick when nothing changed.
#
#   scripts/vm/build-guest.sh            # -> $TETHER_VM_CACHE/guest/{vmlinuz,initramfs.cpio}
#
# TETHER_VM_TETHER=PATH puts that (static) binary in the guest instead of building one.
# TETHER_VM_CACHE (default /var/tmp/tether-vm) holds the guest, the vhost-device-vsock
# install (cargo/bin/) and the static build's target directory (target/, kept apart from
# the project's own so that it can run beside a `cargo test` holding that one's lock).
# The guest is rebuilt only when an input changed: this script, the kernel, busybox, the
# modules or the tether binary (their checksums are kept in guest/inputs).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${TETHER_VM_CACHE:-/var/tmp/tether-vm}
guest=$cache/guest
say() { printf 'build-guest: %s\n' "$*" >&2; }
# shellcheck source=scripts/vm/initramfs-lib.sh
. "$root/scripts/vm/initramfs-lib.sh"
die() {
    say "error: $*"
    exit 1
}
[ "$(id -u)" -eq 0 ] || die "run as root (it installs packages with apt-get)"
mkdir -p "$cache" "$guest"

# --- Debian packages: QEMU, the kernel the guest boots, busybox, cpio, kmod (modprobe,
# depmod), socat (QEMU's per-connection forward of guest TCP to host loopback).
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
ls /boot/vmlinuz-*-amd64 >/dev/null 2>&1 || need+=(linux-image-amd64)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)  # static: the guest has no libc
command -v cpio >/dev/null || need+=(cpio)
command -v depmod >/dev/null || need+=(kmod)
command -v socat >/dev/null || need+=(socat)
command -v file >/dev/null || need+=(file)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs) # the guest's ext4 disk (vm.rs, run.sh -d)
if [ ${#need[@]} -gt 0 ]; then
    say "apt-get install ${need[*]} (about 100 MB to download the first time)"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends "${need[@]}" >&2; then
        apt-get update -q >&2
        apt-get install -y -q --no-install-recommends "${need[@]}" >&2
    fi
fi

# --- vhost-device-vsock (crates.io): guest vsock without the host's vsock modules; its
# host side is a Unix socket per port (UDS_PORT).
vdv=$cache/cargo/bin/vhost-device-vsock
if [ ! -x "$vdv" ]; then
    say "cargo install vhost-device-vsock --root $cache/cargo (a few minutes, once)"
    cargo install --locked vhost-device-vsock --root "$cache/cargo" >&2 ||
        die "cargo install vhost-device-vsock failed"
fi

# --- the static tether, in its own target directory: musl (scripts/build-static.sh, or
# the same cargo build where that script is absent); if that fails, glibc linked
# statically (+crt-static), which serves the guest as well: numeric addresses need no
# NSS libraries.
export CARGO_TARGET_DIR=$cache/target
static_build() { # TRIPLE
    say "cargo build --release -p tether --target $1, statically linked (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
    rustup target add "$1" >&2 &&
        (cd "$root" && CARGO_PROFILE_RELEASE_STRIP=debuginfo CARGO_PROFILE_RELEASE_DEBUG=0 \
            RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
            cargo build --release --locked -p tether --target "$1" >&2)
}
triple=x86_64-unknown-linux-musl
if [ -n "${TETHER_VM_TETHER:-}" ]; then
    say "the guest's tether: $TETHER_VM_TETHER (TETHER_VM_TETHER; nothing built)"
elif [ -x "$root/scripts/build-static.sh" ]; then
    say "scripts/build-static.sh x86_64 (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
    "$root/scripts/build-static.sh" x86_64 >/dev/null || triple=
else
    static_build "$triple" || triple=
fi
if [ -z "$triple" ]; then
    triple=x86_64-unknown-linux-gnu
    say "the musl build failed; building for $triple with +crt-static instead"
    static_build "$triple" || die "the static build failed"
fi
tether=${TETHER_VM_TETHER:-$CARGO_TARGET_DIR/$triple/release/tether}
[ -x "$tether" ] || die "no static tether at $tether"
case $(file -b "$tether") in
    *"statically linked"* | *"static-pie linked"*) ;;
    *) die "$tether is not statically linked: $(file -b "$tether")" ;;
esac

# --- the kernel: the newest Debian one installed.
kver=${TETHER_VM_KVER:-$(cd /boot && ls vmlinuz-*-amd64 | sed 's/^vmlinuz-//' | sort -V | tail -1)}
[ -f "/boot/vmlinuz-$kver" ] && [ -d "/lib/modules/$kver" ] || die "no kernel $kver in /boot and /lib/modules"
modules="fuse vsock vmw_vsock_virtio_transport virtio_net virtio_pci virtio_blk ext4"

# --- is the cached guest up to date?
inputs=$(
    for f in "$0" "$root/scripts/vm/initramfs-lib.sh" "/boot/vmlinuz-$kver" /bin/busybox "$tether"; do
        echo "$(sha256sum <"$f" | cut -d' ' -f1) $(basename "$f")"
    done
    echo "modules: $modules"
    for m in $modules; do modprobe -S "$kver" --show-depends "$m"; done
)
if [ -f "$guest/vmlinuz" ] && [ -f "$guest/initramfs.cpio" ] && [ "$(cat "$guest/inputs" 2>/dev/null)" = "$inputs" ]; then
    say "guest up to date: $guest (kernel $kver)"
    exit 0
fi
say "building the guest: kernel $kver, busybox, modules ($modules), $tether"

tree=$(mktemp -d "$cache/tree.XXXXXX")
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree"/{bin,sbin,dev,proc,sys,tmp,run,root,etc,mnt/src,usr/bin,usr/sbin,tether-vm} \
    "$tree/lib/modules/$kver"
busybox_into "$tree"
cp "$tether" "$tree/bin/tether"
# mount(8) (busybox's mount -a too) runs /sbin/mount.TYPE for a type it does not know.
ln -s ../bin/tether "$tree/sbin/mount.tether"
ln -s /proc/mounts "$tree/etc/mtab"
echo 'root:x:0:0:root:/root:/bin/sh' >"$tree/etc/passwd"
echo 'root:x:0:' >"$tree/etc/group"

# The modules and what they depend on, as modprobe resolves them for this kernel (built-in
# ones have no file and are skipped), uncompressed.
# shellcheck disable=SC2086 # $modules is a list
modules_into "$tree" "$kver" $modules
md=/lib/modules/$kver
say "modules: $(cd "$tree/$md" && find . -name '*.ko' | sed 's|.*/||; s|\.ko$||' | sort | tr '\n' ' ')"

# /init: mounts the basics, loads the modules, sets up the network if asked, mounts what
# /etc/fstab lists, runs /tether-vm/cmd and reports its status on the console, powers off.
# scripts/vm/run.sh appends /tether-vm/env, /tether-vm/cmd and the run's files.
cat >"$tree/init" <<'EOF'
#!/bin/sh
export PATH=/sbin:/bin:/usr/sbin:/usr/bin HOME=/root TERM=dumb
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs -o size=50% tmp /tmp
mount -t tmpfs run /run
stty -onlcr -echo 2>/dev/null </dev/console
hostname guest
TETHER_VM_NET=
[ -f /tether-vm/env ] && . /tether-vm/env
for m in virtio_pci fuse vsock vmw_vsock_virtio_transport virtio_net virtio_blk ext4; do
    modprobe "$m" || echo "tether-vm: modprobe $m failed"
done
ip link set lo up
if [ -n "$TETHER_VM_NET" ]; then
    # QEMU user networking (slirp): the guest is 10.0.2.15, forwarded ports at 10.0.2.100.
    ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 && ip route add default via 10.0.2.2 ||
        echo "tether-vm: network setup failed"
fi
echo TETHER_VM_START
if grep -q '^[^#]' /etc/fstab 2>/dev/null; then
    echo "tether-vm: mount -a"
    mount -a
    echo $? >/run/mount-a.status
fi
cd /root
if [ -f /tether-vm/cmd ]; then
    sh /tether-vm/cmd
    rc=$?
else
    setsid cttyhack sh
    rc=$?
fi
cd /
sync
echo "TETHER_VM_EXIT=$rc"
poweroff -f
EOF
chmod 755 "$tree/init"
(cd "$tree" && find . | sort | cpio -o -H newc --quiet -R 0:0) >"$guest/initramfs.cpio.tmp"
cp "/boot/vmlinuz-$kver" "$guest/vmlinuz"
mv "$guest/initramfs.cpio.tmp" "$guest/initramfs.cpio"
printf '%s\n' "$inputs" >"$guest/inputs"
say "built $guest/vmlinuz and $guest/initramfs.cpio ($(du -h "$guest/initramfs.cpio" | cut -f1))"
