/* SPDX-License-Identifier: MIT */
/*
 * Guest access models (experiment/access.c) under the sanitizers: a
 * working set (touch_percent) and Zipf draws (access zipf), walked from
 * host-made lists in guest memory. Each run verifies, faults exactly once
 * per touched page (none elsewhere, by the trace), and the host's visit
 * counts add up to the guest's own count of its accesses.
 */
#include "helpers.h"

static void run_model(const struct ukvm_config *cfg)
{
	struct ukvm_result res;
	uint64_t i, faults = 0, visits = 0, touched = 0, seen = 0;
	uint32_t r;

	if (!ukt_run_ok(cfg, &res))
		return;
	CHECK(res.verified, "%s: not verified: %s", ukt_cfg_str(cfg), res.verify_message);
	for (r = 0; r < res.nr_readers; r++)
		faults += res.readers[r].faults;
	if (cfg->uffd_mode != UKVM_UFFD_NONE && !cfg->prefault &&
	    ukvm_backing_page_size(cfg->backing) == PAGE)
		CHECK_EQ(faults, res.touched_pages);
	CHECK(res.touched_pages < res.region_bytes / PAGE, "%s: touched %" PRIu64 " pages",
	      ukt_cfg_str(cfg), res.touched_pages);
	if (cfg->trace_faults && CHECK(res.page_visits)) {
		CHECK_EQ(res.nr_page_visits, res.region_bytes / PAGE);
		for (i = 0; i < res.nr_page_visits; i++) {
			visits += res.page_visits[i];
			touched += res.page_visits[i] != 0;
		}
		CHECK_EQ(touched, res.touched_pages);
		CHECK_EQ(visits * cfg->passes, res.guest_accesses);
		for (i = 0; i < res.nr_fault_trace; i++)
			seen += !res.fault_trace[i].eexist;
		if (cfg->uffd_mode != UKVM_UFFD_NONE && ukvm_backing_page_size(cfg->backing) == PAGE)
			CHECK_EQ(seen, res.touched_pages);
	}
	ukvm_result_free(&res);
}

int main(void)
{
	struct ukvm_config cfg;

	ukt_init("access_models");

	UKT_CASE("touch_percent 25, random order, half written, 2 passes") {
		cfg = ukt_small();
		cfg.touch_percent = 25;
		cfg.pattern = UKVM_PATTERN_RANDOM;
		cfg.write_percent = 50;
		cfg.passes = 2;
		cfg.trace_faults = true;
		run_model(&cfg);
	}
	UKT_CASE("zipf 0.99, 3000 accesses, overlap, 2 readers") {
		cfg = ukt_small();
		cfg.access = UKVM_ACCESS_ZIPF;
		cfg.zipf_theta = 0.99;
		cfg.accesses = 3000;
		cfg.overlap = true;
		cfg.readers = 2;
		cfg.write_percent = 50;
		cfg.trace_faults = true;
		run_model(&cfg);
	}
	UKT_CASE("zipf over a 30%% working set, guest timing, resolver vcpu") {
		cfg = ukt_small();
		cfg.access = UKVM_ACCESS_ZIPF;
		cfg.zipf_theta = 1.2;
		cfg.touch_percent = 30;
		cfg.accesses = 2000;
		cfg.guest_timing = true;
		cfg.resolver = UKVM_RESOLVER_VCPU;
		cfg.trace_faults = true;
		run_model(&cfg);
	}
	UKT_CASE("touch_percent 10 on THP") {
		cfg = ukt_small();
		cfg.backing = UKVM_BACKING_ANONYMOUS_THP;
		cfg.touch_percent = 10;
		run_model(&cfg);
	}
	UKT_CASE("touch_percent 30, uffd_mode wp") {
		cfg = ukt_small();
		cfg.uffd_mode = UKVM_UFFD_WP;
		cfg.touch_percent = 30;
		run_model(&cfg);
	}
	UKT_CASE("zipf_theta with access uniform is a config error") {
		struct ukvm_result res;
		struct ukvm_error err;

		cfg = ukt_small();
		cfg.zipf_theta = 0.99;
		CHECK_EQ(ukvm_run(&cfg, &res, &err), -EINVAL);
		CHECK_EQ(err.kind, UKVM_ERR_CONFIG);
		CHECK(strstr(err.message, "zipf_theta"), "%s", err.message);
	}
	return ukt_exit();
}
