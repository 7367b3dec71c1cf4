"""Hostile replay and touch-order files (Config.replay_from, read_touch_order,
uffdkvm/_touchorder.py): cut short, huge, binary, not UTF-8, indices that
are no page of the region, a FIFO, /dev/zero, a directory, a file that is
not there. Each is a ConfigError on replay_from naming the path (and the
line, where there is one), raised without hanging and without reading
more than a bounded amount into memory."""
from __future__ import annotations

import itertools
import os
import threading
import time
import tracemalloc

import pytest

import uffdkvm
from uffdkvm import ConfigError, _touchorder as touchorder

PAGES = 16                        # the region below: 64 KiB of 4 KiB pages
REGION = dict(vcpus=1, mem_per_vcpu=PAGES * 4096, prefetch="replay")


def refused(path, *match):
    """The ConfigError a Config with replay_from=path raises; it names
    replay_from, the path, and each of match."""
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as info:
        uffdkvm.Config(**REGION, replay_from=path)
    assert time.monotonic() - t0 < 5
    message = str(info.value)
    assert info.value.field == "replay_from", message
    assert message.startswith("replay_from: ") and repr(os.fspath(path)) in message, message
    for m in match:
        assert m in message, message
    return message


def saved(tmp_path, order=range(PAGES)):
    path = tmp_path / "order.txt"
    touchorder.write(path, list(order), 4096)
    return path


def test_a_saved_order_reads_back(tmp_path):
    path = saved(tmp_path, range(PAGES - 1, -1, -1))
    assert uffdkvm.Config(**REGION, replay_from=path).replay_from == tuple(range(PAGES))[::-1]


def test_a_file_cut_mid_line_is_refused(tmp_path):
    path = saved(tmp_path, [3, 14, 15, 9, 12])
    data = path.read_bytes()
    path.write_bytes(data[:-2])   # "12\n" cut to "1"
    refused(path, "line 6:", "'1' ends without a newline", "cut short")


def test_a_file_cut_at_a_line_end_is_a_shorter_order(tmp_path):
    """head -n 3 of a saved order: whole lines, a valid replay of fewer pages."""
    path = saved(tmp_path, [3, 14, 15, 9, 12])
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:3]))
    assert uffdkvm.Config(**REGION, replay_from=path).replay_from == (3, 14)


def test_a_page_size_longer_than_any_is_refused_at_its_line(tmp_path):
    """Found by tests/fuzz/touch_order.py: a header whose page size had
    4,000 digits was read, and written back made a header past the
    longest line read, which then failed to read."""
    path = tmp_path / "order.txt"
    path.write_text(f"# uffdkvm touch_order: 1 page indices ({'9' * 4000}-byte pages\n0\n")
    with pytest.raises(touchorder.FormatError, match="line 1: a page size of 4000 digits"):
        touchorder.read(path)
    path.write_text(f"# uffdkvm touch_order: 1 page indices ({2**64 - 1}-byte pages\n0\n")
    assert touchorder.read(path) == ((0,), 2**64 - 1)


def test_a_hand_written_file_may_end_without_a_newline(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("1\n2\n3")
    assert uffdkvm.Config(**REGION, replay_from=path).replay_from == (1, 2, 3)


def test_more_lines_than_the_region_has_pages_stop_at_the_first_too_many(tmp_path):
    path = tmp_path / "long.txt"
    path.write_text("".join(f"{i}\n" for i in range(PAGES)) + "0\n" * 10_000)
    refused(path, f"line {PAGES + 1}:", f"more page indices than the region's {PAGES} pages")


def test_a_file_larger_than_any_order_of_the_region_is_refused_unread(tmp_path):
    """A 4 GiB file (sparse): refused by its size, before a byte is read."""
    path = tmp_path / "huge.txt"
    with open(path, "wb") as f:
        f.truncate(4 << 30)
    tracemalloc.start()
    try:
        refused(path, f"is {4 << 30} bytes, more than a touch order of the region's "
                      f"{PAGES} pages can be")
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()


def test_a_gigabyte_line_is_refused_at_its_first_4_kib(tmp_path):
    """read_touch_order knows no region: a 1 GiB line with no newline is
    still read only up to the longest line a touch order has."""
    path = tmp_path / "line.txt"
    with open(path, "wb") as f:
        f.write(b"1" * (1 << 20))
        f.truncate(1 << 30)
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=f"line 1: longer than {touchorder.MAX_LINE_BYTES} "
                                              f"bytes") as info:
            uffdkvm.read_touch_order(path)
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()
    assert info.value.field == "replay_from" and str(path) in str(info.value)


def test_binary_garbage_is_refused_at_its_line(tmp_path):
    path = saved(tmp_path, [1, 2])
    with open(path, "ab") as f:
        f.write(bytes(range(256)) * 4)
    refused(path, "line 4:")   # the header, 1, 2, then the garbage


@pytest.mark.parametrize("data,line,why", [
    (b"1\n2\n\xff\xfe3\n", 3, "not UTF-8 text (byte 0xff at column 1)"),
    (b"1\n\xc3\n", 2, "not UTF-8 text (byte 0xc3 at column 1)"),
    (b"1\n2\x003\n", 2, "is not a page index"),
    ("0\n\u00b2\n".encode(), 2, "'\u00b2' is not a page index"),     # a digit to str.isdigit()
    ("0\n\u0663\n".encode(), 2, "'\u0663' is not a page index"),     # ARABIC-INDIC THREE
])
def test_text_that_is_not_an_ascii_index_is_refused_at_its_line(tmp_path, data, line, why):
    path = tmp_path / "bad.txt"
    path.write_bytes(data)
    refused(path, f"line {line}:", why)


@pytest.mark.parametrize("text,why", [
    ("-1", "'-1' is not a page index"),
    ("+1", "'+1' is not a page index"),
    ("1e3", "'1e3' is not a page index"),
    ("18446744073709551616", "18446744073709551616 is not a page index: past 2^64 - 1"),
    ("9" * 300, "is not a page index"),
    (str(PAGES), f"page {PAGES} is beyond the region's {PAGES} pages"),
    ("18446744073709551615", f"beyond the region's {PAGES} pages"),
])
def test_an_index_that_is_no_page_of_the_region_is_refused_at_its_line(tmp_path, text, why):
    path = tmp_path / "bad.txt"
    path.write_text(f"# mine\n0\n{text}\n")
    refused(path, "line 3:", why)


def test_a_page_given_twice_is_refused_at_its_second_line(tmp_path):
    path = saved(tmp_path, [5, 6, 5])
    refused(path, "line 4:", "page 5 again")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "order.fifo"
    os.mkfifo(fifo)
    outcome = []
    t = threading.Thread(target=lambda: outcome.append(_refusal(fifo)), daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # blocked in open(): let it go, then fail
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        t.join(10)
        pytest.fail("replay_from waited on a FIFO for a writer")
    assert "it is a FIFO, not a touch-order file" in outcome[0], outcome


def _refusal(path):
    try:
        uffdkvm.Config(**REGION, replay_from=path)
    except ConfigError as e:
        return str(e)
    return "accepted"


@pytest.mark.parametrize("path,kind", [("/dev/zero", "a character device"),
                                       ("/dev/null", "a character device")])
def test_a_device_is_refused_unread(path, kind):
    refused(path, f"it is {kind}, not a touch-order file")


def test_a_directory_is_refused(tmp_path):
    refused(tmp_path, "it is a directory, not a touch-order file")


def test_a_file_that_is_not_there_is_refused(tmp_path):
    path = saved(tmp_path)
    os.unlink(path)
    refused(path, "cannot read", "No such file or directory")


def test_an_unreadable_file_is_refused(tmp_path):
    if os.geteuid() == 0:
        # root reads anything: a path through a file instead of a directory
        refused(saved(tmp_path) / "x", "cannot read", "Not a directory")
    else:
        path = saved(tmp_path)
        path.chmod(0)
        refused(path, "cannot read", "Permission denied")


def test_an_endless_sequence_stops_past_the_regions_pages():
    with pytest.raises(ConfigError, match=f"more than the region's {PAGES} pages") as info:
        uffdkvm.Config(**REGION, replay_from=itertools.count())
    assert info.value.field == "replay_from"
