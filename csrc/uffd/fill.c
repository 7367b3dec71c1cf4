/* SPDX-License-Identifier: MIT */
/*
 * The data a resolver puts into a page, so that the host can tell after the
 * run that every page arrived, whole and at the right address.
 */
#include "base/util.h"
#include "uffd/fill.h"

#define WORDS_PER_PAGE	(UKVM_PAGE_SIZE / sizeof(uint64_t))

void ukvm_fill_template(void *dst, uint64_t len)
{
	uint64_t *w = dst;
	uint64_t i, n = len / sizeof(uint64_t);

	for (i = 0; i < n; i++) {
		uint64_t word = i % WORDS_PER_PAGE;

		w[i] = word < 3 ? 0 : UKVM_FILL_WORD(word);
	}
}

void ukvm_fill_stamp(void *dst, uint64_t len, uint64_t gpa)
{
	uint8_t *p = dst;
	uint64_t off;

	for (off = 0; off < len; off += UKVM_PAGE_SIZE) {
		uint64_t *w = (uint64_t *)(p + off);

		w[0] = ~(gpa + off);
		w[1] = gpa + off;
	}
}

void ukvm_fill_pages(void *dst, uint64_t len, uint64_t gpa)
{
	uint8_t *p = dst;
	uint64_t off;

	for (off = 0; off < len; off += UKVM_PAGE_SIZE) {
		ukvm_fill_template(p + off, UKVM_PAGE_SIZE);
		ukvm_fill_stamp(p + off, UKVM_PAGE_SIZE, gpa + off);
	}
}
