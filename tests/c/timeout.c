/* SPDX-License-Identifier: MIT */
/*
 * cfg.timeout_ns: a run that cannot finish (its only reader left without
 * resolving a fault, UKVM_INJECT_READER_EXIT) or that is merely slow ends
 * with UKVM_ERR_TIMEOUT shortly after the limit, for every way of waiting.
 * Without a limit (timeout_ns 0), ukvm_run() (start, then finish) still
 * returns, with UKVM_ERR_TIMEOUT, once the walk has made no progress for
 * finish's no-progress limit: a C caller has no thread to cancel it from.
 */
#include "helpers.h"

#define LIMIT_NS	(100 * NSEC_PER_MSEC)
/* Past the limit: stopping, and releasing a vCPU stuck on a fault. */
#define SHORTLY_NS	(2000 * NSEC_PER_MSEC)

/* Runs cfg, expects UKVM_ERR_TIMEOUT within [timeout, timeout + SHORTLY_NS). */
static void expect_timeout(const struct ukvm_config *cfg)
{
	struct ukvm_error err;
	uint64_t t0 = ukt_now_ns(), took;

	if (!ukt_run_fails(cfg, UKVM_ERR_TIMEOUT, 0, "timeout", &err))
		return;
	took = ukt_now_ns() - t0;
	CHECK_GE(took, cfg->timeout_ns);
	CHECK_LT(took, cfg->timeout_ns + SHORTLY_NS);
}

int main(void)
{
	struct ukvm_config cfg;
	unsigned i;

	ukt_init("timeout");

	for (i = 0; i < ARRAY_SIZE(ukt_waits); i++) {
		UKT_CASE("%s: 1 of 2 readers of the one uffd leaves at fault 5",
			 ukvm_wait_name(ukt_waits[i])) {
			/* The other reader stays, blocked in its wait until the end. */
			cfg = ukt_small();
			cfg.single_uffd = true;
			cfg.wait = ukt_waits[i];
			cfg.readers = 2;
			cfg.timeout_ns = LIMIT_NS;
			cfg.inject = UKVM_INJECT_READER_EXIT;
			cfg.inject_after = 5;
			expect_timeout(&cfg);
		}
	}

	/*
	 * No reader left at all: where a signal does not pull a vCPU out of
	 * KVM's wait for the fault, only closing the uffd frees it (the
	 * core's 500 ms "stuck vCPU" release).
	 */
	for (i = 0; i < ARRAY_SIZE(ukt_waits); i++) {
		if (ukt_waits[i] != UKVM_WAIT_READ && ukt_waits[i] != UKVM_WAIT_EPOLL_EXCLUSIVE)
			continue;
		UKT_CASE("%s: the only reader leaves at fault 5", ukvm_wait_name(ukt_waits[i])) {
			cfg = ukt_small();
			cfg.vcpus = 1;
			cfg.wait = ukt_waits[i];
			cfg.readers = 1;
			cfg.timeout_ns = LIMIT_NS;
			cfg.inject = UKVM_INJECT_READER_EXIT;
			cfg.inject_after = 5;
			expect_timeout(&cfg);
		}
	}

	UKT_CASE("2 vCPUs, a uffd each: one reader leaves, the other vCPU finishes") {
		cfg = ukt_small();
		cfg.timeout_ns = LIMIT_NS;
		cfg.inject = UKVM_INJECT_READER_EXIT;
		cfg.inject_after = 1;
		expect_timeout(&cfg);
	}

	UKT_CASE("MINOR on shmem, 1 of 2 readers leaves at the first fault") {
		cfg = ukt_small();
		cfg.backing = UKVM_BACKING_SHMEM;
		cfg.uffd_mode = UKVM_UFFD_MINOR;
		cfg.single_uffd = true;
		cfg.readers = 2;
		cfg.timeout_ns = LIMIT_NS;
		cfg.inject = UKVM_INJECT_READER_EXIT;
		cfg.inject_after = 1;
		expect_timeout(&cfg);
	}

	UKT_CASE("a slow run: 8 MiB at 2 ms per fault") {
		cfg = ukt_small();
		cfg.vcpus = 1;
		cfg.mem_per_vcpu = 8 * MiB;
		cfg.delay_us = 2000;
		cfg.timeout_ns = LIMIT_NS;
		expect_timeout(&cfg);
	}

	UKT_CASE("a limit that passes during setup") {
		cfg = ukt_small();
		cfg.timeout_ns = 1;
		expect_timeout(&cfg);
	}

	/*
	 * The last vCPU never enters its guest (UKVM_INJECT_VCPU_HANG, which
	 * also makes the no-progress limit inject_after ms): the other one
	 * finishes, then nothing moves. Without the watch, finish waited here
	 * for ever.
	 */
	UKT_CASE("no limit: a run that stops making progress") {
		struct ukvm_error err;
		uint64_t t0 = ukt_now_ns(), took;

		cfg = ukt_small();
		cfg.vcpus = 2;
		cfg.timeout_ns = 0;
		cfg.inject = UKVM_INJECT_VCPU_HANG;
		cfg.inject_after = LIMIT_NS / NSEC_PER_MSEC;
		if (ukt_run_fails(&cfg, UKVM_ERR_TIMEOUT, 0, "made no progress for 0.1 s and has "
				  "no time limit (timeout_ns 0): 1 of 2 vCPUs were still running",
				  &err)) {
			took = ukt_now_ns() - t0;
			CHECK_GE(took, LIMIT_NS);
			CHECK_LT(took, LIMIT_NS + SHORTLY_NS);
		}
	}

	return ukt_exit();
}
