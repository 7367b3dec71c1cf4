/* SPDX-License-Identifier: MIT */
/*
 * pin_vcpus and pin_readers: vCPU i runs on pin_vcpus[i % n] and reader k of
 * each uffd on pin_readers[k % n]. Checked twice: the affinity each thread
 * reported in the result, and what the kernel says about the threads while
 * they run (/proc/self/task/TID/status, sampled from here, matched to the
 * threads by the tids in the result). Unpinned threads may run wherever the
 * process may.
 */
#include <sched.h>
#include <unistd.h>

#include "helpers.h"

#define MAX_TIDS	256

/* The last Cpus_allowed_list seen for each thread of this process. */
static struct {
	int tid;
	char cpus[128];
} seen[MAX_TIDS];
static unsigned nr_seen;

static void sample_threads(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d))) {
		char path[64], line[256], cpus[128] = "";
		unsigned i;
		FILE *f;
		int tid = atoi(e->d_name);

		if (tid <= 0)
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%d/status", tid);
		f = fopen(path, "re");
		if (!f)
			continue;	/* the thread ended meanwhile */
		while (fgets(line, sizeof(line), f))
			if (sscanf(line, "Cpus_allowed_list: %127s", cpus) == 1)
				break;
		fclose(f);
		if (!cpus[0])
			continue;
		for (i = 0; i < nr_seen && seen[i].tid != tid; i++)
			;
		if (i == nr_seen) {
			if (nr_seen == MAX_TIDS)
				continue;
			nr_seen++;
		}
		seen[i].tid = tid;
		snprintf(seen[i].cpus, sizeof(seen[i].cpus), "%s", cpus);
	}
	closedir(d);
}

static const char *cpus_of(int tid)
{
	unsigned i;

	for (i = 0; i < nr_seen; i++)
		if (seen[i].tid == tid)
			return seen[i].cpus;
	return "(never seen)";
}

/* A thread's reported affinity is exactly {cpu}, or the process's set if cpu < 0. */
static bool affinity_is(const uint64_t affinity[16], int cpu, const cpu_set_t *process)
{
	int i;

	for (i = 0; i < 1024; i++) {
		bool want = cpu >= 0 ? i == cpu : i < CPU_SETSIZE && CPU_ISSET(i, process);

		if (!!(affinity[i / 64] & (1ULL << (i % 64))) != want)
			return false;
	}
	return true;
}

/* Runs cfg while sampling its threads; checks where each was allowed to run. */
static void run_pinned(const struct ukvm_config *cfg, const cpu_set_t *process,
		       const char *process_cpus)
{
	struct ukvm_experiment *exp;
	struct ukvm_result res;
	struct ukvm_error err;
	uint32_t i;

	nr_seen = 0;
	if (ukvm_experiment_start(cfg, &exp, &err)) {
		if (err.kind == UKVM_ERR_HOST)
			ukt_skip_case(err.message);
		else
			CHECK(false, "%s: start: %s", ukt_cfg_str(cfg), err.message);
		return;
	}
	while (ukvm_experiment_wait(exp, 2 * NSEC_PER_MSEC) == -ETIMEDOUT)
		sample_threads();
	if (!CHECK(ukvm_experiment_finish(exp, &res, &err) == 0, "%s: %s", ukt_cfg_str(cfg),
		   err.message))
		return;
	ukt_check_result(cfg, &res);

	for (i = 0; i < res.nr_vcpus; i++) {
		const struct ukvm_vcpu_result *v = &res.vcpus[i];
		int cpu = cfg->nr_pin_vcpus ? cfg->pin_vcpus[i % cfg->nr_pin_vcpus] : -1;
		char want[16];

		CHECK(affinity_is(v->cpus, cpu, process), "vCPU %u reported another affinity "
		      "than CPU %d", i, cpu);
		snprintf(want, sizeof(want), "%d", cpu);
		CHECK(strcmp(cpus_of(v->tid), cpu >= 0 ? want : process_cpus) == 0,
		      "vCPU %u (tid %d) may run on CPUs %s, expected %s", i, v->tid,
		      cpus_of(v->tid), cpu >= 0 ? want : process_cpus);
	}
	for (i = 0; i < res.nr_readers; i++) {
		const struct ukvm_reader_result *x = &res.readers[i];
		int cpu = cfg->nr_pin_readers ? cfg->pin_readers[x->index % cfg->nr_pin_readers] : -1;
		char want[16];

		CHECK(affinity_is(x->cpus, cpu, process), "reader %u of uffd %u reported "
		      "another affinity than CPU %d", x->index, x->uffd, cpu);
		snprintf(want, sizeof(want), "%d", cpu);
		CHECK(strcmp(cpus_of(x->tid), cpu >= 0 ? want : process_cpus) == 0,
		      "reader %u of uffd %u (tid %d) may run on CPUs %s, expected %s", x->index,
		      x->uffd, x->tid, cpus_of(x->tid), cpu >= 0 ? want : process_cpus);
	}
	ukvm_result_free(&res);
}

int main(void)
{
	struct ukvm_config cfg;
	cpu_set_t process;
	char process_cpus[128];
	int first = -1, last = -1, i;
	int32_t vcpu_pins[2], reader_pins[2];

	ukt_init("pinning");
	if (sched_getaffinity(0, sizeof(process), &process))
		ukt_skip_program("sched_getaffinity: %s", strerror(errno));
	for (i = 0; i < CPU_SETSIZE; i++)
		if (CPU_ISSET(i, &process)) {
			if (first < 0)
				first = i;
			last = i;
		}
	nr_seen = 0;
	sample_threads();	/* this thread's own list, in the kernel's words */
	snprintf(process_cpus, sizeof(process_cpus), "%s", cpus_of((int)getpid()));

	/* Long enough to be sampled many times: each fault waits 2 ms in a reader. */
	cfg = ukt_small();
	cfg.mem_per_vcpu = 64 * PAGE;
	cfg.delay_us = 2000;
	cfg.readers = 2;

	UKT_CASE("vCPUs on CPU %d, readers on CPU %d", first, last) {
		vcpu_pins[0] = first;
		reader_pins[0] = last;
		cfg.pin_vcpus = vcpu_pins;
		cfg.nr_pin_vcpus = 1;
		cfg.pin_readers = reader_pins;
		cfg.nr_pin_readers = 1;
		run_pinned(&cfg, &process, process_cpus);
	}

	UKT_CASE("shorter lists wrap: 3 vCPUs on %d,%d,%d, 3 readers on %d,%d,%d",
		 first, last, first, last, first, last) {
		struct ukvm_config c = cfg;

		vcpu_pins[0] = first;
		vcpu_pins[1] = last;
		reader_pins[0] = last;
		reader_pins[1] = first;
		c.vcpus = 3;
		c.single_uffd = true;
		c.readers = 3;
		c.pin_vcpus = vcpu_pins;
		c.nr_pin_vcpus = 2;
		c.pin_readers = reader_pins;
		c.nr_pin_readers = 2;
		run_pinned(&c, &process, process_cpus);
	}

	UKT_CASE("unpinned: anywhere the process may run (%s)", process_cpus) {
		struct ukvm_config c = cfg;

		c.pin_vcpus = NULL;
		c.nr_pin_vcpus = 0;
		c.pin_readers = NULL;
		c.nr_pin_readers = 0;
		run_pinned(&c, &process, process_cpus);
	}

	return ukt_exit();
}
