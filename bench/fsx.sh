#!/usr/bin/env bash
# Data integrity under random operations (issue 6): starts `tether serve` and `tether mount`
# on a fresh export and runs `tether-fsx` against it (writes at random offsets, truncate,
# extend, mmap reads and writes, rename, fsync..., some through the mount and some on the
# host, every read checked against an in-memory model). Prints the tester's report and the
# wall time; exits with the tester's status (1: a mismatch, with the seed and a replay
# command). Everything it started is stopped and unmounted, and its directory removed,
# whatever happens.
#
#   bench/fsx.sh [OPS=1000000] [SEED=random] [-- more tether-fsx options]
#
# SERVE_ARGS and MOUNT_ARGS (environment) are added to `tether serve` and `tether mount`.
#
# Needs root and /dev/fuse; builds the release binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
OPS=${1:-1000000}
SEED=${2:-}
shift $(( $# > 2 ? 2 : $# ))
[ "${1:-}" = "--" ] && shift
cargo build --release -q -p tether
B=$PWD/target/release
work=$(mktemp -d /tmp/tether-fsx.XXXXXX)
mkdir -p "$work/export" "$work/mnt"
spid= mpid=
cleanup() {
  if mountpoint -q "$work/mnt"; then "$B/tether" unmount --lazy "$work/mnt" 2>/dev/null || true; fi
  [ -n "$mpid" ] && { kill "$mpid" 2>/dev/null || true; wait "$mpid" 2>/dev/null || true; }
  [ -n "$spid" ] && { kill "$spid" 2>/dev/null || true; wait "$spid" 2>/dev/null || true; }
  rm -rf "$work"
}
trap cleanup EXIT
"$B/tether" serve "$work/export" --listen "unix:$work/s.sock" ${SERVE_ARGS:-} 2>"$work/serve.log" & spid=$!
for _ in $(seq 100); do [ -S "$work/s.sock" ] && break; sleep 0.1; done
"$B/tether" mount "unix:$work/s.sock" "$work/mnt" ${MOUNT_ARGS:-} 2>"$work/mount.log" & mpid=$!
for _ in $(seq 100); do mountpoint -q "$work/mnt" && break; sleep 0.1; done
if ! mountpoint -q "$work/mnt"; then
  echo "the mount did not come up:"; cat "$work/serve.log" "$work/mount.log"; exit 1
fi
commit=unknown
if git rev-parse --git-dir >/dev/null 2>&1; then
  commit=$(git rev-parse --short HEAD)
  git diff --quiet HEAD || commit="$commit (with uncommitted changes)"
fi
echo "machine: $(nproc) cores, kernel $(uname -r); commit $commit; $(date -u '+%Y-%m-%d %H:%M UTC')"
seed_arg=()
[ -n "$SEED" ] && seed_arg=(--seed "$SEED")
t0=$(date +%s.%N)
status=0
"$B/tether-fsx" "$work/mnt" "$work/export" --ops "$OPS" "${seed_arg[@]}" --progress 100000 "$@" || status=$?
t1=$(date +%s.%N)
echo "wall time (including setup and the final checks): $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f s", b-a}')"
echo "tether status:"; "$B/tether" status "$work/mnt" | sed 's/^/  /' || true
if [ "$status" -ne 0 ]; then
  echo "tether-fsx failed (status $status); server and client logs:"
  tail -n 20 "$work/serve.log" "$work/mount.log"
fi
exit "$status"
