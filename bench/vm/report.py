#!/usr/bin/env python3
"""Turns the console of a bench/vm.sh guest into its markdown report.

Usage: report.py CONSOLE.txt --command C --date D --accel A --qemu Q --host H
                 --guest-kernel K --forward F"""
import argparse
import json
import re
import statistics

ORDER = ["disk", "9p-loose", "9p-mmap", "virtiofs-auto", "virtiofs-always", "tether-vsock", "tether-tcp"]
WHAT = {
    "disk": "the guest's own ext4 disk (virtio-blk, cache=none): the baseline",
    "9p-loose": "virtio-9p, `cache=loose`, msize 512000",
    "9p-mmap": "virtio-9p, `cache=mmap`, msize 512000",
    "virtiofs-auto": "virtiofs, Debian's C virtiofsd `-o cache=auto`",
    "virtiofs-always": "virtiofs, Debian's C virtiofsd `-o cache=always`",
    "tether-vsock": "`tether mount vsock:2:7070` (vhost-device-vsock; host `serve --listen vsock-unix:`), default mount",
    "tether-tcp": "`tether mount tcp:...` over QEMU user networking to host loopback (path above), default mount",
}


def fmt_s(x):
    if x is None:
        return "-"
    if x >= 10:
        return "%.1f s" % x
    if x >= 1:
        return "%.2f s" % x
    return "%.0f ms" % (x * 1e3) if x >= 0.01 else "%.1f ms" % (x * 1e3)


def pct(v, p):
    v = sorted(v)
    return v[round((len(v) - 1) * p)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("console")
    for a in ["command", "date", "accel", "qemu", "host", "guest-kernel", "forward"]:
        ap.add_argument("--" + a, default="")
    a = ap.parse_args()
    text = open(a.console, errors="replace").read()
    lines = text.splitlines()
    info = {}
    mounts, failed = [], []
    rtt, dd, coh, cohctl = {}, {}, {}, {}
    for ln in lines:
        w = ln.split()
        if not w:
            continue
        if w[0] == "INFO" and len(w) >= 3:
            if w[1] == "mount":
                mounts.append(" ".join(w[2:5]))
            elif w[1] == "mount_failed":
                failed.append(w[2])
            else:
                info[w[1]] = " ".join(w[2:])
        elif w[0] == "RTT":
            m = re.search(r"(\d+) round trips, min (\d+) us, p50 (\d+) us, p99 (\d+) us, max (\d+) us", ln)
            if m:
                rtt[w[1]] = [int(x) for x in m.groups()]
        elif w[0] == "DD4K" and len(w) == 4:
            dd[w[1]] = (int(w[2]), int(w[3]))
        elif w[0] == "COHCTL" and len(w) == 3:
            cohctl[w[1]] = float(w[2])
        elif w[0] == "COH" and len(w) == 4:
            coh.setdefault(w[1], []).append(None if w[3] in ("never", "error") else float(w[3]))
    bench = None
    m = re.search(r"^BEGIN_BENCH_JSON\n(.*?)^END_BENCH_JSON", text, re.S | re.M)
    if m:
        try:
            bench = json.loads(m.group(1))
        except ValueError:
            bench = None

    out = []
    p = out.append
    p("Date: %s. Command: `%s`." % (a.date, a.command))
    p("")
    p("- Host: %s; %s." % (a.host, a.qemu))
    p("- Accelerator: %s, %s vCPU, %s MiB; guest kernel %s (Debian's), Debian 12 userland made with "
      "mmdebstrap (git, make, gcc), root file system on virtio-blk." % (
          a.accel, info.get("guest_cpus", "?").split()[0],
          info.get("guest_cpus", "? guest_mem_mib ?").split()[-1], info.get("guest_kernel", a.guest_kernel)))
    fwd = {
        "direct": "direct (QEMU user networking; the guest connects to 10.0.2.2:PORT, libslirp to host loopback)",
        "socat": "socat per connection (restrict=on, guestfwd cmd: socat STDIO TCP:127.0.0.1:PORT,nodelay)",
        "socat-plain": "socat per connection without nodelay (restrict=on, guestfwd cmd: socat STDIO TCP:127.0.0.1:PORT)",
    }
    p("- tether-tcp's path: %s." % fwd.get(a.forward, a.forward))
    if failed:
        p("- **Not mounted**: %s." % ", ".join(failed))
    p("")

    if bench:
        labels = [d["label"] for d in bench["dirs"]]
        cols = [l for l in ORDER if l in labels] + [l for l in labels if l not in ORDER]
        sizes = bench["sizes"]
        p("`tether bench` in the guest (%s sizes: %d-file tree, %d small files, %d MiB dd; %d run%s, "
          "medians; cold rows after dropping the guest's caches): the guest disk's median time, "
          "and every other file system's as a ratio to it (lower is better)." % (
              "quick" if bench["quick"] else "full", sizes["tree_files"], sizes["small_files"],
              sizes["dd_bytes"] >> 20, bench["runs"], "" if bench["runs"] == 1 else "s"))
        p("")
        p("| workload | " + " | ".join(cols) + " |")
        p("|---|" + "---:|" * len(cols))
        for w in bench["workloads"]:
            cells = {c["dir"]: c for c in w["results"]}
            base = cells.get("disk", {}).get("median")
            row = []
            for c in cols:
                cell = cells.get(c)
                if not cell or cell["median"] is None:
                    row.append("failed" if cell and cell["failed"] else "-")
                elif c == "disk" or not base:
                    row.append(fmt_s(cell["median"]))
                else:
                    r = cell["median"] / base
                    row.append(("%.1fx" % r) if r >= 10 else ("%.2fx" % r))
                if cell and cell["failed"] and cell["median"] is not None:
                    row[-1] += " (%d failed)" % cell["failed"]
            p("| %s | %s |" % (w["name"], " | ".join(row)))
        p("")
        if bench.get("notes"):
            for n in bench["notes"]:
                p("Note: %s" % n)
            p("")
    elif "bench_status" in info:
        p("`tether bench` gave no results (status %s; the console has its errors)." % info["bench_status"])
        p("")

    if rtt:
        p("Round trip: `tether check ADDRESS --ping N` in the guest (PING requests one at a time, "
          "after the handshake):")
        p("")
        p("| transport | N | min | p50 | p99 | max |")
        p("|---|---:|---:|---:|---:|---:|")
        for t in ["vsock", "tcp"]:
            if t in rtt:
                n, mn, p50, p99, mx = rtt[t]
                p("| %s | %d | %d us | %d us | %d us | %d us |" % (t, n, mn, p50, p99, mx))
        p("")
    if dd:
        base = dd.get("disk")
        p("4 KiB writes: `dd bs=4k count=N conv=notrunc,fsync` over an existing file, time per write "
          "(the fsync at the end included), and its ratio to the disk's:")
        p("")
        p("| file system | N | per write | ratio |")
        p("|---|---:|---:|---:|")
        for fs in [f for f in ORDER if f in dd]:
            n, us = dd[fs]
            per = us / n / 1000.0
            ratio = "" if fs == "disk" or not base else "%.1fx" % (per / (base[1] / base[0] / 1000.0))
            p("| %s | %d | %.2f ms | %s |" % (fs, n, per, ratio))
        p("")
    if coh:
        ctl = min(cohctl.values()) if cohctl else None
        p("Coherence: the guest reads a 64-byte file twice (warm caches), asks the host (over a "
          "virtio-serial port) to rewrite it in place with new content of the same length, and "
          "rereads it every 0.25 ms until the new content shows; time from the request%s. "
          "\"never\": not within the timeout (two in a row end the check)." % (
              " (whose own round trip is %.1f ms)" % ctl if ctl is not None else ""))
        p("")
        p("| file system | trials | seen | p50 | p99 | max |")
        p("|---|---:|---:|---:|---:|---:|")
        for fs in [f for f in ORDER if f in coh] + [f for f in coh if f not in ORDER]:
            v = coh[fs]
            seen = [x for x in v if x is not None]
            if seen:
                p("| %s | %d | %d | %.1f ms | %.1f ms | %.1f ms |" % (
                    fs, len(v), len(seen), statistics.median(seen), pct(seen, 0.99), max(seen)))
            else:
                p("| %s | %d | 0 | never | never | never |" % (fs, len(v)))
        p("")
    p("File systems: " + "; ".join("%s: %s" % (f, WHAT[f]) for f in ORDER if f in WHAT) + ".")
    print("\n".join(out))


if __name__ == "__main__":
    main()
