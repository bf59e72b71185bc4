#!/usr/bin/env python3
"""How long a blocked lock takes to reach its waiter once the holder lets go.

    lock_handoff.py HOLDER_PATH WAITER_PATH [ROUNDS=40] [KIND=flock]

HOLDER_PATH and WAITER_PATH name the same file, seen from where the holder and the waiter
run: both through one mount, the host's path and a mount's, or two mounts of one export.
Each round the holder locks the file, a forked waiter asks for the lock and blocks, and
after 30-48 ms (varied, so that a polling waiter's retries fall anywhere) the holder
unlocks; the time from the unlock to the waiter's grant is one sample. KIND: flock or
posix (fcntl F_SETLKW). Prints the median, 90th percentile and largest, in ms.
"""
import fcntl
import os
import statistics
import sys
import time


def take(fd, kind, op):
    if kind == "flock":
        fcntl.flock(fd, op)
    else:
        fcntl.lockf(fd, op)


def main():
    holder_path, waiter_path = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    kind = sys.argv[4] if len(sys.argv) > 4 else "flock"
    open(holder_path, "a").close()
    samples = []
    for i in range(rounds):
        held = os.open(holder_path, os.O_RDWR)
        take(held, kind, fcntl.LOCK_EX)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            fd = os.open(waiter_path, os.O_RDWR)
            take(fd, kind, fcntl.LOCK_EX)
            os.write(w, repr(time.monotonic()).encode())
            os._exit(0)
        os.close(w)
        time.sleep(0.030 + (i % 7) * 0.003)
        released = time.monotonic()
        take(held, kind, fcntl.LOCK_UN)
        granted = float(os.read(r, 64))
        os.waitpid(pid, 0)
        os.close(held)
        os.close(r)
        samples.append((granted - released) * 1000)
    samples.sort()
    print(
        "%s handoff, %d rounds: median %.2f ms, p90 %.2f ms, max %.2f ms"
        % (kind, rounds, statistics.median(samples), samples[int(len(samples) * 0.9)], samples[-1])
    )


if __name__ == "__main__":
    main()
