/* SPDX-License-Identifier: MIT */
/*
 * Which pages of the region are resident, and how each came (resident.c):
 * shared by the readers, the vCPUs that resolve their own faults and the
 * prefetch pusher of one run (uffd_mode missing, resolve copy).
 */
#ifndef UKVM_UFFD_RESIDENT_H
#define UKVM_UFFD_RESIDENT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "ukvm.h"

/* A page's state: the bit the installer sets after its UFFDIO_COPY succeeded. */
enum ukvm_page_state {
	UKVM_PAGE_ABSENT = 0,
	UKVM_PAGE_FAULTED,	/* a fault's resolver installed it */
	UKVM_PAGE_PREFETCHED,	/* prefetch (readahead or the pusher) installed it */
	UKVM_PAGE_PREINSTALLED,	/* Config.preinstall: in before the vCPUs started */
};

/*
 * Pages are of the backing's page size, numbered from the region's start.
 * A page is marked after its copy succeeded, so a prefetcher that finds it
 * absent may still meet EEXIST (a fault's copy got there first): that is a
 * race to count, not an error. Only one UFFDIO_COPY of a page succeeds, so
 * each page is marked once.
 */
struct ukvm_resident {
	/*
	 * Bitmaps of 64 pages a word (pages + 63) / 64 words each: the pages a
	 * fault installed, the pages prefetch installed (neither: absent).
	 */
	_Atomic uint64_t *faulted;
	_Atomic uint64_t *prefetched;
	_Atomic uint64_t *preinstalled;	/* and the pages preinstall put in first */
	/*
	 * A bit for each page a vCPU faulted on (a message was resolved for it,
	 * EEXIST included: the vCPU waited, whoever installed the page), so
	 * that the faults prefetch avoided are the pages no vCPU waited for.
	 */
	_Atomic uint64_t *waited;
	uint64_t pages;			/* at most UKVM_RESIDENT_MAX_PAGES */
	uint32_t *order;		/* touch_order: the pages faults installed, in order (else NULL) */
	atomic_uint_fast64_t nr_order;
	atomic_uint_fast64_t nr_resident;
	atomic_uint_fast64_t all_ns;	/* CLOCK_MONOTONIC when the last page went in, or 0 */
	bool timed;			/* stamp all_ns (stats basic reads no clock on the hot path) */
};

/* order holds 32-bit page indexes: 16 TiB of 4 KiB pages. */
#define UKVM_RESIDENT_MAX_PAGES	((uint64_t)UINT32_MAX + 1)

/* Empty, destroyable. */
void ukvm_resident_init(struct ukvm_resident *rs);
/*
 * Every page absent, with the touch order if order (4 bytes a page): 0, or
 * -ENOMEM (-EOVERFLOW: too many pages) with err set.
 */
int ukvm_resident_create(struct ukvm_resident *rs, uint64_t pages, bool order,
			 struct ukvm_error *err);
void ukvm_resident_destroy(struct ukvm_resident *rs);

static inline bool ukvm_resident_bit(_Atomic uint64_t *map, uint64_t page)
{
	return atomic_load_explicit(&map[page / 64], memory_order_relaxed) >> (page % 64) & 1;
}

static inline bool ukvm_resident_absent(struct ukvm_resident *rs, uint64_t page)
{
	return !ukvm_resident_bit(rs->faulted, page) && !ukvm_resident_bit(rs->prefetched, page) &&
	       !ukvm_resident_bit(rs->preinstalled, page);
}

/* How the page went in (after every installer stopped, or racing them: a snapshot). */
static inline enum ukvm_page_state ukvm_resident_state(struct ukvm_resident *rs, uint64_t page)
{
	return ukvm_resident_bit(rs->faulted, page) ? UKVM_PAGE_FAULTED :
	       ukvm_resident_bit(rs->prefetched, page) ? UKVM_PAGE_PREFETCHED :
	       ukvm_resident_bit(rs->preinstalled, page) ? UKVM_PAGE_PREINSTALLED : UKVM_PAGE_ABSENT;
}

/* A vCPU faulted on the page (and waited for it, whoever installed it). */
static inline void ukvm_resident_waited(struct ukvm_resident *rs, uint64_t page)
{
	atomic_fetch_or_explicit(&rs->waited[page / 64], 1ULL << (page % 64),
				 memory_order_relaxed);
}

/* The page went in (its copy returned 0), by a fault or by prefetch. */
void ukvm_resident_mark(struct ukvm_resident *rs, uint64_t page, enum ukvm_page_state how);

#endif
