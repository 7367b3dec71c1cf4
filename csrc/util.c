/* SPDX-License-Identifier: MIT */
/* Small helpers: clocks, sleeping, errors, EINTR-safe ioctls. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>

#include "internal.h"

uint64_t ukvm_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

void ukvm_sleep_ns(uint64_t ns)
{
	struct timespec ts = {
		.tv_sec = (time_t)(ns / NSEC_PER_SEC),
		.tv_nsec = (long)(ns % NSEC_PER_SEC),
	};

	/* A kick (EINTR) ends the sleep early: the sleeper re-checks stop. */
	clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, NULL);
}

void ukvm_err_vset(struct ukvm_error *err, enum ukvm_error_kind kind, int errnum,
		   const char *fmt, va_list ap)
{
	size_t n;

	if (!err || err->kind != UKVM_ERR_NONE)
		return;
	err->kind = kind;
	err->errnum = errnum;
	vsnprintf(err->message, sizeof(err->message), fmt, ap);
	if (errnum) {
		n = strlen(err->message);
		snprintf(err->message + n, sizeof(err->message) - n, ": %s (%s)",
			 strerror(errnum), strerrorname_np(errnum) ?: "unknown errno");
	}
}

void ukvm_err_set(struct ukvm_error *err, enum ukvm_error_kind kind, int errnum,
		  const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	ukvm_err_vset(err, kind, errnum, fmt, ap);
	va_end(ap);
}

void ukvm_err_set_hint(struct ukvm_error *err, enum ukvm_error_kind kind, int errnum,
		       const char *call, const char *hint_fmt, ...)
{
	size_t n;
	va_list ap;

	if (!err || err->kind != UKVM_ERR_NONE)
		return;
	ukvm_err_set(err, kind, errnum, "%s", call);
	n = strlen(err->message);
	if (n + 2 < sizeof(err->message)) {
		memcpy(err->message + n, ". ", 3);
		va_start(ap, hint_fmt);
		vsnprintf(err->message + n + 2, sizeof(err->message) - n - 2, hint_fmt, ap);
		va_end(ap);
	}
}

int ukvm_ioctl(int fd, unsigned long req, void *arg)
{
	int ret;

	do {
		ret = ioctl(fd, req, arg);
	} while (ret == -1 && errno == EINTR);
	return ret;
}
