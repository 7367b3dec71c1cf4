/* SPDX-License-Identifier: MIT */
/* wp_async: which pages were written, from PAGEMAP_SCAN (pagemap.c). */
#ifndef UKVM_UFFD_PAGEMAP_H
#define UKVM_UFFD_PAGEMAP_H

#include <stdint.h>

#include "ukvm.h"

/*
 * Marks written[i] = 1 for every 4 KiB page i of [addr, addr + len) written
 * since it was write-protected (PAGE_IS_WRITTEN: its uffd-wp bit is clear),
 * 0 for the rest. Must run while the uffd is still open: closing it clears
 * every page's uffd-wp bit. 0, or -errno with err set.
 */
int ukvm_pagemap_written(uint64_t addr, uint64_t len, uint8_t *written, struct ukvm_error *err);

#endif
