/* SPDX-License-Identifier: MIT */
/*
 * A bad config is refused with UKVM_ERR_CONFIG and a message that names the
 * field: by ukvm_run and by ukvm_experiment_start before any thread or VM
 * exists, or, for what only the host can tell (its vCPU limit, an injection
 * past the region), by the run itself.
 */
#include "helpers.h"

struct bad {
	const char *what;
	const char *field;	/* the message must name it */
	void (*apply)(struct ukvm_config *cfg);
};

static void vcpus_zero(struct ukvm_config *c) { c->vcpus = 0; }
static void mem_zero(struct ukvm_config *c) { c->mem_per_vcpu = 0; }
static void mem_4095(struct ukvm_config *c) { c->mem_per_vcpu = 4095; }
static void mem_4097(struct ukvm_config *c) { c->mem_per_vcpu = 4097; }
static void mem_6000(struct ukvm_config *c) { c->mem_per_vcpu = 6000; }
static void mem_2m_plus_1(struct ukvm_config *c) { c->mem_per_vcpu = 2 * MiB + 1; }
static void mem_overflows(struct ukvm_config *c) { c->vcpus = 2; c->mem_per_vcpu = 1ULL << 63; }
static void minor_anon(struct ukvm_config *c)
{
	c->uffd_mode = UKVM_UFFD_MINOR;
	c->backing = UKVM_BACKING_ANONYMOUS;
}
static void readers_zero(struct ukvm_config *c) { c->readers = 0; }
static void readers_zero_minor(struct ukvm_config *c)
{
	c->readers = 0;
	c->uffd_mode = UKVM_UFFD_MINOR;
	c->backing = UKVM_BACKING_SHMEM;
}
static void readers_huge(struct ukvm_config *c) { c->readers = 1000000; }
static void backing_bad(struct ukvm_config *c) { c->backing = (enum ukvm_backing)99; }
static void backing_neg(struct ukvm_config *c) { c->backing = (enum ukvm_backing)-1; }
static void mode_bad(struct ukvm_config *c) { c->uffd_mode = UKVM_UFFD__COUNT; }
static void wait_bad(struct ukvm_config *c) { c->wait = UKVM_WAIT__COUNT; }
static void inject_bad(struct ukvm_config *c) { c->inject = UKVM_INJECT__COUNT; }
static void delay_huge(struct ukvm_config *c) { c->delay_us = 10 * 1000 * 1000 + 1; }
static void work_huge(struct ukvm_config *c) { c->guest_work = 1000001; }
/* A count without its list: validation must not read pin_vcpus[0]. */
static void pin_vcpus_null(struct ukvm_config *c) { c->nr_pin_vcpus = 2; c->pin_vcpus = NULL; }
static void pin_readers_null(struct ukvm_config *c)
{
	c->nr_pin_readers = 3;
	c->pin_readers = NULL;
}
/*
 * Regions past 64 TiB, overlapped (one vCPU's size is the region) or not.
 * The first two wrapped sums in vm.c; the hugetlb ones sit just above the
 * limit, where a validator that let them through would fail on the huge
 * page check instead (UKVM_ERR_HOST) rather than build 64 TiB of tables.
 */
static void overlap_mem_wraps(struct ukvm_config *c)
{
	c->overlap = true;
	c->mem_per_vcpu = UINT64_MAX - PAGE + 1;	/* 2^64 - 4 KiB */
}
static void overlap_mem_2_63(struct ukvm_config *c)
{
	c->overlap = true;
	c->mem_per_vcpu = UINT64_C(1) << 63;
}
static void overlap_mem_thp_wraps(struct ukvm_config *c)
{
	c->overlap = true;
	c->backing = UKVM_BACKING_ANONYMOUS_THP;
	c->mem_per_vcpu = UINT64_MAX - 2 * MiB + 1;	/* 2^64 - 2 MiB */
}
static void overlap_region_over_64t(struct ukvm_config *c)
{
	c->overlap = true;
	c->backing = UKVM_BACKING_ANONYMOUS_HUGETLB;
	c->mem_per_vcpu = (UINT64_C(1) << 46) + 2 * MiB;
}
static void region_over_64t(struct ukvm_config *c)
{
	c->vcpus = 2;
	c->backing = UKVM_BACKING_ANONYMOUS_HUGETLB;
	c->mem_per_vcpu = (UINT64_C(1) << 45) + 2 * MiB;
}
/* UFFDIO_MOVE moves private anonymous pages only, and resolves MISSING faults only. */
static void move_shmem(struct ukvm_config *c)
{
	c->backing = UKVM_BACKING_SHMEM;
	c->resolve = UKVM_RESOLVE_MOVE;
}
static void move_hugetlb(struct ukvm_config *c)
{
	c->backing = UKVM_BACKING_ANONYMOUS_HUGETLB;
	c->mem_per_vcpu = 2 * MiB;
	c->resolve = UKVM_RESOLVE_MOVE;
}
static void move_minor(struct ukvm_config *c)
{
	c->backing = UKVM_BACKING_SHMEM;
	c->uffd_mode = UKVM_UFFD_MINOR;
	c->resolve = UKVM_RESOLVE_MOVE;
}
static void region_wraps_4_vcpus(struct ukvm_config *c)
{
	c->vcpus = 4;
	c->mem_per_vcpu = UINT64_C(1) << 62;	/* x 4 = 2^64 */
}

static const struct bad bads[] = {
	{ "vcpus = 0", "vcpus", vcpus_zero },
	{ "mem_per_vcpu = 0", "mem_per_vcpu", mem_zero },
	{ "mem_per_vcpu = 4095", "mem_per_vcpu", mem_4095 },
	{ "mem_per_vcpu = 4097", "mem_per_vcpu", mem_4097 },
	{ "mem_per_vcpu = 6000", "mem_per_vcpu", mem_6000 },
	{ "mem_per_vcpu = 2 MiB + 1", "mem_per_vcpu", mem_2m_plus_1 },
	{ "vcpus * mem_per_vcpu overflows", "mem_per_vcpu", mem_overflows },
	{ "MINOR on anonymous memory", "minor", minor_anon },
	{ "readers = 0", "readers", readers_zero },
	{ "readers = 0 with MINOR", "readers", readers_zero_minor },
	{ "readers = 1000000", "readers", readers_huge },
	{ "backing = 99", "backing", backing_bad },
	{ "backing = -1", "backing", backing_neg },
	{ "uffd_mode out of range", "uffd_mode", mode_bad },
	{ "wait out of range", "wait", wait_bad },
	{ "inject out of range", "inject", inject_bad },
	{ "delay_us over 10 s", "delay_us", delay_huge },
	{ "guest_work over 1000000", "guest_work", work_huge },
	{ "nr_pin_vcpus = 2, pin_vcpus = NULL", "pin_vcpus", pin_vcpus_null },
	{ "nr_pin_readers = 3, pin_readers = NULL", "pin_readers", pin_readers_null },
	{ "overlap, mem_per_vcpu = 2^64 - 4 KiB", "mem_per_vcpu", overlap_mem_wraps },
	{ "overlap, mem_per_vcpu = 2^63", "mem_per_vcpu", overlap_mem_2_63 },
	{ "overlap, THP, mem_per_vcpu = 2^64 - 2 MiB", "mem_per_vcpu", overlap_mem_thp_wraps },
	{ "overlap, hugetlb, mem_per_vcpu = 64 TiB + 2 MiB", "mem_per_vcpu",
	  overlap_region_over_64t },
	{ "2 vCPUs x (32 TiB + 2 MiB) of hugetlb", "mem_per_vcpu", region_over_64t },
	{ "4 vCPUs x 2^62 bytes", "mem_per_vcpu", region_wraps_4_vcpus },
	{ "resolve move on shmem", "resolve: 'move' needs private anonymous", move_shmem },
	{ "resolve move on hugetlb", "resolve: 'move' needs private anonymous", move_hugetlb },
	{ "resolve move, uffd_mode minor", "resolve: 'move' resolves missing faults only",
	  move_minor },
};

int main(void)
{
	struct ukvm_experiment *exp;
	struct ukvm_config cfg;
	struct ukvm_result res;
	struct ukvm_error err;
	unsigned i;
	int ret;

	ukt_init("config_errors");

	for (i = 0; i < ARRAY_SIZE(bads); i++) {
		UKT_CASE("ukvm_run: %s", bads[i].what) {
			cfg = ukt_small();
			bads[i].apply(&cfg);
			memset(&res, 0xa5, sizeof(res));
			ret = ukvm_run(&cfg, &res, &err);
			CHECK(ret != 0, "succeeded");
			CHECK(err.kind == UKVM_ERR_CONFIG, "kind %s: %s", ukt_kind_name(err.kind),
			      err.message);
			CHECK_EQ(err.errnum, 0);
			CHECK(strstr(err.message, bads[i].field), "message does not name %s: %s",
			      bads[i].field, err.message);
			/* The result comes back empty, and freeing it is harmless. */
			CHECK(res.vcpus == NULL && res.readers == NULL && res.nr_vcpus == 0);
			ukvm_result_free(&res);
		}
		UKT_CASE("ukvm_experiment_start: %s", bads[i].what) {
			cfg = ukt_small();
			bads[i].apply(&cfg);
			exp = NULL;
			ret = ukvm_experiment_start(&cfg, &exp, &err);
			CHECK(ret < 0, "returned %d", ret);
			CHECK(exp == NULL, "made an experiment");
			CHECK(err.kind == UKVM_ERR_CONFIG, "kind %s: %s", ukt_kind_name(err.kind),
			      err.message);
			if (ret == 0 && exp && ukvm_experiment_finish(exp, &res, &err) == 0)
				ukvm_result_free(&res);
		}
	}

	UKT_CASE("a region of exactly 64 TiB passes validation") {
		/* The limit is inclusive: what stops this one is the host's huge page pool. */
		cfg = ukt_small();
		cfg.overlap = true;
		cfg.backing = UKVM_BACKING_ANONYMOUS_HUGETLB;
		cfg.mem_per_vcpu = UINT64_C(1) << 46;
		ukt_run_fails(&cfg, UKVM_ERR_HOST, 0, "huge pages", NULL);
	}

	UKT_CASE("more vCPUs than KVM allows") {
		cfg = ukt_small();
		cfg.vcpus = 100000;
		cfg.mem_per_vcpu = PAGE;
		ukt_run_fails(&cfg, UKVM_ERR_CONFIG, 0, "vcpus", NULL);
	}

	UKT_CASE("guest injection past vCPU 0's pages") {
		cfg = ukt_small();
		cfg.inject = UKVM_INJECT_GUEST_FAULT;
		cfg.inject_after = cfg.mem_per_vcpu / PAGE;
		ukt_run_fails(&cfg, UKVM_ERR_CONFIG, 0, "inject_after", NULL);
		cfg.inject = UKVM_INJECT_GUEST_MMIO;
		ukt_run_fails(&cfg, UKVM_ERR_CONFIG, 0, "inject_after", NULL);
	}

	UKT_CASE("ukvm_config_init's defaults validate") {
		/* 1 vCPU x 1 GiB is too much for a test: shrink it, keep the rest. */
		ukvm_config_init(&cfg);
		CHECK_EQ(cfg.vcpus, 1);
		CHECK_EQ(cfg.mem_per_vcpu, 1ULL << 30);
		CHECK_EQ(cfg.readers, 1);
		CHECK(cfg.uffd_mode == UKVM_UFFD_MISSING && cfg.backing == UKVM_BACKING_ANONYMOUS &&
		      cfg.wait == UKVM_WAIT_EPOLL_EXCLUSIVE && cfg.inject == UKVM_INJECT_NONE &&
		      cfg.timeout_ns == 0 && !cfg.overlap && !cfg.single_uffd);
		cfg.mem_per_vcpu = 64 * PAGE;
		if (ukt_run_ok(&cfg, &res)) {
			ukt_check_result(&cfg, &res);
			ukvm_result_free(&res);
		}
	}

	UKT_CASE("names of every enum value, and of bad ones") {
		CHECK(!strcmp(ukvm_backing_name(UKVM_BACKING_ANONYMOUS), "anonymous"));
		CHECK(!strcmp(ukvm_backing_name(UKVM_BACKING_SHMEM), "shmem"));
		CHECK(!strcmp(ukvm_uffd_mode_name(UKVM_UFFD_NONE), "none"));
		CHECK(!strcmp(ukvm_uffd_mode_name(UKVM_UFFD_MISSING), "missing"));
		CHECK(!strcmp(ukvm_uffd_mode_name(UKVM_UFFD_MINOR), "minor"));
		CHECK(!strcmp(ukvm_wait_name(UKVM_WAIT_POLL), "poll"));
		CHECK(!strcmp(ukvm_wait_name(UKVM_WAIT_EPOLL), "epoll"));
		CHECK(!strcmp(ukvm_wait_name(UKVM_WAIT_EPOLL_EXCLUSIVE), "epoll_exclusive"));
		CHECK(!strcmp(ukvm_wait_name(UKVM_WAIT_READ), "read"));
		CHECK(!strcmp(ukvm_backing_name((enum ukvm_backing)-1), "?"));
		CHECK(!strcmp(ukvm_uffd_mode_name(UKVM_UFFD__COUNT), "?"));
		CHECK(!strcmp(ukvm_wait_name((enum ukvm_wait)1000), "?"));
	}

	return ukt_exit();
}
