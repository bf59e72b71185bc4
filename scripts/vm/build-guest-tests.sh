#!/usr/bin/env bash
# Builds test programs that the VM tests (crates/tether/tests/vm.rs) run inside the guest:
# the test binaries posix_native (the POSIX suite; its ignored compare_with_dir_from_env
# compares a native directory with POSIX_OTHER_DIR) and vm (its ignored guest_side_* tests
# are the guest's half of vm.rs's checks), statically linked for x86_64 musl, release.
#
#   scripts/vm/build-guest-tests.sh     # prints the two binaries' paths, one a line
#
# Same target directory, flags and linker as build-guest.sh's static tether
# (scripts/build-static.sh), so the dependencies built for that one are reused: when the
# static tether is built, this costs the test crates' own compilation (a minute or two of
# CPU the first time), and nothing after.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${TETHER_VM_CACHE:-/var/tmp/tether-vm}
triple=x86_64-unknown-linux-musl
say() { printf 'build-guest-tests: %s\n' "$*" >&2; }

export CARGO_TARGET_DIR=$cache/target
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_LINKER=cc
export CARGO_PROFILE_RELEASE_STRIP=debuginfo CARGO_PROFILE_RELEASE_DEBUG=0
export RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static"
rustup target add "$triple" >&2
say "cargo test --release -p tether --target $triple --test posix_native --test vm --no-run (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
cd "$root"
out=$(cargo test --release --locked -p tether --target "$triple" --test posix_native --test vm \
    --no-run --message-format=json-render-diagnostics)
mkdir -p "$cache/tests"
for name in posix_native vm; do
    # The test executable's line in cargo's JSON: {"reason":"compiler-artifact",...
    # "target":{..."name":"NAME","test":true...},..."executable":"PATH",...}
    exe=$(printf '%s\n' "$out" | grep '"reason":"compiler-artifact"' |
        grep "\"kind\":\[\"test\"\],\"crate_types\":\[\"bin\"\],\"name\":\"$name\"" |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
    [ -n "$exe" ] && [ -x "$exe" ] || { say "error: no test executable for $name in cargo's output"; exit 1; }
    case $(file -b "$exe") in
        *"statically linked"* | *"static-pie linked"*) ;;
        *) say "error: $exe is not statically linked: $(file -b "$exe")"; exit 1 ;;
    esac
    cp "$exe" "$cache/tests/$name.tmp" && mv "$cache/tests/$name.tmp" "$cache/tests/$name"
    echo "$cache/tests/$name"
done
