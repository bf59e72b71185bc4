#!/bin/sh
# Runs in the bench guest (bench/vm.sh), as root in the Debian root file system: mounts
# the guest's own disk and every shared folder, then measures (parts from /tether-vm/env):
#   rtt        tether check --ping over vsock and TCP; 4 KiB written-through writes (dd) on each
#   coherence  a host edit after a warm read: time until the guest sees it (coherence.c)
#   bench      tether bench on every file system, interleaved, as JSON between markers
# Output lines bench/vm.sh reads: "== " progress, "RTT ...", "DD4K ...", "COH ...",
# "COHCTL ...", "INFO ...", and the JSON between BEGIN_BENCH_JSON and END_BENCH_JSON.
set -u
. /tether-vm/env
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C
say() { echo "== $(cut -d' ' -f1 /proc/uptime)s $*"; }
ctl=$(ls /dev/vport*p1 2>/dev/null | head -1)
echo "INFO guest_kernel $(uname -r)"
echo "INFO guest_cpus $(nproc) guest_mem_mib $(($(sed -n 's/^MemTotal: *\([0-9]*\).*/\1/p' /proc/meminfo) / 1024))"
echo "INFO guest_cpu $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)"

# --- mounts: NAME -> /mnt/NAME
mounted=
mount_one() { # NAME
    mkdir -p "/mnt/$1"
    case $1 in
        disk) mount -t ext4 /dev/vdb /mnt/disk && mkdir -p /mnt/disk/coherence ;;
        9p-loose) mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose p9loose /mnt/9p-loose ;;
        9p-mmap) mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=mmap p9mmap /mnt/9p-mmap ;;
        virtiofs-auto) mount -t virtiofs vfsauto /mnt/virtiofs-auto ;;
        virtiofs-always) mount -t virtiofs vfsalways /mnt/virtiofs-always ;;
        # shellcheck disable=SC2086 # MOUNT_ARGS is a list
        tether-vsock) env ${GUEST_RUST_LOG:+RUST_LOG=$GUEST_RUST_LOG} tether mount vsock:2:7070 /mnt/tether-vsock \
            --secret-file /tether-vm/secret --background --log /tmp/tether-vsock.log ${MOUNT_ARGS:-} ;;
        # shellcheck disable=SC2086
        tether-tcp) env ${GUEST_RUST_LOG:+RUST_LOG=$GUEST_RUST_LOG} tether mount "$TCP_ADDR" /mnt/tether-tcp \
            --secret-file /tether-vm/secret --background --log /tmp/tether-tcp.log ${MOUNT_ARGS:-} ;;
    esac
}
for fs in $FSLIST; do
    if mount_one "$fs"; then
        mounted="$mounted $fs"
    else
        echo "INFO mount_failed $fs"
        [ -f "/tmp/$fs.log" ] && sed "s/^/$fs log: /" "/tmp/$fs.log"
    fi
done
say "mounted:$mounted"
grep -E ' /mnt/' /proc/mounts | sed 's/^/INFO mount /'

# Every thread's CPU time so far (/proc/PID/task/TID/stat), and the load average.
cpu_snapshot() { # LABEL
    echo "CPUSNAP $1 loadavg $(cat /proc/loadavg) uptime $(cut -d' ' -f1 /proc/uptime)"
    for f in /proc/[0-9]*/task/[0-9]*/stat; do
        read -r l <"$f" 2>/dev/null && echo "CPUSNAP $1 $l"
    done
}
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
ms_now() { echo $(($(date +%s%N) / 1000)); } # microseconds

# --- rtt: PING round trips, then written-through 4 KiB writes with fsync at the end
if has rtt; then
    for t in vsock tcp; do
        case " $mounted " in *" tether-$t "*) ;; *) continue ;; esac
        addr=vsock:2:7070
        [ $t = tcp ] && addr=$TCP_ADDR
        say "rtt: tether check $addr --ping $PINGS"
        out=$(tether check "$addr" --secret-file /tether-vm/secret --ping "$PINGS" 2>&1)
        echo "$out" | sed -n "s/^ping: /RTT $t /p"
        echo "$out" | grep -q '^ping: ' || echo "$out" | sed "s/^/rtt $t: /"
    done
    for fs in $mounted; do
        f=/mnt/$fs/dd4k.$$
        say "rtt: dd 4 KiB x $DD_COUNT on $fs"
        # A first, untimed write makes the file (its creation is not what is measured).
        dd if=/dev/zero of="$f" bs=4k count=1 2>/dev/null
        t0=$(ms_now)
        dd if=/dev/zero of="$f" bs=4k count="$DD_COUNT" conv=notrunc,fsync 2>/dev/null
        t1=$(ms_now)
        echo "DD4K $fs $DD_COUNT $((t1 - t0))"
        rm -f "$f"
    done
fi

# --- coherence
if has coherence && [ -n "$ctl" ]; then
    for fs in $mounted; do
        [ "$fs" = disk ] && continue
        say "coherence: $fs ($TRIALS trials, $TIMEOUT_MS ms timeout)"
        [ -n "${GUEST_RUST_LOG:-}" ] && cpu_snapshot "before $fs"
        /tether-vm/vmbench-coherence "$ctl" "$fs" "/mnt/$fs/coherence/file" "$TRIALS" "$TIMEOUT_MS"
        [ -n "${GUEST_RUST_LOG:-}" ] && cpu_snapshot "after $fs"
    done
    if [ -n "${GUEST_RUST_LOG:-}" ]; then
        for fs in $mounted; do
            [ -f "/tmp/$fs.log" ] && sed "s/^/GLOG $fs /" "/tmp/$fs.log"
        done
    fi
elif has coherence; then
    echo "INFO no control port (/dev/vport*p1): no coherence check"
fi

# --- bench
if has bench; then
    dirs=
    for fs in $mounted; do
        mkdir -p "/mnt/$fs/bench/$fs" && dirs="$dirs /mnt/$fs/bench/$fs"
    done
    set -- $dirs
    first=$1
    shift
    vs=
    for d in "$@"; do vs="$vs --vs $d"; done
    say "bench: tether bench $first$vs $BENCH_ARGS"
    tether bench "$first" $vs $BENCH_ARGS --json /tmp/bench.json 2>/tmp/bench.err
    echo "INFO bench_status $?"
    sed 's/^/bench stderr: /' /tmp/bench.err | grep -v '^bench stderr: *$' | tail -20
    if [ -s /tmp/bench.json ]; then
        echo BEGIN_BENCH_JSON
        cat /tmp/bench.json
        echo END_BENCH_JSON
    fi
fi

# --- unmount
say "unmounting"
cd /
for fs in $mounted; do
    n=0
    until umount "/mnt/$fs" 2>/dev/null; do
        n=$((n + 1))
        [ $n -ge 50 ] && { echo "INFO umount_failed $fs"; umount -l "/mnt/$fs"; break; }
        sleep 0.2
    done
done
say "done"
