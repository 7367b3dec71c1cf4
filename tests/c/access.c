/* SPDX-License-Identifier: MIT */
/*
 * What the guest does at each page: write_percent of the pages are
 * written and the rest read, the same pages in every pass, and only the
 * first pass faults. The kernel says which faults were writes
 * (UFFD_PAGEFAULT_FLAG_WRITE, in the trace); verification checks every
 * page's content, the count of writes to it (passes x writers) and the
 * guest's checksum of what it read.
 */
#include "helpers.h"

/* Pages whose fault was a write, by the trace (one resolved record a page). */
static uint64_t write_faults(const struct ukvm_result *r)
{
	uint64_t i, n = 0;

	for (i = 0; i < r->nr_fault_trace; i++)
		n += !r->fault_trace[i].eexist && r->fault_trace[i].write;
	return n;
}

static void run_access(const struct ukvm_config *cfg)
{
	struct ukvm_result res;
	uint64_t faults = ukt_expected_faults(cfg), writes;
	uint32_t i, p;

	if (!ukt_run_ok(cfg, &res))
		return;
	ukt_check_result(cfg, &res);
	ukt_check_trace(cfg, &res);
	writes = write_faults(&res);
	if (cfg->write_percent == 0)
		CHECK_EQ(writes, 0);
	else if (cfg->write_percent == 100)
		CHECK_EQ(writes, faults);
	else	/* a hash of each page decides: about half, far from none or all */
		CHECK(writes * 10 >= faults * 3 && writes * 10 <= faults * 7,
		      "%" PRIu64 " of %" PRIu64 " faults were writes", writes, faults);

	/* Each pass ends after the one before it, the last with the vCPU's walk. */
	for (i = 0; i < res.nr_vcpus; i++) {
		const struct ukvm_vcpu_result *v = &res.vcpus[i];

		if (!CHECK(v->pass_end_ns))
			continue;
		CHECK_LE(v->start_ns, v->pass_end_ns[0]);
		for (p = 1; p < cfg->passes; p++)
			CHECK_LT(v->pass_end_ns[p - 1], v->pass_end_ns[p]);
		CHECK_EQ(v->pass_end_ns[cfg->passes - 1], v->end_ns);
	}
	ukvm_result_free(&res);
}

int main(void)
{
	static const uint32_t percents[] = { 0, 50, 100 };
	static const struct {
		enum ukvm_uffd_mode mode;
		enum ukvm_backing backing;
	} modes[] = {
		{ UKVM_UFFD_MISSING, UKVM_BACKING_ANONYMOUS },
		{ UKVM_UFFD_MINOR, UKVM_BACKING_SHMEM },
	};
	struct ukvm_config cfg;
	unsigned i, m;

	ukt_init("access");

	for (m = 0; m < ARRAY_SIZE(modes); m++) {
		for (i = 0; i < ARRAY_SIZE(percents); i++) {
			UKT_CASE("%s on %s, write_percent %u, random order",
				 ukvm_uffd_mode_name(modes[m].mode),
				 ukvm_backing_name(modes[m].backing), percents[i]) {
				cfg = ukt_small();
				cfg.mem_per_vcpu = MiB;
				cfg.uffd_mode = modes[m].mode;
				cfg.backing = modes[m].backing;
				cfg.write_percent = percents[i];
				cfg.pattern = UKVM_PATTERN_RANDOM;
				cfg.seed = 1 + i;
				cfg.trace_faults = true;
				run_access(&cfg);
			}
		}
	}

	for (i = 0; i < ARRAY_SIZE(percents); i++) {
		UKT_CASE("write_percent %u, 3 passes: each page written or read every pass",
			 percents[i]) {
			cfg = ukt_small();
			cfg.mem_per_vcpu = MiB;
			cfg.write_percent = percents[i];
			cfg.passes = 3;
			cfg.trace_faults = true;
			run_access(&cfg);
		}
	}

	UKT_CASE("overlap, 2 passes: every page written 4 times, faulted once") {
		cfg = ukt_small();
		cfg.mem_per_vcpu = MiB;
		cfg.overlap = true;
		cfg.readers = 2;
		cfg.passes = 2;
		cfg.trace_faults = true;
		run_access(&cfg);
	}

	UKT_CASE("write_percent 50 without userfaultfd, 2 passes") {
		cfg = ukt_small();
		cfg.uffd_mode = UKVM_UFFD_NONE;
		cfg.write_percent = 50;
		cfg.passes = 2;
		run_access(&cfg);
	}

	return ukt_exit();
}
