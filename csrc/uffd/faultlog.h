/* SPDX-License-Identifier: MIT */
/*
 * Fault records (stats full with trace_faults or guest_timing): writing
 * them during the run, one per fault, into a uffd's store, and after the
 * run what they say: which vCPU took each fault, each fault's stages, the
 * vCPUs' blocked time and the VM's blocktime, and whether every page was
 * resolved exactly once. Without guest_timing the statistics come from
 * online.h instead and the records only make the trace (trace_only); the
 * two share the counting, the sweep and the page check declared below.
 */
#ifndef UKVM_FAULTLOG_H
#define UKVM_FAULTLOG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/hist.h"
#include "base/tsc.h"
#include "ukvm.h"

/*
 * One uffd's fault records, in chunks of UKVM_LOG_CHUNK that its resolvers
 * claim one at a time (one atomic per chunk, no allocation on the hot
 * path). The mapping is reserved for the most records the uffd can see and
 * touched only as far as it fills; a record whose read_ns is 0 was never
 * written.
 */
struct ukvm_faultlog_store {
	struct ukvm_fault_record *records;
	uint64_t cap;			/* records */
	atomic_uint_fast64_t chunks;	/* chunks claimed */
};

#define UKVM_LOG_CHUNK	1024

/* A resolver's part of a store: the chunk it fills. */
struct ukvm_faultlog_writer {
	struct ukvm_fault_record *next;
	struct ukvm_fault_record *end;
};

/* Empty, destroyable. */
void ukvm_faultlog_store_init(struct ukvm_faultlog_store *store);
/*
 * Reserves cap records and populates the first warm of them (what every run
 * fills), so that writing a record does not take a page fault on the hot
 * path: 0, or -errno with err set (who: "uffd 0").
 */
int ukvm_faultlog_store_create(struct ukvm_faultlog_store *store, uint64_t cap, uint64_t warm,
			       const char *who, struct ukvm_error *err);
void ukvm_faultlog_store_destroy(struct ukvm_faultlog_store *store);
/*
 * The next record of w in store, claiming a chunk when w's is used up:
 * the record to fill, or NULL when the store is full (-ENOSPC: far more
 * fault messages than pages).
 */
struct ukvm_fault_record *ukvm_faultlog_next(struct ukvm_faultlog_store *store,
					     struct ukvm_faultlog_writer *w);

/* guest_timing: one vCPU's access log (guest_abi.h), as the host sees it. */
struct ukvm_guest_log {
	const uint8_t *entries;		/* GA_LOG_ENTRY bytes each, first pass in order */
	uint64_t nr;			/* first-pass accesses: the vCPU's pages, or its list's */
	uint64_t pages;			/* 4 KiB pages from base_gpa it walks (0: nr) */
	uint64_t base_gpa;		/* the first page the vCPU walks */
	int64_t tsc_offset;		/* guest TSC - host TSC */
#ifdef UKVM_TEST_HOOKS
	uint64_t tsc_bias;		/* UKVM_INJECT_TSC_OFFSET: added to every stamp read */
#endif
	bool usable;			/* the pass completed and the offset is known */
};

struct ukvm_faultlog {
	/* in */
	uint32_t nr_vcpus;
	const int32_t *tids;		/* of each vCPU thread */
	const struct ukvm_guest_log *guest;	/* per vCPU, or NULL without guest_timing */
	const struct ukvm_tsc_clock *clock;	/* host TSC -> CLOCK_MONOTONIC */
	uint64_t region_gpa;
	uint64_t region_pages;		/* in units of page_size */
	uint64_t page_size;
	uint64_t match_bytes;		/* a fault's address names this much: 4 KiB, or a huge page */
	/* touch_percent, access zipf: accesses to each 4 KiB page of the region
	 * (0: the guest never touches it, so it must never fault); NULL: all */
	const uint32_t *visits;
	/*
	 * Only gather the records into all and attribute them (trace_faults
	 * without guest_timing): online.h has the statistics.
	 */
	bool trace_only;
	/* out */
	struct ukvm_vcpu_result *vcpus;	/* gets faults, blocked_ns, the latencies */
	struct ukvm_reader_result *readers;	/* gets queue_latency; uffd-major order */
	uint32_t readers_per_uffd;
	uint64_t blocktime_ns;		/* every vCPU blocked at once */
	uint64_t misordered;		/* faults whose stamps ran backwards (a stage < 0) */
	uint64_t pages_not_once;	/* pages not resolved exactly once (EEXIST aside);
					 * with visits, untouched pages resolved at all */
	uint64_t first_bad_gpa;		/* the first such page... */
	bool first_bad_resolved_again;	/* ...resolved more than once (else never) */
	bool first_bad_untouched;	/* ...resolved though the guest never touches it */
	/* every record, by read time: the caller's to free, or to keep as the trace */
	struct ukvm_fault_record *all;
	uint64_t nr_all;
};

/*
 * Gathers the records of every store into all, sorted by read time, and
 * attributes, stamps, times and merges them: 0 or -ENOMEM. With trace_only
 * (the statistics come from online.h), only gathers, sorts and attributes.
 */
int ukvm_faultlog_build(struct ukvm_faultlog *log, struct ukvm_faultlog_store *const *stores,
			uint32_t nr_stores);


/* What online.h and the build after the run share. */

/* A vCPU thread's id, and the vCPU's index. */
struct ukvm_tid_index {
	int32_t tid;
	int32_t index;
};

/* map (n entries, sorted by ukvm_tid_sort) -> the vCPU of tid, or -1. */
void ukvm_tid_sort(struct ukvm_tid_index *map, uint32_t n);
int32_t ukvm_tid_vcpu(const struct ukvm_tid_index *map, uint32_t n, int32_t tid);

/*
 * One fault without guest stamps, into its vCPU's counts: resolved (faults)
 * or EEXIST, and its service (read to resolved) in service_latency.
 */
static inline void ukvm_faultlog_count(uint64_t *faults, uint64_t *eexist,
				       struct ukvm_hist *service_latency, bool is_eexist,
				       uint64_t service_ns)
{
	*faults += !is_eexist;	/* resolved, as a reader's faults count */
	*eexist += is_eexist;
	ukvm_hist_add(service_latency, service_ns);
}

/*
 * The sweep over the faults' start and end events in time order (at equal
 * times, ends first): each vCPU's blocked time (a fault of it open) and the
 * VM's blocktime (every vCPU blocked at once). A span of no time has no
 * events: in that order its end would come before its start. An event out
 * of order is counted and taken at the previous one's time, so no span
 * runs backwards (a wrapped difference).
 */
struct ukvm_sweep {
	uint32_t nr_vcpus;
	uint32_t *depth;	/* each vCPU's open faults... */
	uint64_t *since;	/* ...since when */
	uint64_t *blocked_ns;	/* each vCPU's, so far */
	uint64_t blocktime_ns;
	uint32_t blocked;	/* vCPUs with a fault open */
	uint64_t last;		/* the previous event's time */
	bool started;
	/* A broken merge (online.h checks them at the end): */
	uint64_t out_of_order;	/* events earlier than last, taken at last */
	uint64_t unmatched;	/* ends of a vCPU with no fault open, ignored */
};

/* Empty, destroyable; then begin: 0 or -ENOMEM. */
int ukvm_sweep_begin(struct ukvm_sweep *st, uint32_t nr_vcpus);
void ukvm_sweep_step(struct ukvm_sweep *st, uint64_t t, int32_t vcpu, int32_t delta);
void ukvm_sweep_end(struct ukvm_sweep *st);

/*
 * An event in 8 bytes: the time since t0 above UKVM_EV_SHIFT bits, then 1
 * for a start (0 for an end: at equal times ends sort first), then the
 * vCPU. Sorted as plain integers. Times must lie within 2^51 ns (26 days)
 * of t0.
 */
#define UKVM_EV_VCPU_BITS	12	/* UKVM_MAX_VCPUS = 4096 */
#define UKVM_EV_SHIFT		(UKVM_EV_VCPU_BITS + 1)

static inline uint64_t ukvm_ev_pack(uint64_t t, int32_t vcpu, int32_t delta)
{
	return t << UKVM_EV_SHIFT | (uint64_t)(delta > 0) << UKVM_EV_VCPU_BITS | (uint64_t)vcpu;
}

/* The packed event ev (times from t0) into the sweep. */
static inline void ukvm_sweep_packed(struct ukvm_sweep *st, uint64_t ev, uint64_t t0)
{
	ukvm_sweep_step(st, t0 + (ev >> UKVM_EV_SHIFT),
			(int32_t)(ev & ((1u << UKVM_EV_VCPU_BITS) - 1)),
			ev >> UKVM_EV_VCPU_BITS & 1 ? +1 : -1);
}

/* v sorted in place (a heapsort: no second array). */
void ukvm_sort_u64(uint64_t *v, uint64_t n);

/*
 * Which pages of log's region were not resolved exactly once, from two
 * bitmaps (once: resolved, again: resolved more than once; a bit per page):
 * log's pages_not_once and first_bad_*.
 */
void ukvm_faultlog_pages(struct ukvm_faultlog *log, const uint64_t *once, const uint64_t *again);

#endif
