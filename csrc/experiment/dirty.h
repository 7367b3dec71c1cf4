/* SPDX-License-Identifier: MIT */
/*
 * Dirty tracking as an experiment (dirty.c): pass 1 populates; at its end
 * tracking is turned on, and at the end of every later pass, the vCPUs
 * waiting, the host harvests what the tracker found, re-protects, and
 * compares it with the pages the guest wrote by its own count.
 */
#ifndef UKVM_EXPERIMENT_DIRTY_H
#define UKVM_EXPERIMENT_DIRTY_H

#include <stdbool.h>
#include <stdint.h>

#include "ukvm.h"

struct ukvm_dirty;
struct ukvm_experiment;

void ukvm_dirty_init(struct ukvm_dirty *d);
/*
 * After the region's memslot and before the vCPUs: the capabilities the
 * tracker needs (MANUAL_DIRTY_LOG_PROTECT2, the dirty ring), its bitmaps,
 * and for wp_async its uffd, registered. 0, or -errno with err set
 * (UKVM_ERR_HOST where this kernel lacks the mechanism).
 */
int ukvm_dirty_setup(struct ukvm_experiment *exp, struct ukvm_error *err);
/* After the vCPUs are made: each one gated at pass ends, and its ring mapped. */
int ukvm_dirty_setup_vcpus(struct ukvm_experiment *exp, struct ukvm_error *err);
/*
 * Every vCPU has ended pass `pass` (1-based) and waits: turn tracking on
 * (pass 1), or harvest, re-protect and check pass `pass`, and after the
 * last, turn tracking off. The controller then lets the vCPUs on
 * (ukvm_dirty_opened). 0, or -errno with err set: a failed call, or a
 * tracker that missed a page the guest wrote (-EPROTO).
 */
int ukvm_dirty_pass_ended(struct ukvm_experiment *exp, uint64_t pass, struct ukvm_error *err);
/* Tracking on and off, timed (the result's dirty_enable_ns, dirty_disable_ns). */
int ukvm_dirty_enable(struct ukvm_experiment *exp, struct ukvm_error *err);
int ukvm_dirty_disable(struct ukvm_experiment *exp, struct ukvm_error *err);
/*
 * A migration's round `round` (the iteration the DIRTY_* injections count;
 * 0: before round 1), the vCPUs running: harvest and re-protect, and OR
 * the pages found since the last take into `into` (a bit a 4 KiB page),
 * *pages of them not there before; adds the ring-full exits since the last
 * take to *ring_full_exits. A page written after its re-protect is the next
 * take's. 0, or -errno with err set.
 */
int ukvm_dirty_take(struct ukvm_experiment *exp, uint32_t round, uint64_t *into,
		    uint64_t *pages, uint64_t *ring_full_exits, struct ukvm_error *err);
/* The gate into the next pass has opened, at now_ns. */
void ukvm_dirty_opened(struct ukvm_dirty *d, uint64_t now_ns);
/* The records into the result (they move: d keeps none). */
void ukvm_dirty_collect(struct ukvm_dirty *d, struct ukvm_result *res);
void ukvm_dirty_destroy(struct ukvm_dirty *d);

#endif
