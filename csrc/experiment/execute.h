/* SPDX-License-Identifier: MIT */
/* Running an experiment's vCPUs to the end, a failure, a cancel or the deadline (execute.c). */
#ifndef UKVM_EXPERIMENT_EXECUTE_H
#define UKVM_EXPERIMENT_EXECUTE_H

#include "experiment/state.h"
#include "ukvm.h"

/*
 * Starts the vCPU threads together and waits for them; a failure while
 * they run is the run's (exp->ctl), not this function's. 0, or -errno when
 * a thread could not be started.
 */
int ukvm_execute_run(struct ukvm_experiment *exp, struct ukvm_error *err);

#endif
