/* SPDX-License-Identifier: MIT */
/*
 * A reader thread of a pool (pool.h): how it waits for its uffd's fault
 * messages, reads them and hands each to the resolver it owns (reader.c).
 * The pool makes, starts and stops its readers; a reader knows its pool
 * only by what the pool copies into it here, so the two files do not
 * include each other.
 */
#ifndef UKVM_UFFD_READER_H
#define UKVM_UFFD_READER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/thread.h"
#include "uffd/resolve.h"
#include "ukvm.h"

struct ukvm_ring;

/* A reader thread, and the resolver it owns (one of its pool's resolvers[]). */
struct ukvm_reader {
	/* Its pool's, set before it starts: the uffd and how its faults are resolved. */
	struct ukvm_resolve_area *area;
	enum ukvm_wait wait;
	uint32_t read_batch;		/* messages per read(2), 1..UKVM_MAX_READ_BATCH */
	int stop_fd;			/* the pool's eventfd, readable once readers must leave */
	struct ukvm_fault_resolver *res;
	uint32_t index;
	pthread_t thread;
	bool thread_started;
	atomic_bool exited;
	int epfd;
	struct ukvm_ring *ring;		/* wait io_uring: the reader's own ring (ring.h) */
	int cpu;			/* pinned to, or -1 */
	struct ukvm_thread_state state;	/* where it is, for one that would not stop */
#ifdef UKVM_TEST_HOOKS
	uint64_t stall_ms;		/* UKVM_INJECT_READER_STALL, for this reader */
#endif
} __attribute__((aligned(UKVM_CACHELINE)));

/*
 * Its way of waiting, for wait epoll, epoll_exclusive and io_uring only:
 * its epoll set with the uffd and the stop fd, or its ring. 0, or -errno
 * with err set; what was made is freed by the pool's destroy.
 */
int ukvm_reader_prepare(struct ukvm_reader *r, struct ukvm_error *err);
/* The thread's body (arg: its struct ukvm_reader): waits and resolves until told to stop. */
void *ukvm_reader_thread(void *arg);

#endif
