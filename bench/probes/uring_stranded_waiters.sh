#!/usr/bin/env bash
# Lock waiters and a read on one CPU with `mount --io-uring` (bench/journal/2026-11-27-io-uring-ring-entries.md, "every ring
# entry registered at the start"). Each run: a fresh mount; the thread serving CPU 0's ring
# queue made SCHED_IDLE and CPU 0 kept busy; the host holds a lock; WAITERS processes on
# CPU 0 that opened the file ask for it all at once; then `cat` of another file from CPU 0,
# timed (as tests/io_uring.rs does). A queue with fewer
# entries than waiters strands requests in the kernel and the `cat` waits for the lock.
#
#   ./bench/probes/uring_stranded_waiters.sh [RUNS] [WAITERS] [TETHER]   (5, 40, release build)
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-5}
WAITERS=${2:-40}
T=${3:-}
if [ -z "$T" ]; then
  ./scripts/install-deps.sh >/dev/null
  export PATH="$HOME/.cargo/bin:$PATH"
  cargo build --release -q -p tether
  T=$PWD/target/release/tether
fi

work=$(mktemp -d /tmp/tether-stranded.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  mountpoint -q "$work/mnt" && umount "$work/mnt" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# Waits (at most 10 s) until every waiter sleeps in kernel function $1; prints how many do.
waiters_sleeping_in() {
  local n=0
  for _ in $(seq 100); do
    n=0
    for w in "${waiters[@]}"; do
      [ "$(cat /proc/$w/wchan 2>/dev/null)" = "$1" ] && n=$((n + 1))
    done
    [ "$n" -ge "$WAITERS" ] && break
    sleep 0.1
  done
  echo "$n"
}

for run in $(seq "$RUNS"); do
  rm -rf "$work"/* && mkdir "$work/export" "$work/mnt"
  pids=()
  "$T" serve "$work/export" --listen "unix:$work/s.sock" 2>"$work/serve.log" & pids+=($!)
  for _ in $(seq 200); do [ -S "$work/s.sock" ] && break; sleep 0.01; done
  "$T" mount "unix:$work/s.sock" "$work/mnt" --io-uring 2>"$work/mount.log" & mount_pid=$!
  pids+=($mount_pid)
  for _ in $(seq 200); do mountpoint -q "$work/mnt" && break; sleep 0.01; done
  echo data >"$work/export/other"
  : >"$work/export/lock"
  bash -c 'exec 9>>"$1"; flock 9; exec sleep 600' holder "$work/export/lock" & pids+=($!)
  sleep 0.3
  # The waiters open the file, then wait on a FIFO, so that all ask for the lock at once.
  mkfifo "$work/go"
  waiters=()
  for _ in $(seq "$WAITERS"); do
    taskset -c 0 bash -c 'exec 9<"$1"; : <"$2"; exec flock 9' waiter "$work/mnt/lock" "$work/go" &
    waiters+=($!)
  done
  pids+=("${waiters[@]}")
  waiters_sleeping_in wait_for_partner >/dev/null
  for t in /proc/$mount_pid/task/*; do
    if [ "$(cat "$t/comm")" = fuser-uring ] && grep -q "Cpus_allowed_list:.0$" "$t/status"; then
      chrt --idle -p 0 "$(basename "$t")"
    fi
  done
  taskset -c 0 sh -c 'while :; do :; done' & pids+=($!)
  : >"$work/go"
  blocked=$(waiters_sleeping_in request_wait_answer)
  start=$(date +%s.%N)
  if timeout 20 taskset -c 0 cat "$work/mnt/other" >/dev/null; then r=served; else r=STUCK; fi
  echo "run $run: $blocked waiters blocked; cat $r after $(echo "$(date +%s.%N) - $start" | bc) s"
  # The waiters, the holder and the busy loop go first, then the mount, then the server.
  for p in "${pids[@]:2}"; do kill "$p" 2>/dev/null || true; done
  wait "${pids[@]:2}" 2>/dev/null || true
  kill "$mount_pid" && wait "$mount_pid" 2>/dev/null || true
  kill "${pids[0]}" && wait "${pids[0]}" 2>/dev/null || true
  pids=()
done
