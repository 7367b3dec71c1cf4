/* SPDX-License-Identifier: MIT */
/*
 * Hugetlb memory of 2 MiB pages, private and shared (a hugetlbfs memfd
 * mapped twice): MISSING resolved with UFFDIO_COPY of 2 MiB, MINOR with
 * UFFDIO_CONTINUE of 2 MiB, and no userfaultfd. Each 2 MiB page faults once
 * and every 4 KiB page verifies.
 *
 * Huge pages must be reserved beforehand, by root (the Python side grows the
 * pool for the session: tests/project/test_sanitizers.py). With fewer free
 * than the largest case needs, the whole program skips (77) and says so.
 */
#include "helpers.h"

#define POOL		"/sys/kernel/mm/hugepages/hugepages-2048kB"
#define PAGES_NEEDED	4	/* 2 vCPUs x 4 MiB */

static long read_long(const char *path)
{
	FILE *f = fopen(path, "re");
	long v = -1;

	if (f) {
		if (fscanf(f, "%ld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

int main(void)
{
	static const enum ukvm_backing backings[] = {
		UKVM_BACKING_ANONYMOUS_HUGETLB, UKVM_BACKING_SHARED_HUGETLB,
	};
	struct ukvm_config cfg;
	long total, free_pages, resv;
	unsigned b;

	ukt_init("hugetlb");
	total = read_long(POOL "/nr_hugepages");
	free_pages = read_long(POOL "/free_hugepages");
	resv = read_long(POOL "/resv_hugepages");
	if (total < 0 || free_pages < 0)
		ukt_skip_program("this kernel has no 2 MiB huge page pool (%s)", POOL);
	if (free_pages - (resv > 0 ? resv : 0) < PAGES_NEEDED)
		ukt_skip_program("needs %d free 2 MiB huge pages and %ld are free (%ld reserved, "
				 "pool of %ld): as root, echo %ld > %s/nr_hugepages",
				 PAGES_NEEDED, free_pages, resv, total,
				 total + PAGES_NEEDED, POOL);

	for (b = 0; b < ARRAY_SIZE(backings); b++) {
		const char *name = ukvm_backing_name(backings[b]);

		UKT_CASE("%s: copy, 2 vCPUs x 4 MiB, 2 readers per uffd", name) {
			cfg = ukt_small();
			cfg.mem_per_vcpu = 4 * MiB;
			cfg.readers = 2;
			cfg.pattern = UKVM_PATTERN_RANDOM;
			cfg.write_percent = 50;
			cfg.trace_faults = true;
			ukt_run_2m_pages(&cfg, backings[b]);
		}
		UKT_CASE("%s: copy, overlap on one uffd, 2 readers", name) {
			cfg = ukt_small();
			cfg.mem_per_vcpu = 4 * MiB;
			cfg.overlap = true;
			cfg.readers = 2;
			cfg.trace_faults = true;
			ukt_run_2m_pages(&cfg, backings[b]);
		}
		UKT_CASE("%s: no userfaultfd", name) {
			cfg = ukt_small();
			cfg.mem_per_vcpu = 4 * MiB;
			cfg.uffd_mode = UKVM_UFFD_NONE;
			ukt_run_2m_pages(&cfg, backings[b]);
		}
	}

	UKT_CASE("shared_hugetlb: MINOR, continue, single uffd, 3 readers") {
		cfg = ukt_small();
		cfg.mem_per_vcpu = 4 * MiB;
		cfg.uffd_mode = UKVM_UFFD_MINOR;
		cfg.single_uffd = true;
		cfg.readers = 3;
		cfg.write_percent = 50;
		cfg.trace_faults = true;
		ukt_run_2m_pages(&cfg, UKVM_BACKING_SHARED_HUGETLB);
	}

	UKT_CASE("anonymous_hugetlb: the guest maps the region with 2 MiB pages") {
		cfg = ukt_small();
		cfg.mem_per_vcpu = 4 * MiB;
		cfg.guest_page_size = 2 * MiB;
		ukt_run_2m_pages(&cfg, UKVM_BACKING_ANONYMOUS_HUGETLB);
	}

	return ukt_exit();
}
