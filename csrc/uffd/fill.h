/* SPDX-License-Identifier: MIT */
/*
 * What every page must hold. A page resolved with data (UFFDIO_COPY, or
 * the page cache a MINOR run prefills) holds, per 4 KiB at guest physical
 * address gpa:
 *   word 0: ~gpa, word 1: gpa, word 2: 0, word i >= 3: UKVM_FILL_WORD(i).
 * Words 0 and 1 tie the page to its address; the rest catch corruption.
 */
#ifndef UKVM_UFFD_FILL_H
#define UKVM_UFFD_FILL_H

#include <stdint.h>

#define UKVM_FILL_BASE		0xa5c3a5c3a5c3a5c3ULL
#define UKVM_FILL_WORD(i)	(UKVM_FILL_BASE ^ (uint64_t)(i))

/* Writes the address-independent words of every 4 KiB page of dst. */
void ukvm_fill_template(void *dst, uint64_t len);
/* Writes the address-dependent words of every 4 KiB page of dst. */
void ukvm_fill_stamp(void *dst, uint64_t len, uint64_t gpa);
/* Template and stamps at once: what a prefill writes. */
void ukvm_fill_pages(void *dst, uint64_t len, uint64_t gpa);

#endif
