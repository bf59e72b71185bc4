#!/usr/bin/env bash
# Scale: a tree of N small files (default 300,000, the size of the 278k-file tree in the
# seeds) walked, read and copied out through a Tether mount, cold; reports the times, the
# peak RSS of server and client, and their RSS after the kernel drops its caches (the
# kernel's FORGETs must let both sides shrink). Run as root.
#   bench/scale.sh [N]
set -euo pipefail
N=${1:-300000}
cd "$(dirname "$0")/.."
cargo build --release -q
tether=$PWD/target/release/tether
work=$(mktemp -d /tmp/tether-scale.XXXXXX)
spid= mpid=
cleanup() {
  [ -n "$mpid" ] && { "$tether" unmount --lazy "$work/mnt" 2>/dev/null || true; kill "$mpid" 2>/dev/null || true; wait "$mpid" 2>/dev/null || true; }
  [ -n "$spid" ] && { kill "$spid" 2>/dev/null || true; wait "$spid" 2>/dev/null || true; }
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/export" "$work/mnt" "$work/copy"
python3 - "$work/export" "$N" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
per = 300
for i in range(n):
    d = os.path.join(root, f"d{i // (per * per):03d}", f"e{(i // per) % per:03d}")
    if i % per == 0:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i}.txt"), "w") as f:
        f.write(f"file {i}\n" * 8)
PY
rss() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/status"; }
"$tether" serve "$work/export" --listen "unix:$work/s.sock" 2>"$work/serve.log" & spid=$!
for _ in $(seq 100); do [ -S "$work/s.sock" ] && break; sleep 0.1; done
"$tether" mount "unix:$work/s.sock" "$work/mnt" 2>"$work/mount.log" & mpid=$!
for _ in $(seq 100); do mountpoint -q "$work/mnt" && break; sleep 0.1; done
if ! mountpoint -q "$work/mnt"; then
  echo "the mount did not come up:"; cat "$work/serve.log" "$work/mount.log"; exit 1
fi
timed() { local t0 t1; t0=$(date +%s.%N); "$@"; t1=$(date +%s.%N); awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f s", b-a}'; }
sync; echo 3 > /proc/sys/vm/drop_caches
echo "tree: $N files in $(find "$work/export" -type d | wc -l) directories"
echo "walk (find, cold):       $(timed sh -c "find '$work/mnt' | wc -l > '$work/count'")  entries: $(cat "$work/count")"
sync; echo 3 > /proc/sys/vm/drop_caches
echo "read all (tar, cold):    $(timed sh -c "tar -C '$work/mnt' -cf - . | wc -c > '$work/bytes'")  bytes: $(cat "$work/bytes")"
sync; echo 3 > /proc/sys/vm/drop_caches
echo "copy out (cp -a, cold):  $(timed cp -a "$work/mnt/." "$work/copy/")"
if diff -rq "$work/export" "$work/copy" >/dev/null; then echo "copy identical to the export: yes"; else echo "copy identical to the export: NO"; fi
echo "peak RSS: server $(rss $spid VmHWM) KiB, client $(rss $mpid VmHWM) KiB"
echo "RSS now: server $(rss $spid VmRSS) KiB, client $(rss $mpid VmRSS) KiB"
sync; echo 3 > /proc/sys/vm/drop_caches; sleep 2
echo "RSS after drop_caches: server $(rss $spid VmRSS) KiB, client $(rss $mpid VmRSS) KiB"
echo "tether status: $("$tether" status "$work/mnt" | grep -E 'unwatched|pushes' | tr '\n' ' ')"
