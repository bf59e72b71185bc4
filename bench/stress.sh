#!/usr/bin/env bash
# stress-ng's file-system stressors against a Tether mount (issue 6): serves a fresh export,
# mounts it, runs stress-ng (Debian package) with --temp-path inside the mount and --verify,
# then checks that the mount still answers. Exits non-zero when a stressor fails, stress-ng
# or the mount hangs, the server or client dies, or either logs a panic; prints the tails of
# their logs (and, for a hang, the stacks of blocked tasks and of both processes) and keeps
# the log directory. Everything it started is stopped by PID and unmounted whatever happens
# (also on Ctrl-C); a hung mount's FUSE connection is aborted first (through fusectl, or by
# killing the client). stress-ng runs in a private mount namespace without the machine's
# other FUSE mounts, since some stressors (fanotify) reach every mount they can see.
#
#   bench/stress.sh [options] [STRESSOR...]
#
#   --time T      how long each stressor runs (stress-ng --timeout: 20s, 10m; default 60s)
#   --workers N   instances of each stressor (default 2)
#   --threads N   tether mount --threads N (FUSE worker threads; default: tether's own)
#   --each        one stress-ng run per stressor, one after another, checking the mount
#                 after each and printing a verdict per stressor (triage); the default is
#                 one run of all the stressors at once
#   --native      run in a fresh directory under /tmp instead of a mount (comparison)
#   --list        print the default, lock and excluded stressors and exit
#
# STRESSOR...     run these instead of the default list.
# TETHER_BIN=path uses that binary instead of building target/release/tether.
# Needs root, /dev/fuse and stress-ng (apt-get install stress-ng).
set -uo pipefail

# Stressors that work in --temp-path: the file-system class and the I/O and memory-mapping
# stressors that do file I/O there.
DEFAULT=(access chattr chdir chmod chown copy-file dentry dir dirdeep dirmany dnotify dup
  fallocate fanotify fiemap fifo file-ioctl filename fpunch fsize fstat getdent hdd
  inode-flags inotify iomix ioprio link mknod open rename symlink sync-file touch utime
  verity xattr aio aiol readahead revio seek sendfile mmap msync msyncmany madvise mincore
  flock lockf fcntl lease locka lockofd)
EXCLUDED_WHY="bind-mount (pathological: bind-mounts /; not the file system under test)
binderfs (mounts binderfs; not the file system under test)
procfs eventfd io splice handle mmapfork (never touch --temp-path)
io-uring (fails on a native ext4 directory on this kernel: IORING_OP_STATX gets ENOENT)"

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

TIME=60s WORKERS=2 THREADS= EACH=0 NATIVE=0
STRESSORS=()
while [ $# -gt 0 ]; do
  case $1 in
    --time) TIME=$2; shift ;;
    --workers) WORKERS=$2; shift ;;
    --threads) THREADS=$2; shift ;;
    --each) EACH=1 ;;
    --native) NATIVE=1 ;;
    --list)
      echo "default: ${DEFAULT[*]}"
      echo "excluded:"; echo "$EXCLUDED_WHY" | sed 's/^/  /'
      exit 0 ;;
    -h|--help) usage ;;
    -*) echo "unknown option $1" >&2; usage 2 >&2 ;;
    *) STRESSORS+=("$1") ;;
  esac
  shift
done
[ ${#STRESSORS[@]} -eq 0 ] && STRESSORS=("${DEFAULT[@]}")
command -v stress-ng >/dev/null || { echo "stress-ng is missing: apt-get install stress-ng" >&2; exit 2; }

seconds() { # 20s, 10m, 1h, 90 -> seconds
  local v=$1
  case $v in
    *s) echo "${v%s}" ;; *m) echo $(( ${v%m} * 60 )) ;; *h) echo $(( ${v%h} * 3600 )) ;;
    *) echo "$v" ;;
  esac
}
T=$(seconds "$TIME")

cd "$(dirname "$0")/.."
if [ "$NATIVE" = 0 ]; then
  if [ -n "${TETHER_BIN:-}" ]; then B=$TETHER_BIN; else cargo build --release -q -p tether || exit 2; B=$PWD/target/release/tether; fi
fi

work=$(mktemp -d /tmp/tether-stress.XXXXXX)
logs=$work/logs
mkdir -p "$work/export" "$work/mnt" "$logs"
spid= mpid= stpid= probe_pid= failed=0 hung=0 keep_logs=0

# The directory to stress and the one the health probe uses.
if [ "$NATIVE" = 1 ]; then top=$work/export; else top=$work/mnt; fi

mount_minor() { # the FUSE connection number of our mount, from mountinfo (no syscall on it)
  awk -v m="$work/mnt" '$5 == m { split($3, d, ":"); print d[2] }' /proc/self/mountinfo
}

abort_mount() { # unblocks every task waiting on the hung mount (they get ENOTCONN)
  local c; c=$(mount_minor)
  if [ -n "$c" ] && [ -e "/sys/fs/fuse/connections/$c/abort" ]; then
    echo "aborting FUSE connection $c"
    echo 1 >"/sys/fs/fuse/connections/$c/abort"
  elif [ -n "$mpid" ]; then
    # Without fusectl mounted: the kernel aborts the connection when /dev/fuse is closed.
    echo "killing tether mount (pid $mpid) to abort the FUSE connection"
    kill -KILL "$mpid" 2>/dev/null
  fi
}

kill_stress() {
  [ -n "$stpid" ] || return 0
  if kill -0 "$stpid" 2>/dev/null; then
    kill -TERM -- "-$stpid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$stpid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$stpid" 2>/dev/null
  fi
  wait "$stpid" 2>/dev/null
  stpid=
}

cleanup() {
  trap - EXIT INT TERM
  # Tasks blocked in a hung mount cannot be killed until its connection is aborted.
  if [ "$hung" = 1 ]; then abort_mount; fi
  kill_stress
  if [ -n "$mpid" ]; then
    # SIGTERM: the client unmounts and exits; a mount still there after 10 s is detached.
    kill -TERM "$mpid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$mpid" 2>/dev/null || break; sleep 0.1; done
    if mountpoint -q "$work/mnt"; then "$B" unmount --lazy "$work/mnt" 2>/dev/null; fi
    kill -KILL "$mpid" 2>/dev/null
    wait "$mpid" 2>/dev/null
  fi
  if [ -n "$spid" ]; then
    kill -TERM "$spid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
  fi
  if [ "$keep_logs" = 1 ]; then
    local kept; kept=$(mktemp -d /tmp/tether-stress-logs.XXXXXX)
    cp -a "$logs/." "$kept/"
    echo "logs kept in $kept"
  fi
  if mountpoint -q "$work/mnt"; then
    echo "WARNING: $work/mnt is still mounted; not removing $work" >&2
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM

show_logs() {
  if [ "$NATIVE" = 0 ]; then
    echo "== tail of the server log ($logs/serve.log)"; tail -n 40 "$logs/serve.log"
    echo "== tail of the client log ($logs/mount.log), without fuser's warnings about ioctl"
    awk '/WARN fuser: \[Not Implemented\] ioctl/ {skip = 3} skip > 0 {skip--; next} {print}' \
      "$logs/mount.log" | tail -n 40
  fi
}

dump_hang() {
  local t p
  echo "== blocked tasks of the run (stress-ng's session, the health probe) and their kernel stacks"
  for p in $(pgrep -s "$stpid") $probe_pid; do
    for t in /proc/"$p"/task/*; do
      case $(awk '/^State:/ {print $2}' "$t/status" 2>/dev/null) in
        D|S) echo "--- pid ${t##*/} $(cat "$t/comm" 2>/dev/null) ($(awk '/^State:/ {print $2}' "$t/status"))"
             grep -v entry_SYSCALL "$t/stack" 2>/dev/null ;;
      esac
    done
  done
  if [ "$NATIVE" = 0 ]; then
    for p in "$mpid" "$spid"; do
      echo "== kernel stacks of $(tr '\0' ' ' <"/proc/$p/cmdline" | cut -c1-100) (pid $p)"
      for t in /proc/"$p"/task/*; do
        echo "--- ${t##*/} $(cat "$t/comm") ($(awk '/^State:/ {print $2}' "$t/status"))"
        grep -v entry_SYSCALL "$t/stack"
      done
      if command -v gdb >/dev/null; then
        echo "== user stacks (gdb)"
        timeout 60 gdb -p "$p" -batch -ex 'thread apply all bt' 2>/dev/null |
          grep -E '^(Thread|#)' | grep -vE 'std::(sys|panic|thread)|core::ops|alloc::boxed|start_thread|clone3' | cut -c1-220
      fi
    done
    local w=/sys/fs/fuse/connections/$(mount_minor)/waiting
    [ -e "$w" ] && echo "== FUSE connection $(mount_minor): $(cat "$w") requests waiting"
  fi
}

# Lists, writes and reads back a file in $top/probe; true if that finishes within $1
# seconds. A hung mount may leave the probe unkillable, so it is waited for by polling.
probe() {
  local limit=$1 p i
  (
    set -e
    mkdir -p "$top/probe"
    ls "$top" >/dev/null
    echo "probe $$" >"$top/probe/file"
    [ "$(cat "$top/probe/file")" = "probe $$" ]
    rm "$top/probe/file"
  ) >"$logs/probe.out" 2>&1 &
  p=$! probe_pid=$!
  for ((i = 0; i < limit * 10; i++)); do
    if ! kill -0 "$p" 2>/dev/null; then
      wait "$p" && return 0
      echo "the health probe failed: $(cat "$logs/probe.out")"
      return 1
    fi
    sleep 0.1
  done
  echo "the health probe did not finish in $limit s: the mount hangs"
  return 2
}

alive() { # the server and client are still running
  [ "$NATIVE" = 1 ] && return 0
  kill -0 "$spid" 2>/dev/null || { echo "tether serve died"; return 1; }
  kill -0 "$mpid" 2>/dev/null || { echo "tether mount died"; return 1; }
}

if [ "$NATIVE" = 0 ]; then
  "$B" serve "$work/export" --listen "unix:$work/s.sock" 2>"$logs/serve.log" &
  spid=$!
  for _ in $(seq 100); do [ -S "$work/s.sock" ] && break; sleep 0.1; done
  "$B" mount "unix:$work/s.sock" "$work/mnt" ${THREADS:+--threads "$THREADS"} 2>"$logs/mount.log" &
  mpid=$!
  for _ in $(seq 100); do mountpoint -q "$work/mnt" && break; sleep 0.1; done
  if ! mountpoint -q "$work/mnt"; then
    echo "the mount did not come up"; show_logs; exit 1
  fi
fi

# stress-ng's working directory, and a populated one for fstat (which defaults to /dev).
mkdir -p "$top/stress" "$top/fstat/sub"
for i in $(seq 64); do echo "$i" >"$top/fstat/f$i"; ln -s "f$i" "$top/fstat/l$i"; done
mkfifo "$top/fstat/fifo"

OPTS=(--temp-path "$top/stress" --timeout "$TIME" --metrics-brief --verify
  --fstat-dir "$top/fstat"
  --hdd-bytes 128M --iomix-bytes 64M --fallocate-bytes 64M --readahead-bytes 64M
  --sync-file-bytes 64M --seek-size 64M --fiemap-bytes 16M --copy-file-bytes 128M
  --mmap-file --mmap-bytes 16M --msync-bytes 16M)

echo "stress-ng $(stress-ng --version | awk '{print $3}'), $(nproc) cores, $(uname -r)"
if [ "$NATIVE" = 1 ]; then
  echo "target: native directory $top (/tmp: $(findmnt -no FSTYPE -T /tmp))"
else
  if [ -n "${TETHER_BIN:-}" ]; then built="binary $B"; else built="built from $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo ' + uncommitted changes')"; fi
  echo "target: tether mount $top (threads: ${THREADS:-default}; $built)"
fi

# Runs stress-ng with ARGS... in its own session, waiting at most $1 seconds and probing
# the mount every 30 s. Sets rc (stress-ng's status, 124 on a hang) and hung.
run_stress() {
  local limit=$1 out=$2 start now next_probe pr
  shift 2
  echo "+ stress-ng $* ${OPTS[*]}" >"$out"
  # Some stressors reach every mount on the machine (fanotify marks them all): run
  # stress-ng in a private mount namespace without the other FUSE mounts, so that nobody
  # else's mount is touched (or, if it hangs, blocks the run).
  local others
  others=$(awk -v m="$work/mnt" '$3 ~ /^fuse/ && $2 != m {print $2}' /proc/mounts)
  # Its working directory is ours too: some stressors leave files in it.
  setsid unshare --mount --propagation private -- sh -c \
    'cd "$1"; shift; while [ "$1" != -- ]; do umount -l "$(printf "%b" "$1")" 2>/dev/null; shift; done
     shift; exec stress-ng "$@"' \
    sh "$work" $others -- "$@" "${OPTS[@]}" >>"$out" 2>&1 &
  stpid=$!
  start=$(date +%s) next_probe=$((start + 30))
  while kill -0 "$stpid" 2>/dev/null; do
    sleep 0.5
    now=$(date +%s)
    if ((now - start > limit)); then
      echo "stress-ng did not finish within $limit s"
      hung=1
      break
    fi
    if ((now >= next_probe)); then
      next_probe=$((now + 30))
      alive || { rc=125; return; }
      probe 60; pr=$?
      if [ "$pr" = 2 ]; then hung=1; break; fi
    fi
  done
  if [ "$hung" = 1 ]; then
    rc=124
    keep_logs=1
    dump_hang 2>&1 | tee "$logs/hang.txt"
    return
  fi
  wait "$stpid"
  rc=$?
  stpid=
}

# Names of the stressors that failed, from stress-ng's output.
failed_in() {
  sed -nE 's/^stress-ng: fail: +\[[0-9]+\] ([a-z0-9-]+):.*/\1/p;
           s/.*process \[[0-9]+\] \(([a-z0-9-]+)\) terminated with an error.*/\1/p' "$1" | sort -u
}
skipped_in() {
  sed -nE 's/^stress-ng: [a-z]+: +\[[0-9]+\] ([a-z0-9-]+): .*skipping.*/\1/p' "$1" | sort -u
}
bogo_of() { # bogo ops of stressor $2 in output $1
  awk -v s="$2" '$2 == "metrc:" && $4 == s && $5 ~ /^[0-9]+$/ { print $5; exit }' "$1"
}

margin=$((T / 2 > 240 ? T / 2 : 240))
if [ "$EACH" = 1 ]; then
  printf '%-12s %-7s %12s  %s\n' stressor verdict "bogo ops" note
  declare -A verdicts=()
  for s in "${STRESSORS[@]}"; do
    out=$logs/$s.out
    run_stress $((T + margin)) "$out" --"$s" "$WORKERS"
    note=
    if [ "$rc" = 124 ]; then
      v=HANG
    elif [ "$rc" = 125 ]; then
      v=DIED
    elif [ -n "$(failed_in "$out")" ] || { [ "$rc" != 0 ] && [ "$rc" != 3 ] && [ "$rc" != 4 ]; }; then
      v=FAIL note="rc $rc: $(grep -m1 -E '(fail|error):' "$out" | sed -E 's/^stress-ng: [a-z]+: +\[[0-9]+\] //' | cut -c1-110)"
    elif [ -n "$(skipped_in "$out")" ] || [ "$rc" = 3 ] || [ "$rc" = 4 ]; then
      v=SKIP note=$(grep -m1 -E 'skipping|not implemented|not supported' "$out" | sed -E 's/^stress-ng: [a-z]+: +\[[0-9]+\] //' | cut -c1-110)
    else
      v=PASS
    fi
    if [ "$v" != HANG ] && [ "$v" != DIED ]; then
      if ! alive; then v=DIED; else probe 60; pr=$?; [ "$pr" = 2 ] && { hung=1; v=HANG; }; [ "$pr" = 1 ] && v=BROKE; fi
    fi
    verdicts[$s]=$v
    printf '%-12s %-7s %12s  %s\n' "$s" "$v" "$(bogo_of "$out" "$s")" "$note"
    [ "$v" = PASS ] || [ "$v" = SKIP ] || { failed=1; keep_logs=1; }
    [ "$v" = HANG ] || [ "$v" = DIED ] || [ "$v" = BROKE ] && { echo "stopping: the mount is unusable"; break; }
  done
  echo "pass: $(for s in "${!verdicts[@]}"; do [ "${verdicts[$s]}" = PASS ] && echo "$s"; done | sort | tr '\n' ' ')"
  echo "skip: $(for s in "${!verdicts[@]}"; do [ "${verdicts[$s]}" = SKIP ] && echo "$s"; done | sort | tr '\n' ' ')"
  echo "fail: $(for s in "${!verdicts[@]}"; do case ${verdicts[$s]} in PASS|SKIP) ;; *) echo "$s(${verdicts[$s]})" ;; esac; done | sort | tr '\n' ' ')"
else
  out=$logs/stress.out
  args=()
  for s in "${STRESSORS[@]}"; do args+=(--"$s" "$WORKERS"); done
  echo "running ${#STRESSORS[@]} stressors x $WORKERS workers at once for $TIME"
  started=$(date +%s)
  run_stress $((T + margin)) "$out" "${args[@]}"
  echo "stress-ng ended after $(( $(date +%s) - started )) s with status $rc"
  sed -nE '/metrc:/ s/^stress-ng: metrc: \[[0-9]+\] //p' "$out"
  f=$(failed_in "$out" | tr '\n' ' ') sk=$(skipped_in "$out" | tr '\n' ' ')
  [ -n "$sk" ] && echo "skipped: $sk"
  if [ -n "$f" ] || [ "$rc" != 0 ]; then
    echo "FAILED stressors: ${f:-none named} (stress-ng status $rc)"
    grep -E '(fail|error):' "$out" | head -40
    failed=1
  fi
  if [ "$hung" = 0 ] && [ "$rc" != 125 ]; then
    alive || failed=1
    probe 60; pr=$?
    [ "$pr" = 2 ] && hung=1
    [ "$pr" = 0 ] || failed=1
  fi
fi

if [ "$NATIVE" = 0 ] && grep -qE 'panicked|RUST_BACKTRACE' "$logs/serve.log" "$logs/mount.log"; then
  echo "a panic in the logs:"; grep -hE -A3 'panicked' "$logs/serve.log" "$logs/mount.log" | head -20
  failed=1
fi
if [ "$failed" = 1 ]; then
  keep_logs=1
  show_logs
  echo "RESULT: FAILED"
  exit 1
fi
echo "RESULT: passed"
