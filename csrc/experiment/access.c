/* SPDX-License-Identifier: MIT */
/*
 * The guest's access lists (access.h).
 *
 * The working set is a hash of the page frame (as the write/read choice
 * is), so that with overlap every vCPU has the same one; the order within
 * it follows the pattern. Zipf draws are independent per vCPU: rank r
 * (0-based) has weight 1 / (r + 1)^theta, and ranks map to the touched
 * pages through a seeded shuffle, so the hot pages are scattered over the
 * region rather than its first pages. Every pass repeats the list, so a
 * page's visit count per pass times passes is what the guest did to it.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "base/util.h"
#include "experiment/access.h"
#include "kvm/guest_abi.h"

bool ukvm_access_listed(const struct ukvm_config *cfg)
{
	return cfg->touch_percent < 100 || cfg->access != UKVM_ACCESS_UNIFORM;
}

uint64_t ukvm_access_max_entries(const struct ukvm_config *cfg)
{
	uint64_t pages = cfg->mem_per_vcpu / UKVM_PAGE_SIZE;

	return cfg->access == UKVM_ACCESS_ZIPF && cfg->accesses > pages ? cfg->accesses : pages;
}

bool ukvm_access_in_set(uint64_t gpa, uint32_t touch_percent, uint64_t touch_key)
{
	uint64_t h;

	if (touch_percent >= 100)
		return true;
	h = ((gpa >> 12) ^ touch_key) * GUEST_HASH_MUL2;
	h ^= h >> 29;
	h *= GUEST_HASH_MUL1;
	h ^= h >> 32;
	return (uint64_t)(((unsigned __int128)h * 100) >> 64) < touch_percent;
}

/* Fisher-Yates, from the splitmix64 stream at *state. */
static void access_shuffle(uint32_t *a, uint64_t n, uint64_t *state)
{
	uint64_t i, j;
	uint32_t t;

	for (i = n; i > 1; i--) {
		j = (uint64_t)(((unsigned __int128)ukvm_splitmix64(state) * i) >> 64);
		t = a[i - 1];
		a[i - 1] = a[j];
		a[j] = t;
	}
}

/* accesses draws of a rank in [0, n) by Zipf weights, each mapped to page[rank]. */
static int access_zipf_draw(const uint32_t *page, uint64_t n, double theta, uint64_t accesses,
		     uint64_t *state, uint32_t *list)
{
	double *cdf = malloc(n * sizeof(*cdf)), total = 0;
	uint64_t i;

	if (!cdf)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		total += pow((double)(i + 1), -theta);
		cdf[i] = total;
	}
	for (i = 0; i < accesses; i++) {
		double u = ukvm_random_unit(state) * total;
		uint64_t lo = 0, hi = n - 1;

		while (lo < hi) {	/* the first rank whose cumulative weight exceeds u */
			uint64_t mid = lo + (hi - lo) / 2;

			if (cdf[mid] > u)
				hi = mid;
			else
				lo = mid + 1;
		}
		list[i] = page[lo];
	}
	free(cdf);
	return 0;
}

int64_t ukvm_access_build(const struct ukvm_config *cfg, uint32_t vcpu, uint64_t first_gpa,
			  uint64_t pages, uint64_t touch_key, uint32_t *list, uint32_t *visits)
{
	uint64_t state = cfg->seed ^ (0x6163636573730000ULL + vcpu), n = 0, k, len;
	uint32_t *set = cfg->access == UKVM_ACCESS_ZIPF ? malloc(pages * sizeof(*set) + 1) : list;

	if (!set)
		return -ENOMEM;
	for (k = 0; k < pages; k++) {
		uint64_t at = cfg->pattern == UKVM_PATTERN_REVERSE ? pages - 1 - k : k;

		if (ukvm_access_in_set(first_gpa + at * UKVM_PAGE_SIZE, cfg->touch_percent,
				       touch_key))
			set[n++] = (uint32_t)at;
	}
	len = n;
	if (cfg->access == UKVM_ACCESS_ZIPF) {
		len = !n ? 0 : cfg->accesses ? cfg->accesses : n;
		access_shuffle(set, n, &state);	/* rank -> page */
		if (len && access_zipf_draw(set, n, cfg->zipf_theta, len, &state, list)) {
			free(set);
			return -ENOMEM;
		}
		free(set);
	} else if (cfg->pattern == UKVM_PATTERN_RANDOM) {
		access_shuffle(list, n, &state);
	}
	for (k = 0; k < len; k++)
		visits[list[k]]++;
	return (int64_t)len;
}
