/* SPDX-License-Identifier: MIT */
/* The host's TSC against CLOCK_MONOTONIC, and the guest's TSC offset (tsc.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/tsc.h"

/* Tries per pair: the narrowest window wins (an interrupt widens one). */
#define PAIR_TRIES	16

void ukvm_tsc_clock_init(struct ukvm_tsc_clock *c)
{
	memset(c, 0, sizeof(*c));
}

int ukvm_tsc_clock_sample(struct ukvm_tsc_clock *c)
{
	struct ukvm_tsc_pair best = { .window = UINT64_MAX };
	struct timespec ts;
	int i;

	if (c->nr == c->cap) {
		uint32_t cap = c->cap ? 2 * c->cap : 64;
		struct ukvm_tsc_pair *p = realloc(c->pairs, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		c->pairs = p;
		c->cap = cap;
	}
	for (i = 0; i < PAIR_TRIES; i++) {
		uint64_t before = ukvm_tsc_read(), after;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		after = ukvm_tsc_read();
		if (after - before < best.window) {
			best.window = after - before;
			best.tsc = before + best.window / 2;
			best.ns = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
		}
	}
	c->pairs[c->nr++] = best;
	return 0;
}

/* The pair segment [i, i + 1] to interpolate tsc in (the end ones extrapolate). */
static uint32_t clock_segment(const struct ukvm_tsc_clock *c, uint64_t tsc)
{
	uint32_t lo = 0, hi = c->nr - 1;

	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (c->pairs[mid].tsc <= tsc)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

uint64_t ukvm_tsc_clock_ns(const struct ukvm_tsc_clock *c, uint64_t tsc)
{
	const struct ukvm_tsc_pair *a, *b;
	double slope;

	if (c->nr < 2)
		return 0;
	a = &c->pairs[clock_segment(c, tsc)];
	b = a + 1;
	if (b->tsc == a->tsc)
		return a->ns;
	slope = (double)(int64_t)(b->ns - a->ns) / (double)(int64_t)(b->tsc - a->tsc);
	/* Differences, not absolutes, go through the double: ns stay exact. */
	return a->ns + (uint64_t)(int64_t)((double)(int64_t)(tsc - a->tsc) * slope);
}

double ukvm_tsc_clock_cycles_per_ns(const struct ukvm_tsc_clock *c)
{
	const struct ukvm_tsc_pair *a = c->pairs, *b = c->pairs + c->nr - 1;

	if (c->nr < 2 || b->ns == a->ns)
		return 0;
	return (double)(b->tsc - a->tsc) / (double)(b->ns - a->ns);
}

double ukvm_tsc_clock_error_ns(const struct ukvm_tsc_clock *c)
{
	double per_ns = ukvm_tsc_clock_cycles_per_ns(c);
	uint64_t widest = 0;
	uint32_t i;

	for (i = 0; i < c->nr; i++)
		if (c->pairs[i].window > widest)
			widest = c->pairs[i].window;
	return per_ns > 0 ? (double)widest / 2 / per_ns : 0;
}

void ukvm_tsc_clock_destroy(struct ukvm_tsc_clock *c)
{
	free(c->pairs);
	ukvm_tsc_clock_init(c);
}

void ukvm_tsc_bracket_init(struct ukvm_tsc_bracket *b)
{
	b->lo = INT64_MIN;
	b->hi = INT64_MAX;
	b->rounds = 0;
}

bool ukvm_tsc_bracket_meet(struct ukvm_tsc_bracket *b, const struct ukvm_tsc_bracket *other)
{
	if (other->lo > b->lo)
		b->lo = other->lo;
	if (other->hi < b->hi)
		b->hi = other->hi;
	b->rounds += other->rounds;
	return b->lo <= b->hi;
}

void ukvm_tsc_bracket_add(struct ukvm_tsc_bracket *b, uint64_t guest_tsc, uint64_t before,
			  uint64_t after)
{
	/* before <= the guest's read (as host TSC) <= after, so
	 * guest_tsc - after <= offset <= guest_tsc - before. */
	int64_t lo = (int64_t)(guest_tsc - after), hi = (int64_t)(guest_tsc - before);

	if (lo > b->lo)
		b->lo = lo;
	if (hi < b->hi)
		b->hi = hi;
	b->rounds++;
}

void ukvm_tsc_offsets_init(struct ukvm_tsc_offsets *o)
{
	memset(o, 0, sizeof(*o));
}

void ukvm_tsc_offsets_add(struct ukvm_tsc_offsets *o, int64_t offset)
{
	if (!o->reads) {
		o->lo = o->hi = offset;
	} else {
		o->changes += offset != o->last;
		if (offset < o->lo)
			o->lo = offset;
		if (offset > o->hi)
			o->hi = offset;
	}
	o->last = offset;
	o->reads++;
}

bool ukvm_tsc_offsets_steady(const struct ukvm_tsc_offsets *o)
{
	return o->lo == o->hi;
}
