#!/usr/bin/env python3
"""Where a coherence trial's time goes (bench/vm.sh --keep with TETHER_VM_GUEST_LOG and the
host's RUST_LOG set; see bench/vm.sh's header).

    timeline.py WORKDIR [NAME]      (NAME: the share, default tether-vsock)

Reads WORKDIR/console.log (COHT, GLOG and CPUSNAP lines), WORKDIR/ctl.log (ctl.py's edit
times) and WORKDIR/serve-vsock.log (the host server's trace lines). The guest's clock is
put on the host's by the smallest gap between a trial's request leaving the guest and
ctl.py receiving it, less half the control channel's round trip (COHCTL). For each trial,
milestones in ms from the request leaving the guest:

  got      ctl.py read the edit request          made   ctl.py closed the file
  woke     the server's watcher woke (first after the edit)
  pushed   the server wrote the push             read   the guest client read it
  applied  the invalidation thread applied it
  req      the first request the client sent after the push (op), and its reply
  seen     the guest's reread showed the edit

then percentiles of each step, and the CPU time of every guest thread that used any
during the coherence part (CPUSNAP before/after)."""
import re
import statistics
import sys
from datetime import datetime, timezone

OPS = {10: "LOOKUP", 11: "FORGET", 12: "GETATTR", 13: "SETATTR", 22: "OPEN", 23: "READ",
       26: "RELEASE", 27: "FSYNC", 32: "FLUSH", 42: "PING"}
TS = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z\s+(\w+)\s+([\w:]+): (.*)")


def ts(s):
    return datetime.strptime(s[:26], "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()


def log_lines(lines):
    for line in lines:
        m = TS.search(line)
        if m:
            yield ts(m.group(1)), m.group(3), m.group(4)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float("nan")


def main():
    work = sys.argv[1]
    name = sys.argv[2] if len(sys.argv) > 2 else "tether-vsock"
    console = open(work + "/console.log", errors="replace").read().replace("\r", "").splitlines()
    coht, ctl_rtt, glog, snaps = {}, 0.3, [], {}
    for line in console:
        w = line.split()
        if w[:2] == ["COHT", name]:
            coht[int(w[2])] = (float(w[3]), float(w[4]))
        elif w[:2] == ["COHCTL", name]:
            ctl_rtt = float(w[2])
        elif w[:2] == ["GLOG", name]:
            glog.append(line.split(" ", 2)[2])
        elif w[:1] == ["CPUSNAP"] and len(w) > 3 and w[2] == name and w[3] != "loadavg":
            when = w[1]
            # pid (comm) state ... : comm may hold spaces
            rest = line.split(" ", 3)[3]
            tid = int(rest.split(" ", 1)[0])
            comm = rest[rest.index("(") + 1:rest.rindex(")")]
            f = rest[rest.rindex(")") + 2:].split()
            snaps.setdefault(when, {})[tid] = (comm, int(f[11]) + int(f[12]))
        elif w[:1] == ["CPUSNAP"] and len(w) > 3 and w[3] == "loadavg":
            print(line)
    edits = {}
    for line in open(work + "/ctl.log", errors="replace"):
        w = line.split()
        if w[:2] == ["edit", name]:
            edits[int(w[2])] = (float(w[3]), float(w[4]))
    trials = sorted(set(coht) & set(edits))
    if not trials:
        sys.exit("no trials with both COHT and ctl.log lines")
    host_minus_guest = min(edits[i][0] - coht[i][0] for i in trials) - ctl_rtt / 2000
    half = len(trials) // 2
    drift = (min(edits[i][0] - coht[i][0] for i in trials[half:])
             - min(edits[i][0] - coht[i][0] for i in trials[:half]))
    print(f"trials {len(trials)}; host - guest clock {host_minus_guest:.6f} s "
          f"(second half vs first: {drift * 1e3:+.3f} ms)")
    server = list(log_lines(open(work + "/serve-vsock.log", errors="replace")))
    guest = [(t + host_minus_guest, tgt, msg) for t, tgt, msg in log_lines(glog)]

    def first(events, after, before, pred):
        for t, tgt, msg in events:
            if after <= t < before and pred(tgt, msg):
                return t, msg
        return None

    steps = {}
    rows = []
    for i in trials:
        g0 = coht[i][0] + host_minus_guest
        seen = coht[i][1]
        end = g0 + (seen if seen >= 0 else 5000) / 1e3 + 0.05
        got, made = edits[i]
        m = {"got": got, "made": made}
        woke = first(server, made - 0.001, end, lambda g, s: s.startswith("watch events"))
        pushed = first(server, made - 0.001, end, lambda g, s: s.startswith("pushed"))
        if woke:
            m["woke"] = woke[0]
        if pushed:
            m["pushed"] = pushed[0]
            read = first(guest, pushed[0] - 0.002, end, lambda g, s: s.startswith("push read"))
            if read:
                m["read"] = read[0]
                ap = first(guest, read[0], end, lambda g, s: s.startswith("applied"))
                if ap:
                    m["applied"] = ap[0]
                req = first(guest, read[0], end, lambda g, s: s.startswith("request sent"))
                if req:
                    m["req"] = req[0]
                    op = re.search(r"op=(\d+)", req[1])
                    m["req_op"] = OPS.get(int(op.group(1)), op.group(1)) if op else "?"
        m["seen"] = g0 + seen / 1e3 if seen >= 0 else None
        rel = {k: (v - g0) * 1e3 for k, v in m.items() if isinstance(v, float)}
        rows.append((i, rel, m.get("req_op", "")))
        order = ["got", "made", "woke", "pushed", "read", "applied", "req", "seen"]
        prev = 0.0
        prev_name = "sent"
        for k in order:
            if k in rel:
                steps.setdefault(f"{prev_name}->{k}", []).append(rel[k] - prev)
                prev, prev_name = rel[k], k
    print("\nfirst trials (ms from the request leaving the guest):")
    for i, rel, op in rows[:25]:
        print(f"  {i:4d} " + " ".join(f"{k}={v:.2f}" for k, v in rel.items()) + f" {op}")
    print("\nsteps (ms): n p10 p50 p90 p99 max")
    for k, xs in steps.items():
        print(f"  {k:18s} {len(xs):4d} {pct(xs, .1):7.2f} {pct(xs, .5):7.2f} {pct(xs, .9):7.2f} "
              f"{pct(xs, .99):7.2f} {max(xs):7.2f}")
    seen = [rel["seen"] for _, rel, _ in rows if "seen" in rel]
    if seen:
        print(f"  seen overall      {len(seen):4d} p50 {statistics.median(seen):.2f} "
              f"p99 {pct(seen, .99):.2f} max {max(seen):.2f}")
    if "before" in snaps and "after" in snaps:
        b, a = snaps["before"], snaps["after"]
        print("\nguest CPU during the coherence part (clock ticks, 100/s):")
        use = [(a[t][1] - b.get(t, (None, 0))[1], t, a[t][0]) for t in a]
        for d, t, comm in sorted(use, reverse=True)[:20]:
            if d > 0:
                print(f"  {d:6d} {t:6d} {comm}")


if __name__ == "__main__":
    main()
