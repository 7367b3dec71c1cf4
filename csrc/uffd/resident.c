/* SPDX-License-Identifier: MIT */
/*
 * The run's resident map: a byte per page saying how it went in, the order
 * of first touches, and when the region became wholly resident.
 */
#include <errno.h>
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

int ukvm_resident_create(struct ukvm_resident *rs, uint64_t pages, struct ukvm_error *err)
{
	ukvm_resident_init(rs);
	rs->pages = pages;
	/* resident_map() keeps mmap's errno: the error names it, not ENOMEM for every cause. */
	rs->state = resident_map(pages);
	rs->waited = rs->state ? resident_map(pages) : NULL;
	rs->order = rs->waited ? resident_map(pages * sizeof(*rs->order)) : NULL;
	if (!rs->order)
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "mmap(resident map of %llu pages)",
				    (unsigned long long)pages);
	return 0;
}

void ukvm_resident_destroy(struct ukvm_resident *rs)
{
	if (rs->state)
		munmap((void *)rs->state, rs->pages ?: 1);
	if (rs->waited)
		munmap((void *)rs->waited, rs->pages ?: 1);
	if (rs->order)
		munmap(rs->order, (rs->pages * sizeof(*rs->order)) ?: 1);
	ukvm_resident_init(rs);
}

void ukvm_resident_mark(struct ukvm_resident *rs, uint64_t page, enum ukvm_page_state how)
{
	uint64_t n;

	atomic_store_explicit(&rs->state[page], (uint8_t)how, memory_order_relaxed);
	if (how == UKVM_PAGE_FAULTED) {
		n = atomic_fetch_add_explicit(&rs->nr_order, 1, memory_order_relaxed);
		if (n < rs->pages)	/* each page is installed once: always */
			rs->order[n] = page;
	}
	n = atomic_fetch_add_explicit(&rs->nr_resident, 1, memory_order_acq_rel) + 1;
	if (n == rs->pages && rs->timed)
		atomic_store(&rs->all_ns, ukvm_now_ns());
}
