#!/usr/bin/env python3
"""The host side of bench/vm.sh's control channel (a virtio-serial port; QEMU listens on
the Unix socket SOCK). The guest's coherence helper (bench/vm/coherence.c) asks for host
edits through it:

    nop            -> ok
    edit NAME I    -> rewrites SHARES/NAME/coherence/file in place with trial I's content
                      (64 bytes: "vI", dots, a newline; the length never changes), then ok

Usage: ctl.py SOCK SHARES (runs until the socket closes)."""
import os
import socket
import sys
import time

LEN = 64


def content(i):
    s = ("v%d" % i).encode()
    return s + b"." * (LEN - 1 - len(s)) + b"\n"


def main():
    path, shares = sys.argv[1], sys.argv[2]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    for _ in range(600):
        try:
            s.connect(path)
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit("ctl.py: cannot connect to %s" % path)
    f = s.makefile("rwb", buffering=0)
    buf = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            words = line.decode(errors="replace").split()
            if words[:1] == ["edit"] and len(words) == 3:
                name, i = words[1], int(words[2])
                target = os.path.join(shares, name, "coherence", "file")
                got = time.time()
                fd = os.open(target, os.O_WRONLY)
                try:
                    os.pwrite(fd, content(i), 0)
                finally:
                    os.close(fd)
                # When each edit was asked for and made (host clock), for matching with
                # the guest's COHT lines and the servers' logs.
                print("edit %s %d %.6f %.6f" % (name, i, got, time.time()), flush=True)
            f.write(b"ok\n")


if __name__ == "__main__":
    main()
