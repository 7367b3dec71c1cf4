/* SPDX-License-Identifier: MIT */
/*
 * Overlapped memory: every vCPU walks the whole region through one uffd.
 * Each page is resolved once; another vCPU's fault on a page already being
 * resolved comes back as EEXIST; every vCPU touched every page, and the
 * visit counts in memory say so.
 */
#include "helpers.h"

static const struct {
	enum ukvm_uffd_mode mode;
	enum ukvm_backing backing;
} modes[] = {
	{ UKVM_UFFD_MISSING, UKVM_BACKING_ANONYMOUS },
	{ UKVM_UFFD_MISSING, UKVM_BACKING_SHMEM },
	{ UKVM_UFFD_MINOR, UKVM_BACKING_SHMEM },
	{ UKVM_UFFD_NONE, UKVM_BACKING_ANONYMOUS },
	{ UKVM_UFFD_NONE, UKVM_BACKING_SHMEM },
};

static const enum ukvm_wait waits[] = {
	UKVM_WAIT_POLL, UKVM_WAIT_EPOLL, UKVM_WAIT_EPOLL_EXCLUSIVE, UKVM_WAIT_READ,
};

static void run_case(const struct ukvm_config *cfg)
{
	struct ukvm_result res;

	if (!ukt_run_ok(cfg, &res))
		return;
	ukt_check_result(cfg, &res);
	if (cfg->uffd_mode != UKVM_UFFD_NONE)
		CHECK_EQ(res.nr_uffds, 1);
	ukvm_result_free(&res);
}

int main(void)
{
	struct ukvm_config cfg;
	unsigned i;

	ukt_init("overlap");

	for (i = 0; i < ARRAY_SIZE(modes); i++) {
		UKT_CASE("%s on %s, 2 vCPUs over 4 MiB, 3 readers",
			 ukvm_uffd_mode_name(modes[i].mode), ukvm_backing_name(modes[i].backing)) {
			cfg = ukt_small();
			cfg.uffd_mode = modes[i].mode;
			cfg.backing = modes[i].backing;
			cfg.mem_per_vcpu = 4 * MiB;
			cfg.overlap = true;
			cfg.readers = 3;
			run_case(&cfg);
		}
	}

	for (i = 0; i < ARRAY_SIZE(waits); i++) {
		UKT_CASE("%s: 3 vCPUs over 1 MiB, 2 readers", ukvm_wait_name(waits[i])) {
			cfg = ukt_small();
			cfg.vcpus = 3;
			cfg.mem_per_vcpu = MiB;
			cfg.overlap = true;
			cfg.wait = waits[i];
			cfg.readers = 2;
			run_case(&cfg);
		}
	}

	UKT_CASE("overlap with single_uffd set as well") {
		cfg = ukt_small();
		cfg.overlap = true;
		cfg.single_uffd = true;
		run_case(&cfg);
	}

	return ukt_exit();
}
