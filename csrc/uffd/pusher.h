/* SPDX-License-Identifier: MIT */
/*
 * Prefetch's pusher (pusher.c): one thread per run that installs pages
 * before the guest asks for them
 * (prefetch background: the region in address order; replay: a recorded
 * order) at a bounded rate, while the readers serve faults.
 */
#ifndef UKVM_UFFD_PUSHER_H
#define UKVM_UFFD_PUSHER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/ctl.h"
#include "base/thread.h"
#include "uffd/resident.h"
#include "uffd/source.h"
#include "ukvm.h"

/* One uffd's registered range, as the pusher installs into it. */
struct ukvm_pusher_range {
	int uffd;
	uint64_t hva;
	uint64_t gpa;
	uint64_t size;
	uint64_t first;			/* its first page's number (set by ukvm_pusher_start) */
};

struct ukvm_pusher {
	struct ukvm_ctl *ctl;
	struct ukvm_resident *resident;	/* pages numbered over all ranges, in order */
	uint64_t page_size;
	uint32_t nr_ranges;		/* consecutive pieces of the region, one per uffd */
	struct ukvm_pusher_range *ranges;
	const uint64_t *order;		/* replay: pages in install order; NULL: address order */
	uint64_t nr_order;
	uint64_t bandwidth_mbps;	/* 0: as fast as it goes */
	const struct ukvm_source *source; /* where the pages' bytes come from */
	struct ukvm_source_conn conn;	/* the pusher's own connection to it */
	int stop_fd;			/* eventfd: readable once it must leave (a fetch waits on it) */
	bool conn_open;
	uint8_t *buf;			/* a chunk, prepared for the source's fetches */
	uint64_t buf_bytes;		/* chunk_pages pages */
	uint32_t chunk_pages;		/* pipelined: most pages in one request */
	pthread_t thread;
	bool thread_started;
	atomic_bool stop;
	atomic_bool exited;
	struct ukvm_thread_state state;
	/* the thread's own counters, read after its join */
	uint64_t pages;			/* installed */
	uint64_t eexist;		/* found there already (a fault, or readahead, won) */
	int32_t tid;
};

/* Numbers the ranges' pages in region order (each range's first): ukvm_pusher_start() does. */
void ukvm_pusher_number_ranges(struct ukvm_pusher_range *ranges, uint32_t n, uint64_t page_size);
/*
 * The range of ranges[0, n) (numbered) that page, numbered over all of
 * them, falls in, and its byte offset there; NULL past the last. A binary
 * search: O(log n) per page, for the pusher's every page.
 */
struct ukvm_pusher_range *ukvm_pusher_find(struct ukvm_pusher_range *ranges, uint32_t n,
					   uint64_t page_size, uint64_t page, uint64_t *off);
/*
 * The fds a started pusher holds with a source of that kind: what the run's
 * fd budget counts (setup.c); a test build's start fails on another number.
 */
uint32_t ukvm_pusher_fds(enum ukvm_source_kind source);
/* Empty, destroyable; the caller fills the fields above thread, ranges allocated. */
void ukvm_pusher_init(struct ukvm_pusher *p);
/*
 * Starts the thread, which waits for the vCPUs' go (ctl->go) before it
 * installs anything: 0 or -errno with err set.
 */
int ukvm_pusher_start(struct ukvm_pusher *p, struct ukvm_error *err);
/* Tells the pusher to leave; returns at once. */
void ukvm_pusher_request_stop(struct ukvm_pusher *p);
/* Joins it if it has left, else (with kick) signals it: 1 while it still runs, else 0. */
uint32_t ukvm_pusher_reap(struct ukvm_pusher *p, bool kick);
/* Frees everything: 0, or -EBUSY (nothing freed) while the thread runs. */
int ukvm_pusher_destroy(struct ukvm_pusher *p);

#endif
