/* SPDX-License-Identifier: MIT */
/*
 * How MISSING faults are resolved: UFFDIO_COPY of a page of known data,
 * UFFDIO_ZEROPAGE, or UFFDIO_MOVE of a staged page of known data. Each
 * reader counts the ioctls it ran, and memory says which one it was: after
 * ZEROPAGE every page the guest only read is zero (verification expects
 * exactly that: a copy would have stamped the page's address into it), and
 * the guest's checksum of what it read is 0; after MOVE every page holds
 * its stamp, as after COPY.
 */
#include "helpers.h"

/* The readers ran `want` for every fault and no other ioctl. */
static void check_ioctls(const struct ukvm_result *r, const char *want)
{
	uint32_t i;

	for (i = 0; i < r->nr_readers; i++) {
		const struct ukvm_reader_result *x = &r->readers[i];
		uint64_t all = x->faults + x->eexist;

		CHECK_EQ(x->copies, strcmp(want, "copy") ? 0 : all);
		CHECK_EQ(x->zeropages, strcmp(want, "zeropage") ? 0 : all);
		CHECK_EQ(x->continues, strcmp(want, "continue") ? 0 : all);
		CHECK_EQ(x->moves, strcmp(want, "move") ? 0 : all);
	}
}

static void run_resolved(const struct ukvm_config *cfg, const char *want)
{
	struct ukvm_result res;

	if (!ukt_run_ok(cfg, &res))
		return;
	ukt_check_result(cfg, &res);
	check_ioctls(&res, want);
	ukvm_result_free(&res);
}

/*
 * Resolver vCPU: each vCPU thread resolves its own faults (no reader
 * threads): ukt_check_result checks that each vCPU's faults came back to it
 * as exits, and the trace that every record is the vCPU's own.
 */
static void run_by_vcpus(struct ukvm_config cfg, const char *want)
{
	struct ukvm_result res;

	cfg.resolver = UKVM_RESOLVER_VCPU;
	cfg.trace_faults = true;
	if (!ukt_run_ok(&cfg, &res))
		return;
	ukt_check_result(&cfg, &res);
	ukt_check_trace(&cfg, &res);
	check_ioctls(&res, want);
	ukvm_result_free(&res);
}

int main(void)
{
	static const uint32_t percents[] = { 0, 50, 100 };
	static const enum ukvm_backing backings[] = { UKVM_BACKING_ANONYMOUS, UKVM_BACKING_SHMEM };
	struct ukvm_config cfg;
	unsigned b, i;

	ukt_init("resolve");

	UKT_CASE("resolver vcpu: copy, per-vCPU uffds, reads and writes") {
		cfg = ukt_small();
		cfg.vcpus = 2;
		cfg.write_percent = 50;
		run_by_vcpus(cfg, "copy");
	}
	UKT_CASE("resolver vcpu: zeropage, one uffd") {
		cfg = ukt_small();
		cfg.vcpus = 2;
		cfg.single_uffd = true;
		cfg.resolve = UKVM_RESOLVE_ZEROPAGE;
		run_by_vcpus(cfg, "zeropage");
	}
	UKT_CASE("resolver vcpu: minor on shmem, overlap") {
		cfg = ukt_small();
		cfg.vcpus = 2;
		cfg.overlap = true;
		cfg.backing = UKVM_BACKING_SHMEM;
		cfg.uffd_mode = UKVM_UFFD_MINOR;
		run_by_vcpus(cfg, "continue");
	}

	for (b = 0; b < ARRAY_SIZE(backings); b++) {
		for (i = 0; i < ARRAY_SIZE(percents); i++) {
			UKT_CASE("zeropage on %s, write_percent %u", ukvm_backing_name(backings[b]),
				 percents[i]) {
				cfg = ukt_small();
				cfg.mem_per_vcpu = MiB;
				cfg.backing = backings[b];
				cfg.resolve = UKVM_RESOLVE_ZEROPAGE;
				cfg.write_percent = percents[i];
				cfg.pattern = UKVM_PATTERN_RANDOM;
				cfg.readers = 2;
				run_resolved(&cfg, "zeropage");
			}
		}
		UKT_CASE("copy on %s, write_percent 50 (the other resolver)",
			 ukvm_backing_name(backings[b])) {
			cfg = ukt_small();
			cfg.mem_per_vcpu = MiB;
			cfg.backing = backings[b];
			cfg.write_percent = 50;
			cfg.readers = 2;
			run_resolved(&cfg, "copy");
		}
	}

	/* UFFDIO_MOVE: more faults per reader than a staging area holds (64 pages). */
	UKT_CASE("move: per-vCPU uffds, 2 readers, reads and writes") {
		cfg = ukt_small();
		cfg.vcpus = 2;
		cfg.mem_per_vcpu = MiB;
		cfg.resolve = UKVM_RESOLVE_MOVE;
		cfg.write_percent = 50;
		cfg.pattern = UKVM_PATTERN_RANDOM;
		cfg.readers = 2;
		run_resolved(&cfg, "move");
	}
	UKT_CASE("move, overlap: readers race for the same pages (EEXIST)") {
		cfg = ukt_small();
		cfg.vcpus = 3;
		cfg.mem_per_vcpu = MiB;
		cfg.overlap = true;
		cfg.resolve = UKVM_RESOLVE_MOVE;
		cfg.write_percent = 0;
		cfg.readers = 3;
		run_resolved(&cfg, "move");
	}
	UKT_CASE("resolver vcpu: move, one uffd") {
		cfg = ukt_small();
		cfg.vcpus = 2;
		cfg.mem_per_vcpu = MiB;
		cfg.single_uffd = true;
		cfg.write_percent = 50;
		cfg.resolve = UKVM_RESOLVE_MOVE;
		run_by_vcpus(cfg, "move");
	}

	UKT_CASE("continue: MINOR on shmem") {
		cfg = ukt_small();
		cfg.mem_per_vcpu = MiB;
		cfg.backing = UKVM_BACKING_SHMEM;
		cfg.uffd_mode = UKVM_UFFD_MINOR;
		cfg.write_percent = 50;
		run_resolved(&cfg, "continue");
	}

	UKT_CASE("zeropage, overlap: readers race for the same pages (EEXIST)") {
		cfg = ukt_small();
		cfg.vcpus = 3;
		cfg.mem_per_vcpu = MiB;
		cfg.overlap = true;
		cfg.resolve = UKVM_RESOLVE_ZEROPAGE;
		cfg.write_percent = 0;
		cfg.readers = 3;
		run_resolved(&cfg, "zeropage");
	}

	return ukt_exit();
}
