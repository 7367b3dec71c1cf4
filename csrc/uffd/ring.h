/* SPDX-License-Identifier: MIT */
/*
 * wait="io_uring": a reader's own io_uring, which keeps a read of the uffd
 * and a poll of the pool's stop eventfd in flight and hands back what
 * completes (ring.c). Built with liburing (setup.py defines
 * UKVM_HAVE_LIBURING where it finds it); without it every function here
 * fails with UKVM_ERR_HOST saying so.
 */
#ifndef UKVM_UFFD_RING_H
#define UKVM_UFFD_RING_H

#include <linux/userfaultfd.h>
#include <stdint.h>
#include <sys/types.h>

#include "ukvm.h"

struct ukvm_ring;

/* ukvm_ring_next(): the stop eventfd became readable. */
#define UKVM_RING_STOPPED	0

/*
 * 0 where this build has io_uring (liburing), else -EOPNOTSUPP with err
 * (UKVM_ERR_HOST) saying how to get a build that has it.
 */
int ukvm_ring_built(struct ukvm_error *err);
/*
 * A ring for one reader of uffd (non-blocking) that reads up to batch
 * (1..UKVM_MAX_READ_BATCH) messages at a time and watches stop_fd: 0, or
 * -errno with err naming the call (UKVM_ERR_HOST where the kernel or the
 * build refuses io_uring). Nothing is submitted until ukvm_ring_next().
 */
int ukvm_ring_create(struct ukvm_ring **out, int uffd, int stop_fd, uint32_t batch,
		     struct ukvm_error *err);
/*
 * Waits for the next completion, first (re)submitting the read and the
 * stop poll where they are not in flight. Returns the bytes of messages a
 * read of the uffd returned (> 0, at *msgs until the next call),
 * UKVM_RING_STOPPED, -EAGAIN for a read that completed empty, -EINTR when
 * the wait ended without a completion (a signal: the caller looks at its
 * stop flag and calls again), or another -errno with *what naming the call
 * that failed. Called by one thread at a time.
 */
ssize_t ukvm_ring_next(struct ukvm_ring *ring, const struct uffd_msg **msgs, const char **what);
/*
 * Cancels what is in flight and reaps it, for timeout_ns at most, so that
 * no read of the uffd outlives the reader: a read that completes with
 * messages meanwhile is dropped (the run is over, or failed and its uffds
 * are being closed). Called by the thread that called ukvm_ring_next().
 */
void ukvm_ring_cancel(struct ukvm_ring *ring, uint64_t timeout_ns);
/* Frees the ring (NULL is fine); the kernel cancels anything still in flight. */
void ukvm_ring_destroy(struct ukvm_ring *ring);
/*
 * Can a reader wait for this (empty, non-blocking) uffd through io_uring?
 * Makes a ring, submits a read (with the RWF_* flags rw_flags: 0, as the
 * readers' own; a test build passes RWF_NOWAIT to get the answer of a kernel
 * that does not retry O_NONBLOCK files) and checks that it waits rather than
 * completing at once, then cancels it: 0, or -errno with err (kind
 * UKVM_ERR_HOST) saying what the kernel or the build refused. The kernel's
 * answer decides, never its version.
 */
int ukvm_ring_check(int uffd, int rw_flags, struct ukvm_error *err);

/* Why a read of an empty O_NONBLOCK uffd completed at once (EAGAIN, EINVAL). */
#define UKVM_RING_NO_RETRY						\
	"This kernel's io_uring does not wait for a non-blocking file to become "	\
	"readable: it completes the read with EAGAIN instead of polling (io_uring "	\
	"retries O_NONBLOCK files from Linux 5.15)"
#define UKVM_RING_NO_READ						\
	"This kernel's io_uring has no IORING_OP_READ (Linux 5.6+; io_uring "		\
	"retries O_NONBLOCK files from Linux 5.15)"


#endif
