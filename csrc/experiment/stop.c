/* SPDX-License-Identifier: MIT */
/*
 * Stopping an experiment's threads, for a bounded while: the vCPUs are
 * kicked out of KVM_RUN and joined, the readers told to leave, kicked and
 * joined. A thread still running after STOP_WAIT_NS is named in the run's
 * error and left running; the controller keeps the experiment until it
 * leaves (experiment_linger in experiment.c).
 */
#include <stdio.h>
#include <string.h>

#include "base/ctl.h"
#include "base/thread.h"
#include "base/util.h"
#include "experiment/state.h"
#include "experiment/stop.h"
#include "kvm/vcpu.h"
#include "uffd/pool.h"

#define STUCK_VCPU_NS		(500 * NSEC_PER_MSEC)
/* A failed run verifies nothing, so its uffds may go at once (PVM, for one,
 * does not let the kick interrupt a vCPU waiting on a userfault). */
#define STUCK_VCPU_ABORTED_NS	(10 * NSEC_PER_MSEC)
/* Readers get this long to leave before a stuck vCPU's uffds are let go. */
#define RELEASE_READERS_NS	(200 * NSEC_PER_MSEC)

/*
 * A thread (who: "vCPU 1", "reader 2 of uffd 0") did not stop within
 * STOP_WAIT_NS: names it and where it was in the run's error, and keeps
 * that as the experiment's holdout. more: how many others did not either.
 */
static void stop_report_stuck(struct ukvm_experiment *exp, const char *who,
			      struct ukvm_thread_state *st, uint32_t more, const char *more_what)
{
	char where[384], others[64] = "";

	ukvm_thread_describe(st, where, sizeof(where));
	if (more)
		snprintf(others, sizeof(others), " (and %u more %s)", more, more_what);
	ukvm_ctl_fail_or_append(&exp->ctl, "%s did not stop within %.1f s%s: %s", who,
				(double)STOP_WAIT_NS / NSEC_PER_SEC, others, where);
	pthread_mutex_lock(&exp->ctl.lock);
	if (!exp->holdout[0])
		snprintf(exp->holdout, sizeof(exp->holdout), "%s did not stop within %.1f s%s: %s",
			 who, (double)STOP_WAIT_NS / NSEC_PER_SEC, others, where);
	pthread_mutex_unlock(&exp->ctl.lock);
}

uint32_t ukvm_stop_wait_vcpus(struct ukvm_experiment *exp, uint64_t deadline_ns,
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
			ukvm_timespec(&ts, ukvm_deadline_after(poll_ns));
			pthread_cond_timedwait(&exp->ctl.cond, &exp->ctl.lock, &ts);
		}
		pthread_mutex_unlock(&exp->ctl.lock);
	}
}

/*
 * Kicks every vCPU out of KVM_RUN and joins it; safe after a partial setup.
 * Bounded: a vCPU thread still running after STOP_WAIT_NS is named and left.
 */
uint32_t ukvm_stop_vcpus(struct ukvm_experiment *exp)
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
	running = ukvm_stop_wait_vcpus(exp, stuck, NSEC_PER_MSEC);
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
			ukvm_stop_release_uffds(exp);
		running = ukvm_stop_wait_vcpus(exp, deadline, NSEC_PER_MSEC);
	}
	if (!running) {
		exp->threads_joined_ns = ukvm_now_ns();	/* demand_paging_test's end */
		return 0;
	}
	for (i = 0; i < exp->cfg.vcpus; i++) {
		if (exp->vcpus[i].thread_started) {
			snprintf(who, sizeof(who), "vCPU %u", i);
			stop_report_stuck(exp, who, &exp->vcpus[i].state, running - 1,
					 "vCPU threads");
			break;
		}
	}
	return running;
}

/* A uffd that could not be let go of (ret: the swap's -errno): named in the run's error. */
static void stop_report_held(struct ukvm_experiment *exp, uint32_t uffd, int ret)
{
	ukvm_ctl_fail_or_append(&exp->ctl, "uffd %u could not be let go of while a reader "
				"still holds it (its swap for /dev/null, open and dup3, failed: "
				"%s); a vCPU waiting on it stays blocked until a retry succeeds",
				uffd, strerror(-ret));
}

/*
 * Every uffd still held by a failed release (ukvm_stop_release_uffds) tried
 * again: one that lingers waits for that too, not forever for a vCPU.
 */
static void stop_retry_held(struct ukvm_experiment *exp)
{
	uint32_t u;

	for (u = 0; u < exp->nr_pools; u++)
		if (exp->pools[u].uffd_held)
			ukvm_pool_release_uffd(&exp->pools[u], exp->pusher.thread_started);
}

uint32_t ukvm_stop_wait_pools(struct ukvm_experiment *exp, uint64_t deadline_ns)
{
	stop_retry_held(exp);
	return ukvm_pool_stop(exp->pools, exp->nr_pools, &exp->pusher, deadline_ns);
}

uint32_t ukvm_stop_wait_threads(struct ukvm_experiment *exp, uint64_t poll_ns)
{
	uint32_t vcpus, pools;

	/*
	 * Both every round: the pools' wait retries a uffd whose release
	 * failed (stop_retry_held), and a vCPU blocked on that uffd leaves only
	 * once it is let go of, so waiting for the vCPUs first and the pools
	 * only once none runs would wait for ever.
	 */
	vcpus = ukvm_stop_wait_vcpus(exp, ukvm_now_ns() + poll_ns, poll_ns);
	pools = ukvm_stop_wait_pools(exp, ukvm_now_ns() + poll_ns);
	return vcpus + pools;
}

uint32_t ukvm_stop_pools(struct ukvm_experiment *exp, bool close_uffds)
{
	uint32_t u, running;
	struct ukvm_reader *r;

	running = ukvm_stop_wait_pools(exp, ukvm_now_ns() + STOP_WAIT_NS);
	if (running && exp->pusher.thread_started) {
		stop_report_stuck(exp, "the prefetch pusher", &exp->pusher.state, running - 1,
				  "readers");
		return running;
	}
	if (running) {
		for (u = 0; u < exp->nr_pools; u++) {
			r = ukvm_pool_running_reader(&exp->pools[u]);
			if (r) {
				stop_report_stuck(exp, r->res->who, &r->state, running - 1, "readers");
				break;
			}
		}
		return running;
	}
	for (u = 0; close_uffds && u < exp->nr_pools; u++)
		ukvm_pool_destroy(&exp->pools[u]);
	return 0;
}

void ukvm_stop_release_uffds(struct ukvm_experiment *exp)
{
	uint32_t u;
	bool pusher;

	/*
	 * Resolver vCPU: nobody sleeps on the uffd (it answers SIGBUS), and a
	 * vCPU still running may be inside its pool resolving a page: the
	 * pools wait for the vCPUs' join, like the rest of the teardown.
	 */
	if (exp->cfg.resolver == UKVM_RESOLVER_VCPU)
		return;
	ukvm_stop_wait_pools(exp, ukvm_now_ns() + RELEASE_READERS_NS);
	/*
	 * Readers that left free their pool; one still running keeps it, uffd
	 * number and all. So does the pusher while it runs (not joined by the
	 * wait above): it copies into every pool's uffd by number, so each is
	 * swapped for /dev/null, and closed once it is gone (ukvm_stop_pools).
	 */
	pusher = exp->pusher.thread_started;
	for (u = 0; u < exp->nr_pools; u++) {
		struct ukvm_pool *pool = &exp->pools[u];
		bool held = pool->uffd_held;
		int ret;

		if (!pusher && !ukvm_pool_destroy(pool))
			continue;
		ret = ukvm_pool_release_uffd(pool, pusher);
		if (ret && !held)	/* named once */
			stop_report_held(exp, pool->area.uffd_index, ret);
	}
}
