/* SPDX-License-Identifier: MIT */
/*
 * stats full and stats basic. Full: every fault recorded (trace_faults hands
 * the records back) and attributed to the vCPU whose slice holds the page;
 * latencies and blocked time hold the readers' delay. Basic: the readers
 * count faults and nothing else: no records, no clocks, no latencies, no
 * blocked time, for every way of waiting.
 */
#include "helpers.h"

static void check_basic(const struct ukvm_result *r)
{
	uint32_t i;

	CHECK(!r->stats_full);
	CHECK_EQ(r->nr_fault_trace, 0);
	CHECK(r->fault_trace == NULL);
	CHECK_EQ(r->blocktime_ns, 0);
	for (i = 0; i < r->nr_vcpus; i++) {
		CHECK_EQ(r->vcpus[i].faults, 0);
		CHECK_EQ(r->vcpus[i].blocked_ns, 0);
		CHECK_EQ(r->vcpus[i].service_latency.count, 0);
	}
	for (i = 0; i < r->nr_readers; i++) {
		CHECK_EQ(r->readers[i].service_latency.count, 0);
		CHECK_EQ(r->readers[i].busy_ns, 0);
	}
}

int main(void)
{
	struct ukvm_config cfg;
	struct ukvm_result res;
	uint32_t i;

	ukt_init("stats");

	UKT_CASE("full, traced: 2 vCPUs, a uffd each, 2 readers each") {
		cfg = ukt_small();
		cfg.mem_per_vcpu = MiB;
		cfg.readers = 2;
		cfg.trace_faults = true;
		if (ukt_run_ok(&cfg, &res)) {
			ukt_check_result(&cfg, &res);
			ukt_check_trace(&cfg, &res);
			CHECK(res.stats_full);
			CHECK_EQ(res.nr_fault_trace, 2 * MiB / PAGE);
			for (i = 0; i < res.nr_readers; i++)
				CHECK_EQ(res.readers[i].service_latency.count,
					 res.readers[i].faults + res.readers[i].eexist);
			ukvm_result_free(&res);
		}
	}

	UKT_CASE("full, traced: 3 vCPUs overlapping on one uffd, 3 readers") {
		cfg = ukt_small();
		cfg.vcpus = 3;
		cfg.mem_per_vcpu = MiB;
		cfg.overlap = true;
		cfg.readers = 3;
		cfg.trace_faults = true;
		if (ukt_run_ok(&cfg, &res)) {
			ukt_check_result(&cfg, &res);
			ukt_check_trace(&cfg, &res);
			ukvm_result_free(&res);
		}
	}

	UKT_CASE("full, not traced: no records handed back, each vCPU's faults attributed") {
		cfg = ukt_small();
		cfg.mem_per_vcpu = MiB;
		cfg.single_uffd = true;
		cfg.readers = 2;
		if (ukt_run_ok(&cfg, &res)) {
			ukt_check_result(&cfg, &res);
			CHECK_EQ(res.nr_fault_trace, 0);
			CHECK(res.fault_trace == NULL);
			for (i = 0; i < res.nr_vcpus; i++)
				CHECK_EQ(res.vcpus[i].faults, MiB / PAGE);
			ukvm_result_free(&res);
		}
	}

	UKT_CASE("full: a reader's 1 ms delay shows in latency and blocked time") {
		cfg = ukt_small();
		cfg.vcpus = 1;
		cfg.mem_per_vcpu = 16 * PAGE;
		cfg.delay_us = 1000;
		if (ukt_run_ok(&cfg, &res)) {
			const struct ukvm_vcpu_result *v = &res.vcpus[0];

			ukt_check_result(&cfg, &res);
			CHECK_EQ(v->faults, 16);
			CHECK_EQ(v->service_latency.count, 16);
			CHECK_GE(v->service_latency.min, NSEC_PER_MSEC);
			CHECK_GE(res.readers[0].service_latency.min, NSEC_PER_MSEC);
			CHECK_GE(res.readers[0].busy_ns, 16 * NSEC_PER_MSEC);
			/* One vCPU: blocked while its fault waits, within its own run. */
			CHECK_GE(v->blocked_ns, 16 * NSEC_PER_MSEC);
			CHECK_LE(v->blocked_ns, v->end_ns - v->start_ns);
			CHECK_GE(res.blocktime_ns, 16 * NSEC_PER_MSEC);
			ukvm_result_free(&res);
		}
	}

	for (i = 0; i < ARRAY_SIZE(ukt_waits); i++) {
		UKT_CASE("basic, %s: counters only", ukvm_wait_name(ukt_waits[i])) {
			cfg = ukt_small();
			cfg.mem_per_vcpu = MiB;
			cfg.stats = UKVM_STATS_BASIC;
			cfg.wait = ukt_waits[i];
			cfg.readers = 2;
			if (ukt_run_ok(&cfg, &res)) {
				ukt_check_result(&cfg, &res);	/* the readers still count */
				check_basic(&res);
				ukvm_result_free(&res);
			}
		}
	}

	UKT_CASE("basic, MINOR on shmem, overlap, single uffd, 1 ms delay") {
		cfg = ukt_small();
		cfg.mem_per_vcpu = 16 * PAGE;
		cfg.backing = UKVM_BACKING_SHMEM;
		cfg.uffd_mode = UKVM_UFFD_MINOR;
		cfg.overlap = true;
		cfg.readers = 2;
		cfg.delay_us = 1000;
		cfg.stats = UKVM_STATS_BASIC;
		if (ukt_run_ok(&cfg, &res)) {
			ukt_check_result(&cfg, &res);
			check_basic(&res);
			ukvm_result_free(&res);
		}
	}

	return ukt_exit();
}
