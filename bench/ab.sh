#!/usr/bin/env bash
# Two builds of tether side by side in one `tether bench` run: each serves and mounts its own
# export (Unix socket, default options), and the bench interleaves native, A and B, so that
# the machine's drift hits all three alike. For "is the new build slower anywhere?".
#
#   bench/ab.sh OLD_TETHER NEW_TETHER [tether bench options, e.g. --runs 3 --only a,b]
#
# Needs root and /dev/fuse. Works in a fresh directory under /var/tmp (ext4 here), removed at
# the end; everything it starts is stopped by PID and unmounted, whatever happens.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,8p' "$0"; exit 2; }
old=$(readlink -f "$1") new=$(readlink -f "$2")
shift 2
for b in "$old" "$new"; do [ -x "$b" ] || { echo "ab.sh: $b is not an executable" >&2; exit 2; }; done
work=$(mktemp -d /var/tmp/tether-ab.XXXXXX)
pids=()
cleanup() {
  for m in "$work/a-mnt" "$work/b-mnt"; do
    if mountpoint -q "$m"; then "$new" unmount --lazy "$m" 2>/dev/null || umount -l "$m" || true; fi
  done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work"/{native,a-export,a-mnt,b-export,b-mnt}
start() { # LABEL BINARY
  local label=$1 bin=$2
  "$bin" serve "$work/$label-export" --listen "unix:$work/$label.sock" 2>"$work/$label-serve.log" &
  pids+=($!)
  for _ in $(seq 100); do [ -S "$work/$label.sock" ] && break; sleep 0.05; done
  "$bin" mount "unix:$work/$label.sock" "$work/$label-mnt" 2>"$work/$label-mount.log" &
  pids+=($!)
  for _ in $(seq 200); do mountpoint -q "$work/$label-mnt" && return 0; sleep 0.05; done
  echo "ab.sh: $label did not mount; its log:" >&2
  cat "$work/$label-mount.log" >&2
  exit 1
}
start a "$old"
start b "$new"
echo "A = $old ($("$old" --version 2>/dev/null || echo '?'))"
echo "B = $new ($("$new" --version 2>/dev/null || echo '?'))"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
# DIR is measured; ratios are to the first --vs directory: native.
"$new" bench "$work/a-mnt" --vs "$work/native" --vs "$work/b-mnt" "$@"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
