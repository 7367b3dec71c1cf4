/* SPDX-License-Identifier: MIT */
/* The coordination between the controller and the threads it starts. */
#include <errno.h>
#include <sched.h>
#include <string.h>

#include "internal.h"

int ukvm_ctl_init(struct ukvm_ctl *ctl)
{
	pthread_condattr_t attr;
	int ret;

	memset(ctl, 0, sizeof(*ctl));
	ret = pthread_mutex_init(&ctl->lock, NULL);
	if (ret)
		return -ret;
	/* Deadlines are computed on CLOCK_MONOTONIC: wall-clock jumps must not matter. */
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	ret = pthread_cond_init(&ctl->cond, &attr);
	pthread_condattr_destroy(&attr);
	if (ret) {
		pthread_mutex_destroy(&ctl->lock);
		return -ret;
	}
	atomic_init(&ctl->stop, false);
	atomic_init(&ctl->abort, false);
	return 0;
}

int ukvm_thread_create(struct ukvm_ctl *ctl, pthread_t *thread, size_t stack_bytes,
		       void *(*fn)(void *), void *arg)
{
	pthread_attr_t attr;
	int ret;

	if (ukvm_ctl_inject(ctl, UKVM_INJECT_THREAD_CREATE))
		return EAGAIN;
	ret = pthread_attr_init(&attr);
	if (ret)
		return ret;
	ret = pthread_attr_setstacksize(&attr, stack_bytes);
	if (!ret)
		ret = pthread_create(thread, &attr, fn, arg);
	pthread_attr_destroy(&attr);
	return ret;
}

int ukvm_thread_pin(int cpu, uint64_t affinity[16])
{
	cpu_set_t set;
	int i;

	if (cpu >= 0) {
		CPU_ZERO(&set);
		CPU_SET(cpu, &set);
		if (sched_setaffinity(0, sizeof(set), &set))
			return -1;
	}
	memset(affinity, 0, 16 * sizeof(uint64_t));
	if (sched_getaffinity(0, sizeof(set), &set) == 0)
		for (i = 0; i < 1024 && i < CPU_SETSIZE; i++)
			if (CPU_ISSET(i, &set))
				affinity[i / 64] |= 1ULL << (i % 64);
	return 0;
}

void ukvm_ctl_destroy(struct ukvm_ctl *ctl)
{
	pthread_cond_destroy(&ctl->cond);
	pthread_mutex_destroy(&ctl->lock);
}

void ukvm_ctl_fail_locked(struct ukvm_ctl *ctl, const struct ukvm_error *err)
{
	if (!ctl->failed) {
		ctl->failed = true;
		ctl->error = *err;
	}
	atomic_store(&ctl->abort, true);
	atomic_store(&ctl->stop, true);
	pthread_cond_broadcast(&ctl->cond);
}

void ukvm_ctl_fail(struct ukvm_ctl *ctl, enum ukvm_error_kind kind, int errnum,
		   const char *fmt, ...)
{
	struct ukvm_error err = { 0 };
	va_list ap;

	/* Format outside the lock: strerror and snprintf are not free. */
	va_start(ap, fmt);
	ukvm_err_vset(&err, kind, errnum, fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&ctl->lock);
	ukvm_ctl_fail_locked(ctl, &err);
	pthread_mutex_unlock(&ctl->lock);
}
