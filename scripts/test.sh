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
echo "== test.sh: building (a first build takes about 3 minutes on 2 cores; later ones seconds)"
cargo build --workspace --all-targets --quiet
echo "== test.sh: running the tests (about 10 minutes: real servers, real FUSE mounts)."
echo "   A failing test shows the logs of the processes it started; passing ones stay quiet."
cargo test --workspace --no-fail-fast 2>&1
