/* SPDX-License-Identifier: MIT */
/*
 * A run's progress: the pages each vCPU's guest has touched (what
 * ukvm_experiment_progress() reports), and the watch that
 * ukvm_experiment_finish() keeps over a run without a time limit: it fails
 * the run once the walk makes no progress for too long.
 */
#include <pthread.h>
#include <stdbool.h>
#include <time.h>

#include "base/ctl.h"
#include "base/errors.h"
#include "base/util.h"
#include "experiment/state.h"
#include "experiment/watch.h"
#include "kvm/guest_abi.h"
#include "uffd/source.h"
#include "ukvm.h"

/* finish, for a run without a time limit: see watch_no_progress_ns() */
#define NO_PROGRESS_NS		(60 * NSEC_PER_SEC)
#define WATCH_POLL_NS		(100 * NSEC_PER_MSEC)

const char ukvm_watch_phase_running[] =
	"running";

uint64_t ukvm_watch_pages_done(struct ukvm_experiment *exp, uint32_t i, uint64_t *total)
{
	/* Torn reads are harmless here: the guest writes each word whole. */
	uint64_t *a = exp_guest_args(exp, &exp->vcpus[i]);
	uint64_t per_pass = guest_arg(a, GA_PAGES);
	uint64_t passes = __atomic_load_n(&guest_arg(a, GA_PASSES_DONE), __ATOMIC_ACQUIRE);
	uint64_t step = __atomic_load_n(&guest_arg(a, GA_STEP), __ATOMIC_ACQUIRE);
	uint64_t done;

	/*
	 * At a pass's end the guest publishes the step as the pass's size,
	 * then bumps its passes; the next pass's first chunk publishes 0.
	 * A step at the pass's size, or a pass that ended between the two
	 * loads, would be counted twice: the step counts only below the
	 * pass's size and within an unchanged pass.
	 */
	if (step >= per_pass ||
	    __atomic_load_n(&guest_arg(a, GA_PASSES_DONE), __ATOMIC_ACQUIRE) != passes)
		step = 0;
	*total = per_pass * exp->passes;
	done = passes * per_pass + step;
	return done < *total ? done : *total;
}

/*
 * Under ctl->lock: what the run has done so far, as one number that grows
 * while it gets anywhere: the guests' pages (published every
 * GUEST_STEP_CHUNK pages and at each pass's end) and the vCPUs that have
 * finished. 0 outside the walk.
 */
static uint64_t watch_progress_mark(struct ukvm_experiment *exp)
{
	uint64_t mark = 0, total;
	uint32_t i;

	if (!exp->walkable)
		return 0;
	for (i = 0; i < exp->cfg.vcpus; i++)
		mark += ukvm_watch_pages_done(exp, i, &total);
	/* A migration's sender works on while its vCPUs are parked at the stop. */
	mark += atomic_load_explicit(&exp->migrate.pages_sent, memory_order_relaxed);
	return mark + exp->cfg.vcpus - exp->ctl.vcpus_running;
}

/*
 * How long a run without a time limit may walk without progress before
 * ukvm_experiment_finish() fails it: a minute, and GUEST_STEP_CHUNK of its
 * slowest pages on top (each waiting four times the mean delay, which an
 * exponential draw exceeds 1.8% of the time; a microsecond per iteration of
 * guest_work; and a page server's whole UKVM_SOURCE_REMOTE_WAIT_NS, after
 * which the fetch fails the run anyway), so that a slow run that gets
 * anywhere is never taken for a stuck one.
 */
static uint64_t watch_no_progress_ns(const struct ukvm_experiment *exp)
{
	const struct ukvm_config *cfg = &exp->cfg;
	uint64_t page_ns = (4 * (uint64_t)cfg->delay_us + cfg->guest_work) * NSEC_PER_USEC +
			   NSEC_PER_MSEC;

#ifdef UKVM_TEST_HOOKS
	if (cfg->inject == UKVM_INJECT_VCPU_HANG)
		return cfg->inject_after * NSEC_PER_MSEC;
#endif
	if (cfg->source == UKVM_SOURCE_REMOTE)
		page_ns += UKVM_SOURCE_REMOTE_WAIT_NS;
	return NO_PROGRESS_NS + GUEST_STEP_CHUNK * page_ns;
}

/*
 * The watch.h call: waits WATCH_POLL_NS at most (or until woken), and fails
 * the run once it has spent watch_no_progress_ns() walking without progress. Only the walk is
 * watched: setup and verification do work of their own (minutes, for a
 * region of many GiB), and stopping is bounded by stop.c.
 */
void ukvm_watch_locked(struct ukvm_experiment *exp, struct ukvm_watch *w)
{
	uint64_t now = ukvm_now_ns(), mark = watch_progress_mark(exp), limit;
	bool walking = exp->walkable && exp->phase == ukvm_watch_phase_running;
	struct ukvm_error stuck = { 0 };
	struct timespec ts;

	if (!w->since_ns || !walking || exp->phase != w->phase || mark != w->mark) {
		w->phase = exp->phase;
		w->mark = mark;
		w->since_ns = now;
	}
	limit = watch_no_progress_ns(exp);
	if (walking && now - w->since_ns >= limit) {
		ukvm_err_set(&stuck, UKVM_ERR_TIMEOUT, 0,
			     "the run made no progress for %.1f s and has no time limit "
			     "(timeout_ns 0): %u of %u vCPUs were still running (a fault never "
			     "resolved?)", (double)limit / NSEC_PER_SEC, exp->ctl.vcpus_running,
			     exp->cfg.vcpus);
		ukvm_ctl_fail_locked(&exp->ctl, &stuck);
		return;
	}
	ukvm_timespec(&ts, ukvm_deadline_after(WATCH_POLL_NS));
	pthread_cond_timedwait(&exp->ctl.cond, &exp->ctl.lock, &ts);
}
