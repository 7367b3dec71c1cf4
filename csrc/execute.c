/* SPDX-License-Identifier: MIT */
/*
 * Running an experiment: the vCPU threads start together, the controller
 * waits for every one of them to finish, for a failure, a cancel or the
 * deadline, and then kicks out and joins whatever still runs.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>

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

int experiment_execute(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	struct ukvm_ctl *ctl = &exp->ctl;
	bool timing = exp->cfg.guest_timing;
	struct timespec ts;
	uint32_t i, ready;
	int ret = 0;

	exp->threads_start_ns = ukvm_now_ns();
	for (i = 0; i < exp->cfg.vcpus; i++) {
		struct ukvm_vcpu *vcpu = &exp->vcpus[i];

		ret = ukvm_thread_create(ctl, &vcpu->thread, THREAD_STACK_BYTES, ukvm_vcpu_thread,
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
		pthread_cond_wait(&ctl->cond, &ctl->lock);
	}
	pthread_mutex_unlock(&ctl->lock);

	ukvm_kvmstats_snapshot(&exp->vm_stats);
	for (i = 0; i < exp->cfg.vcpus; i++)
		ukvm_kvmstats_snapshot(&exp->vcpu_stats[i]);

	pthread_mutex_lock(&ctl->lock);
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

/* Kicks every vCPU out of KVM_RUN and joins it; safe after a partial setup. */
void experiment_stop_vcpus(struct ukvm_experiment *exp)
{
	struct ukvm_ctl *ctl = &exp->ctl;
	uint64_t start = ukvm_now_ns();
	bool waiting, released = false;
	uint32_t i;

	if (!exp->vcpus)
		return;
	pthread_mutex_lock(&ctl->lock);
	if (ctl->go == 0)
		ctl->go = -1;	/* threads still waiting to start: leave */
	pthread_cond_broadcast(&ctl->cond);
	pthread_mutex_unlock(&ctl->lock);
	atomic_store(&ctl->stop, true);

	for (;;) {
		waiting = false;
		for (i = 0; i < exp->cfg.vcpus; i++) {
			struct ukvm_vcpu *vcpu = &exp->vcpus[i];

			if (vcpu->thread_started && !atomic_load(&vcpu->exited)) {
				waiting = true;
				ukvm_vcpu_kick(vcpu);
			}
		}
		if (!waiting)
			break;
		/*
		 * A vCPU blocked on a fault that no reader will resolve, in a
		 * kernel where that wait is not interruptible: closing the uffd
		 * wakes it and the fault completes without userfaultfd.
		 */
		if (!released && ukvm_now_ns() - start >
		    (exp_aborted(exp) ? STUCK_VCPU_ABORTED_NS : STUCK_VCPU_NS)) {
			experiment_stop_pools(exp, true);
			released = true;
		}
		ukvm_sleep_ns(NSEC_PER_MSEC);
	}
	for (i = 0; i < exp->cfg.vcpus; i++) {
		struct ukvm_vcpu *vcpu = &exp->vcpus[i];

		if (vcpu->thread_started) {
			pthread_join(vcpu->thread, NULL);
			vcpu->thread_started = false;
		}
	}
	exp->threads_joined_ns = ukvm_now_ns();
}
