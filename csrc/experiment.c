/* SPDX-License-Identifier: MIT */
/*
 * One experiment, from a config to a result, run by a controller thread of
 * its own (setup.c, execute.c, collect.c hold the phases), and the public
 * lifecycle around it: start, wait, cancel, finish, probe.
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

/*
 * A failed, cancelled or timed-out run is over once its threads are joined
 * and its fds closed, but handing back a region of several GiB can take the
 * kernel seconds (the page cache of a prefilled shmem region, say), and
 * Ctrl-C must answer within one. So its caller waits RELEASE_WAIT_NS at most
 * for the memory (enough for most regions: then it is all gone, as for a
 * run that succeeded); past that it returns, the controller releases the
 * memory on its own, and the experiment waits on this list until
 * ukvm_wait_idle() (or the next experiment's start) joins the controller
 * and frees it, so nothing piles up and no thread outlives it.
 */
#define RELEASE_WAIT_NS		(300 * NSEC_PER_MSEC)

static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ukvm_experiment *pending;

static void experiment_free(struct ukvm_experiment *exp);

void ukvm_wait_idle(void)
{
	struct ukvm_experiment *exp;

	pthread_mutex_lock(&pending_lock);
	while ((exp = pending)) {
		pending = exp->next_pending;
		pthread_join(exp->controller, NULL);
		experiment_free(exp);
	}
	pthread_mutex_unlock(&pending_lock);
}

static void experiment_free(struct ukvm_experiment *exp)
{
	ukvm_result_free(&exp->result);
	ukvm_tsc_clock_destroy(&exp->tsc_clock);
	ukvm_ctl_destroy(&exp->ctl);
	free(exp->pin_vcpus);
	free(exp->pin_readers);
	free(exp);
}

static void *controller_thread(void *arg)
{
	struct ukvm_experiment *exp = arg;
	struct ukvm_error err = { 0 };
	bool early;
	int ret;

	if (exp->cfg.timeout_ns)
		exp->deadline_ns = experiment_deadline_after(exp->cfg.timeout_ns);
	ret = experiment_setup(exp, &err);
	if (!ret && !exp_aborted(exp))
		ret = experiment_execute(exp, &err);
	if (ret)
		exp_fail(exp, &err);
	experiment_stop_vcpus(exp);
	experiment_stop_pools(exp, false);
	if (!exp_aborted(exp)) {
		ret = experiment_collect(exp, &err);
		if (ret)
			exp_fail(exp, &err);
	}
	early = exp_aborted(exp) && exp->mem.hva;
	experiment_teardown(exp, early);

	pthread_mutex_lock(&exp->ctl.lock);
	exp->finished = true;
	exp->releasing_memory = early;
	pthread_cond_broadcast(&exp->ctl.cond);
	pthread_mutex_unlock(&exp->ctl.lock);
	if (!early)
		return NULL;

	ukvm_mem_destroy(&exp->mem);	/* the caller may have gone: see ukvm_wait_idle() */
	pthread_mutex_lock(&exp->ctl.lock);
	exp->releasing_memory = false;
	pthread_cond_broadcast(&exp->ctl.cond);
	pthread_mutex_unlock(&exp->ctl.lock);
	return NULL;
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
	if (ret)
		return ret;
	ukvm_wait_idle();	/* an earlier failed run's memory first */
	exp = calloc(1, sizeof(*exp));
	if (!exp) {
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating the experiment");
		return -ENOMEM;
	}
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
	if ((cfg->nr_pin_vcpus && !exp->pin_vcpus) || (cfg->nr_pin_readers && !exp->pin_readers)) {
		free(exp->pin_vcpus);
		free(exp->pin_readers);
		free(exp);
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "copying the pin lists");
		return -ENOMEM;
	}
	exp->cfg.pin_vcpus = exp->pin_vcpus;
	exp->cfg.pin_readers = exp->pin_readers;
	ukvm_vm_init(&exp->vm);
	ukvm_kvmstats_init(&exp->vm_stats);
	ukvm_mem_init(&exp->mem);
	ret = ukvm_ctl_init(&exp->ctl);
	if (ret) {
		ukvm_err_set(err, UKVM_ERR_RUN, -ret, "pthread_mutex_init/pthread_cond_init");
		free(exp->pin_vcpus);
		free(exp->pin_readers);
		free(exp);
		return ret;
	}
	exp->ctl.inject = cfg->inject;
	exp->ctl.inject_after = cfg->inject_after;

	/* The controller, and every thread it makes, starts with all signals blocked. */
	ukvm_block_all_signals(&old);
	ret = pthread_create(&exp->controller, NULL, controller_thread, exp);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret) {
		ukvm_err_set(err, UKVM_ERR_RUN, ret, "pthread_create(controller)");
		ukvm_ctl_destroy(&exp->ctl);
		free(exp->pin_vcpus);
		free(exp->pin_readers);
		free(exp);
		return -ret;
	}
	*out = exp;
	return 0;
}

int ukvm_experiment_wait(struct ukvm_experiment *exp, uint64_t timeout_ns)
{
	struct ukvm_ctl *ctl = &exp->ctl;
	uint64_t deadline = experiment_deadline_after(timeout_ns);
	struct timespec ts;
	int ret = 0;

	experiment_timespec(&ts, deadline);
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
	int ret = 0;

	memset(err, 0, sizeof(*err));
	memset(res, 0, sizeof(*res));
	ukvm_experiment_wait(exp, UINT64_MAX);
	pthread_mutex_lock(&exp->ctl.lock);
	if (exp->releasing_memory) {
		/* Failed: most regions go in milliseconds; for the rest, don't wait. */
		struct timespec ts;

		experiment_timespec(&ts, experiment_deadline_after(RELEASE_WAIT_NS));
		while (exp->releasing_memory &&
		       pthread_cond_timedwait(&exp->ctl.cond, &exp->ctl.lock, &ts) != ETIMEDOUT)
			;
	}
	if (exp->releasing_memory) {
		/* Answer now; the controller finishes releasing memory. */
		*err = exp->ctl.error;
		pthread_mutex_unlock(&exp->ctl.lock);
		pthread_mutex_lock(&pending_lock);
		exp->next_pending = pending;
		pending = exp;
		pthread_mutex_unlock(&pending_lock);
		return -1;
	}
	pthread_mutex_unlock(&exp->ctl.lock);
	pthread_join(exp->controller, NULL);
	if (exp->ctl.failed) {
		*err = exp->ctl.error;
		ret = -1;
	} else {
		*res = exp->result;
		memset(&exp->result, 0, sizeof(exp->result));	/* now the caller's */
	}
	experiment_free(exp);
	return ret;
}

int ukvm_probe(const struct ukvm_config *cfg, struct ukvm_error *err)
{
	struct ukvm_experiment *exp;
	int ret;

	memset(err, 0, sizeof(*err));
	ret = ukvm_config_validate(cfg, err);
	if (ret)
		return ret;
	exp = calloc(1, sizeof(*exp));
	if (!exp) {
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating the probe");
		return -ENOMEM;
	}
	exp->cfg = *cfg;
	exp->cfg.nr_pin_vcpus = exp->cfg.nr_pin_readers = 0;
	exp->probe = true;
	ukvm_vm_init(&exp->vm);
	ukvm_mem_init(&exp->mem);
	ukvm_kvmstats_init(&exp->vm_stats);
	ret = ukvm_ctl_init(&exp->ctl);
	if (ret) {
		ukvm_err_set(err, UKVM_ERR_RUN, -ret, "pthread_mutex_init/pthread_cond_init");
		free(exp);
		return ret;
	}
	ret = experiment_setup(exp, err);
	experiment_teardown(exp, false);
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
	ukvm_free_names(res->vm_stat_names, res->nr_vm_stats);
	ukvm_free_names(res->vcpu_stat_names, res->nr_vcpu_stats);
	free(res->vm_stats);
	free(res->trace);
	res->trace = NULL;
	res->nr_trace = 0;
	res->vm_stat_names = res->vcpu_stat_names = NULL;
	res->vm_stats = NULL;
	free(res->vcpus);
	free(res->readers);
	res->vcpus = NULL;
	res->readers = NULL;
}
