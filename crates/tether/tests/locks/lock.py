#!/usr/bin/env python3
"""One locker process for tests/locks.rs.

lock.py MODE KIND PATH [START LEN]
  MODE  try    take the lock without waiting: prints "got" or "busy"
        wait   take it, waiting as long as it takes: prints "got"
        share  take a read (shared) lock, waiting as long as it takes: prints "got"
        intr   take it, waiting, with SIGALRM after 0.5 s: prints "eintr" or "got"
        hold   take it (waiting), print "held", then on each stdin line "close" close
               the file and print "closed", on "unlock" unlock it (flock LOCK_UN, or
               F_UNLCK for the range) and print "unlocked", on "downgrade" turn it into a
               read lock and print "downgraded"; exits at end of input
        getlk  F_GETLK / F_OFD_GETLK for a write lock: prints "unlocked" or
               "read|write START LEN" of the conflicting lock
        count  START times: open the file, lock it (waiting), add 1 to the number in
               it, close it (which drops the lock); prints "done"
lock.py grow KIND GUEST HOST N
        N times: on the host (HOST, the same file outside the mount) lock the file, make
        it one byte longer, unlock; then in the guest (GUEST) lock it, read it whole and
        unlock. Meanwhile another host process keeps touching the file, so that the
        watcher's invalidations of it keep coming. Prints "done" if every guest read saw
        the whole file, else "short S of N". KIND none: the guest takes no lock and reads 50 ms
        after the host's change (a measurement of what an unlocked reader may see)
  KIND  posix (fcntl F_SETLK), ofd (F_OFD_SETLK) or flock
  START LEN  the byte range (default 0 0: the whole file); ignored for flock
"""
import fcntl
import os
import signal
import struct
import sys
import time

mode, kind, path = sys.argv[1:4]
if mode == "count":
    for _ in range(int(sys.argv[4])):
        fd = os.open(path, os.O_RDWR)
        if kind == "flock":
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            fcntl.lockf(fd, fcntl.LOCK_EX)
        n = int(os.pread(fd, 32, 0).decode().strip() or "0")
        os.pwrite(fd, ("%d" % (n + 1)).ljust(32).encode(), 0)
        os.close(fd)
    print("done")
    sys.exit(0)
if mode == "grow":
    guest, host, rounds = path, sys.argv[4], int(sys.argv[5])

    def lock_file(fd, op):
        if kind == "flock":
            fcntl.flock(fd, op)
        elif kind == "posix":
            fcntl.lockf(fd, op)

    open(host, "w").close()
    toucher = os.fork()
    if toucher == 0:
        # Until killed: a change to the file's times about every 0.2 ms.
        while True:
            os.utime(host)
    short = 0
    try:
        for i in range(1, rounds + 1):
            fd = os.open(host, os.O_RDWR)
            lock_file(fd, fcntl.LOCK_EX)
            os.pwrite(fd, b"x" * i, 0)
            lock_file(fd, fcntl.LOCK_UN)
            os.close(fd)
            if kind == "none":
                time.sleep(0.05)  # well past the watcher's latency: only races remain
            fd = os.open(guest, os.O_RDONLY)
            if kind != "none":
                lock_file(fd, fcntl.LOCK_SH)
            data = b""
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                data += chunk
            os.close(fd)
            short += len(data) != i
    finally:
        os.kill(toucher, signal.SIGKILL)
        os.waitpid(toucher, 0)
    print("done" if short == 0 else "short %d of %d" % (short, rounds))
    sys.exit(0)
start, length = (int(sys.argv[4]), int(sys.argv[5])) if len(sys.argv) > 5 else (0, 0)
fd = os.open(path, os.O_RDWR)

# struct flock on Linux x86-64/arm64: short type, short whence, off_t start, off_t len,
# pid_t pid (OFD locks need pid 0), padded to 32 bytes.
def flock_struct(typ):
    return struct.pack("hhqqi4x", typ, os.SEEK_SET, start, length, 0)

def lock(wait, typ=fcntl.F_WRLCK):
    if kind == "flock":
        op = {fcntl.F_UNLCK: fcntl.LOCK_UN, fcntl.F_RDLCK: fcntl.LOCK_SH}.get(typ, fcntl.LOCK_EX)
        fcntl.flock(fd, op | (0 if wait else fcntl.LOCK_NB))
        return
    if kind == "posix":
        cmd = fcntl.F_SETLKW if wait else fcntl.F_SETLK
    else:
        cmd = fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK
    fcntl.fcntl(fd, cmd, flock_struct(typ))

def on_alarm(*_):
    # Raising makes the interrupted call fail with EINTR instead of Python retrying it.
    raise InterruptedError(4, "interrupted")

if mode == "try":
    try:
        lock(False)
        print("got")
    except (BlockingIOError, PermissionError):
        print("busy")
elif mode == "wait":
    lock(True)
    print("got")
elif mode == "share":
    lock(True, fcntl.F_RDLCK)
    print("got")
elif mode == "intr":
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        lock(True)
        print("got")
    except InterruptedError:
        print("eintr")
elif mode == "hold":
    lock(True)
    print("held", flush=True)
    for line in sys.stdin:
        if line.strip() == "close":
            os.close(fd)
            print("closed", flush=True)
        elif line.strip() == "unlock":
            lock(False, fcntl.F_UNLCK)
            print("unlocked", flush=True)
        elif line.strip() == "downgrade":
            lock(False, fcntl.F_RDLCK)
            print("downgraded", flush=True)
elif mode == "getlk":
    cmd = fcntl.F_GETLK if kind == "posix" else fcntl.F_OFD_GETLK
    res = fcntl.fcntl(fd, cmd, flock_struct(fcntl.F_WRLCK))
    typ, _, s, n, _ = struct.unpack("hhqqi4x", res)
    names = {fcntl.F_UNLCK: "unlocked", fcntl.F_RDLCK: "read", fcntl.F_WRLCK: "write"}
    print(names[typ] if typ == fcntl.F_UNLCK else "%s %d %d" % (names[typ], s, n))
else:
    sys.exit("unknown mode " + mode)
