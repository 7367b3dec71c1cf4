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
/* Readers get this long to leave before a stuck vCPU's uffds are let go. */
#define RELEASE_READERS_NS	(200 * NSEC_PER_MSEC)
/*
 * How long stopping waits for one kind of thread (vCPUs, then readers). A
 * thread still running then is named in the run's error and left running;
 * the controller keeps the experiment (memory, fds, mappings it may touch)
 * until it leaves: see experiment_linger() in experiment.c.
 */
#define STOP_WAIT_NS		(2 * NSEC_PER_SEC)
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
	bool exact_address;		/* fault messages name the 4 KiB page, hugetlb too */
	bool probe;			/* ukvm_probe(): build, register, stop there */
	bool releasing_memory;		/* under ctl.lock: a failed run's memory, still going */
	/* Under ctl.lock: what the controller is doing, for errors that name it. */
	const char *phase;
	/* Under ctl.lock: the vCPUs' args pages may be read (progress). */
	bool walkable;
	/* Under ctl.lock: a thread would not stop; the controller waits for it. */
	bool lingering;
	uint64_t lingering_since_ns;
	char holdout[640];		/* under ctl.lock: that thread, named */
	atomic_bool controller_done;	/* the controller is returning: join, then free */
	/* Under pending_lock (experiment.c): the caller left it to the background. */
	uint64_t handoff_ns;
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

/* experiment.c */
/*
 * A thread (who: "vCPU 1", "reader 2 of uffd 0") did not stop within
 * STOP_WAIT_NS: names it and where it was in the run's error, and keeps
 * that as the experiment's holdout. more: how many others did not either.
 */
void experiment_stuck(struct ukvm_experiment *exp, const char *who,
		      struct ukvm_thread_state *st, uint32_t more, const char *more_what);

/*
 * Before anything is built: can this process open the fds cfg needs? 0, or
 * -EMFILE with an error (UKVM_ERR_HOST) that says how many, the limits and
 * the fix.
 */
int experiment_check_fds(const struct ukvm_config *cfg, bool probe, struct ukvm_error *err);
/* An EMFILE that still happened (another thread took fds meanwhile): the same fix. */
void experiment_fd_hint(struct ukvm_error *err);

/* setup.c */
/*
 * Before anything is built or sized from cfg->vcpus: does KVM allow that
 * many (KVM_CAP_MAX_VCPUS of /dev/kvm)? 0, or UKVM_ERR_CONFIG naming vcpus.
 */
int experiment_check_vcpus(const struct ukvm_config *cfg, struct ukvm_error *err);
/* The most fds a run (or probe) of cfg holds at once; why: what they are. */
uint64_t experiment_fds_needed(const struct ukvm_config *cfg, bool probe, char *why,
			       size_t why_len);
int experiment_setup(struct ukvm_experiment *exp, struct ukvm_error *err);
/* Releases everything (no thread may still run); with keep_memory, all but the region's memory. */
void experiment_teardown(struct ukvm_experiment *exp, bool keep_memory);
/*
 * Stops every reader, STOP_WAIT_NS at most, and names any that would not
 * stop (experiment_stuck); with close_uffds and none left, releases the
 * pools and their uffds. Returns how many readers still run.
 */
uint32_t experiment_stop_pools(struct ukvm_experiment *exp, bool close_uffds);
/* Joins the readers that left, kicking the rest until deadline_ns: how many still run. */
uint32_t experiment_wait_pools(struct ukvm_experiment *exp, uint64_t deadline_ns);
/* A vCPU is stuck on a fault: stop the readers (briefly) and let go of every uffd. */
void experiment_release_uffds(struct ukvm_experiment *exp);

/* execute.c */
/* now + timeout_ns, saturating: a timeout of "forever" must not wrap around. */
uint64_t experiment_deadline_after(uint64_t timeout_ns);
void experiment_timespec(struct timespec *ts, uint64_t ns);
int experiment_execute(struct ukvm_experiment *exp, struct ukvm_error *err);
/*
 * Stops every vCPU, STOP_WAIT_NS at most, and names any that would not stop
 * (experiment_stuck). Returns how many vCPU threads still run.
 */
uint32_t experiment_stop_vcpus(struct ukvm_experiment *exp);
/* Joins the vCPU threads that left, kicking the rest every poll_ns until deadline_ns. */
uint32_t experiment_wait_vcpus(struct ukvm_experiment *exp, uint64_t deadline_ns,
			       uint64_t poll_ns);

/* collect.c */
int experiment_collect(struct ukvm_experiment *exp, struct ukvm_error *err);

#endif
