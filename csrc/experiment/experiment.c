/* SPDX-License-Identifier: MIT */
/*
 * One experiment, from a config to a result, run by a controller thread of
 * its own (setup.c, execute.c, collect.c hold the phases), and the public
 * lifecycle around it: start, wait, cancel, finish, probe.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "base/ctl.h"
#include "base/errors.h"
#include "base/kick.h"
#include "base/tsc.h"
#include "base/util.h"
#include "experiment/collect.h"
#include "experiment/config.h"
#include "experiment/dirty.h"
#include "experiment/execute.h"
#include "experiment/migrate.h"
#include "experiment/setup.h"
#include "experiment/state.h"
#include "experiment/stop.h"
#include "experiment/watch.h"
#include "kvm/kvmstats.h"
#include "kvm/vm.h"
#include "uffd/backing.h"
#include "uffd/pool.h"
#include "uffd/ring.h"
#include "uffd/source.h"
#include "ukvm.h"

/*
 * A failed, cancelled or timed-out run is over once its threads are joined
 * and its fds closed, but handing back a region of several GiB can take the
 * kernel seconds (the page cache of a prefilled shmem region, say), and
 * Ctrl-C must answer within one. So its caller waits RELEASE_WAIT_NS at most
 * for the memory (enough for most regions: then it is all gone, as for a
 * run that succeeded); past that it returns, the controller releases the
 * memory on its own, and the experiment waits on the pending list until
 * ukvm_wait_idle() (or the next experiment's start) joins the controller
 * and frees it, so nothing piles up and no thread outlives it.
 *
 * The same list holds an experiment with a thread that would not stop
 * (experiment_linger) and one whose caller stopped waiting for it to stop
 * (CANCEL_WAIT_NS after a cancel, ABORT_WAIT_NS after a failure). Nothing
 * here waits for them without a bound: the next start and probe wait
 * IDLE_WAIT_NS at most (counted from when the caller left each one) and go
 * on; ukvm_wait_idle_for() says which thread still holds on.
 */
#define RELEASE_WAIT_NS		(300 * NSEC_PER_MSEC)
/* Ctrl-C must answer within a second, whatever a thread that would not stop does. */
#define CANCEL_WAIT_NS		(500 * NSEC_PER_MSEC)
/* Stopping takes STOP_WAIT_NS per kind of thread, at most; this is a safety net. */
#define ABORT_WAIT_NS		(3 * STOP_WAIT_NS)
#define IDLE_WAIT_NS		(10 * NSEC_PER_SEC)
#define IDLE_POLL_NS		(2 * NSEC_PER_MSEC)
/* The background waits for a thread that would not stop: kicks this often. */
#define LINGER_POLL_NS		(20 * NSEC_PER_MSEC)

static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ukvm_experiment *pending;

static void experiment_free(struct ukvm_experiment *exp);

/* Under pending_lock: why exp still holds on, for an error. */
static void pending_describe(struct ukvm_experiment *exp, uint64_t now, struct ukvm_error *err)
{
	pthread_mutex_lock(&exp->ctl.lock);
	if (exp->lingering)
		ukvm_err_set(err, UKVM_ERR_RUN, 0,
			     "an earlier experiment still holds its threads, fds and memory: "
			     "%s, and it is still running %.1f s later",
			     exp->holdout,
			     (double)(now - exp->lingering_since_ns) / NSEC_PER_SEC);
	else
		ukvm_err_set(err, UKVM_ERR_RUN, 0,
			     "an earlier experiment has not finished %s, %.1f s after its caller "
			     "left it",
			     exp->releasing_memory ? "releasing its memory" :
			     exp->phase ? exp->phase : "starting",
			     (double)(now - exp->handoff_ns) / NSEC_PER_SEC);
	pthread_mutex_unlock(&exp->ctl.lock);
}

/*
 * Joins and frees every pending experiment whose controller is done, and
 * waits for the others until deadline_ns (with since_handoff, no longer
 * than IDLE_WAIT_NS after its caller left each one). 0, or -ETIMEDOUT with
 * err saying which one still holds on.
 */
static int pending_wait(uint64_t deadline_ns, bool since_handoff, struct ukvm_error *err)
{
	struct ukvm_experiment **pp, *exp, *holdout;
	uint64_t now, own;
	bool waiting;

	pthread_mutex_lock(&pending_lock);
	for (;;) {
		now = ukvm_now_ns();
		holdout = NULL;
		waiting = false;
		for (pp = &pending; (exp = *pp); pp = &exp->next_pending) {
			if (atomic_load(&exp->controller_done))
				break;
			own = deadline_ns;
			if (since_handoff && exp->handoff_ns + IDLE_WAIT_NS < own)
				own = exp->handoff_ns + IDLE_WAIT_NS;
			if (now < own)
				waiting = true;
			else if (!holdout)
				holdout = exp;
		}
		if (exp) {
			/* Its controller is returning: the join is prompt. */
			*pp = exp->next_pending;
			pthread_mutex_unlock(&pending_lock);
			pthread_join(exp->controller, NULL);
			experiment_free(exp);
			pthread_mutex_lock(&pending_lock);
			continue;
		}
		if (!waiting)
			break;
		pthread_mutex_unlock(&pending_lock);
		ukvm_sleep_ns(IDLE_POLL_NS);
		pthread_mutex_lock(&pending_lock);
	}
	if (holdout && err)
		pending_describe(holdout, now, err);
	pthread_mutex_unlock(&pending_lock);
	return holdout ? -ETIMEDOUT : 0;
}

int ukvm_wait_idle_for(uint64_t timeout_ns, struct ukvm_error *err)
{
	if (err)
		memset(err, 0, sizeof(*err));
	return pending_wait(ukvm_deadline_after(timeout_ns), false, err);
}

void ukvm_wait_idle(void)
{
	ukvm_wait_idle_for(IDLE_WAIT_NS, NULL);
}

/* The caller is leaving exp to the controller: the next start or wait_idle frees it. */
static void pending_add(struct ukvm_experiment *exp)
{
	pthread_mutex_lock(&pending_lock);
	exp->handoff_ns = ukvm_now_ns();
	exp->next_pending = pending;
	pending = exp;
	pthread_mutex_unlock(&pending_lock);
}

/* The copies of the caller's lists, and the experiment. */
static void experiment_free_lists(struct ukvm_experiment *exp)
{
	free(exp->pin_vcpus);
	free(exp->pin_readers);
	free(exp->replay);
	free(exp->preinstall);
	free(exp);
}

static void experiment_free(struct ukvm_experiment *exp)
{
	ukvm_result_free(&exp->result);
	ukvm_tsc_clock_destroy(&exp->tsc_clock);
	ukvm_ctl_destroy(&exp->ctl);
	experiment_free_lists(exp);
}

/* fds this process has open below limit: the numbers the next open competes for. */
static uint64_t fds_open_below(uint64_t limit)
{
	struct dirent *e;
	uint64_t n = 0;
	DIR *d;
	int self;

	d = opendir("/proc/self/fd");
	if (!d)
		return errno == EMFILE ? limit : 0;	/* no fd left even for this */
	self = dirfd(d);
	while ((e = readdir(d))) {
		char *end;
		long fd = strtol(e->d_name, &end, 10);

		if (*end || end == e->d_name || fd == self)
			continue;
		n += (uint64_t)fd < limit;
	}
	closedir(d);
	return n;
}

/* ", hard limit H" and the fix, for an error about RLIMIT_NOFILE; needed may be 0. */
static void fds_fix(char *buf, size_t len, const struct rlimit *rl, uint64_t open,
		   uint64_t needed)
{
	uint64_t want = ((open + needed) / 1024 + 1) * 1024;
	char hard[32];

	if (rl->rlim_max == RLIM_INFINITY)
		snprintf(hard, sizeof(hard), "unlimited");
	else
		snprintf(hard, sizeof(hard), "%llu", (unsigned long long)rl->rlim_max);
	if (rl->rlim_max != RLIM_INFINITY && want > rl->rlim_max)
		want = rl->rlim_max;
	snprintf(buf, len,
		 "its soft limit RLIMIT_NOFILE is %llu (hard limit %s) and %llu are open. Raise "
		 "the soft limit: 'ulimit -n %llu' in the shell that starts the program, or "
		 "resource.setrlimit(resource.RLIMIT_NOFILE, (%llu, hard)) in Python before the "
		 "run%s; or use fewer readers or vCPUs",
		 (unsigned long long)rl->rlim_cur, hard, (unsigned long long)open,
		 (unsigned long long)want, (unsigned long long)want,
		 rl->rlim_max != RLIM_INFINITY && open + needed > rl->rlim_max ?
		 " (the hard limit is too low for this run too: as root, raise it first)" : "");
}

/*
 * Before anything is built: can this process open the fds cfg needs? 0, or
 * -EMFILE with an error (UKVM_ERR_HOST) that says how many, the limits and
 * the fix.
 */
static int fds_check(const struct ukvm_config *cfg, bool probe, struct ukvm_error *err)
{
	char why[384], fix[512];
	struct rlimit rl;
	uint64_t needed, open, limit;

	if (getrlimit(RLIMIT_NOFILE, &rl))
		return 0;	/* nothing to go by: the opens will say */
	limit = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur;
	needed = ukvm_setup_fds_needed(cfg, probe, why, sizeof(why));
	open = fds_open_below(limit);
	if (open <= limit && needed <= limit - open)
		return 0;
	fds_fix(fix, sizeof(fix), &rl, open, needed);
	ukvm_err_set(err, UKVM_ERR_HOST, 0,
		     "this %s needs %llu more file descriptors (%s), and this process can open "
		     "only %llu more: %s", probe ? "probe" : "run", (unsigned long long)needed,
		     why, (unsigned long long)(open < limit ? limit - open : 0), fix);
	err->errnum = EMFILE;	/* the errno it would have met, without strerror's words */
	return -EMFILE;
}

/* An EMFILE that still happened (another thread took fds meanwhile): the same fix. */
static void fds_hint(struct ukvm_error *err)
{
	char fix[512];
	struct rlimit rl;
	size_t n;

	if (err->errnum != EMFILE || strstr(err->message, "RLIMIT_NOFILE") ||
	    getrlimit(RLIMIT_NOFILE, &rl))
		return;	/* not out of fds, or already says so */
	fds_fix(fix, sizeof(fix), &rl,
	       fds_open_below(rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur), 0);
	n = strlen(err->message);
	snprintf(err->message + n, sizeof(err->message) - n,
		 ". This process ran out of file descriptors: %s", fix);
}

static void experiment_set_phase(struct ukvm_experiment *exp, const char *phase)
{
	pthread_mutex_lock(&exp->ctl.lock);
	exp->phase = phase;
	pthread_mutex_unlock(&exp->ctl.lock);
}

/* The controller's last act: after it, exp may be freed at any moment. */
static void experiment_controller_done(struct ukvm_experiment *exp)
{
	pthread_mutex_lock(&exp->ctl.lock);
	atomic_store(&exp->controller_done, true);
	pthread_cond_broadcast(&exp->ctl.cond);
	pthread_mutex_unlock(&exp->ctl.lock);
}

/*
 * A thread would not stop. It may still touch anything of the experiment
 * (its vCPU's kvm_run, a reader's pool, the fds it uses, guest memory), so
 * nothing is freed: the failure is published at once (the caller answers),
 * and this thread, in the background, kicks and waits for the stragglers,
 * then tears everything down. Nobody waits for this beyond a bound (see
 * pending_wait); a thread that never leaves keeps its experiment for the
 * life of the process, which is better than freeing memory under it.
 */
static void experiment_linger(struct ukvm_experiment *exp)
{
	pthread_mutex_lock(&exp->ctl.lock);
	exp->phase = "waiting for a thread that would not stop";
	exp->walkable = false;		/* the VM goes below: progress must not read it */
	exp->lingering = true;
	exp->lingering_since_ns = ukvm_now_ns();
	exp->finished = true;
	pthread_cond_broadcast(&exp->ctl.cond);
	pthread_mutex_unlock(&exp->ctl.lock);

	while (ukvm_stop_wait_threads(exp, LINGER_POLL_NS))
		;
	ukvm_setup_teardown(exp, false);
	pthread_mutex_lock(&exp->ctl.lock);
	exp->lingering = false;
	pthread_mutex_unlock(&exp->ctl.lock);
}

#ifdef UKVM_TEST_HOOKS
/*
 * The thread budget (ukvm_setup_threads_needed, which Python checks against
 * pids.max and RLIMIT_NPROC) against the threads the run made through
 * ukvm_thread_create. Only those are checked: the controller and KVM's
 * worker are added here as the 2 the budget counts them as, so a budget
 * that miscounted either would still pass (counting the process's tasks
 * instead would take in Python's own threads). A drift in the core's own
 * threads fails every test that runs the config.
 */
static int experiment_check_threads(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	char why[256];
	uint64_t counted = ukvm_setup_threads_needed(&exp->cfg, why, sizeof(why));
	uint64_t made = atomic_load(&exp->ctl.threads_made) + 2;	/* see above */

	if (made == counted)
		return 0;
	return ukvm_err_set(err, UKVM_ERR_RUN, 0, "the run made %llu threads through "
			    "ukvm_thread_create (shown with 2 added for the controller and "
			    "KVM's worker, not counted), but its thread budget "
			    "(ukvm_setup_threads_needed) counts %llu (%s): the two have drifted "
			    "apart", (unsigned long long)made, (unsigned long long)counted, why);
}
#endif

static void *experiment_controller(void *arg)
{
	struct ukvm_experiment *exp = arg;
	struct ukvm_error err = { 0 };
	uint32_t running;
	bool early;
	int ret;

	if (exp->cfg.timeout_ns)
		exp->deadline_ns = ukvm_deadline_after(exp->cfg.timeout_ns);
	experiment_set_phase(exp, "setting up");
	ret = ukvm_setup_build(exp, &err);
	if (ret)
		fds_hint(&err);
	if (!ret && !exp_aborted(exp)) {
		pthread_mutex_lock(&exp->ctl.lock);
		exp->walkable = true;
		exp->phase = ukvm_watch_phase_running;
		pthread_mutex_unlock(&exp->ctl.lock);
		ret = ukvm_execute_run(exp, &err);
#ifdef UKVM_TEST_HOOKS
		if (!ret && !exp_aborted(exp))
			ret = experiment_check_threads(exp, &err);
#endif
	}
	if (ret)
		exp_fail(exp, &err);
	experiment_set_phase(exp, "stopping the vCPUs");
	/* A vCPU resolving its own fault may wait on the page server: its pool's stop ends that. */
	if (exp_aborted(exp) && exp->cfg.resolver == UKVM_RESOLVER_VCPU)
		for (uint32_t u = 0; u < exp->nr_pools; u++)
			ukvm_pool_request_stop(&exp->pools[u]);
	running = ukvm_stop_vcpus(exp);
	experiment_set_phase(exp, "stopping the readers");
	running += ukvm_stop_pools(exp, false);
	if (running) {
		experiment_linger(exp);
		experiment_controller_done(exp);
		return NULL;
	}
	if (!exp_aborted(exp)) {
		experiment_set_phase(exp, "verifying");
		ret = ukvm_collect_result(exp, &err);
		if (ret)
			exp_fail(exp, &err);
	}
	pthread_mutex_lock(&exp->ctl.lock);
	exp->walkable = false;
	exp->phase = "releasing";
	pthread_mutex_unlock(&exp->ctl.lock);
	early = exp_aborted(exp) && exp->mem.hva;
	ukvm_setup_teardown(exp, early);

	pthread_mutex_lock(&exp->ctl.lock);
	exp->finished = true;
	exp->releasing_memory = early;
	pthread_cond_broadcast(&exp->ctl.cond);
	pthread_mutex_unlock(&exp->ctl.lock);
	if (early) {
		ukvm_backing_destroy(&exp->mem);	/* the caller may have gone: see pending_wait() */
		pthread_mutex_lock(&exp->ctl.lock);
		exp->releasing_memory = false;
		pthread_mutex_unlock(&exp->ctl.lock);
	}
	experiment_controller_done(exp);
	return NULL;
}

/*
 * What this build lacks for a sound config (wait io_uring without liburing):
 * the host's lack, kept out of validation so that validating stays pure.
 */
static int experiment_check_build(const struct ukvm_config *cfg, struct ukvm_error *err)
{
	if (cfg->wait == UKVM_WAIT_IO_URING && cfg->uffd_mode != UKVM_UFFD_NONE &&
	    cfg->resolver == UKVM_RESOLVER_READERS)
		return ukvm_ring_built(err);
	return 0;
}

const struct ukvm_config *ukvm_experiment_config(const struct ukvm_experiment *exp)
{
	return &exp->cfg;
}

int ukvm_experiment_start(const struct ukvm_config *cfg, struct ukvm_experiment **out,
			  struct ukvm_error *err)
{
	struct ukvm_experiment *exp;
	sigset_t old;
	int ret;

	memset(err, 0, sizeof(*err));
	ret = ukvm_config_validate(cfg, err);
	ret = ret ?: ukvm_kick_init(err);
	ret = ret ?: experiment_check_build(cfg, err);
	ret = ret ?: ukvm_setup_check_vcpus(cfg, err);
	if (!ret) {
		/*
		 * An earlier failed run's memory (and fds) first, for a bounded
		 * while: then go on.
		 */
		pending_wait(ukvm_deadline_after(IDLE_WAIT_NS), true, NULL);
		ret = fds_check(cfg, false, err);
	}
	if (ret) {
		fds_hint(err);
		return ret;
	}
	exp = calloc(1, sizeof(*exp));
	if (!exp)
		return ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating the experiment");
	exp->cfg = *cfg;
	/* The caller's pin lists need not outlive this call: keep copies. */
	if (cfg->nr_pin_vcpus) {
		exp->pin_vcpus = malloc(cfg->nr_pin_vcpus * sizeof(int32_t));
		if (exp->pin_vcpus)
			memcpy(exp->pin_vcpus, cfg->pin_vcpus, cfg->nr_pin_vcpus * sizeof(int32_t));
	}
	if (cfg->nr_pin_readers) {
		exp->pin_readers = malloc(cfg->nr_pin_readers * sizeof(int32_t));
		if (exp->pin_readers)
			memcpy(exp->pin_readers, cfg->pin_readers,
			       cfg->nr_pin_readers * sizeof(int32_t));
	}
	if (cfg->nr_replay) {
		exp->replay = malloc(cfg->nr_replay * sizeof(uint64_t));
		if (exp->replay)
			memcpy(exp->replay, cfg->replay, cfg->nr_replay * sizeof(uint64_t));
	}
	if (cfg->nr_preinstall) {
		exp->preinstall = malloc(cfg->nr_preinstall * sizeof(uint64_t));
		if (exp->preinstall)
			memcpy(exp->preinstall, cfg->preinstall, cfg->nr_preinstall * sizeof(uint64_t));
	}
	if ((cfg->nr_pin_vcpus && !exp->pin_vcpus) || (cfg->nr_pin_readers && !exp->pin_readers) ||
	    (cfg->nr_replay && !exp->replay) || (cfg->nr_preinstall && !exp->preinstall)) {
		experiment_free_lists(exp);
		return ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "copying the pin and page lists");
	}
	exp->cfg.pin_vcpus = exp->pin_vcpus;
	exp->cfg.pin_readers = exp->pin_readers;
	exp->cfg.replay = exp->replay;
	exp->cfg.preinstall = exp->preinstall;
	ukvm_vm_init(&exp->vm);
	ukvm_kvmstats_init(&exp->vm_stats);
	ukvm_backing_init(&exp->mem);
	ukvm_source_init(&exp->source);
	ukvm_resident_init(&exp->resident);
	ukvm_pusher_init(&exp->pusher);
	ukvm_dirty_init(&exp->dirty);
	ukvm_migrate_init(&exp->migrate);
	ret = ukvm_ctl_init(&exp->ctl);
	if (ret) {
		ukvm_err_set(err, UKVM_ERR_RUN, -ret, "pthread_mutex_init/pthread_cond_init");
		experiment_free_lists(exp);
		return ret;
	}
#ifdef UKVM_TEST_HOOKS
	exp->ctl.inject = cfg->inject;
	exp->ctl.inject_after = cfg->inject_after;
#endif
	atomic_init(&exp->controller_done, false);

	/*
	 * The controller, and every thread it makes, starts with every signal
	 * blocked but the synchronous ones (kick.c).
	 */
	ukvm_kick_block_all(&old);
	ret = pthread_create(&exp->controller, NULL, experiment_controller, exp);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret) {
		ukvm_err_set(err, UKVM_ERR_RUN, ret, "pthread_create(controller)");
		ukvm_ctl_destroy(&exp->ctl);
		experiment_free_lists(exp);
		return -ret;
	}
	*out = exp;
	return 0;
}

int ukvm_experiment_wait(struct ukvm_experiment *exp, uint64_t timeout_ns)
{
	struct ukvm_ctl *ctl = &exp->ctl;
	uint64_t deadline = ukvm_deadline_after(timeout_ns);
	struct timespec ts;
	int ret = 0;

	ukvm_timespec(&ts, deadline);
	pthread_mutex_lock(&ctl->lock);
	while (!exp->finished) {
		if (timeout_ns == UINT64_MAX) {
			pthread_cond_wait(&ctl->cond, &ctl->lock);
		} else if (pthread_cond_timedwait(&ctl->cond, &ctl->lock, &ts) == ETIMEDOUT) {
			ret = exp->finished ? 0 : -ETIMEDOUT;
			break;
		}
	}
	pthread_mutex_unlock(&ctl->lock);
	return ret;
}

void ukvm_experiment_progress(struct ukvm_experiment *exp, const char **phase,
			      uint64_t *pages_done, uint64_t *pages_total, uint32_t n)
{
	uint32_t i;

	pthread_mutex_lock(&exp->ctl.lock);
	*phase = exp->phase ? exp->phase : "starting";
	for (i = 0; i < n; i++) {
		pages_done[i] = 0;
		pages_total[i] = 0;
		if (exp->walkable && i < exp->cfg.vcpus)
			pages_done[i] = ukvm_watch_pages_done(exp, i, &pages_total[i]);
	}
	pthread_mutex_unlock(&exp->ctl.lock);
}

void ukvm_experiment_cancel(struct ukvm_experiment *exp)
{
	struct ukvm_ctl *ctl = &exp->ctl;

	struct ukvm_error cancelled = { 0 };

	ukvm_err_set(&cancelled, UKVM_ERR_CANCELLED, 0, "the experiment was cancelled");
	pthread_mutex_lock(&ctl->lock);
	if (!exp->finished) {	/* too late to cancel a finished run: keep its result */
		ctl->cancelled = true;
		ukvm_ctl_fail_locked(ctl, &cancelled);
	}
	pthread_mutex_unlock(&ctl->lock);
}

int ukvm_experiment_finish(struct ukvm_experiment *exp, struct ukvm_result *res,
			   struct ukvm_error *err)
{
	struct ukvm_ctl *ctl = &exp->ctl;
	struct ukvm_watch watch = { 0 };
	uint64_t now, failed_at = 0, bound = 0;
	struct timespec ts;
	int ret = 0;

	memset(err, 0, sizeof(*err));
	memset(res, 0, sizeof(*res));
	pthread_mutex_lock(&ctl->lock);
	/*
	 * A run that goes on is waited for as long as it runs: to its time
	 * limit (timeout_ns), or without one for as long as it makes progress
	 * (watch.c), since a C caller has no other thread to cancel it with.
	 * Once it has failed or been cancelled, stopping is waited for a
	 * bounded while only.
	 */
	while (!exp->finished) {
		if (!ctl->failed && exp->cfg.timeout_ns) {
			pthread_cond_wait(&ctl->cond, &ctl->lock);	/* execute.c fails it at the deadline */
			continue;
		}
		if (!ctl->failed) {
			ukvm_watch_locked(exp, &watch);
			continue;
		}
		now = ukvm_now_ns();
		if (!failed_at)
			failed_at = now;
		bound = ctl->cancelled ? CANCEL_WAIT_NS : ABORT_WAIT_NS;
		if (now - failed_at >= bound)
			break;
		ukvm_timespec(&ts, failed_at + bound);
		pthread_cond_timedwait(&ctl->cond, &ctl->lock, &ts);
	}
	if (!exp->finished) {
		/* Answer now; the controller stops on its own and pending_wait() frees it. */
		*err = ctl->error;
		if (!ctl->cancelled) {
			size_t n = strlen(err->message);

			snprintf(err->message + n, sizeof(err->message) - n,
				 "; then the experiment did not finish stopping within %.1f s (it "
				 "was %s): it is left to finish in the background",
				 (double)bound / NSEC_PER_SEC, exp->phase ? exp->phase : "starting");
		}
		pthread_mutex_unlock(&ctl->lock);
		pending_add(exp);
		return ukvm_err_code(err);
	}
	if (exp->releasing_memory) {
		/* Failed: most regions go in milliseconds; for the rest, don't wait. */
		ukvm_timespec(&ts, ukvm_deadline_after(RELEASE_WAIT_NS));
		while (exp->releasing_memory &&
		       pthread_cond_timedwait(&ctl->cond, &ctl->lock, &ts) != ETIMEDOUT)
			;
	}
	if (exp->releasing_memory || exp->lingering) {
		/* Answer now; the controller finishes releasing memory or waiting. */
		*err = ctl->error;
		pthread_mutex_unlock(&ctl->lock);
		pending_add(exp);
		return ukvm_err_code(err);
	}
	pthread_mutex_unlock(&ctl->lock);
	pthread_join(exp->controller, NULL);	/* finished, nothing left: it is returning */
	if (ctl->failed) {
		*err = ctl->error;
		ret = ukvm_err_code(err);
	} else {
		*res = exp->result;
		memset(&exp->result, 0, sizeof(exp->result));	/* now the caller's */
	}
	experiment_free(exp);
	return ret;
}

uint64_t ukvm_threads_needed(const struct ukvm_config *cfg, char *why, size_t why_len)
{
	return ukvm_setup_threads_needed(cfg, why, why_len);
}

int ukvm_probe(const struct ukvm_config *cfg, struct ukvm_error *err)
{
	struct ukvm_experiment *exp;
	int ret;

	memset(err, 0, sizeof(*err));
	ret = ukvm_config_validate(cfg, err);
	ret = ret ?: experiment_check_build(cfg, err);
	ret = ret ?: ukvm_setup_check_vcpus(cfg, err);
	if (!ret) {
		/* As a run's start: an earlier failed run's memory first, a bounded while. */
		pending_wait(ukvm_deadline_after(IDLE_WAIT_NS), true, NULL);
		ret = fds_check(cfg, true, err);
	}
	if (ret) {
		fds_hint(err);
		return ret;
	}
	exp = calloc(1, sizeof(*exp));
	if (!exp)
		return ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating the probe");
	exp->cfg = *cfg;
	exp->cfg.nr_pin_vcpus = exp->cfg.nr_pin_readers = 0;
	exp->probe = true;
	exp->cfg.nr_replay = 0;		/* a probe starts no pusher: the list is not kept */
	exp->cfg.replay = NULL;
	exp->cfg.prefetch = UKVM_PREFETCH_NONE;
	ukvm_vm_init(&exp->vm);
	ukvm_backing_init(&exp->mem);
	ukvm_source_init(&exp->source);
	ukvm_resident_init(&exp->resident);
	ukvm_pusher_init(&exp->pusher);
	ukvm_dirty_init(&exp->dirty);
	ukvm_migrate_init(&exp->migrate);
	ukvm_kvmstats_init(&exp->vm_stats);
	ret = ukvm_ctl_init(&exp->ctl);
	if (ret) {
		ukvm_err_set(err, UKVM_ERR_RUN, -ret, "pthread_mutex_init/pthread_cond_init");
		free(exp);
		return ret;
	}
	ret = ukvm_setup_build(exp, err);
	if (ret)
		fds_hint(err);
	ukvm_setup_teardown(exp, false);
	experiment_free(exp);
	return ret;
}

int ukvm_run(const struct ukvm_config *cfg, struct ukvm_result *res, struct ukvm_error *err)
{
	struct ukvm_experiment *exp;
	int ret;

	memset(res, 0, sizeof(*res));
	ret = ukvm_experiment_start(cfg, &exp, err);
	if (ret)
		return ret;
	return ukvm_experiment_finish(exp, res, err);
}

void ukvm_result_free(struct ukvm_result *res)
{
	uint32_t i;

	for (i = 0; res->vcpus && i < res->nr_vcpus; i++) {
		free(res->vcpus[i].kvm_stats);
		free(res->vcpus[i].pass_end_ns);
	}
	ukvm_kvmstats_free_names(res->kvm_stat_names, res->nr_kvm_stats);
	ukvm_kvmstats_free_names(res->vcpu_stat_names, res->nr_vcpu_stats);
	free(res->kvm_stats);
	free(res->fault_trace);
	res->fault_trace = NULL;
	free(res->page_visits);
	res->page_visits = NULL;
	res->nr_page_visits = 0;
	free(res->touch_order);
	res->touch_order = NULL;
	free(res->dirty_passes);
	res->dirty_passes = NULL;
	res->nr_dirty_passes = 0;
	free(res->migration_rounds);
	res->migration_rounds = NULL;
	res->nr_migration_rounds = 0;
	free(res->migrated_pages);
	res->migrated_pages = NULL;
	res->nr_migrated_pages = 0;
	res->nr_touch_order = 0;
	res->nr_fault_trace = 0;
	res->kvm_stat_names = res->vcpu_stat_names = NULL;
	res->kvm_stats = NULL;
	free(res->vcpus);
	free(res->readers);
	res->vcpus = NULL;
	res->readers = NULL;
}
