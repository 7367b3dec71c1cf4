/* SPDX-License-Identifier: MIT */
/*
 * Prefetch: readahead on readers and vCPU resolvers, the background pusher
 * (unlimited and paced) and replay, with several vCPUs on one region so
 * that prefetch and faults race; every run verifies and every page came
 * once, by a fault or by prefetch. A paced pusher still running when the
 * run fails or times out is stopped and joined (ASan: nothing leaked; TSan:
 * the resident map and the pusher's counters are shared without races).
 * Bad prefetch configs are refused with the field named.
 */
#include "helpers.h"

static uint64_t faults_of(const struct ukvm_result *r)
{
	uint64_t n = 0;
	uint32_t i;

	for (i = 0; i < r->nr_readers; i++)
		n += r->readers[i].faults;
	return n;
}

/*
 * Runs cfg with the touch order asked for: verified, each page once (fault
 * or prefetch), the touch order a set of pages.
 */
static void run_prefetch(const struct ukvm_config *asked, uint64_t *faults, uint64_t *pushed)
{
	struct ukvm_config copy = *asked, *cfg = &copy;
	uint64_t region = cfg->overlap ? cfg->mem_per_vcpu : cfg->mem_per_vcpu * cfg->vcpus;
	uint64_t pages = region / ukvm_backing_page_size(cfg->backing), i;
	struct ukvm_result res;
	uint8_t *seen;

	copy.record_touch_order = true;
	*faults = *pushed = 0;
	if (!ukt_run_ok(cfg, &res))
		return;
	CHECK(res.verified, "%s: %s", ukt_cfg_str(cfg), res.verify_message);
	CHECK(res.resident_tracked);
	*faults = faults_of(&res);
	*pushed = res.pushed_pages;
	CHECK_EQ(*faults + res.prefetched_pages, pages);
	CHECK_EQ(res.touched_units, pages);
	CHECK_EQ(res.wasted_prefetch_pages, 0);
	/*
	 * From the first KVM_RUN (0 if the pusher finished before it), within
	 * the run: stamped by the installer after its ioctl returned, which a
	 * descheduled installer does after the vCPU it woke has finished (3 ms
	 * late seen under TSan in an emulated guest), so within a slack.
	 */
	CHECK(res.resident_ns != UKVM_RESULT_NONE);
	CHECK_LE(res.resident_ns, res.threads_joined_ns - res.start_ns + 100 * NSEC_PER_MSEC);
	CHECK_EQ(res.faults_avoided, res.touched_units - res.faulted_pages);
	CHECK_EQ(res.faults, *faults);
	CHECK_EQ(res.nr_touch_order, *faults);
	seen = calloc(pages, 1);
	for (i = 0; seen && i < res.nr_touch_order; i++) {
		CHECK(res.touch_order[i] < pages && !seen[res.touch_order[i]]);
		if (res.touch_order[i] < pages)
			seen[res.touch_order[i]] = 1;
	}
	free(seen);
	ukvm_result_free(&res);
}

int main(void)
{
	static const enum ukvm_resolver resolvers[] = { UKVM_RESOLVER_READERS, UKVM_RESOLVER_VCPU };
	struct ukvm_config cfg;
	uint64_t faults, pushed, order[64];
	unsigned i;

	ukt_init("prefetch");

	for (i = 0; i < ARRAY_SIZE(resolvers); i++) {
		UKT_CASE("readahead of 8, %s, 1 vCPU", ukvm_resolver_name(resolvers[i])) {
			cfg = ukt_small();
			cfg.vcpus = 1;
			cfg.resolver = resolvers[i];
			cfg.prefetch = UKVM_PREFETCH_READAHEAD;
			run_prefetch(&cfg, &faults, &pushed);
			/* sequential: a fault per 1 + 8 pages */
			CHECK_LE(faults, 2 * MiB / PAGE / 9 + 8);
		}
		UKT_CASE("readahead of 4, %s, 3 vCPUs overlapped",
			 ukvm_resolver_name(resolvers[i])) {
			cfg = ukt_small();
			cfg.vcpus = 3;
			cfg.overlap = true;
			cfg.readers = resolvers[i] == UKVM_RESOLVER_READERS ? 2 : 1;
			cfg.resolver = resolvers[i];
			cfg.prefetch = UKVM_PREFETCH_READAHEAD;
			cfg.prefetch_pages = 4;
			run_prefetch(&cfg, &faults, &pushed);
		}
	}

	UKT_CASE("background, unlimited, 2 vCPUs with a uffd each") {
		cfg = ukt_small();
		cfg.prefetch = UKVM_PREFETCH_BACKGROUND;
		run_prefetch(&cfg, &faults, &pushed);
		CHECK(pushed > 0);
	}
	UKT_CASE("background at 20 Mbit/s, 3 vCPUs overlapped, 2 readers") {
		cfg = ukt_small();
		cfg.vcpus = 3;
		cfg.overlap = true;
		cfg.readers = 2;
		cfg.prefetch = UKVM_PREFETCH_BACKGROUND;
		cfg.prefetch_bandwidth_mbps = 20;
		run_prefetch(&cfg, &faults, &pushed);
	}
	UKT_CASE("background on anonymous_thp") {
		cfg = ukt_small();
		cfg.vcpus = 1;
		cfg.backing = UKVM_BACKING_ANONYMOUS_THP;
		cfg.mem_per_vcpu = 8 * MiB;
		cfg.prefetch = UKVM_PREFETCH_BACKGROUND;
		run_prefetch(&cfg, &faults, &pushed);
	}
	UKT_CASE("replay of 64 pages backwards, vCPU resolvers") {
		cfg = ukt_small();
		cfg.resolver = UKVM_RESOLVER_VCPU;
		for (i = 0; i < ARRAY_SIZE(order); i++)
			order[i] = 2 * ARRAY_SIZE(order) - 1 - 2 * i;
		cfg.prefetch = UKVM_PREFETCH_REPLAY;
		cfg.replay = order;
		cfg.nr_replay = ARRAY_SIZE(order);
		run_prefetch(&cfg, &faults, &pushed);
		CHECK_LE(pushed, ARRAY_SIZE(order));
	}

	UKT_CASE("a paced pusher when a resolve fails") {
		cfg = ukt_small();
		cfg.prefetch = UKVM_PREFETCH_BACKGROUND;
		cfg.prefetch_bandwidth_mbps = 1;
		cfg.delay_us = 1000;
		cfg.inject = UKVM_INJECT_RESOLVE_EIO;
		cfg.inject_after = 20;
		ukt_run_fails(&cfg, UKVM_ERR_RUN, EIO, NULL, NULL);
	}
	UKT_CASE("a paced pusher at the time limit") {
		cfg = ukt_small();
		cfg.prefetch = UKVM_PREFETCH_BACKGROUND;
		cfg.prefetch_bandwidth_mbps = 1;
		cfg.delay_us = 20000;
		cfg.timeout_ns = 200 * NSEC_PER_MSEC;
		ukt_run_fails(&cfg, UKVM_ERR_TIMEOUT, -1, NULL, NULL);
	}

	UKT_CASE("bad prefetch configs name their field") {
		cfg = ukt_small();
		cfg.prefetch = UKVM_PREFETCH_READAHEAD;
		cfg.resolve = UKVM_RESOLVE_ZEROPAGE;
		ukt_run_fails(&cfg, UKVM_ERR_CONFIG, -1, "prefetch: 'readahead' installs", NULL);
		cfg = ukt_small();
		cfg.prefetch = UKVM_PREFETCH_REPLAY;
		ukt_run_fails(&cfg, UKVM_ERR_CONFIG, -1, "replay_from: prefetch='replay' needs", NULL);
		order[0] = 1;
		order[1] = 1;
		cfg.replay = order;
		cfg.nr_replay = 2;
		ukt_run_fails(&cfg, UKVM_ERR_CONFIG, -1, "replay_from: entry 1 repeats page 1", NULL);
		order[1] = 2 * 2 * MiB / PAGE;
		ukt_run_fails(&cfg, UKVM_ERR_CONFIG, -1, "beyond the region's 1024 pages", NULL);
		cfg = ukt_small();
		cfg.prefetch = UKVM_PREFETCH_READAHEAD;
		cfg.prefetch_pages = 0;
		ukt_run_fails(&cfg, UKVM_ERR_CONFIG, -1, "prefetch_pages:", NULL);
	}

	return ukt_exit();
}
