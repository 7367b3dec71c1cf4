/* SPDX-License-Identifier: MIT */
/*
 * The reader pools: every way of waiting, with one uffd per vCPU and with
 * one uffd shared by several readers (the herd), for COPY and CONTINUE, and
 * with a delay so that readers sleep while others wait. Exact fault counts
 * per uffd and wakeup accounting per reader. io_uring runs in every case
 * where the build has liburing, and is refused where it has not.
 */
#include "helpers.h"

int main(void)
{
	struct ukvm_config cfg;
	unsigned i;

	ukt_init("wait_modes");

	for (i = 0; i < ARRAY_SIZE(ukt_waits); i++) {
		const char *w = ukvm_wait_name(ukt_waits[i]);

		UKT_CASE("%s: uffd per vCPU, 2 readers each", w) {
			cfg = ukt_small();
			cfg.wait = ukt_waits[i];
			cfg.readers = 2;
			ukt_run_checked(&cfg);
		}
		UKT_CASE("%s: single uffd, 4 readers", w) {
			cfg = ukt_small();
			cfg.wait = ukt_waits[i];
			cfg.single_uffd = true;
			cfg.readers = 4;
			ukt_run_checked(&cfg);
		}
		UKT_CASE("%s: single uffd, 4 readers, batches of 16", w) {
			cfg = ukt_small();
			cfg.wait = ukt_waits[i];
			cfg.single_uffd = true;
			cfg.readers = 4;
			cfg.read_batch = 16;
			ukt_run_checked(&cfg);
		}
		UKT_CASE("%s: MINOR on shmem, single uffd, 3 readers", w) {
			cfg = ukt_small();
			cfg.backing = UKVM_BACKING_SHMEM;
			cfg.uffd_mode = UKVM_UFFD_MINOR;
			cfg.wait = ukt_waits[i];
			cfg.single_uffd = true;
			cfg.readers = 3;
			ukt_run_checked(&cfg);
		}
		UKT_CASE("%s: MISSING on shmem, 1 vCPU, 2 readers, 20 us delay", w) {
			cfg = ukt_small();
			cfg.vcpus = 1;
			cfg.mem_per_vcpu = MiB;
			cfg.backing = UKVM_BACKING_SHMEM;
			cfg.wait = ukt_waits[i];
			cfg.readers = 2;
			cfg.delay_us = 20;
			ukt_run_checked(&cfg);
		}
	}

	UKT_CASE("spin: 1 vCPU, 1 reader that never sleeps") {
		cfg = ukt_small();
		cfg.vcpus = 1;
		cfg.wait = UKVM_WAIT_SPIN;
		ukt_run_checked(&cfg);
	}
	UKT_CASE("spin: single uffd, 2 readers, batches of 4") {
		cfg = ukt_small();
		cfg.vcpus = 1;
		cfg.wait = UKVM_WAIT_SPIN;
		cfg.single_uffd = true;
		cfg.readers = 2;
		cfg.read_batch = 4;
		ukt_run_checked(&cfg);
	}

	UKT_CASE("spin_idle: 2 vCPUs, a uffd and a SCHED_IDLE spinner each, all on one CPU") {
		int32_t cpus[] = { ukt_first_cpu() };

		cfg = ukt_small();
		cfg.wait = UKVM_WAIT_SPIN_IDLE;
		cfg.pin_vcpus = cpus;
		cfg.nr_pin_vcpus = 1;
		cfg.pin_readers = cpus;
		cfg.nr_pin_readers = 1;
		ukt_run_checked(&cfg);
	}
	UKT_CASE("spin_idle: single uffd, 2 readers, batches of 4") {
		cfg = ukt_small();
		cfg.wait = UKVM_WAIT_SPIN_IDLE;
		cfg.single_uffd = true;
		cfg.readers = 2;
		cfg.read_batch = 4;
		ukt_run_checked(&cfg);
	}

#ifdef UKVM_HAVE_LIBURING
	UKT_CASE("io_uring: 4 vCPUs on one uffd, 1 reader: every read a ring completion") {
		struct ukvm_result res;

		cfg = ukt_small();
		cfg.vcpus = 4;
		cfg.mem_per_vcpu = MiB;
		cfg.single_uffd = true;
		cfg.wait = UKVM_WAIT_IO_URING;
		cfg.read_batch = 8;
		if (ukt_run_ok(&cfg, &res)) {
			ukt_check_result(&cfg, &res);
			CHECK_EQ(res.readers[0].ring_completions, res.readers[0].reads);
			CHECK_GE(res.readers[0].reads, 1);
			ukvm_result_free(&res);
		}
	}
#else
	UKT_CASE("io_uring: a build without liburing refuses it at validation, saying how") {
		struct ukvm_experiment *exp;
		struct ukvm_result res;
		struct ukvm_error err;
		int ret;

		cfg = ukt_small();
		cfg.wait = UKVM_WAIT_IO_URING;
		/* By ukvm_experiment_start itself, before anything is built. */
		ret = ukvm_experiment_start(&cfg, &exp, &err);
		CHECK_EQ(ret, -EOPNOTSUPP);
		CHECK(err.kind == UKVM_ERR_HOST && strstr(err.message, "apt-get install liburing-dev"),
		      "kind %s: %s", ukt_kind_name(err.kind), err.message);
		if (ret == 0 && ukvm_experiment_finish(exp, &res, &err) == 0)
			ukvm_result_free(&res);
		/* Without userfaultfd there are no readers, and nothing to refuse. */
		cfg.uffd_mode = UKVM_UFFD_NONE;
		ukt_run_checked(&cfg);
	}
#endif

	UKT_CASE("delay is spent inside the readers") {
		struct ukvm_result res;
		uint64_t busy = 0;

		cfg = ukt_small();
		cfg.vcpus = 1;
		cfg.mem_per_vcpu = 32 * PAGE;
		cfg.delay_us = 1000;
		if (ukt_run_ok(&cfg, &res)) {
			ukt_check_result(&cfg, &res);
			for (i = 0; i < res.nr_readers; i++)
				busy += res.readers[i].busy_ns;
			CHECK_GE(busy, 32 * NSEC_PER_MSEC);
			CHECK_GE(res.end_ns - res.start_ns, 32 * NSEC_PER_MSEC);
			ukvm_result_free(&res);
		}
	}

	return ukt_exit();
}
