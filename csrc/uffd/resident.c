/* SPDX-License-Identifier: MIT */
/*
 * The run's resident map: three bits per page saying how it went in and one
 * whether a vCPU waited for it, the order of first touches (4 bytes a page), and when the region became wholly resident.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/errors.h"
#include "base/util.h"
#include "uffd/resident.h"

void ukvm_resident_init(struct ukvm_resident *rs)
{
	memset(rs, 0, sizeof(*rs));
	atomic_init(&rs->nr_order, 0);
	atomic_init(&rs->nr_resident, 0);
	atomic_init(&rs->all_ns, 0);
}

/* Anonymous, not populated: a page of the map costs memory once a page it covers goes in. */
static void *resident_map(uint64_t bytes)
{
	void *p = mmap(NULL, bytes ?: 1, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

static uint64_t resident_words(uint64_t pages)
{
	return (pages + 63) / 64;
}

int ukvm_resident_create(struct ukvm_resident *rs, uint64_t pages, bool order,
			 struct ukvm_error *err)
{
	uint64_t bytes = resident_words(pages) * sizeof(uint64_t);

	ukvm_resident_init(rs);
	if (pages > UKVM_RESIDENT_MAX_PAGES)
		return ukvm_err_set(err, UKVM_ERR_RUN, EOVERFLOW,
				    "resident map: %llu pages, more than its 32-bit touch order "
				    "holds (%llu): use a larger page_size (backing)",
				    (unsigned long long)pages,
				    (unsigned long long)UKVM_RESIDENT_MAX_PAGES);
	rs->pages = pages;
	/* resident_map() keeps mmap's errno: the error names it, not ENOMEM for every cause. */
	rs->faulted = resident_map(bytes);
	rs->prefetched = rs->faulted ? resident_map(bytes) : NULL;
	rs->preinstalled = rs->prefetched ? resident_map(bytes) : NULL;
	rs->waited = rs->preinstalled ? resident_map(bytes) : NULL;
	/*
	 * malloc, not mmap: collect hands it to the result as the touch order
	 * (free()d there); a large block is mmap()ed by the allocator and, not
	 * written beyond the pages faults installed, costs no more memory.
	 */
	rs->order = rs->waited && order ? malloc((pages ?: 1) * sizeof(*rs->order)) : NULL;
	if (!rs->waited || (order && !rs->order))
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "allocating the resident map of %llu pages",
				    (unsigned long long)pages);
	return 0;
}

void ukvm_resident_destroy(struct ukvm_resident *rs)
{
	uint64_t bytes = resident_words(rs->pages) * sizeof(uint64_t);

	if (rs->faulted)
		munmap((void *)rs->faulted, bytes ?: 1);
	if (rs->prefetched)
		munmap((void *)rs->prefetched, bytes ?: 1);
	if (rs->preinstalled)
		munmap((void *)rs->preinstalled, bytes ?: 1);
	if (rs->waited)
		munmap((void *)rs->waited, bytes ?: 1);
	free(rs->order);
	ukvm_resident_init(rs);
}

void ukvm_resident_mark(struct ukvm_resident *rs, uint64_t page, enum ukvm_page_state how)
{
	uint64_t n;

	if (how == UKVM_PAGE_FAULTED) {
		atomic_fetch_or_explicit(&rs->faulted[page / 64], 1ULL << (page % 64),
					 memory_order_relaxed);
		if (rs->order) {	/* touch_order: asked for */
			n = atomic_fetch_add_explicit(&rs->nr_order, 1, memory_order_relaxed);
			if (n < rs->pages)	/* each page is installed once: always */
				rs->order[n] = (uint32_t)page;
		}
	} else {
		atomic_fetch_or_explicit(how == UKVM_PAGE_PREINSTALLED ? &rs->preinstalled[page / 64] :
					 &rs->prefetched[page / 64], 1ULL << (page % 64),
					 memory_order_relaxed);
	}
	n = atomic_fetch_add_explicit(&rs->nr_resident, 1, memory_order_acq_rel) + 1;
	if (n == rs->pages && rs->timed)
		atomic_store(&rs->all_ns, ukvm_now_ns());
}
