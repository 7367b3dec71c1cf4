/* SPDX-License-Identifier: MIT */
/*
 * Every path gives back what it took: after many runs, good and failed
 * (config errors, injected failures, timeouts, cancels at different times),
 * the process has the same open fds, the same threads, and none of the
 * core's named mappings (memfd guest memory, vCPU run structs). Memory is
 * LeakSanitizer's job in the ASan build.
 */
#include "helpers.h"

#define ROUNDS	2

static void run_quietly(const struct ukvm_config *cfg)
{
	struct ukvm_result res;
	struct ukvm_error err;

	if (ukvm_run(cfg, &res, &err) == 0)
		ukvm_result_free(&res);
}

static void start_cancel(const struct ukvm_config *cfg, unsigned delay_ms)
{
	struct ukvm_experiment *exp;
	struct ukvm_result res;
	struct ukvm_error err;

	if (ukvm_experiment_start(cfg, &exp, &err))
		return;
	if (delay_ms)
		ukt_sleep_ms(delay_ms);
	ukvm_experiment_cancel(exp);
	if (ukvm_experiment_finish(exp, &res, &err) == 0)
		ukvm_result_free(&res);
}

/* One of everything that can happen to a run. */
static void every_kind_of_run(void)
{
	struct ukvm_config cfg;
	unsigned i, n;

	for (i = 0; i < ARRAY_SIZE(ukt_waits); i++) {
		cfg = ukt_small();
		cfg.wait = ukt_waits[i];
		cfg.readers = 2;
		cfg.mem_per_vcpu = MiB;
		run_quietly(&cfg);		/* success */
		cfg.inject = UKVM_INJECT_RESOLVE_EIO;
		cfg.inject_after = 9;
		run_quietly(&cfg);		/* a reader fails */
	}

	cfg = ukt_small();
	cfg.backing = UKVM_BACKING_SHMEM;
	cfg.uffd_mode = UKVM_UFFD_MINOR;
	cfg.mem_per_vcpu = MiB;
	run_quietly(&cfg);
	cfg.overlap = true;
	run_quietly(&cfg);
	cfg.uffd_mode = UKVM_UFFD_NONE;
	run_quietly(&cfg);

	cfg = ukt_small();
	cfg.vcpus = 0;
	run_quietly(&cfg);			/* config error */
	cfg = ukt_small();
	cfg.vcpus = 100000;
	cfg.mem_per_vcpu = PAGE;
	run_quietly(&cfg);			/* config error found on the host */

	for (n = 1; n <= 5; n++) {		/* a thread fails to start: each one */
		cfg = ukt_small();
		cfg.readers = 2;
		cfg.mem_per_vcpu = MiB;
		cfg.inject = UKVM_INJECT_THREAD_CREATE;
		cfg.inject_after = n;
		run_quietly(&cfg);
	}

	cfg = ukt_small();
	cfg.mem_per_vcpu = MiB;
	cfg.inject = UKVM_INJECT_GUEST_FAULT;
	cfg.inject_after = 3;
	run_quietly(&cfg);
	cfg.inject = UKVM_INJECT_GUEST_MMIO;
	run_quietly(&cfg);
	cfg.inject = UKVM_INJECT_CORRUPT_PAGE;
	run_quietly(&cfg);

	cfg = ukt_small();
	cfg.vcpus = 1;
	cfg.wait = UKVM_WAIT_READ;
	cfg.timeout_ns = 50 * NSEC_PER_MSEC;
	cfg.inject = UKVM_INJECT_READER_EXIT;
	cfg.inject_after = 2;
	run_quietly(&cfg);			/* timeout, a vCPU stuck on a fault */

	cfg = ukt_small();
	cfg.vcpus = 1;
	cfg.mem_per_vcpu = 8 * MiB;
	cfg.delay_us = 2000;
	start_cancel(&cfg, 0);			/* cancelled during setup */
	start_cancel(&cfg, 10);			/* cancelled while running */
	cfg.backing = UKVM_BACKING_SHMEM;
	cfg.uffd_mode = UKVM_UFFD_MINOR;
	start_cancel(&cfg, 1);
}

/* Thread exit is asynchronous to pthread_join by a hair: allow a moment. */
static void check_back_to(int fds, int threads)
{
	uint64_t t0 = ukt_now_ns();

	while ((ukt_open_fds() != fds || ukt_threads() != threads) &&
	       ukt_now_ns() - t0 < NSEC_PER_SEC)
		ukt_sleep_ms(5);
	CHECK_EQ(ukt_open_fds(), fds);
	CHECK_EQ(ukt_threads(), threads);
	CHECK_EQ(ukt_mappings("memfd:uffdkvm-guest"), 0);
	CHECK_EQ(ukt_mappings("kvm-vcpu"), 0);
}

/*
 * The baseline's thread count: the least seen over half a second, since a
 * thread the last round joined leaves /proc/self/task a hair after its join
 * returns, and under TCG the hair is long enough to be counted (a baseline
 * of 2 against 1 after the rounds, in Debian's 6.18 guest).
 */
static int settled_threads(void)
{
	uint64_t t0 = ukt_now_ns();
	int least = ukt_threads(), n;

	while (ukt_now_ns() - t0 < NSEC_PER_SEC / 2) {
		ukt_sleep_ms(10);
		n = ukt_threads();
		if (n < least)
			least = n;
	}
	return least;
}

int main(void)
{
	int fds, threads, round;

	ukt_init("leaks");

	UKT_CASE("fds, threads and mappings after %d rounds of every kind of run", ROUNDS) {
		/* A first round settles what runtimes start lazily (TSan's own thread). */
		every_kind_of_run();
		fds = ukt_open_fds();
		threads = settled_threads();
		CHECK(fds > 0 && threads > 0);
		CHECK_EQ(ukt_mappings("memfd:uffdkvm-guest"), 0);
		for (round = 0; round < ROUNDS; round++) {
			every_kind_of_run();
			check_back_to(fds, threads);
		}
	}

	return ukt_exit();
}
