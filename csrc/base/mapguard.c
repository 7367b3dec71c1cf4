/* SPDX-License-Identifier: MIT */
/*
 * The SIGBUS guard around copies from a mapped file.
 *
 * A MAP_SHARED mapping of a file that another process truncates has no
 * page behind the bytes past the new end: touching them raises SIGBUS,
 * which by default kills the process (a Jupyter kernel with it). A copy
 * from such a mapping sets a per-thread jump point and the source range;
 * the handler, finding the faulting address inside the range of its own
 * thread's copy, jumps back and the copy returns -EIO, like pread(2) at the
 * file's end.
 *
 * Why this and not a path through the kernel (process_vm_readv on this
 * process, or UFFDIO_COPY straight from the mapping, both of which turn
 * the fault into EFAULT): source_read="mmap" exists to measure the copy
 * from a mapping against pread(2), and a system call per page would make
 * it a second pread (process_vm_readv of 4 KiB takes 0.55 us on the
 * development host, memcpy 0.14 us: benchmarks/mapguard_cost.c). The guard
 * costs a sigsetjmp without the signal mask (no system call) and two
 * thread-local stores: within 0.5% of memcpy there. MADV_POPULATE_READ first
 * would not do: the file can still shrink between it and the copy.
 *
 * Everything else is left as it was. The first hold installs the handler
 * and it stays for the life of the process: a SIGBUS it does not own
 * (another address, another thread, one sent by kill(), any with no copy in
 * progress) goes to the handler it found then (faulthandler's, a C
 * program's, or the default action, which then kills as it would have), so
 * staying costs nothing. It is never put back or installed again: a handler
 * installed after ours that chains to the one it replaced (a crash
 * reporter, faulthandler) calls ours, and ours installed again over it
 * would call it back, and so on until the stack ran out. The price: a
 * handler put over ours that does not chain takes the guard out for the
 * runs after it, as it would during a run.
 *
 * The handler uses only async-signal-safe calls (sigaction, raise,
 * pthread_sigmask after the jump) and a thread-local of the initial-exec
 * model, read without a function call.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "base/mapguard.h"

struct mapguard_copy {
	sigjmp_buf env;
	uintptr_t lo, hi;	/* the source bytes, [lo, hi) */
};

static __thread struct mapguard_copy *volatile mapguard_current
	__attribute__((tls_model("initial-exec")));

static pthread_mutex_t mapguard_lock = PTHREAD_MUTEX_INITIALIZER;
static bool mapguard_installed;
static struct sigaction mapguard_prev;	/* the handler the first hold found */

/* The signal is not a guarded copy's: hand it to what was there before us. */
static void mapguard_chain(int sig, siginfo_t *si, void *uc)
{
	struct sigaction dfl;

	if (mapguard_prev.sa_flags & SA_SIGINFO) {
		mapguard_prev.sa_sigaction(sig, si, uc);
		return;
	}
	if (mapguard_prev.sa_handler != SIG_DFL && mapguard_prev.sa_handler != SIG_IGN) {
		mapguard_prev.sa_handler(sig);
		return;
	}
	if (mapguard_prev.sa_handler == SIG_IGN && si->si_code <= 0)
		return;		/* sent, and ignored: as the kernel would have */
	/*
	 * The default action: a fault comes again when the instruction is
	 * retried on return, a sent signal is sent again (delivered once this
	 * handler returns); either way it now kills, as it would have.
	 */
	memset(&dfl, 0, sizeof(dfl));
	dfl.sa_handler = SIG_DFL;
	sigemptyset(&dfl.sa_mask);
	sigaction(SIGBUS, &dfl, NULL);
	if (si->si_code <= 0)
		raise(SIGBUS);
}

static void mapguard_handler(int sig, siginfo_t *si, void *uc)
{
	struct mapguard_copy *c = mapguard_current;
	uintptr_t addr = (uintptr_t)si->si_addr;

	/* si_code > 0: raised by the kernel for a fault, not sent by a process. */
	if (c && si->si_code > 0 && addr >= c->lo && addr < c->hi) {
		mapguard_current = NULL;
		siglongjmp(c->env, 1);
	}
	mapguard_chain(sig, si, uc);
}

int ukvm_mapguard_hold(void)
{
	struct sigaction sa, old;
	int ret = 0;

	pthread_mutex_lock(&mapguard_lock);
	if (mapguard_installed)
		goto out;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = mapguard_handler;
	sigemptyset(&sa.sa_mask);
	/* SA_ONSTACK: a thread with an alternate stack (faulthandler's) keeps using it. */
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
	/*
	 * The handler to chain to is in place before ours is: a SIGBUS that
	 * comes the moment ours is installed finds it, not a zeroed one.
	 */
	if (sigaction(SIGBUS, NULL, &old)) {
		ret = -errno;
		goto out;
	}
	mapguard_prev = old;
	if (sigaction(SIGBUS, &sa, NULL)) {
		ret = -errno;
		goto out;
	}
	mapguard_installed = true;
out:
	pthread_mutex_unlock(&mapguard_lock);
	return ret;
}

void ukvm_mapguard_release(void)
{
	/* Nothing to undo: the handler stays (see the top of this file for why). */
}

int ukvm_mapguard_copy(void *dst, const void *src, size_t len)
{
	struct mapguard_copy c;
	sigset_t bus;

	c.lo = (uintptr_t)src;
	c.hi = c.lo + len;
	/* No mask saved (that would be a system call a copy): unblocked below instead. */
	if (sigsetjmp(c.env, 0)) {
		/* Jumped out of the handler, which ran with SIGBUS blocked. */
		sigemptyset(&bus);
		sigaddset(&bus, SIGBUS);
		pthread_sigmask(SIG_UNBLOCK, &bus, NULL);
		return -EIO;
	}
	mapguard_current = &c;
	__asm__ volatile("" ::: "memory");	/* the copy stays between the two stores */
	memcpy(dst, src, len);
	__asm__ volatile("" ::: "memory");
	mapguard_current = NULL;
	return 0;
}
