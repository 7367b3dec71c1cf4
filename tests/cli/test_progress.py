"""The command's live progress: on stderr when it is a terminal (a real
pseudo-terminal here), after 2 s, never on a pipe or with --quiet.

The long runs are long by their fault delay (-d: the reader sleeps before
resolving each fault), so they cost this host little CPU, and run at once.
"""
import fcntl
import os
import struct
import subprocess
import termios
import threading

import pytest

from helpers.children import ENV as CHILD_ENV
from helpers.children import uffdkvm_command

# alone (tests/helpers/machine_lock.py): a progress line that shows only after a delay.
pytestmark = [pytest.mark.kvm, pytest.mark.alone]

# 2048 faults resolved 1.5 ms after each is read: 3 s or more, past the 2 s delay.
LONG = ["-b", "8M", "-d", "1500"]
SHORT = ["-b", "1M"]


class Child:
    """The command, stdout a pipe, stderr a pipe or the slave side of a pty."""

    def __init__(self, *args, tty):
        self.master = None
        stderr = subprocess.PIPE
        if tty:
            self.master, slave = os.openpty()
            # 24 rows of 100 columns, as a terminal has (a new pty says 0x0).
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
            stderr = slave
        self.proc = subprocess.Popen(uffdkvm_command(*args),
                                     stdout=subprocess.PIPE, stderr=stderr,
                                     env=CHILD_ENV)
        self.chunks = []
        if tty:
            os.close(slave)
            # Drained while the child runs, so that it never blocks on a full pty.
            self.reader = threading.Thread(target=self._drain, daemon=True)
            self.reader.start()

    def _drain(self):
        while True:
            try:
                data = os.read(self.master, 4096)
            except OSError:  # EIO: the child closed the last slave fd
                return
            if not data:
                return
            self.chunks.append(data)

    def wait(self):
        out, err = self.proc.communicate(timeout=120)
        if self.master is not None:
            self.reader.join(timeout=30)
            os.close(self.master)
            err = b"".join(self.chunks)
        return self.proc.returncode, out.decode(), err.decode()


def test_progress_shows_on_a_terminal_only_after_the_delay_and_not_with_quiet(kvm):
    children = {
        "tty": Child(*LONG, tty=True),
        "pipe": Child(*LONG, tty=False),
        "quiet": Child(*LONG, "--quiet", tty=True),
        "short": Child(*SHORT, tty=True),
    }
    seen = {name: c.wait() for name, c in children.items()}
    for name, (code, out, err) in seen.items():
        assert code == 0, (name, err)
        assert out.startswith("Total guest execution time:"), name

    _, _, err = seen["tty"]
    lines = [line.strip() for line in err.split("\r") if line.strip()]
    assert lines, err
    # "running    2.3 s   40%  819/2048 pages  (slowest vCPU 40%)", redrawn in place
    running = [line for line in lines if line.startswith("running")]
    assert running, lines
    for line in running:
        seconds = float(line.split()[1])
        assert seconds >= 2.0, line   # nothing before the delay
        assert line.endswith("%)") and "/2048 pages" in line, line
    done = [int(line.split("/2048")[0].split()[-1]) for line in running]
    assert done == sorted(done) and 0 < done[-1] <= 2048
    assert err.endswith("\r")        # the line is cleared before the result prints

    assert seen["pipe"][2] == ""     # stderr not a terminal: nothing
    assert seen["quiet"][2] == ""    # --quiet: nothing
    assert seen["short"][2] == ""    # under 2 s: nothing, even on a terminal


def test_a_sweep_shows_its_bar_on_a_terminal_only(kvm):
    args = ["sweep", "-b", "1M", "-r", "1,2"]
    children = {"tty": Child(*args, tty=True), "pipe": Child(*args, tty=False),
                "quiet": Child(*args, "-q", tty=True)}
    seen = {name: c.wait() for name, c in children.items()}
    for name, (code, out, err) in seen.items():
        assert code == 0, (name, err)
        assert out.startswith("| readers | pages_per_s |"), name
    assert "2/2" in seen["tty"][2]     # tqdm's runs done of runs in all
    assert seen["pipe"][2] == ""
    assert seen["quiet"][2] == ""
