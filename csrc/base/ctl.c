/* SPDX-License-Identifier: MIT */
/* The coordination between the controller and the threads it starts. */
#include <stdio.h>
#include <string.h>

#include "base/ctl.h"
#include "base/errors.h"

int ukvm_ctl_init(struct ukvm_ctl *ctl)
{
	pthread_condattr_t attr;
	int ret;

	memset(ctl, 0, sizeof(*ctl));
	ctl->passes_open = UINT64_MAX;	/* no pass gates unless dirty tracking sets them */
	ctl->passes_end = UINT64_MAX;
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

void ukvm_ctl_fail_or_append(struct ukvm_ctl *ctl, const char *fmt, ...)
{
	struct ukvm_error err = { 0 };
	va_list ap;
	size_t n;

	va_start(ap, fmt);
	ukvm_err_vset(&err, UKVM_ERR_RUN, 0, fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&ctl->lock);
	if (ctl->failed) {
		n = strlen(ctl->error.message);
		snprintf(ctl->error.message + n, sizeof(ctl->error.message) - n, "; then %s",
			 err.message);
	}
	ukvm_ctl_fail_locked(ctl, &err);
	pthread_mutex_unlock(&ctl->lock);
}
