#!/usr/bin/env python3
"""Host writes racing guest listings: does every write reach the guest's cached size?

    host_writes_racing_listings.py EXPORT MOUNT [FILES=1000]

EXPORT is the served directory, MOUNT a mount of it. Two threads list MOUNT without pause
(the kernel takes each listing in as READDIRPLUS entries), while this process makes FILES
files on the host: each is created empty and, 0.2 ms later, written with 4,096 bytes. A
listing that read a file empty just before its write, and whose inode the kernel made only
after the write's push, leaves the guest with 0 bytes cached until revoked; each file's
size is checked through the mount for 0.5 s. Prints the files that stayed stale. Run
`tether status MOUNT` afterwards for the invalidations the kernel refused at first
("invalidations applied again once the kernel had made the node"). Load the machine
(`stress-ng --cpu 2`) to widen the race.
"""
import os
import sys
import threading
import time


def main():
    export, mount = sys.argv[1], sys.argv[2]
    files = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    stop = threading.Event()

    def lister():
        while not stop.is_set():
            try:
                for _ in os.scandir(mount):
                    pass
            except OSError:
                pass

    listers = [threading.Thread(target=lister) for _ in range(2)]
    for t in listers:
        t.start()
    stale = 0
    try:
        for i in range(files):
            fd = os.open(os.path.join(export, f"f{i}"), os.O_CREAT | os.O_WRONLY, 0o644)
            time.sleep(0.0002)
            os.write(fd, b"x" * 4096)
            os.close(fd)
            seen = os.path.join(mount, f"f{i}")
            deadline = time.monotonic() + 0.5
            while os.stat(seen).st_size != 4096:
                if time.monotonic() > deadline:
                    stale += 1
                    print(f"f{i}: {os.stat(seen).st_size} bytes 0.5 s after the host wrote 4096")
                    break
                time.sleep(0.005)
    finally:
        stop.set()
        for t in listers:
            t.join()
    print(f"{stale} of {files} files stale")
    sys.exit(1 if stale else 0)


if __name__ == "__main__":
    main()
