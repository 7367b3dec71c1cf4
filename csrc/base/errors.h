/* SPDX-License-Identifier: MIT */
/*
 * Filling a struct ukvm_error (ukvm.h): a kind, an errno and a message
 * that names the failing call. The first error explains a failure; later
 * ones are echoes, so each setter leaves an error already set alone.
 */
#ifndef UKVM_BASE_ERRORS_H
#define UKVM_BASE_ERRORS_H

#include <stdarg.h>

#include "ukvm.h"

/*
 * Each setter returns the -errno that kind and errnum stand for (as
 * ukvm_err_code() gives it), whether or not err already held an error, so
 * a failing function ends with `return ukvm_err_set(...)` and never reads
 * errno a second time after a call that may have changed it.
 */
/* "message: strerror (ENAME)" when errnum is set; nothing if err already holds an error. */
int ukvm_err_set(struct ukvm_error *err, enum ukvm_error_kind kind, int errnum,
		 const char *fmt, ...) __attribute__((format(printf, 4, 5)));
int ukvm_err_vset(struct ukvm_error *err, enum ukvm_error_kind kind, int errnum,
		  const char *fmt, va_list ap);
/* "call: strerror (ENAME). hint": for failures the user can act on. */
int ukvm_err_set_hint(struct ukvm_error *err, enum ukvm_error_kind kind, int errnum,
		      const char *call, const char *hint_fmt, ...)
	__attribute__((format(printf, 5, 6)));
/*
 * The -errno a public function returns for err: its errnum, or for an
 * error without one, the errno its kind stands for (EINVAL for a config,
 * EOPNOTSUPP for the host, EIO for the run, ETIMEDOUT, ECANCELED).
 */
int ukvm_err_code(const struct ukvm_error *err);

#endif
