/* SPDX-License-Identifier: MIT */
/*
 * Prefetch readahead (prefetch.c): after a fault its resolver installed
 * itself, the next prefetch_pages pages of the uffd's range that are not
 * resident yet, fetched in runs through the resolver's own buffer and
 * installed without a wake. The pusher, prefetch's other way, is pusher.c.
 */
#ifndef UKVM_UFFD_PREFETCH_H
#define UKVM_UFFD_PREFETCH_H

#include <stdint.h>

#include "uffd/resolve.h"
#include "ukvm.h"

/*
 * Each resolver's buffer for a run of pages fetched in one request, at most
 * this many bytes (anonymous memory, pages smaller than it only: larger
 * pages are read ahead one at a time through the copy sources, resolve.h).
 */
#define UKVM_READAHEAD_BUF_MAX	(1ULL << 20)

/*
 * r's readahead buffer, where its area reads ahead (prefetch readahead,
 * resolve copy): 0, or -errno with err set. Sets the area's readahead.
 */
int ukvm_prefetch_prepare(struct ukvm_fault_resolver *r, struct ukvm_error *err);
void ukvm_prefetch_destroy(struct ukvm_fault_resolver *r);
/*
 * Readahead after the fault at addr was resolved (its vCPU woken), as
 * struct ukvm_resolve_area's readahead: 0, or -errno after recording the
 * failure as the run's.
 */
int ukvm_prefetch_readahead(struct ukvm_fault_resolver *r, uint64_t addr);

#endif
