/* SPDX-License-Identifier: MIT */
/*
 * One experiment, shared by the files that run its phases:
 *
 *   setup.c       VM, backing memory, memslot, guest page tables, vCPUs, the
 *                 prefill, uffds and their reader pools; and the teardown
 *   execute.c     vCPU threads start together; the controller waits for all
 *                 of them, a failure, a cancel or the deadline; then stops them
 *   collect.c     KVM stats, reader stats and fault log, uffds closed, every
 *                 page verified, the result filled
 *   experiment.c  the controller thread and the public lifecycle
 */
#ifndef UKVM_EXPERIMENT_H
#define UKVM_EXPERIMENT_H

#include "guest_abi.h"
#include "internal.h"

#include <time.h>

#define SZ_1G			(1ULL << 30)
#define REGION_MIN_GPA		(4ULL << 30)
#define VCPU_STACK_BYTES	(16ULL << 10)
#define THREAD_STACK_BYTES	(512ULL << 10)
#define PREFILL_CHUNK		(2ULL << 20)
#define STUCK_VCPU_NS		(500 * NSEC_PER_MSEC)
/* A failed run verifies nothing, so its uffds may go at once (PVM, for one,
 * does not let the kick interrupt a vCPU waiting on a userfault). */
#define STUCK_VCPU_ABORTED_NS	(10 * NSEC_PER_MSEC)
#define NO_STAT			UINT64_MAX
/* guest_timing: how often the controller pairs the host's TSC with CLOCK_MONOTONIC */
#define CLOCK_PAIR_NS		(50 * NSEC_PER_MSEC)
/* guest_timing: the guest's clock-sync exits before its walk (tsc.h) */
#define SYNC_ROUNDS		16

struct ukvm_experiment {
	struct ukvm_config cfg;
	struct ukvm_ctl ctl;
	pthread_t controller;
	bool finished;			/* under ctl.lock */
	struct ukvm_result result;

	struct ukvm_vm vm;
	struct ukvm_mem mem;
	uint64_t region_gpa;
	uint64_t region_size;
	uint64_t slice_size;		/* what one vCPU walks */
	uint64_t passes;
	uint64_t write_key;		/* the guest's write-or-read choice, seeded */
	bool filled;			/* pages arrive with data (else zero-filled) */
	int32_t *pin_vcpus;		/* copies of the config's lists */
	int32_t *pin_readers;
	struct ukvm_vcpu *vcpus;
	struct ukvm_kvmstats *vcpu_stats;
	struct ukvm_kvmstats vm_stats;
	struct ukvm_pool *pools;
	uint32_t nr_pools;
	uint64_t deadline_ns;
	/* demand_paging_test's window: before the first vCPU thread is created... */
	uint64_t threads_start_ns;
	uint64_t threads_joined_ns;	/* ...after the last one is joined */
	struct ukvm_tsc_clock tsc_clock;	/* guest_timing: sampled while the vCPUs run */
	bool probe;			/* ukvm_probe(): build, register, stop there */
	bool releasing_memory;		/* under ctl.lock: a failed run's memory, still going */
	struct ukvm_experiment *next_pending;
};

/* Records err as the experiment's failure unless something failed first. */
static inline void exp_fail(struct ukvm_experiment *exp, const struct ukvm_error *err)
{
	pthread_mutex_lock(&exp->ctl.lock);
	ukvm_ctl_fail_locked(&exp->ctl, err);
	pthread_mutex_unlock(&exp->ctl.lock);
}

static inline bool exp_aborted(struct ukvm_experiment *exp)
{
	return ukvm_ctl_aborted(&exp->ctl);
}

static inline bool exp_past_deadline(struct ukvm_experiment *exp)
{
	return exp->deadline_ns && ukvm_now_ns() >= exp->deadline_ns;
}

/* The vCPU's args page (guest_abi.h), as the host sees it. */
static inline uint64_t *guest_args(struct ukvm_experiment *exp, struct ukvm_vcpu *vcpu)
{
	return ukvm_vm_sys_hva(&exp->vm, vcpu->args_gpa);
}

#define ARG(args, off) ((args)[(off) / sizeof(uint64_t)])

/* setup.c */
int experiment_setup(struct ukvm_experiment *exp, struct ukvm_error *err);
/* Releases everything; with keep_memory, all but the test region's memory. */
void experiment_teardown(struct ukvm_experiment *exp, bool keep_memory);
/* Stops every reader; with close_uffds, releases the pools and their uffds. */
void experiment_stop_pools(struct ukvm_experiment *exp, bool close_uffds);

/* execute.c */
/* now + timeout_ns, saturating: a timeout of "forever" must not wrap around. */
uint64_t experiment_deadline_after(uint64_t timeout_ns);
void experiment_timespec(struct timespec *ts, uint64_t ns);
int experiment_execute(struct ukvm_experiment *exp, struct ukvm_error *err);
void experiment_stop_vcpus(struct ukvm_experiment *exp);

/* collect.c */
int experiment_collect(struct ukvm_experiment *exp, struct ukvm_error *err);

#endif
