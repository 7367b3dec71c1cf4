/* SPDX-License-Identifier: MIT */
/*
 * uffd_mode wp: the region is filled and write-protected before the vCPUs
 * start; the guest's first write to each page faults, and the resolver saves
 * the page's old contents into the snapshot and un-protects it. The run
 * verifies both the guest's new bytes and the snapshot's old ones (and that
 * pages only read were never saved); these cases check what the counters
 * say about it, the backings and resolvers it runs with, and that a save
 * left out fails verification. wp_async: no fault at all, and the pages
 * PAGEMAP_SCAN finds written are the ones the guest wrote.
 */
#include "helpers.h"

/* Every WP message is answered with UFFDIO_WRITEPROTECT and nothing else. */
static uint64_t check_wp_counters(const struct ukvm_result *res)
{
	uint64_t faults = 0;
	uint32_t i;

	for (i = 0; i < res->nr_readers; i++) {
		const struct ukvm_reader_result *x = &res->readers[i];

		CHECK_EQ(x->unprotects, x->faults + x->eexist);
		CHECK_EQ(x->copies + x->zeropages + x->continues, 0);
		faults += x->faults;
	}
	return faults;
}

/* A verified run of cfg; returns the faults resolved, or UINT64_MAX after a failure or skip. */
static uint64_t run_wp(const struct ukvm_config *cfg)
{
	struct ukvm_result res;
	uint64_t faults;

	if (!ukt_run_ok(cfg, &res))
		return UINT64_MAX;
	CHECK(res.verified, "%s: not verified: %s", ukt_cfg_str(cfg), res.verify_message);
	CHECK_EQ(res.bad_pages, 0);
	faults = check_wp_counters(&res);
	ukvm_result_free(&res);
	return faults;
}

static struct ukvm_config wp_config(void)
{
	struct ukvm_config cfg = ukt_small();

	cfg.uffd_mode = UKVM_UFFD_WP;
	cfg.mem_per_vcpu = MiB;
	return cfg;
}

int main(void)
{
	uint64_t pages = MiB / PAGE, faults;
	struct ukvm_config cfg;
	struct ukvm_result res;
	struct ukvm_error err;
	uint32_t i;

	ukt_init("wp");

	UKT_CASE("anonymous, 2 vCPUs, 2 readers each, every page written: a fault per page") {
		cfg = wp_config();
		cfg.readers = 2;
		faults = run_wp(&cfg);
		if (faults != UINT64_MAX)
			CHECK_EQ(faults, 2 * pages);
	}

	UKT_CASE("shmem, write_percent 50: fewer faults than pages, traced writes") {
		cfg = wp_config();
		cfg.backing = UKVM_BACKING_SHMEM;
		cfg.write_percent = 50;
		cfg.trace_faults = true;
		if (ukt_run_ok(&cfg, &res)) {
			CHECK(res.verified, "not verified: %s", res.verify_message);
			faults = check_wp_counters(&res);
			/* About half the pages (a hash of the frame decides): reads do not fault. */
			CHECK(faults > 2 * pages / 4 && faults < 2 * pages * 3 / 4,
			      "%" PRIu64 " faults for %" PRIu64 " pages at write_percent 50",
			      faults, 2 * pages);
			CHECK_EQ(res.nr_fault_trace, faults);
			for (i = 0; i < res.nr_fault_trace; i++)
				CHECK_EQ(res.fault_trace[i].write, 1);
			ukvm_result_free(&res);
		}
	}

	UKT_CASE("write_percent 0: nothing faults, nothing saved") {
		cfg = wp_config();
		cfg.write_percent = 0;
		faults = run_wp(&cfg);
		if (faults != UINT64_MAX)
			CHECK_EQ(faults, 0);
	}

	UKT_CASE("2 passes, guest_timing: only the first write to a page faults") {
		cfg = wp_config();
		cfg.passes = 2;
		cfg.guest_timing = true;
		faults = run_wp(&cfg);
		if (faults != UINT64_MAX)
			CHECK_EQ(faults, 2 * pages);
	}

	UKT_CASE("overlap: two vCPUs write every page, each saved once") {
		cfg = wp_config();
		cfg.overlap = true;
		cfg.readers = 2;
		faults = run_wp(&cfg);
		if (faults != UINT64_MAX)
			CHECK_EQ(faults, pages);
	}

	UKT_CASE("resolver vcpu: the WP fault comes back to the vCPU thread (SIGBUS)") {
		cfg = wp_config();
		cfg.resolver = UKVM_RESOLVER_VCPU;
		if (ukt_run_ok(&cfg, &res)) {
			CHECK(res.verified, "not verified: %s", res.verify_message);
			CHECK_EQ(check_wp_counters(&res), 2 * pages);
			for (i = 0; i < res.nr_vcpus; i++)
				CHECK_EQ(res.vcpus[i].fault_exits, pages);
			ukvm_result_free(&res);
		}
	}

	UKT_CASE("a save left out: the snapshot fails verification") {
		cfg = wp_config();
		cfg.inject = UKVM_INJECT_WP_NO_SAVE;
		if (ukt_run_ok(&cfg, &res)) {
			CHECK(!res.verified, "verified with no page saved");
			CHECK(res.bad_pages > 0);
			CHECK(strstr(res.verify_message, "snapshot slot"), "%s", res.verify_message);
			ukvm_result_free(&res);
		}
	}

	UKT_CASE("huge pages and guest_memfd are refused, naming the field") {
		static const enum ukvm_backing refused[] = {
			UKVM_BACKING_ANONYMOUS_THP, UKVM_BACKING_ANONYMOUS_HUGETLB,
			UKVM_BACKING_SHARED_HUGETLB, UKVM_BACKING_GUEST_MEMFD,
		};

		for (i = 0; i < ARRAY_SIZE(refused); i++) {
			cfg = wp_config();
			cfg.mem_per_vcpu = 2 * MiB;
			cfg.backing = refused[i];
			ukt_run_fails(&cfg, UKVM_ERR_CONFIG, 0, "uffd_mode: 'wp' runs on 'anonymous' or 'shmem'",
				      &err);
		}
	}

	UKT_CASE("a kernel without uffd-wp: a host error that says which feature, per backing") {
		cfg = wp_config();
		cfg.inject = UKVM_INJECT_NO_WP_FEATURES;
		ukt_run_fails(&cfg, UKVM_ERR_HOST, 0, "UFFD_FEATURE_PAGEFAULT_FLAG_WP", &err);
		cfg.backing = UKVM_BACKING_SHMEM;
		ukt_run_fails(&cfg, UKVM_ERR_HOST, 0, "UFFD_FEATURE_WP_HUGETLBFS_SHMEM", &err);
		/* The other modes never ask for them. */
		cfg.uffd_mode = UKVM_UFFD_MISSING;
		if (ukt_run_ok(&cfg, &res)) {
			ukt_check_result(&cfg, &res);
			for (i = 0; i < res.nr_readers; i++)
				CHECK_EQ(res.readers[i].unprotects, 0);
			ukvm_result_free(&res);
		}
	}

	UKT_CASE("wp_async, shmem, write_percent 50: no fault, the written pages found") {
		cfg = wp_config();
		cfg.backing = UKVM_BACKING_SHMEM;
		cfg.wp_async = true;
		cfg.write_percent = 50;
		cfg.readers = 2;
		if (ukt_run_ok(&cfg, &res)) {
			CHECK(res.verified, "not verified: %s", res.verify_message);
			CHECK(res.dirty_pages > 2 * pages / 4 && res.dirty_pages < 2 * pages * 3 / 4,
			      "%" PRIu64 " dirty pages of %" PRIu64, res.dirty_pages, 2 * pages);
			for (i = 0; i < res.nr_readers; i++) {
				CHECK_EQ(res.readers[i].faults + res.readers[i].eexist, 0);
				CHECK_EQ(res.readers[i].unprotects, 0);
			}
			ukvm_result_free(&res);
		}
		cfg.backing = UKVM_BACKING_ANONYMOUS;
		cfg.write_percent = 100;
		if (ukt_run_ok(&cfg, &res)) {
			CHECK(res.verified, "not verified: %s", res.verify_message);
			CHECK_EQ(res.dirty_pages, 2 * pages);
			ukvm_result_free(&res);
		}
	}

	UKT_CASE("wp_async needs uffd_mode wp and resolver readers") {
		cfg = wp_config();
		cfg.wp_async = true;
		cfg.resolver = UKVM_RESOLVER_VCPU;
		ukt_run_fails(&cfg, UKVM_ERR_CONFIG, 0, "wp_async: delivers no faults", &err);
		cfg = ukt_small();
		cfg.wp_async = true;
		ukt_run_fails(&cfg, UKVM_ERR_CONFIG, 0, "wp_async: applies to uffd_mode='wp' only",
			      &err);
	}

	UKT_CASE("resolve zeropage is refused with wp") {
		cfg = wp_config();
		cfg.resolve = UKVM_RESOLVE_ZEROPAGE;
		ukt_run_fails(&cfg, UKVM_ERR_CONFIG, 0, "resolves missing faults only", &err);
	}

	return ukt_exit();
}
