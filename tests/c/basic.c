/* SPDX-License-Identifier: MIT */
/*
 * Every backing and uffd mode, with one uffd per vCPU and one for all:
 * every page faults exactly once, through the uffd that covers it, and
 * verifies; without userfaultfd there are no readers at all.
 */
#include "helpers.h"

int main(void)
{
	struct ukvm_config cfg;
	unsigned i;
	int single;

	ukt_init("basic");

	for (i = 0; i < ARRAY_SIZE(ukt_modes); i++) {
		for (single = 0; single <= 1; single++) {
			if (single && ukt_modes[i].mode == UKVM_UFFD_NONE)
				continue;
			UKT_CASE("%s on %s, %s", ukvm_uffd_mode_name(ukt_modes[i].mode),
				 ukvm_backing_name(ukt_modes[i].backing),
				 single ? "single uffd" : "uffd per vCPU") {
				cfg = ukt_small();
				cfg.uffd_mode = ukt_modes[i].mode;
				cfg.backing = ukt_modes[i].backing;
				cfg.single_uffd = single;
				cfg.readers = 2;
				ukt_run_checked(&cfg);
			}
		}
	}

	UKT_CASE("one vCPU, 4 MiB") {
		cfg = ukt_small();
		cfg.vcpus = 1;
		cfg.mem_per_vcpu = 4 * MiB;
		ukt_run_checked(&cfg);
	}

	UKT_CASE("three vCPUs of 1 MiB + 4 KiB, single uffd") {
		/* A region that is not a multiple of 2 MiB, split in odd pieces. */
		cfg = ukt_small();
		cfg.vcpus = 3;
		cfg.mem_per_vcpu = MiB + PAGE;
		cfg.single_uffd = true;
		cfg.readers = 3;
		ukt_run_checked(&cfg);
	}

	UKT_CASE("a one-page region") {
		cfg = ukt_small();
		cfg.vcpus = 1;
		cfg.mem_per_vcpu = PAGE;
		ukt_run_checked(&cfg);
	}

	UKT_CASE("guest_work between accesses") {
		cfg = ukt_small();
		cfg.guest_work = 3;
		ukt_run_checked(&cfg);
	}

	/* The schema's range holds whatever the mode: one rule, as Python has it. */
	UKT_CASE("readers = 0 is refused without userfaultfd too") {
		cfg = ukt_small();
		cfg.uffd_mode = UKVM_UFFD_NONE;
		cfg.readers = 0;
		ukt_run_fails(&cfg, UKVM_ERR_CONFIG, -1, "readers: must be between 1 and", NULL);
	}

	UKT_CASE("a timeout that is not reached") {
		cfg = ukt_small();
		cfg.timeout_ns = 60 * NSEC_PER_SEC;
		ukt_run_checked(&cfg);
	}

	return ukt_exit();
}
