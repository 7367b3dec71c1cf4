/* SPDX-License-Identifier: MIT */
/*
 * guest_timing: the guest times every access with rdtsc, into a log2
 * histogram of cycles and their sum. Every access of every pass is counted
 * once; the sum lies within what the histogram's buckets allow; an access
 * that waits for a reader that sleeps 1 ms before resolving takes at least
 * 1 ms of the guest's TSC (a lower bound, not a speed test). Without
 * guest_timing nothing is counted.
 */
#include "helpers.h"

#define BUCKETS	64

static uint64_t accesses(const struct ukvm_vcpu_result *v)
{
	uint64_t n = 0;
	unsigned b;

	for (b = 0; b < BUCKETS; b++)
		n += v->access_hist[b];
	return n;
}

/* Bucket b holds accesses of 2^b to 2^(b+1) - 1 cycles (bucket 0: 0 and 1). */
static void check_sum_within_buckets(const struct ukvm_vcpu_result *v, uint32_t index)
{
	unsigned __int128 low = 0, high = 0;
	unsigned b;

	for (b = 0; b < BUCKETS; b++) {
		low += (unsigned __int128)v->access_hist[b] * (b ? 1ULL << b : 0);
		high += (unsigned __int128)v->access_hist[b] * ((b + 1 < 64 ? 1ULL << (b + 1) : ~0ULL) - 1);
	}
	CHECK(low <= v->access_cycles && v->access_cycles <= high,
	      "vCPU %u: %" PRIu64 " cycles, buckets allow %" PRIu64 "..%" PRIu64, index,
	      v->access_cycles, (uint64_t)low, (uint64_t)high);
}

int main(void)
{
	struct ukvm_config cfg;
	struct ukvm_result res;
	uint32_t i;

	ukt_init("guest_timing");

	UKT_CASE("2 vCPUs, 2 passes: every access counted, the sum within its buckets") {
		cfg = ukt_small();
		cfg.mem_per_vcpu = MiB;
		cfg.passes = 2;
		cfg.write_percent = 50;
		cfg.guest_timing = true;
		if (ukt_run_ok(&cfg, &res)) {
			ukt_check_result(&cfg, &res);
			CHECK_GE(res.tsc_khz, 1);
			for (i = 0; i < res.nr_vcpus; i++) {
				CHECK_EQ(accesses(&res.vcpus[i]), 2 * MiB / PAGE);
				CHECK_GE(res.vcpus[i].access_cycles, 1);
				check_sum_within_buckets(&res.vcpus[i], i);
			}
			ukvm_result_free(&res);
		}
	}

	UKT_CASE("a 1 ms resolver: each faulting access takes at least 1 ms of TSC") {
		cfg = ukt_small();
		cfg.vcpus = 1;
		cfg.mem_per_vcpu = 16 * PAGE;
		cfg.delay_us = 1000;
		cfg.guest_timing = true;
		if (ukt_run_ok(&cfg, &res)) {
			const struct ukvm_vcpu_result *v = &res.vcpus[0];
			uint64_t per_ms = res.tsc_khz, b;

			ukt_check_result(&cfg, &res);
			CHECK_EQ(accesses(v), 16);
			CHECK_GE(v->access_cycles, 16 * per_ms);
			check_sum_within_buckets(v, 0);
			/* No access in a bucket whose every value is below 1 ms. */
			for (b = 0; b < BUCKETS && (2ULL << b) <= per_ms; b++)
				CHECK(v->access_hist[b] == 0, "%" PRIu64 " accesses of %llu..%llu "
				      "cycles, under 1 ms (%" PRIu64 " cycles)", v->access_hist[b],
				      1ULL << b, (2ULL << b) - 1, per_ms);
			ukvm_result_free(&res);
		}
	}

	UKT_CASE("off: nothing is counted") {
		cfg = ukt_small();
		cfg.mem_per_vcpu = MiB;
		if (ukt_run_ok(&cfg, &res)) {
			ukt_check_result(&cfg, &res);
			for (i = 0; i < res.nr_vcpus; i++) {
				CHECK_EQ(accesses(&res.vcpus[i]), 0);
				CHECK_EQ(res.vcpus[i].access_cycles, 0);
			}
			ukvm_result_free(&res);
		}
	}

	return ukt_exit();
}
