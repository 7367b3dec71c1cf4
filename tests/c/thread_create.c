/* SPDX-License-Identifier: MIT */
/*
 * UKVM_INJECT_THREAD_CREATE: the n-th thread the core starts fails with
 * EAGAIN. For every n from 1 to the number of threads (readers + vCPUs; the
 * controller is not counted) the run fails with UKVM_ERR_RUN naming the
 * thread; over the sweep each reader and each vCPU is hit once, whatever
 * order the core starts them in; one past the last, the run succeeds.
 */
#include "helpers.h"

static void sweep(struct ukvm_config cfg)
{
	uint32_t uffds = cfg.single_uffd ? 1 : cfg.vcpus;
	uint32_t readers = cfg.uffd_mode == UKVM_UFFD_NONE ? 0 : uffds * cfg.readers;
	uint32_t threads = readers + cfg.vcpus, n, hit_readers = 0, hit_vcpus = 0;
	struct ukvm_result res;
	struct ukvm_error err;

	cfg.inject = UKVM_INJECT_THREAD_CREATE;
	for (n = 1; n <= threads; n++) {
		cfg.inject_after = n;
		if (!ukt_run_fails(&cfg, UKVM_ERR_RUN, EAGAIN, "pthread_create", &err))
			return;
		if (strstr(err.message, "reader"))
			hit_readers++;
		else if (strstr(err.message, "vCPU"))
			hit_vcpus++;
		else
			CHECK(0, "thread %u is neither a reader nor a vCPU: %s", n, err.message);
	}
	CHECK_EQ(hit_readers, readers);
	CHECK_EQ(hit_vcpus, cfg.vcpus);

	cfg.inject_after = threads + 1;
	if (ukt_run_ok(&cfg, &res)) {
		ukt_check_result(&cfg, &res);
		ukvm_result_free(&res);
	}
}

int main(void)
{
	struct ukvm_config cfg;

	ukt_init("thread_create");

	UKT_CASE("2 vCPUs, a uffd each with 2 readers") {
		cfg = ukt_small();
		cfg.readers = 2;
		sweep(cfg);
	}

	UKT_CASE("3 vCPUs, one uffd with 3 readers, blocking read") {
		cfg = ukt_small();
		cfg.vcpus = 3;
		cfg.mem_per_vcpu = MiB;
		cfg.single_uffd = true;
		cfg.readers = 3;
		cfg.wait = UKVM_WAIT_READ;
		sweep(cfg);
	}

	UKT_CASE("MINOR on shmem, poll") {
		cfg = ukt_small();
		cfg.backing = UKVM_BACKING_SHMEM;
		cfg.uffd_mode = UKVM_UFFD_MINOR;
		cfg.wait = UKVM_WAIT_POLL;
		sweep(cfg);
	}

	UKT_CASE("no userfaultfd: vCPU threads only") {
		cfg = ukt_small();
		cfg.uffd_mode = UKVM_UFFD_NONE;
		sweep(cfg);
	}

	return ukt_exit();
}
