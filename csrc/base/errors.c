/* SPDX-License-Identifier: MIT */
/* Filling a struct ukvm_error (errors.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/errors.h"

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

int ukvm_err_code(const struct ukvm_error *err)
{
	if (err->errnum > 0)
		return -err->errnum;
	switch (err->kind) {
	case UKVM_ERR_CONFIG: return -EINVAL;
	case UKVM_ERR_HOST: return -EOPNOTSUPP;
	case UKVM_ERR_TIMEOUT: return -ETIMEDOUT;
	case UKVM_ERR_CANCELLED: return -ECANCELED;
	default: return -EIO;
	}
}
