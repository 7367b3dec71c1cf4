/* SPDX-License-Identifier: MIT */
/* Filling a struct ukvm_error (errors.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/errors.h"

/* The -errno that kind and errnum stand for (see ukvm_err_code). */
static int errors_code(enum ukvm_error_kind kind, int errnum)
{
	if (errnum > 0)
		return -errnum;
	switch (kind) {
	case UKVM_ERR_CONFIG: return -EINVAL;
	case UKVM_ERR_HOST: return -EOPNOTSUPP;
	case UKVM_ERR_TIMEOUT: return -ETIMEDOUT;
	case UKVM_ERR_CANCELLED: return -ECANCELED;
	default: return -EIO;
	}
}

int ukvm_err_vset(struct ukvm_error *err, enum ukvm_error_kind kind, int errnum,
		  const char *fmt, va_list ap)
{
	size_t n;

	if (!err || err->kind != UKVM_ERR_NONE)
		return errors_code(kind, errnum);
	err->kind = kind;
	err->errnum = errnum;
	vsnprintf(err->message, sizeof(err->message), fmt, ap);
	if (errnum) {
		n = strlen(err->message);
		snprintf(err->message + n, sizeof(err->message) - n, ": %s (%s)",
			 strerror(errnum), strerrorname_np(errnum) ?: "unknown errno");
	}
	return errors_code(kind, errnum);
}

int ukvm_err_set(struct ukvm_error *err, enum ukvm_error_kind kind, int errnum,
		 const char *fmt, ...)
{
	va_list ap;
	int ret;

	va_start(ap, fmt);
	ret = ukvm_err_vset(err, kind, errnum, fmt, ap);
	va_end(ap);
	return ret;
}

int ukvm_err_set_hint(struct ukvm_error *err, enum ukvm_error_kind kind, int errnum,
		      const char *call, const char *hint_fmt, ...)
{
	size_t n;
	va_list ap;

	if (!err || err->kind != UKVM_ERR_NONE)
		return errors_code(kind, errnum);
	ukvm_err_set(err, kind, errnum, "%s", call);
	n = strlen(err->message);
	if (n + 2 < sizeof(err->message)) {
		memcpy(err->message + n, ". ", 3);
		va_start(ap, hint_fmt);
		vsnprintf(err->message + n + 2, sizeof(err->message) - n - 2, hint_fmt, ap);
		va_end(ap);
	}
	return errors_code(kind, errnum);
}

int ukvm_err_code(const struct ukvm_error *err)
{
	return errors_code(err->kind, err->errnum);
}
