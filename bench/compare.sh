#!/usr/bin/env bash
# Compares Tether with the alternatives on this machine and writes its report into
# docs/benchmarks.md (between the report markers; the rest of the page is kept) and
# docs/benchmarks.svg:
#
#   native       a plain directory (the baseline every ratio is relative to)
#   tether-unix  tether serve + tether mount over a Unix socket
#   tether-tcp   the same over TCP on 127.0.0.1
#   sshfs        sshfs to a private sshd on 127.0.0.1 (generated keys, own config)
#   tether-ssh   tether mount ssh:... through the same sshd (tether serve --stdio there)
#   bindfs       bindfs: a plain FUSE passthrough, the floor of FUSE overhead
#
# Each one serves its own directory under /var/tmp/tether-compare.*, so they never share
# files or caches of the same inodes. Runs `tether bench` (all five, interleaved) and
# `tether latency` (tether-unix, sshfs, bindfs). Run as root on Debian; installs what is
# missing with apt-get. Everything it starts, mounts or creates is removed on exit, also
# on Ctrl-C or SIGTERM.
#
#   bench/compare.sh            full sizes (10-30 minutes)
#   bench/compare.sh --quick    about a tenth of the sizes, for a quick check
set -euo pipefail

quick=()
runs=3
trials=300
for arg in "$@"; do
  case "$arg" in
    --quick) quick=(--quick); runs=1; trials=50 ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "compare.sh: run as root (FUSE mounts, sshd, dropping caches)" >&2; exit 1; }
cd "$(dirname "$0")/.."
repo=$PWD
export PATH="$HOME/.cargo/bin:$PATH"

base= child= sshd_pid= made_run_sshd= made_policy=
pids=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  # A running bench or latency cleans up its own working directories on SIGTERM.
  if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; fi
  if [ -n "$base" ]; then
    for m in "$base"/mnt/*; do
      [ -d "$m" ] || continue
      if mountpoint -q "$m"; then
        fusermount3 -u "$m" 2>/dev/null || umount "$m" 2>/dev/null || umount -l "$m"
      fi
    done
  fi
  for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  [ -n "$sshd_pid" ] && { kill "$sshd_pid" 2>/dev/null; wait "$sshd_pid" 2>/dev/null; }
  [ -n "$made_run_sshd" ] && rmdir /run/sshd 2>/dev/null
  [ -n "$made_policy" ] && rm -f /usr/sbin/policy-rc.d
  [ -n "$base" ] && rm -rf "$base"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Runs a command in the background and waits, so a signal interrupts the wait at once.
run() {
  "$@" &
  child=$!
  local rc=0
  wait "$child" || rc=$?
  child=
  return "$rc"
}

say() { printf '\n== %s\n' "$*" >&2; }

# 1. Packages.
need=()
command -v cc >/dev/null || need+=(build-essential)
command -v make >/dev/null || need+=(make)
command -v git >/dev/null || need+=(git)
command -v fusermount3 >/dev/null || need+=(fuse3)
command -v sshfs >/dev/null || need+=(sshfs)
command -v bindfs >/dev/null || need+=(bindfs)
command -v ssh >/dev/null || need+=(openssh-client)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
if [ ${#need[@]} -gt 0 ]; then
  say "installing: ${need[*]}"
  # Keep the package from starting the system's sshd (we start our own on 127.0.0.1).
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    made_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
  [ -n "$made_policy" ] && rm -f /usr/sbin/policy-rc.d && made_policy=
fi
[ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true
# The same, generous open-file limit for every server and mount (a 10,000-file tree plus
# its git objects is more than some defaults allow); recorded in the report.
nofile_default=$(ulimit -n)
ulimit -n "$(cat /proc/sys/fs/nr_open 2>/dev/null || echo 1048576)" 2>/dev/null \
  || ulimit -n "$(ulimit -Hn)"
nofile=$(ulimit -n)

# 2. Build.
say "cargo build --release -p tether"
cargo build --release -p tether --quiet
tether=$repo/target/release/tether
# Before this run rewrites docs/benchmarks.*, so "-dirty" means the source really differs.
tether_v="$("$tether" --version 2>&1 | head -1) ($(git -C "$repo" describe --always --dirty 2>/dev/null || echo unknown))"

# 3. The directories: one export per setup, one mount point per mount.
base=$(mktemp -d /var/tmp/tether-compare.XXXXXX)
mkdir -p "$base"/{native,export-unix,export-tcp,export-sshfs,export-ssh,export-bindfs,logs,out,ssh} \
  "$base"/mnt/{tether-unix,tether-tcp,sshfs,tether-ssh,bindfs}
chmod 700 "$base/ssh"
mnt=$base/mnt
logs=$base/logs
out=$base/out

wait_mounted() {
  for _ in $(seq 100); do mountpoint -q "$1" && return 0; sleep 0.1; done
  return 1
}

free_port() {
  local p
  for p in $(shuf -i 20000-60000 -n 50); do
    if [ -z "$(ss -Htln "sport = :$p")" ]; then echo "$p"; return 0; fi
  done
  return 1
}

failed=()   # setups that could not be brought up, with the reason
vs=(--vs "$base/native")

# 4. Tether over a Unix socket and over TCP loopback.
say "tether serve + mount (unix socket, tcp loopback)"
"$tether" serve "$base/export-unix" --listen "unix:$base/tether.sock" 2>"$logs/serve-unix.log" &
serve_unix=$!
pids+=($!)
for _ in $(seq 100); do [ -S "$base/tether.sock" ] && break; sleep 0.05; done
"$tether" mount "unix:$base/tether.sock" "$mnt/tether-unix" 2>"$logs/mount-unix.log" &
pids+=($!)
wait_mounted "$mnt/tether-unix" || { cat "$logs"/*-unix.log >&2; echo "tether (unix) did not mount" >&2; exit 1; }

"$tether" serve "$base/export-tcp" --listen tcp:127.0.0.1:0 2>"$logs/serve-tcp.log" &
serve_tcp=$!
pids+=($!)
tcp_addr=
for _ in $(seq 100); do
  tcp_addr=$(grep -o 'on tcp:127\.0\.0\.1:[0-9]*' "$logs/serve-tcp.log" | sed 's/^on //' || true)
  [ -n "$tcp_addr" ] && break
  sleep 0.05
done
[ -n "$tcp_addr" ] || { cat "$logs/serve-tcp.log" >&2; echo "tether (tcp) did not start" >&2; exit 1; }
"$tether" mount "$tcp_addr" "$mnt/tether-tcp" 2>"$logs/mount-tcp.log" &
pids+=($!)
wait_mounted "$mnt/tether-tcp" || { cat "$logs"/*-tcp.log >&2; echo "tether (tcp) did not mount" >&2; exit 1; }
vs+=(--vs "$mnt/tether-tcp")

# 5. sshfs through a private sshd on 127.0.0.1.
say "private sshd on 127.0.0.1 + sshfs"
ssh_ok=
setup_sshfs() {
  local d=$base/ssh port
  ssh-keygen -q -t ed25519 -N '' -C tether-compare-host -f "$d/host_key" || return 1
  ssh-keygen -q -t ed25519 -N '' -C tether-compare-client -f "$d/client_key" || return 1
  cp "$d/client_key.pub" "$d/authorized_keys"
  port=$(free_port) || { echo "no free port" >&2; return 1; }
  # sshd refuses a locked account (password field starting with '!') unless PAM decides.
  local pam=no
  case "$(getent shadow root | cut -d: -f2)" in '!'*) pam=yes ;; esac
  cat > "$d/sshd_config" <<EOF
Port $port
ListenAddress 127.0.0.1
HostKey $d/host_key
PidFile $d/sshd.pid
AuthorizedKeysFile $d/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM $pam
StrictModes no
Subsystem sftp internal-sftp
EOF
  cat > "$d/ssh_config" <<EOF
Host tether-compare
  HostName 127.0.0.1
  Port $port
  User root
  IdentityFile $d/client_key
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  GlobalKnownHostsFile /dev/null
  BatchMode yes
  LogLevel ERROR
EOF
  if [ ! -d /run/sshd ]; then mkdir -p /run/sshd && chmod 755 /run/sshd && made_run_sshd=1; fi
  /usr/sbin/sshd -t -f "$d/sshd_config" || return 1
  /usr/sbin/sshd -D -e -f "$d/sshd_config" 2>"$logs/sshd.log" &
  sshd_pid=$!
  for _ in $(seq 100); do [ -n "$(ss -Htln "sport = :$port")" ] && break; sleep 0.05; done
  ssh -F "$d/ssh_config" tether-compare true || { cat "$logs/sshd.log" >&2; return 1; }
  sshfs -F "$d/ssh_config" "tether-compare:$base/export-sshfs" "$mnt/sshfs" 2>"$logs/sshfs.log" || {
    cat "$logs/sshfs.log" >&2; return 1; }
  wait_mounted "$mnt/sshfs"
}
if setup_sshfs; then
  ssh_ok=1
  vs+=(--vs "$mnt/sshfs")
else
  failed+=("sshfs: could not be set up (see the log above; sshd log: $(tail -3 "$logs/sshd.log" 2>/dev/null | tr '\n' ' '))")
  echo "compare.sh: sshfs setup failed; continuing without it" >&2
fi
# Tether through the same sshd: the client starts `tether serve --stdio` over ssh.
if [ -n "$ssh_ok" ]; then
  "$tether" mount "ssh:tether-compare:$base/export-ssh" "$mnt/tether-ssh" \
    --ssh-command "ssh -F $base/ssh/ssh_config" --remote-tether "$tether" 2>"$logs/mount-ssh.log" &
  pids+=($!)
  if wait_mounted "$mnt/tether-ssh"; then
    vs+=(--vs "$mnt/tether-ssh")
  else
    failed+=("tether-ssh: $(tail -3 "$logs/mount-ssh.log" | tr '\n' ' ')")
  fi
fi

# 6. bindfs.
say "bindfs"
bindfs_ok=
if bindfs "$base/export-bindfs" "$mnt/bindfs" 2>"$logs/bindfs.log" && wait_mounted "$mnt/bindfs"; then
  bindfs_ok=1
  vs+=(--vs "$mnt/bindfs")
else
  failed+=("bindfs: $(cat "$logs/bindfs.log")")
fi

# 7. The workloads.
bench_cmd=("$tether" bench "$mnt/tether-unix" "${vs[@]}" "${quick[@]}" --runs "$runs"
  --json "$out/bench.json" --plot "$repo/docs/benchmarks.svg")
say "${bench_cmd[*]}"
# How fast this machine creates files right now (1,000 empty files in the base directory):
# on shared virtual machines this varies over time, and it moves every create-heavy number.
probe() {
  local d=$base/probe t0 t1
  mkdir "$d"
  t0=$(date +%s%N)
  for i in $(seq 1000); do : > "$d/p$i"; done
  t1=$(date +%s%N)
  rm -rf "$d"
  echo "$(( (t1 - t0) / 1000000 )) ms"
}
probe_start=$(probe)
started=$(date -u '+%Y-%m-%d %H:%M UTC')
load_start=$(cut -d" " -f1-3 /proc/loadavg)
bench_rc=0
run "${bench_cmd[@]}" > "$out/bench.txt" || bench_rc=$?
cat "$out/bench.txt"
probe_end=$(probe)
fds() { { find "/proc/$1/fd" -mindepth 1 -maxdepth 1 2>/dev/null || true; } | wc -l; }
fds_after="tether-unix server: $(fds "$serve_unix"), tether-tcp server: $(fds "$serve_tcp")"
cp "$out/bench.json" "$repo/docs/benchmarks.json" 2>/dev/null || true

# 8. Coherence latency: change in the export, poll through the mount.
lat_cmds=()
lat_targets=("tether-unix:$base/export-unix:$mnt/tether-unix")
[ -n "$ssh_ok" ] && lat_targets+=("sshfs:$base/export-sshfs:$mnt/sshfs")
[ -n "$bindfs_ok" ] && lat_targets+=("bindfs:$base/export-bindfs:$mnt/bindfs")
for t in "${lat_targets[@]}"; do
  IFS=: read -r name host mount <<<"$t"
  cmd=("$tether" latency --host "$host" --mount "$mount" --trials "$trials" --timeout 5
    --json "$out/latency-$name.json")
  lat_cmds+=("${cmd[*]}")
  say "${cmd[*]}"
  rc=0
  run "${cmd[@]}" > "$out/latency-$name.txt" || rc=$?
  [ "$rc" = 0 ] || echo "(tether latency exited with status $rc)" >> "$out/latency-$name.txt"
  cat "$out/latency-$name.txt"
done
finished=$(date -u '+%Y-%m-%d %H:%M UTC')
load_end=$(cut -d" " -f1-3 /proc/loadavg)

# 9. docs/benchmarks.md.
first() { { "$@" 2>&1 || true; } | head -1 || true; }
sshfs_v=$(sshfs --version 2>&1 | grep -i 'sshfs version' | head -1 || true)
ssh_v=$(first ssh -V)
bindfs_v=$(first bindfs --version)
mem=$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //' || true)
md=$repo/docs/benchmarks.md
# The report goes between the page's markers; the rest of the page (summary, how to
# measure, journal link) is written by hand and kept. Notes added by hand inside the old
# report described the run this one replaces, and go (they belong in bench/journal/).
report=$out/report.md
begin='<!-- bench/compare.sh report: begin -->'
end='<!-- bench/compare.sh report: end -->'
{
  echo
  echo "Generated by \`bench/compare.sh${quick:+ --quick}\` from $started to $finished; rerun it to"
  echo "refresh this report (it replaces what stands between the markers in"
  echo "\`docs/benchmarks.md\`, and overwrites \`docs/benchmarks.svg\` and \`docs/benchmarks.json\`)."
  echo "Everything runs on one machine: the \"host\" and the \"guest\" are the same kernel, so"
  echo "these numbers show protocol and FUSE overhead, not a virtual machine's network."
  echo
  echo "### Machine"
  echo
  echo "- CPUs: $(nproc) (${cpu:-unknown model})"
  echo "- memory: $mem"
  echo "- kernel: $(uname -r); Debian $(cat /etc/debian_version 2>/dev/null || echo '?')"
  echo "- tether: $tether_v"
  echo "- sshfs: ${sshfs_v:-not installed}; ${ssh_v}"
  echo "- bindfs: ${bindfs_v:-not installed}"
  echo "- $(first gcc --version), $(first make --version), $(first git --version)"
  echo "- load average (1, 5, 15 min) when the bench started: $load_start; when it ended: $load_end"
  echo "- creating 1,000 empty files in the base directory (a probe of the machine's state) took $probe_start before the bench and $probe_end after it"
  echo "- open-file limit (\`ulimit -n\`) for every server and mount: $nofile (the shell's was $nofile_default)"
  echo
  echo "### Setups"
  echo
  echo "| label | what | mounted with |"
  echo "|---|---|---|"
  echo "| native | a plain directory on the same file system as the exports (the baseline) | - |"
  echo "| tether-unix | Tether over a Unix socket, default options | \`tether serve EXPORT --listen unix:SOCK\`; \`tether mount unix:SOCK MNT\` |"
  echo "| tether-tcp | Tether over TCP loopback, default options | \`tether serve EXPORT --listen tcp:127.0.0.1:0\`; \`tether mount $tcp_addr MNT\` |"
  echo "| sshfs | sshfs (SFTP) to a private sshd on 127.0.0.1, default sshfs options | \`sshfs -F CONFIG tether-compare:EXPORT MNT\` |"
  echo "| tether-ssh | Tether through the same sshd (the client runs \`tether serve --stdio EXPORT\` there), default options | \`tether mount ssh:tether-compare:EXPORT MNT --ssh-command \"ssh -F CONFIG\"\` |"
  echo "| bindfs | bindfs passthrough, default options: the floor of FUSE overhead | \`bindfs EXPORT MNT\` |"
  echo
  echo "Each setup has its own export directory under \`/var/tmp/tether-compare.*\` (ext4 here)."
  if [ ${#failed[@]} -gt 0 ]; then
    echo
    echo "**Not measured:**"
    for f in "${failed[@]}"; do echo "- $f"; done
  fi
  echo
  echo "### Workloads"
  echo
  echo "![time relative to native, log scale](benchmarks.svg)"
  echo
  echo "\`\`\`"
  echo "${bench_cmd[*]}" | sed "s#$base#\$BASE#g; s#$repo/##g"
  echo "\`\`\`"
  echo
  echo "Medians of $runs run(s); each run goes through every workload and, within a workload,"
  echo "every directory in turn, so drift hits all alike. Lower is better; the ratio columns"
  echo "divide by native. \`*_cold\` workloads run \`sync; echo 3 > /proc/sys/vm/drop_caches\`"
  echo "first, which on one machine empties the host's caches as well as the guest's."
  [ "$bench_rc" = 0 ] || echo "\`tether bench\` exited with status $bench_rc (failed steps are listed under the table)."
  echo
  echo "\`\`\`"
  sed "s#$base#\$BASE#g" "$out/bench.txt"
  echo "\`\`\`"
  echo
  echo "Open descriptors held by the Tether servers after the bench: $fds_after."
  echo
  echo "### Coherence latency"
  echo
  echo "How long a change made in the export takes to show through the mount: each trial"
  echo "makes one change on the host side, then polls the mount every ~75 us until it shows."
  echo "A kind that stays invisible for 5 s three times in a row is given up."
  for i in "${!lat_targets[@]}"; do
    IFS=: read -r name _ _ <<<"${lat_targets[$i]}"
    echo
    echo "#### $name"
    echo
    echo "\`\`\`"
    echo "${lat_cmds[$i]}" | sed "s#$base#\$BASE#g; s#$repo/##g"
    echo
    sed "s#$base#\$BASE#g" "$out/latency-$name.txt"
    echo "\`\`\`"
  done
  echo
} > "$report"
if [ -f "$md" ] && grep -qF "$begin" "$md" && grep -qF "$end" "$md"; then
  awk -v begin="$begin" -v end="$end" -v report="$report" '
    $0 == begin { print; while ((getline line < report) > 0) print line; skip = 1; next }
    $0 == end { skip = 0 }
    !skip' "$md" > "$md.new" && mv "$md.new" "$md"
else
  { echo "# Benchmarks"; echo; echo "$begin"; cat "$report"; echo "$end"; } > "$md"
fi
say "wrote docs/benchmarks.md, docs/benchmarks.svg and docs/benchmarks.json"
exit "$bench_rc"
