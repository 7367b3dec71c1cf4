/* SPDX-License-Identifier: MIT */
/*
 * White-box cases of the fault log (csrc/uffd/faultlog.c) that no real run can
 * produce: the kernel resolves a page only once, so a run cannot show a
 * page resolved twice while another was never resolved, with the total
 * right. `verified` must still catch that (collect.c asks faultlog.c which
 * pages were not resolved exactly once), so here the records are written by
 * hand into a uffd's store and the log is built as after a run.
 */
#include <sys/mman.h>

#include "helpers.h"
#undef NSEC_PER_MSEC	/* base/util.h has its own, the same */
#undef NSEC_PER_SEC
#undef ARRAY_SIZE
#include "base/util.h"
#include "uffd/faultlog.h"

#define GPA	(4ULL << 30)
#define PAGES	8

/*
 * A store holding one record per entry of pages[] (a page index, or -1 for
 * EEXIST of page 0), written through the writer the resolvers use.
 */
static void store_with(struct ukvm_faultlog_store *store, const int *pages, unsigned n)
{
	struct ukvm_faultlog_writer w = { 0 };
	struct ukvm_error err = { 0 };
	unsigned i;

	ukvm_faultlog_store_init(store);
	CHECK_EQ(ukvm_faultlog_store_create(store, UKVM_LOG_CHUNK, n, "uffd 0", &err), 0);
	for (i = 0; i < n; i++) {
		struct ukvm_fault_record *rec = ukvm_faultlog_next(store, &w);

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
	struct ukvm_faultlog_store store, *stores[] = { &store };

	memset(vcpu, 0, sizeof(*vcpu));
	store_with(&store, pages, n);
	*log = (struct ukvm_faultlog){
		.nr_vcpus = 1, .tids = tids, .region_gpa = GPA, .region_pages = PAGES,
		.page_size = PAGE, .match_bytes = PAGE, .vcpus = vcpu, .readers_per_uffd = 1,
	};
	CHECK_EQ(ukvm_faultlog_build(log, stores, 1), 0);
	ukvm_faultlog_store_destroy(&store);
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
	UKT_CASE("a store whose chunks are all claimed hands out no more records") {
		struct ukvm_faultlog_store store;
		struct ukvm_faultlog_writer a = { 0 }, b = { 0 };
		struct ukvm_error err = { 0 };
		unsigned i, got = 0;

		ukvm_faultlog_store_init(&store);
		CHECK_EQ(ukvm_faultlog_store_create(&store, 2 * UKVM_LOG_CHUNK, 0, "uffd 0", &err), 0);
		/* Two writers, a chunk each: every record distinct, then none. */
		for (i = 0; i < UKVM_LOG_CHUNK; i++) {
			struct ukvm_fault_record *x = ukvm_faultlog_next(&store, &a);
			struct ukvm_fault_record *y = ukvm_faultlog_next(&store, &b);

			got += x && y && x != y;
		}
		CHECK_EQ(got, UKVM_LOG_CHUNK);
		CHECK(!ukvm_faultlog_next(&store, &a), "a third chunk from a store of two");
		ukvm_faultlog_store_destroy(&store);
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
