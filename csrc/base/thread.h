/* SPDX-License-Identifier: MIT */
/*
 * The core's threads: starting one (checked, with its stack size), pinning
 * it, and the state each keeps so that one that would not stop can be named
 * with where it was.
 */
#ifndef UKVM_BASE_THREAD_H
#define UKVM_BASE_THREAD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/ctl.h"

/*
 * What a core thread is doing, kept by the thread itself. done is the
 * thread's last store before it returns: once it is set, pthread_join()
 * does not wait.
 */
struct ukvm_thread_state {
	_Atomic(const char *) where;	/* a string literal */
	atomic_int tid;
	atomic_bool done;
};

/* pthread_create with a stack of stack_bytes: 0 or -errno (ctl: for test hooks). */
int ukvm_thread_create(struct ukvm_ctl *ctl, pthread_t *thread, size_t stack_bytes,
		       void *(*fn)(void *), void *arg);
/*
 * Pins the calling thread to cpu (if >= 0): 0 or -errno; records the
 * affinity it then has, pinned or not.
 */
int ukvm_thread_pin(int cpu, uint64_t affinity[16]);

/* What the calling thread has used since it started (getrusage(RUSAGE_THREAD)). */
struct ukvm_thread_usage {
	uint64_t cpu_ns;			/* user + system CPU time */
	uint64_t context_switches;		/* voluntary + involuntary */
	uint64_t voluntary_context_switches;
};
/* Fills *usage for the calling thread: 0, or -errno with *usage all zero. */
int ukvm_thread_usage(struct ukvm_thread_usage *usage);

static inline void ukvm_thread_at(struct ukvm_thread_state *st, const char *where)
{
	atomic_store_explicit(&st->where, where, memory_order_relaxed);
}
/* Records the calling thread's id in st. */
void ukvm_thread_start(struct ukvm_thread_state *st);
/*
 * "it was <where> (thread <tid>: <syscall>, in the kernel at <wchan>)": the
 * thread's own words and what /proc/self/task/<tid> says of it.
 */
void ukvm_thread_describe(struct ukvm_thread_state *st, char *buf, size_t len);
#ifdef UKVM_TEST_HOOKS
/* UKVM_INJECT_*_STALL: stays ms milliseconds, whatever kicks or stop say. */
void ukvm_thread_stall(struct ukvm_thread_state *st, uint64_t ms);
#endif

#endif
