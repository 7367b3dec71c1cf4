"""Skips for what this build or this host cannot do, each citing the host
fact behind it (hostfacts.py), as the skip audit asks."""
import uffdkvm

from .hostfacts import (BUILT_WITHOUT_LIBURING, BUILT_WITHOUT_TEST_HOOKS, LOOPBACK_DOWN,
                        NO_IO_URING_UFFD, NO_KVM, NO_USERFAULTFD, WITHOUT_LIBCRYPTO, host_skip)

# What stops every experiment: the kvm fixture cites these.
KVM_FACTS = (NO_KVM, NO_USERFAULTFD)

# Fault injection (uffdkvm.testing._faults) is only in builds made with
# UFFDKVM_TEST_HOOKS=1; tests that inject skip elsewhere, citing the fact.
TEST_HOOKS = uffdkvm._core.TEST_HOOKS


def needs_test_hooks(detail="injects a failure", *, allow_module_level=False):
    """Skips, citing BUILT_WITHOUT_TEST_HOOKS, in a build without fault injection."""
    __tracebackhide__ = True
    if not TEST_HOOKS:
        host_skip(BUILT_WITHOUT_TEST_HOOKS, f"{detail}: build with UFFDKVM_TEST_HOOKS=1",
                  allow_module_level=allow_module_level)


def needs_io_uring(detail='wait="io_uring"'):
    """Skips, citing the fact, where this build or kernel cannot run
    wait="io_uring" (a build without liburing; a kernel that cannot wait for
    a uffd through io_uring)."""
    __tracebackhide__ = True
    if not uffdkvm._core.HAVE_IO_URING:
        host_skip(BUILT_WITHOUT_LIBURING, f"{detail}: build with liburing (liburing-dev)")
    if NO_IO_URING_UFFD.holds:
        host_skip(NO_IO_URING_UFFD, f"{detail}: {NO_IO_URING_UFFD.evidence}")


def needs_loopback(detail="talks TCP on 127.0.0.1"):
    """Skips, citing LOOPBACK_DOWN, where lo is not up (a page server over
    transport="tcp" listens on 127.0.0.1)."""
    __tracebackhide__ = True
    if LOOPBACK_DOWN.holds:
        host_skip(LOOPBACK_DOWN, f"{detail}: {LOOPBACK_DOWN.evidence}")


def needs_keys(detail="a page server with a key (every TCP one)"):
    """Skips, citing WITHOUT_LIBCRYPTO, where uffdkvm cannot check keys."""
    __tracebackhide__ = True
    if WITHOUT_LIBCRYPTO.holds:
        host_skip(WITHOUT_LIBCRYPTO, f"{detail}: {WITHOUT_LIBCRYPTO.evidence}")


def skip_without_kvm(kvm_reason):
    """Skips, citing the host facts, when kvm_reason (the kvm_reason
    fixture's) says the host cannot run experiments: for fixtures whose
    scope is wider than kvm's."""
    __tracebackhide__ = True
    if kvm_reason:
        host_skip(KVM_FACTS, f"host cannot run experiments: {kvm_reason}")
