/* SPDX-License-Identifier: MIT */
/*
 * What every file of the binding shares: the CoreError exception, raised
 * from a struct ukvm_error, and the builders of dicts and lists of ints.
 * Each returns 0 or -1 (an object, or NULL) with the Python error set, as
 * the C API does.
 */
#ifndef UKVM_PYTHON_COMMON_H
#define UKVM_PYTHON_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "ukvm.h"

/* Adds uffdkvm._core.CoreError to m (made on the first call): 0 or -1. */
int py_core_error_add(PyObject *m);

/* Raises CoreError(kind, errno, message) from err. */
void py_raise_core_error(const struct ukvm_error *err);
/* d[key] = v. */
int py_set_u64(PyObject *d, const char *key, uint64_t v);
/* d[key] = o, o's reference taken (o NULL: the error already set). */
int py_set_obj(PyObject *d, const char *key, PyObject *o);
/* A new list of n items, or NULL with MemoryError where n cannot be one. */
PyObject *py_list_new(uint64_t n);
/* values[0..n) as a list of ints (values NULL: an empty list). */
PyObject *py_u64_list(const uint64_t *values, uint64_t n);

#endif
