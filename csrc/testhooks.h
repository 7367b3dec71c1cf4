/* SPDX-License-Identifier: MIT */
/*
 * Test-only fault injection, for the test suites (tests/c, uffdkvm._testing):
 * each makes one thing go wrong so that an error path can be exercised for
 * real. Compiled only where UKVM_TEST_HOOKS is defined (tests/c/Makefile;
 * setup.py with UFFDKVM_TEST_HOOKS=1): a user's build has neither these
 * names nor any injection code. ukvm.h includes this header in such builds
 * and then gives struct ukvm_config the fields below, after all the others.
 */
#ifndef UKVM_TESTHOOKS_H
#define UKVM_TESTHOOKS_H

#ifdef UKVM_TEST_HOOKS

#include <stdint.h>

enum ukvm_inject {
	UKVM_INJECT_NONE = 0,
	UKVM_INJECT_RESOLVE_EIO,	/* resolve number inject_after fails with EIO */
	UKVM_INJECT_READER_EXIT,	/* the reader taking fault inject_after leaves silently */
	UKVM_INJECT_GUEST_FAULT,	/* page inject_after of vCPU 0 is unmapped: #PF */
	UKVM_INJECT_GUEST_MMIO,		/* page inject_after of vCPU 0 maps no memory: MMIO exit */
	UKVM_INJECT_THREAD_CREATE,	/* thread number inject_after fails to start (EAGAIN) */
	UKVM_INJECT_CORRUPT_PAGE,	/* page inject_after is damaged before verification */
	/*
	 * A thread that will not stop: when its run is over it stays
	 * inject_after milliseconds more, ignoring stop and kicks. READER:
	 * the last reader of uffd 0; VCPU: the last vCPU.
	 */
	UKVM_INJECT_READER_STALL,
	UKVM_INJECT_VCPU_STALL,
	/* Every resolving ioctl fails with EAGAIN for inject_after ms from the first. */
	UKVM_INJECT_RESOLVE_EAGAIN,
	/*
	 * Reader 0 of uffd 0 touches a PROT_NONE page as it starts: a real
	 * SIGSEGV, which kills the process (its handler, faulthandler say,
	 * runs first). For a child process only.
	 */
	UKVM_INJECT_READER_CRASH,
	UKVM_INJECT_TSC_OFFSET,		/* the host sees every guest TSC inject_after cycles ahead */
	UKVM_INJECT_NO_KVM_TSC_OFFSET,	/* KVM's TSC offset is taken as unknown */
	UKVM_INJECT_UNFAULTED_PAGE,	/* page inject_after is mapped before userfaultfd is */
	UKVM_INJECT_TSC_JUMP,		/* after the walk the guest TSC reads inject_after ahead */
	UKVM_INJECT_NO_EXACT_ADDRESS,	/* no UFFD_FEATURE_EXACT_ADDRESS, as on Linux < 5.18 */
	UKVM_INJECT_NO_MOVE,		/* no UFFD_FEATURE_MOVE, as on Linux < 6.8 */
	UKVM_INJECT_WP_NO_SAVE,		/* uffd_mode wp: pages are un-protected without saving */
	/* No UFFD_FEATURE_PAGEFAULT_FLAG_WP nor WP_HUGETLBFS_SHMEM, as on a kernel without uffd-wp */
	UKVM_INJECT_NO_WP_FEATURES,
	/* source file or remote: the page (of the backing's size) holding byte
	 * inject_after * 4 KiB of the region gets the next page's bytes of the file
	 * (the first page's, at the end), in whichever fetch brings it */
	UKVM_INJECT_SOURCE_WRONG_OFFSET,
	/*
	 * touch_percent, access zipf: the host's record drops the first page
	 * the guest touches from page inject_after on (the guest still
	 * touches it), as a host-side subset that disagreed with the guest's.
	 */
	UKVM_INJECT_UNTOUCHED_PAGE,
	/*
	 * wait io_uring: the setup's check reads the uffd with RWF_NOWAIT, so
	 * the kernel completes the read of the empty uffd at once with EAGAIN,
	 * as a kernel whose io_uring does not retry reads of O_NONBLOCK files
	 * (before Linux 5.15) does.
	 */
	UKVM_INJECT_RING_NOWAIT,
	/*
	 * backing guest_memfd: the VM's KVM_CAP_GUEST_MEMFD is taken as 0, as a
	 * KVM_X86_DEFAULT_VM's is from Linux 6.8 to 6.17 (/dev/kvm's answer is
	 * still asked of /dev/kvm).
	 */
	UKVM_INJECT_NO_VM_GUEST_MEMFD,
	/*
	 * resolver vcpu on huge units (anonymous_thp): every resolved fault
	 * waits for its 4 KiB page to be mapped, as after another thread's
	 * half-done copy, and the inject_after-th wait's mincore() fails for
	 * real (an address not page-aligned: EINVAL).
	 */
	UKVM_INJECT_MINCORE_FAIL,
	/*
	 * Letting go of a uffd a reader still holds (ukvm_pool_release_uffd):
	 * uffd 0's last reader stays inject_after x 1.5 s after its run (as
	 * READER_STALL), and the first inject_after dup3() swaps of a uffd for
	 * /dev/null fail for real (onto their own fd number: EINVAL); the uffd
	 * stays held, and a vCPU waiting on it with it, until a retry
	 * succeeds (a swap, or a close once the reader has gone).
	 */
	UKVM_INJECT_RELEASE_DUP3,
	/*
	 * stats full without guest_timing (online.h): a resolver tries a drain
	 * every inject_after events it queues (not UKVM_ONLINE_DRAIN_AT), so a
	 * small run merges its events in many drains while it runs...
	 */
	UKVM_INJECT_ONLINE_DRAIN,
	/* ...and as ONLINE_DRAIN, but every drain leaves the last queue out: a broken merge. */
	UKVM_INJECT_ONLINE_SKIP_QUEUE,
	/*
	 * The last vCPU, once the run has begun, never enters the guest: it
	 * sleeps until the run is stopped, so the run makes no progress and
	 * never ends by itself. A run without a time limit (timeout_ns 0)
	 * then fails after inject_after ms without progress, not after
	 * ukvm_experiment_finish()'s own limit (watch.c, NO_PROGRESS_NS).
	 */
	UKVM_INJECT_VCPU_HANG,
	/*
	 * dirty_tracking: at the end of iteration inject_after (1 the first
	 * tracked pass), the harvest loses the first page it found (a tracker
	 * that misses a write), or the re-protect is skipped (KVM_CLEAR_DIRTY_LOG,
	 * KVM_RESET_DIRTY_RINGS, PAGEMAP_SCAN's write-protect), as a tracker
	 * that forgets to re-arm. "bitmap" re-protects as it reads: nothing to skip.
	 */
	UKVM_INJECT_DIRTY_DROP_PAGE,
	UKVM_INJECT_DIRTY_SKIP_REPROTECT,
	/*
	 * migration: the tracker never reports 4 KiB page inject_after of the
	 * region (a tracker blind to it): a write after its send in round 1
	 * leaves the destination's copy stale, and the check against the
	 * source's at the stop must fail the run.
	 */
	UKVM_INJECT_MIGRATE_BLIND_PAGE,
	/*
	 * backing guest_memfd: a shmem memfd stands in for the guest_memfd
	 * (made, mapped and given to KVM as backing shmem's is, no
	 * KVM_CAP_GUEST_MEMFD asked), so UFFDIO_REGISTER succeeds on any
	 * kernel, as on one whose userfaultfd registers guest_memfd: what
	 * follows a successful registration (experiment/gmem.c) is reached.
	 */
	UKVM_INJECT_GMEM_UFFD_REGISTERS,
	/*
	 * guest_timing: KVM's TSC offset of each vCPU reads inject_after cycles
	 * more at every reading than at the one before, as KVM's own moves on a
	 * host whose TSC it finds unstable (the guest's TSC is left alone, so the
	 * sync exits still bracket one offset).
	 */
	UKVM_INJECT_TSC_OFFSET_MOVES,
	UKVM_INJECT__COUNT
};

/* The last members of struct ukvm_config (ukvm.h) in a test build. */
#define UKVM_TEST_CONFIG_FIELDS						\
	enum ukvm_inject inject;	/* what goes wrong; NONE by default */	\
	uint64_t inject_after;		/* when, or how much (see each kind) */

#endif /* UKVM_TEST_HOOKS */
#endif /* UKVM_TESTHOOKS_H */
