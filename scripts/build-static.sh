#!/usr/bin/env bash
# Builds a statically linked tether for VM guests (musl): one file to copy into a guest,
# with no loader or libraries beside it (docs/install.md).
#
#   scripts/build-static.sh                 # x86_64, and aarch64 if it can be linked here
#   scripts/build-static.sh x86_64          # only these architectures
#   scripts/build-static.sh x86_64 aarch64  # aarch64 is then an error if it cannot be built
#
# Output: target/<arch>-unknown-linux-musl/release/tether ($CARGO_TARGET_DIR if set),
# stripped of debug information (KEEP_DEBUG=1 keeps it).
#
# Installs what it needs: the rustup targets, and for aarch64 Debian's cross linker
# (gcc-aarch64-linux-gnu, with apt-get, as root). Rust's musl targets bring their own C
# runtime (self-contained crt objects and libc.a), so any gcc for the architecture links
# them; no musl-gcc is needed.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
target_dir=${CARGO_TARGET_DIR:-$root/target}

say() { printf 'build-static: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

if [ $# -gt 0 ]; then
    arches=("$@")
    explicit=1
else
    arches=(x86_64 aarch64)
    explicit=0
fi

command -v rustup >/dev/null || die "rustup is needed to add the musl targets (https://rustup.rs)"
command -v file >/dev/null || { say "installing file (to check the result)"; apt-get install -y -q -o DPkg::Lock::Timeout=600 file >/dev/null; }

# The C linker for an architecture, installing Debian's cross gcc if it is missing.
linker_for() {
    local arch=$1 native
    native=$(uname -m)
    if [ "$arch" = "$native" ]; then
        command -v cc >/dev/null && { echo cc; return 0; }
        say "installing gcc (the linker rustc calls)"
        apt-get install -y -q -o DPkg::Lock::Timeout=600 gcc >/dev/null 2>&1 || return 1
        echo cc
        return 0
    fi
    local cross="$arch-linux-gnu-gcc"
    if ! command -v "$cross" >/dev/null; then
        if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
            say "no $cross, and cannot install it (needs root and apt-get)"
            return 1
        fi
        local pkg="gcc-${arch//_/-}-linux-gnu"
        say "installing $pkg (the cross linker for $arch): apt-get install $pkg"
        local aptlog
        aptlog=$(mktemp)
        if ! apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 "$pkg" >"$aptlog" 2>&1; then
            say "apt-get install $pkg failed; trying once more after apt-get update"
            apt-get update -q -o DPkg::Lock::Timeout=600 >>"$aptlog" 2>&1 || true
            if ! apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 "$pkg" >>"$aptlog" 2>&1; then
                tail -n 5 "$aptlog" | sed 's/^/build-static:   apt: /' >&2
                rm -f "$aptlog"
                return 1
            fi
        fi
        rm -f "$aptlog"
    fi
    echo "$cross"
}

built=()
skipped=()
for arch in "${arches[@]}"; do
    case $arch in
        x86_64 | aarch64) ;;
        *) die "unknown architecture $arch (x86_64 or aarch64)" ;;
    esac
    triple="$arch-unknown-linux-musl"
    say "== $triple"
    if ! linker=$(linker_for "$arch"); then
        msg="$arch: no linker for $triple here (Debian's gcc-${arch//_/-}-linux-gnu could not be installed)"
        [ "$explicit" = 1 ] && die "$msg"
        say "skipping $msg"
        skipped+=("$arch")
        continue
    fi
    say "rustup target add $triple"
    rustup target add "$triple" >&2
    env_triple=$(echo "$triple" | tr 'a-z-' 'A-Z_')
    export "CARGO_TARGET_${env_triple}_LINKER=$linker"
    if [ "${KEEP_DEBUG:-0}" != 1 ]; then
        export CARGO_PROFILE_RELEASE_STRIP=debuginfo CARGO_PROFILE_RELEASE_DEBUG=0
    fi
    say "cargo build --release --locked -p tether --target $triple (linker: $linker)"
    # crt-static is the musl targets' default; said here so it cannot silently change.
    RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
        cargo build --release --locked -p tether --target "$triple" >&2
    bin="$target_dir/$triple/release/tether"
    [ -x "$bin" ] || die "no binary at $bin"
    desc=$(file -b "$bin")
    say "file: $desc"
    case $desc in
        *"statically linked"* | *"static-pie linked"*) ;;
        *) die "$bin is not statically linked: $desc" ;;
    esac
    if [ "$arch" = "$(uname -m)" ]; then
        say "runs here: $("$bin" --version)"
    elif command -v "qemu-$arch-static" >/dev/null || command -v "qemu-$arch" >/dev/null; then
        q=$(command -v "qemu-$arch-static" || command -v "qemu-$arch")
        say "runs under $q: $("$q" "$bin" --version)"
    else
        say "not run: no qemu-$arch here to try a foreign binary"
    fi
    say "built $bin ($(du -h "$bin" | cut -f1))"
    built+=("$bin")
done

[ ${#built[@]} -gt 0 ] || die "nothing was built"
say "done: ${built[*]}"
[ ${#skipped[@]} -eq 0 ] || say "not built (no linker here): ${skipped[*]}"
printf '%s\n' "${built[@]}"
