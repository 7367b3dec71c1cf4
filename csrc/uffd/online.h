/* SPDX-License-Identifier: MIT */
/*
 * Stats full without guest stamps: the statistics computed while the run
 * goes on, with no record kept per fault (faultlog.c keeps records only for
 * trace_faults and guest_timing).
 *
 * Order-independent parts: each resolver counts, per vCPU, its own faults,
 * EEXISTs and service_latency histogram (summed at collect), and marks each
 * resolved page in two bitmaps shared by all (resolved, resolved again:
 * atomic OR, 2 bits a page).
 *
 * Blocked time and blocktime need every resolver's events (a fault's start
 * at its read, its end at its resolution) in time order. Each resolver
 * pushes its own, in its own time order, to a queue only it writes, and
 * publishes a watermark: the time of its last pushed event, below which it
 * will push nothing more. A resolver about to wait without a timeout
 * (poll, epoll, a blocking read, io_uring, a spinner that found nothing, a
 * resolving vCPU going back into KVM_RUN) first pushes what it holds back
 * and sets its waiting flag; on waking it clears the flag before it reads
 * the clock for its next event. A drainer reads the clock (ordered) first,
 * then each flag: a waiting resolver's next event comes after that time,
 * so the time is its watermark. The drainer takes, from every queue, the
 * events strictly earlier than the least watermark, and feeds them in
 * (time, end before start) order to the sweep (faultlog.h): what it gets is
 * what a sort of all the events after the run would give.
 *
 * Who drains: a resolver whose queue holds UKVM_ONLINE_DRAIN_AT events,
 * if it can take the drain lock at once (else it goes on), and the
 * controller after every resolver has stopped (all that is left). A queue
 * is a list of chunks; a full chunk gets a new one (a drained one, kept
 * for reuse, while there is one: so no allocation while drains keep up),
 * so a resolver never blocks or drops an event. A queue's memory grows only while a watermark
 * is held back: a resolver that neither waits nor pushes (stuck in a slow
 * fetch or a long delay) holds every other queue at what it has.
 */
#ifndef UKVM_ONLINE_H
#define UKVM_ONLINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/util.h"
#include "uffd/faultlog.h"
#include "ukvm.h"

#define UKVM_ONLINE_CHUNK	511	/* events a chunk holds: a chunk is 4 KiB */
#define UKVM_ONLINE_DRAIN_AT	2048	/* a resolver's queued events that make it try a drain */
#define UKVM_ONLINE_SPARES	8	/* drained chunks a queue keeps for reuse (6 made at first) */

struct ukvm_online_chunk {
	struct ukvm_online_chunk *_Atomic next;
	uint64_t ev[UKVM_ONLINE_CHUNK];
};

/* One vCPU's counts as one resolver saw them. */
struct ukvm_online_vcpu {
	uint64_t faults;
	uint64_t eexist;
	struct ukvm_hist service_latency;
};

/* One resolver's: written by its thread alone, drained under the online lock. */
struct ukvm_online_queue {
	/* the producer's */
	struct ukvm_online_chunk *tail;
	uint32_t tail_used;
	uint32_t npend;
	uint64_t pushed_own;			/* = pushed, without the atomic */
	uint64_t next_try;			/* pushed_own at which it may try a drain again */
#ifdef UKVM_TEST_HOOKS
	bool test_no_chunk;			/* a full chunk gets no next: -ENOMEM (tests/c) */
#endif
	uint64_t pend[UKVM_MAX_READ_BATCH];	/* ends later than the last start, held back */
	struct ukvm_online_vcpu *vcpus;		/* per vCPU */
	/* shared */
	atomic_uint_fast64_t pushed __attribute__((aligned(UKVM_CACHELINE)));	/* release */
	atomic_uint_fast64_t mark;	/* no event to come is earlier (release) */
	atomic_int waiting;		/* seq_cst: 1 while the resolver may sleep */
	/* drained chunks, for the producer: no allocation while drains keep up */
	struct ukvm_online_chunk *_Atomic spare[UKVM_ONLINE_SPARES];
	/* the drainer's */
	struct ukvm_online_chunk *head __attribute__((aligned(UKVM_CACHELINE)));
	uint32_t head_used;
	atomic_uint_fast64_t taken;	/* events drained (release: the producer reads it) */
} __attribute__((aligned(UKVM_CACHELINE)));

struct ukvm_online {
	uint32_t nr_vcpus;
	uint64_t t0;			/* no event is earlier: packed times count from here */
	/* the tid -> vCPU map, set before any vCPU runs (ukvm_online_set_tids) */
	struct ukvm_tid_index *map;
	/*
	 * map, once sorted (release): the readers learn of a fault through the
	 * kernel, which orders it after the vCPU's start, and the start after
	 * this; the acquire says so to the compiler and to TSan too
	 */
	struct ukvm_tid_index *_Atomic map_ready;
	/* page-once bitmaps over the region */
	uint64_t region_gpa;
	uint64_t region_pages;
	uint64_t page_size;
	_Atomic uint64_t *once;
	_Atomic uint64_t *again;
	/* the queues, one per resolver */
	struct ukvm_online_queue **queues;
	uint32_t cap;
	atomic_uint nr;
	/* the drain */
	pthread_mutex_t lock;
	bool lock_made;
	struct ukvm_sweep sweep;
	uint64_t *scratch;
	uint64_t scratch_cap;
	uint64_t drain_at;		/* UKVM_ONLINE_DRAIN_AT (tests: fewer) */
	uint64_t drains;		/* how many drains took events */
	/*
	 * The first -errno of a drain or of a resolver's flush (-ENOMEM): the
	 * sweep is incomplete. Set once (compare-and-swap from 0), never cleared.
	 */
	_Atomic int error;
#ifdef UKVM_TEST_HOOKS
	bool test_nonstrict;		/* t <= watermark: an inclusive merge (tests/c) */
	bool test_late_bound;		/* a clock step past the bound taken: broken (tests/c) */
	bool test_skip_last;		/* the drain skips the last queue (tests/c) */
	bool test_no_waiting;		/* waiting flags ignored (tests/c) */
	unsigned test_clock_shift;	/* a clock of 2^shift ns steps: ties (tests/c) */
#endif
};

/* Empty, destroyable. */
void ukvm_online_init(struct ukvm_online *o);
/*
 * For nr_vcpus vCPUs and at most nr_queues resolvers, over a region of
 * region_pages pages of page_size at region_gpa: 0 or -ENOMEM.
 */
int ukvm_online_create(struct ukvm_online *o, uint32_t nr_vcpus, uint32_t nr_queues,
		       uint64_t region_gpa, uint64_t region_pages, uint64_t page_size);
void ukvm_online_destroy(struct ukvm_online *o);
/* Each vCPU's thread id, then done, before any vCPU runs. */
void ukvm_online_set_tid(struct ukvm_online *o, uint32_t vcpu, int32_t tid);
void ukvm_online_tids_done(struct ukvm_online *o);
/* A queue for one more resolver, set up before its thread starts: NULL on -ENOMEM. */
struct ukvm_online_queue *ukvm_online_attach(struct ukvm_online *o);

/* The clock the events are stamped with: CLOCK_MONOTONIC. */
uint64_t ukvm_online_now(const struct ukvm_online *o);
/*
 * The resolver's clock for the fault messages it is about to handle: clears
 * its waiting flag, then reads CLOCK_MONOTONIC.
 */
uint64_t ukvm_online_stamp(struct ukvm_online *o, struct ukvm_online_queue *q);
/*
 * One fault handled (read at t_read, its ioctl returned at t_done) by the
 * thread of tid (a vCPU's, or not): counted, its page marked, its events
 * queued (none for a span of no time); maybe a drain. 0, -ENOMEM, or
 * -EPROTO for more faults since the last stamp than a read returns.
 */
int ukvm_online_fault(struct ukvm_online *o, struct ukvm_online_queue *q, uint64_t t_read,
		      uint64_t t_done, uint64_t gpa, int32_t tid, bool eexist);
/*
 * About to wait without a timeout: what is held back queued, then the
 * waiting flag set. When the queueing fails (-ENOMEM, kept as the run's
 * error) the flag stays clear, so the queue holds the drains at its mark.
 */
void ukvm_online_sleep(struct ukvm_online *o, struct ukvm_online_queue *q);
/*
 * After every resolver has stopped: drains all that is left and adds the
 * statistics to log's outputs (vcpus' faults, eexist, service_latency,
 * blocked_ns; blocktime_ns, pages_not_once and the first bad page). 0, or
 * -errno with err set: the first error of the run's queueing or draining
 * (-ENOMEM), or -EPROTO when the sweep does not end with every fault
 * closed, every end matched and every event in order (an event lost,
 * doubled or misordered).
 */
int ukvm_online_finish(struct ukvm_online *o, struct ukvm_faultlog *log, struct ukvm_error *err);

/* One drain, as a resolver makes it (tests/c): whether it took the lock. */
bool ukvm_online_try_drain(struct ukvm_online *o);

#endif
