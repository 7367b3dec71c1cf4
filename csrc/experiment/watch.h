/* SPDX-License-Identifier: MIT */
/*
 * Watching a run's progress (watch.c): the pages each vCPU's guest has
 * touched, and ukvm_experiment_finish()'s watch over a run without a time
 * limit, which fails it once it makes no progress.
 */
#ifndef UKVM_EXPERIMENT_WATCH_H
#define UKVM_EXPERIMENT_WATCH_H

#include <stdint.h>

#include "experiment/state.h"

/* The phase of the walk, the only one the watch looks at: compared by address. */
extern const char ukvm_watch_phase_running[];

/* What finish knows of a run without a time limit: its last progress, and when it was made. */
struct ukvm_watch {
	const char *phase;
	uint64_t mark;
	uint64_t since_ns;
};

/*
 * Under ctl->lock, while exp->walkable: the pages vCPU i's guest has touched
 * (all passes), and in *total the pages it will touch in all.
 */
uint64_t ukvm_watch_pages_done(struct ukvm_experiment *exp, uint32_t i, uint64_t *total);
/*
 * Under ctl->lock, for a run without a time limit that goes on: waits a
 * poll at most (or until woken) and fails the run once it has walked
 * without progress for too long (watch.c says how long).
 */
void ukvm_watch_locked(struct ukvm_experiment *exp, struct ukvm_watch *w);

#endif
