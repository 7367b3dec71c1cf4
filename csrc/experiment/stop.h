/* SPDX-License-Identifier: MIT */
/* Stopping an experiment's vCPU and reader threads, bounded (stop.c). */
#ifndef UKVM_EXPERIMENT_STOP_H
#define UKVM_EXPERIMENT_STOP_H

#include <stdbool.h>
#include <stdint.h>

#include "base/util.h"
#include "experiment/state.h"

/*
 * How long stopping waits for one kind of thread (vCPUs, then readers). A
 * thread still running then is named in the run's error and left running;
 * the controller keeps the experiment (memory, fds, mappings it may touch)
 * until it leaves: see experiment_linger() in experiment.c.
 */
#define STOP_WAIT_NS		(2 * NSEC_PER_SEC)

/*
 * Stops every vCPU, STOP_WAIT_NS at most, and names any that would not stop
 * in the run's error. Returns how many vCPU threads still run.
 */
uint32_t ukvm_stop_vcpus(struct ukvm_experiment *exp);
/* Joins the vCPU threads that left, kicking the rest every poll_ns until deadline_ns. */
uint32_t ukvm_stop_wait_vcpus(struct ukvm_experiment *exp, uint64_t deadline_ns,
			      uint64_t poll_ns);
/*
 * Stops every reader and the prefetch pusher (which installs into the
 * readers' uffds), STOP_WAIT_NS at most, and names any that would not
 * stop; with close_uffds and none left, releases the pools and their
 * uffds. Returns how many readers (and pusher) still run.
 */
uint32_t ukvm_stop_pools(struct ukvm_experiment *exp, bool close_uffds);
/* Joins the readers (and pusher) that left, kicking the rest until deadline_ns: how many run. */
uint32_t ukvm_stop_wait_pools(struct ukvm_experiment *exp, uint64_t deadline_ns);
/*
 * One look at the threads of exp that would not stop: the vCPUs, kicked,
 * poll_ns at most, then the readers and the pusher, poll_ns at most, after
 * a retry of every uffd still held. How many still run (0: all joined).
 */
uint32_t ukvm_stop_wait_threads(struct ukvm_experiment *exp, uint64_t poll_ns);
/* A vCPU is stuck on a fault: stop the readers (briefly) and let go of every uffd. */
void ukvm_stop_release_uffds(struct ukvm_experiment *exp);

#endif
