"""fault_path_support(): every wait mode and resolver, by a real run."""
from __future__ import annotations

import subprocess
import sys

import pytest

import uffdkvm
from uffdkvm.config import RESOLVERS, WAITS

pytestmark = pytest.mark.kvm


def test_every_mode_is_tried_and_the_defaults_run(kvm):
    support = uffdkvm.fault_path_support()
    assert set(support["wait"]) == set(WAITS)
    assert set(support["resolver"]) == set(RESOLVERS)
    assert support["wait"]["epoll_exclusive"] is None
    assert support["resolver"]["readers"] is None
    # Every reason is a sentence of uffdkvm's, naming what is missing.
    for modes in support.values():
        for why in modes.values():
            assert why is None or len(why) > 20


def test_the_cli_lists_them(kvm):
    p = subprocess.run([sys.executable, "-m", "uffdkvm", "--list-backings"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert any(line.startswith("wait: ") and "epoll_exclusive" in line
               for line in p.stdout.splitlines())
    assert any(line.startswith("resolver: ") for line in p.stdout.splitlines())
