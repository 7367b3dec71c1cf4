/* SPDX-License-Identifier: MIT */
/*
 * White-box cases of the pusher's range lookup (csrc/uffd/pusher.c): every
 * page of ranges of unequal sizes, and the pages past them, against a
 * brute-force walk over the ranges. The pusher looks a page's uffd up for
 * every page it installs, so the lookup is a binary search; a run cannot
 * show a page it silently skipped (a fault brings it instead).
 */
#include "helpers.h"
#undef NSEC_PER_MSEC	/* base/util.h has its own, the same */
#undef NSEC_PER_SEC
#undef ARRAY_SIZE
#include "base/util.h"
#include "uffd/pusher.h"

/* The walk the pusher made before: the range at, and the offset there. */
static int brute(const struct ukvm_pusher_range *ranges, uint32_t n, uint64_t page_size,
		 uint64_t page, uint64_t *off)
{
	uint64_t at = page * page_size;
	uint32_t u;

	for (u = 0; u < n; u++) {
		if (at < ranges[u].size) {
			*off = at;
			return (int)u;
		}
		at -= ranges[u].size;
	}
	return -1;
}

static void check_all(struct ukvm_pusher_range *ranges, uint32_t n, uint64_t page_size)
{
	uint64_t page, total = 0, off = 0, want_off = 0;
	struct ukvm_pusher_range *got;
	uint32_t u, bad = 0;
	int want;

	ukvm_pusher_number_ranges(ranges, n, page_size);
	for (u = 0; u < n; u++)
		total += ranges[u].size / page_size;
	for (page = 0; page < total + 3; page++) {
		want = brute(ranges, n, page_size, page, &want_off);
		got = ukvm_pusher_find(ranges, n, page_size, page, &off);
		if ((want < 0) != (got == NULL) ||
		    (got && (got != &ranges[want] || off != want_off))) {
			if (bad++ < 5)
				CHECK(false, "page %" PRIu64 ": range %d at %" PRIu64 ", found %td at %"
				      PRIu64, page, want, want_off, got ? got - ranges : -1, off);
		}
	}
	CHECK_EQ(bad, 0);
}

int main(void)
{
	struct ukvm_pusher_range ranges[9];
	uint32_t n, u;

	ukt_init("pusher_ranges");

	for (n = 1; n <= ARRAY_SIZE(ranges); n++) {
		UKT_CASE("%u ranges of unequal sizes, 4 KiB pages", n) {
			for (u = 0; u < n; u++)
				ranges[u] = (struct ukvm_pusher_range){ .size = (u % 3 + 1) * 5 * 4096 };
			check_all(ranges, n, 4096);
		}
	}
	UKT_CASE("64 equal ranges of one 2 MiB page each") {
		struct ukvm_pusher_range many[64];

		for (u = 0; u < ARRAY_SIZE(many); u++)
			many[u] = (struct ukvm_pusher_range){ .size = 2 << 20 };
		check_all(many, ARRAY_SIZE(many), 2 << 20);
	}
	UKT_CASE("no ranges: nothing is found") {
		uint64_t off = 0;

		CHECK(!ukvm_pusher_find(ranges, 0, 4096, 0, &off), "a page in no range");
	}
	return ukt_exit();
}
