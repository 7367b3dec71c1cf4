/* SPDX-License-Identifier: MIT */
/*
 * prefault: the region is filled through the guest's own mapping before the
 * vCPUs start, so nothing is left to fault: the readers resolve nothing, the
 * trace is empty, no vCPU waits, and every page still verifies (it holds the
 * data a resolver would have put there).
 */
#include "helpers.h"

static void run_prefaulted(const struct ukvm_config *cfg)
{
	struct ukvm_result res;
	uint32_t i;

	if (!ukt_run_ok(cfg, &res))
		return;
	ukt_check_result(cfg, &res);	/* expects 0 faults: cfg->prefault */
	CHECK_EQ(res.nr_fault_trace, 0);
	for (i = 0; i < res.nr_readers; i++) {
		CHECK_EQ(res.readers[i].faults, 0);
		CHECK_EQ(res.readers[i].eexist, 0);
		CHECK_EQ(res.readers[i].copies + res.readers[i].zeropages +
			 res.readers[i].continues, 0);
	}
	for (i = 0; i < res.nr_vcpus; i++) {
		CHECK_EQ(res.vcpus[i].faults, 0);
		CHECK_EQ(res.vcpus[i].blocked_ns, 0);
	}
	ukvm_result_free(&res);
}

int main(void)
{
	struct ukvm_config cfg;
	unsigned i;

	ukt_init("prefault");

	for (i = 0; i < ARRAY_SIZE(ukt_modes); i++) {
		UKT_CASE("%s on %s, 2 readers, write_percent 50, traced",
			 ukvm_uffd_mode_name(ukt_modes[i].mode),
			 ukvm_backing_name(ukt_modes[i].backing)) {
			cfg = ukt_small();
			cfg.mem_per_vcpu = MiB;
			cfg.uffd_mode = ukt_modes[i].mode;
			cfg.backing = ukt_modes[i].backing;
			cfg.readers = 2;
			cfg.write_percent = 50;
			cfg.trace_faults = true;
			cfg.prefault = true;
			run_prefaulted(&cfg);
		}
	}

	UKT_CASE("zeropage set but nothing to resolve: the pages hold the filled data") {
		cfg = ukt_small();
		cfg.mem_per_vcpu = MiB;
		cfg.resolve = UKVM_RESOLVE_ZEROPAGE;
		cfg.write_percent = 0;
		cfg.prefault = true;
		run_prefaulted(&cfg);
	}

	UKT_CASE("anonymous_thp, overlap, 2 passes") {
		cfg = ukt_small();
		cfg.mem_per_vcpu = 4 * MiB;
		cfg.backing = UKVM_BACKING_ANONYMOUS_THP;
		cfg.overlap = true;
		cfg.passes = 2;
		cfg.prefault = true;
		run_prefaulted(&cfg);
	}

	return ukt_exit();
}
