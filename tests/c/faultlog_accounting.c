/* SPDX-License-Identifier: MIT */
/*
 * White-box cases of the fault log (csrc/uffd/faultlog.c) that no real run can
 * produce: the kernel resolves a page only once, so a run cannot show a
 * page resolved twice while another was never resolved, with the total
 * right. `verified` must still catch that (collect.c asks faultlog.c which
 * pages were not resolved exactly once), so here the records are written by
 * hand into a uffd's store and the log is built as after a run.
 *
 * And the build's blocked time and blocktime are what a brute-force count
 * of nanoseconds says, with spans of no time among the others (they block
 * for none, and must leave no vCPU blocked after them).
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

#define MIX_VCPUS	3
#define MIX_PER_STORE	1500	/* more than a chunk: a writer's partly used chunk leaves a hole */
#define MIX_SPAN	20000

static const int32_t mix_tids[MIX_VCPUS] = { 11, 22, 33 };

/*
 * Deterministic pseudo-random records: overlapping spans of three vCPUs and
 * a stranger; with zeros, every 13th span of no time.
 */
static void mix_stores(struct ukvm_faultlog_store stores[2], bool zeros)
{
	uint64_t x = 12345;
	unsigned s, i;

	for (s = 0; s < 2; s++) {
		struct ukvm_faultlog_writer w[2] = { 0 };
		struct ukvm_error err = { 0 };

		ukvm_faultlog_store_init(&stores[s]);
		CHECK_EQ(ukvm_faultlog_store_create(&stores[s], 8 * UKVM_LOG_CHUNK, 0, "uffd", &err), 0);
		for (i = 0; i < MIX_PER_STORE; i++) {
			struct ukvm_fault_record *rec = ukvm_faultlog_next(&stores[s], &w[i % 2]);
			unsigned who;

			x = x * 6364136223846793005ULL + 1442695040888963407ULL;
			who = (unsigned)(x >> 60) % (MIX_VCPUS + 1);
			rec->read_ns = 1 + (x >> 20) % MIX_SPAN;
			rec->resolved_ns = rec->read_ns +
					   (zeros && i % 13 == 0 ? 0 : 1 + (x >> 8) % 40);
			rec->gpa = GPA + (uint64_t)(i % PAGES) * PAGE;
			rec->vcpu = who < MIX_VCPUS ? mix_tids[who] : 99;
			rec->eexist = (x >> 4) % 7 == 0;
			rec->uffd = (uint16_t)s;
			rec->reader = (uint16_t)(i % 2);
		}
	}
}

static void mix_build(bool zeros, struct ukvm_faultlog *log, struct ukvm_vcpu_result *vcpus,
		      uint8_t (*busy)[MIX_SPAN + 64])
{
	struct ukvm_faultlog_store stores[2], *ptrs[] = { &stores[0], &stores[1] };
	uint64_t t, s, i;

	memset(vcpus, 0, MIX_VCPUS * sizeof(*vcpus));
	mix_stores(stores, zeros);
	/* The brute force: every nanosecond each vCPU had a span open, [read, resolved). */
	memset(busy, 0, MIX_VCPUS * sizeof(*busy));
	for (s = 0; s < 2; s++)
		for (i = 0; i < stores[s].cap; i++) {
			const struct ukvm_fault_record *rec = &stores[s].records[i];
			unsigned v;

			for (v = 0; rec->read_ns && v < MIX_VCPUS; v++)
				if (rec->vcpu == mix_tids[v])
					for (t = rec->read_ns; t < rec->resolved_ns; t++)
						busy[v][t] = 1;
		}
	*log = (struct ukvm_faultlog){
		.nr_vcpus = MIX_VCPUS, .tids = mix_tids, .region_gpa = GPA, .region_pages = PAGES,
		.page_size = PAGE, .match_bytes = PAGE, .vcpus = vcpus, .readers_per_uffd = 2,
	};
	CHECK_EQ(ukvm_faultlog_build(log, ptrs, 2), 0);
	ukvm_faultlog_store_destroy(&stores[0]);
	ukvm_faultlog_store_destroy(&stores[1]);
}

/*
 * The mix built and checked against the brute force: how many numbers
 * differ (0: none).
 */
static unsigned mix_check(bool zeros)
{
	static uint8_t busy[MIX_VCPUS][MIX_SPAN + 64];
	struct ukvm_vcpu_result vcpus[MIX_VCPUS];
	struct ukvm_faultlog log;
	uint64_t t, all = 0, blocked[MIX_VCPUS] = { 0 };
	unsigned v, diff = 0;

	mix_build(zeros, &log, vcpus, busy);
	CHECK_EQ(log.nr_all, 2 * MIX_PER_STORE);
	for (t = 0; t < MIX_SPAN + 64; t++) {
		bool every = true;

		for (v = 0; v < MIX_VCPUS; v++) {
			blocked[v] += busy[v][t];
			every = every && busy[v][t];
		}
		all += every;
	}
	CHECK(all > 0, "the mix has time with every vCPU blocked");
	diff += log.blocktime_ns != all;
	for (v = 0; v < MIX_VCPUS; v++) {
		CHECK(vcpus[v].faults > 0, "every vCPU has faults");
		CHECK_EQ(vcpus[v].service_latency.count, vcpus[v].faults + vcpus[v].eexist);
		if (vcpus[v].blocked_ns != blocked[v])
			printf("# vCPU %u: blocked_ns %llu, the brute force %llu\n", v,
			       (unsigned long long)vcpus[v].blocked_ns,
			       (unsigned long long)blocked[v]);
		diff += vcpus[v].blocked_ns != blocked[v];
	}
	free(log.all);
	return diff;
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
	UKT_CASE("blocked time and blocktime: the brute force's") {
		CHECK_EQ(mix_check(false), 0);
	}
	UKT_CASE("spans of no time among them block for none") {
		CHECK_EQ(mix_check(true), 0);
	}
	return ukt_exit();
}
