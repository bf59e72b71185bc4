#!/usr/bin/env python3
"""A bank in SQLite, for tests/locks.rs: workers move money between accounts in concurrent
transactions, reading balances and writing them back, so a stale read (a page cache that
missed another writer's commit) loses or creates money. Readers check the total as they go.

sqlite.py init DB JOURNAL_MODE       create the accounts (journal mode: delete, wal)
sqlite.py work DB WORKER_ID N        N transfers, each followed by a read-only check
sqlite.py check DB WORKERS N         the invariant at the end: total, log, integrity
sqlite.py hold DB                    open it, read, print "open", stay until end of input
sqlite.py try DB                     open it and read: prints "ok" or the error
"""
import random
import sqlite3
import sys
import time

ACCOUNTS, START = 20, 1000

def connect(db):
    # isolation_level=None: transactions are exactly the BEGIN/COMMIT written here.
    return sqlite3.connect(db, timeout=60, isolation_level=None)

def retrying(con, fn):
    """Runs fn in a transaction, again while the database is busy."""
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as e:
            msg = str(e)
            # "locking protocol": a WAL database another guest or the host holds (its
            # index is refused here until they close it: coherence.md, "Locks").
            if "locked" not in msg and "busy" not in msg and "locking protocol" not in msg:
                sys.exit("%s (%s)" % (msg, getattr(e, "sqlite_errorname", "?")))
            if con.in_transaction:
                con.execute("ROLLBACK")
            time.sleep(random.uniform(0.001, 0.01))

cmd, db = sys.argv[1], sys.argv[2]
con = connect(db)
if cmd == "init":
    mode = con.execute("PRAGMA journal_mode=%s" % sys.argv[3]).fetchone()[0]
    assert mode == sys.argv[3], "journal_mode is %s" % mode
    con.execute("CREATE TABLE acct(id INTEGER PRIMARY KEY, bal INTEGER NOT NULL)")
    con.execute("CREATE TABLE log(worker INTEGER, seq INTEGER, UNIQUE(worker, seq))")
    con.executemany("INSERT INTO acct VALUES(?, ?)", [(i, START) for i in range(ACCOUNTS)])
elif cmd == "work":
    worker, n = int(sys.argv[3]), int(sys.argv[4])
    rnd = random.Random(worker)

    def transfer(seq):
        con.execute("BEGIN IMMEDIATE")
        a, b = rnd.sample(range(ACCOUNTS), 2)
        amount = rnd.randint(1, 50)
        (ba,) = con.execute("SELECT bal FROM acct WHERE id=?", (a,)).fetchone()
        (bb,) = con.execute("SELECT bal FROM acct WHERE id=?", (b,)).fetchone()
        con.execute("UPDATE acct SET bal=? WHERE id=?", (ba - amount, a))
        con.execute("UPDATE acct SET bal=? WHERE id=?", (bb + amount, b))
        con.execute("INSERT INTO log VALUES(?, ?)", (worker, seq))
        con.execute("COMMIT")

    def total():
        con.execute("BEGIN")
        (t,) = con.execute("SELECT sum(bal) FROM acct").fetchone()
        con.execute("COMMIT")
        return t

    for seq in range(n):
        retrying(con, lambda: transfer(seq))
        t = retrying(con, total)
        if t != ACCOUNTS * START:
            sys.exit("worker %d: total %d after transfer %d, expected %d"
                     % (worker, t, seq, ACCOUNTS * START))
elif cmd == "check":
    workers, n = int(sys.argv[3]), int(sys.argv[4])
    (ok,) = con.execute("PRAGMA integrity_check").fetchone()
    (t,) = con.execute("SELECT sum(bal) FROM acct").fetchone()
    (logged,) = con.execute("SELECT count(*) FROM log").fetchone()
    problems = []
    if ok != "ok":
        problems.append("integrity_check: " + ok)
    if t != ACCOUNTS * START:
        problems.append("total %d, expected %d" % (t, ACCOUNTS * START))
    if logged != workers * n:
        problems.append("%d transfers logged, expected %d" % (logged, workers * n))
    if problems:
        sys.exit("; ".join(problems))
    print("ok: %d transfers, total %d" % (logged, t))
elif cmd == "hold":
    con.execute("SELECT count(*) FROM acct").fetchone()
    print("open", flush=True)
    sys.stdin.read()
elif cmd == "try":
    con = sqlite3.connect(db, timeout=0.5, isolation_level=None)
    try:
        con.execute("SELECT count(*) FROM acct").fetchone()
        print("ok")
    except sqlite3.OperationalError as e:
        print(e)
else:
    sys.exit("unknown command " + cmd)
