/* SPDX-License-Identifier: MIT */
/*
 * Latency histograms: exact below 16 ns, then four linear sub-buckets per
 * power of two (the two bits after the leading one), up to 2^40 ns, about
 * 18 minutes. Adding is a few instructions and no allocation, so a reader
 * can keep one per thread on the hot path (fio's latency buckets, coarser).
 */
#include "base/hist.h"

#define EXACT		16	/* values below this have a bucket each */
#define SUB_BITS	2

unsigned ukvm_hist_bucket(uint64_t v)
{
	unsigned msb, b;

	if (v < EXACT)
		return (unsigned)v;
	msb = 63u - (unsigned)__builtin_clzll(v);
	b = EXACT + (msb - 4) * (1u << SUB_BITS) +
	    (unsigned)((v >> (msb - SUB_BITS)) & ((1u << SUB_BITS) - 1));
	return b < UKVM_HIST_BUCKETS ? b : UKVM_HIST_BUCKETS - 1;
}

uint64_t ukvm_hist_bucket_lower(unsigned b)
{
	unsigned msb, sub;

	if (b < EXACT)
		return b;
	msb = 4 + (b - EXACT) / (1u << SUB_BITS);
	sub = (b - EXACT) % (1u << SUB_BITS);
	return ((uint64_t)((1u << SUB_BITS) | sub)) << (msb - SUB_BITS);
}

void ukvm_hist_add(struct ukvm_hist *h, uint64_t v)
{
	if (!h->count || v < h->min)
		h->min = v;
	if (v > h->max)
		h->max = v;
	h->count++;
	h->sum += v;
	h->buckets[ukvm_hist_bucket(v)]++;
}

void ukvm_hist_merge(struct ukvm_hist *h, const struct ukvm_hist *x)
{
	unsigned b;

	if (!x->count)
		return;
	if (!h->count || x->min < h->min)
		h->min = x->min;
	if (x->max > h->max)
		h->max = x->max;
	h->count += x->count;
	h->sum += x->sum;
	for (b = 0; b < UKVM_HIST_BUCKETS; b++)
		h->buckets[b] += x->buckets[b];
}
