#!/usr/bin/env bash
# Guest file watchers under a burst of host changes (issue 7): `inotifywait -m -r` watches a
# Tether mount while the host creates N files in nested directories (an `npm install`), then
# rewrites M of them (a `git checkout`). Reports how many events the watcher got, how long
# after the host finished the last one arrived, and whether its queue overflowed.
#
#   bench/watch_burst.sh [N_CREATE=20000] [M_REWRITE=2000]
#
# Needs root, /dev/fuse, inotify-tools; builds the release binary.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20000}
M=${2:-2000}
cargo build --release -q
B=$PWD/target/release/tether
work=$(mktemp -d /tmp/tether-burst.XXXXXX)
mkdir -p "$work/export" "$work/mnt"
pids=()
cleanup() {
  [ -n "${IW:-}" ] && kill "$IW" 2>/dev/null || true
  mountpoint -q "$work/mnt" && "$B" unmount --lazy "$work/mnt" 2>/dev/null || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
"$B" serve "$work/export" --listen "unix:$work/s.sock" 2>"$work/serve.log" &
pids+=($!)
sleep 0.5
"$B" mount "unix:$work/s.sock" "$work/mnt" 2>"$work/mount.log" &
pids+=($!)
for _ in $(seq 100); do mountpoint -q "$work/mnt" && break; sleep 0.05; done
# The package directories exist before the watcher starts: a directory created during the
# burst races with inotifywait -r adding its watch, natively too, so it would measure that.
mkdir "$work/export/node_modules"
for i in $(seq 0 $(( (N - 1) / 100 ))); do mkdir "$work/export/node_modules/pkg$i"; done
sleep 0.3
inotifywait -m -r -q --format '%e %w%f' "$work/mnt" >"$work/events" 2>"$work/iw.err" &
IW=$!
for _ in $(seq 100); do grep -q . "$work/iw.err" 2>/dev/null || true; sleep 0.02; done

count() { grep -c "$1" "$work/events" || true; }
wait_events() { # pattern, expected, then prints seconds from now until reached (or gives up)
  local start end n
  start=$(date +%s.%N)
  for _ in $(seq 3000); do
    n=$(count "$1")
    [ "$n" -ge "$2" ] && break
    sleep 0.01
  done
  end=$(date +%s.%N)
  echo "$n $(awk "BEGIN{print $end - $start}")"
}

# npm install: N files in the N/100 package directories.
t0=$(date +%s.%N)
python3 - "$work/export/node_modules" "$N" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, f"pkg{i // 100}")
    with open(os.path.join(d, f"f{i}.js"), "w") as f:
        f.write("module.exports = %d;\n" % i)
PY
t1=$(date +%s.%N)
read -r got late < <(wait_events '^CREATE .*\.js$' "$N")
echo "create: host made $N files in $(awk "BEGIN{print $t1 - $t0}") s; watcher got $got CREATE events, the last $late s after the host finished"

# git checkout: rewrite M of them.
t0=$(date +%s.%N)
python3 - "$work/export/node_modules" "$M" <<'PY'
import os, sys
root, m = sys.argv[1], int(sys.argv[2])
for i in range(m):
    with open(os.path.join(root, f"pkg{i // 100}", f"f{i}.js"), "w") as f:
        f.write("module.exports = 'changed %d';\n" % i)
PY
t1=$(date +%s.%N)
read -r got late < <(wait_events '^CLOSE_WRITE' "$((N + M))")
echo "rewrite: host rewrote $M files in $(awk "BEGIN{print $t1 - $t0}") s; watcher got $((got - N)) more CLOSE_WRITE events, the last $late s after the host finished"
echo "overflows: $(count Q_OVERFLOW)"
"$B" status "$work/mnt" | grep "host events"
