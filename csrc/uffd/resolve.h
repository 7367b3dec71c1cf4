/* SPDX-License-Identifier: MIT */
/*
 * Resolving one fault (resolve.c): what a reader does with a message it
 * read, and what a vCPU that resolves its own faults does with the page
 * KVM handed back. Each such thread owns a struct ukvm_fault_resolver (not
 * "struct ukvm_resolver": that tag is the config's enum, ukvm.h); the
 * resolvers of one uffd share its struct ukvm_resolve_area.
 */
#ifndef UKVM_UFFD_RESOLVE_H
#define UKVM_UFFD_RESOLVE_H

#include <linux/userfaultfd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/ctl.h"
#include "base/util.h"
#include "uffd/faultlog.h"
#include "uffd/online.h"
#include "uffd/resident.h"
#include "uffd/source.h"
#include "ukvm.h"

/*
 * What UFFDIO_COPY copies from, into which the page source (source.h)
 * fetches the page's bytes. A page must be whole when the copy makes it
 * present: a vCPU may read it that very moment (a faulting vCPU that finds
 * the page already mapped does not wait for a wake, and with overlap any
 * vCPU may touch it). So the data, address words included, goes in with
 * the copy. Each resolver fetches into a buffer of its own for pages up to
 * UKVM_READER_SRC_MAX (4 KiB: anonymous memory; 2 MiB: a memfd named
 * "uffdkvm-reader-source" in /proc/PID/maps); 1 GiB pages, too large for
 * one per resolver, share one buffer per uffd ("uffdkvm-source"), filled
 * and copied under a lock: the resolvers of one uffd take turns with it,
 * those of different uffds (different vCPUs' memory) do not wait for each
 * other. One read-only template for every page size (UFFDIO_COPY with
 * DONTWAKE, the stamp written through the region's own mapping, then
 * UFFDIO_WAKE) cannot stand in for this: handle_userfault() makes the
 * message readable before it checks the page table and sleeps, so a reader
 * quick enough makes the page present first, and the vCPU then returns to
 * the guest without waiting for the wake, to an unstamped page
 * (benchmarks/RESULTS.md has the runs that showed it). All of it is
 * ordinary memory whatever the backing, and uffdkvm/run.py counts it in its
 * memory check. UKVM_READER_SRC_MAX (2 MiB) is in config_schema.h, from
 * uffdkvm/schema/fields.py, which run.py reads too.
 */

struct ukvm_shared_buffer {
	uint64_t page_size;
	uint8_t *buffer;		/* fetched into per fault, under lock */
	pthread_mutex_t lock;
	bool lock_made;
};

struct ukvm_fault_resolver;

/*
 * One uffd's registered range and how its faults are resolved: what every
 * resolver of the uffd shares. Its owner (a reader pool, pool.h) fills the
 * fields above shared, then ukvm_resolve_area_create() makes the rest.
 */
struct ukvm_resolve_area {
	struct ukvm_ctl *ctl;
	uint32_t uffd_index;
	int uffd;
	enum ukvm_uffd_mode mode;
	uint64_t page_size;
	uint64_t hva_base;		/* the registered range... */
	uint64_t region_size;
	uint64_t gpa_base;		/* ...and its guest physical address */
	uint64_t region_off;		/* ...and its offset in the whole test region */
	const struct ukvm_source *source; /* where resolved pages' bytes come from (NULL:
					   * the synthetic fill) */
	uint64_t delay_ns;
	enum ukvm_delay_dist delay_dist;
	enum ukvm_resolve resolve;
	bool vcpu_resolvers;		/* resolver vcpu: the resolvers are vCPU threads */
	bool full_stats;
	/*
	 * stats full: the statistics online (online.h, owned by the
	 * experiment), or NULL with guest_timing; records: a fault record per
	 * fault in log (trace_faults, guest_timing).
	 */
	struct ukvm_online *online;
	bool records;
	uint64_t seed;
	/*
	 * uffd_mode wp: the snapshot's slots for this range (a page's old
	 * contents go to the same offset) and a state per page (0 not saved,
	 * 1 being saved, 2 saved): a second message for a page (two vCPUs
	 * wrote it) must not save the bytes the first vCPU has written since,
	 * nor un-protect it before the first save is complete. Owned by the
	 * experiment.
	 */
	uint8_t *snapshot;
	_Atomic uint8_t *wp_state;
	/*
	 * uffd_mode missing with resolve copy: the run's resident map, in
	 * which this range's first page is resident_first (owned by the
	 * experiment). With any prefetch, an EEXIST may be a page prefetched
	 * without a wake: the resolver wakes it.
	 */
	struct ukvm_resident *resident;
	uint64_t resident_first;
	enum ukvm_prefetch prefetch;
	uint32_t prefetch_pages;
	/*
	 * prefetch readahead (prefetch.c): called after a fault the resolver
	 * installed itself, its vCPU already woken: 0, or -errno after
	 * recording the failure as the run's. NULL: no readahead.
	 */
	int (*readahead)(struct ukvm_fault_resolver *r, uint64_t addr);
	/* made by ukvm_resolve_area_create() */
	struct ukvm_shared_buffer shared; /* 1 GiB pages: the resolvers' shared copy source */
	struct ukvm_faultlog_store log;	/* records: every fault record */
	atomic_bool stop;		/* the resolvers must leave (ukvm_resolve_stopping) */
};

/*
 * One thread's resolver (a reader's, or a resolving vCPU's): its buffers,
 * its connection to the page source, its counters. Used by that thread
 * alone; the counters are read after its join.
 */
struct ukvm_fault_resolver {
	struct ukvm_resolve_area *area;
	uint32_t index;			/* among its uffd's resolvers: the records' reader */
	int32_t vcpu;			/* a resolving vCPU's index, else -1 */
	char who[48];			/* "reader 2 of uffd 0", "vCPU 1, resolving on uffd 0" */
	uint8_t *src;			/* up to 2 MiB pages: UFFDIO_COPY source, fetched per fault */
	struct ukvm_source_conn conn;	/* the thread's own connection to the page source */
	/* prefetch readahead (prefetch.c): a run of up to ra_pages absent pages, fetched at once */
	uint8_t *ra;
	uint32_t ra_pages;
	/* resolve move: the staging area, stage_pages pages, the next at stage_next */
	uint8_t *stage;
	uint32_t stage_pages;
	uint32_t stage_next;
	uint64_t rng;			/* delay distribution state */
	struct ukvm_faultlog_writer rec; /* records: the chunk of area->log it fills */
	struct ukvm_online_queue *queue; /* online: its events (area->online's) */
	struct ukvm_reader_result stats;
} __attribute__((aligned(UKVM_CACHELINE)));

/* Empty, destroyable state; the owner then fills in the fields above shared. */
void ukvm_resolve_area_init(struct ukvm_resolve_area *a);
/*
 * The shared copy source (1 GiB pages) and, with stats full, the fault log
 * sized for nr_resolvers resolvers and vcpus_sharing vCPUs that may fault
 * one page: 0, or -errno with err set.
 */
int ukvm_resolve_area_create(struct ukvm_resolve_area *a, uint32_t nr_resolvers,
			     uint32_t vcpus_sharing, struct ukvm_error *err);
void ukvm_resolve_area_destroy(struct ukvm_resolve_area *a);

/*
 * Resolver index of area, numbered k over every uffd's (the pin list's and
 * the delay's seed), for reader thread or, vcpu >= 0, that vCPU's thread:
 * named, its counters empty; then ukvm_resolve_prepare() makes its buffers
 * and connection (stop_fd: a fetch gives up when it is readable). 0, or
 * -errno with err set. ukvm_resolve_destroy() frees what prepare made.
 */
/* The fds a prepared resolver holds for a source of that kind: a page server's connection. */
uint32_t ukvm_resolve_fds(enum ukvm_source_kind source);
void ukvm_resolve_init(struct ukvm_fault_resolver *r, struct ukvm_resolve_area *a, uint32_t index,
		       uint32_t k, int32_t vcpu);
int ukvm_resolve_prepare(struct ukvm_fault_resolver *r, int stop_fd, struct ukvm_error *err);
void ukvm_resolve_destroy(struct ukvm_fault_resolver *r);

/*
 * Resolves one fault message read at t_read (0 with stats basic): 0, or
 * -errno after recording the failure as the run's (-ECANCELED: the run is
 * over, or an injected READER_EXIT, nothing recorded).
 */
int ukvm_resolve_message(struct ukvm_fault_resolver *r, const struct uffd_msg *msg, uint64_t t_read);
/*
 * Resolver vCPU: the vCPU thread that owns r resolves the page at gpa
 * itself, as a reader would have on reading its message, counted and
 * logged the same way, and waits for a huge unit another thread's copy is
 * still filling. 0 with *hva the page's host address, -ENOENT if gpa is
 * not r's uffd's (nothing done), or -errno (the failure recorded as the
 * run's). What kvm/vcpu.c calls through its resolve_fault pointer.
 */
int ukvm_resolve_fault(struct ukvm_fault_resolver *r, uint64_t gpa, bool write, uint8_t **hva);

/*
 * For prefetch.c: the bytes of len from the page at addr (guest physical
 * gpa) from the page source into dst; urgent: a fault waits for it (else
 * readahead). 0, or -errno after recording the failure as the run's
 * (-ECANCELED: the run is stopping, nothing recorded).
 */
int ukvm_resolve_fetch(struct ukvm_fault_resolver *r, uint64_t addr, uint64_t len, uint64_t gpa,
		       uint8_t *dst, bool urgent);
/* The resident map's number (resident.h) of area's page at addr. */
uint64_t ukvm_resolve_page(const struct ukvm_resolve_area *a, uint64_t addr);
/* The area's resolvers are told to leave (area->stop). */
bool ukvm_resolve_stopping(const struct ukvm_fault_resolver *r);

#endif
