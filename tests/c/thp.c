/* SPDX-License-Identifier: MIT */
/*
 * Anonymous memory with transparent huge pages: faults are resolved 2 MiB
 * at a time, so each 2 MiB piece of the region faults once, whichever of
 * its 512 pages the guest touches first (the trace says which pieces), and
 * the guest still touches, and the host still verifies, every 4 KiB page.
 * UFFDIO_COPY, UFFDIO_ZEROPAGE and UFFDIO_MOVE of 2 MiB, one reader and
 * several, guest mappings of 4 KiB and 2 MiB, and no userfaultfd at all.
 */
#include "helpers.h"

int main(void)
{
	struct ukvm_config cfg;

	ukt_init("thp");

	UKT_CASE("copy, 2 vCPUs x 4 MiB, a reader per uffd") {
		cfg = ukt_small();
		cfg.mem_per_vcpu = 4 * MiB;
		cfg.trace_faults = true;
		ukt_run_2m_pages(&cfg, UKVM_BACKING_ANONYMOUS_THP);
	}

	UKT_CASE("copy, single uffd, 3 readers, random order, write_percent 50") {
		cfg = ukt_small();
		cfg.mem_per_vcpu = 4 * MiB;
		cfg.single_uffd = true;
		cfg.readers = 3;
		cfg.pattern = UKVM_PATTERN_RANDOM;
		cfg.write_percent = 50;
		cfg.trace_faults = true;
		ukt_run_2m_pages(&cfg, UKVM_BACKING_ANONYMOUS_THP);
	}

	UKT_CASE("zeropage, reverse order, 2 readers per uffd") {
		cfg = ukt_small();
		cfg.mem_per_vcpu = 4 * MiB;
		cfg.resolve = UKVM_RESOLVE_ZEROPAGE;
		cfg.pattern = UKVM_PATTERN_REVERSE;
		cfg.readers = 2;
		cfg.trace_faults = true;
		ukt_run_2m_pages(&cfg, UKVM_BACKING_ANONYMOUS_THP);
	}

	UKT_CASE("copy, overlap: 2 vCPUs race for each 2 MiB page") {
		cfg = ukt_small();
		cfg.mem_per_vcpu = 4 * MiB;
		cfg.overlap = true;
		cfg.readers = 2;
		cfg.trace_faults = true;
		ukt_run_2m_pages(&cfg, UKVM_BACKING_ANONYMOUS_THP);
	}

	UKT_CASE("move, 2 readers per uffd, write_percent 50") {
		cfg = ukt_small();
		cfg.mem_per_vcpu = 4 * MiB;
		cfg.resolve = UKVM_RESOLVE_MOVE;
		cfg.readers = 2;
		cfg.write_percent = 50;
		cfg.trace_faults = true;
		ukt_run_2m_pages(&cfg, UKVM_BACKING_ANONYMOUS_THP);
	}

	UKT_CASE("move, overlap: 2 vCPUs race for each 2 MiB page") {
		cfg = ukt_small();
		cfg.mem_per_vcpu = 4 * MiB;
		cfg.overlap = true;
		cfg.resolve = UKVM_RESOLVE_MOVE;
		cfg.readers = 2;
		cfg.trace_faults = true;
		ukt_run_2m_pages(&cfg, UKVM_BACKING_ANONYMOUS_THP);
	}

	UKT_CASE("copy, the guest maps the region with 2 MiB pages") {
		cfg = ukt_small();
		cfg.mem_per_vcpu = 4 * MiB;
		cfg.guest_page_size = 2 * MiB;
		ukt_run_2m_pages(&cfg, UKVM_BACKING_ANONYMOUS_THP);
	}

	UKT_CASE("no userfaultfd: the kernel pages the memory in") {
		cfg = ukt_small();
		cfg.mem_per_vcpu = 4 * MiB;
		cfg.uffd_mode = UKVM_UFFD_NONE;
		ukt_run_2m_pages(&cfg, UKVM_BACKING_ANONYMOUS_THP);
	}

	return ukt_exit();
}
