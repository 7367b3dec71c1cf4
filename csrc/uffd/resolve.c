/* SPDX-License-Identifier: MIT */
/*
 * Resolving one fault, for a reader that read its message or a vCPU that
 * met it in KVM_RUN: the delay, the page's bytes fetched from the page
 * source through the resolver's own conn, the resolving ioctl, the wake
 * after EEXIST, the counters and the fault record, then readahead.
 *
 * resolve copy: UFFDIO_COPY's data goes in with the copy: each resolver has
 * a buffer of its own for pages up to 2 MiB, and 1 GiB pages share one per
 * uffd under a lock (struct ukvm_shared_buffer in resolve.h says why).
 *
 * resolve move (UFFDIO_MOVE, Linux 6.8+): the page a fault gets is one the
 * resolver has received into a buffer of its own, then moved into place
 * without a copy. The kernel takes the page out of the buffer (it is a
 * hole there afterwards) and accepts only private anonymous pages that are
 * present and not shared with another process (EBUSY: a fork's copy-on-
 * write page). So each resolver stages pages in a private anonymous area
 * (MADV_DONTFORK: a fork of this process leaves its pages exclusive),
 * UKVM_MOVE_STAGE_BYTES (config_schema.h, from uffdkvm/schema/fields.py) of 4 KiB
 * pages or one 2 MiB page (anonymous_thp, 2 MiB aligned, MADV_HUGEPAGE, so
 * that a whole huge page moves at once),
 * takes the next page per fault, fetches its bytes into it and moves it,
 * and refills the area once it is used up: one MADV_POPULATE_WRITE faults
 * all its pages in again, and for the synthetic source the template is
 * written over them (what receiving them would cost), on the fault that
 * finds it used up (every 64th of 4 KiB, every 2 MiB one). The template
 * goes in before the move like a copy's data: the page is whole when it
 * appears. A 2 MiB page that the kernel gave the area as a huge page moves
 * whole (one PMD), and stays a huge mapping.
 *
 * In uffd_mode wp a fault is a first write: the old page goes into the
 * snapshot, then UFFDIO_WRITEPROTECT un-protects it (resolve_unprotect).
 */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/ctl.h"
#include "base/errors.h"
#include "base/hist.h"
#include "base/util.h"
#include "uapi_compat.h"
#include "uffd/faultlog.h"
#include "uffd/resident.h"
#include "uffd/resolve.h"
#include "uffd/source.h"
#include "uffd/uffd.h"

/*
 * resolve move: a resolver's staging area for 4 KiB pages (64 pages, refilled
 * in one call) is UKVM_MOVE_STAGE_BYTES (config_schema.h).
 */
/* Resolver vCPU: the longest wait for another thread's copy of a unit to reach a page. */
#define RESOLVER_UNIT_WAIT_NS	(10ULL * NSEC_PER_SEC)

static const char *resolve_name(const struct ukvm_resolve_area *a)
{
	if (a->mode == UKVM_UFFD_MINOR)
		return "UFFDIO_CONTINUE";
	if (a->resolve == UKVM_RESOLVE_MOVE)
		return "UFFDIO_MOVE";
	if (a->mode == UKVM_UFFD_WP)
		return "UFFDIO_WRITEPROTECT";
	return a->resolve == UKVM_RESOLVE_ZEROPAGE ? "UFFDIO_ZEROPAGE" : "UFFDIO_COPY";
}

static uint64_t resolve_delay_ns(struct ukvm_fault_resolver *r)
{
	const struct ukvm_resolve_area *a = r->area;
	double u;

	switch (a->delay_dist) {
	case UKVM_DELAY_UNIFORM:
		return (uint64_t)(ukvm_random_unit(&r->rng) * 2.0 * (double)a->delay_ns);
	case UKVM_DELAY_EXPONENTIAL:
		u = ukvm_random_unit(&r->rng);
		return (uint64_t)(-log1p(-u) * (double)a->delay_ns);
	default:
		return a->delay_ns;
	}
}

bool ukvm_resolve_stopping(const struct ukvm_fault_resolver *r)
{
	return atomic_load_explicit(&r->area->stop, memory_order_relaxed);
}

uint64_t ukvm_resolve_page(const struct ukvm_resolve_area *a, uint64_t addr)
{
	return a->resident_first + (addr - a->hva_base) / a->page_size;
}

int ukvm_resolve_fetch(struct ukvm_fault_resolver *r, uint64_t addr, uint64_t len, uint64_t gpa,
		       uint8_t *dst, bool urgent)
{
	struct ukvm_resolve_area *a = r->area;
	uint64_t off = a->region_off + (addr - a->hva_base);
	int ret;

	ret = ukvm_source_fetch(&r->conn, off, len, gpa, dst, urgent);
	/* Cancelled: the run is stopping (its end, or another thread's failure). */
	if (ret && ret != -ECANCELED && !ukvm_ctl_aborted(a->ctl))
		ukvm_ctl_fail(a->ctl, UKVM_ERR_RUN, -ret,
			      "%s: fetching %llu bytes at offset %llu of %s %s: %s", r->who,
			      (unsigned long long)len, (unsigned long long)off,
			      a->source->kind == UKVM_SOURCE_REMOTE ? "the page server at" :
			      "source_path", a->source->kind == UKVM_SOURCE_REMOTE ?
			      a->source->address : a->source->path,
			      ukvm_source_strerror(a->source, ret));
	return ret;
}

/* UFFDIO_COPY of the page at addr with its data: 0, -EEXIST (resolved already) or -errno. */
static int resolve_copy(struct ukvm_fault_resolver *r, uint64_t addr, uint64_t gpa)
{
	struct ukvm_resolve_area *a = r->area;
	struct ukvm_shared_buffer *shared = &a->shared;
	int ret;

	/* Up to 2 MiB pages: the resolver's own buffer (struct ukvm_shared_buffer). */
	if (r->src) {
		ret = ukvm_resolve_fetch(r, addr, a->page_size, gpa, r->src, true);
		return ret ?: ukvm_uffd_copy(a->uffd, addr, r->src, a->page_size);
	}
	pthread_mutex_lock(&shared->lock);
	ret = ukvm_resolve_fetch(r, addr, a->page_size, gpa, shared->buffer, true);
	ret = ret ?: ukvm_uffd_copy(a->uffd, addr, shared->buffer, a->page_size);
	pthread_mutex_unlock(&shared->lock);
	return ret;
}

/* resolve move: every page of the staging area present again, holding the template. */
static void stage_refill(struct ukvm_fault_resolver *r)
{
	uint64_t len = (uint64_t)r->stage_pages * r->area->page_size;

	/* Best effort (Linux 5.14+): without it, the template's writes fault the pages in. */
	madvise(r->stage, len, MADV_POPULATE_WRITE);
	ukvm_source_prepare(r->area->source, r->stage, len);
	r->stage_next = 0;
}

/*
 * resolve move: the resolver's staging area, page-aligned to the area's
 * page size (a 2 MiB page moves whole only from a 2 MiB aligned huge
 * page), and filled.
 */
static int stage_create(struct ukvm_fault_resolver *r, struct ukvm_error *err)
{
	uint64_t page = r->area->page_size;
	uint64_t pages = page < UKVM_MOVE_STAGE_BYTES ? UKVM_MOVE_STAGE_BYTES / page : 1;
	uint64_t len = pages * page, slack = page > UKVM_PAGE_SIZE ? page : 0;
	uint8_t *p, *aligned;

	p = mmap(NULL, len + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "%s: mmap(staging area for "
				    "UFFDIO_MOVE, %llu bytes)", r->who,
				    (unsigned long long)(len + slack));
	aligned = (uint8_t *)(uintptr_t)ALIGN_UP((uintptr_t)p, page);
	if (aligned > p)
		munmap(p, (size_t)(aligned - p));
	if (p + len + slack > aligned + len)
		munmap(aligned + len, (size_t)(p + len + slack - (aligned + len)));
	r->stage = aligned;
	r->stage_pages = (uint32_t)pages;
	/* Huge pages where the area's are huge (best effort: 4 KiB pages move too, one by one). */
	madvise(aligned, len, page > UKVM_PAGE_SIZE ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
	if (madvise(aligned, len, MADV_DONTFORK))
		return ukvm_err_set(err, UKVM_ERR_RUN, errno,
				    "%s: madvise(staging area, MADV_DONTFORK)", r->who);
	stage_refill(r);
	return 0;
}

/*
 * resolve move: the next staged page, fetched into, moved to addr. 0, -EEXIST
 * (resolved already) or -errno. A 4 KiB page that met EEXIST is still
 * there and serves the next fault; a larger one may have moved in part,
 * so it counts as used.
 */
static int resolve_move(struct ukvm_fault_resolver *r, uint64_t addr, uint64_t gpa)
{
	uint64_t page = r->area->page_size;
	uint8_t *src;
	int ret;

	if (r->stage_next == r->stage_pages)
		stage_refill(r);
	src = r->stage + (uint64_t)r->stage_next * page;
	ret = ukvm_resolve_fetch(r, addr, page, gpa, src, true);
	if (ret)
		return ret;
	ret = ukvm_uffd_move(r->area->uffd, addr, src, page);
	if (!ret || (ret == -EEXIST && page > UKVM_PAGE_SIZE))
		r->stage_next++;
	return ret;
}

enum { WP_UNSAVED = 0, WP_SAVING, WP_SAVED };

/*
 * uffd_mode wp: the page at addr (offset off in the area) is about to be
 * written for the first time. The first message for it saves its old
 * contents into the snapshot, then un-protects it (which wakes every thread
 * waiting on it); a later one (another vCPU wrote it meanwhile) waits for
 * that save to be complete before it un-protects too, and is counted as
 * EEXIST. 0, -EEXIST, or -errno.
 */
static int resolve_unprotect(struct ukvm_fault_resolver *r, uint64_t addr, uint64_t off)
{
	struct ukvm_resolve_area *a = r->area;
	_Atomic uint8_t *state = &a->wp_state[off / UKVM_PAGE_SIZE];
	uint8_t seen = WP_UNSAVED;
	int ret;

	if (atomic_compare_exchange_strong(state, &seen, WP_SAVING)) {
#ifdef UKVM_TEST_HOOKS
		/* The save broken on purpose: the snapshot must then fail verification. */
		if (a->ctl->inject != UKVM_INJECT_WP_NO_SAVE)
#endif
			memcpy(a->snapshot + off, (const void *)(uintptr_t)addr, a->page_size);
		atomic_store_explicit(state, WP_SAVED, memory_order_release);
		return ukvm_uffd_writeprotect(a->uffd, addr, a->page_size, false);
	}
	/* Saving elsewhere: a 4 KiB copy, so wait, but not past the run's end. */
	while (atomic_load_explicit(state, memory_order_acquire) != WP_SAVED) {
		if (ukvm_ctl_aborted(a->ctl))
			return -ECANCELED;
		sched_yield();
	}
	ret = ukvm_uffd_writeprotect(a->uffd, addr, a->page_size, false);
	return ret ?: -EEXIST;
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
static int resolve_wake(struct ukvm_fault_resolver *r, uint64_t addr)
{
	struct ukvm_resolve_area *a = r->area;
	int ret;

	if (a->vcpu_resolvers ||
	    (a->prefetch == UKVM_PREFETCH_NONE && a->page_size > UKVM_PAGE_SIZE))
		return 0;
	ret = ukvm_uffd_wake(a->uffd, addr, a->page_size);
	if (!ret) {
		r->stats.wakes++;
		return 0;
	}
	if (ukvm_ctl_aborted(a->ctl))
		return ret;
	ukvm_ctl_fail(a->ctl, UKVM_ERR_RUN, -ret, "%s: UFFDIO_WAKE(%llu bytes at gpa 0x%llx)",
		      r->who, (unsigned long long)a->page_size,
		      (unsigned long long)(a->gpa_base + (addr - a->hva_base)));
	return ret;
}

/* Records: remembers one fault for faultlog.c (vcpu holds the thread id for now). */
static int resolve_record(struct ukvm_fault_resolver *r, uint64_t start, uint64_t end,
			  uint64_t gpa, int32_t tid, bool eexist, bool write)
{
	struct ukvm_resolve_area *a = r->area;
	struct ukvm_fault_record *rec = ukvm_faultlog_next(&a->log, &r->rec);

	if (!rec) {
		ukvm_ctl_fail(a->ctl, UKVM_ERR_RUN, ENOSPC,
			      "%s: the fault log is full (%llu records: far more fault messages "
			      "than pages)", r->who, (unsigned long long)a->log.cap);
		return -ENOSPC;
	}
	rec->raised_ns = 0;	/* guest_timing: from the guest's stamps, after the run */
	rec->read_ns = start;
	rec->resolved_ns = end;
	rec->resumed_ns = 0;
	rec->gpa = gpa;
	rec->vcpu = tid;
	rec->uffd = (uint16_t)a->uffd_index;
	rec->reader = (uint16_t)r->index;
	rec->eexist = eexist;
	rec->write = write;
	return 0;
}

/* The resolving call of the fault at addr: 0, -EEXIST, or -errno (-ECANCELED: stopping). */
static int resolve_one(struct ukvm_fault_resolver *r, const struct uffd_msg *msg, uint64_t addr,
		       uint64_t gpa)
{
	struct ukvm_resolve_area *a = r->area;
	int ret;

	if (a->mode == UKVM_UFFD_WP) {
		if (!a->snapshot) {	/* wp_async: the kernel resolves every write itself */
			ukvm_ctl_fail(a->ctl, UKVM_ERR_RUN, 0,
				      "%s: a fault message at gpa 0x%llx with wp_async, which "
				      "delivers none", r->who, (unsigned long long)gpa);
			return -EPROTO;
		}
		if (!(msg->arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP)) {
			ukvm_ctl_fail(a->ctl, UKVM_ERR_RUN, 0,
				      "%s: a fault at gpa 0x%llx without UFFD_PAGEFAULT_FLAG_WP "
				      "(flags 0x%llx) on a range registered for WP only", r->who,
				      (unsigned long long)gpa,
				      (unsigned long long)msg->arg.pagefault.flags);
			return -EPROTO;
		}
		ret = resolve_unprotect(r, addr, addr - a->hva_base);
		if (ret != -ECANCELED)	/* the run is over: nothing to count */
			r->stats.unprotects++;
		return ret;
	}
	if (a->mode == UKVM_UFFD_MINOR) {
		r->stats.continues++;
		return ukvm_uffd_continue(a->uffd, addr, a->page_size);
	}
	if (a->resolve == UKVM_RESOLVE_ZEROPAGE) {
		r->stats.zeropages++;
		return ukvm_uffd_zeropage(a->uffd, addr, a->page_size);
	}
	if (a->resolve == UKVM_RESOLVE_MOVE) {
		r->stats.moves++;
		return resolve_move(r, addr, gpa);
	}
	/* Prefetch installed it already: no fetch, no copy, only the wake. */
	if (a->prefetch != UKVM_PREFETCH_NONE &&
	    !ukvm_resident_absent(a->resident, ukvm_resolve_page(a, addr)))
		return -EEXIST;
	ret = resolve_copy(r, addr, gpa);
	if (ret != -ECANCELED)	/* a fetch given up on the stop: the run is over */
		r->stats.copies++;
	return ret;
}

int ukvm_resolve_message(struct ukvm_fault_resolver *r, const struct uffd_msg *msg,
			 uint64_t t_read)
{
	struct ukvm_resolve_area *a = r->area;
	uint64_t fault, addr, gpa;
	int ret;

	if (msg->event != UFFD_EVENT_PAGEFAULT) {
		ukvm_ctl_fail(a->ctl, UKVM_ERR_RUN, 0, "%s: unexpected uffd event 0x%x", r->who,
			      msg->event);
		return -EPROTO;
	}
	fault = msg->arg.pagefault.address & ~(UKVM_PAGE_SIZE - 1);	/* what the vCPU touched */
	addr = msg->arg.pagefault.address & ~(a->page_size - 1);	/* what gets resolved */
	if (addr < a->hva_base || addr >= a->hva_base + a->region_size) {
		ukvm_ctl_fail(a->ctl, UKVM_ERR_RUN, 0,
			      "%s: fault at 0x%llx, outside the region this uffd registered",
			      r->who, (unsigned long long)msg->arg.pagefault.address);
		return -EFAULT;
	}
	gpa = a->gpa_base + (addr - a->hva_base);

	if (a->delay_ns)
		ukvm_sleep_ns(resolve_delay_ns(r));

#ifdef UKVM_TEST_HOOKS
	if (ukvm_ctl_inject(a->ctl, UKVM_INJECT_READER_EXIT)) {
		/* A reader just goes; a vCPU cannot, so its run fails. */
		if (r->vcpu >= 0)
			ukvm_ctl_fail(a->ctl, UKVM_ERR_RUN, ECANCELED,
				      "%s: left its fault unresolved (injected)", r->who);
		return -ECANCELED;	/* gone without a word: the fault stays unresolved */
	}
	if (ukvm_ctl_inject(a->ctl, UKVM_INJECT_RESOLVE_EIO)) {
		ukvm_ctl_fail(a->ctl, UKVM_ERR_RUN, EIO, "%s: %s(%llu bytes at gpa 0x%llx) (injected)",
			      r->who, resolve_name(a), (unsigned long long)a->page_size,
			      (unsigned long long)gpa);
		return -EIO;
	}
#endif

	ret = resolve_one(r, msg, addr, gpa);
	if (ret == -ECANCELED)
		return ret;	/* the run is over: nothing to record */
	if (ret < 0 && ret != -EEXIST) {
		ukvm_ctl_fail(a->ctl, UKVM_ERR_RUN, -ret, "%s: %s(%llu bytes at gpa 0x%llx)", r->who,
			      resolve_name(a), (unsigned long long)a->page_size,
			      (unsigned long long)gpa);
		return ret;
	}
	if (ret == -EEXIST)
		r->stats.eexist++;
	else
		r->stats.faults++;
	if (a->resident) {
		uint64_t page = ukvm_resolve_page(a, addr);

		ukvm_resident_waited(a->resident, page);
		if (!ret)
			ukvm_resident_mark(a->resident, page, UKVM_PAGE_FAULTED);
	}
	if (ret == -EEXIST) {
		int woke = resolve_wake(r, addr);

		if (woke)
			return woke;	/* its -errno, recorded */
	}
	if (a->full_stats) {
		uint64_t t_done = ukvm_now_ns();
		int logged = 0;

		r->stats.busy_ns += t_done - t_read;
		ukvm_hist_add(&r->stats.service_latency, t_done - t_read);
		if (a->online) {
			logged = ukvm_online_fault(a->online, r->queue, t_read, t_done,
						   a->gpa_base + (fault - a->hva_base),
						   (int32_t)msg->arg.pagefault.feat.ptid,
						   ret == -EEXIST);
			if (logged)
				ukvm_ctl_fail(a->ctl, UKVM_ERR_RUN, -logged,
					      "%s: queueing a fault's events (stats full)", r->who);
		}
		if (!logged && a->records)
			logged = resolve_record(r, t_read, t_done,
						a->gpa_base + (fault - a->hva_base),
						(int32_t)msg->arg.pagefault.feat.ptid, ret == -EEXIST,
						msg->arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WRITE);
		if (logged)
			return logged;
	}
	/* After the fault's own timing: its vCPU runs on meanwhile. */
	if (!ret && a->readahead)
		return a->readahead(r, addr);	/* 0, or its -errno, recorded */
	return 0;
}

/*
 * Resolver vCPU, missing units above 4 KiB: waits until the 4 KiB page at
 * addr is mapped. A unit of anonymous memory (anonymous_thp) goes in 4 KiB
 * at a time, so a copy that met another thread's copy of the same unit
 * half done (a prefetch, or another vCPU with overlap) returns EEXIST
 * before the page this vCPU touches is there; its next access (the MMIO
 * completion's memcpy, KVM's retry) must not come first: on a uffd opened
 * with SIGBUS it would raise SIGBUS. So a mincore() that fails cannot be
 * taken for "mapped": it is the run's failure. 0, -ECANCELED (the run is
 * over), -ETIMEDOUT after RESOLVER_UNIT_WAIT_NS (the other copy is one
 * ioctl), or mincore's -errno.
 */
static int resolve_wait_mapped(struct ukvm_fault_resolver *r, uint64_t addr)
{
	struct ukvm_resolve_area *a = r->area;
	uint64_t start = ukvm_now_ns();
	unsigned char vec = 0;
	uintptr_t at = (uintptr_t)addr;

#ifdef UKVM_TEST_HOOKS
	/* A real mincore() failure: EINVAL for an address not page-aligned. */
	if (ukvm_ctl_inject(a->ctl, UKVM_INJECT_MINCORE_FAIL))
		at |= 1;
#endif
	for (;;) {
		if (mincore((void *)at, UKVM_PAGE_SIZE, &vec)) {
			int e = errno;

			ukvm_ctl_fail(a->ctl, UKVM_ERR_RUN, e,
				      "%s: mincore(the page at 0x%llx, whose unit another thread "
				      "is copying)", r->who, (unsigned long long)addr);
			return -e;
		}
		if (vec & 1)
			return 0;
		if (ukvm_ctl_aborted(a->ctl))
			return -ECANCELED;
		if (ukvm_now_ns() - start > RESOLVER_UNIT_WAIT_NS) {
			ukvm_ctl_fail(a->ctl, UKVM_ERR_RUN, ETIMEDOUT,
				      "%s: the page at 0x%llx was still missing %.1f s after "
				      "another thread's copy of its unit began", r->who,
				      (unsigned long long)addr,
				      (double)RESOLVER_UNIT_WAIT_NS / NSEC_PER_SEC);
			return -ETIMEDOUT;
		}
		sched_yield();
	}
}

int ukvm_resolve_fault(struct ukvm_fault_resolver *r, uint64_t gpa, bool write, uint8_t **hva)
{
	struct ukvm_resolve_area *a = r->area;
	struct uffd_msg msg;
	uint64_t addr, eexist;
	bool unit_shared;
	int ret;

	if (gpa < a->gpa_base || gpa >= a->gpa_base + a->region_size)
		return -ENOENT;
	addr = a->hva_base + (gpa - a->gpa_base);
	if (!r->stats.tid) {
		/* This vCPU thread's first fault: it resolves as a reader would. */
		r->stats.tid = (int32_t)gettid();
		ukvm_uffd_thread_init(a->ctl, r->who);
	}
	/* What the uffd would have queued, had it not been opened with SIGBUS. */
	memset(&msg, 0, sizeof(msg));
	msg.event = UFFD_EVENT_PAGEFAULT;
	msg.arg.pagefault.address = addr;
	msg.arg.pagefault.flags = write ? UFFD_PAGEFAULT_FLAG_WRITE : 0;
	if (a->mode == UKVM_UFFD_WP)	/* only writes fault on a WP-only range */
		msg.arg.pagefault.flags |= UFFD_PAGEFAULT_FLAG_WP | UFFD_PAGEFAULT_FLAG_WRITE;
	msg.arg.pagefault.feat.ptid = (uint32_t)r->stats.tid;
	eexist = r->stats.eexist;
	/* online: it waits in KVM_RUN, not in a read: awake from here to its return */
	ret = ukvm_resolve_message(r, &msg, !a->full_stats ? 0 :
					    a->online ? ukvm_online_stamp(a->online, r->queue) :
					    ukvm_now_ns());
	if (a->online)
		ukvm_online_sleep(a->online, r->queue);
	/* Its own copy put the whole unit in; only another's (EEXIST) may be half done. */
	unit_shared = r->stats.eexist != eexist;
#ifdef UKVM_TEST_HOOKS
	unit_shared |= a->ctl->inject == UKVM_INJECT_MINCORE_FAIL;	/* the wait, every time */
#endif
	if (!ret && unit_shared && a->mode == UKVM_UFFD_MISSING && a->page_size > UKVM_PAGE_SIZE)
		ret = resolve_wait_mapped(r, addr & ~(UKVM_PAGE_SIZE - 1));
	if (ret)
		return ret;
	*hva = (uint8_t *)(uintptr_t)addr;
	return 0;
}

/* A shared mapping of a memfd called name: named in /proc/PID/maps. 0, or -errno. */
static int shared_map(const char *name, uint64_t size, uint8_t **out, struct ukvm_error *err)
{
	void *p;
	int fd, e;

	fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0)
		return ukvm_err_set(err, UKVM_ERR_HOST, errno, "memfd_create(%s)", name);
	if (ftruncate(fd, (off_t)size)) {
		e = errno;
		close(fd);
		return ukvm_err_set(err, UKVM_ERR_HOST, e, "ftruncate(%s, %llu)", name,
				    (unsigned long long)size);
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	e = errno;
	close(fd);	/* the mapping keeps the memory */
	if (p == MAP_FAILED)
		return ukvm_err_set(err, UKVM_ERR_HOST, e, "mmap(%s, %llu bytes)", name,
				    (unsigned long long)size);
	*out = p;
	return 0;
}

/* The shared buffer of page_size bytes, prepared for source, and its lock. */
static int shared_create(struct ukvm_shared_buffer *src, uint64_t page_size,
			 const struct ukvm_source *source, struct ukvm_error *err)
{
	int ret;

	src->page_size = page_size;
	ret = pthread_mutex_init(&src->lock, NULL);
	if (ret)
		return ukvm_err_set(err, UKVM_ERR_RUN, ret, "pthread_mutex_init(source)");
	src->lock_made = true;
	ret = shared_map("uffdkvm-source", page_size, &src->buffer, err);
	if (ret)
		return ret;
	ukvm_source_prepare(source, src->buffer, page_size);
	return 0;
}

static void shared_destroy(struct ukvm_shared_buffer *src)
{
	if (src->buffer)
		munmap(src->buffer, src->page_size);
	if (src->lock_made)
		pthread_mutex_destroy(&src->lock);
	memset(src, 0, sizeof(*src));
}

void ukvm_resolve_area_init(struct ukvm_resolve_area *a)
{
	memset(a, 0, sizeof(*a));
	a->uffd = -1;
	atomic_init(&a->stop, false);
	ukvm_faultlog_store_init(&a->log);
}

int ukvm_resolve_area_create(struct ukvm_resolve_area *a, uint32_t nr_resolvers,
			     uint32_t vcpus_sharing, struct ukvm_error *err)
{
	char who[32];
	int ret;

	if (!a->source)
		a->source = ukvm_source_synthetic();
	if (a->mode == UKVM_UFFD_MISSING && a->resolve == UKVM_RESOLVE_COPY &&
	    a->page_size > UKVM_READER_SRC_MAX) {
		ret = shared_create(&a->shared, a->page_size, a->source, err);
		if (ret)
			return ret;
	}
	if (a->records) {
		/*
		 * Each page of the range faults once per vCPU that may touch it
		 * (a retried access can fault again, so double it), plus a
		 * partly filled chunk per resolver. The part every run fills (a
		 * record per page) is populated now.
		 */
		uint64_t pages = a->region_size / a->page_size;
		uint64_t cap = 2 * pages * vcpus_sharing +
			       (uint64_t)(nr_resolvers + 1) * UKVM_LOG_CHUNK;

		snprintf(who, sizeof(who), "uffd %u", a->uffd_index);
		return ukvm_faultlog_store_create(&a->log, cap,
						  pages + (uint64_t)nr_resolvers * UKVM_LOG_CHUNK,
						  who, err);
	}
	return 0;
}

void ukvm_resolve_area_destroy(struct ukvm_resolve_area *a)
{
	ukvm_faultlog_store_destroy(&a->log);
	shared_destroy(&a->shared);
}

void ukvm_resolve_init(struct ukvm_fault_resolver *r, struct ukvm_resolve_area *a, uint32_t index,
		       uint32_t k, int32_t vcpu)
{
	memset(r, 0, sizeof(*r));
	r->area = a;
	r->index = index;
	r->vcpu = vcpu;
	r->rng = a->seed ^ ((uint64_t)k << 32) ^ 0x7265616465720000ULL;
	r->stats.uffd = a->uffd_index;
	r->stats.index = index;
	if (vcpu >= 0)
		snprintf(r->who, sizeof(r->who), "vCPU %d, resolving on uffd %u", vcpu,
			 a->uffd_index);
	else
		snprintf(r->who, sizeof(r->who), "reader %u of uffd %u", index, a->uffd_index);
}

uint32_t ukvm_resolve_fds(enum ukvm_source_kind source)
{
	return source == UKVM_SOURCE_REMOTE ? 1 : 0;	/* ukvm_source_conn_open() connects */
}

int ukvm_resolve_prepare(struct ukvm_fault_resolver *r, int stop_fd, struct ukvm_error *err)
{
	struct ukvm_resolve_area *a = r->area;
	void *p;
	int ret;

	ret = ukvm_source_conn_open(&r->conn, a->source, a->full_stats, stop_fd, err);
	if (ret)
		return ret;
	if (a->mode == UKVM_UFFD_MISSING && a->resolve == UKVM_RESOLVE_COPY &&
	    a->page_size <= UKVM_READER_SRC_MAX) {
		if (a->page_size == UKVM_PAGE_SIZE) {
			p = mmap(NULL, a->page_size, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (p == MAP_FAILED)
				return ukvm_err_set(err, UKVM_ERR_RUN, errno,
						    "%s: mmap(source page)", r->who);
			r->src = p;
		} else {
			ret = shared_map("uffdkvm-reader-source", a->page_size, &r->src, err);
			if (ret)
				return ret;
		}
		ukvm_source_prepare(a->source, r->src, a->page_size);
	}
	if (a->mode == UKVM_UFFD_MISSING && a->resolve == UKVM_RESOLVE_MOVE)
		return stage_create(r, err);
	return 0;
}

void ukvm_resolve_destroy(struct ukvm_fault_resolver *r)
{
	if (r->src)
		munmap(r->src, r->area->page_size);
	r->src = NULL;
	if (r->stage)
		munmap(r->stage, (uint64_t)r->stage_pages * r->area->page_size);
	r->stage = NULL;
	ukvm_source_conn_close(&r->conn);
}
