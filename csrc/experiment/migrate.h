/* SPDX-License-Identifier: MIT */
/*
 * The source side of a live migration (migrate.c): after pass 1 the guest
 * keeps walking while the host sends its pages over a modelled link, round
 * by round, until it stops the vCPUs at a pass's end and sends (pre-copy)
 * or leaves (post-copy) what is still dirty. uffdkvm.migrate() runs the
 * destination from what this leaves: the memory at the stop, in a file, and
 * the pages the destination already holds.
 */
#ifndef UKVM_EXPERIMENT_MIGRATE_H
#define UKVM_EXPERIMENT_MIGRATE_H

#include "ukvm.h"

struct ukvm_migrate;
struct ukvm_experiment;

void ukvm_migrate_init(struct ukvm_migrate *m);
/*
 * After the vCPUs are made: the destination's copy and page maps, and every
 * vCPU gated at pass ends (pass 1, then the sender decides). 0, or -errno
 * with err set.
 */
int ukvm_migrate_setup(struct ukvm_experiment *exp, struct ukvm_error *err);
/*
 * The controller's part while the vCPUs run, called with ctl->lock held
 * (returns with it held): the rounds, the stop, the stop-copy, the check of
 * every page the destination holds against the source's, and the memory
 * written to migration_dump_path; then the vCPUs leave. A failure is
 * recorded as the run's (ctl).
 */
void ukvm_migrate_run(struct ukvm_experiment *exp);
/* The records into the result (they move). */
void ukvm_migrate_collect(struct ukvm_migrate *m, struct ukvm_result *res);
void ukvm_migrate_destroy(struct ukvm_migrate *m);

#endif
