/* SPDX-License-Identifier: MIT */
/*
 * source file: pages come from a snapshot written with ukvm_snapshot_write,
 * read by pread or from a mapping, by readers and by resolving vCPUs, with
 * copy and move; every page verified against the file. A fetch from the
 * wrong offset (injected) fails verification, and a missing or short file
 * is the config's error. Under TSan: several readers fetch at once, each
 * through its own conn.
 */
#include <unistd.h>

#include "helpers.h"

static char snap_path[64];

/* Every message fetched one page, and the core says it ran the file. */
static void check_fetched(const struct ukvm_result *r)
{
	uint64_t bytes = 0, messages = 0;
	uint32_t i;

	CHECK_EQ(r->source, UKVM_SOURCE_FILE);
	for (i = 0; i < r->nr_readers; i++) {
		bytes += r->readers[i].source_bytes;
		messages += r->readers[i].faults + r->readers[i].eexist;
	}
	CHECK_EQ(bytes, messages * r->page_size);
}

static void run_file(const struct ukvm_config *cfg)
{
	struct ukvm_result res;

	if (!ukt_run_ok(cfg, &res))
		return;
	ukt_check_result(cfg, &res);
	check_fetched(&res);
	ukvm_result_free(&res);
}

static struct ukvm_config file_cfg(void)
{
	struct ukvm_config cfg = ukt_small();

	cfg.source = UKVM_SOURCE_FILE;
	snprintf(cfg.source_path, sizeof(cfg.source_path), "%s", snap_path);
	cfg.write_percent = 50;
	cfg.readers = 2;
	return cfg;
}

int main(void)
{
	struct ukvm_config cfg;
	struct ukvm_result res;
	struct ukvm_error err = { 0 };
	int fd;

	ukt_init("source_file");
	ukt_temp_template(snap_path, sizeof(snap_path), "/var/tmp", "ukvm-source");
	fd = mkstemp(snap_path);
	if (fd < 0 || close(fd) || ukvm_snapshot_write(snap_path, 4 * MiB, 5, &err)) {
		ukt_skip_program("cannot write a snapshot as %s: %s", snap_path, err.message);
		return ukt_exit();
	}

	UKT_CASE("copy by readers, pread, warm") {
		cfg = file_cfg();
		run_file(&cfg);
	}
	UKT_CASE("copy by readers, mmap, cold: nothing cached at start") {
		cfg = file_cfg();
		cfg.source_read = UKVM_SOURCE_READ_MMAP;
		cfg.source_cache = UKVM_SOURCE_CACHE_COLD;
		if (ukt_run_ok(&cfg, &res)) {
			ukt_check_result(&cfg, &res);
			check_fetched(&res);
			CHECK_EQ(res.source_cached_pages_at_start, 0);
			ukvm_result_free(&res);
		}
	}
	UKT_CASE("move by vCPUs, one uffd") {
		cfg = file_cfg();
		cfg.readers = 1;
		cfg.resolver = UKVM_RESOLVER_VCPU;
		cfg.resolve = UKVM_RESOLVE_MOVE;
		cfg.single_uffd = true;
		run_file(&cfg);
	}
	UKT_CASE("overlap: readers race for pages (EEXIST), each fetching") {
		cfg = file_cfg();
		cfg.overlap = true;
		cfg.readers = 3;
		cfg.mem_per_vcpu = 4 * MiB;
		run_file(&cfg);
	}
	UKT_CASE("a page from the wrong offset fails verification, named") {
		cfg = file_cfg();
		cfg.inject = UKVM_INJECT_SOURCE_WRONG_OFFSET;
		cfg.inject_after = 7;
		if (ukt_run_ok(&cfg, &res)) {
			CHECK(!res.verified);
			CHECK_EQ(res.bad_pages, 1);
			CHECK(strstr(res.verify_message, ukt_fmt("page at gpa 0x%" PRIx64 ":",
								 res.region_gpa + 7 * PAGE)),
			      "%s", res.verify_message);
			ukvm_result_free(&res);
		}
	}
	UKT_CASE("a short file is the config's error") {
		cfg = file_cfg();
		cfg.mem_per_vcpu = 4 * MiB;	/* 8 MiB region, 4 MiB file */
		ukt_run_fails(&cfg, UKVM_ERR_CONFIG, -1, "smaller than the test region", NULL);
	}
	UKT_CASE("a missing file is the config's error") {
		cfg = file_cfg();
		snprintf(cfg.source_path, sizeof(cfg.source_path), "%s.none", snap_path);
		ukt_run_fails(&cfg, UKVM_ERR_CONFIG, -1, "does not exist", NULL);
	}
	UKT_CASE("remote without a server's address is refused") {
		cfg = ukt_small();
		cfg.source = UKVM_SOURCE_REMOTE;
		ukt_run_fails(&cfg, UKVM_ERR_CONFIG, -1, "source_address: source='remote' needs",
			      NULL);
	}
	unlink(snap_path);
	return ukt_exit();
}
