/* SPDX-License-Identifier: MIT */
/* How the run's memory is demand-paged: its uffds, their pools and the pusher (paging.c). */
#ifndef UKVM_EXPERIMENT_PAGING_H
#define UKVM_EXPERIMENT_PAGING_H

#include <stdbool.h>
#include <stdint.h>

#include "experiment/state.h"
#include "uffd/pool.h"
#include "ukvm.h"

/* How many uffds (pools) a run of cfg has: 0 without a uffd_mode. */
uint32_t ukvm_paging_nr_pools(const struct ukvm_config *cfg);
/*
 * Pool u of nr_pools shaped from cfg alone (mode, resolving, ways of
 * waiting, readers), as the run's will be; nothing allocated or opened.
 */
void ukvm_paging_pool_shape(const struct ukvm_config *cfg, uint32_t nr_pools,
			    struct ukvm_pool *pool, uint32_t u);
/* Whether a run of cfg has the prefetch pusher (prefetch background or replay). */
bool ukvm_paging_has_pusher(const struct ukvm_config *cfg);
/*
 * The uffds, each registered over its range with its pool started (a
 * probe: registered, no pool started), then preinstall and the pusher. 0,
 * or -errno with err set; the teardown releases what was made.
 */
int ukvm_paging_setup(struct ukvm_experiment *exp, struct ukvm_error *err);

#endif
