#!/usr/bin/env bash
# A build across server restarts: `make -j2` of a small C project in a Tether mount, three
# times without restarts and three times while the server is restarted (SIGTERM, start
# again) every INTERVAL seconds. Prints the build times, how many restarts each build
# spanned, and how long the client took to reconnect (from its log).
#
#   ./bench/restart.sh [INTERVAL] [FILES]      (defaults: 0.5 s, 200 source files)
set -euo pipefail
cd "$(dirname "$0")/.."
INTERVAL=${1:-0.5}
FILES=${2:-200}
./scripts/install-deps.sh >/dev/null
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -q -p tether
T=$PWD/target/release/tether

work=$(mktemp -d /tmp/tether-restart.XXXXXX)
mkdir "$work/export" "$work/mnt"
sock="$work/s.sock"
server_pid=""
mount_pid=""
start_server() {
  "$T" serve "$work/export" --listen "unix:$sock" 2>>"$work/serve.log" &
  server_pid=$!
  for _ in $(seq 200); do [ -S "$sock" ] && return; sleep 0.01; done
  echo "server did not start" >&2; exit 1
}
stop_server() {
  [ -n "$server_pid" ] && kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  server_pid=""
}
cleanup() {
  if [ -n "$mount_pid" ]; then
    kill -INT "$mount_pid" 2>/dev/null || true
    wait "$mount_pid" 2>/dev/null || true
  fi
  mountpoint -q "$work/mnt" && umount -l "$work/mnt" || true
  stop_server
  rm -rf "$work"
}
trap cleanup EXIT

start_server
"$T" mount "unix:$sock" "$work/mnt" 2>"$work/mount.log" &
mount_pid=$!
for _ in $(seq 200); do mountpoint -q "$work/mnt" && break; sleep 0.01; done

proj="$work/mnt/proj"
mkdir -p "$proj/src"
{
  echo '#include <stdio.h>'
  for i in $(seq 0 $((FILES - 1))); do echo "int f$i(void);"; done
  echo 'int main(void) { long s = 0;'
  for i in $(seq 0 $((FILES - 1))); do echo "s += f$i();"; done
  echo 'printf("%ld\n", s); return 0; }'
} >"$proj/src/main.c"
for i in $(seq 0 $((FILES - 1))); do echo "int f$i(void) { return $i; }" >"$proj/src/f$i.c"; done
printf 'SRCS := $(wildcard src/*.c)\nOBJS := $(SRCS:src/%%.c=out/%%.o)\nprog: $(OBJS)\n\tcc -o $@ $^\nout/%%.o: src/%%.c | out\n\tcc -c -o $@ $<\nout:\n\tmkdir -p out\n' >"$proj/Makefile"
want=$(( (FILES - 1) * FILES / 2 ))

build() {
  rm -rf "$proj/out" "$proj/prog"
  local t0 t1
  t0=$(date +%s.%N)
  make -C "$proj" -j2 -s >/dev/null
  t1=$(date +%s.%N)
  [ "$("$proj/prog")" = "$want" ] || { echo "wrong program output" >&2; exit 1; }
  echo "$t1 - $t0" | bc
}

echo "machine: $(nproc) cores, $(uname -r); commit $(git rev-parse --short HEAD); $(date -u +%F)"
echo "make -j2 of $FILES C files in the mount"
for run in 1 2 3; do echo "  no restarts:            $(build) s"; done
for run in 1 2 3; do
  before=$(grep -c "reconnected after" "$work/mount.log" || true)
  # The build runs in the background; the server restarts here until it ends.
  ( build >"$work/build.time" ) &
  builder=$!
  n=0
  while kill -0 "$builder" 2>/dev/null; do
    sleep "$INTERVAL"
    kill -0 "$builder" 2>/dev/null || break
    stop_server; start_server; n=$((n + 1))
  done
  wait "$builder"
  after=$(grep -c "reconnected after" "$work/mount.log" || true)
  echo "  restart every ${INTERVAL} s: $(cat "$work/build.time") s ($n restarts, $((after - before)) reconnects)"
done
echo "reconnect times (s), from the client's log:"
grep -o "reconnected after [0-9.]* s" "$work/mount.log" | awk '{print $3}' | sort -n |
  awk '{a[NR]=$1} END {if (NR) printf "  n=%d  median %.2f  max %.2f\n", NR, a[int((NR+1)/2)], a[NR]}'
grep -o "[0-9]* request(s) .*failed with EIO" "$work/mount.log" | sort | uniq -c || echo "  no request failed"
