#!/usr/bin/env python3
"""pty_run.py — runs a command with stdin, stdout and stderr on a pseudo-terminal (as a person at
the terminal would) and prints everything it wrote, byte for byte, on stdout. Bounded: the child
is killed after TIMEOUT seconds. Used by tests/e2e/cli_progress.sh.

  pty_run.py TIMEOUT INPUT_FILE|- CMD ARGS...
"""
import os
import pty
import select
import subprocess
import sys
import time

timeout = float(sys.argv[1])
inp = b"" if sys.argv[2] == "-" else open(sys.argv[2], "rb").read()
master, slave = pty.openpty()
p = subprocess.Popen(sys.argv[3:], stdin=slave, stdout=slave, stderr=slave, close_fds=True)
os.close(slave)
if inp:
    os.write(master, inp)
out = b""
deadline = time.time() + timeout
while time.time() < deadline:
    r, _, _ = select.select([master], [], [], 0.2)
    if r:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    elif p.poll() is not None:
        break
if p.poll() is None:
    p.kill()
rc = p.wait()
sys.stdout.buffer.write(out)
sys.exit(rc)
