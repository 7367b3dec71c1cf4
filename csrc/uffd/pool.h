/* SPDX-License-Identifier: MIT */
/* Reader pools: the threads that read one uffd's fault messages and resolve them (pool.c). */
#ifndef UKVM_UFFD_POOL_H
#define UKVM_UFFD_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/ctl.h"
#include "base/thread.h"
#include "base/util.h"
#include "uffd/source.h"
#include "uffd/resident.h"
#include "ukvm.h"

struct ukvm_pool;
struct ukvm_ring;

/*
 * What UFFDIO_COPY copies from, into which the page source (source.h)
 * fetches the page's bytes. A page must be whole when the copy makes it
 * present: a vCPU may read it that very moment (a faulting vCPU that finds
 * the page already mapped does not wait for a wake, and with overlap any
 * vCPU may touch it). So the data, address words included, goes in with
 * the copy. Each reader fetches into a buffer of its own for pages up to
 * UKVM_READER_SRC_MAX (4 KiB: anonymous memory; 2 MiB: a memfd named
 * "uffdkvm-reader-source" in /proc/PID/maps); 1 GiB pages, too large for
 * one per reader, share one buffer per uffd ("uffdkvm-source"), filled
 * and copied under a lock: the readers of one uffd take turns with it,
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
 * uffdkvm/schema.py, which run.py reads too.
 */
/*
 * Prefetch readahead: each reader's buffer for a run of pages fetched in
 * one request, at most this many bytes (anonymous memory, pages smaller
 * than it only: larger pages are read ahead one at a time through the
 * buffers above).
 */
#define UKVM_READAHEAD_BUF_MAX	(1ULL << 20)

struct ukvm_shared_buffer {
	uint64_t page_size;
	uint8_t *buffer;		/* fetched into per fault, under lock */
	pthread_mutex_t lock;
	bool lock_made;
};

struct ukvm_reader {
	struct ukvm_pool *pool;
	uint32_t index;
	char who[48];			/* "reader 2 of uffd 0", or the vCPU that resolves */
	int32_t vcpu;			/* resolver vCPU: the vCPU whose thread this is, else -1 */
	pthread_t thread;
	bool thread_started;
	atomic_bool exited;
	int epfd;
	struct ukvm_ring *ring;		/* wait io_uring: the reader's own ring (ring.h) */
	uint8_t *src;			/* up to 2 MiB pages: UFFDIO_COPY source, fetched per fault */
	struct ukvm_source_conn conn;	/* the thread's own connection to the page source */
	/* prefetch readahead: a run of up to ra_pages absent pages is fetched at once into ra */
	uint8_t *ra;
	uint32_t ra_pages;
	/* resolve move: the staging area (pool.c), stage_pages pages, the next at stage_next */
	uint8_t *stage;
	uint32_t stage_pages;
	uint32_t stage_next;
	int cpu;			/* pinned to, or -1 */
	uint64_t rng;			/* delay distribution state */
	struct ukvm_thread_state state;	/* where it is, for one that would not stop */
#ifdef UKVM_TEST_HOOKS
	uint64_t stall_ms;		/* UKVM_INJECT_READER_STALL, for this reader */
#endif
	/* stats full: the chunk of the pool's fault log this reader fills (vcpu = tid) */
	struct ukvm_fault_record *rec_next;
	struct ukvm_fault_record *rec_end;
	struct ukvm_reader_result stats;	/* the thread's own; read after join */
} __attribute__((aligned(UKVM_CACHELINE)));

struct ukvm_pool {
	struct ukvm_ctl *ctl;
	uint32_t uffd_index;
	int uffd;
	int stop_fd;			/* eventfd, readable once readers must leave */
	enum ukvm_resolver resolver;	/* vCPU: readers[] are the vCPUs', no threads */
	enum ukvm_wait wait;
	uint32_t read_batch;		/* messages per read(2), 1..UKVM_MAX_READ_BATCH */
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
	bool full_stats;
	uint64_t seed;
	const int32_t *pins;		/* reader k of all pools runs on pins[k % nr_pins] */
	uint32_t nr_pins;
	uint32_t first_reader;		/* this pool's first reader, counted over all pools */
	struct ukvm_shared_buffer shared; /* 1 GiB pages: the readers' shared copy source */
	/*
	 * uffd_mode wp: the snapshot's slots for this pool's range (a page's
	 * old contents go to the same offset) and a state per page (0 not
	 * saved, 1 being saved, 2 saved): a second message for a page (two
	 * vCPUs wrote it) must not save the bytes the first vCPU has written
	 * since, nor un-protect it before the first save is complete. Owned
	 * by the experiment.
	 */
	uint8_t *snapshot;
	_Atomic uint8_t *wp_state;
	/*
	 * uffd_mode missing with resolve copy: the run's resident map, in
	 * which this pool's first page is resident_first (owned by the
	 * experiment); prefetch readahead installs the prefetch_pages pages
	 * after each fault's that are absent. With any prefetch, an EEXIST
	 * may be a page prefetched without a wake: the resolver wakes it.
	 */
	struct ukvm_resident *resident;
	uint64_t resident_first;
	enum ukvm_prefetch prefetch;
	uint32_t prefetch_pages;
	uint32_t nr_readers;
	uint32_t readers_made;		/* entries of readers[] to clean up */
	struct ukvm_reader *readers;
	atomic_bool stop;
	/*
	 * Stats full: every fault record, in chunks of UKVM_LOG_CHUNK that the
	 * readers claim one at a time (one atomic per chunk, no allocation on
	 * the hot path). The mapping is reserved for the most records the pool
	 * can see and touched only as far as it fills; a record whose read_ns
	 * is 0 was never written.
	 */
	uint32_t vcpus_sharing;		/* vCPUs that may fault one page (overlap) */
	struct ukvm_fault_record *log;
	uint64_t log_cap;		/* records */
	atomic_uint_fast64_t log_chunks; /* chunks claimed */
};

#define UKVM_LOG_CHUNK	1024

/* Empty, destroyable state; the caller then fills in the fields above readers. */
void ukvm_pool_init(struct ukvm_pool *pool);
int ukvm_pool_start(struct ukvm_pool *pool, struct ukvm_error *err);
/* Tells every reader to leave (the stop flag and eventfd); returns at once. */
void ukvm_pool_request_stop(struct ukvm_pool *pool);
/*
 * One look, without waiting: joins the readers that have left (their join
 * is prompt) and, with kick, signals the others. Returns how many still run.
 */
uint32_t ukvm_pool_reap(struct ukvm_pool *pool, bool kick);
/*
 * Asks the readers to leave, kicks and joins them until deadline_ns:
 * returns how many still run (not joined). Safe on a pool that never started.
 */
uint32_t ukvm_pool_stop(struct ukvm_pool *pool, uint64_t deadline_ns);
/* The first reader that still runs, or NULL. */
struct ukvm_reader *ukvm_pool_running_reader(struct ukvm_pool *pool);
/*
 * Lets go of the uffd, so that a vCPU waiting on a fault is released: it is
 * closed, or, while a reader still runs and may use its number, replaced
 * by /dev/null until the pool is destroyed.
 */
void ukvm_pool_release_uffd(struct ukvm_pool *pool);
/*
 * Resolver vCPU: the vCPU thread whose resolver (a reader of the pool, with
 * no thread of its own) is given resolves the page at gpa itself, as a
 * reader would have on reading its message, counted and logged the same
 * way. 0 with *hva the page's host address, -ENOENT if gpa is not this
 * pool's (nothing done), or -errno (the failure recorded as the run's).
 */
int ukvm_pool_resolve_fault(void *resolver, uint64_t gpa, bool write, uint8_t **hva);
/* Resolver vCPU: the resolver r is vCPU vcpu's thread (its name and r->vcpu). */
void ukvm_pool_bind_vcpu(struct ukvm_reader *r, uint32_t vcpu);
/* Frees everything: 0, or -EBUSY (and nothing freed) while a reader still runs. */
int ukvm_pool_destroy(struct ukvm_pool *pool);

#endif
