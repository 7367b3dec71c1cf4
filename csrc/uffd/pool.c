/* SPDX-License-Identifier: MIT */
/*
 * Reader pools: the threads that read one uffd's fault messages and resolve
 * them. How they wait is the experiment:
 *
 *   poll            poll(2) on the shared uffd. Every waiting reader wakes for
 *                   every fault, one reads it, the rest read nothing (EAGAIN):
 *                   the thundering herd, counted as spurious wakeups.
 *   epoll           each reader its own epoll set, plain EPOLLIN: the same herd.
 *   epoll_exclusive each reader its own epoll set with EPOLLIN|EPOLLEXCLUSIVE on
 *                   the uffd, so a fault wakes one of them.
 *   read            a blocking read(2). The uffd's read waiters sit on the same
 *                   wait queue as poll's, added non-exclusively (fs/userfaultfd.c
 *                   userfaultfd_ctx_read), so every fault wakes them all: the
 *                   losers find the queue empty in the kernel and sleep again
 *                   without returning, a herd that only context_switches shows.
 *   io_uring        a ring per reader (ring.c) keeps a read of the uffd in flight;
 *                   the kernel parks it on the same wait queue, non-exclusively:
 *                   the same in-kernel herd as read's.
 *
 * Every reader also waits on the pool's stop eventfd (read mode: it is kicked
 * with a signal instead); stopping waits for it until a deadline, never
 * longer. Each keeps its counters in its own cache line and they survive
 * every exit path, errors included.
 *
 * UFFDIO_COPY's data goes in with the copy, fetched from the page source
 * (source.h: the synthetic stamp, or a snapshot file) through the
 * resolver's own conn: each reader has a buffer of its own for pages up
 * to 2 MiB, and 1 GiB pages share one per uffd under a lock (struct
 * ukvm_shared_buffer in pool.h says why).
 *
 * resolve move (UFFDIO_MOVE, Linux 6.8+): the page a fault gets is one the
 * reader has received into a buffer of its own, then moved into place
 * without a copy. The kernel takes the page out of the buffer (it is a
 * hole there afterwards) and accepts only private anonymous pages that are
 * present and not shared with another process (EBUSY: a fork's copy-on-
 * write page). So each reader stages pages in a private anonymous area
 * (MADV_DONTFORK: a fork of this process leaves its pages exclusive),
 * MOVE_STAGE_BYTES of 4 KiB pages or one 2 MiB page (anonymous_thp,
 * 2 MiB aligned, MADV_HUGEPAGE, so that a whole huge page moves at once),
 * takes the next page per fault, fetches its bytes into it and moves it,
 * and refills the area once it is used up: one MADV_POPULATE_WRITE faults
 * all its pages in again, and for the synthetic source the template is
 * written over them (what receiving them would cost), on the fault that
 * finds it used up (every 64th of 4 KiB, every
 * 2 MiB one). The template goes in before the move like a copy's data: the
 * page is whole when it appears. A 2 MiB page that the kernel gave the
 * area as a huge page moves whole (one PMD), and stays a huge mapping.
 *
 * In uffd_mode wp a fault is a first write: the old page goes into the snapshot, then
 * UFFDIO_WRITEPROTECT un-protects it (reader_unprotect).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/ctl.h"
#include "base/errors.h"
#include "base/hist.h"
#include "base/kick.h"
#include "base/thread.h"
#include "base/util.h"
#include "uapi_compat.h"
#include "uffd/pool.h"
#include "uffd/resident.h"
#include "uffd/ring.h"
#include "uffd/uffd.h"

#define READER_STACK_BYTES	(512ULL << 10)
#define EV_UFFD			0
#define EV_STOP			1
/* A leaving io_uring reader waits this long at most for its ring to let go of the uffd. */
#define RING_CANCEL_NS		(100 * NSEC_PER_MSEC)
/* resolve move: a reader's staging area for 4 KiB pages (64 pages, refilled in one call). */
#define MOVE_STAGE_BYTES	(256ULL << 10)
/* Resolver vCPU: the longest wait for another thread's copy of a unit to reach a page. */
#define RESOLVER_UNIT_WAIT_NS	(10ULL * NSEC_PER_SEC)

static const char *resolve_name(const struct ukvm_pool *pool)
{
	if (pool->mode == UKVM_UFFD_MINOR)
		return "UFFDIO_CONTINUE";
	if (pool->resolve == UKVM_RESOLVE_MOVE)
		return "UFFDIO_MOVE";
	if (pool->mode == UKVM_UFFD_WP)
		return "UFFDIO_WRITEPROTECT";
	return pool->resolve == UKVM_RESOLVE_ZEROPAGE ? "UFFDIO_ZEROPAGE" : "UFFDIO_COPY";
}

static uint64_t reader_delay_ns(struct ukvm_reader *r)
{
	struct ukvm_pool *pool = r->pool;
	double u;

	switch (pool->delay_dist) {
	case UKVM_DELAY_UNIFORM:
		return (uint64_t)(ukvm_random_unit(&r->rng) * 2.0 * (double)pool->delay_ns);
	case UKVM_DELAY_EXPONENTIAL:
		u = ukvm_random_unit(&r->rng);
		return (uint64_t)(-log1p(-u) * (double)pool->delay_ns);
	default:
		return pool->delay_ns;
	}
}

/*
 * The bytes of the page at addr (guest physical gpa) from the page source
 * into dst; urgent: a fault waits for it (else readahead). 0, or -errno
 * after recording the failure as the run's.
 */
static int reader_fetch_len(struct ukvm_reader *r, uint64_t addr, uint64_t len, uint64_t gpa,
			    uint8_t *dst, bool urgent)
{
	struct ukvm_pool *pool = r->pool;
	uint64_t off = pool->region_off + (addr - pool->hva_base);
	int ret;

	ret = ukvm_source_fetch(&r->conn, off, len, gpa, dst, urgent);
	/* Cancelled: the run is stopping (its end, or another thread's failure). */
	if (ret && ret != -ECANCELED && !ukvm_ctl_aborted(pool->ctl))
		ukvm_ctl_fail(pool->ctl, UKVM_ERR_RUN, -ret,
			      "%s: fetching %llu bytes at offset %llu of %s %s: %s", r->who,
			      (unsigned long long)len, (unsigned long long)off,
			      pool->source->kind == UKVM_SOURCE_REMOTE ? "the page server at" :
			      "source_path", pool->source->kind == UKVM_SOURCE_REMOTE ?
			      pool->source->address : pool->source->path,
			      ukvm_source_strerror(pool->source, ret));
	return ret;
}

static int reader_fetch(struct ukvm_reader *r, uint64_t addr, uint64_t gpa, uint8_t *dst,
			bool urgent)
{
	return reader_fetch_len(r, addr, r->pool->page_size, gpa, dst, urgent);
}

/* UFFDIO_COPY of the page at addr with its data: 0, -EEXIST (resolved already) or -errno. */
static int reader_copy(struct ukvm_reader *r, uint64_t addr, uint64_t gpa)
{
	struct ukvm_pool *pool = r->pool;
	struct ukvm_shared_buffer *shared = &pool->shared;
	int ret;

	/* Up to 2 MiB pages: the reader's own buffer (struct ukvm_shared_buffer). */
	if (r->src) {
		ret = reader_fetch(r, addr, gpa, r->src, true);
		return ret ?: ukvm_uffd_copy(pool->uffd, addr, r->src, pool->page_size);
	}
	pthread_mutex_lock(&shared->lock);
	ret = reader_fetch(r, addr, gpa, shared->buffer, true);
	ret = ret ?: ukvm_uffd_copy(pool->uffd, addr, shared->buffer, pool->page_size);
	pthread_mutex_unlock(&shared->lock);
	return ret;
}

/* resolve move: every page of the staging area present again, holding the template. */
static void stage_refill(struct ukvm_reader *r)
{
	uint64_t len = (uint64_t)r->stage_pages * r->pool->page_size;

	/* Best effort (Linux 5.14+): without it, the template's writes fault the pages in. */
	madvise(r->stage, len, MADV_POPULATE_WRITE);
	ukvm_source_prepare(r->pool->source, r->stage, len);
	r->stage_next = 0;
}

/*
 * resolve move: the reader's staging area, page-aligned to the pool's page
 * size (a 2 MiB page moves whole only from a 2 MiB aligned huge page), and
 * filled.
 */
static int stage_create(struct ukvm_reader *r, struct ukvm_error *err)
{
	struct ukvm_pool *pool = r->pool;
	uint64_t page = pool->page_size;
	uint64_t pages = page < MOVE_STAGE_BYTES ? MOVE_STAGE_BYTES / page : 1;
	uint64_t len = pages * page, slack = page > UKVM_PAGE_SIZE ? page : 0;
	uint8_t *p, *aligned;

	p = mmap(NULL, len + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		ukvm_err_set(err, UKVM_ERR_RUN, errno, "%s: mmap(staging area for UFFDIO_MOVE, "
			     "%llu bytes)", r->who, (unsigned long long)(len + slack));
		return -ENOMEM;
	}
	aligned = (uint8_t *)(uintptr_t)ALIGN_UP((uintptr_t)p, page);
	if (aligned > p)
		munmap(p, (size_t)(aligned - p));
	if (p + len + slack > aligned + len)
		munmap(aligned + len, (size_t)(p + len + slack - (aligned + len)));
	r->stage = aligned;
	r->stage_pages = (uint32_t)pages;
	/* Huge pages where the pool's are huge (best effort: 4 KiB pages move too, one by one). */
	madvise(aligned, len, page > UKVM_PAGE_SIZE ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
	if (madvise(aligned, len, MADV_DONTFORK)) {
		ukvm_err_set(err, UKVM_ERR_RUN, errno, "%s: madvise(staging area, MADV_DONTFORK)",
			     r->who);
		return -EINVAL;
	}
	stage_refill(r);
	return 0;
}

/*
 * resolve move: the next staged page, fetched into, moved to addr. 0, -EEXIST
 * (resolved already) or -errno. A 4 KiB page that met EEXIST is still
 * there and serves the next fault; a larger one may have moved in part,
 * so it counts as used.
 */
static int reader_move(struct ukvm_reader *r, uint64_t addr, uint64_t gpa)
{
	uint64_t page = r->pool->page_size;
	uint8_t *src;
	int ret;

	if (r->stage_next == r->stage_pages)
		stage_refill(r);
	src = r->stage + (uint64_t)r->stage_next * page;
	ret = reader_fetch(r, addr, gpa, src, true);
	if (ret)
		return ret;
	ret = ukvm_uffd_move(r->pool->uffd, addr, src, page);
	if (!ret || (ret == -EEXIST && page > UKVM_PAGE_SIZE))
		r->stage_next++;
	return ret;
}

enum { WP_UNSAVED = 0, WP_SAVING, WP_SAVED };

/*
 * uffd_mode wp: the page at addr (offset off in the pool's range) is about
 * to be written for the first time. The first message for it saves its old
 * contents into the snapshot, then un-protects it (which wakes every thread
 * waiting on it); a later one (another vCPU wrote it meanwhile) waits for
 * that save to be complete before it un-protects too, and is counted as
 * EEXIST. 0, -EEXIST, or -errno.
 */
static int reader_unprotect(struct ukvm_reader *r, uint64_t addr, uint64_t off)
{
	struct ukvm_pool *pool = r->pool;
	_Atomic uint8_t *state = &pool->wp_state[off / UKVM_PAGE_SIZE];
	uint8_t seen = WP_UNSAVED;
	int ret;

	if (atomic_compare_exchange_strong(state, &seen, WP_SAVING)) {
#ifdef UKVM_TEST_HOOKS
		/* The save broken on purpose: the snapshot must then fail verification. */
		if (pool->ctl->inject != UKVM_INJECT_WP_NO_SAVE)
#endif
			memcpy(pool->snapshot + off, (const void *)(uintptr_t)addr,
			       pool->page_size);
		atomic_store_explicit(state, WP_SAVED, memory_order_release);
		return ukvm_uffd_writeprotect(pool->uffd, addr, pool->page_size, false);
	}
	/* Saving elsewhere: a 4 KiB copy, so wait, but not past the run's end. */
	while (atomic_load_explicit(state, memory_order_acquire) != WP_SAVED) {
		if (ukvm_ctl_aborted(pool->ctl))
			return -ECANCELED;
		sched_yield();
	}
	ret = ukvm_uffd_writeprotect(pool->uffd, addr, pool->page_size, false);
	return ret ?: -EEXIST;
}

/* Empty, destroyable state. */
static void shared_init(struct ukvm_shared_buffer *src)
{
	memset(src, 0, sizeof(*src));
}

/* A shared mapping of a memfd called name: named in /proc/PID/maps. */
static uint8_t *shared_map(const char *name, uint64_t size, struct ukvm_error *err)
{
	uint8_t *p;
	int fd, e;

	fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0) {
		e = errno;
		ukvm_err_set(err, UKVM_ERR_HOST, e, "memfd_create(%s)", name);
		return NULL;
	}
	if (ftruncate(fd, (off_t)size)) {
		e = errno;
		close(fd);
		ukvm_err_set(err, UKVM_ERR_HOST, e, "ftruncate(%s, %llu)", name,
			     (unsigned long long)size);
		return NULL;
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	e = errno;
	close(fd);	/* the mapping keeps the memory */
	if (p == MAP_FAILED) {
		ukvm_err_set(err, UKVM_ERR_HOST, e, "mmap(%s, %llu bytes)", name,
			     (unsigned long long)size);
		return NULL;
	}
	return p;
}

/* The shared buffer of page_size bytes, prepared for source, and its lock. */
static int shared_create(struct ukvm_shared_buffer *src, uint64_t page_size,
			 const struct ukvm_source *source, struct ukvm_error *err)
{
	int ret;

	shared_init(src);
	src->page_size = page_size;
	ret = pthread_mutex_init(&src->lock, NULL);
	if (ret) {
		ukvm_err_set(err, UKVM_ERR_RUN, ret, "pthread_mutex_init(source)");
		return -ret;
	}
	src->lock_made = true;
	src->buffer = shared_map("uffdkvm-source", page_size, err);
	if (!src->buffer)
		return -ENOMEM;
	ukvm_source_prepare(source, src->buffer, page_size);
	return 0;
}

static void shared_destroy(struct ukvm_shared_buffer *src)
{
	if (src->buffer)
		munmap(src->buffer, src->page_size);
	if (src->lock_made)
		pthread_mutex_destroy(&src->lock);
	shared_init(src);
}

/* Stats full: remembers one fault for faultlog.c (vcpu holds the thread id for now). */
static int reader_record(struct ukvm_reader *r, uint64_t start, uint64_t end, uint64_t gpa,
			 int32_t tid, bool eexist, bool write)
{
	struct ukvm_pool *pool = r->pool;
	struct ukvm_fault_record *rec;

	if (r->rec_next == r->rec_end) {
		uint64_t chunk = atomic_fetch_add_explicit(&pool->log_chunks, 1,
							   memory_order_relaxed);

		if ((chunk + 1) * UKVM_LOG_CHUNK > pool->log_cap) {
			ukvm_ctl_fail(pool->ctl, UKVM_ERR_RUN, ENOSPC,
				      "%s: the fault log is full (%llu records: "
				      "far more fault messages than pages)", r->who,
				      (unsigned long long)pool->log_cap);
			return -ENOSPC;
		}
		r->rec_next = pool->log + chunk * UKVM_LOG_CHUNK;
		r->rec_end = r->rec_next + UKVM_LOG_CHUNK;
	}
	rec = r->rec_next++;
	rec->raised_ns = 0;	/* guest_timing: from the guest's stamps, after the run */
	rec->read_ns = start;
	rec->resolved_ns = end;
	rec->resumed_ns = 0;
	rec->gpa = gpa;
	rec->vcpu = tid;
	rec->uffd = (uint16_t)r->pool->uffd_index;
	rec->reader = (uint16_t)r->index;
	rec->eexist = eexist;
	rec->write = write;
	return 0;
}

/* The resident map's number (resident.h) of the pool's page at addr. */
static uint64_t pool_page(const struct ukvm_pool *pool, uint64_t addr)
{
	return pool->resident_first + (addr - pool->hva_base) / pool->page_size;
}

/*
 * Prefetch: the page at addr with its data from the page source (not
 * urgent: no fault waits for it), without waking anyone
 * (UFFDIO_COPY_MODE_DONTWAKE): 0, -EEXIST, -EIO (a failed fetch, already
 * recorded as the run's) or -errno. The reader's own buffer, or the uffd's
 * shared one under its lock.
 */
static int reader_prefetch_copy(struct ukvm_reader *r, uint64_t addr, uint64_t gpa)
{
	struct ukvm_pool *pool = r->pool;
	struct ukvm_shared_buffer *shared = &pool->shared;
	uint8_t *buf = r->src ? r->src : shared->buffer;
	int ret;

	if (!r->src)
		pthread_mutex_lock(&shared->lock);
	ret = reader_fetch(r, addr, gpa, buf, false);
	if (!ret)
		ret = ukvm_uffd_copy_dontwake(pool->uffd, addr, buf, pool->page_size);
	else if (ret != -ECANCELED)
		ret = -EIO;	/* recorded as the run's failure by reader_fetch() */
	if (!r->src)
		pthread_mutex_unlock(&shared->lock);
	return ret;
}

static bool reader_stopping(struct ukvm_reader *r);

/*
 * A readahead copy's outcome for the page at addr: counted (installed, or
 * EEXIST: a fault got it first), 0; or -errno after recording the failure
 * as the run's.
 */
static int reader_readahead_done(struct ukvm_reader *r, uint64_t addr, int ret)
{
	struct ukvm_pool *pool = r->pool;
	uint64_t page = pool_page(pool, addr);

	if (!ret) {
		ukvm_resident_mark(pool->resident, page, UKVM_PAGE_PREFETCHED);
		r->stats.prefetched++;
		return 0;
	}
	if (ret == -EEXIST) {
		r->stats.prefetch_eexist++;
		return 0;
	}
	if (ukvm_ctl_aborted(pool->ctl))
		return ret;
	ukvm_ctl_fail(pool->ctl, UKVM_ERR_RUN, -ret,
		      "%s: readahead UFFDIO_COPY(MODE_DONTWAKE, %llu bytes at gpa 0x%llx)",
		      r->who, (unsigned long long)pool->page_size,
		      (unsigned long long)(pool->gpa_base + (addr - pool->hva_base)));
	return ret;
}

/*
 * Readahead of the run of pages pages from addr, absent when asked for, in
 * one fetch into the reader's readahead buffer (one request to a page
 * server: one round trip, not one per page), then a DONTWAKE copy per page
 * not resident by then (a fault on it may have won meanwhile: EEXIST,
 * counted). 0, -ECANCELED (stopping) or -errno after recording the
 * failure as the run's.
 */
static int reader_readahead_run(struct ukvm_reader *r, uint64_t addr, uint32_t pages)
{
	struct ukvm_pool *pool = r->pool;
	uint64_t ps = pool->page_size, page, a;
	uint32_t k;
	int ret;

	ret = reader_fetch_len(r, addr, pages * ps, pool->gpa_base + (addr - pool->hva_base),
			       r->ra, false);
	if (ret)
		return ret == -ECANCELED ? ret : -EIO;	/* a failure: recorded */
	for (k = 0, a = addr; k < pages; k++, a += ps) {
		page = pool_page(pool, a);
		ret = !ukvm_resident_absent(pool->resident, page) ? -EEXIST :
		      ukvm_uffd_copy_dontwake(pool->uffd, a, r->ra + k * ps, ps);
		ret = reader_readahead_done(r, a, ret);
		if (ret)
			return ret;
	}
	return 0;
}

/*
 * Prefetch readahead, after the fault at addr was resolved (and its vCPU
 * woken): the next prefetch_pages pages of this uffd's range that are not
 * resident yet, each run of them in a row fetched at once (up to the
 * readahead buffer's ra_pages; without one, a page at a time). One that a
 * fault got first is EEXIST, counted. 0, or -errno after recording the
 * failure as the run's.
 */
static int reader_readahead(struct ukvm_reader *r, uint64_t addr)
{
	struct ukvm_pool *pool = r->pool;
	uint64_t ps = pool->page_size, end = pool->hva_base + pool->region_size, a, page;
	uint32_t k, max = r->ra ? r->ra_pages : 1;
	int ret;

	if (end - addr > ((uint64_t)pool->prefetch_pages + 1) * ps)
		end = addr + ((uint64_t)pool->prefetch_pages + 1) * ps;
	for (a = addr + ps; a < end; a += (uint64_t)k * ps) {
		if (reader_stopping(r))
			return 0;
		page = pool_page(pool, a);
		k = 1;
		if (!ukvm_resident_absent(pool->resident, page))
			continue;
		while (k < max && a + (uint64_t)k * ps < end &&
		       ukvm_resident_absent(pool->resident, page + k))
			k++;
		if (r->ra) {
			ret = reader_readahead_run(r, a, k);
		} else {
			/* A failed fetch, recorded, aborted the run: done() adds nothing. */
			ret = reader_prefetch_copy(r, a, pool->gpa_base + (a - pool->hva_base));
			if (ret != -ECANCELED)
				ret = reader_readahead_done(r, a, ret);
		}
		if (ret == -ECANCELED)
			return 0;	/* stopping: the pages ahead can wait */
		if (ret)
			return ret;
	}
	return 0;
}

/*
 * The page at addr was there already (EEXIST), and the ioctl that failed
 * woke nobody: the vCPU of this message may be asleep on it, so wake it, as
 * KVM's demand_paging_test does. A prefetched page came without any wake;
 * and the wake of the ioctl that put the page there does not cover every
 * waiter either: in Debian's 6.1 under nested kvm_amd, with overlap and 24
 * readers, a vCPU slept on forever in handle_userfault() with its message
 * read (fdinfo pending 0, total 1) and EEXIST, its page resolved for
 * another vCPU before that read, until a UFFDIO_WAKE. A huge unit is woken
 * only with prefetch: another reader's copy of it may be half done, and its
 * own wake when whole is what the waiter needs (woken earlier, it faults
 * again on a 4 KiB page not yet in). A vCPU that resolves its own faults
 * never sleeps on one.
 */
static int reader_wake(struct ukvm_reader *r, uint64_t addr)
{
	struct ukvm_pool *pool = r->pool;
	int ret;

	if (pool->resolver == UKVM_RESOLVER_VCPU ||
	    (pool->prefetch == UKVM_PREFETCH_NONE && pool->page_size > UKVM_PAGE_SIZE))
		return 0;
	ret = ukvm_uffd_wake(pool->uffd, addr, pool->page_size);
	if (!ret) {
		r->stats.wakes++;
		return 0;
	}
	if (ukvm_ctl_aborted(pool->ctl))
		return ret;
	ukvm_ctl_fail(pool->ctl, UKVM_ERR_RUN, -ret, "%s: UFFDIO_WAKE(%llu bytes at gpa 0x%llx)",
		      r->who, (unsigned long long)pool->page_size,
		      (unsigned long long)(pool->gpa_base + (addr - pool->hva_base)));
	return ret;
}

/*
 * Resolves one fault message: 0, or -errno after recording the failure as
 * the run's (an injected READER_EXIT records nothing: the reader just goes).
 */
static int reader_resolve(struct ukvm_reader *r, const struct uffd_msg *msg, uint64_t t_read)
{
	struct ukvm_pool *pool = r->pool;
	uint64_t fault, addr, gpa;
	int ret;

	if (msg->event != UFFD_EVENT_PAGEFAULT) {
		ukvm_ctl_fail(pool->ctl, UKVM_ERR_RUN, 0,
			      "%s: unexpected uffd event 0x%x", r->who, msg->event);
		return -EPROTO;
	}
	fault = msg->arg.pagefault.address & ~(UKVM_PAGE_SIZE - 1);	/* what the vCPU touched */
	addr = msg->arg.pagefault.address & ~(pool->page_size - 1);	/* what gets resolved */
	if (addr < pool->hva_base || addr >= pool->hva_base + pool->region_size) {
		ukvm_ctl_fail(pool->ctl, UKVM_ERR_RUN, 0,
			      "%s: fault at 0x%llx, outside the region this uffd "
			      "registered", r->who, (unsigned long long)msg->arg.pagefault.address);
		return -EFAULT;
	}
	gpa = pool->gpa_base + (addr - pool->hva_base);

	if (pool->delay_ns)
		ukvm_sleep_ns(reader_delay_ns(r));

#ifdef UKVM_TEST_HOOKS
	if (ukvm_ctl_inject(pool->ctl, UKVM_INJECT_READER_EXIT))
		return -ECANCELED;	/* gone without a word: the fault stays unresolved */
	if (ukvm_ctl_inject(pool->ctl, UKVM_INJECT_RESOLVE_EIO)) {
		ukvm_ctl_fail(pool->ctl, UKVM_ERR_RUN, EIO,
			      "%s: %s(%llu bytes at gpa 0x%llx) (injected)",
			      r->who, resolve_name(pool),
			      (unsigned long long)pool->page_size, (unsigned long long)gpa);
		return -EIO;
	}
#endif

	if (pool->mode == UKVM_UFFD_WP) {
		if (!pool->snapshot) {	/* wp_async: the kernel resolves every write itself */
			ukvm_ctl_fail(pool->ctl, UKVM_ERR_RUN, 0,
				      "%s: a fault message at gpa 0x%llx with wp_async, which "
				      "delivers none", r->who, (unsigned long long)gpa);
			return -EPROTO;
		}
		if (!(msg->arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP)) {
			ukvm_ctl_fail(pool->ctl, UKVM_ERR_RUN, 0,
				      "%s: a fault at gpa 0x%llx without UFFD_PAGEFAULT_FLAG_WP "
				      "(flags 0x%llx) on a range registered for WP only", r->who,
				      (unsigned long long)gpa,
				      (unsigned long long)msg->arg.pagefault.flags);
			return -EPROTO;
		}
		ret = reader_unprotect(r, addr, addr - pool->hva_base);
		if (ret == -ECANCELED)
			return ret;	/* the run is over: nothing to record */
		r->stats.unprotects++;
	} else if (pool->mode == UKVM_UFFD_MINOR) {
		ret = ukvm_uffd_continue(pool->uffd, addr, pool->page_size);
		r->stats.continues++;
	} else if (pool->resolve == UKVM_RESOLVE_ZEROPAGE) {
		ret = ukvm_uffd_zeropage(pool->uffd, addr, pool->page_size);
		r->stats.zeropages++;
	} else if (pool->resolve == UKVM_RESOLVE_MOVE) {
		ret = reader_move(r, addr, gpa);
		r->stats.moves++;
	} else if (pool->prefetch != UKVM_PREFETCH_NONE &&
		   !ukvm_resident_absent(pool->resident, pool_page(pool, addr))) {
		/* Prefetch installed it already: no fetch, no copy, only the wake below. */
		ret = -EEXIST;
	} else {
		ret = reader_copy(r, addr, gpa);
		if (ret == -ECANCELED)
			return ret;	/* a fetch given up on the stop: the run is over */
		r->stats.copies++;
	}
	if (ret < 0 && ret != -EEXIST) {
		ukvm_ctl_fail(pool->ctl, UKVM_ERR_RUN, -ret,
			      "%s: %s(%llu bytes at gpa 0x%llx)", r->who,
			      resolve_name(pool),
			      (unsigned long long)pool->page_size, (unsigned long long)gpa);
		return ret;
	}
	if (ret == -EEXIST)
		r->stats.eexist++;
	else
		r->stats.faults++;
	if (pool->resident) {
		uint64_t page = pool_page(pool, addr);

		ukvm_resident_waited(pool->resident, page);
		if (!ret)
			ukvm_resident_mark(pool->resident, page, UKVM_PAGE_FAULTED);
	}
	if (ret == -EEXIST && reader_wake(r, addr))
		return -EIO;
	if (pool->full_stats) {
		uint64_t t_done = ukvm_now_ns();
		int logged;

		r->stats.busy_ns += t_done - t_read;
		ukvm_hist_add(&r->stats.service_latency, t_done - t_read);
		logged = reader_record(r, t_read, t_done, pool->gpa_base + (fault - pool->hva_base),
				       (int32_t)msg->arg.pagefault.feat.ptid, ret == -EEXIST,
				       msg->arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WRITE);
		if (logged)
			return logged;
	}
	/* After the fault's own timing: its vCPU runs on meanwhile. */
	if (!ret && pool->prefetch == UKVM_PREFETCH_READAHEAD)
		return reader_readahead(r, addr) ? -EIO : 0;
	return 0;
}

/* The time a message was read; stats basic reads no clocks at all. */
static uint64_t reader_clock(struct ukvm_reader *r)
{
	return r->pool->full_stats ? ukvm_now_ns() : 0;
}

void ukvm_pool_bind_vcpu(struct ukvm_reader *r, uint32_t vcpu)
{
	r->vcpu = (int32_t)vcpu;
	snprintf(r->who, sizeof(r->who), "vCPU %u, resolving on uffd %u", vcpu,
		 r->pool->uffd_index);
}

/*
 * Resolver vCPU, missing units above 4 KiB: waits until the 4 KiB page at
 * addr is mapped. A unit of anonymous memory (anonymous_thp) goes in 4 KiB
 * at a time, so a copy that met another thread's copy of the same unit
 * half done (a prefetch, or another vCPU with overlap) returns EEXIST
 * before the page this vCPU touches is there; its next access (the MMIO
 * completion's memcpy, KVM's retry) must not come first: on a uffd opened
 * with SIGBUS it would raise SIGBUS. 0, -ECANCELED (the run is over), or
 * -ETIMEDOUT after RESOLVER_UNIT_WAIT_NS (the other copy is one ioctl).
 */
static int resolver_wait_mapped(struct ukvm_reader *r, uint64_t addr)
{
	uint64_t start = ukvm_now_ns();
	unsigned char vec = 0;

	for (;;) {
		if (mincore((void *)(uintptr_t)addr, UKVM_PAGE_SIZE, &vec))
			return 0;	/* cannot tell: the access will */
		if (vec & 1)
			return 0;
		if (ukvm_ctl_aborted(r->pool->ctl))
			return -ECANCELED;
		if (ukvm_now_ns() - start > RESOLVER_UNIT_WAIT_NS) {
			ukvm_ctl_fail(r->pool->ctl, UKVM_ERR_RUN, ETIMEDOUT,
				      "%s: the page at 0x%llx was still missing %.1f s after "
				      "another thread's copy of its unit began", r->who,
				      (unsigned long long)addr,
				      (double)RESOLVER_UNIT_WAIT_NS / NSEC_PER_SEC);
			return -ETIMEDOUT;
		}
		sched_yield();
	}
}

int ukvm_pool_resolve_fault(void *resolver, uint64_t gpa, bool write, uint8_t **hva)
{
	struct ukvm_reader *r = resolver;
	struct ukvm_pool *pool = r->pool;
	struct uffd_msg msg;
	uint64_t addr, eexist;
	int ret;

	if (gpa < pool->gpa_base || gpa >= pool->gpa_base + pool->region_size)
		return -ENOENT;
	addr = pool->hva_base + (gpa - pool->gpa_base);
	if (!r->stats.tid) {
		/* This vCPU thread's first fault: it resolves as a reader would. */
		r->stats.tid = (int32_t)gettid();
		ukvm_uffd_thread_init(pool->ctl, r->who);
	}
	/* What the uffd would have queued, had it not been opened with SIGBUS. */
	memset(&msg, 0, sizeof(msg));
	msg.event = UFFD_EVENT_PAGEFAULT;
	msg.arg.pagefault.address = addr;
	msg.arg.pagefault.flags = write ? UFFD_PAGEFAULT_FLAG_WRITE : 0;
	if (pool->mode == UKVM_UFFD_WP)	/* only writes fault on a WP-only range */
		msg.arg.pagefault.flags |= UFFD_PAGEFAULT_FLAG_WP | UFFD_PAGEFAULT_FLAG_WRITE;
	msg.arg.pagefault.feat.ptid = (uint32_t)r->stats.tid;
	eexist = r->stats.eexist;
	ret = reader_resolve(r, &msg, reader_clock(r));
	if (ret == -ECANCELED)	/* an injected READER_EXIT: a vCPU cannot just go */
		ukvm_ctl_fail(pool->ctl, UKVM_ERR_RUN, ECANCELED,
			      "%s: left its fault unresolved (injected)", r->who);
	/* Its own copy put the whole unit in; only another's (EEXIST) may be half done. */
	if (!ret && r->stats.eexist != eexist && pool->mode == UKVM_UFFD_MISSING &&
	    pool->page_size > UKVM_PAGE_SIZE)
		ret = resolver_wait_mapped(r, addr & ~(UKVM_PAGE_SIZE - 1));
	if (ret)
		return ret;
	*hva = (uint8_t *)(uintptr_t)addr;
	return 0;
}

static bool reader_stopping(struct ukvm_reader *r)
{
	return atomic_load_explicit(&r->pool->stop, memory_order_relaxed);
}

/* Why a read is made, which decides what an empty uffd (EAGAIN) counts as. */
enum reader_read_kind {
	READ_WOKEN,	/* the first after a wakeup: empty is a spurious wakeup */
	READ_DRAIN,	/* after a full batch: empty is read_sizes[0] */
	READ_SPIN,	/* a spinner's poll: empty is nothing worth counting */
};

/*
 * What one read of the uffd brought, n bytes of messages or -errno (call
 * names the read: read(2) or the ring's), counted and each message
 * resolved in turn: the number of messages (0: nothing read: EAGAIN, or
 * EINTR for a kick), or -errno: leave (the failure is recorded as the
 * run's, and the rest of the batch, already taken from the uffd, stays
 * unresolved: the run ends, and closing the uffd wakes its vCPUs). Every
 * message of a batch is stamped read when the read returned, so a later
 * one's service includes its wait behind the ones before it. Every wait
 * mode's reads come through here, so they count alike.
 */
static int reader_take(struct ukvm_reader *r, const struct uffd_msg *msgs, ssize_t n,
		       enum reader_read_kind kind, const char *call)
{
	struct ukvm_pool *pool = r->pool;
	uint64_t t_read;
	int i, count, ret;

	if (n < 0) {
		if (n == -EAGAIN) {
			if (kind == READ_WOKEN)
				r->stats.spurious_wakeups++;
			else if (kind == READ_DRAIN)
				r->stats.read_sizes[0]++;
			return 0;
		}
		if (n == -EINTR)
			return 0;
		ukvm_ctl_fail(pool->ctl, UKVM_ERR_RUN, (int)-n, "reader %u of uffd %u: %s",
			      r->index, pool->uffd_index, call);
		return (int)n;
	}
	if (n == 0 || n % sizeof(msgs[0]) || (size_t)n > pool->read_batch * sizeof(msgs[0])) {
		ukvm_ctl_fail(pool->ctl, UKVM_ERR_RUN, 0,
			      "reader %u of uffd %u: %s returned %zd bytes, not a multiple "
			      "of %zu up to %u messages", r->index, pool->uffd_index, call, n,
			      sizeof(msgs[0]), pool->read_batch);
		return -EPROTO;
	}
	t_read = reader_clock(r);
	count = (int)(n / sizeof(msgs[0]));
	r->stats.reads++;
	r->stats.read_sizes[count]++;
	for (i = 0; i < count; i++) {
		/* Stopping: the run is over, or failed and its uffds will be closed. */
		if (i && reader_stopping(r))
			break;
		ret = reader_resolve(r, &msgs[i], t_read);
		if (ret)
			return ret;
	}
	return count;
}

/* One read(2) of up to read_batch messages, through reader_take(). */
static int reader_read(struct ukvm_reader *r, enum reader_read_kind kind)
{
	struct uffd_msg msgs[UKVM_MAX_READ_BATCH];
	ssize_t n;

	n = read(r->pool->uffd, msgs, r->pool->read_batch * sizeof(msgs[0]));
	return reader_take(r, msgs, n < 0 ? -errno : n, kind, "read(uffd)");
}

/*
 * After a wakeup: one read, and while reads come back full (read_batch
 * messages, so more may be queued) more, UKVM_READS_PER_WAKEUP in all at
 * most. A read that comes back short emptied the queue (the kernel returns
 * all it has), and messages that arrive later wake a reader. 0, or -errno.
 */
static int reader_serve(struct ukvm_reader *r)
{
	uint32_t batch = r->pool->read_batch;
	int reads, ret;

	for (reads = 0; reads < UKVM_READS_PER_WAKEUP; reads++) {
		ret = reader_read(r, reads ? READ_DRAIN : READ_WOKEN);
		if (ret <= 0)
			return ret;
		if (batch == 1 || (uint32_t)ret < batch || reader_stopping(r))
			return 0;
	}
	return 0;
}

static void reader_loop_poll(struct ukvm_reader *r)
{
	struct ukvm_pool *pool = r->pool;

	while (!reader_stopping(r)) {
		struct pollfd fds[2] = {
			{ .fd = pool->uffd, .events = POLLIN },
			{ .fd = pool->stop_fd, .events = POLLIN },
		};

		if (poll(fds, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			ukvm_ctl_fail(pool->ctl, UKVM_ERR_RUN, errno, "reader %u of uffd %u: poll",
				      r->index, pool->uffd_index);
			return;
		}
		if (fds[1].revents)
			return;
		r->stats.wakeups++;
		if (fds[0].revents & (POLLERR | POLLHUP | POLLNVAL)) {
			ukvm_ctl_fail(pool->ctl, UKVM_ERR_RUN, 0,
				      "reader %u of uffd %u: poll reported 0x%x on the uffd",
				      r->index, pool->uffd_index, fds[0].revents);
			return;
		}
		if (reader_serve(r) < 0)
			return;
	}
}

static void reader_loop_epoll(struct ukvm_reader *r)
{
	struct ukvm_pool *pool = r->pool;

	while (!reader_stopping(r)) {
		struct epoll_event evs[2];
		bool fault = false;
		int n, i;

		n = epoll_wait(r->epfd, evs, 2, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			ukvm_ctl_fail(pool->ctl, UKVM_ERR_RUN, errno,
				      "reader %u of uffd %u: epoll_wait", r->index, pool->uffd_index);
			return;
		}
		for (i = 0; i < n; i++) {
			if (evs[i].data.u32 == EV_STOP)
				return;
			if (evs[i].events & (EPOLLERR | EPOLLHUP)) {
				ukvm_ctl_fail(pool->ctl, UKVM_ERR_RUN, 0,
					      "reader %u of uffd %u: epoll reported 0x%x on the uffd",
					      r->index, pool->uffd_index, evs[i].events);
				return;
			}
			fault = true;
		}
		if (!fault)
			continue;
		r->stats.wakeups++;
		if (reader_serve(r) < 0)
			return;
	}
}

/* The uffd is blocking here: a read returns a message, or EINTR for a kick. */
static void reader_loop_read(struct ukvm_reader *r)
{
	int ret;

	while (!reader_stopping(r)) {
		ret = reader_read(r, READ_WOKEN);
		if (ret < 0)
			return;
		r->stats.wakeups += ret > 0;	/* a blocking read that returned messages */
	}
}

/*
 * The uffd is non-blocking here, and the reader never sleeps: it reads, and
 * with nothing there pauses the CPU for a moment and reads again. Meant for
 * readers with a CPU of their own (the latency floor: no wakeup at all); a
 * "wakeup" is a read that found messages after reads that found none.
 */
static void reader_loop_spin(struct ukvm_reader *r)
{
	bool idle = true;
	int ret;

	while (!reader_stopping(r)) {
		ret = reader_read(r, READ_SPIN);
		if (ret < 0)
			return;
		if (ret == 0) {
			__builtin_ia32_pause();
			idle = true;
			continue;
		}
		r->stats.wakeups += idle;
		idle = false;
	}
}

/*
 * io_uring (ring.c): the reader's own ring keeps one read of the uffd in
 * flight and a poll of the stop eventfd, and the reader sleeps in the ring
 * until one completes; a completion with messages is a wakeup and a read.
 * After a full batch it does not drain with read(2) as reader_serve()
 * does: it resubmits the ring's read, which it must do before it sleeps
 * anyway. Issued at once, that read takes what is queued and completes
 * within the same io_uring_enter() a drain's read(2) would have cost; on
 * an empty uffd it arms the poll and sleeps in that same call, where a
 * drain spends an empty read(2) and then another call to wait. So every
 * read goes through the ring (ring_completions == reads) and read_sizes[0]
 * stays 0. Each trip through io_uring_enter() lets the other readers' rings
 * take messages too, so no bound on reads per wakeup is needed here.
 */
static void reader_loop_ring(struct ukvm_reader *r)
{
	struct ukvm_pool *pool = r->pool;
	const struct uffd_msg *msgs = NULL;
	const char *what = "io_uring";
	ssize_t n;

	while (!reader_stopping(r)) {
		n = ukvm_ring_next(r->ring, &msgs, &what);
		if (n == -EINTR)
			continue;	/* a kick: look at the stop flag again */
		if (n == UKVM_RING_STOPPED)
			break;
		if (n < 0 && n != -EAGAIN) {
			ukvm_ctl_fail(pool->ctl, UKVM_ERR_RUN, (int)-n, "reader %u of uffd %u: %s",
				      r->index, pool->uffd_index, what);
			break;
		}
		r->stats.wakeups++;
		r->stats.ring_completions += n > 0;
		if (reader_take(r, msgs, n, READ_WOKEN, "IORING_OP_READ(uffd)") < 0)
			break;
	}
	/* No read of the uffd outlives the reader (ring.h). */
	ukvm_ring_cancel(r->ring, RING_CANCEL_NS);
}

/*
 * The thread's own counters, over its whole life (RUSAGE_THREAD counts from
 * its start), on every way out: a reader that failed to pin has them too.
 */
static void reader_record_usage(struct ukvm_reader *r)
{
	struct ukvm_thread_usage usage;

	if (ukvm_thread_usage(&usage))
		return;
	r->stats.context_switches = usage.context_switches;
	r->stats.voluntary_context_switches = usage.voluntary_context_switches;
	r->stats.cpu_ns = usage.cpu_ns;
}

#ifdef UKVM_TEST_HOOKS
/* UKVM_INJECT_READER_CRASH: a fault of this thread's own, as a bug would make. */
static void reader_crash(void)
{
	volatile uint8_t *page = mmap(NULL, UKVM_PAGE_SIZE, PROT_NONE,
				      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (page != MAP_FAILED)
		*page = 1;	/* SIGSEGV, delivered to this thread at once */
}
#endif

static void *reader_thread(void *arg)
{
	struct ukvm_reader *r = arg;
	char who[48];
	int ret;

	ukvm_kick_thread_init();
	r->stats.tid = (int32_t)gettid();
	ukvm_thread_start(&r->state);
	snprintf(who, sizeof(who), "reader %u of uffd %u", r->index, r->pool->uffd_index);
	ukvm_uffd_thread_init(r->pool->ctl, who);
#ifdef UKVM_TEST_HOOKS
	if (r->pool->ctl->inject == UKVM_INJECT_READER_CRASH && r->pool->uffd_index == 0 &&
	    r->index == 0)
		reader_crash();
#endif
	ret = ukvm_thread_pin(r->cpu, r->stats.affinity);
	if (ret) {
		ukvm_ctl_fail(r->pool->ctl, UKVM_ERR_RUN, -ret,
			      "reader %u of uffd %u: pinning to CPU %d (pin_readers)", r->index,
			      r->pool->uffd_index, r->cpu);
		goto out;
	}
	ukvm_thread_at(&r->state, "waiting for or resolving faults");
	switch (r->pool->wait) {
	case UKVM_WAIT_POLL:
		reader_loop_poll(r);
		break;
	case UKVM_WAIT_READ:
		reader_loop_read(r);
		break;
	case UKVM_WAIT_SPIN:
		reader_loop_spin(r);
		break;
	case UKVM_WAIT_IO_URING:
		reader_loop_ring(r);
		break;
	default:
		reader_loop_epoll(r);
		break;
	}
out:
#ifdef UKVM_TEST_HOOKS
	if (r->stall_ms)
		ukvm_thread_stall(&r->state, r->stall_ms);
#endif
	reader_record_usage(r);
	ukvm_thread_at(&r->state, "leaving");
	atomic_store(&r->exited, true);
	return NULL;
}

static int reader_prepare(struct ukvm_reader *r, struct ukvm_error *err)
{
	struct ukvm_pool *pool = r->pool;
	struct epoll_event ev;
	int ret;

	ret = ukvm_source_conn_open(&r->conn, pool->source, pool->full_stats, pool->stop_fd, err);
	if (ret)
		return ret;
	if (pool->mode == UKVM_UFFD_MISSING && pool->resolve == UKVM_RESOLVE_COPY &&
	    pool->page_size <= UKVM_READER_SRC_MAX) {
		if (pool->page_size == UKVM_PAGE_SIZE) {
			r->src = mmap(NULL, pool->page_size, PROT_READ | PROT_WRITE,
				      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (r->src == MAP_FAILED) {
				r->src = NULL;
				ukvm_err_set(err, UKVM_ERR_RUN, errno,
					     "uffd %u reader %u: mmap(source page)",
					     pool->uffd_index, r->index);
				return -ENOMEM;
			}
		} else {
			r->src = shared_map("uffdkvm-reader-source", pool->page_size, err);
			if (!r->src)
				return -ENOMEM;
		}
		ukvm_source_prepare(pool->source, r->src, pool->page_size);
	}
	if (pool->prefetch == UKVM_PREFETCH_READAHEAD && pool->mode == UKVM_UFFD_MISSING &&
	    pool->resolve == UKVM_RESOLVE_COPY && pool->page_size < UKVM_READAHEAD_BUF_MAX) {
		r->ra_pages = (uint32_t)(UKVM_READAHEAD_BUF_MAX / pool->page_size);
		if (r->ra_pages > pool->prefetch_pages)
			r->ra_pages = pool->prefetch_pages;
	}
	if (r->ra_pages > 1) {
		r->ra = mmap(NULL, (uint64_t)r->ra_pages * pool->page_size,
			     PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (r->ra == MAP_FAILED) {
			r->ra = NULL;
			ukvm_err_set(err, UKVM_ERR_RUN, errno,
				     "uffd %u reader %u: mmap(readahead buffer of %u pages)",
				     pool->uffd_index, r->index, r->ra_pages);
			return -ENOMEM;
		}
		ukvm_source_prepare(pool->source, r->ra, (uint64_t)r->ra_pages * pool->page_size);
	}
	if (pool->mode == UKVM_UFFD_MISSING && pool->resolve == UKVM_RESOLVE_MOVE) {
		ret = stage_create(r, err);
		if (ret)
			return ret;
	}
	if (pool->resolver == UKVM_RESOLVER_VCPU)
		return 0;	/* a vCPU thread: it waits for nothing */
	if (pool->wait == UKVM_WAIT_IO_URING)
		return ukvm_ring_create(&r->ring, pool->uffd, pool->stop_fd, pool->read_batch, err);
	if (pool->wait != UKVM_WAIT_EPOLL && pool->wait != UKVM_WAIT_EPOLL_EXCLUSIVE)
		return 0;

	r->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (r->epfd < 0) {
		ukvm_err_set(err, UKVM_ERR_RUN, errno, "uffd %u reader %u: epoll_create1",
			     pool->uffd_index, r->index);
		return -EINVAL;
	}
	ev.events = EPOLLIN;
	if (pool->wait == UKVM_WAIT_EPOLL_EXCLUSIVE)
		ev.events |= EPOLLEXCLUSIVE;
	ev.data.u64 = 0;
	ev.data.u32 = EV_UFFD;
	if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, pool->uffd, &ev)) {
		ukvm_err_set(err, UKVM_ERR_HOST, errno,
			     "uffd %u reader %u: epoll_ctl(ADD uffd%s)", pool->uffd_index,
			     r->index, pool->wait == UKVM_WAIT_EPOLL_EXCLUSIVE ?
			     ", EPOLLEXCLUSIVE" : "");
		return -EINVAL;
	}
	ev.events = EPOLLIN;
	ev.data.u64 = 0;
	ev.data.u32 = EV_STOP;
	if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, pool->stop_fd, &ev)) {
		ukvm_err_set(err, UKVM_ERR_RUN, errno,
			     "uffd %u reader %u: epoll_ctl(ADD stop eventfd)", pool->uffd_index,
			     r->index);
		return -EINVAL;
	}
	return 0;
}

void ukvm_pool_init(struct ukvm_pool *pool)
{
	memset(pool, 0, sizeof(*pool));
	pool->uffd = -1;
	pool->stop_fd = -1;
	atomic_init(&pool->stop, false);
	atomic_init(&pool->log_chunks, 0);
	shared_init(&pool->shared);
}

/*
 * Stats full: the pool's fault log. Each page of the range faults once per
 * vCPU that may touch it (a retried access can fault again, so double it),
 * plus a partly filled chunk per reader. Only the address space is reserved
 * up front; the part every run fills (a record per page) is populated now,
 * so that writing a record does not take a page fault on the hot path
 * either.
 */
static int pool_log_create(struct ukvm_pool *pool, struct ukvm_error *err)
{
	uint64_t pages = pool->region_size / pool->page_size;
	uint64_t expected = pages * pool->vcpus_sharing;
	uint64_t cap = 2 * expected + (uint64_t)(pool->nr_readers + 1) * UKVM_LOG_CHUNK;
	/* One record per page: what every run needs, whatever overlap adds. */
	uint64_t warm = (pages + (uint64_t)pool->nr_readers * UKVM_LOG_CHUNK) * sizeof(*pool->log);

	pool->log = mmap(NULL, cap * sizeof(*pool->log), PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (pool->log == MAP_FAILED) {
		pool->log = NULL;
		ukvm_err_set(err, UKVM_ERR_RUN, errno, "uffd %u: mmap(fault log, %llu records)",
			     pool->uffd_index, (unsigned long long)cap);
		return -ENOMEM;
	}
	pool->log_cap = cap;
	/* Best effort (Linux 5.14+): without it the first records fault the pages in. */
	madvise(pool->log, ALIGN_UP(warm, UKVM_PAGE_SIZE), MADV_POPULATE_WRITE);
	return 0;
}

int ukvm_pool_start(struct ukvm_pool *pool, struct ukvm_error *err)
{
	uint32_t i;
	int ret;

	if (!pool->source)
		pool->source = ukvm_source_synthetic();
	pool->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (pool->stop_fd < 0) {
		ukvm_err_set(err, UKVM_ERR_RUN, errno, "uffd %u: eventfd", pool->uffd_index);
		return -EINVAL;
	}
	if (posix_memalign((void **)&pool->readers, UKVM_CACHELINE,
			   pool->nr_readers * sizeof(*pool->readers))) {
		pool->readers = NULL;
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "uffd %u: allocating %u readers",
			     pool->uffd_index, pool->nr_readers);
		return -ENOMEM;
	}
	memset(pool->readers, 0, pool->nr_readers * sizeof(*pool->readers));
	if (pool->full_stats) {
		ret = pool_log_create(pool, err);
		if (ret)
			return ret;
	}
	if (pool->mode == UKVM_UFFD_MISSING && pool->resolve == UKVM_RESOLVE_COPY &&
	    pool->page_size > UKVM_READER_SRC_MAX) {
		ret = shared_create(&pool->shared, pool->page_size, pool->source, err);
		if (ret)
			return ret;
	}
	for (i = 0; i < pool->nr_readers; i++) {
		struct ukvm_reader *r = &pool->readers[i];
		uint32_t k = pool->first_reader + i;

		r->pool = pool;
		r->index = i;
		r->epfd = -1;
		r->cpu = pool->nr_pins ? pool->pins[k % pool->nr_pins] : -1;
		r->rng = pool->seed ^ ((uint64_t)k << 32) ^ 0x7265616465720000ULL;
		r->stats.uffd = pool->uffd_index;
		r->stats.index = i;
		r->vcpu = -1;	/* resolver vCPU: ukvm_pool_bind_vcpu() says which */
		snprintf(r->who, sizeof(r->who), "reader %u of uffd %u", i, pool->uffd_index);
		atomic_init(&r->exited, false);
#ifdef UKVM_TEST_HOOKS
		/* The stalled reader of UKVM_INJECT_READER_STALL: uffd 0's last. */
		if (pool->ctl->inject == UKVM_INJECT_READER_STALL && pool->uffd_index == 0 &&
		    i == pool->nr_readers - 1)
			r->stall_ms = pool->ctl->inject_after;
#endif
	}
	pool->readers_made = pool->nr_readers;
	for (i = 0; i < pool->nr_readers; i++) {
		ret = reader_prepare(&pool->readers[i], err);
		if (ret)
			return ret;
	}

	if (pool->resolver == UKVM_RESOLVER_VCPU)
		return 0;	/* the vCPU threads resolve their own faults */
	for (i = 0; i < pool->nr_readers; i++) {
		struct ukvm_reader *r = &pool->readers[i];

		ret = ukvm_thread_create(pool->ctl, &r->thread, READER_STACK_BYTES, reader_thread, r);
		if (ret) {
			ukvm_err_set(err, UKVM_ERR_RUN, -ret,
				     "uffd %u: pthread_create(reader %u of %u)", pool->uffd_index,
				     i, pool->nr_readers);
			return ret;
		}
		r->thread_started = true;
	}
	return 0;
}

void ukvm_pool_request_stop(struct ukvm_pool *pool)
{
	uint64_t one = 1;

	if (atomic_exchange(&pool->stop, true))
		return;
	if (pool->stop_fd >= 0 && write(pool->stop_fd, &one, sizeof(one)) < 0) {
		/* The eventfd counter cannot overflow from one write; kicks still work. */
	}
}

uint32_t ukvm_pool_reap(struct ukvm_pool *pool, bool kick)
{
	uint32_t i, running = 0;

	for (i = 0; pool->readers && i < pool->nr_readers; i++) {
		struct ukvm_reader *r = &pool->readers[i];

		if (!r->thread_started)
			continue;
		if (atomic_load(&r->exited)) {
			pthread_join(r->thread, NULL);	/* it is returning: prompt */
			r->thread_started = false;
			continue;
		}
		running++;
		if (kick)
			pthread_kill(r->thread, ukvm_kick_signal());
	}
	return running;
}

uint32_t ukvm_pool_stop(struct ukvm_pool *pool, uint64_t deadline_ns)
{
	uint32_t running;
	int rounds;

	ukvm_pool_request_stop(pool);
	/*
	 * Readers in poll/epoll wake on the eventfd. A reader blocked in
	 * read(2) (or sleeping out a delay) needs a signal; a kick can land
	 * just before it blocks, so kick until it has left. One that does not
	 * leave by the deadline is left running for the caller to report,
	 * never waited for without a bound.
	 */
	for (rounds = 0;; rounds++) {
		running = ukvm_pool_reap(pool, rounds > 0);
		if (!running || ukvm_now_ns() >= deadline_ns)
			return running;
		ukvm_sleep_ns(rounds ? NSEC_PER_MSEC : 100000);
	}
}

struct ukvm_reader *ukvm_pool_running_reader(struct ukvm_pool *pool)
{
	uint32_t i;

	for (i = 0; pool->readers && i < pool->nr_readers; i++)
		if (pool->readers[i].thread_started)
			return &pool->readers[i];
	return NULL;
}

void ukvm_pool_release_uffd(struct ukvm_pool *pool)
{
	int nul;

	if (pool->uffd < 0)
		return;
	if (!ukvm_pool_running_reader(pool)) {
		close(pool->uffd);
		pool->uffd = -1;
		return;
	}
	/*
	 * A reader that still runs may use this fd number any time: closed, the
	 * number could name another file (the next run's uffd). dup3 swaps the
	 * uffd for /dev/null under the same number; the uffd itself is released
	 * once no call of that reader holds it. Without a spare fd, keep it.
	 */
	nul = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (nul < 0)
		return;
	dup3(nul, pool->uffd, O_CLOEXEC);
	close(nul);
}

int ukvm_pool_destroy(struct ukvm_pool *pool)
{
	uint32_t i;

	/* Joins readers that have left; one still running keeps everything. */
	if (ukvm_pool_reap(pool, false))
		return -EBUSY;
	for (i = 0; pool->readers && i < pool->readers_made; i++) {
		struct ukvm_reader *r = &pool->readers[i];

		if (r->epfd >= 0)
			close(r->epfd);
		ukvm_ring_destroy(r->ring);
		r->ring = NULL;
		if (r->src)
			munmap(r->src, pool->page_size);
		if (r->ra)
			munmap(r->ra, (uint64_t)r->ra_pages * pool->page_size);
		if (r->stage)
			munmap(r->stage, (uint64_t)r->stage_pages * pool->page_size);
		ukvm_source_conn_close(&r->conn);
	}
	free(pool->readers);
	pool->readers = NULL;
	if (pool->log)
		munmap(pool->log, pool->log_cap * sizeof(*pool->log));
	pool->log = NULL;
	shared_destroy(&pool->shared);
	if (pool->stop_fd >= 0)
		close(pool->stop_fd);
	pool->stop_fd = -1;
	if (pool->uffd >= 0)
		close(pool->uffd);
	pool->uffd = -1;
	return 0;
}
