/* SPDX-License-Identifier: MIT */
/*
 * Fault records (stats full): the writer each resolver appends to during
 * the run, and after it, off the hot path, from the records to what each
 * vCPU went through.
 *
 * A record spans a reader's read() returning the fault message to its
 * resolving ioctl returning (the service stage), and names the faulting
 * thread (UFFD_FEATURE_THREAD_ID), which maps to a vCPU. With guest_timing
 * the vCPU's own access log adds the two ends the readers cannot see: when
 * the guest was about to make the access (raised) and when it completed
 * (resumed), converted from the guest's TSC to CLOCK_MONOTONIC (tsc.h). The
 * record of vCPU v at 4 KiB page p takes the stamps of v's first-pass access
 * to p: a vCPU faults on a page only in the pass that first touches it.
 * Where the kernel names only the huge page of a hugetlb fault (no
 * UFFD_FEATURE_EXACT_ADDRESS), the record takes v's first access to that
 * huge page, which is the faulting one: a hugetlb page appears whole, in
 * one go. (A THP copy does not: it installs 4 KiB pieces one by one, and a
 * vCPU can touch a piece already in, then fault on one still to come; but
 * anonymous faults always name their 4 KiB page.)
 *
 * A vCPU is blocked while one of its faults is outstanding, raised to
 * resumed when the stamps are known, read to resolved otherwise; the VM is
 * blocked while every vCPU is (QEMU's postcopy-blocktime). Both come from
 * one sweep over the faults' start and end events in time order.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/errors.h"
#include "base/hist.h"
#include "base/tsc.h"
#include "base/util.h"
#include "kvm/guest_abi.h"
#include "uapi_compat.h"
#include "uffd/faultlog.h"

void ukvm_faultlog_store_init(struct ukvm_faultlog_store *store)
{
	store->records = NULL;
	store->cap = 0;
	atomic_init(&store->chunks, 0);
}

int ukvm_faultlog_store_create(struct ukvm_faultlog_store *store, uint64_t cap, uint64_t warm,
			       const char *who, struct ukvm_error *err)
{
	void *p;

	p = mmap(NULL, cap * sizeof(*store->records), PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "%s: mmap(fault log, %llu records)",
				    who, (unsigned long long)cap);
	store->records = p;
	store->cap = cap;
	/* Best effort (Linux 5.14+): without it the first records fault the pages in. */
	madvise(p, ALIGN_UP((warm < cap ? warm : cap) * sizeof(*store->records), UKVM_PAGE_SIZE),
		MADV_POPULATE_WRITE);
	return 0;
}

void ukvm_faultlog_store_destroy(struct ukvm_faultlog_store *store)
{
	if (store->records)
		munmap(store->records, store->cap * sizeof(*store->records));
	ukvm_faultlog_store_init(store);
}

struct ukvm_fault_record *ukvm_faultlog_next(struct ukvm_faultlog_store *store,
					     struct ukvm_faultlog_writer *w)
{
	if (w->next == w->end) {
		uint64_t chunk = atomic_fetch_add_explicit(&store->chunks, 1, memory_order_relaxed);

		if ((chunk + 1) * UKVM_LOG_CHUNK > store->cap)
			return NULL;
		w->next = store->records + chunk * UKVM_LOG_CHUNK;
		w->end = w->next + UKVM_LOG_CHUNK;
	}
	return w->next++;
}

struct event {
	uint64_t t;
	int32_t vcpu;
	int32_t delta;	/* +1 a fault starts, -1 it ends */
};

static int cmp_tid(const void *a, const void *b)
{
	const struct ukvm_tid_index *x = a, *y = b;

	return (x->tid > y->tid) - (x->tid < y->tid);
}

static int cmp_read(const void *a, const void *b)
{
	const struct ukvm_fault_record *x = a, *y = b;

	return (x->read_ns > y->read_ns) - (x->read_ns < y->read_ns);
}

/* By time; at the same instant an end before a start, so touching faults do not overlap. */
static int cmp_event(const void *a, const void *b)
{
	const struct event *x = a, *y = b;

	if (x->t != y->t)
		return (x->t > y->t) - (x->t < y->t);
	return x->delta - y->delta;
}

/*
 * ev sorted by cmp_event in place: a heapsort, where qsort() (glibc's
 * merge sort) would take a second array as large as ev, 32 bytes a fault.
 */
static void sift(struct event *ev, uint64_t root, uint64_t n)
{
	for (;;) {
		uint64_t child = 2 * root + 1;
		struct event tmp;

		if (child >= n)
			return;
		if (child + 1 < n && cmp_event(&ev[child], &ev[child + 1]) < 0)
			child++;
		if (cmp_event(&ev[root], &ev[child]) >= 0)
			return;
		tmp = ev[root];
		ev[root] = ev[child];
		ev[child] = tmp;
		root = child;
	}
}

static void sort_events(struct event *ev, uint64_t n)
{
	uint64_t i;
	struct event tmp;

	for (i = n / 2; i-- > 0;)
		sift(ev, i, n);
	for (i = n; i-- > 1;) {
		tmp = ev[0];
		ev[0] = ev[i];
		ev[i] = tmp;
		sift(ev, 0, i);
	}
}

void ukvm_tid_sort(struct ukvm_tid_index *map, uint32_t n)
{
	qsort(map, n, sizeof(*map), cmp_tid);
}

int32_t ukvm_tid_vcpu(const struct ukvm_tid_index *map, uint32_t n, int32_t tid)
{
	struct ukvm_tid_index key = { .tid = tid };
	const struct ukvm_tid_index *hit = bsearch(&key, map, n, sizeof(*map), cmp_tid);

	return hit ? hit->index : -1;
}

int ukvm_sweep_begin(struct ukvm_sweep *st, uint32_t nr_vcpus)
{
	*st = (struct ukvm_sweep){ .nr_vcpus = nr_vcpus,
				   .depth = calloc(nr_vcpus ?: 1, sizeof(*st->depth)),
				   .since = calloc(nr_vcpus ?: 1, sizeof(*st->since)),
				   .blocked_ns = calloc(nr_vcpus ?: 1, sizeof(*st->blocked_ns)) };
	return st->depth && st->since && st->blocked_ns ? 0 : -ENOMEM;
}

/* One event, in time order (at equal t, ends before starts): the sweep's step. */
void ukvm_sweep_step(struct ukvm_sweep *st, uint64_t t, int32_t vcpu, int32_t delta)
{
	if (st->started && t < st->last) {
		st->out_of_order++;
		t = st->last;
	}
	if (st->blocked == st->nr_vcpus && st->started)
		st->blocktime_ns += t - st->last;
	st->started = true;
	st->last = t;
	if (delta > 0) {
		if (st->depth[vcpu]++ == 0) {
			st->since[vcpu] = t;
			st->blocked++;
		}
	} else if (!st->depth[vcpu]) {
		st->unmatched++;	/* its start lost, or the end doubled */
	} else if (--st->depth[vcpu] == 0) {
		st->blocked_ns[vcpu] += t - st->since[vcpu];
		st->blocked--;
	}
}

void ukvm_sweep_end(struct ukvm_sweep *st)
{
	free(st->depth);
	free(st->since);
	free(st->blocked_ns);
	st->depth = NULL;
	st->since = NULL;
	st->blocked_ns = NULL;
}

/* The sweep's totals into log's outputs. */
static void sweep_out(struct ukvm_faultlog *log, const struct ukvm_sweep *st)
{
	uint32_t v;

	log->blocktime_ns += st->blocktime_ns;
	for (v = 0; v < log->nr_vcpus; v++)
		log->vcpus[v].blocked_ns += st->blocked_ns[v];
}

static int sweep(struct ukvm_faultlog *log, struct event *ev, uint64_t n)
{
	struct ukvm_sweep st;
	uint64_t i;
	int ret = ukvm_sweep_begin(&st, log->nr_vcpus);

	for (i = 0; !ret && i < n; i++)
		ukvm_sweep_step(&st, ev[i].t, ev[i].vcpu, ev[i].delta);
	if (!ret)
		sweep_out(log, &st);
	ukvm_sweep_end(&st);
	return ret;
}

_Static_assert(UKVM_MAX_VCPUS <= 1 << UKVM_EV_VCPU_BITS, "a vCPU index fits a packed event");

static void sift_u64(uint64_t *v, uint64_t root, uint64_t n)
{
	for (;;) {
		uint64_t child = 2 * root + 1, tmp;

		if (child >= n)
			return;
		if (child + 1 < n && v[child] < v[child + 1])
			child++;
		if (v[root] >= v[child])
			return;
		tmp = v[root];
		v[root] = v[child];
		v[child] = tmp;
		root = child;
	}
}

void ukvm_sort_u64(uint64_t *v, uint64_t n)
{
	uint64_t i, tmp;

	for (i = n / 2; i-- > 0;)
		sift_u64(v, i, n);
	for (i = n; i-- > 1;) {
		tmp = v[0];
		v[0] = v[i];
		v[i] = tmp;
		sift_u64(v, 0, i);
	}
}

/* The records of store that were claimed: a chunk's unwritten tail has read_ns 0. */
static uint64_t store_used(struct ukvm_faultlog_store *store)
{
	uint64_t used = atomic_load(&store->chunks) * UKVM_LOG_CHUNK;

	return store->records ? (used > store->cap ? store->cap : used) : 0;
}

/* Every record the resolvers wrote, from the stores, into log->all. */
static int gather(struct ukvm_faultlog *log, struct ukvm_faultlog_store *const *stores,
		  uint32_t nr_stores)
{
	uint64_t n = 0, k = 0, i, used;
	uint32_t u;

	for (u = 0; u < nr_stores; u++)
		for (i = 0, used = store_used(stores[u]); i < used; i++)
			n += stores[u]->records[i].read_ns != 0;
	log->all = malloc((n ?: 1) * sizeof(*log->all));
	if (!log->all)
		return -ENOMEM;
	for (u = 0; u < nr_stores; u++)
		for (i = 0, used = store_used(stores[u]); i < used && k < n; i++)
			if (stores[u]->records[i].read_ns)
				log->all[k++] = stores[u]->records[i];
	log->nr_all = k;
	return 0;
}

static uint64_t entry_word(const struct ukvm_guest_log *g, uint64_t i, unsigned off)
{
	uint64_t v;

	memcpy(&v, g->entries + i * GA_LOG_ENTRY + off, sizeof(v));
	return v;
}

/*
 * guest_timing: raised_ns and resumed_ns of every record, from the access
 * log of the vCPU that faulted. The records are visited vCPU by vCPU through
 * `order` (record indexes grouped by vCPU), with one table at a time: each
 * page the records can name (match_bytes) -> the vCPU's earliest log entry.
 */
static int stamp(struct ukvm_faultlog *log)
{
	uint64_t *first = calloc(log->nr_vcpus + 1, sizeof(*first));
	uint64_t *order = malloc((log->nr_all ?: 1) * sizeof(*order));
	uint64_t *fill = calloc(log->nr_vcpus + 1, sizeof(*fill));
	uint32_t *entry_of = NULL;
	uint64_t i, pages, max_pages = 0;
	uint32_t v;
	int ret = -ENOMEM;

	if (!first || !order || !fill)
		goto out;
	for (i = 0; i < log->nr_all; i++)
		if (log->all[i].vcpu >= 0)
			first[log->all[i].vcpu + 1]++;
	for (v = 0; v < log->nr_vcpus; v++) {
		uint64_t walked = log->guest[v].pages ?: log->guest[v].nr;

		first[v + 1] += first[v];
		if (walked > max_pages)
			max_pages = walked;	/* 4 KiB pages: at least the backing pages */
	}
	for (i = 0; i < log->nr_all; i++)
		if (log->all[i].vcpu >= 0)
			order[first[log->all[i].vcpu] + fill[log->all[i].vcpu]++] = i;
	entry_of = malloc((max_pages ?: 1) * sizeof(*entry_of));
	if (!entry_of)
		goto out;

	for (v = 0; v < log->nr_vcpus; v++) {
		const struct ukvm_guest_log *g = &log->guest[v];

		if (!g->usable || first[v] == first[v + 1])
			continue;
		pages = (g->pages ?: g->nr) * UKVM_PAGE_SIZE / log->match_bytes;
		memset(entry_of, 0xff, pages * sizeof(*entry_of));
		for (i = 0; i < g->nr; i++) {	/* in access order: the first is the earliest */
			uint64_t page = (entry_word(g, i, LOG_GVA) - g->base_gpa) / log->match_bytes;

			if (page < pages && entry_of[page] == UINT32_MAX)
				entry_of[page] = (uint32_t)i;
		}
		for (i = first[v]; i < first[v + 1]; i++) {
			struct ukvm_fault_record *rec = &log->all[order[i]];
			uint64_t page = (rec->gpa - g->base_gpa) / log->match_bytes;
			uint64_t raised, resumed;
			uint32_t e;

			if (rec->gpa < g->base_gpa || page >= pages || entry_of[page] == UINT32_MAX)
				continue;	/* not an access of this vCPU's walk */
			e = entry_of[page];
			raised = entry_word(g, e, LOG_RAISED);
			resumed = entry_word(g, e, LOG_RESUMED);
#ifdef UKVM_TEST_HOOKS
			raised += g->tsc_bias;
			resumed += g->tsc_bias;
#endif
			if (resumed < raised)
				continue;	/* the access never completed */
			rec->raised_ns = ukvm_tsc_clock_ns(log->clock, raised - (uint64_t)g->tsc_offset);
			rec->resumed_ns = ukvm_tsc_clock_ns(log->clock,
							    resumed - (uint64_t)g->tsc_offset);
		}
	}
	ret = 0;
out:
	free(first);
	free(order);
	free(fill);
	free(entry_of);
	return ret;
}

/*
 * Each page (of page_size) of the region resolved exactly once, EEXIST
 * aside? Two bits a page (resolved at all, resolved again): a 4 GiB region
 * of 4 KiB pages takes 64 KiB.
 */
static int count_pages(struct ukvm_faultlog *log)
{
	uint64_t words = log->region_pages / 64 + 1, i;
	uint64_t *once = calloc(words, sizeof(*once)), *again = calloc(words, sizeof(*again));
	int ret = -ENOMEM;

	if (!once || !again)
		goto out;
	for (i = 0; i < log->nr_all; i++) {
		const struct ukvm_fault_record *rec = &log->all[i];
		uint64_t page = (rec->gpa - log->region_gpa) / log->page_size, bit;

		if (rec->eexist || rec->gpa < log->region_gpa || page >= log->region_pages)
			continue;
		bit = 1ULL << (page % 64);
		if (once[page / 64] & bit)
			again[page / 64] |= bit;
		once[page / 64] |= bit;
	}
	ukvm_faultlog_pages(log, once, again);
	ret = 0;
out:
	free(once);
	free(again);
	return ret;
}

void ukvm_faultlog_pages(struct ukvm_faultlog *log, const uint64_t *once, const uint64_t *again)
{
	uint64_t i;

	for (i = 0; i < log->region_pages; i++) {
		uint64_t bit = 1ULL << (i % 64);
		bool seen = once[i / 64] & bit, twice = again[i / 64] & bit;
		bool touched = !log->visits, untouched;
		uint64_t k, per = log->page_size / UKVM_PAGE_SIZE;

		for (k = 0; !touched && k < per; k++)
			touched = log->visits[i * per + k];
		untouched = !touched && seen;
		if (touched ? seen && !twice : !seen)
			continue;
		if (!log->pages_not_once++) {
			log->first_bad_gpa = log->region_gpa + i * log->page_size;
			log->first_bad_resolved_again = twice;
			log->first_bad_untouched = untouched;
		}
	}
}

static uint64_t page_of(const struct ukvm_faultlog *log, uint64_t gpa)
{
	return gpa < log->region_gpa ? UINT64_MAX : (gpa - log->region_gpa) / log->page_size;
}

/*
 * *out: the index in log->all of the fault that resolved each page (not
 * EEXIST), or UINT64_MAX; NULL without the guest's stamps (nothing to check
 * them by) or without an EEXIST message (no vCPU was woken by another's
 * fault). 0, or -ENOMEM.
 */
static int resolvers(const struct ukvm_faultlog *log, uint64_t **out)
{
	uint64_t *by_page, i;

	*out = NULL;
	if (!log->guest)
		return 0;
	for (i = 0; i < log->nr_all && !log->all[i].eexist; i++)
		;
	if (i == log->nr_all)
		return 0;
	by_page = malloc((log->region_pages ?: 1) * sizeof(*by_page));
	if (!by_page)
		return -ENOMEM;
	memset(by_page, 0xff, (log->region_pages ?: 1) * sizeof(*by_page));
	for (i = 0; i < log->nr_all; i++) {
		uint64_t page = page_of(log, log->all[i].gpa);

		if (!log->all[i].eexist && page < log->region_pages)
			by_page[page] = i;
	}
	*out = by_page;
	return 0;
}

static bool woken_by_other(const struct ukvm_faultlog *log,
			   const struct ukvm_fault_record *rec, const uint64_t *resolver)
{
	const struct ukvm_fault_record *by;
	uint64_t page = page_of(log, rec->gpa);

	if (!rec->eexist || !resolver || page >= log->region_pages ||
	    resolver[page] == UINT64_MAX)
		return false;
	by = &log->all[resolver[page]];
	return rec->raised_ns < rec->resumed_ns && rec->resumed_ns <= rec->read_ns &&
	       by->read_ns < rec->resumed_ns && rec->raised_ns < by->resolved_ns;
}

/*
 * One fault's stages into its vCPU's and reader's histograms; its blocked
 * span into ev.
 *
 * With the guest's stamps the stages partition the vCPU's stall, raised to
 * resumed, at the read and at the page's arrival. The page arrives inside
 * the resolving ioctl, which wakes the vCPU before it returns; a reader that
 * the woken vCPU preempts sees the return only after the vCPU has resumed.
 * So the service stage ends at the ioctl's return or at the resume,
 * whichever came first, and the resume stage is what is left. The reader's
 * own service_latency keeps the ioctl's return: its busy time.
 */
static void account(struct ukvm_faultlog *log, const struct ukvm_fault_record *rec,
		    const uint64_t *resolver, struct event *ev)
{
	struct ukvm_vcpu_result *v = &log->vcpus[rec->vcpu];
	uint64_t start = rec->read_ns, end = rec->resolved_ns, arrived;
	uint64_t r = (uint64_t)rec->uffd * log->readers_per_uffd + rec->reader;

	if (!rec->raised_ns || !rec->resumed_ns) {
		ukvm_faultlog_count(&v->faults, &v->eexist, &v->service_latency, rec->eexist,
				    rec->resolved_ns - rec->read_ns);
		goto blocked;
	}
	v->faults += !rec->eexist;	/* resolved, as a reader's faults count */
	v->eexist += rec->eexist;
	/*
	 * A message that found its page already resolved (EEXIST) may be read
	 * after its vCPU resumed: with overlap, another vCPU's fault on the same
	 * page was resolved first, and that resolution woke every vCPU waiting
	 * on the page. Such a stall has no queue, service or resume of its own:
	 * it counts whole (raised to resumed), in fault_latency and blocked time.
	 * Only where the page's resolving fault bears it out (read before this
	 * vCPU resumed, resolved after it raised): else it is a clock error.
	 */
	if (woken_by_other(log, rec, resolver)) {
		ukvm_hist_add(&v->fault_latency, rec->resumed_ns - rec->raised_ns);
		start = rec->raised_ns;
		end = rec->resumed_ns;
		goto blocked;
	}
	/*
	 * raised < read < resumed holds for every other fault: the message
	 * exists only after the access began, and the access completes only
	 * after the page came. Stamps that say otherwise are a clock error.
	 */
	if (rec->raised_ns >= rec->read_ns || rec->resumed_ns <= rec->read_ns) {
		log->misordered++;
		ukvm_hist_add(&v->service_latency, rec->resolved_ns - rec->read_ns);
		goto blocked;
	}
	arrived = rec->resolved_ns < rec->resumed_ns ? rec->resolved_ns : rec->resumed_ns;
	ukvm_hist_add(&v->queue_latency, rec->read_ns - rec->raised_ns);
	ukvm_hist_add(&v->service_latency, arrived - rec->read_ns);
	ukvm_hist_add(&v->resume_latency, rec->resumed_ns - arrived);
	ukvm_hist_add(&v->fault_latency, rec->resumed_ns - rec->raised_ns);
	if (log->readers && rec->reader < log->readers_per_uffd)
		ukvm_hist_add(&log->readers[r].queue_latency, rec->read_ns - rec->raised_ns);
	start = rec->raised_ns;
	end = rec->resumed_ns;
blocked:
	ev[0] = (struct event){ start, rec->vcpu, +1 };
	ev[1] = (struct event){ end, rec->vcpu, -1 };
}

int ukvm_faultlog_build(struct ukvm_faultlog *log, struct ukvm_faultlog_store *const *stores,
			uint32_t nr_stores)
{
	struct ukvm_tid_index *map = NULL;
	uint64_t *resolver = NULL;
	struct event *ev = NULL;
	uint64_t i, k = 0;
	int ret;

	ret = gather(log, stores, nr_stores);
	if (ret)
		return ret;
	ret = -ENOMEM;
	map = malloc((log->nr_vcpus ?: 1) * sizeof(*map));
	if (!log->trace_only)	/* else no events: online.h swept them */
		ev = malloc((2 * log->nr_all ?: 1) * sizeof(*ev));
	if (!map || (!log->trace_only && !ev))
		goto out;
	qsort(log->all, log->nr_all, sizeof(*log->all), cmp_read);

	for (i = 0; i < log->nr_vcpus; i++)
		map[i] = (struct ukvm_tid_index){ .tid = log->tids[i], .index = (int32_t)i };
	ukvm_tid_sort(map, log->nr_vcpus);
	for (i = 0; i < log->nr_all; i++)
		log->all[i].vcpu = ukvm_tid_vcpu(map, log->nr_vcpus, log->all[i].vcpu);
	if (log->trace_only) {
		ret = 0;
		goto out;
	}
	if (log->guest && stamp(log))
		goto out;
	if (count_pages(log))
		goto out;

	if (resolvers(log, &resolver))
		goto out;
	for (i = 0; i < log->nr_all; i++) {
		if (log->all[i].vcpu < 0)
			continue;	/* not a vCPU's fault (no THREAD_ID, say) */
		account(log, &log->all[i], resolver, &ev[k]);
		if (ev[k].t != ev[k + 1].t)
			k += 2;	/* a span of no time has no events (faultlog.h) */
	}
	sort_events(ev, k);
	ret = sweep(log, ev, k);
out:
	free(map);
	free(ev);
	free(resolver);
	return ret;
}
