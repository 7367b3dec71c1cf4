/* SPDX-License-Identifier: MIT */
/* The result side of the binding: a struct ukvm_result into run()'s dict. */
#ifndef UKVM_PYTHON_RESULT_H
#define UKVM_PYTHON_RESULT_H

#include "python/common.h"

/* The result as dicts and lists of ints, by the structs' member names, or NULL. */
PyObject *pyresult_to_dict(const struct ukvm_result *res);

#endif
