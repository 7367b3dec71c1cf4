/* SPDX-License-Identifier: MIT */
/*
 * Stats full without guest stamps, computed while the run goes on (online.h
 * says how). Why the merge equals the sort after the run: every event a
 * resolver will still push is no earlier than its watermark, and a drain
 * takes only events strictly earlier than the least watermark, so each
 * drain takes every event of a span of time [previous bound, bound) that
 * any queue will ever hold, and drains follow each other in time. Events
 * at one instant all land in one drain, where the sort puts ends first (a
 * span of no time has no events: its end would go before its own start).
 * The finish checks what this proof promises: every event in order, every
 * end matched, every vCPU unblocked at the end.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/hist.h"
#include "base/util.h"
#include "uffd/online.h"

void ukvm_online_init(struct ukvm_online *o)
{
	memset(o, 0, sizeof(*o));
	atomic_init(&o->nr, 0);
	atomic_init(&o->map_ready, NULL);
}

int ukvm_online_create(struct ukvm_online *o, uint32_t nr_vcpus, uint32_t nr_queues,
		       uint64_t region_gpa, uint64_t region_pages, uint64_t page_size)
{
	uint64_t words = region_pages / 64 + 1;

	o->nr_vcpus = nr_vcpus;
	o->t0 = ukvm_now_ns();
	o->region_gpa = region_gpa;
	o->region_pages = region_pages;
	o->page_size = page_size;
	o->cap = nr_queues;
	o->drain_at = UKVM_ONLINE_DRAIN_AT;
	o->once = calloc(words, sizeof(*o->once));
	o->again = calloc(words, sizeof(*o->again));
	o->queues = calloc(nr_queues ?: 1, sizeof(*o->queues));
	o->map = calloc(nr_vcpus ?: 1, sizeof(*o->map));
	/* What drains take while they keep up: no allocation then. */
	o->scratch_cap = (uint64_t)(nr_queues ?: 1) * (UKVM_ONLINE_DRAIN_AT + UKVM_ONLINE_CHUNK);
	o->scratch = malloc(o->scratch_cap * sizeof(*o->scratch));
	if (!o->scratch)
		o->scratch_cap = 0;
	if (!o->once || !o->again || !o->queues || !o->map)
		return -ENOMEM;
	if (pthread_mutex_init(&o->lock, NULL))
		return -ENOMEM;
	o->lock_made = true;
	return ukvm_sweep_begin(&o->sweep, nr_vcpus);
}

static void queue_free(struct ukvm_online_queue *q)
{
	struct ukvm_online_chunk *c = q->head, *next;

	for (; c; c = next) {
		next = atomic_load_explicit(&c->next, memory_order_relaxed);
		free(c);
	}
	for (unsigned i = 0; i < UKVM_ONLINE_SPARES; i++)
		free(atomic_load_explicit(&q->spare[i], memory_order_relaxed));
	free(q->vcpus);
	free(q);
}

void ukvm_online_destroy(struct ukvm_online *o)
{
	uint32_t i, nr = atomic_load(&o->nr);

	for (i = 0; o->queues && i < nr; i++)
		queue_free(o->queues[i]);
	free(o->queues);
	free((void *)o->once);
	free((void *)o->again);
	free(o->map);
	free(o->scratch);
	ukvm_sweep_end(&o->sweep);
	if (o->lock_made)
		pthread_mutex_destroy(&o->lock);
	ukvm_online_init(o);
}

void ukvm_online_set_tid(struct ukvm_online *o, uint32_t vcpu, int32_t tid)
{
	if (vcpu < o->nr_vcpus)
		o->map[vcpu] = (struct ukvm_tid_index){ .tid = tid, .index = (int32_t)vcpu };
}

void ukvm_online_tids_done(struct ukvm_online *o)
{
	ukvm_tid_sort(o->map, o->nr_vcpus);
	atomic_store_explicit(&o->map_ready, o->map, memory_order_release);
}

struct ukvm_online_queue *ukvm_online_attach(struct ukvm_online *o)
{
	uint32_t nr = atomic_load(&o->nr);
	struct ukvm_online_queue *q;

	if (nr >= o->cap)
		return NULL;
	q = aligned_alloc(UKVM_CACHELINE, ALIGN_UP(sizeof(*q), UKVM_CACHELINE));
	if (!q)
		return NULL;
	memset(q, 0, sizeof(*q));
	q->vcpus = calloc(o->nr_vcpus ?: 1, sizeof(*q->vcpus));
	q->tail = calloc(1, sizeof(*q->tail));
	if (!q->vcpus || !q->tail) {
		free(q->vcpus);
		free(q->tail);
		free(q);
		return NULL;
	}
	q->head = q->tail;
	atomic_init(&q->pushed, 0);
	atomic_init(&q->mark, 0);
	atomic_init(&q->waiting, 1);	/* no event before its first stamp */
	for (unsigned i = 0; i < UKVM_ONLINE_SPARES; i++)
		atomic_init(&q->spare[i],
			    i < UKVM_ONLINE_DRAIN_AT / UKVM_ONLINE_CHUNK + 2 ? malloc(sizeof(*q->tail)) :
			    NULL);
	atomic_init(&q->taken, 0);
	o->queues[nr] = q;
	atomic_store(&o->nr, nr + 1);	/* after the queue: a drainer sees it whole */
	return q;
}

/*
 * The run's first error (a drain's or a producer's): kept, never cleared,
 * since the sweep it stopped is incomplete whatever comes after.
 */
static void online_fail(struct ukvm_online *o, int err)
{
	int none = 0;

	atomic_compare_exchange_strong(&o->error, &none, err);
}

/* One event onto q (the producer): 0 or -ENOMEM. */
static int queue_push(struct ukvm_online_queue *q, uint64_t ev, uint64_t t)
{
	if (q->tail_used == UKVM_ONLINE_CHUNK) {
		struct ukvm_online_chunk *c = NULL;

#ifdef UKVM_TEST_HOOKS
		if (q->test_no_chunk)
			return -ENOMEM;	/* as if no spare were left and malloc failed */
#endif
		for (unsigned i = 0; !c && i < UKVM_ONLINE_SPARES; i++)
			if (atomic_load_explicit(&q->spare[i], memory_order_relaxed))
				c = atomic_exchange(&q->spare[i], NULL);
		if (!c)
			c = malloc(sizeof(*c));
		if (!c)
			return -ENOMEM;
		atomic_init(&c->next, NULL);
		atomic_store_explicit(&q->tail->next, c, memory_order_release);
		q->tail = c;
		q->tail_used = 0;
	}
	q->tail->ev[q->tail_used++] = ev;
	atomic_store_explicit(&q->pushed, ++q->pushed_own, memory_order_release);
	atomic_store_explicit(&q->mark, t, memory_order_release);
	return 0;
}

/*
 * The held-back ends at or before t (every one: UINT64_MAX) onto q: 0 or
 * -ENOMEM, when the ends from the one that failed on stay held back.
 */
static int queue_flush(struct ukvm_online *o, struct ukvm_online_queue *q, uint64_t t)
{
	uint32_t i, k;
	int ret = 0;

	for (i = 0; i < q->npend; i++) {
		uint64_t at = o->t0 + (q->pend[i] >> UKVM_EV_SHIFT);

		if (at > t)
			break;
		ret = queue_push(q, q->pend[i], at);
		if (ret)
			break;	/* before i moves on: pend[i] was not pushed */
	}
	for (k = 0; i < q->npend; i++, k++)
		q->pend[k] = q->pend[i];
	q->npend = k;
	return ret;
}

uint64_t ukvm_online_now(const struct ukvm_online *o)
{
#ifdef UKVM_TEST_HOOKS
	return ukvm_now_ns() >> o->test_clock_shift << o->test_clock_shift;
#else
	return ukvm_now_ns();
#endif
}

uint64_t ukvm_online_stamp(struct ukvm_online *o, struct ukvm_online_queue *q)
{
	uint64_t t;
	int ret;

	if (atomic_load_explicit(&q->waiting, memory_order_relaxed))	/* its own flag */
		atomic_store(&q->waiting, 0);	/* seq_cst: before the clock is read */
	t = ukvm_online_now(o);
	/* What it held back is older than t; after it, nothing it pushes is older. */
	ret = queue_flush(o, q, UINT64_MAX);
	if (ret)
		online_fail(o, ret);	/* the mark stays below what is held back */
	else
		atomic_store_explicit(&q->mark, t, memory_order_release);
	return t;
}

void ukvm_online_sleep(struct ukvm_online *o, struct ukvm_online_queue *q)
{
	int ret = queue_flush(o, q, UINT64_MAX);

	/*
	 * On -ENOMEM the ends stay held back and the run fails at collect; the
	 * flag stays 0, so the queue holds the bound at its mark, below them.
	 */
	if (ret) {
		online_fail(o, ret);
		return;
	}
	atomic_store(&q->waiting, 1);	/* seq_cst: after every event is pushed */
}

/* A drained chunk back to q's producer, or freed if q keeps enough. */
static void spare_put(struct ukvm_online_queue *q, struct ukvm_online_chunk *c)
{
	for (unsigned i = 0; i < UKVM_ONLINE_SPARES; i++) {
		struct ukvm_online_chunk *none = NULL;

		if (atomic_compare_exchange_strong(&q->spare[i], &none, c))
			return;
	}
	free(c);
}

/* The events of q earlier than bound, into o->scratch from *n: 0 or -ENOMEM. */
static int queue_take(struct ukvm_online *o, struct ukvm_online_queue *q, uint64_t bound,
		      uint64_t *n)
{
	uint64_t avail = atomic_load_explicit(&q->pushed, memory_order_acquire) -
			 atomic_load_explicit(&q->taken, memory_order_relaxed);
	uint64_t got = 0;
	int ret = 0;

	while (got < avail) {
		uint64_t ev;

		if (q->head_used == UKVM_ONLINE_CHUNK) {
			struct ukvm_online_chunk *old = q->head;

			q->head = atomic_load_explicit(&old->next, memory_order_acquire);
			q->head_used = 0;
			spare_put(q, old);
		}
		ev = q->head->ev[q->head_used];
#ifdef UKVM_TEST_HOOKS
		if (o->test_nonstrict ? o->t0 + (ev >> UKVM_EV_SHIFT) > bound :
		    o->t0 + (ev >> UKVM_EV_SHIFT) >= bound)
			break;
#else
		if (o->t0 + (ev >> UKVM_EV_SHIFT) >= bound)
			break;	/* strictly earlier only: an event at bound may have company */
#endif
		if (*n == o->scratch_cap) {
			uint64_t cap = o->scratch_cap ? 2 * o->scratch_cap : 4096;
			uint64_t *p = realloc(o->scratch, cap * sizeof(*p));

			if (!p) {
				ret = -ENOMEM;
				break;
			}
			o->scratch = p;
			o->scratch_cap = cap;
		}
		o->scratch[(*n)++] = ev;
		q->head_used++;
		got++;
	}
	atomic_store_explicit(&q->taken, atomic_load_explicit(&q->taken, memory_order_relaxed) + got,
			      memory_order_release);
	/* Not from *n and got: scratch may be exactly full where the bound stopped the take. */
	return ret;
}

/* Under o->lock: every queue's events earlier than the least watermark (all: every one), swept. */
static void drain_locked(struct ukvm_online *o, bool all)
{
	uint32_t i, nr = atomic_load_explicit(&o->nr, memory_order_acquire);
	uint64_t n = 0, bound = UINT64_MAX;

#ifdef UKVM_TEST_HOOKS
	if (o->test_skip_last && nr)
		nr--;
#endif
	if (!all) {
		/* The clock first, ordered before the flags' loads (lfence after rdtsc). */
		uint64_t now = ukvm_online_now(o);

		__asm__ __volatile__("lfence" ::: "memory");
		for (i = 0; i < nr; i++) {
			struct ukvm_online_queue *q = o->queues[i];
			uint64_t mark;

#ifdef UKVM_TEST_HOOKS
			if (!o->test_no_waiting && atomic_load(&q->waiting))
#else
			if (atomic_load(&q->waiting))	/* seq_cst */
#endif
				mark = now;	/* its next event is stamped after it wakes */
			else
				mark = atomic_load_explicit(&q->mark, memory_order_acquire);
			bound = mark < bound ? mark : bound;
		}
#ifdef UKVM_TEST_HOOKS
		if (o->test_late_bound)	/* strictly earlier: the step after the bound's taken too */
			bound += 2ULL << o->test_clock_shift;
#endif
	}
	for (i = 0; i < nr && !atomic_load(&o->error); i++) {
		int ret = queue_take(o, o->queues[i], bound, &n);

		if (ret)
			online_fail(o, ret);
	}
	if (atomic_load(&o->error) || !n)
		return;
	ukvm_sort_u64(o->scratch, n);
	for (uint64_t k = 0; k < n; k++)
		ukvm_sweep_packed(&o->sweep, o->scratch[k], o->t0);
	o->drains++;
}

bool ukvm_online_try_drain(struct ukvm_online *o)
{
	if (pthread_mutex_trylock(&o->lock))
		return false;	/* another drains: go on */
	drain_locked(o, false);
	pthread_mutex_unlock(&o->lock);
	return true;
}

int ukvm_online_fault(struct ukvm_online *o, struct ukvm_online_queue *q, uint64_t t_read,
		      uint64_t t_done, uint64_t gpa, int32_t tid, bool eexist)
{
	const struct ukvm_tid_index *map = atomic_load_explicit(&o->map_ready,
								 memory_order_acquire);
	int32_t vcpu = map ? ukvm_tid_vcpu(map, o->nr_vcpus, tid) : -1;
	uint64_t page = gpa < o->region_gpa ? UINT64_MAX : (gpa - o->region_gpa) / o->page_size;
	int ret;

	if (!eexist && page < o->region_pages) {
		uint64_t bit = 1ULL << (page % 64);

		if (atomic_fetch_or_explicit(&o->once[page / 64], bit, memory_order_relaxed) & bit)
			atomic_fetch_or_explicit(&o->again[page / 64], bit, memory_order_relaxed);
	}
	if (vcpu < 0)
		return 0;	/* not a vCPU's fault (no THREAD_ID, say): pages only */
	ukvm_faultlog_count(&q->vcpus[vcpu].faults, &q->vcpus[vcpu].eexist,
			    &q->vcpus[vcpu].service_latency, eexist, t_done - t_read);
	/*
	 * A span of no time blocks for none, and the sweep's order (ends first
	 * at one instant) would meet its end before its start: no events.
	 */
	if (t_done == t_read)
		return 0;
	/* Ends up to t_read go first (ends before starts at one instant), then the start. */
	ret = queue_flush(o, q, t_read);
	if (ret)
		return ret;
	/*
	 * A batch's ends at most are held back (a stamp flushes them), so this
	 * is a caller that handled more faults than it read: flushing them here
	 * would put ends later than the start to come before it.
	 */
	if (q->npend == UKVM_MAX_READ_BATCH)
		return -EPROTO;
	ret = queue_push(q, ukvm_ev_pack(t_read - o->t0, vcpu, +1), t_read);
	if (ret)
		return ret;
	q->pend[q->npend++] = ukvm_ev_pack(t_done - o->t0, vcpu, -1);
	/* At most once per drain_at events: a queue held back by another tries no more often. */
	if (q->pushed_own >= q->next_try &&
	    q->pushed_own - atomic_load_explicit(&q->taken, memory_order_acquire) >= o->drain_at) {
		q->next_try = q->pushed_own + o->drain_at;
		ukvm_online_try_drain(o);
	}
	return 0;
}

/*
 * After the last drain every fault has closed: a vCPU still blocked, an end
 * without its start or an event earlier than the one before means the
 * merge lost, doubled or misordered an event. 0, or -EPROTO with err set.
 */
static int online_check(const struct ukvm_online *o, struct ukvm_error *err)
{
	const struct ukvm_sweep *st = &o->sweep;
	uint32_t v, open = 0;

	for (v = 0; v < st->nr_vcpus; v++)
		open += st->depth[v] != 0;
	if (!open && !st->blocked && !st->out_of_order && !st->unmatched)
		return 0;
	return ukvm_err_set(err, UKVM_ERR_RUN, EPROTO,
			    "the online statistics (stats full) lost, doubled or misordered a "
			    "fault's event: "
			    "%u vCPUs still blocked after the last drain (%u counted), %llu ends "
			    "without a start, %llu events earlier than the one before",
			    open, st->blocked, (unsigned long long)st->unmatched,
			    (unsigned long long)st->out_of_order);
}

int ukvm_online_finish(struct ukvm_online *o, struct ukvm_faultlog *log, struct ukvm_error *err)
{
	uint32_t i, v, nr = atomic_load(&o->nr);
	int ret;

	pthread_mutex_lock(&o->lock);
	for (i = 0; i < nr && !atomic_load(&o->error); i++) {	/* the resolvers have stopped */
		ret = queue_flush(o, o->queues[i], UINT64_MAX);
		if (ret)
			online_fail(o, ret);
	}
	if (!atomic_load(&o->error))
		drain_locked(o, true);
	pthread_mutex_unlock(&o->lock);
	ret = atomic_load(&o->error);
	if (ret)
		return ukvm_err_set(err, UKVM_ERR_RUN, -ret,
				    "the online statistics (stats full): queueing or draining "
				    "the faults' events");
	ret = online_check(o, err);
	if (ret)
		return ret;
	for (i = 0; i < nr; i++)
		for (v = 0; v < log->nr_vcpus && v < o->nr_vcpus; v++) {
			const struct ukvm_online_vcpu *x = &o->queues[i]->vcpus[v];

			log->vcpus[v].faults += x->faults;
			log->vcpus[v].eexist += x->eexist;
			ukvm_hist_merge(&log->vcpus[v].service_latency, &x->service_latency);
		}
	for (v = 0; v < log->nr_vcpus && v < o->nr_vcpus; v++)
		log->vcpus[v].blocked_ns += o->sweep.blocked_ns[v];
	log->blocktime_ns += o->sweep.blocktime_ns;
	ukvm_faultlog_pages(log, (const uint64_t *)o->once, (const uint64_t *)o->again);
	return 0;
}
