"""Config: defaults, normalisation, and a clear error for each kind of bad value."""
import dataclasses

import pytest

import uffdkvm
from uffdkvm import Config, ConfigError


def test_defaults_match_the_documented_ones():
    c = Config()
    assert (c.vcpus, c.mem_per_vcpu, c.backing, c.uffd_mode, c.single_uffd, c.readers,
            c.wait, c.delay_us, c.overlap) == (
        1, 1 << 30, "anonymous", "missing", False, 1, "epoll_exclusive", 0, False)


@pytest.mark.parametrize("text,expected", [
    ("64M", 64 << 20), ("1G", 1 << 30), ("4096", 4096), ("16k", 16 << 10),
    ("2GiB", 2 << 30), (" 8 M ", 8 << 20), (12288, 12288),
])
def test_sizes_parse_to_bytes(text, expected):
    assert Config(mem_per_vcpu=text).mem_per_vcpu == expected


def test_names_are_case_insensitive_and_none_means_no_uffd():
    c = Config(backing="SHMEM", uffd_mode="MINOR", wait="Poll")
    assert (c.backing, c.uffd_mode, c.wait) == ("shmem", "minor", "poll")
    assert Config(uffd_mode="none").uffd_mode is None


def test_config_is_frozen_and_replace_validates():
    c = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.vcpus = 3
    assert c.replace(vcpus=3).vcpus == 3
    with pytest.raises(ConfigError, match="vcpus"):
        c.replace(vcpus=0)
    with pytest.raises(ConfigError, match="not a Config field"):
        c.replace(vcpu=2)


@pytest.mark.parametrize("fields,field", [
    (dict(vcpus=0), "vcpus"),
    (dict(vcpus="2"), "vcpus"),
    (dict(vcpus=True), "vcpus"),
    (dict(vcpus=5000), "vcpus"),
    (dict(vcpus=64, mem_per_vcpu="2T"), "mem_per_vcpu"),
    (dict(mem_per_vcpu="64Q"), "mem_per_vcpu"),
    (dict(mem_per_vcpu=1000), "mem_per_vcpu"),
    (dict(mem_per_vcpu=0), "mem_per_vcpu"),
    (dict(mem_per_vcpu=1.5), "mem_per_vcpu"),
    (dict(backing="tmpfs"), "backing"),
    (dict(uffd_mode="writeprotect"), "uffd_mode"),
    (dict(uffd_mode="minor"), "uffd_mode"),  # on anonymous memory
    (dict(single_uffd="yes"), "single_uffd"),
    (dict(readers=0), "readers"),
    (dict(readers=100000), "readers"),
    (dict(wait="select"), "wait"),
    (dict(delay_us=-1), "delay_us"),
    (dict(delay_us=10**9), "delay_us"),
    (dict(overlap=1), "overlap"),
    (dict(guest_work=-1), "guest_work"),
    (dict(guest_work=10**7), "guest_work"),
    (dict(timeout_s=0), "timeout_s"),
    (dict(timeout_s="soon"), "timeout_s"),
])
def test_bad_values_raise_a_value_error_naming_the_field(fields, field):
    with pytest.raises(ValueError) as info:
        Config(**fields)
    assert isinstance(info.value, uffdkvm.UffdkvmError)
    assert str(info.value).startswith(field + ":"), str(info.value)


def test_minor_on_anonymous_says_how_to_fix_it():
    with pytest.raises(ConfigError, match="backing='shmem'"):
        Config(uffd_mode="minor")


def test_run_rejects_what_is_not_a_config():
    with pytest.raises(ConfigError, match="Config"):
        uffdkvm.run({"vcpus": 2})
    with pytest.raises(ConfigError, match="not a Config field"):
        uffdkvm.run(vcpu=2)


def test_a_region_larger_than_the_host_is_refused_before_anything_runs():
    with pytest.raises(uffdkvm.HostUnsupportedError, match="MemAvailable"):
        uffdkvm.run(vcpus=64, mem_per_vcpu="64G")


def test_derived_sizes():
    c = Config(vcpus=4, mem_per_vcpu="64M")
    assert (c.region_bytes, c.pages_per_vcpu, c.uffds) == (256 << 20, 16384, 4)
    assert Config(vcpus=4, overlap=True).uffds == 1
    assert Config(vcpus=4, single_uffd=True).uffds == 1
    assert Config(vcpus=4, uffd_mode=None).uffds == 0
    assert Config(vcpus=4, mem_per_vcpu="64M", overlap=True).region_bytes == 64 << 20
