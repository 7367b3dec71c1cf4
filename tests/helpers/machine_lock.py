"""The machine shared between pytest-xdist's workers: a test marked
``alone`` runs with the machine to itself, every other test beside others.

A test is ``alone`` when what it checks depends on the rest of the machine
being quiet: it measures time or the scheduler's placement against a bound,
or changes what the whole host shares (a huge page pool set to a value,
all of a cgroup's memory). Everything else only gets slower beside another
test, and runs beside the others.

The lock is two flock(2)s on files in the session's temporary directory,
which holds every worker's own (pytest's retention removes it like any
other): every test holds ``share`` (an ``alone`` test
exclusively, the others shared), and takes ``turnstile`` for a moment
first. A test waiting to be alone holds the turnstile while it waits, so
that tests arriving after it queue behind it instead of overlapping each
other forever (flock(2) alone gives a waiting exclusive lock no priority).
Without xdist (``-n 0``, or a pytest that runs tests in a subprocess) there
is one test at a time anyway, and nothing is locked.

A worker keeps the machine from one ``alone`` test to the next when it runs
them one after the other (Hold; another worker's test then waits for the
whole run): taking it means waiting for the other
workers' tests in flight to end, and with about 120 alone tests, most of
them in runs of a module's, that wait, paid per test, was a minute of a
worker's idle time.
"""
import collections
import contextlib
import fcntl
import os
import time

import pytest

# A test waits at most this long for the machine (the longest test here
# takes about a minute): past it, the test fails saying so, never hangs.
WAIT_S = 1800


@contextlib.contextmanager
def _flocked(path, operation, what):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                fcntl.flock(fd, operation | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"waited {WAIT_S} s for {what} ({path}): "
                                       "another worker's test never finished") from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def machine(directory, alone):
    """Held around one test: the machine to itself when alone, else shared.
    directory: where the session's workers keep the lock files (None: no
    workers, nothing to lock)."""
    if directory is None:
        yield
        return
    turnstile = os.path.join(directory, "machine.turnstile")
    share = os.path.join(directory, "machine.share")
    with contextlib.ExitStack() as held:
        with _flocked(turnstile, fcntl.LOCK_EX, "the turnstile"):
            held.enter_context(_flocked(share, fcntl.LOCK_EX if alone else fcntl.LOCK_SH,
                                        "the machine"))
        yield


# The worker's Hold, kept in its config for conftest's pytest_runtest_teardown.
HOLD = pytest.StashKey["Hold"]()


def is_alone(item):
    """Whether a test (None: no test) is marked alone."""
    return item is not None and item.get_closest_marker("alone") is not None


def order(items):
    """Sorts a worker's tests (pytest items, in place) into the order xdist
    hands their files out in: the files that hold alone tests first, then
    those that hold slow ones, then the rest, each group by its number of
    tests, largest first; within a file its alone tests first, then the
    rest, each in their order. So the alone tests run while the other
    worker's tests are short, and a test waiting to be alone waits for
    little (behind a guest's boot or a sanitizer build it waited up to
    40 s, a worker idle meanwhile: an alone test at the end of a long file
    of others came to it that late), and no long file is left to run by
    itself at the end."""
    alone_files = {item.path for item in items if is_alone(item)}
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    group = {path: 0 if path in alone_files else 1 if path in slow_files else 2
             for path in {item.path for item in items}}
    count = collections.Counter(item.path for item in items)
    seen = {path: i for i, path in enumerate(dict.fromkeys(item.path for item in items))}
    # Stable: files of one size keep their order, and so do a file's tests of one kind.
    items.sort(key=lambda item: (group[item.path], -count[item.path], seen[item.path],
                                 not is_alone(item)))


class Hold:
    """One worker's hold on the machine, kept from an ``alone`` test to the
    next alone one (enter() again with alone=True while held alone is a
    no-op); any other test lets it go first."""

    def __init__(self, directory):
        self._directory = directory
        self._held = None      # the entered machine(), or None
        self._alone = False

    def enter(self, alone):
        if self._held is not None and self._alone and alone:
            return
        self.leave()
        held = machine(self._directory, alone)
        held.__enter__()
        self._held, self._alone = held, alone

    def leave(self):
        held, self._held = self._held, None
        if held is not None:
            held.__exit__(None, None, None)
