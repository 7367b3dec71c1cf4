/* SPDX-License-Identifier: MIT */
/*
 * 2 MiB pages (anonymous THP here: no huge page pool needed) are copied from
 * a source of each reader's own, stamped before the copy, so a page is whole
 * the moment it is present. Every page verifies with several readers
 * racing, under ASan and TSan, and the run maps one 2 MiB source per reader,
 * no more.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "helpers.h"

#define HUGE	(2 * MiB)

struct sampler {
	pthread_t thread;
	atomic_bool stop;
	int most;		/* source mappings seen at once */
	bool one_page;		/* each was one page long */
};

static void *sample(void *arg)
{
	struct sampler *s = arg;
	char line[512];

	s->one_page = true;
	while (!atomic_load(&s->stop)) {
		FILE *f = fopen("/proc/self/maps", "re");
		unsigned long start, end;
		int n = 0;

		while (f && fgets(line, sizeof(line), f)) {
			if (!strstr(line, "memfd:uffdkvm-reader-source") &&
			    !strstr(line, "memfd:uffdkvm-source"))
				continue;
			n++;
			if (sscanf(line, "%lx-%lx", &start, &end) == 2 && end - start != HUGE)
				s->one_page = false;
		}
		if (f)
			fclose(f);
		if (n > s->most)
			s->most = n;
		ukt_sleep_ms(2);
	}
	return NULL;
}

int main(void)
{
	static const struct {
		const char *name;
		uint32_t vcpus, readers;
		bool single_uffd, overlap;
	} layouts[] = {
		{ "a uffd per vCPU, 4 readers each", 2, 4, false, false },
		{ "one uffd, 8 readers", 2, 8, true, false },
		{ "overlapped, 3 vCPUs, 4 readers", 3, 4, false, true },
	};
	struct ukvm_config cfg;
	struct ukvm_result res;
	struct sampler s;
	uint64_t region, faults;
	unsigned i, k;

	ukt_init("huge_sources");

	for (i = 0; i < ARRAY_SIZE(layouts); i++) {
		UKT_CASE("anonymous_thp, %s", layouts[i].name) {
			cfg = ukt_small();
			cfg.backing = UKVM_BACKING_ANONYMOUS_THP;
			cfg.vcpus = layouts[i].vcpus;
			cfg.readers = layouts[i].readers;
			cfg.single_uffd = layouts[i].single_uffd;
			cfg.overlap = layouts[i].overlap;
			cfg.mem_per_vcpu = 8 * MiB;
			cfg.write_percent = 50;
			cfg.passes = 2;
			cfg.delay_us = 5000;	/* long enough to look at the maps */
			memset(&s, 0, sizeof(s));
			atomic_init(&s.stop, false);
			CHECK(pthread_create(&s.thread, NULL, sample, &s) == 0);
			if (ukt_run_ok(&cfg, &res)) {
				region = cfg.overlap ? cfg.mem_per_vcpu
						     : cfg.vcpus * cfg.mem_per_vcpu;
				CHECK(res.verified, "%s", res.verify_message);
				CHECK_EQ(res.bad_pages, 0);
				CHECK_EQ(res.page_size, HUGE);
				for (k = 0, faults = 0; k < res.nr_readers; k++)
					faults += res.readers[k].faults;
				CHECK_EQ(faults, region / HUGE);
				ukvm_result_free(&res);
			}
			atomic_store(&s.stop, true);
			pthread_join(s.thread, NULL);
			CHECK_EQ(s.most, (int)(layouts[i].readers *
					       (layouts[i].single_uffd || layouts[i].overlap ?
						1 : layouts[i].vcpus)));
			CHECK(s.one_page, "a source mapping was not one 2 MiB page");
		}
	}

	return ukt_exit();
}
