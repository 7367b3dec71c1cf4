/* SPDX-License-Identifier: MIT */
/*
 * The kick: a private real-time signal with an empty handler.
 *
 * A vCPU inside KVM_RUN (possibly blocked on a userfault) or a reader inside
 * a blocking read(2) only leaves the kernel when it is signalled. The
 * handler is installed without SA_RESTART, so the call returns EINTR and
 * the thread checks whether it must stop. Only the core's own threads
 * unblock this signal, and it is only ever sent with pthread_kill(), so the
 * rest of the process (Python's main thread included) never sees it.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>

#include "base/errors.h"
#include "base/kick.h"
#include "base/util.h"

/* An offset from SIGRTMIN that the C library and CPython leave alone. */
#define UKVM_KICK_OFFSET	5

static pthread_once_t kick_once = PTHREAD_ONCE_INIT;
static int kick_signo;
static int kick_errno;
static bool kick_taken;

static void kick_handler(int signo)
{
	(void)signo;
}

static void kick_install(void)
{
	struct sigaction sa, old;
	int signo = SIGRTMIN + UKVM_KICK_OFFSET;

	if (sigaction(signo, NULL, &old)) {
		kick_errno = errno;
		return;
	}
	if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN &&
	    old.sa_handler != kick_handler) {
		kick_taken = true;
		kick_errno = EBUSY;
		return;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = kick_handler;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = 0;	/* no SA_RESTART: the point is to interrupt */
	if (sigaction(signo, &sa, NULL)) {
		kick_errno = errno;
		return;
	}
	kick_signo = signo;
}

int ukvm_kick_init(struct ukvm_error *err)
{
	pthread_once(&kick_once, kick_install);
	if (kick_signo)
		return 0;
	if (kick_taken)
		return ukvm_err_set(err, UKVM_ERR_HOST, 0,
				    "signal SIGRTMIN+%d, which uffdkvm uses to interrupt its "
				    "threads, already has a handler in this process",
				    UKVM_KICK_OFFSET);
	return ukvm_err_set(err, UKVM_ERR_HOST, kick_errno ?: EINVAL, "sigaction(SIGRTMIN+%d)",
			    UKVM_KICK_OFFSET);
}

int ukvm_kick_signal(void)
{
	return kick_signo;
}

/*
 * Every signal the process may be sent (SIGINT above all) is blocked in the
 * core's threads, so it reaches the caller's thread. The synchronous ones
 * are not: a fault the thread itself causes (SIGSEGV, SIGBUS, ...) that
 * arrives blocked kills the process without running any handler, and
 * faulthandler (or a debugger's handler) could not say where it crashed.
 * SIGABRT goes with them: an abort() in a core thread (a failed libc or
 * sanitizer check; the core itself never calls it) must reach its handler.
 */
static const int synchronous_signals[] = {
	SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS, SIGABRT,
};

static void fill_blockable(sigset_t *set)
{
	size_t i;

	sigfillset(set);
	for (i = 0; i < ARRAY_SIZE(synchronous_signals); i++)
		sigdelset(set, synchronous_signals[i]);
}

void ukvm_kick_thread_init(void)
{
	sigset_t set;

	fill_blockable(&set);
	sigdelset(&set, kick_signo);
	pthread_sigmask(SIG_SETMASK, &set, NULL);
}

void ukvm_kick_block_all(sigset_t *old)
{
	sigset_t set;

	fill_blockable(&set);
	pthread_sigmask(SIG_BLOCK, &set, old);
}
