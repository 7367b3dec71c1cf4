/* SPDX-License-Identifier: MIT */
/*
 * The coordination shared by the controller and the threads it starts: go,
 * stop, abort and the first failure.
 */
#ifndef UKVM_BASE_CTL_H
#define UKVM_BASE_CTL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "ukvm.h"

struct ukvm_ctl {
	pthread_mutex_t lock;
	pthread_cond_t cond;		/* signalled on every change below */
	int go;				/* 0 wait, 1 run, -1 give up */
	uint32_t vcpus_running;
	/* vCPUs that wait at pass ends (dirty tracking): the passes they may start */
	uint64_t passes_open;
	/* migration: a vCPU at the gate of this pass or later leaves (the source stopped) */
	uint64_t passes_end;
	bool failed;
	bool cancelled;
	struct ukvm_error error;	/* the first failure */
	atomic_bool stop;		/* every thread: leave now */
	atomic_bool abort;		/* the experiment failed or was cancelled */
#ifdef UKVM_TEST_HOOKS
	/* Test-only fault injection (testhooks.h): what, when, and how far along. */
	enum ukvm_inject inject;
	uint64_t inject_after;
	atomic_uint_fast64_t inject_count;
	/* Threads ukvm_thread_create() started: the thread budget's check (experiment.c). */
	atomic_uint_fast64_t threads_made;
#endif
};

#ifdef UKVM_TEST_HOOKS
/* True once per run: when the inject_after-th event of this kind happens. */
static inline bool ukvm_ctl_inject(struct ukvm_ctl *ctl, enum ukvm_inject kind)
{
	if (__builtin_expect(ctl->inject != kind, 1))
		return false;
	return atomic_fetch_add(&ctl->inject_count, 1) + 1 == ctl->inject_after;
}
#endif

/* 0, or -errno (the lock or the condition variable could not be made). */
int ukvm_ctl_init(struct ukvm_ctl *ctl);
void ukvm_ctl_destroy(struct ukvm_ctl *ctl);
/* Records the first failure, raises stop and wakes the controller. */
void ukvm_ctl_fail(struct ukvm_ctl *ctl, enum ukvm_error_kind kind, int errnum,
		   const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Under ctl->lock: record err as the failure unless one came first; stop and abort. */
void ukvm_ctl_fail_locked(struct ukvm_ctl *ctl, const struct ukvm_error *err);
/*
 * A failure found while stopping (a thread that would not stop): the run's
 * failure (UKVM_ERR_RUN) if none came first, else appended to the first
 * one's message ("...; then ..."), so that neither is lost.
 */
void ukvm_ctl_fail_or_append(struct ukvm_ctl *ctl, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static inline bool ukvm_ctl_stopping(struct ukvm_ctl *ctl)
{
	return atomic_load_explicit(&ctl->stop, memory_order_relaxed);
}

static inline bool ukvm_ctl_aborted(struct ukvm_ctl *ctl)
{
	return atomic_load_explicit(&ctl->abort, memory_order_relaxed);
}

#endif
