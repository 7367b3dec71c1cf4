/* SPDX-License-Identifier: MIT */
/*
 * Reader pools: the threads that wait for one uffd's fault messages, read
 * them and hand each to their resolver (reader.h, resolve.h), and their
 * lifecycle (pool.c). With resolver vcpu a pool has no threads: its
 * resolvers belong to the vCPU threads, which resolve their own faults.
 */
#ifndef UKVM_UFFD_POOL_H
#define UKVM_UFFD_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "uffd/pusher.h"
#include "uffd/reader.h"
#include "uffd/resolve.h"
#include "ukvm.h"

struct ukvm_pool {
	/* The uffd, its range and how its faults are resolved: filled in by the caller. */
	struct ukvm_resolve_area area;
	enum ukvm_wait wait;
	uint32_t read_batch;		/* messages per read(2), 1..UKVM_MAX_READ_BATCH */
	const int32_t *pins;		/* reader k of all pools runs on pins[k % nr_pins] */
	uint32_t nr_pins;
	uint32_t first_reader;		/* this pool's first resolver, counted over all pools */
	uint32_t first_vcpu;		/* resolver vcpu: the vCPU of resolvers[0] */
	uint32_t vcpus_sharing;		/* vCPUs that may fault one page (overlap) */
	/*
	 * Resolvers: one per reader thread, or with resolver vcpu one per vCPU
	 * this uffd serves (resolvers[i] is vCPU first_vcpu + i's, and there
	 * are no readers).
	 */
	uint32_t nr_readers;		/* resolvers, whoever owns them */
	struct ukvm_fault_resolver *resolvers;
	struct ukvm_reader *readers;	/* NULL with resolver vcpu */
	uint32_t made;			/* entries of resolvers[] and readers[] to clean up */
	int stop_fd;			/* eventfd, readable once readers must leave */
	bool uffd_held;			/* release_uffd could not swap the uffd out: retry */
};

/* Empty, destroyable state; the caller then fills in area and the fields up to nr_readers. */
void ukvm_pool_init(struct ukvm_pool *pool);
/*
 * The fds the pool holds once started from a source of that kind (its uffd,
 * its stop eventfd, each reader's epoll set or ring, each resolver's
 * connection to a page server), from the same fields ukvm_pool_start()
 * decides by: the run's fd budget (setup.c) counts a pool with it, and in a
 * test build ukvm_pool_start() fails if the pool then holds another number.
 */
uint32_t ukvm_pool_fds(const struct ukvm_pool *pool, enum ukvm_source_kind source);
/*
 * The threads the pool starts (its readers; none when its vCPUs resolve
 * their own faults): the run's thread budget (setup.c) counts a pool with it.
 */
uint32_t ukvm_pool_threads(const struct ukvm_pool *pool);
int ukvm_pool_start(struct ukvm_pool *pool, struct ukvm_error *err);
/*
 * Tells every reader to leave (the stop flag and eventfd; a resolving
 * vCPU's fetch from a page server gives up on it too); returns at once.
 */
void ukvm_pool_request_stop(struct ukvm_pool *pool);
/*
 * One look, without waiting: joins the readers that have left (their join
 * is prompt) and, with kick, signals the others. Returns how many still run.
 */
uint32_t ukvm_pool_reap(struct ukvm_pool *pool, bool kick);
/*
 * The one way to stop readers: tells the pusher (if any: it installs into
 * the pools' uffds) and every reader of the nr pools to leave, then kicks
 * and joins them until deadline_ns, every pool at each look (readers
 * blocked in read(2) need their kicks now). Returns how many still run
 * (not joined), the pusher included. Safe on pools that never started.
 */
uint32_t ukvm_pool_stop(struct ukvm_pool *pools, uint32_t nr, struct ukvm_pusher *pusher,
			uint64_t deadline_ns);
/* The first reader that still runs, or NULL. */
struct ukvm_reader *ukvm_pool_running_reader(struct ukvm_pool *pool);
/*
 * Lets go of the uffd, so that a vCPU waiting on a fault is released: it is
 * closed, or, while a reader still runs or keep_number (a thread outside
 * the pool, the pusher, still runs and may use the number), replaced by
 * /dev/null until the pool is destroyed. 0, or -errno when it could not
 * be replaced (no fd for /dev/null, or dup3 failed): the uffd is still
 * held (pool->uffd_held) and a later call tries again.
 */
int ukvm_pool_release_uffd(struct ukvm_pool *pool, bool keep_number);
/* Frees everything: 0, or -EBUSY (and nothing freed) while a reader still runs. */
int ukvm_pool_destroy(struct ukvm_pool *pool);

#endif
