/* SPDX-License-Identifier: MIT */
/* The pages written under WP_ASYNC, from PAGEMAP_SCAN (pagemap.c). */
#ifndef UKVM_UFFD_PAGEMAP_H
#define UKVM_UFFD_PAGEMAP_H

#include <stdbool.h>
#include <stdint.h>

#include "ukvm.h"

/*
 * Marks written[i] = 1 for every 4 KiB page i of [addr, addr + len) written
 * since it was write-protected (PAGE_IS_WRITTEN: its uffd-wp bit is clear),
 * 0 for the rest. Must run while the uffd is still open: closing it clears
 * every page's uffd-wp bit. 0, or -errno with err set.
 */
int ukvm_pagemap_written(uint64_t addr, uint64_t len, uint8_t *written, struct ukvm_error *err);

/* /proc/self/pagemap, opened for ukvm_pagemap_harvest: an fd, or -errno. */
int ukvm_pagemap_open(struct ukvm_error *err);
/*
 * dirty_tracking wp_async: sets bit i of bitmap for every written page i of
 * [addr, addr + len) and write-protects it again in the same walk
 * (PM_SCAN_WP_MATCHING, checked to be WP_ASYNC: PM_SCAN_CHECK_WPASYNC).
 * Bits of pages not written are left as they were. !protect: the scan
 * alone (a test build's UKVM_INJECT_DIRTY_SKIP_REPROTECT).
 */
int ukvm_pagemap_harvest(int fd, uint64_t addr, uint64_t len, uint64_t *bitmap, bool protect,
			 struct ukvm_error *err);

#endif
