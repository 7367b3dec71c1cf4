/* SPDX-License-Identifier: MIT */
/*
 * Running an experiment: the vCPU threads start together, and the
 * controller waits for every one of them to finish, for a failure, a cancel
 * or the deadline. Kicking out and joining whatever still runs is stop.c's.
 */
#include <errno.h>
#include <time.h>

#include "base/ctl.h"
#include "base/errors.h"
#include "base/thread.h"
#include "base/tsc.h"
#include "base/util.h"
#include "experiment/dirty.h"
#include "experiment/execute.h"
#include "experiment/migrate.h"
#include "experiment/state.h"
#include "kvm/kvmstats.h"
#include "kvm/vcpu.h"

#define THREAD_STACK_BYTES	(512ULL << 10)
/* guest_timing: how often the controller pairs the host's TSC with CLOCK_MONOTONIC */
#define CLOCK_PAIR_NS		(50 * NSEC_PER_MSEC)

/*
 * The vCPU thread: ukvm_vcpu_thread() (vcpu.c) runs the guest, and this
 * keeps the state that stopping waits on (done is its last store) and, in
 * a test build, plays UKVM_INJECT_VCPU_STALL.
 */
static void *execute_vcpu_thread(void *arg)
{
	struct ukvm_vcpu *vcpu = arg;

	ukvm_thread_start(&vcpu->state);
	ukvm_thread_at(&vcpu->state, "running the guest");
	ukvm_vcpu_thread(vcpu);
#ifdef UKVM_TEST_HOOKS
	if (vcpu->stall_ms)
		ukvm_thread_stall(&vcpu->state, vcpu->stall_ms);
#endif
	ukvm_thread_at(&vcpu->state, "leaving");
	/* Under the lock, so that a stop waiting for done cannot miss the wake. */
	pthread_mutex_lock(&vcpu->ctl->lock);
	atomic_store(&vcpu->state.done, true);
	pthread_cond_broadcast(&vcpu->ctl->cond);
	pthread_mutex_unlock(&vcpu->ctl->lock);
	return NULL;
}

/* Under ctl->lock: has every vCPU ended pass `pass` and stopped at its gate? */
static bool execute_all_at_gate(struct ukvm_experiment *exp, uint64_t pass)
{
	uint32_t i;

	for (i = 0; i < exp->cfg.vcpus; i++)
		if (exp->vcpus[i].at_gate < pass)
			return false;
	return true;
}

/*
 * Under ctl->lock, with every vCPU waiting at the end of pass `pass`: the
 * dirty tracker's work for it (dirty.c), without the lock, then the gate
 * into the next pass opens. 0, or -errno (recorded as the run's failure).
 */
static int execute_pass_gate(struct ukvm_experiment *exp, uint64_t pass)
{
	struct ukvm_ctl *ctl = &exp->ctl;
	struct ukvm_error err = { 0 };
	int ret;

	pthread_mutex_unlock(&ctl->lock);
	ret = ukvm_dirty_pass_ended(exp, pass, &err);
	pthread_mutex_lock(&ctl->lock);
	if (ret) {
		ukvm_ctl_fail_locked(ctl, &err);
		return ret;
	}
	ctl->passes_open = pass + 1;
	ukvm_dirty_opened(&exp->dirty, ukvm_now_ns());
	pthread_cond_broadcast(&ctl->cond);
	return 0;
}

int ukvm_execute_run(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	struct ukvm_ctl *ctl = &exp->ctl;
	bool timing = exp->cfg.guest_timing, migrated = false;
	struct timespec ts;
	uint32_t i, ready;
	int ret = 0;

	/*
	 * KVM's counters from here: no vCPU runs before its thread exists, so
	 * taking them before the window opens changes nothing they count and
	 * keeps their reading out of upstream's window.
	 */
	ukvm_kvmstats_snapshot(&exp->vm_stats);
	for (i = 0; i < exp->cfg.vcpus; i++)
		ukvm_kvmstats_snapshot(&exp->vcpu_stats[i]);

	exp->threads_start_ns = ukvm_now_ns();	/* demand_paging_test's start */
	for (i = 0; i < exp->cfg.vcpus; i++) {
		struct ukvm_vcpu *vcpu = &exp->vcpus[i];

#ifdef UKVM_TEST_HOOKS
		if (exp->cfg.inject == UKVM_INJECT_VCPU_STALL && i == exp->cfg.vcpus - 1)
			vcpu->stall_ms = exp->cfg.inject_after;
		vcpu->hang = exp->cfg.inject == UKVM_INJECT_VCPU_HANG && i == exp->cfg.vcpus - 1;
#endif
		ret = ukvm_thread_create(ctl, &vcpu->thread, THREAD_STACK_BYTES,
					 execute_vcpu_thread, vcpu);
		if (ret) {
			ukvm_err_set(err, UKVM_ERR_RUN, -ret, "pthread_create(vCPU %u of %u)", i,
				     exp->cfg.vcpus);
			break;
		}
		vcpu->thread_started = true;
	}
	if (ret)
		return ret;

	/* Thread start-up stays out of the timing: wait until all are ready. */
	pthread_mutex_lock(&ctl->lock);
	for (;;) {
		for (i = 0, ready = 0; i < exp->cfg.vcpus; i++)
			ready += exp->vcpus[i].ready;
		if (ready == exp->cfg.vcpus || ctl->failed)
			break;
		if (!exp->deadline_ns) {
			pthread_cond_wait(&ctl->cond, &ctl->lock);
			continue;
		}
		ukvm_timespec(&ts, exp->deadline_ns);
		if (pthread_cond_timedwait(&ctl->cond, &ctl->lock, &ts) == ETIMEDOUT &&
		    ukvm_now_ns() >= exp->deadline_ns) {
			struct ukvm_error timeout = { 0 };

			ukvm_err_set(&timeout, UKVM_ERR_TIMEOUT, 0,
				     "the run did not finish within timeout_s=%.3f: %u of %u "
				     "vCPU threads had not started",
				     (double)exp->cfg.timeout_ns / NSEC_PER_SEC,
				     exp->cfg.vcpus - ready, exp->cfg.vcpus);
			ukvm_ctl_fail_locked(ctl, &timeout);
		}
	}
	ctl->vcpus_running = exp->cfg.vcpus;
	if (exp->online.queues && !ctl->failed) {
		/* Every vCPU thread has its id, and none has run: no fault yet. */
		for (i = 0; i < exp->cfg.vcpus; i++)
			ukvm_online_set_tid(&exp->online, i, exp->vcpus[i].tid);
		ukvm_online_tids_done(&exp->online);
	}
	if (timing)
		ukvm_tsc_clock_sample(&exp->tsc_clock);
	ctl->go = ctl->failed ? -1 : 1;
	pthread_cond_broadcast(&ctl->cond);
	while (ctl->vcpus_running && !ctl->failed) {
		uint64_t until = exp->deadline_ns;

		/* Migration: the sender is this thread, until the source stops. */
		if (exp->migrate.mode != UKVM_MIGRATION_NONE && !migrated) {
			migrated = true;
			ukvm_migrate_run(exp);
			continue;
		}
		/* Dirty tracking: every vCPU at a pass's end waits for the harvest. */
		if (exp->dirty.kind != UKVM_DIRTY_NONE && exp->migrate.mode == UKVM_MIGRATION_NONE &&
		    ctl->passes_open <= exp->passes &&
		    execute_all_at_gate(exp, ctl->passes_open)) {
			if (execute_pass_gate(exp, ctl->passes_open))
				break;
			continue;
		}

		/* guest_timing: a (TSC, CLOCK_MONOTONIC) pair every CLOCK_PAIR_NS */
		if (timing && (!until || until - ukvm_now_ns() > CLOCK_PAIR_NS))
			until = ukvm_deadline_after(CLOCK_PAIR_NS);
		if (!until) {
			pthread_cond_wait(&ctl->cond, &ctl->lock);
			continue;
		}
		ukvm_timespec(&ts, until);
		ret = pthread_cond_timedwait(&ctl->cond, &ctl->lock, &ts);
		if (timing)
			ukvm_tsc_clock_sample(&exp->tsc_clock);
		if (ret == ETIMEDOUT && exp->deadline_ns && ukvm_now_ns() >= exp->deadline_ns) {
			struct ukvm_error timeout = { 0 };

			ukvm_err_set(&timeout, UKVM_ERR_TIMEOUT, 0,
				     "the run did not finish within timeout_s=%.3f: %u of %u "
				     "vCPUs were still running (a fault never resolved?)",
				     (double)exp->cfg.timeout_ns / NSEC_PER_SEC,
				     ctl->vcpus_running, exp->cfg.vcpus);
			ukvm_ctl_fail_locked(ctl, &timeout);
		}
	}
	pthread_mutex_unlock(&ctl->lock);
	if (timing)
		ukvm_tsc_clock_sample(&exp->tsc_clock);	/* the last stamps are older than this */
	return 0;
}
