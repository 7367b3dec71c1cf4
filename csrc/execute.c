/* SPDX-License-Identifier: MIT */
/*
 * Running an experiment: the vCPU threads start together, the controller
 * waits for every one of them to finish, for a failure, a cancel or the
 * deadline, and then kicks out and joins whatever still runs, for a bounded
 * while: a vCPU thread that will not stop is named and left to the
 * background (experiment_linger in experiment.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "experiment.h"

/* now + timeout_ns, saturating: a timeout of "forever" must not wrap around. */
uint64_t experiment_deadline_after(uint64_t timeout_ns)
{
	uint64_t now = ukvm_now_ns();

	return timeout_ns > UINT64_MAX - now ? UINT64_MAX : now + timeout_ns;
}

void experiment_timespec(struct timespec *ts, uint64_t deadline_ns)
{
	ts->tv_sec = (time_t)(deadline_ns / NSEC_PER_SEC);
	ts->tv_nsec = (long)(deadline_ns % NSEC_PER_SEC);
}

/*
 * The vCPU thread: ukvm_vcpu_thread() (vcpu.c) runs the guest, and this
 * keeps the state that stopping waits on (done is its last store) and
 * plays UKVM_INJECT_VCPU_STALL.
 */
static void *vcpu_thread_main(void *arg)
{
	struct ukvm_vcpu *vcpu = arg;

	ukvm_thread_start(&vcpu->state);
	ukvm_thread_at(&vcpu->state, "running the guest");
	ukvm_vcpu_thread(vcpu);
	if (vcpu->stall_ms)
		ukvm_thread_stall(&vcpu->state, vcpu->stall_ms);
	ukvm_thread_at(&vcpu->state, "leaving");
	/* Under the lock, so that a stop waiting for done cannot miss the wake. */
	pthread_mutex_lock(&vcpu->ctl->lock);
	atomic_store(&vcpu->state.done, true);
	pthread_cond_broadcast(&vcpu->ctl->cond);
	pthread_mutex_unlock(&vcpu->ctl->lock);
	return NULL;
}

int experiment_execute(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	struct ukvm_ctl *ctl = &exp->ctl;
	bool timing = exp->cfg.guest_timing;
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

		if (exp->cfg.inject == UKVM_INJECT_VCPU_STALL && i == exp->cfg.vcpus - 1)
			vcpu->stall_ms = exp->cfg.inject_after;
		ret = ukvm_thread_create(ctl, &vcpu->thread, THREAD_STACK_BYTES, vcpu_thread_main,
					 vcpu);
		if (ret) {
			ukvm_err_set(err, UKVM_ERR_RUN, ret, "pthread_create(vCPU %u of %u)", i,
				     exp->cfg.vcpus);
			ret = -ret;
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
		experiment_timespec(&ts, exp->deadline_ns);
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
	if (timing)
		ukvm_tsc_clock_sample(&exp->tsc_clock);
	ctl->go = ctl->failed ? -1 : 1;
	pthread_cond_broadcast(&ctl->cond);
	while (ctl->vcpus_running && !ctl->failed) {
		uint64_t until = exp->deadline_ns;

		/* guest_timing: a (TSC, CLOCK_MONOTONIC) pair every CLOCK_PAIR_NS */
		if (timing && (!until || until - ukvm_now_ns() > CLOCK_PAIR_NS))
			until = experiment_deadline_after(CLOCK_PAIR_NS);
		if (!until) {
			pthread_cond_wait(&ctl->cond, &ctl->lock);
			continue;
		}
		experiment_timespec(&ts, until);
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

uint32_t experiment_wait_vcpus(struct ukvm_experiment *exp, uint64_t deadline_ns,
			       uint64_t poll_ns)
{
	struct ukvm_vcpu *next;
	struct timespec ts;
	uint32_t i, running;

	if (!exp->vcpus)
		return 0;
	for (;;) {
		running = 0;
		next = NULL;
		for (i = 0; i < exp->cfg.vcpus; i++) {
			struct ukvm_vcpu *vcpu = &exp->vcpus[i];

			if (!vcpu->thread_started)
				continue;
			if (atomic_load(&vcpu->state.done)) {
				pthread_join(vcpu->thread, NULL);	/* it is returning: prompt */
				vcpu->thread_started = false;
				continue;
			}
			running++;
			ukvm_vcpu_kick(vcpu);
			next = next ?: vcpu;
		}
		if (!running || ukvm_now_ns() >= deadline_ns)
			return running;
		/*
		 * Wait for one still running to be done, a slice at most, rather
		 * than sleep the slice: a thread on its way out is joined the
		 * moment it is done, so the end of upstream's window
		 * (threads_joined_ns) does not wait out a poll. ctl's condition
		 * variable runs on CLOCK_MONOTONIC: no clock step can stretch it.
		 */
		pthread_mutex_lock(&exp->ctl.lock);
		if (!atomic_load(&next->state.done)) {
			experiment_timespec(&ts, experiment_deadline_after(poll_ns));
			pthread_cond_timedwait(&exp->ctl.cond, &exp->ctl.lock, &ts);
		}
		pthread_mutex_unlock(&exp->ctl.lock);
	}
}

/*
 * Kicks every vCPU out of KVM_RUN and joins it; safe after a partial setup.
 * Bounded: a vCPU thread still running after STOP_WAIT_NS is named and left.
 */
uint32_t experiment_stop_vcpus(struct ukvm_experiment *exp)
{
	struct ukvm_ctl *ctl = &exp->ctl;
	uint64_t start = ukvm_now_ns(), deadline = start + STOP_WAIT_NS, stuck;
	uint32_t i, running, in_guest;
	char who[32];

	if (!exp->vcpus)
		return 0;
	pthread_mutex_lock(&ctl->lock);
	if (ctl->go == 0)
		ctl->go = -1;	/* threads still waiting to start: leave */
	pthread_cond_broadcast(&ctl->cond);
	pthread_mutex_unlock(&ctl->lock);
	atomic_store(&ctl->stop, true);

	/*
	 * A vCPU blocked on a fault that no reader will resolve, in a kernel
	 * where that wait is not interruptible: letting go of the uffd wakes
	 * it and the fault completes without userfaultfd.
	 */
	stuck = start + (exp_aborted(exp) ? STUCK_VCPU_ABORTED_NS : STUCK_VCPU_NS);
	running = experiment_wait_vcpus(exp, stuck, NSEC_PER_MSEC);
	if (running) {
		/*
		 * Only where a vCPU may be in a fault: a run that succeeded has
		 * every vCPU past its walk, and its readers' counters and fault
		 * log are still to be collected.
		 */
		pthread_mutex_lock(&ctl->lock);
		in_guest = ctl->vcpus_running;
		pthread_mutex_unlock(&ctl->lock);
		if (exp_aborted(exp) || in_guest)
			experiment_release_uffds(exp);
		running = experiment_wait_vcpus(exp, deadline, NSEC_PER_MSEC);
	}
	if (!running) {
		exp->threads_joined_ns = ukvm_now_ns();	/* demand_paging_test's end */
		return 0;
	}
	for (i = 0; i < exp->cfg.vcpus; i++) {
		if (exp->vcpus[i].thread_started) {
			snprintf(who, sizeof(who), "vCPU %u", i);
			experiment_stuck(exp, who, &exp->vcpus[i].state, running - 1,
					 "vCPU threads");
			break;
		}
	}
	return running;
}
