/* SPDX-License-Identifier: MIT */
/*
 * The page server's side of the binding (csrc/remote/): the server process's
 * body, the client connection Python's PageClient speaks through, and the
 * counters' names.
 */
#ifndef UKVM_PYTHON_REMOTE_H
#define UKVM_PYTHON_REMOTE_H

#include "python/common.h"

/* Adds the page server's functions and REMOTE_STATS_FIELDS/MEANINGS to m: 0 or -1. */
int pyremote_init(PyObject *m);

#endif
