#!/usr/bin/env bash
# What `tether sync` costs, and how late a host change shows without it (issue 34).
# One `tether serve` on a Unix socket and one default `tether mount` (release build):
#   1. idle:  `tether latency` (no sync), then `tether latency --sync`
#   2. busy:  the same while a host process rewrites 100 files of the export in a loop
#             (files the guest has read, so every rewrite is pushed)
#   3. the command itself: N runs of `tether sync -q`, wall time per run (process start
#      included), idle
#
#   bench/sync_cost.sh [TRIALS=1000] [OUT_DIR]
#   MOUNT_ARGS="--no-watch-events" bench/sync_cost.sh      # other mount options
#
# Needs root and /dev/fuse; builds the release binary. Prints the tables; with OUT_DIR,
# also leaves the latency JSON files there.
set -euo pipefail
cd "$(dirname "$0")/.."
TRIALS=${1:-1000}
OUT=${2:-}
cargo build --release -q
B=$PWD/target/release/tether
work=$(mktemp -d /var/tmp/tether-sync.XXXXXX)
mkdir -p "$work/export/busy" "$work/mnt"
pids=()
BUSY=
cleanup() {
  [ -n "$BUSY" ] && kill "$BUSY" 2>/dev/null || true
  mountpoint -q "$work/mnt" && "$B" unmount --lazy "$work/mnt" 2>/dev/null || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
"$B" serve "$work/export" --listen "unix:$work/s.sock" 2>"$work/serve.log" &
pids+=($!)
sleep 0.5
# shellcheck disable=SC2086
"$B" mount "unix:$work/s.sock" "$work/mnt" ${MOUNT_ARGS:-} 2>"$work/mount.log" &
pids+=($!)
for _ in $(seq 100); do mountpoint -q "$work/mnt" && break; sleep 0.05; done
json() { [ -n "$OUT" ] && echo "--json $OUT/$1.json" || true; }
[ -n "$OUT" ] && mkdir -p "$OUT"

echo "== machine: $(nproc) CPUs, $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg); $("$B" --version); mount options: ${MOUNT_ARGS:-(default)}"
echo "== idle: host changes without sync"
# shellcheck disable=SC2046
"$B" latency --host "$work/export" --mount "$work/mnt" --trials "$TRIALS" $(json idle-nosync)
echo "== idle: each host change followed by tether sync"
# shellcheck disable=SC2046
"$B" latency --host "$work/export" --mount "$work/mnt" --trials "$TRIALS" --sync $(json idle-sync)

echo "== the command: $TRIALS runs of \`tether sync -q\`, idle"
start=$(date +%s%N)
for _ in $(seq "$TRIALS"); do "$B" sync -q "$work/mnt"; done
end=$(date +%s%N)
echo "wall time per run: $(( (end - start) / TRIALS / 1000 )) us (process start included)"

# Busy: a host process rewrites 100 files the guest has read, as fast as it can.
for i in $(seq 100); do echo "file $i" >"$work/export/busy/f$i"; done
"$B" sync -q "$work/mnt" # (without it the guest may still list busy/ as it was: empty)
cat "$work/mnt"/busy/* >/dev/null
python3 - "$work/export/busy" <<'PY' &
import os, sys
d = sys.argv[1]
n = 0
while True:
    for i in range(1, 101):
        with open(os.path.join(d, f"f{i}"), "w") as f:
            f.write(f"rewrite {n} of file {i}\n")
    n += 1
PY
BUSY=$!
sleep 1
echo "== busy (a host process rewrites 100 files in a loop): host changes without sync"
# shellcheck disable=SC2046
"$B" latency --host "$work/export" --mount "$work/mnt" --trials "$TRIALS" $(json busy-nosync)
echo "== busy: each host change followed by tether sync"
# shellcheck disable=SC2046
"$B" latency --host "$work/export" --mount "$work/mnt" --trials "$TRIALS" --sync $(json busy-sync)
kill "$BUSY"
BUSY=
"$B" status "$work/mnt" | grep -E "pushes received|invalidations applied:|host events"
