#!/usr/bin/env bash
# Installs what building and testing Tether needs on Debian, as root: a Rust toolchain if
# there is none, and the Debian packages the tests and benchmarks use. Idempotent and quick
# when everything is already there.
#
#   scripts/install-deps.sh [--vm-bench] [PACKAGE...]
#
# --vm-bench: also what bench/vm.sh needs beyond the VM tests (mmdebstrap for the guest's
# Debian userland, e2fsprogs, python3); not part of the test suite, so only when asked
# (bench/vm.sh installs it by itself too). Other arguments are extra Debian packages.
set -euo pipefail

vm_bench=
args=()
for a in "$@"; do
  case $a in
    --vm-bench) vm_bench=1 ;;
    *) args+=("$a") ;;
  esac
done
set -- ${args[@]+"${args[@]}"}

need=()
command -v cc >/dev/null || need+=(build-essential)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v fusermount3 >/dev/null || need+=(fuse3)
command -v setpriv >/dev/null || need+=(util-linux)
command -v git >/dev/null || need+=(git)
# Guest file watchers in the tests: inotifywait and Python's watchdog library.
command -v inotifywait >/dev/null || need+=(inotify-tools)
/usr/bin/python3 -c 'import watchdog.observers.inotify' 2>/dev/null || need+=(python3-watchdog)
# The ssh transport's tests run a private sshd on 127.0.0.1.
command -v ssh >/dev/null || need+=(openssh-client)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
# pjdfstest (third_party/pjdfstest, tests/pjdfstest.rs) runs under perl's prove.
command -v prove >/dev/null || need+=(perl)
command -v openssl >/dev/null || need+=(openssl)
# The VM tests (crates/tether/tests/vm.rs): QEMU, the guest's kernel, busybox, cpio and
# kmod to build its initramfs, socat for QEMU's TCP forwards. scripts/vm/build-guest.sh,
# which the tests run, installs these too, and vhost-device-vsock with cargo install.
vm_need=()
command -v qemu-system-x86_64 >/dev/null || vm_need+=(qemu-system-x86)
ls /boot/vmlinuz-*-amd64 >/dev/null 2>&1 || vm_need+=(linux-image-amd64)
dpkg -s busybox-static >/dev/null 2>&1 || vm_need+=(busybox-static)
command -v cpio >/dev/null || vm_need+=(cpio)
command -v depmod >/dev/null || vm_need+=(kmod)
command -v socat >/dev/null || vm_need+=(socat)
command -v file >/dev/null || vm_need+=(file)
if [ -n "$vm_bench" ]; then
  command -v mmdebstrap >/dev/null || vm_need+=(mmdebstrap)
  command -v mke2fs >/dev/null || vm_need+=(e2fsprogs)
  command -v python3 >/dev/null || vm_need+=(python3)
  [ -x /usr/lib/qemu/virtiofsd ] || vm_need+=(qemu-system-x86)
fi
for extra in "$@"; do
  dpkg -s "$extra" >/dev/null 2>&1 || need+=("$extra")
done
if ! command -v cargo >/dev/null && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
  # Debian's own Rust; rustup is preferred where its download server can be reached.
  need+=(cargo rustc)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  # Keep packages from starting services (openssh-server's sshd): the tests start their own.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ ${#vm_need[@]} -gt 0 ]; then
  echo "installing for the VM tests: ${vm_need[*]}" >&2
  [ ${#need[@]} -gt 0 ] || apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${vm_need[@]}" >/dev/null
fi
if [ ! -e /dev/fuse ]; then
  modprobe fuse 2>/dev/null || true
fi
