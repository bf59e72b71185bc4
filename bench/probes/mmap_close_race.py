#!/usr/bin/env python3
"""A FUSE race in the guest kernel (docs/coherence.md, "Shared mappings and a concurrent
close"): a write() that extends a file within a page dirtied through a shared mapping is
lost on the server when a close() of another descriptor of the file writes that page back
at the same moment. Not Tether's: bindfs loses the same bytes.

    mmap_close_race.py MOUNT_DIR BACKING_DIR [ITERATIONS=2000] [--no-closer]

Each iteration writes 108 bytes, changes bytes 60-107 through a mapping (no msync), writes
byte 4095 with pwrite() and closes; a second thread opens the file for writing and closes it
in a loop. Prints the iterations whose file in BACKING_DIR (the export, or bindfs's source)
lacks byte 4095, and the count. --no-closer runs without the second thread (expect 0).
"""
import mmap
import os
import sys
import threading
import time

args = [a for a in sys.argv[1:] if not a.startswith("--")]
mount, backing = args[0], args[1]
iterations = int(args[2]) if len(args) > 2 else 2000
name = "mmap-close-race"
stop = False


def closer():
    while not stop:
        try:
            os.close(os.open(os.path.join(mount, name), os.O_WRONLY | os.O_NONBLOCK))
        except FileNotFoundError:
            pass


t = threading.Thread(target=closer)
if "--no-closer" not in sys.argv:
    t.start()
lost = 0
for i in range(iterations):
    fd = os.open(os.path.join(mount, name), os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    os.pwrite(fd, b"a" * 108, 0)
    m = mmap.mmap(fd, 108)
    m[60:108] = b"b" * 48  # a dirty mapped page, not synced
    os.pwrite(fd, b"c", 4095)  # extends the file within that page
    os.close(fd)
    m.flush()
    m.close()
    time.sleep(0.002)
    with open(os.path.join(backing, name), "rb") as f:
        data = f.read()
    if len(data) != 4096 or data[4095:] != b"c" or data[60:108] != b"b" * 48:
        lost += 1
        print(f"iteration {i}: {len(data)} bytes, byte 4095 is {data[4095:]!r}", flush=True)
stop = True
if t.is_alive():
    t.join()
os.unlink(os.path.join(mount, name))
print(f"lost writes: {lost} of {iterations}")
