"""Every backing x uffd_mode runs and verifies, or says exactly why not."""
import fcntl
import re
import threading
import time

import pytest

from helpers import hostfacts
import uffdkvm
import uffdkvm.host.facts
from helpers.hostfacts import (GUEST_MEMFD_BYPASSES_UFFD, NO_GUEST_MEMFD, NO_GUEST_MEMFD_UFFD,
                               NO_UFFD_MINOR_SHMEM, host_skip)
from helpers.runs import run_or_skip, run_with_fault
from uffdkvm.config import BACKING_PAGE_SIZES, SHARED_BACKINGS
from uffdkvm.support import modes_for

pytestmark = pytest.mark.kvm

COMBOS = [(b, m) for b in BACKING_PAGE_SIZES for m in modes_for(b)]


def size_for(backing):
    """Small, but at least two of the backing's pages per vCPU."""
    page = BACKING_PAGE_SIZES[backing]
    return (1, page) if page >= 1 << 30 else (2, max(2 * page, 4 << 20))


def touch_for(backing):
    """The share of its 4 KiB pages the guest touches: all, but 1% of a
    1 GiB page (262,144 accesses, some 10 s where the guest is emulated).
    The fault is the same one, and verification still reads every byte of
    the page."""
    return 1 if BACKING_PAGE_SIZES[backing] >= 1 << 30 else 100


# The VmFlags /proc/self/smaps shows on a range registered with userfaultfd, per mode.
UFFD_VMFLAGS = {"missing": "um", "minor": "ui", "wp": "uw"}


def smaps_pass_seconds():
    """How long one read of /proc/self/smaps takes here (milliseconds on a
    host, a good part of a second in an emulated guest)."""
    start = time.monotonic()
    with open("/proc/self/smaps") as f:
        for _ in f:
            pass
    return time.monotonic() - start


def registered_mappings(**fields):
    """Runs an experiment that must verify (skipping as run_or_skip does)
    while a thread reads /proc/self/smaps: the kernel's own account of the
    mappings that are registered with userfaultfd during the run. Returns
    (result, {(start, end): (name, KernelPageSize in bytes, the uffd
    VmFlags, its THP advice: "hg" for MADV_HUGEPAGE, "nh" for
    MADV_NOHUGEPAGE, or "")})."""
    seen, done = {}, threading.Event()

    def watch():
        while not done.is_set():
            with open("/proc/self/smaps") as f:
                for line in f:
                    if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                        parts = line.split()
                        start, end = (int(x, 16) for x in parts[0].split("-"))
                        name, page = " ".join(parts[5:]), None
                    elif line.startswith("KernelPageSize:"):
                        page = int(line.split()[1]) * 1024
                    elif line.startswith("VmFlags:"):
                        vmflags = set(line.split()[1:])
                        flags = vmflags & set(UFFD_VMFLAGS.values())
                        advice = "".join(sorted(vmflags & {"hg", "nh"}))
                        if flags:
                            seen[start, end] = (name, page, frozenset(flags), advice)
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        r = run_or_skip(**fields)
    finally:
        done.set()
        watcher.join()
    return r, seen


def userfault_cap():
    """A default VM's KVM_CHECK_EXTENSION(245), KVM_CAP_USERFAULT out of tree,
    by the tests' own probe."""
    value, why = hostfacts._vm_cap(hostfacts.KVM_CAP_USERFAULT, "KVM_CAP_USERFAULT")
    assert value is not None, why
    return value


def registered_guest_memfd_refusal(mode):
    """What uffdkvm must say where userfaultfd registers guest_memfd."""
    cap = userfault_cap()
    return (
        f"uffd_mode '{mode}' on backing guest_memfd: this kernel's userfaultfd registers "
        "guest_memfd memory (UFFDIO_REGISTER succeeded), but the guest's accesses would not "
        "fault through it: KVM maps guest_memfd pages for the guest from the file itself, "
        "never through the host's mapping that userfaultfd watches, so "
        + ("no minor fault would arrive (every page would be mapped as it was filled)"
           if mode == "minor" else
           "no missing fault would arrive (every page would read as zeros)")
        + ". Only KVM Userfault (memslot flag KVM_MEM_USERFAULT) makes the guest's accesses "
        "exit to userspace, and uffdkvm does not use it yet; this KVM "
        + ("offers it" if cap > 0 else "does not offer it either")
        + f" (KVM_CAP_USERFAULT, 245 out of tree, is {cap} on the VM). Run guest_memfd with "
        "uffd_mode=None, or demand-page backing 'shmem'")


def assert_guest_memfd_uffd_refused(message, mode):
    """The refusal of uffd_mode `mode` on guest_memfd gives this kernel's
    reason, as the tests' own probes (hostfacts, straight to the kernel)
    find it: no guest_memfd; userfaultfd cannot register it; or it
    registers but a guest's read of a registered page never reaches the
    uffd. On a kernel where the guest's accesses do fault through
    userfaultfd the refusal would be wrong, and this fails."""
    if NO_GUEST_MEMFD.holds:
        assert message.startswith("backing guest_memfd: KVM_CAP_GUEST_MEMFD is "), message
    elif NO_GUEST_MEMFD_UFFD.holds:
        assert "(EINVAL)" in NO_GUEST_MEMFD_UFFD.evidence, NO_GUEST_MEMFD_UFFD.evidence
        assert message == (
            "UFFDIO_REGISTER(guest_memfd): Invalid argument (EINVAL). This kernel's "
            f"userfaultfd cannot register guest_memfd memory (uffd_mode {mode.upper()}); run "
            "guest_memfd with uffd_mode=None, or demand-page backing 'shmem' (even a kernel "
            "that registers guest_memfd gives no fault for the guest's accesses: "
            "docs/backings.md)"), message
    else:
        assert GUEST_MEMFD_BYPASSES_UFFD.holds, (
            "userfaultfd registers guest_memfd here and the guest's accesses reach it "
            f"({GUEST_MEMFD_BYPASSES_UFFD.evidence}), yet uffdkvm refused: {message}")
        assert message == registered_guest_memfd_refusal(mode)


@pytest.mark.parametrize("backing,mode", COMBOS, ids=[f"{b}-{m}" for b, m in COMBOS])
def test_backing_runs_and_verifies(kvm, hugepages, backing, mode):
    vcpus, mem = size_for(backing)
    if backing == "guest_memfd" and mode is not None:
        # No kernel lets uffdkvm demand-page guest_memfd: refused before the run, each
        # kernel for its own reason.
        with pytest.raises(uffdkvm.HostUnsupportedError) as info:
            uffdkvm.run(vcpus=vcpus, mem_per_vcpu=mem, backing=backing, uffd_mode=mode,
                        readers=2)
        assert_guest_memfd_uffd_refused(str(info.value), mode)
        return
    page = BACKING_PAGE_SIZES[backing]
    faults = vcpus * mem // page
    # Slow enough (0.4 s in all, or ten of the watcher's passes over smaps
    # where a pass is slower: an emulated guest) that the watcher sees the
    # run; its 2 readers share the faults.
    total_us = max(400_000, int(10e6 * smaps_pass_seconds()))
    delay_us = 0 if mode is None else min(1_000_000, max(100, 2 * total_us // faults))
    touch = touch_for(backing)
    r, mappings = registered_mappings(vcpus=vcpus, mem_per_vcpu=mem, backing=backing,
                                      uffd_mode=mode, readers=2, delay_us=delay_us,
                                      touch_percent=touch)
    assert r.page_size == page  # the unit the core resolved in
    # Faults are resolved a backing page at a time, each exactly once.
    assert r.faults == (0 if mode is None else faults)
    if touch == 100:
        assert all(v.pages == mem // 4096 for v in r.vcpus)
    else:  # a seeded share, about touch percent
        assert all(0 < v.pages < mem // 4096 * 2 * touch // 100 for v in r.vcpus)
    if mode is None:
        assert not mappings, mappings
        return
    # The kernel's view of the guest memory: registered in the mode asked
    # for, over the whole region, in pages of the backing's size (THP: 4 KiB
    # pages that the kernel was advised to make huge; anonymous: advised
    # not to, so every fault is a 4 KiB one), shared (a memfd) or private
    # (anonymous, hugetlb's "/anon_hugepage") as the backing is.
    assert sum(end - start for start, end in mappings) == vcpus * mem, mappings
    thp = backing == "anonymous_thp"
    for name, kernel_page, flags, advice in mappings.values():
        assert flags == {UFFD_VMFLAGS[mode]}, mappings
        assert kernel_page == (4096 if thp else page), mappings
        assert advice == {"anonymous_thp": "hg", "anonymous": "nh"}.get(backing, ""), mappings
        if backing in SHARED_BACKINGS:
            assert name.startswith("/memfd:") or "gmem" in name, mappings
        else:
            assert name in ("", "/anon_hugepage (deleted)"), mappings


@pytest.mark.parametrize("mode", ["missing", "minor"])
def test_guest_memfd_with_userfaultfd_is_refused_before_the_run_for_the_kernels_reason(
        kvm, mode):
    """A run and a probe (which builds the VM, the memory and the uffds and
    runs nothing) are refused alike: the refusal comes at setup, before any
    vCPU runs, never as a run that cannot verify."""
    with pytest.raises(uffdkvm.HostUnsupportedError) as info:
        uffdkvm.run(mem_per_vcpu="1M", backing="guest_memfd", uffd_mode=mode)
    assert_guest_memfd_uffd_refused(str(info.value), mode)
    with pytest.raises(uffdkvm.HostUnsupportedError) as probed:
        uffdkvm.probe(mem_per_vcpu="1M", backing="guest_memfd", uffd_mode=mode)
    assert str(probed.value) == str(info.value)


@pytest.mark.parametrize("mode", ["missing", "minor"])
def test_guest_memfd_that_userfaultfd_registers_is_refused_saying_why(kvm, mode):
    """Where userfaultfd registers guest_memfd (here a shmem memfd stands in
    for it, test hook, so that registration succeeds on any kernel), the
    refusal says why no fault would come, and whether this KVM offers KVM
    Userfault (its answer asked by the tests' own probe)."""
    if mode == "minor" and NO_UFFD_MINOR_SHMEM.holds:
        host_skip(NO_UFFD_MINOR_SHMEM, "the stand-in is shmem: MINOR needs it on shmem")
    with pytest.raises(uffdkvm.HostUnsupportedError) as info:
        run_with_fault(vcpus=1, mem_per_vcpu="64K", backing="guest_memfd", uffd_mode=mode,
                       fault="guest_memfd_uffd_registers")
    assert str(info.value) == registered_guest_memfd_refusal(mode)
    # The hook alone refuses nothing: the stand-in without a uffd_mode runs and verifies.
    r = run_with_fault(vcpus=1, mem_per_vcpu="64K", backing="guest_memfd", uffd_mode=None,
                       fault="guest_memfd_uffd_registers")
    assert r.verified, r.verify_message


def guest_memfd_answers():
    """KVM_CHECK_EXTENSION(KVM_CAP_GUEST_MEMFD) asked of /dev/kvm and of a
    fresh VM of type 0 (KVM_X86_DEFAULT_VM, as uffdkvm makes), by the tests'
    own probe."""
    with hostfacts._Fds() as fds:
        kvm, vm, why = hostfacts._create_vm(fds)
        assert vm is not None, why
        cap = hostfacts.KVM_CAP_GUEST_MEMFD
        return (fcntl.ioctl(kvm, hostfacts.KVM_CHECK_EXTENSION, cap),
                fcntl.ioctl(vm, hostfacts.KVM_CHECK_EXTENSION, cap))


def test_host_info_asks_guest_memfd_of_dev_kvm_and_of_the_vm_type_uffdkvm_creates(kvm):
    """kvm_caps is /dev/kvm's answer, vm_caps a default VM's; only the VM's
    says whether backing="guest_memfd" can work (with the host's mmap of it)."""
    h = uffdkvm.HostInfo.current()
    on_dev_kvm, on_vm = guest_memfd_answers()
    assert (h.kvm_caps["guest_memfd"], h.vm_caps["guest_memfd"]) == (on_dev_kvm, on_vm)
    mmapable = h.vm_caps["guest_memfd"] > 0 and h.vm_caps.get("guest_memfd_flags", 0) & 1
    assert bool(mmapable) is not NO_GUEST_MEMFD.holds, (h.vm_caps, NO_GUEST_MEMFD.evidence)


def test_host_info_keeps_dev_kvm_and_vm_answers_apart(kvm, monkeypatch):
    """As Linux 6.12 answers (x86, a KVM with private memory): 1 on /dev/kvm,
    0 on a default VM. The kernel's own answers, but the VM's turned to 0 on
    the VM's fd only: a HostInfo that asked one fd for both fails this."""
    real_ioctl, vm_fds = fcntl.ioctl, set()

    def ioctl(fd, request, arg=0, *rest):
        answer = real_ioctl(fd, request, arg, *rest)
        if request == hostfacts.KVM_CREATE_VM:
            vm_fds.add(answer)
        elif (request, arg) == (hostfacts.KVM_CHECK_EXTENSION, hostfacts.KVM_CAP_GUEST_MEMFD):
            return 0 if fd in vm_fds else 1
        return answer

    monkeypatch.setattr(uffdkvm.host.facts.fcntl, "ioctl", ioctl)
    h = uffdkvm.HostInfo.current()
    assert vm_fds, "HostInfo made no VM to ask"
    assert (h.kvm_caps["guest_memfd"], h.vm_caps["guest_memfd"]) == (1, 0)


def test_guest_memfd_refused_by_the_vm_types_answer_names_both(kvm):
    """The VM's KVM_CAP_GUEST_MEMFD taken as 0 (test hook), /dev/kvm's asked
    of the kernel: the refusal gives each, under its own name."""
    on_dev_kvm, _ = guest_memfd_answers()
    with pytest.raises(uffdkvm.HostUnsupportedError) as info:
        run_with_fault(mem_per_vcpu="64K", backing="guest_memfd", uffd_mode=None,
                       fault="no_vm_guest_memfd")
    if on_dev_kvm > 0:
        assert str(info.value) == (
            f"backing guest_memfd: KVM_CAP_GUEST_MEMFD is {on_dev_kvm} on /dev/kvm but 0 on "
            "the VM type uffdkvm creates (KVM_X86_DEFAULT_VM): this KVM offers guest_memfd "
            "only to VM types with private memory (KVM_X86_SW_PROTECTED_VM, SEV-SNP, TDX), "
            "as x86 KVM does from Linux 6.8 to 6.17; a default VM has an mmap-able "
            "guest_memfd from Linux 6.18")
    else:
        assert str(info.value) == (
            "backing guest_memfd: KVM_CAP_GUEST_MEMFD is 0 on /dev/kvm and 0 on the VM type "
            "uffdkvm creates (KVM_X86_DEFAULT_VM): this KVM has no guest_memfd (Linux 6.8+ "
            "built with CONFIG_KVM_PRIVATE_MEM); a default VM has an mmap-able guest_memfd "
            "from Linux 6.18")
    # Without the hook the VM's own answer decides.
    if not NO_GUEST_MEMFD.holds:
        assert uffdkvm.run(mem_per_vcpu="64K", backing="guest_memfd", uffd_mode=None).verified


def test_backing_support_probes_every_combination(kvm):
    support = uffdkvm.backing_support()
    assert set(support) == set(BACKING_PAGE_SIZES)
    for backing, modes in support.items():
        assert set(modes) == set(modes_for(backing))
        for why in modes.values():
            assert why is None or (isinstance(why, str) and why)
    assert support["anonymous"] == {"missing": None, "wp": None, None: None}
    # guest_memfd under userfaultfd: never None, each kernel's own reason.
    for mode in ("missing", "minor"):
        assert_guest_memfd_uffd_refused(support["guest_memfd"][mode], mode)


def test_too_few_huge_pages_fail_before_the_vm_with_the_fix(kvm):
    """Asking for more huge pages than the pool holds says how many and where."""
    free = int(open("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages").read())
    pages = free + 64
    with pytest.raises(uffdkvm.HostUnsupportedError) as info:
        uffdkvm.run(mem_per_vcpu=pages * (2 << 20), backing="anonymous_hugetlb")
    message = str(info.value)
    assert f"needs {pages} free huge pages of 2 MiB" in message
    assert "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages" in message


def test_no_pool_can_outgrow_the_host(kvm):
    total = hostfacts.mem_info("MemTotal")
    with pytest.raises(uffdkvm.HostUnsupportedError, match="^mem_per_vcpu: the run needs"):
        uffdkvm.run(vcpus=2, mem_per_vcpu=(total // 2 + (1 << 30)) >> 21 << 21,
                    backing="anonymous_hugetlb")


def test_hugetlb_sizes_must_be_whole_pages():
    with pytest.raises(uffdkvm.ConfigError, match="mem_per_vcpu: must be a positive multiple "
                                                  "of 2097152"):
        uffdkvm.Config(backing="anonymous_hugetlb", mem_per_vcpu="3M")
    with pytest.raises(uffdkvm.ConfigError, match="1073741824"):
        uffdkvm.Config(backing="anonymous_hugetlb_1gb", mem_per_vcpu="512M")
