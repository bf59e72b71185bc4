#!/usr/bin/env bash
# Builds Tether, serves a sample folder over a Unix socket, mounts it, shows edits crossing
# in both directions, and unmounts. Run as root on Debian.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --quiet
tether=$PWD/target/release/tether

demo=$(mktemp -d /tmp/tether-demo.XXXXXX)
mkdir -p "$demo/host" "$demo/guest"
server= client=
cleanup() {
  [ -n "$client" ] && kill -INT "$client" 2>/dev/null && wait "$client" 2>/dev/null
  mountpoint -q "$demo/guest" && "$tether" unmount --lazy "$demo/guest"
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$demo"
}
trap cleanup EXIT

printf 'int main(void) { return 0; }\n' > "$demo/host/main.c"
printf 'all: main\n' > "$demo/host/Makefile"
mkdir "$demo/host/docs" && echo "hello from the host" > "$demo/host/docs/README"

echo "== host: tether serve $demo/host --listen unix:$demo/tether.sock"
"$tether" serve "$demo/host" --listen "unix:$demo/tether.sock" 2>"$demo/serve.log" &
server=$!
for _ in $(seq 100); do [ -S "$demo/tether.sock" ] && break; sleep 0.05; done

echo "== guest: tether mount unix:$demo/tether.sock $demo/guest"
"$tether" mount "unix:$demo/tether.sock" "$demo/guest" 2>"$demo/mount.log" &
client=$!
for _ in $(seq 100); do mountpoint -q "$demo/guest" && break; sleep 0.05; done
mountpoint -q "$demo/guest" || { cat "$demo/mount.log"; exit 1; }

echo "== guest sees the host's files:"
ls -l "$demo/guest"
cat "$demo/guest/docs/README"
echo "== guest builds in the shared folder:"
(cd "$demo/guest" && make -s && ls -l main)
echo "== host sees the guest's build output:"
ls -l "$demo/host/main"
echo "== host edits, guest reads:"
echo "edited on the host" > "$demo/host/docs/README"
# The server pushes an invalidation as the host changes the file: no timeout to wait out.
for _ in $(seq 200); do
  grep -q "edited on the host" "$demo/guest/docs/README" && break
  sleep 0.01
done
cat "$demo/guest/docs/README"
echo "== unmount"
kill -INT "$client"; wait "$client"; client=
mountpoint -q "$demo/guest" && { echo "still mounted!"; exit 1; }
echo "demo finished: mounted, built, edited both ways, unmounted"
