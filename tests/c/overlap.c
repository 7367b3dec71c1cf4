/* SPDX-License-Identifier: MIT */
/*
 * Overlapped memory: every vCPU walks the whole region through one uffd.
 * Each page is resolved once; another vCPU's fault on a page already being
 * resolved comes back as EEXIST; every vCPU touched every page, and the
 * visit counts in memory say so.
 */
#include "helpers.h"

static void run_overlapped(const struct ukvm_config *cfg)
{
	struct ukvm_result res;

	if (!ukt_run_ok(cfg, &res))
		return;
	ukt_check_result(cfg, &res);
	if (cfg->uffd_mode != UKVM_UFFD_NONE)
		CHECK_EQ(res.uffds, 1);
	ukvm_result_free(&res);
}

int main(void)
{
	struct ukvm_config cfg;
	unsigned i;

	ukt_init("overlap");

	for (i = 0; i < ARRAY_SIZE(ukt_modes); i++) {
		UKT_CASE("%s on %s, 2 vCPUs over 4 MiB, 3 readers",
			 ukvm_uffd_mode_name(ukt_modes[i].mode), ukvm_backing_name(ukt_modes[i].backing)) {
			cfg = ukt_small();
			cfg.uffd_mode = ukt_modes[i].mode;
			cfg.backing = ukt_modes[i].backing;
			cfg.mem_per_vcpu = 4 * MiB;
			cfg.overlap = true;
			cfg.readers = 3;
			run_overlapped(&cfg);
		}
	}

	for (i = 0; i < ARRAY_SIZE(ukt_waits); i++) {
		UKT_CASE("%s: 3 vCPUs over 1 MiB, 2 readers", ukvm_wait_name(ukt_waits[i])) {
			cfg = ukt_small();
			cfg.vcpus = 3;
			cfg.mem_per_vcpu = MiB;
			cfg.overlap = true;
			cfg.wait = ukt_waits[i];
			cfg.readers = 2;
			run_overlapped(&cfg);
		}
	}

	UKT_CASE("overlap with single_uffd set as well") {
		cfg = ukt_small();
		cfg.overlap = true;
		cfg.single_uffd = true;
		run_overlapped(&cfg);
	}

	return ukt_exit();
}
