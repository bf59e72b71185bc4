#!/bin/sh
# Runs a built cargo-fuzz target in a private mount namespace in which / is read-only: only
# fuzz/ (corpus, artifacts) and a private tmpfs holding the session target's temporary export
# stay writable. The session target serves an export that holds a symlink to /, so a server
# escape found while fuzzing as root cannot touch the machine's files.
#
# usage (as root, after `cargo +nightly fuzz build`):
#   fuzz/run-sandboxed.sh TARGET [LIBFUZZER-OPTIONS...]
# e.g. fuzz/run-sandboxed.sh session -max_total_time=600 -rss_limit_mb=2048
set -e
[ $# -ge 1 ] || { echo "usage: $0 TARGET [LIBFUZZER-OPTIONS...]" >&2; exit 2; }
fuzz=$(cd "$(dirname "$0")" && pwd)
tmp=${TMPDIR:-/tmp}/tether-fuzz-sandbox
mkdir -p "$tmp" "$fuzz/artifacts/$1" "$fuzz/corpus/$1"
exec unshare -m --propagation private sh -c '
  set -e
  fuzz=$1 tmp=$2 t=$3; shift 3
  mount -t tmpfs -o size=4g tmpfs "$tmp"
  mount --bind "$fuzz" "$fuzz"
  mount -o remount,bind,ro /
  cd "$fuzz"
  TETHER_FUZZ_TMPDIR=$tmp exec "./target/x86_64-unknown-linux-gnu/release/$t" \
    -artifact_prefix="$fuzz/artifacts/$t/" "$@" "corpus/$t"
' sh "$fuzz" "$tmp" "$@"
