"""tests/helpers/machine_lock.py, which pytest-xdist's workers share: tests beside
each other, an ``alone`` test with the machine to itself, and a test waiting
to be alone served before the tests that come after it.

flock(2) locks belong to an open file, so threads that each open the lock
files contend as the workers' processes do."""
import threading
import time

from helpers import machine_lock


def hold(directory, alone, seconds, spans, name):
    with machine_lock.machine(directory, alone):
        start = time.monotonic()
        time.sleep(seconds)
        spans[name] = (start, time.monotonic())


def overlap(a, b):
    return a[0] < b[1] and b[0] < a[1]


def test_tests_share_and_an_alone_one_waits_and_goes_first(tmp_path):
    spans = {}
    started = []

    def start(name, alone, seconds):
        t = threading.Thread(target=hold, args=(str(tmp_path), alone, seconds, spans, name))
        t.start()
        started.append(t)
        time.sleep(0.1)  # each arrives after the one before is holding or waiting

    start("shared-1", False, 0.5)
    start("shared-2", False, 0.5)   # beside shared-1
    start("alone", True, 0.3)       # waits for both
    start("shared-3", False, 0.1)   # came after alone: waits for it
    for t in started:
        t.join(10)
    assert set(spans) == {"shared-1", "shared-2", "alone", "shared-3"}, spans
    assert overlap(spans["shared-1"], spans["shared-2"]), spans
    for other in ("shared-1", "shared-2", "shared-3"):
        assert not overlap(spans["alone"], spans[other]), (other, spans)
    assert spans["shared-3"][0] >= spans["alone"][1], spans


def test_without_xdist_nothing_is_locked():
    with machine_lock.machine(None, alone=True):
        with machine_lock.machine(None, alone=True):
            pass


def test_a_worker_keeps_the_machine_from_one_alone_test_to_the_next(tmp_path):
    """Hold: two alone tests in a row on one worker, with another worker's
    test arriving between them, keep the machine; the other test runs once
    a test that is not alone lets it go."""
    worker = machine_lock.Hold(str(tmp_path))
    spans = {}
    worker.enter(alone=True)                    # the first alone test
    other = threading.Thread(target=hold, args=(str(tmp_path), False, 0.1, spans, "other"))
    other.start()
    time.sleep(0.3)                             # the other worker waits, meanwhile
    worker.enter(alone=True)                    # the next alone test: still held
    time.sleep(0.3)
    assert "other" not in spans, spans
    released = time.monotonic()
    worker.enter(alone=False)                   # a shared test: lets the machine go
    other.join(10)
    worker.leave()
    assert spans["other"][0] >= released, spans


def test_the_order_runs_a_files_alone_tests_first_and_keeps_files_whole(pytester):
    """The order under xdist: files with alone tests first, and in each file
    its alone tests first; a file's tests never split."""
    pytester.makepyfile(
        test_few="def test_x(): pass\n",
        test_many="import pytest\n"
                  "def test_a(): pass\n"
                  "@pytest.mark.alone\n"
                  "def test_b(): pass\n"
                  "def test_c(): pass\n"
                  "@pytest.mark.alone\n"
                  "def test_d(): pass\n",
        test_other="def test_y(): pass\ndef test_z(): pass\n")
    items, _ = pytester.inline_genitems()
    machine_lock.order(items)
    assert [i.name for i in items] == ["test_b", "test_d", "test_a", "test_c",
                                       "test_y", "test_z", "test_x"]
