/* SPDX-License-Identifier: MIT */
/*
 * ukvm_experiment_cancel: a run that would take seconds ends promptly with
 * UKVM_ERR_CANCELLED, whatever its readers are blocked in (poll, epoll, a
 * blocking read, a delay, nothing at all because the one reader left), from
 * the main thread or another one, during setup or while the vCPUs run.
 * ukvm_experiment_wait times out while it runs and returns 0 once it ended.
 */
#include <pthread.h>

#include "helpers.h"

/* Cancel to the end of ukvm_experiment_finish, at most. */
#define PROMPT_NS	(1500 * NSEC_PER_MSEC)
/* A vCPU stuck on a fault nobody resolves is released after 500 ms. */
#define PROMPT_STUCK_NS	(2500 * NSEC_PER_MSEC)

/* 1 vCPU x 8 MiB at 2 ms per fault: 4 s unless cancelled. */
static struct ukvm_config slow_config(void)
{
	struct ukvm_config cfg = ukt_small();

	cfg.vcpus = 1;
	cfg.mem_per_vcpu = 8 * MiB;
	cfg.delay_us = 2000;
	return cfg;
}

/* Starts cfg, cancels it after delay_ms, expects a prompt UKVM_ERR_CANCELLED. */
static void cancel_after(const struct ukvm_config *cfg, unsigned delay_ms, uint64_t prompt_ns)
{
	struct ukvm_experiment *exp;
	struct ukvm_result res;
	struct ukvm_error err;
	uint64_t t0;
	int ret;

	ret = ukvm_experiment_start(cfg, &exp, &err);
	if (ret && err.kind == UKVM_ERR_HOST) {
		ukt_skip_case(err.message);
		return;
	}
	if (!CHECK(ret == 0, "start: %s", err.message))
		return;
	if (delay_ms) {
		ukt_sleep_ms(delay_ms);
		CHECK(ukvm_experiment_wait(exp, NSEC_PER_MSEC) == -ETIMEDOUT,
		      "the experiment ended by itself within %u ms", delay_ms);
	}
	t0 = ukt_now_ns();
	ukvm_experiment_cancel(exp);
	ret = ukvm_experiment_finish(exp, &res, &err);
	CHECK_LT(ukt_now_ns() - t0, prompt_ns);
	CHECK(ret != 0, "finished with a result");
	CHECK(err.kind == UKVM_ERR_CANCELLED, "kind %s: %s", ukt_kind_name(err.kind), err.message);
	if (ret == 0)
		ukvm_result_free(&res);
}

struct canceller {
	struct ukvm_experiment *exp;
	unsigned delay_ms;
	int calls;
};

static void *canceller_thread(void *arg)
{
	struct canceller *c = arg;
	int i;

	ukt_sleep_ms(c->delay_ms);
	for (i = 0; i < c->calls; i++)
		ukvm_experiment_cancel(c->exp);
	return NULL;
}

int main(void)
{
	struct ukvm_experiment *exp;
	struct ukvm_config cfg;
	struct ukvm_result res;
	struct ukvm_error err;
	unsigned i;
	int ret;

	ukt_init("cancel");

	for (i = 0; i < ARRAY_SIZE(ukt_waits); i++) {
		UKT_CASE("%s: cancel while readers sleep out a delay", ukvm_wait_name(ukt_waits[i])) {
			cfg = slow_config();
			cfg.wait = ukt_waits[i];
			cfg.readers = 2;
			cancel_after(&cfg, 30, PROMPT_NS);
		}
		UKT_CASE("%s: cancel with readers blocked and a vCPU stuck on a fault",
			 ukvm_wait_name(ukt_waits[i])) {
			/* Reader 1 of the single uffd leaves at fault 3 without resolving it. */
			cfg = ukt_small();
			cfg.wait = ukt_waits[i];
			cfg.single_uffd = true;
			cfg.readers = 2;
			cfg.inject = UKVM_INJECT_READER_EXIT;
			cfg.inject_after = 3;
			cancel_after(&cfg, 60, PROMPT_STUCK_NS);
		}
	}

	UKT_CASE("cancel while the readers retry EAGAIN: they give up at once") {
		/*
		 * Every resolving ioctl fails with EAGAIN (injected, for ever). A
		 * reader retries for a second before it gives up, unless the run
		 * is cancelled: then the run must end well within that second.
		 */
		uint64_t t0;

		cfg = ukt_small();
		cfg.readers = 2;
		cfg.inject = UKVM_INJECT_RESOLVE_EAGAIN;
		cfg.inject_after = UINT64_MAX;
		ret = ukvm_experiment_start(&cfg, &exp, &err);
		if (CHECK(ret == 0, "start: %s", err.message)) {
			ukt_sleep_ms(150);
			CHECK(ukvm_experiment_wait(exp, 0) == -ETIMEDOUT, "ended by itself");
			t0 = ukt_now_ns();
			ukvm_experiment_cancel(exp);
			CHECK_EQ(ukvm_experiment_wait(exp, 10 * NSEC_PER_SEC), 0);
			CHECK_LT(ukt_now_ns() - t0, 400 * NSEC_PER_MSEC);
			ret = ukvm_experiment_finish(exp, &res, &err);
			CHECK(ret != 0 && err.kind == UKVM_ERR_CANCELLED, "kind %s: %s",
			      ukt_kind_name(err.kind), err.message);
			if (ret == 0)
				ukvm_result_free(&res);
		}
	}

	UKT_CASE("cancel right after start, during setup") {
		cfg = slow_config();
		cancel_after(&cfg, 0, PROMPT_NS);
	}

	UKT_CASE("cancel during a MINOR run's setup") {
		cfg = slow_config();
		cfg.backing = UKVM_BACKING_SHMEM;
		cfg.uffd_mode = UKVM_UFFD_MINOR;
		cfg.mem_per_vcpu = 32 * MiB;
		cancel_after(&cfg, 0, PROMPT_NS);
	}

	UKT_CASE("cancel a 2-vCPU run with a uffd per vCPU") {
		cfg = slow_config();
		cfg.vcpus = 2;
		cfg.readers = 3;
		cancel_after(&cfg, 20, PROMPT_NS);
	}

	UKT_CASE("cancel from another thread, twice, while the caller waits") {
		struct canceller c = { .delay_ms = 20, .calls = 2 };
		pthread_t t;
		uint64_t t0;

		cfg = slow_config();
		cfg.wait = UKVM_WAIT_READ;
		ret = ukvm_experiment_start(&cfg, &exp, &err);
		if (CHECK(ret == 0, "start: %s", err.message)) {
			c.exp = exp;
			t0 = ukt_now_ns();
			CHECK(pthread_create(&t, NULL, canceller_thread, &c) == 0);
			/* ukvm_experiment_wait, not finish: the canceller may still use exp. */
			CHECK_EQ(ukvm_experiment_wait(exp, UINT64_MAX), 0);
			CHECK_LT(ukt_now_ns() - t0, 20 * NSEC_PER_MSEC + PROMPT_NS);
			pthread_join(t, NULL);
			CHECK_EQ(ukvm_experiment_wait(exp, 0), 0);
			ret = ukvm_experiment_finish(exp, &res, &err);
			CHECK(ret != 0 && err.kind == UKVM_ERR_CANCELLED, "kind %s: %s",
			      ukt_kind_name(err.kind), err.message);
			if (ret == 0)
				ukvm_result_free(&res);
		}
	}

	UKT_CASE("wait in slices, as the Python binding does, then cancel") {
		uint64_t t0 = ukt_now_ns();
		int slices = 0;

		cfg = slow_config();
		ret = ukvm_experiment_start(&cfg, &exp, &err);
		if (CHECK(ret == 0, "start: %s", err.message)) {
			while (ukvm_experiment_wait(exp, 5 * NSEC_PER_MSEC) == -ETIMEDOUT &&
			       ++slices < 10)
				;
			CHECK_EQ(slices, 10);
			/* Ten 5 ms slices take at least 50 ms, and not much more. */
			CHECK_GE(ukt_now_ns() - t0, 50 * NSEC_PER_MSEC);
			ukvm_experiment_cancel(exp);
			CHECK_EQ(ukvm_experiment_wait(exp, 10 * NSEC_PER_SEC), 0);
			ret = ukvm_experiment_finish(exp, &res, &err);
			CHECK(ret != 0 && err.kind == UKVM_ERR_CANCELLED, "kind %s: %s",
			      ukt_kind_name(err.kind), err.message);
			if (ret == 0)
				ukvm_result_free(&res);
		}
	}

	UKT_CASE("cancel at every moment of a short run: setup, run, verification, end") {
		struct timespec ts = { 0 };
		unsigned step, outcomes[2] = { 0 };

		cfg = ukt_small();
		cfg.readers = 2;
		/* A run takes some 20 ms here, 50 to 80 ms under a sanitizer. */
		for (step = 0; step < 16; step++) {
			ret = ukvm_experiment_start(&cfg, &exp, &err);
			if (!CHECK(ret == 0, "start: %s", err.message))
				break;
			ts.tv_nsec = (long)step * 4000000;	/* 0 to 60 ms */
			nanosleep(&ts, NULL);
			ukvm_experiment_cancel(exp);
			ret = ukvm_experiment_finish(exp, &res, &err);
			if (ret == 0) {
				/* Ended before the cancel: what it returns must be whole. */
				ukt_check_result(&cfg, &res);
				ukvm_result_free(&res);
			} else {
				CHECK(err.kind == UKVM_ERR_CANCELLED, "kind %s: %s",
				      ukt_kind_name(err.kind), err.message);
			}
			outcomes[ret == 0]++;
		}
		printf("  %u cancelled, %u ended first\n", outcomes[0], outcomes[1]);
		CHECK_GE(outcomes[0], 1);
	}

	UKT_CASE("an experiment that ends on its own, waited for then finished") {
		cfg = ukt_small();
		ret = ukvm_experiment_start(&cfg, &exp, &err);
		if (CHECK(ret == 0, "start: %s", err.message)) {
			CHECK_EQ(ukvm_experiment_wait(exp, 30 * NSEC_PER_SEC), 0);
			CHECK_EQ(ukvm_experiment_wait(exp, 0), 0);
			ret = ukvm_experiment_finish(exp, &res, &err);
			if (CHECK(ret == 0, "kind %s: %s", ukt_kind_name(err.kind), err.message)) {
				ukt_check_result(&cfg, &res);
				ukvm_result_free(&res);
			}
		}
	}

	UKT_CASE("cancel after the experiment ended on its own") {
		/*
		 * ukvm.h only promises to stop a running experiment. Either outcome
		 * is accepted here; the point is that nothing leaks or races.
		 */
		cfg = ukt_small();
		ret = ukvm_experiment_start(&cfg, &exp, &err);
		if (CHECK(ret == 0, "start: %s", err.message)) {
			CHECK_EQ(ukvm_experiment_wait(exp, 30 * NSEC_PER_SEC), 0);
			ukvm_experiment_cancel(exp);
			ret = ukvm_experiment_finish(exp, &res, &err);
			if (ret == 0) {
				ukt_check_result(&cfg, &res);
				ukvm_result_free(&res);
			} else {
				CHECK(err.kind == UKVM_ERR_CANCELLED, "kind %s: %s",
				      ukt_kind_name(err.kind), err.message);
				printf("  note: cancel after the end discards the result (%s)\n",
				       err.message);
			}
		}
	}

	return ukt_exit();
}
