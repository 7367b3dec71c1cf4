/* SPDX-License-Identifier: MIT */
/*
 * Prefetch readahead: after the fault at addr was resolved (and its vCPU
 * woken), its resolver installs the next prefetch_pages pages of the uffd's
 * range that are not resident yet, each run of them in a row fetched at
 * once (up to the readahead buffer's ra_pages; without one, a page at a
 * time) and copied with UFFDIO_COPY_MODE_DONTWAKE: no fault waits for
 * them, and a vCPU already waiting on such a page is woken by the reader
 * of its fault, which finds EEXIST (resolve.c). One that a fault got first
 * is EEXIST, counted.
 */
#include <errno.h>
#include <pthread.h>
#include <sys/mman.h>

#include "base/ctl.h"
#include "base/errors.h"
#include "uffd/prefetch.h"
#include "uffd/resident.h"
#include "uffd/resolve.h"
#include "uffd/source.h"
#include "uffd/uffd.h"

int ukvm_prefetch_prepare(struct ukvm_fault_resolver *r, struct ukvm_error *err)
{
	struct ukvm_resolve_area *a = r->area;
	void *p;

	if (a->prefetch != UKVM_PREFETCH_READAHEAD || a->mode != UKVM_UFFD_MISSING ||
	    a->resolve != UKVM_RESOLVE_COPY)
		return 0;
	a->readahead = ukvm_prefetch_readahead;
	if (a->page_size >= UKVM_READAHEAD_BUF_MAX)
		return 0;
	r->ra_pages = (uint32_t)(UKVM_READAHEAD_BUF_MAX / a->page_size);
	if (r->ra_pages > a->prefetch_pages)
		r->ra_pages = a->prefetch_pages;
	if (r->ra_pages <= 1)
		return 0;
	p = mmap(NULL, (uint64_t)r->ra_pages * a->page_size, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return ukvm_err_set(err, UKVM_ERR_RUN, errno,
				    "%s: mmap(readahead buffer of %u pages)", r->who, r->ra_pages);
	r->ra = p;
	ukvm_source_prepare(a->source, r->ra, (uint64_t)r->ra_pages * a->page_size);
	return 0;
}

void ukvm_prefetch_destroy(struct ukvm_fault_resolver *r)
{
	if (r->ra)
		munmap(r->ra, (uint64_t)r->ra_pages * r->area->page_size);
	r->ra = NULL;
}

/*
 * The page at addr with its data from the page source (not urgent: no
 * fault waits for it), without waking anyone: 0, -EEXIST, -ECANCELED, the
 * -errno of a failed fetch (already recorded as the run's) or of the copy. The
 * resolver's own buffer, or the uffd's shared one under its lock.
 */
static int prefetch_copy(struct ukvm_fault_resolver *r, uint64_t addr, uint64_t gpa)
{
	struct ukvm_resolve_area *a = r->area;
	struct ukvm_shared_buffer *shared = &a->shared;
	uint8_t *buf = r->src ? r->src : shared->buffer;
	int ret;

	if (!r->src)
		pthread_mutex_lock(&shared->lock);
	ret = ukvm_resolve_fetch(r, addr, a->page_size, gpa, buf, false);
	if (!ret)
		ret = ukvm_uffd_copy_dontwake(a->uffd, addr, buf, a->page_size);
	if (!r->src)
		pthread_mutex_unlock(&shared->lock);
	return ret;
}

/*
 * A readahead copy's outcome for the page at addr: counted (installed, or
 * EEXIST: a fault got it first), 0; or -errno after recording the failure
 * as the run's.
 */
static int prefetch_done(struct ukvm_fault_resolver *r, uint64_t addr, int ret)
{
	struct ukvm_resolve_area *a = r->area;
	uint64_t page = ukvm_resolve_page(a, addr);

	if (!ret) {
		ukvm_resident_mark(a->resident, page, UKVM_PAGE_PREFETCHED);
		r->stats.prefetched++;
		return 0;
	}
	if (ret == -EEXIST) {
		r->stats.prefetch_eexist++;
		return 0;
	}
	if (ukvm_ctl_aborted(a->ctl))
		return ret;
	ukvm_ctl_fail(a->ctl, UKVM_ERR_RUN, -ret,
		      "%s: readahead UFFDIO_COPY(MODE_DONTWAKE, %llu bytes at gpa 0x%llx)",
		      r->who, (unsigned long long)a->page_size,
		      (unsigned long long)(a->gpa_base + (addr - a->hva_base)));
	return ret;
}

/*
 * Readahead of the run of pages pages from addr, absent when asked for, in
 * one fetch into the resolver's readahead buffer (one request to a page
 * server: one round trip, not one per page), then a DONTWAKE copy per page
 * not resident by then (a fault on it may have won meanwhile: EEXIST,
 * counted). 0, -ECANCELED (stopping) or -errno after recording the
 * failure as the run's.
 */
static int prefetch_run(struct ukvm_fault_resolver *r, uint64_t addr, uint32_t pages)
{
	struct ukvm_resolve_area *a = r->area;
	uint64_t ps = a->page_size, page, at;
	uint32_t k;
	int ret;

	ret = ukvm_resolve_fetch(r, addr, pages * ps, a->gpa_base + (addr - a->hva_base), r->ra,
				 false);
	if (ret)
		return ret;	/* -ECANCELED, or a failure the fetch recorded */
	for (k = 0, at = addr; k < pages; k++, at += ps) {
		page = ukvm_resolve_page(a, at);
		ret = !ukvm_resident_absent(a->resident, page) ? -EEXIST :
		      ukvm_uffd_copy_dontwake(a->uffd, at, r->ra + k * ps, ps);
		ret = prefetch_done(r, at, ret);
		if (ret)
			return ret;
	}
	return 0;
}

int ukvm_prefetch_readahead(struct ukvm_fault_resolver *r, uint64_t addr)
{
	struct ukvm_resolve_area *a = r->area;
	uint64_t ps = a->page_size, end = a->hva_base + a->region_size, at, page;
	uint32_t k, max = r->ra ? r->ra_pages : 1;
	int ret;

	if (end - addr > ((uint64_t)a->prefetch_pages + 1) * ps)
		end = addr + ((uint64_t)a->prefetch_pages + 1) * ps;
	for (at = addr + ps; at < end; at += (uint64_t)k * ps) {
		if (ukvm_resolve_stopping(r))
			return 0;
		page = ukvm_resolve_page(a, at);
		k = 1;
		if (!ukvm_resident_absent(a->resident, page))
			continue;
		while (k < max && at + (uint64_t)k * ps < end &&
		       ukvm_resident_absent(a->resident, page + k))
			k++;
		if (r->ra) {
			ret = prefetch_run(r, at, k);
		} else {
			/* A failed fetch, recorded, aborted the run: done() adds nothing. */
			ret = prefetch_copy(r, at, a->gpa_base + (at - a->hva_base));
			if (ret != -ECANCELED)
				ret = prefetch_done(r, at, ret);
		}
		if (ret == -ECANCELED)
			return 0;	/* stopping: the pages ahead can wait */
		if (ret)
			return ret;
	}
	return 0;
}
