/* SPDX-License-Identifier: MIT */
/*
 * White-box cases of the fault log (csrc/uffd/faultlog.c) that no real run can
 * produce: the kernel resolves a page only once, so a run cannot show a
 * page resolved twice while another was never resolved, with the total
 * right. `verified` must still catch that (collect.c asks faultlog.c which
 * pages were not resolved exactly once), so here the records are written by
 * hand into a pool's log and the log is built as after a run.
 */
#include <sys/mman.h>

#include "helpers.h"
#undef NSEC_PER_MSEC	/* base/util.h has its own, the same */
#undef NSEC_PER_SEC
#undef ARRAY_SIZE
#include "uffd/faultlog.h"
#include "uffd/pool.h"

#define GPA	(4ULL << 30)
#define PAGES	8

/* A pool whose log holds one record per entry of pages[] (a page index, or -1 for EEXIST of page 0). */
static void pool_with(struct ukvm_pool *pool, const int *pages, unsigned n)
{
	unsigned i;

	ukvm_pool_init(pool);
	pool->log_cap = UKVM_LOG_CHUNK;
	pool->log = calloc(pool->log_cap, sizeof(*pool->log));
	atomic_store(&pool->log_chunks, 1);
	for (i = 0; i < n; i++) {
		struct ukvm_fault_record *rec = &pool->log[i];

		rec->read_ns = 1000 + 10 * i;
		rec->resolved_ns = rec->read_ns + 5;
		rec->gpa = GPA + (pages[i] < 0 ? 0 : (uint64_t)pages[i]) * PAGE;
		rec->eexist = pages[i] < 0;
		rec->vcpu = 4242;	/* a thread id, mapped to vCPU 0 */
	}
}

static void build(const int *pages, unsigned n, struct ukvm_faultlog *log,
		  struct ukvm_vcpu_result *vcpu)
{
	static const int32_t tids[] = { 4242 };
	struct ukvm_pool pool;

	memset(vcpu, 0, sizeof(*vcpu));
	pool_with(&pool, pages, n);
	*log = (struct ukvm_faultlog){
		.nr_vcpus = 1, .tids = tids, .region_gpa = GPA, .region_pages = PAGES,
		.page_size = PAGE, .match_bytes = PAGE, .vcpus = vcpu, .readers_per_uffd = 1,
	};
	CHECK_EQ(ukvm_faultlog_build(log, &pool, 1), 0);
	free(pool.log);
}

int main(void)
{
	static const int once[] = { 0, 1, 2, 3, 4, 5, 6, 7, -1 };
	static const int twice[] = { 0, 1, 2, 3, 3, 5, 6, 7 };	/* 3 twice, 4 never */
	static const int missing[] = { 0, 1, 2, 4, 5, 6, 7 };	/* 3 never */
	struct ukvm_vcpu_result vcpu;
	struct ukvm_faultlog log;

	ukt_init("faultlog_accounting");

	UKT_CASE("every page once, an EEXIST echo aside") {
		build(once, ARRAY_SIZE(once), &log, &vcpu);
		CHECK_EQ(log.nr_all, 9);
		CHECK_EQ(log.pages_not_once, 0);
		/* faults as a reader counts them: resolved; the echo is eexist */
		CHECK_EQ(vcpu.faults, 8);
		CHECK_EQ(vcpu.eexist, 1);
		free(log.all);
	}
	UKT_CASE("one page twice and another never, the total right") {
		build(twice, ARRAY_SIZE(twice), &log, &vcpu);
		CHECK_EQ(log.pages_not_once, 2);
		CHECK_EQ(log.first_bad_gpa, GPA + 3 * PAGE);
		CHECK(log.first_bad_resolved_again, "page 3 was resolved twice");
		free(log.all);
	}
	UKT_CASE("a page never resolved") {
		build(missing, ARRAY_SIZE(missing), &log, &vcpu);
		CHECK_EQ(log.pages_not_once, 1);
		CHECK_EQ(log.first_bad_gpa, GPA + 3 * PAGE);
		CHECK(!log.first_bad_resolved_again, "page 3 was never resolved");
		free(log.all);
	}
	return ukt_exit();
}
