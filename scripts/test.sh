#!/usr/bin/env bash
# The test suite, as CI runs it: formatting, lints, then every test (unit, golden, in-process,
# and the real-FUSE-mount suites). Run as root on Debian.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== test.sh: installing what the tests need (Debian packages, a Rust toolchain), if missing"
./scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
rustup component add rustfmt clippy >/dev/null 2>&1 || true
echo "== test.sh: formatting and lints"
if cargo fmt --version >/dev/null 2>&1; then
  cargo fmt --all -- --check
else
  echo "SKIPPED: cargo fmt --check (rustfmt not installed)"
fi
if cargo clippy --version >/dev/null 2>&1; then
  cargo clippy --workspace --all-targets --quiet -- -D warnings
else
  echo "SKIPPED: cargo clippy (clippy not installed)"
fi
echo "== test.sh: the host side for macOS: cargo clippy (so also check) for both Apple targets"
echo "   (installs their rust-std with rustup if missing; no Apple linker is needed to check)"
for target in x86_64-apple-darwin aarch64-apple-darwin; do
  rustup target add "$target" >/dev/null 2>&1 || true
  cargo clippy --target "$target" --quiet -p tether-proto -p tether-transport -p tether-sys \
    -p tether-server -p tether-client -p tether --lib --bins -- -D warnings
done
echo "== test.sh: building (a first build takes about 3 minutes on 2 cores; later ones seconds)"
cargo build --workspace --all-targets --quiet
echo "== test.sh: running the tests (about 10 minutes: real servers, real FUSE mounts)."
echo "   A failing test shows the logs of the processes it started; passing ones stay quiet."
status=0
cargo test --workspace --no-fail-fast 2>&1 || status=$?
echo "== test.sh: the real-mount suites again with the portable backend (the code macOS runs:"
echo "   tether serve --backend portable; the tests of Linux-only features say they skip)."
echo "   One test at a time: the portable watcher's timing tests are looser under load."
TETHER_TEST_SERVE_ARGS="--backend portable" cargo test -p tether --no-fail-fast \
  --test posix_mount --test coherence --test locks --test boundary --test security \
  --test reconnect --test watch_events --test case_insensitive -- --test-threads 1 2>&1 || status=$?
exit $status
