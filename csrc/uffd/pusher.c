/* SPDX-License-Identifier: MIT */
/*
 * Prefetch's pusher: one thread per run (prefetch background or replay)
 * that installs pages the guest has not asked for yet, QEMU's post-copy
 * stream and REAP's recorded working set. Faults jump the queue: the
 * readers never wait for the pusher, which skips pages already resident
 * and meets EEXIST, counted, where a fault's copy won the race. Its copies
 * do not wake anyone (UFFDIO_COPY_MODE_DONTWAKE): a vCPU already waiting on
 * such a page is woken by the reader of its fault, which finds EEXIST.
 *
 * Each page is two steps: fetch its bytes from the page source through
 * the pusher's own connection (source.h; not urgent: no fault waits for
 * it), then install them. From a file or the synthetic fill a fetch costs
 * no round trip: one page at a time. From a page server (the only source
 * that pipelines) one page per round trip would cap the pusher at
 * 1/latency pages a second, so it keeps up to PUSHER_DEPTH requests in
 * flight, each for a run of up to PUSHER_CHUNK_PAGES absent pages in a row
 * (in install order, within one uffd's range), and installs a reply's
 * pages as it arrives, each re-checked for residency first: a fault may
 * have brought it meanwhile (counted as EEXIST, like a copy that lost).
 *
 * Its rate (bandwidth_mbps, 10^6 bits/s) is a token bucket kept by
 * sleeping: the next page may go at next_ns, which advances a page's time
 * per page; credit for idle time is capped at PACE_BURST_NS, and no sleep
 * is longer than PACE_SLICE_NS, so a stop is seen within that.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/ctl.h"
#include "base/errors.h"
#include "base/kick.h"
#include "base/thread.h"
#include "base/util.h"
#include "uffd/pusher.h"
#include "uffd/resident.h"
#include "uffd/source.h"
#include "uffd/uffd.h"

#define PUSHER_STACK_BYTES	(256ULL << 10)
#define PACE_SLICE_NS		(10 * NSEC_PER_MSEC)
#define PACE_BURST_NS		(10 * NSEC_PER_MSEC)
#define PUSHER_WHO		"prefetch pusher"
/*
 * A page server: requests kept in flight on the pusher's connection
 * (docs/config.md, docs/postcopy.md), each for at most PUSHER_CHUNK_PAGES
 * pages and PUSHER_CHUNK_BYTES bytes (one page if a page is larger), and
 * with a rate at most what PACE_BURST_NS of credit allows, so that a
 * chunk is no burst the token bucket would not allow.
 */
#define PUSHER_DEPTH		16
#define PUSHER_CHUNK_PAGES	16
#define PUSHER_CHUNK_BYTES	(64ULL << 10)

/* A request in flight: pages [page, page + pages), numbered over the region. */
struct pusher_request {
	uint64_t page;
	uint32_t pages;
};

void ukvm_pusher_init(struct ukvm_pusher *p)
{
	memset(p, 0, sizeof(*p));
	p->stop_fd = -1;
	atomic_init(&p->stop, false);
	atomic_init(&p->exited, false);
}

static bool pusher_stopping(struct ukvm_pusher *p)
{
	return atomic_load_explicit(&p->stop, memory_order_relaxed) || ukvm_ctl_stopping(p->ctl);
}

/* Waits for the vCPUs' go: true to push, false to leave. */
static bool pusher_wait_go(struct ukvm_pusher *p)
{
	struct ukvm_ctl *ctl = p->ctl;
	struct timespec ts;
	int go;

	pthread_mutex_lock(&ctl->lock);
	while (ctl->go == 0 && !pusher_stopping(p)) {
		ukvm_timespec(&ts, ukvm_deadline_after(PACE_SLICE_NS));
		pthread_cond_timedwait(&ctl->cond, &ctl->lock, &ts);
	}
	go = ctl->go;
	pthread_mutex_unlock(&ctl->lock);
	return go > 0 && !pusher_stopping(p);
}

/*
 * The token bucket: charges pages once they may go. 0 then; -EAGAIN if
 * not yet and !wait; -ECANCELED if told to stop (meanwhile).
 */
static int pusher_pace(struct ukvm_pusher *p, uint64_t *next_ns, uint32_t pages, bool wait)
{
	/* 8 bits a byte, mbps 10^6 bits a second: page_ns = bits * 1000 / mbps. */
	uint64_t page_ns = p->page_size * 8 * 1000 / p->bandwidth_mbps;
	uint64_t now = ukvm_now_ns(), left;

	if (*next_ns + PACE_BURST_NS < now)
		*next_ns = now - PACE_BURST_NS;
	while (now < *next_ns) {
		if (pusher_stopping(p))
			return -ECANCELED;
		if (!wait)
			return -EAGAIN;
		left = *next_ns - now;
		ukvm_sleep_ns(left < PACE_SLICE_NS ? left : PACE_SLICE_NS);
		now = ukvm_now_ns();
	}
	*next_ns += page_ns * pages;
	return pusher_stopping(p) ? -ECANCELED : 0;
}

void ukvm_pusher_number_ranges(struct ukvm_pusher_range *ranges, uint32_t n, uint64_t page_size)
{
	uint64_t first = 0;
	uint32_t u;

	for (u = 0; u < n; u++) {
		ranges[u].first = first;
		first += ranges[u].size / page_size;
	}
}

struct ukvm_pusher_range *ukvm_pusher_find(struct ukvm_pusher_range *ranges, uint32_t n,
					   uint64_t page_size, uint64_t page, uint64_t *off)
{
	uint32_t lo = 0, hi = n, mid;

	/* The last range whose first page is at or before page. */
	while (hi - lo > 1) {
		mid = lo + (hi - lo) / 2;
		if (ranges[mid].first <= page)
			lo = mid;
		else
			hi = mid;
	}
	if (!n || page < ranges[lo].first || (page - ranges[lo].first) * page_size >= ranges[lo].size)
		return NULL;
	*off = (page - ranges[lo].first) * page_size;
	return &ranges[lo];
}

/* The range page (of the whole region) falls in, and its offset there. */
static struct ukvm_pusher_range *pusher_range(struct ukvm_pusher *p, uint64_t page,
					      uint64_t *off)
{
	return ukvm_pusher_find(p->ranges, p->nr_ranges, p->page_size, page, off);
}

/* A failed fetch of pages from page: the run's failure, unless it is over anyway. */
static int pusher_fetch_failed(struct ukvm_pusher *p, int ret, uint64_t page, uint64_t pages)
{
	if (pusher_stopping(p) || ukvm_ctl_aborted(p->ctl))
		return ret;
	/* Named as the readers name it (resolve.c): the file, or the server's address. */
	ukvm_ctl_fail(p->ctl, UKVM_ERR_RUN, -ret, "%s: fetching %llu bytes at offset %llu of "
		      "%s %s: %s", PUSHER_WHO, (unsigned long long)(pages * p->page_size),
		      (unsigned long long)(page * p->page_size),
		      p->source->kind == UKVM_SOURCE_REMOTE ? "the page server at" : "source_path",
		      p->source->kind == UKVM_SOURCE_REMOTE ? p->source->address : p->source->path,
		      ukvm_source_strerror(p->source, ret));
	return ret;
}

/*
 * Installs page from src unless it is resident by now: 0 (installed, or
 * found there: counted), or -errno with the failure recorded as the run's.
 */
static int pusher_copy(struct ukvm_pusher *p, uint64_t page, const uint8_t *src)
{
	struct ukvm_pusher_range *range;
	uint64_t off;
	int ret;

	range = pusher_range(p, page, &off);
	if (!range)
		return 0;	/* replay was checked against the region: cannot happen */
	if (!ukvm_resident_absent(p->resident, page)) {
		p->eexist++;	/* a fault won while the bytes were on their way */
		return 0;
	}
	ret = ukvm_uffd_copy_dontwake(range->uffd, range->hva + off, src, p->page_size);
	if (!ret) {
		ukvm_resident_mark(p->resident, page, UKVM_PAGE_PREFETCHED);
		p->pages++;
		return 0;
	}
	if (ret == -EEXIST) {
		p->eexist++;
		return 0;
	}
	if (pusher_stopping(p) || ukvm_ctl_aborted(p->ctl))
		return ret;	/* the run is over, its uffds going: nothing to report */
	ukvm_ctl_fail(p->ctl, UKVM_ERR_RUN, -ret,
		      "%s: UFFDIO_COPY(MODE_DONTWAKE, %llu bytes at gpa 0x%llx)", PUSHER_WHO,
		      (unsigned long long)p->page_size, (unsigned long long)(range->gpa + off));
	return ret;
}

/* Fetches the page's bytes, then installs them: as pusher_copy(). */
static int pusher_install(struct ukvm_pusher *p, uint64_t page)
{
	struct ukvm_pusher_range *range;
	uint64_t off;
	int ret;

	range = pusher_range(p, page, &off);
	if (!range)
		return 0;
	ret = ukvm_source_fetch(&p->conn, page * p->page_size, p->page_size, range->gpa + off,
				p->buf, false);
	if (ret)
		return pusher_fetch_failed(p, ret, page, 1);
	return pusher_copy(p, page, p->buf);
}

static uint64_t pusher_page(const struct ukvm_pusher *p, uint64_t i)
{
	return p->order ? p->order[i] : i;
}

/*
 * The next run to ask for from the *i-th page to install on: up to max
 * absent pages in a row, within one range. Its length (*i past it, *first
 * its first page), or 0 when no absent page is left.
 */
static uint32_t pusher_next_run(struct ukvm_pusher *p, uint64_t *i, uint64_t n, uint32_t max,
				uint64_t *first)
{
	struct ukvm_pusher_range *range = NULL;
	uint64_t page = 0, off = 0, next;
	uint32_t k;

	for (; *i < n; (*i)++) {
		page = pusher_page(p, *i);
		if (ukvm_resident_absent(p->resident, page)) {
			range = pusher_range(p, page, &off);
			if (range)
				break;
		}
	}
	if (!range)
		return 0;
	*first = page;
	for (k = 1, (*i)++; k < max && *i < n; k++, (*i)++) {
		next = pusher_page(p, *i);
		if (next != page + k || off + (k + 1) * p->page_size > range->size ||
		    !ukvm_resident_absent(p->resident, next))
			break;
	}
	return k;
}

/*
 * A page server: up to PUSHER_DEPTH requests in flight, a reply's pages
 * installed as it comes. Leaves at the end, on a stop (a wait for a reply
 * gives up on the stop eventfd; the requests still in flight go with the
 * connection, closed by ukvm_pusher_destroy()) or on a failure.
 */
static void pusher_pipeline(struct ukvm_pusher *p, uint64_t n)
{
	struct pusher_request req[PUSHER_DEPTH], run = { 0 };
	uint64_t ps = p->page_size, i = 0, next_ns = 0, off, len;
	uint32_t inflight = 0, max = p->chunk_pages, j, k;
	int ret;

	if (p->bandwidth_mbps) {
		uint64_t page_ns = ps * 8 * 1000 / p->bandwidth_mbps;
		uint64_t burst = page_ns ? PACE_BURST_NS / page_ns : max;

		max = burst < 1 ? 1 : burst < max ? (uint32_t)burst : max;
	}
	while (!pusher_stopping(p)) {
		while (inflight < PUSHER_DEPTH) {
			if (!run.pages)
				run.pages = pusher_next_run(p, &i, n, max, &run.page);
			if (!run.pages)
				break;
			if (p->bandwidth_mbps) {
				/* Replies to take meanwhile: do not sleep for the bucket. */
				ret = pusher_pace(p, &next_ns, run.pages, inflight == 0);
				if (ret == -EAGAIN)
					break;
				if (ret)
					return;
			}
			ret = ukvm_source_send(&p->conn, run.page * ps, run.pages * ps);
			if (ret) {
				pusher_fetch_failed(p, ret, run.page, run.pages);
				return;
			}
			req[inflight++] = run;
			run.pages = 0;
		}
		if (!inflight)
			return;		/* every page asked for and installed */
		ret = ukvm_source_recv(&p->conn, &off, &len, p->buf, p->buf_bytes);
		if (ret) {
			pusher_fetch_failed(p, ret, req[0].page, req[0].pages);
			return;
		}
		for (j = 0; j < inflight; j++)
			if (req[j].page * ps == off && req[j].pages * ps == len)
				break;
		if (j == inflight) {
			pusher_fetch_failed(p, -EPROTO, off / ps, len / ps);
			return;
		}
		run = req[j];
		memmove(&req[j], &req[j + 1], (inflight - j - 1) * sizeof(req[0]));
		inflight--;
		for (k = 0; k < run.pages; k++)
			if (pusher_copy(p, run.page + k, p->buf + k * ps))
				return;
		run.pages = 0;
	}
}

static void *pusher_thread(void *arg)
{
	struct ukvm_pusher *p = arg;
	uint64_t i, n, page, next_ns = 0;

	ukvm_kick_thread_init();
	p->tid = (int32_t)gettid();
	ukvm_thread_start(&p->state);
	ukvm_uffd_thread_init(p->ctl, PUSHER_WHO);
	ukvm_thread_at(&p->state, "waiting for the vCPUs to start");
	if (!pusher_wait_go(p))
		goto out;
	ukvm_thread_at(&p->state, "installing pages");
	n = p->order ? p->nr_order : p->resident->pages;
	if (ukvm_source_pipelined(&p->conn)) {
		pusher_pipeline(p, n);
		goto out;
	}
	for (i = 0; i < n && !pusher_stopping(p); i++) {
		page = pusher_page(p, i);
		if (!ukvm_resident_absent(p->resident, page))
			continue;
		if (p->bandwidth_mbps && pusher_pace(p, &next_ns, 1, true))
			break;
		if (pusher_install(p, page))
			break;
	}
out:
	ukvm_thread_at(&p->state, "leaving");
	atomic_store(&p->exited, true);
	return NULL;
}

uint32_t ukvm_pusher_fds(enum ukvm_source_kind source)
{
	return 1 + (source == UKVM_SOURCE_REMOTE);	/* its stop eventfd, its own connection */
}

int ukvm_pusher_start(struct ukvm_pusher *p, struct ukvm_error *err)
{
	void *buf;
	int ret;

	ukvm_pusher_number_ranges(p->ranges, p->nr_ranges, p->page_size);
	p->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (p->stop_fd < 0)
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "%s: eventfd", PUSHER_WHO);
	ret = ukvm_source_conn_open(&p->conn, p->source, false, p->stop_fd, err);
	if (ret)
		return ret;
	p->conn_open = true;
	p->chunk_pages = 1;
	if (ukvm_source_pipelined(&p->conn) && p->page_size < PUSHER_CHUNK_BYTES) {
		p->chunk_pages = (uint32_t)(PUSHER_CHUNK_BYTES / p->page_size);
		if (p->chunk_pages > PUSHER_CHUNK_PAGES)
			p->chunk_pages = PUSHER_CHUNK_PAGES;
	}
	p->buf_bytes = p->chunk_pages * p->page_size;
	buf = mmap(NULL, p->buf_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "%s: mmap(a buffer of %llu bytes)",
				    PUSHER_WHO, (unsigned long long)p->buf_bytes);
	p->buf = buf;
	ukvm_source_prepare(p->source, p->buf, p->buf_bytes);
#ifdef UKVM_TEST_HOOKS
	/* The run's fd budget counts the pusher by ukvm_pusher_fds(): a drift shows in any test. */
	if (ukvm_pusher_fds(p->source->kind) != 1u + (p->conn.remote != NULL))
		return ukvm_err_set(err, UKVM_ERR_RUN, 0, "%s holds %u fds, but its fd budget "
				    "(ukvm_pusher_fds) counts %u: the two have drifted apart",
				    PUSHER_WHO, 1u + (p->conn.remote != NULL),
				    ukvm_pusher_fds(p->source->kind));
#endif
	ret = ukvm_thread_create(p->ctl, &p->thread, PUSHER_STACK_BYTES, pusher_thread, p);
	if (ret) {
		ukvm_err_set(err, UKVM_ERR_RUN, -ret, "pthread_create(%s)", PUSHER_WHO);
		return ret;
	}
	p->thread_started = true;
	return 0;
}

void ukvm_pusher_request_stop(struct ukvm_pusher *p)
{
	uint64_t one = 1;

	if (atomic_exchange(&p->stop, true) || p->stop_fd < 0)
		return;
	/* A fetch from a page server waits on it. One write cannot overflow the counter. */
	if (write(p->stop_fd, &one, sizeof(one)) < 0) {
	}
}

uint32_t ukvm_pusher_reap(struct ukvm_pusher *p, bool kick)
{
	if (!p->thread_started)
		return 0;
	if (atomic_load(&p->exited)) {
		pthread_join(p->thread, NULL);	/* it is returning: prompt */
		p->thread_started = false;
		return 0;
	}
	if (kick)
		pthread_kill(p->thread, ukvm_kick_signal());
	return 1;
}

int ukvm_pusher_destroy(struct ukvm_pusher *p)
{
	if (ukvm_pusher_reap(p, false))
		return -EBUSY;
	if (p->buf)
		munmap(p->buf, p->buf_bytes);
	p->buf = NULL;
	if (p->conn_open)
		ukvm_source_conn_close(&p->conn);
	p->conn_open = false;
	if (p->stop_fd >= 0)
		close(p->stop_fd);
	p->stop_fd = -1;
	free(p->ranges);
	p->ranges = NULL;
	p->nr_ranges = 0;
	return 0;
}
