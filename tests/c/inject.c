/* SPDX-License-Identifier: MIT */
/*
 * Every test-only fault injection of enum ukvm_inject but THREAD_CREATE
 * (thread_create.c), READER_EXIT (timeout.c, cancel.c), the stalls
 * (stall.c) and RELEASE_DUP3 (pool_internals.c) makes the run fail the way
 * ukvm.h says, with an error that says what happened.
 */
#include "helpers.h"

static const struct {
	enum ukvm_uffd_mode mode;
	enum ukvm_backing backing;
} modes[] = {
	{ UKVM_UFFD_MISSING, UKVM_BACKING_ANONYMOUS },
	{ UKVM_UFFD_MISSING, UKVM_BACKING_SHMEM },
	{ UKVM_UFFD_MINOR, UKVM_BACKING_SHMEM },
	{ UKVM_UFFD_NONE, UKVM_BACKING_ANONYMOUS },
};

int main(void)
{
	struct ukvm_config cfg;
	struct ukvm_result res;
	unsigned i;

	ukt_init("inject");

	for (i = 0; i < ARRAY_SIZE(ukt_waits); i++) {
		UKT_CASE("RESOLVE_EIO, %s, single uffd, 3 readers", ukvm_wait_name(ukt_waits[i])) {
			cfg = ukt_small();
			cfg.wait = ukt_waits[i];
			cfg.single_uffd = true;
			cfg.readers = 3;
			cfg.inject = UKVM_INJECT_RESOLVE_EIO;
			cfg.inject_after = 17;
			ukt_run_fails(&cfg, UKVM_ERR_RUN, EIO, "UFFDIO_COPY", NULL);
		}
	}

	/*
	 * Below, two readers per uffd: a vCPU whose fault died with its only
	 * reader waits out the core's 500 ms stuck-vCPU release (timeout.c).
	 */
	UKT_CASE("RESOLVE_EIO on the first fault, uffd per vCPU") {
		cfg = ukt_small();
		cfg.readers = 2;
		cfg.inject = UKVM_INJECT_RESOLVE_EIO;
		cfg.inject_after = 1;
		ukt_run_fails(&cfg, UKVM_ERR_RUN, EIO, "UFFDIO_COPY", NULL);
	}

	UKT_CASE("RESOLVE_EIO, MINOR on shmem") {
		cfg = ukt_small();
		cfg.backing = UKVM_BACKING_SHMEM;
		cfg.uffd_mode = UKVM_UFFD_MINOR;
		cfg.readers = 2;
		cfg.inject = UKVM_INJECT_RESOLVE_EIO;
		cfg.inject_after = 100;
		ukt_run_fails(&cfg, UKVM_ERR_RUN, EIO, "UFFDIO_CONTINUE", NULL);
	}

	UKT_CASE("RESOLVE_EIO after the last fault: the run succeeds") {
		cfg = ukt_small();
		cfg.inject = UKVM_INJECT_RESOLVE_EIO;
		cfg.inject_after = cfg.vcpus * cfg.mem_per_vcpu / PAGE + 1;
		if (ukt_run_ok(&cfg, &res)) {
			ukt_check_result(&cfg, &res);
			ukvm_result_free(&res);
		}
	}

	for (i = 0; i < ARRAY_SIZE(modes); i++) {
		const char *m = ukvm_uffd_mode_name(modes[i].mode);
		const char *b = ukvm_backing_name(modes[i].backing);

		UKT_CASE("GUEST_FAULT, %s on %s: the guest takes #PF", m, b) {
			cfg = ukt_small();
			cfg.uffd_mode = modes[i].mode;
			cfg.backing = modes[i].backing;
			cfg.inject = UKVM_INJECT_GUEST_FAULT;
			cfg.inject_after = 10;
			ukt_run_fails(&cfg, UKVM_ERR_RUN, 0, "#PF", NULL);
		}
		UKT_CASE("GUEST_MMIO, %s on %s: an MMIO exit", m, b) {
			cfg = ukt_small();
			cfg.uffd_mode = modes[i].mode;
			cfg.backing = modes[i].backing;
			cfg.inject = UKVM_INJECT_GUEST_MMIO;
			cfg.inject_after = 10;
			ukt_run_fails(&cfg, UKVM_ERR_RUN, 0, "MMIO", NULL);
		}
		UKT_CASE("CORRUPT_PAGE, %s on %s: one bad page", m, b) {
			cfg = ukt_small();
			cfg.uffd_mode = modes[i].mode;
			cfg.backing = modes[i].backing;
			cfg.inject = UKVM_INJECT_CORRUPT_PAGE;
			cfg.inject_after = 700;	/* in vCPU 1's half */
			if (ukt_run_ok(&cfg, &res)) {
				CHECK(!res.verified, "verified despite a damaged page");
				CHECK_EQ(res.bad_pages, 1);
				CHECK(strstr(res.verify_message, "word 12"), "%s", res.verify_message);
				/* Everything but the memory is as in a good run. */
				CHECK_EQ(res.nr_vcpus, 2);
				CHECK_EQ(res.vcpus[0].pages + res.vcpus[1].pages,
					 cfg.vcpus * cfg.mem_per_vcpu / PAGE);
				ukvm_result_free(&res);
			}
		}
	}

	UKT_CASE("GUEST_FAULT on vCPU 0's last page, overlap") {
		cfg = ukt_small();
		cfg.overlap = true;
		cfg.inject = UKVM_INJECT_GUEST_FAULT;
		cfg.inject_after = cfg.mem_per_vcpu / PAGE - 1;
		ukt_run_fails(&cfg, UKVM_ERR_RUN, 0, "#PF", NULL);
	}

	UKT_CASE("CORRUPT_PAGE, the first page of an overlapped region") {
		cfg = ukt_small();
		cfg.overlap = true;
		cfg.readers = 2;
		cfg.inject = UKVM_INJECT_CORRUPT_PAGE;
		cfg.inject_after = 0;
		/* Here inject_after is a page index, not an event count: the first page. */
		if (ukt_run_ok(&cfg, &res)) {
			CHECK(!res.verified);
			CHECK_EQ(res.bad_pages, 1);
			ukvm_result_free(&res);
		}
	}

	/*
	 * A vCPU that resolves its own fault on a huge unit waits for its
	 * 4 KiB page to be mapped (another thread's copy may be half done): a
	 * mincore() that fails there is the run's failure, named, not taken
	 * for "mapped" (the access after it could take SIGBUS).
	 */
	for (i = 1; i <= 3; i += 2) {
		UKT_CASE("MINCORE_FAIL on wait %u, resolver vcpu on anonymous_thp", i) {
			cfg = ukt_small();
			cfg.resolver = UKVM_RESOLVER_VCPU;
			cfg.backing = UKVM_BACKING_ANONYMOUS_THP;
			cfg.mem_per_vcpu = 8 * MiB;
			cfg.inject = UKVM_INJECT_MINCORE_FAIL;
			cfg.inject_after = i;
			ukt_run_fails(&cfg, UKVM_ERR_RUN, EINVAL, "mincore(the page at 0x", NULL);
		}
	}
	UKT_CASE("MINCORE_FAIL with readers: no vCPU waits, the run succeeds") {
		cfg = ukt_small();
		cfg.backing = UKVM_BACKING_ANONYMOUS_THP;
		cfg.mem_per_vcpu = 8 * MiB;
		cfg.inject = UKVM_INJECT_MINCORE_FAIL;
		cfg.inject_after = 1;
		ukt_run_checked(&cfg);
	}

	UKT_CASE("RESOLVE_EAGAIN for 50 ms: retried by time, the run succeeds") {
		cfg = ukt_small();
		cfg.readers = 2;
		cfg.inject = UKVM_INJECT_RESOLVE_EAGAIN;
		cfg.inject_after = 50;
		ukt_run_checked(&cfg);
	}

	UKT_CASE("RESOLVE_EAGAIN for ever: the ioctl and how long it retried") {
		uint64_t t0 = ukt_now_ns();

		cfg = ukt_small();
		cfg.backing = UKVM_BACKING_SHMEM;
		cfg.uffd_mode = UKVM_UFFD_MINOR;
		cfg.inject = UKVM_INJECT_RESOLVE_EAGAIN;
		cfg.inject_after = UINT64_MAX;
		ukt_run_fails(&cfg, UKVM_ERR_RUN, EAGAIN,
			      "UFFDIO_CONTINUE(4096 bytes at 0x", NULL);
		CHECK_LT(ukt_now_ns() - t0, 3 * NSEC_PER_SEC);
	}

	UKT_CASE("CORRUPT_PAGE past the region: nothing to damage") {
		cfg = ukt_small();
		cfg.inject = UKVM_INJECT_CORRUPT_PAGE;
		cfg.inject_after = cfg.vcpus * cfg.mem_per_vcpu / PAGE;
		if (ukt_run_ok(&cfg, &res)) {
			ukt_check_result(&cfg, &res);
			ukvm_result_free(&res);
		}
	}

	return ukt_exit();
}
