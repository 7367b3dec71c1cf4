/* SPDX-License-Identifier: MIT */
/*
 * A thread that will not stop (UKVM_INJECT_READER_STALL, _VCPU_STALL: it
 * stays STALL_MS after its run, deaf to stop and kicks) fails its run within
 * seconds with UKVM_ERR_RUN naming it, never hangs the caller, and keeps its
 * experiment until it leaves: ASan would see the stalled thread touch
 * freed memory otherwise. ukvm_wait_idle_for() names it meanwhile and
 * returns once it has left; then every fd and thread is back. A cancel
 * answers within CANCEL_NS whatever the stalled thread does.
 *
 * The three runs go at once, so the program takes one stall, not three.
 */
#include "helpers.h"

#define STALL_MS	3000
/* Stopping waits 2 s for the vCPUs, then 2 s for the readers. */
#define ERROR_NS	(3500 * NSEC_PER_MSEC)
#define CANCEL_NS	(800 * NSEC_PER_MSEC)

static struct ukvm_experiment *start(const struct ukvm_config *cfg)
{
	struct ukvm_experiment *exp = NULL;
	struct ukvm_error err;

	if (!CHECK(ukvm_experiment_start(cfg, &exp, &err) == 0, "start: %s", err.message))
		return NULL;
	return exp;
}

/* Finishes exp, expecting kind and a message that contains needle, within limit_ns. */
static void finish_fails(struct ukvm_experiment *exp, uint64_t t0, uint64_t limit_ns,
			 enum ukvm_error_kind kind, const char *needle)
{
	struct ukvm_result res;
	struct ukvm_error err;
	int ret;

	if (!exp)
		return;
	ret = ukvm_experiment_finish(exp, &res, &err);
	CHECK_LT(ukt_now_ns() - t0, limit_ns);
	CHECK(ret != 0, "finished with a result");
	if (ret == 0)
		ukvm_result_free(&res);
	CHECK(err.kind == kind, "kind %s: %s", ukt_kind_name(err.kind), err.message);
	if (needle)
		CHECK(strstr(err.message, needle), "no \"%s\" in: %s", needle, err.message);
	printf("  %s\n", err.message);
}

int main(void)
{
	struct ukvm_experiment *reader_run, *vcpu_run, *cancelled_run;
	struct ukvm_config reader_cfg, vcpu_cfg, cancel_cfg;
	struct ukvm_error err;
	int fds, threads, ret;
	uint64_t t0;

	ukt_init("stall");

	UKT_CASE("a reader and a vCPU that will not stop, and a cancel meanwhile") {
		fds = ukt_open_fds();
		threads = ukt_threads();

		/* Two uffds, readers in read(2): the other uffd's must still be kicked out. */
		reader_cfg = ukt_small();
		reader_cfg.wait = UKVM_WAIT_READ;
		reader_cfg.readers = 2;
		reader_cfg.inject = UKVM_INJECT_READER_STALL;
		reader_cfg.inject_after = STALL_MS;
		vcpu_cfg = ukt_small();
		vcpu_cfg.vcpus = 3;
		vcpu_cfg.inject = UKVM_INJECT_VCPU_STALL;
		vcpu_cfg.inject_after = STALL_MS;
		/* Still running (2 ms a fault) when it is cancelled. */
		cancel_cfg = ukt_small();
		cancel_cfg.vcpus = 1;
		cancel_cfg.delay_us = 2000;
		cancel_cfg.readers = 2;
		cancel_cfg.inject = UKVM_INJECT_READER_STALL;
		cancel_cfg.inject_after = STALL_MS;

		t0 = ukt_now_ns();
		reader_run = start(&reader_cfg);
		vcpu_run = start(&vcpu_cfg);
		cancelled_run = start(&cancel_cfg);
		ukt_sleep_ms(100);
		if (cancelled_run) {
			CHECK(ukvm_experiment_wait(cancelled_run, 0) == -ETIMEDOUT,
			      "the slow run ended by itself");
			uint64_t t1 = ukt_now_ns();

			ukvm_experiment_cancel(cancelled_run);
			finish_fails(cancelled_run, t1, CANCEL_NS, UKVM_ERR_CANCELLED, NULL);
		}
		finish_fails(reader_run, t0, ERROR_NS, UKVM_ERR_RUN,
			     "reader 1 of uffd 0 did not stop within 2.0 s: it was stalled");
		finish_fails(vcpu_run, t0, ERROR_NS, UKVM_ERR_RUN,
			     "vCPU 2 did not stop within 2.0 s: it was stalled");

		/* The stalled threads still run: their experiments are kept, and named. */
		memset(&err, 0, sizeof(err));
		ret = ukvm_wait_idle_for(10 * NSEC_PER_MSEC, &err);
		CHECK(ret == -ETIMEDOUT, "wait_idle_for returned %d", ret);
		CHECK(strstr(err.message, "did not stop within 2.0 s") &&
		      strstr(err.message, "still running"), "%s", err.message);
		CHECK(ukt_count_dir("/proc/self/task") > threads, "the stalled threads are gone");

		/* Once they leave, everything is given back. */
		ret = ukvm_wait_idle_for(10 * NSEC_PER_SEC, &err);
		CHECK(ret == 0, "wait_idle_for returned %d: %s", ret, err.message);
		CHECK_GE(ukt_now_ns() - t0, STALL_MS * NSEC_PER_MSEC);
		t0 = ukt_now_ns();
		while ((ukt_open_fds() != fds || ukt_threads() != threads) &&
		       ukt_now_ns() - t0 < NSEC_PER_SEC)
			ukt_sleep_ms(5);
		CHECK_EQ(ukt_open_fds(), fds);
		CHECK_EQ(ukt_threads(), threads);
		CHECK_EQ(ukt_mappings("kvm-vcpu"), 0);
	}

	/*
	 * A vCPU blocked on a fault of a uffd whose release failed twice
	 * (RELEASE_DUP3, inject_after 2: the swap as the vCPUs are stopped,
	 * and its retry as the readers are; the reader holding the number
	 * stays 3 s, past both): the run fails naming the vCPU, and the
	 * experiment lingers. Once the reader has gone, only the linger's
	 * retry (ukvm_stop_wait_pools, stop_retry_held) lets go of the uffd
	 * and so the vCPU; wait_idle_for returns 0 within a bound. Where the
	 * kick frees the waiting vCPU (as on kvm_pvm with Linux 6.18, where
	 * KVM's wait for a userfault is interruptible), no vCPU is stuck and
	 * neither swap is reached: the run then fails naming the reader, and
	 * the case only drives the linger that waits for it to its end, and
	 * prints which of the two it saw. pool_internals.c keeps a vCPU stuck
	 * by hand and shows the linger's retry on every kernel.
	 */
	UKT_CASE("a vCPU on a uffd whose release failed twice: the linger retries it") {
		struct ukvm_experiment *exp;
		struct ukvm_result res;
		struct ukvm_config cfg = ukt_small();

		fds = ukt_open_fds();
		threads = ukt_threads();
		cfg.vcpus = 1;
		cfg.readers = 2;		/* reader 1 holds the uffd's number */
		cfg.delay_us = 100000;		/* the vCPU waits on a fault when the time is up */
		cfg.timeout_ns = 300 * NSEC_PER_MSEC;
		cfg.inject = UKVM_INJECT_RELEASE_DUP3;
		cfg.inject_after = 2;
		t0 = ukt_now_ns();
		exp = start(&cfg);
		if (exp) {
			memset(&err, 0, sizeof(err));
			ret = ukvm_experiment_finish(exp, &res, &err);
			CHECK(ret != 0, "finished with a result");
			if (ret == 0)
				ukvm_result_free(&res);
			printf("  %s\n", err.message);
			CHECK(strstr(err.message, "did not stop within 2.0 s"), "%s", err.message);
			if (strstr(err.message, "vCPU 0 did not stop"))
				CHECK(strstr(err.message, "uffd 0 could not be let go of"), "%s",
				      err.message);
			else
				printf("  (the kick freed the vCPU here: no vCPU was stuck)\n");
			memset(&err, 0, sizeof(err));
			ret = ukvm_wait_idle_for(10 * NSEC_PER_SEC, &err);
			CHECK(ret == 0, "wait_idle_for returned %d: %s", ret, err.message);
			CHECK_LT(ukt_now_ns() - t0, 8 * NSEC_PER_SEC);
			t0 = ukt_now_ns();
			while ((ukt_open_fds() != fds || ukt_threads() != threads) &&
			       ukt_now_ns() - t0 < NSEC_PER_SEC)
				ukt_sleep_ms(5);
			CHECK_EQ(ukt_open_fds(), fds);
			CHECK_EQ(ukt_threads(), threads);
		}
	}

	UKT_CASE("the next run after them is whole") {
		cancel_cfg = ukt_small();
		ukt_run_checked(&cancel_cfg);
	}

	return ukt_exit();
}
