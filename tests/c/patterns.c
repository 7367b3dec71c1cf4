/* SPDX-License-Identifier: MIT */
/*
 * The guest's walk order, read from the fault trace. A vCPU waits for each
 * fault to be resolved before it touches the next page, so the order in
 * which the readers read one vCPU's faults is the order its guest touched
 * them: up the region for sequential, down for reverse, and for random a
 * permutation of the pages that depends on the seed alone.
 */
#include "helpers.h"

#define PAGES	256	/* 1 MiB per vCPU */

static struct ukvm_config traced(enum ukvm_pattern pattern, uint64_t seed)
{
	struct ukvm_config cfg = ukt_small();

	cfg.vcpus = 1;
	cfg.mem_per_vcpu = PAGES * PAGE;
	cfg.pattern = pattern;
	cfg.seed = seed;
	cfg.trace_faults = true;
	return cfg;
}

/* The pages vCPU `vcpu` faulted on, in order, as page indexes in its slice. */
static uint64_t walk(const struct ukvm_config *cfg, const struct ukvm_result *r, uint32_t vcpu,
		     uint64_t *order, uint64_t max)
{
	uint64_t i, n = 0;

	for (i = 0; i < r->nr_fault_trace && n < max; i++)
		if (r->fault_trace[i].vcpu == (int32_t)vcpu)
			order[n++] = (r->fault_trace[i].gpa - r->region_gpa) / PAGE -
				     (uint64_t)vcpu * (cfg->mem_per_vcpu / PAGE);
	return n;
}

/* Steps from a page to the next one up: a random walk has a handful. */
static uint64_t ascents(const uint64_t *order, uint64_t n)
{
	uint64_t i, k = 0;

	for (i = 1; i < n; i++)
		k += order[i] == order[i - 1] + 1;
	return k;
}

/* Runs cfg; fills order[] with vCPU 0's walk. False if the case cannot go on. */
static bool run_walk(const struct ukvm_config *cfg, uint64_t *order, uint64_t pages)
{
	struct ukvm_result res;
	bool ok;

	if (!ukt_run_ok(cfg, &res))
		return false;
	ukt_check_result(cfg, &res);
	ukt_check_trace(cfg, &res);
	ok = CHECK_EQ(walk(cfg, &res, 0, order, pages), pages);
	ukvm_result_free(&res);
	return ok;
}

int main(void)
{
	static uint64_t a[PAGES + 64], b[PAGES + 64], c[PAGES + 64];
	struct ukvm_config cfg;
	uint64_t i, same;

	ukt_init("patterns");

	UKT_CASE("sequential: up the region, one page after the other") {
		cfg = traced(UKVM_PATTERN_SEQUENTIAL, 0);
		if (run_walk(&cfg, a, PAGES))
			for (i = 0; i < PAGES; i++)
				if (!CHECK(a[i] == i, "step %" PRIu64 " touched page %" PRIu64, i, a[i]))
					break;
	}

	UKT_CASE("reverse: down the region from its last page") {
		cfg = traced(UKVM_PATTERN_REVERSE, 0);
		if (run_walk(&cfg, a, PAGES))
			for (i = 0; i < PAGES; i++)
				if (!CHECK(a[i] == PAGES - 1 - i, "step %" PRIu64 " touched page %"
					   PRIu64, i, a[i]))
					break;
	}

	UKT_CASE("random: every page once, in an order set by the seed") {
		/* ukt_check_trace() has checked that each walk is a permutation. */
		cfg = traced(UKVM_PATTERN_RANDOM, 7);
		if (run_walk(&cfg, a, PAGES) && run_walk(&cfg, b, PAGES)) {
			CHECK(memcmp(a, b, sizeof(uint64_t) * PAGES) == 0,
			      "the same seed walked in another order");
			CHECK_LT(ascents(a, PAGES), PAGES / 8);
			CHECK(a[0] != 0 || a[1] != 1, "starts like sequential");
			cfg.seed = 8;
			if (run_walk(&cfg, c, PAGES)) {
				for (i = 0, same = 0; i < PAGES; i++)
					same += a[i] == c[i];
				CHECK_LT(same, PAGES / 8);
			}
		}
	}

	UKT_CASE("random over 300 pages: not a power of two, still each page once") {
		cfg = traced(UKVM_PATTERN_RANDOM, 3);
		cfg.mem_per_vcpu = 300 * PAGE;
		if (run_walk(&cfg, a, 300))
			CHECK_LT(ascents(a, 300), 300 / 8);
	}

	for (enum ukvm_pattern p = 0; p < UKVM_PATTERN__COUNT; p++) {
		UKT_CASE("%s, 2 vCPUs: each walks its own slice in its own order",
			 ukvm_pattern_name(p)) {
			struct ukvm_result res;
			uint32_t v;

			cfg = traced(p, 5);
			cfg.vcpus = 2;
			cfg.readers = 2;
			if (ukt_run_ok(&cfg, &res)) {
				ukt_check_result(&cfg, &res);
				ukt_check_trace(&cfg, &res);
				for (v = 0; v < 2; v++) {
					uint64_t *o = v ? b : a;

					if (!CHECK_EQ(walk(&cfg, &res, v, o, PAGES), PAGES))
						continue;
					if (p == UKVM_PATTERN_SEQUENTIAL)
						CHECK(o[0] == 0 && o[PAGES - 1] == PAGES - 1 &&
						      ascents(o, PAGES) == PAGES - 1, "vCPU %u", v);
					else if (p == UKVM_PATTERN_REVERSE)
						CHECK(o[0] == PAGES - 1 && o[PAGES - 1] == 0 &&
						      ascents(o, PAGES) == 0, "vCPU %u", v);
					else
						CHECK_LT(ascents(o, PAGES), PAGES / 8);
				}
				/* Each vCPU's random order has keys of its own. */
				if (p == UKVM_PATTERN_RANDOM)
					CHECK(memcmp(a, b, sizeof(uint64_t) * PAGES) != 0);
				ukvm_result_free(&res);
			}
		}
	}

	UKT_CASE("3 passes of reverse: only the first one faults") {
		cfg = traced(UKVM_PATTERN_REVERSE, 0);
		cfg.passes = 3;
		if (run_walk(&cfg, a, PAGES))
			CHECK(a[0] == PAGES - 1 && ascents(a, PAGES) == 0);
	}

	return ukt_exit();
}
