#!/usr/bin/env bash
# The test suite, as CI runs it: formatting, lints, then every test (unit, golden, in-process,
# and the real-FUSE-mount suites). Run as root on Debian.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
rustup component add rustfmt clippy >/dev/null 2>&1 || true
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
cargo test --workspace --quiet 2>&1
