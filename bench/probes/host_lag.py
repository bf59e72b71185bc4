#!/usr/bin/env python3
"""host_lag.py MNT_FILE HOST_FILE [TRIALS] [BLOCK] [BURST]: how long after a guest write()
returns the host has it.

Each trial writes BURST times BLOCK bytes (defaults 1 and 4096) at the end of MNT_FILE
through the mount (os.write calls on a descriptor kept open), then polls HOST_FILE's size (the same file seen on the
host) until it has grown, and records the time from the write's return. Prints the
median, 99th percentile and maximum, and how many trials had the data already at the first
look. Written through without --write-behind every trial should find it at once. The
poll sleeps 20 us between looks (a busy loop would take the CPU the server needs on a
small machine), so lags are measured to about 100 us.
"""
import os
import sys
import time


def main():
    mnt_file, host_file = sys.argv[1], sys.argv[2]
    trials = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    block = int(sys.argv[4]) if len(sys.argv) > 4 else 4096
    burst = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    data = b"x" * block
    fd = os.open(mnt_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    lags, at_once = [], 0
    size = 0
    for _ in range(trials):
        for _ in range(burst):
            os.write(fd, data)
        done = time.perf_counter()
        size += block * burst
        first = True
        while os.stat(host_file).st_size < size:
            first = False
            if time.perf_counter() - done > 5:
                sys.exit(f"the host did not show the write within 5 s (size {size})")
            # Not a busy loop: on a small machine it would take the CPU the server needs.
            time.sleep(20e-6)
        lags.append(time.perf_counter() - done)
        at_once += first
    os.close(fd)
    lags.sort()
    us = lambda s: f"{s * 1e6:.0f} us"
    print(
        f"{trials} trials of {burst} write(s) of {block} bytes: host has it at the first look in {at_once}; "
        f"lag p50 {us(lags[len(lags) // 2])}, p99 {us(lags[int(len(lags) * 0.99)])}, "
        f"max {us(lags[-1])}"
    )


if __name__ == "__main__":
    main()
