/* SPDX-License-Identifier: MIT */
/*
 * userfaultfd: opening one, the features a run asks for and the API
 * handshake, registration, and the resolving ioctls with their
 * recoverable errors (uffd.c).
 */
#ifndef UKVM_UFFD_UFFD_H
#define UKVM_UFFD_UFFD_H

#include <stdbool.h>
#include <stdint.h>

#include "base/ctl.h"
#include "ukvm.h"

/* A uffd after UFFDIO_API with features: the fd, or -errno. */
int ukvm_uffd_open(bool nonblock, uint64_t features, struct ukvm_error *err);
/*
 * The UFFD_API features a run of cfg asks for (*wanted: 0 without a uffd
 * mode), checked against what this kernel's userfaultfd offers: 0, or
 * -EOPNOTSUPP (UKVM_ERR_HOST, naming what is missing and the fix) or
 * another -errno with err set. The nice-to-haves (the faulting thread's id,
 * the exact address, with stats full) are asked for only where offered.
 */
int ukvm_uffd_negotiate(const struct ukvm_config *cfg, uint64_t *wanted, struct ukvm_error *err);
int ukvm_uffd_register(int uffd, void *addr, uint64_t len, enum ukvm_uffd_mode mode,
		       enum ukvm_backing backing, struct ukvm_error *err);
/*
 * The calling thread's run and name ("reader 2 of uffd 0"): its resolving
 * ioctls give up early once that run is aborted, and one that keeps failing
 * with EAGAIN is recorded as the run's failure, named.
 */
void ukvm_uffd_thread_init(struct ukvm_ctl *ctl, const char *who);
/*
 * 0 resolved here, -EEXIST already resolved by another, another -errno on
 * failure. EAGAIN and EINTR are retried with backoff, for 1 s at most.
 */
int ukvm_uffd_copy(int uffd, uint64_t dst, const void *src, uint64_t len);
/*
 * Prefetch: UFFDIO_COPY with UFFDIO_COPY_MODE_DONTWAKE: a thread already
 * waiting on the page is not woken (the reader of its fault message finds
 * EEXIST and wakes it with ukvm_uffd_wake). Returns as ukvm_uffd_copy().
 */
int ukvm_uffd_copy_dontwake(int uffd, uint64_t dst, const void *src, uint64_t len);
/* UFFDIO_WAKE of the threads waiting on [addr, addr + len): 0 or -errno. */
int ukvm_uffd_wake(int uffd, uint64_t addr, uint64_t len);
int ukvm_uffd_continue(int uffd, uint64_t addr, uint64_t len);
int ukvm_uffd_zeropage(int uffd, uint64_t addr, uint64_t len);
/*
 * UFFDIO_MOVE of the present private anonymous pages at src to dst: after
 * it, src is a hole. 0, -EEXIST (dst resolved already: src is untouched, or
 * for a page of several 4 KiB pages, maybe partly moved), or another -errno
 * (EBUSY: a src page is shared, e.g. after a fork; ENOENT: src has a hole).
 */
int ukvm_uffd_move(int uffd, uint64_t dst, void *src, uint64_t len);
/*
 * UFFDIO_WRITEPROTECT over [addr, addr + len): protect sets the uffd-wp bit
 * (writes then fault); !protect clears it and wakes the threads waiting on
 * the range. 0 or -errno, EAGAIN retried as above.
 */
int ukvm_uffd_writeprotect(int uffd, uint64_t addr, uint64_t len, bool protect);

#endif
