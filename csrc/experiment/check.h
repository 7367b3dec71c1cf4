/* SPDX-License-Identifier: MIT */
/* After the run: the checks of memory, of the guests' reports and of the faults (check.c). */
#ifndef UKVM_EXPERIMENT_CHECK_H
#define UKVM_EXPERIMENT_CHECK_H

#include <stdbool.h>
#include <stdint.h>

#include "experiment/state.h"
#include "uffd/faultlog.h"
#include "uffd/verify.h"
#include "ukvm.h"

/* What verifying the run carries from one step to the next. */
struct ukvm_check {
	struct ukvm_verify_params vp;
	uint64_t read_sum;		/* what the checked pages sum to, as the guest reads them */
	uint64_t checksums;		/* the guests' own sums, added up (overlap with lists) */
	uint64_t dirty_bad;		/* wp_async: pages the dirty map got wrong */
	uint64_t wp_written;		/* WP: pages the snapshot shows written */
	uint64_t installed_touched;	/* touched pages prefetch or preinstall put in first */
	bool source_modified;		/* the source file was written to during the run */
};

/* Empty, with the verify parameters every check shares, from exp's config. */
void ukvm_check_init(struct ukvm_check *chk, const struct ukvm_experiment *exp);
/*
 * wp_async: the pages the kernel found written (PAGEMAP_SCAN) against the
 * guest's writes; while the uffds are open. 0, or -errno with err.
 */
int ukvm_check_dirty_map(struct ukvm_experiment *exp, struct ukvm_check *chk,
			 struct ukvm_error *err);
/*
 * vCPU i's pages (its slice; overlapped, the region with vCPU 0) and what
 * its guest reported: once the uffds are closed and vCPU i's result
 * filled. 0, or -ECANCELED with err.
 */
int ukvm_check_vcpu(struct ukvm_experiment *exp, uint32_t i, struct ukvm_check *chk,
		    struct ukvm_error *err);
/* After every vCPU's: overlapped checksums summed, the bad pages, WP's snapshot. */
void ukvm_check_totals(struct ukvm_experiment *exp, struct ukvm_check *chk);
/* The source file written to during the run, said before the bad page's message. */
void ukvm_check_source_changed(struct ukvm_result *res);
/* Last, of a verified run: every page came through userfaultfd as the config says. */
void ukvm_check_faults(struct ukvm_experiment *exp, const struct ukvm_faultlog *log,
		       uint64_t wp_written, uint64_t installed_touched);

#endif
