/* SPDX-License-Identifier: MIT */
/* After the run: statistics, fault log, verification, the result (collect.c). */
#ifndef UKVM_EXPERIMENT_COLLECT_H
#define UKVM_EXPERIMENT_COLLECT_H

#include "experiment/state.h"
#include "ukvm.h"

/* Fills exp->result; every thread must have stopped. */
int ukvm_collect_result(struct ukvm_experiment *exp, struct ukvm_error *err);

#endif
