/* SPDX-License-Identifier: MIT */
/*
 * After the run, for collect.c: is the memory what the run should have
 * left, and did the guests and the faults add up? Each check that fails
 * clears res->verified and says why in res->verify_message (the last one
 * to fail speaks); collect.c calls them in the order they need (the dirty
 * map while the uffds are open, the pages once they are closed) between
 * the steps that fill the result.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "experiment/check.h"
#include "experiment/state.h"
#include "kvm/guest_abi.h"
#include "uffd/faultlog.h"
#include "uffd/pagemap.h"
#include "uffd/verify.h"
#include "ukvm.h"

void ukvm_check_init(struct ukvm_check *chk, const struct ukvm_experiment *exp)
{
	const struct ukvm_config *cfg = &exp->cfg;

	*chk = (struct ukvm_check){
		.vp = {
			.filled = exp->filled,
			.walkers = cfg->overlap ? cfg->vcpus : 1,
			.write_pct = cfg->write_percent,
			.write_key = exp->write_key,
			.write_rotate = cfg->write_set == UKVM_WRITE_SET_PER_PASS ?
					GUEST_WRITE_ROTATE : 0,
			.passes = exp->passes,
			.unit_size = exp->mem.page_size,
			/* Before the run: filled (prefault, MINOR's page cache, WP), else empty. */
			.untouched_filled = cfg->prefault || cfg->uffd_mode == UKVM_UFFD_MINOR ||
					    cfg->uffd_mode == UKVM_UFFD_WP,
		},
	};
}

/*
 * Did the experiment happen as configured? Every page of the region must
 * have come through userfaultfd exactly once in a uffd mode (EEXIST aside:
 * a second message for a page already resolved), and none may have without
 * userfaultfd or with prefault. Contents are verify.c's job; this is the
 * accounting, so that a run whose pages arrived some other way (a kernel
 * that maps them without asking) is not reported as verified.
 */
void ukvm_check_faults(struct ukvm_experiment *exp, const struct ukvm_faultlog *log,
		       uint64_t wp_written, uint64_t installed_touched)
{
	const struct ukvm_config *cfg = &exp->cfg;
	struct ukvm_result *res = &exp->result;
	uint64_t resolved = res->faults, messages = res->faults + res->eexist, expected = 0;
	const char *how = "";
	if (cfg->wp_async) {
		how = " (wp_async: the kernel un-protects written pages itself)";
	} else if (cfg->uffd_mode == UKVM_UFFD_WP) {
		/* Only writes fault, once per page, whatever prefault did. */
		expected = wp_written;
		how = wp_written ? "" : " (the guest wrote no page: write_percent)";
	} else if (cfg->uffd_mode != UKVM_UFFD_NONE && !cfg->prefault) {
		/*
		 * The pages the guest touches, each once (touch_percent, access:
		 * the rest must never fault), less those prefetch or preinstall
		 * put in before the guest touched them.
		 */
		expected = (exp->visits ? exp->touched_units : exp->region_size /
			    exp->mem.page_size) - installed_touched;
		how = exp->visits ? " (touch_percent, access: one per page the guest touches, "
				    "less those prefetch or preinstall put in first)" :
		      installed_touched ? " (less the pages prefetch or preinstall put in first)" :
		      "";
	} else if (cfg->uffd_mode != UKVM_UFFD_NONE)
		how = " (prefault populated every page before the vCPUs started)";
	else
		how = " (uffd_mode None: no userfaultfd)";

	/* No fault at all without userfaultfd or with prefault (prefetch: EEXIST ones, woken). */
	if (resolved != expected || (!expected && messages && !installed_touched)) {
		snprintf(res->verify_message, sizeof(res->verify_message),
			 "userfaultfd resolved %llu faults (%llu messages), expected %llu%s%s",
			 (unsigned long long)resolved, (unsigned long long)messages,
			 (unsigned long long)expected,
			 !expected ? "" : cfg->uffd_mode == UKVM_UFFD_WP ?
			 ": one per page the guest wrote" : exp->visits ? "" :
			 ": one per page of the region", how);
		res->verified = false;
		return;
	}
	/*
	 * WP: pages only read never fault; the snapshot's check stands for this
	 * one. Prefetch and preinstall: their pages are the ones no fault resolved
	 * (resident.h: each page goes in once).
	 */
	if (expected && res->stats_full && log->pages_not_once != installed_touched &&
	    cfg->uffd_mode != UKVM_UFFD_WP) {
		snprintf(res->verify_message, sizeof(res->verify_message),
			 "%llu pages were not resolved exactly once: the page at gpa 0x%llx "
			 "was %s", (unsigned long long)log->pages_not_once,
			 (unsigned long long)log->first_bad_gpa,
			 log->first_bad_untouched ? "resolved though the guest never touches it" :
			 log->first_bad_resolved_again ? "resolved more than once" : "never resolved");
		res->verified = false;
	}
}

/*
 * Verification found pages other than the source file's, and the file was
 * written to during the run: the pages fetched before the write hold what
 * it held then. Said first, before the page that shows it.
 */
void ukvm_check_source_changed(struct ukvm_result *res)
{
	char page[sizeof(res->verify_message)];
	static const char why[] = "the source changed during the run (source_path was written "
				  "to after it was opened), so pages fetched before differ from it: ";

	memcpy(page, res->verify_message, sizeof(page));
	/* The page's own message after it, as much of it as fits. */
	snprintf(res->verify_message, sizeof(res->verify_message), "%s%.*s", why,
		 (int)(sizeof(res->verify_message) - sizeof(why)), page);
}

/*
 * wp_async: the pages the kernel found written (PAGEMAP_SCAN) against the
 * guest's writes, while the uffds are open (closing one clears every
 * uffd-wp bit). 0, or -errno with err.
 */
int ukvm_check_dirty_map(struct ukvm_experiment *exp, struct ukvm_check *chk,
			 struct ukvm_error *err)
{
	struct ukvm_result *res = &exp->result;
	uint8_t *dirty_map;
	int ret;

	chk->vp.visits = exp->visits;
	dirty_map = malloc(exp->region_size / UKVM_PAGE_SIZE);
	if (!dirty_map) {
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating the dirty page map");
		return -ENOMEM;
	}
	ret = ukvm_pagemap_written((uint64_t)(uintptr_t)exp->mem.hva, exp->region_size,
				   dirty_map, err);
	chk->vp.gpa = exp->region_gpa;
	chk->vp.size = exp->region_size;
	if (!ret)
		chk->dirty_bad = ukvm_verify_dirty(&chk->vp, dirty_map, &res->dirty_pages,
						   res->verify_message,
						   sizeof(res->verify_message));
	free(dirty_map);
	return ret;
}

/*
 * vCPU i's pages verified (partitioned: its slice; overlapped: the region,
 * with vCPU 0), then what its guest reported held against them: the pages
 * it touched and the checksum of what it read. A failed check clears
 * res->verified and says why. 0, or -ECANCELED with err.
 */
int ukvm_check_vcpu(struct ukvm_experiment *exp, uint32_t i, struct ukvm_check *chk,
		    struct ukvm_error *err)
{
	const struct ukvm_config *cfg = &exp->cfg;
	struct ukvm_result *res = &exp->result;
	struct ukvm_verify_params *vp = &chk->vp;
	const struct ukvm_vcpu_result *vr = &res->vcpus[i];
	uint64_t *a = exp_guest_args(exp, &exp->vcpus[i]);

	/* Partitioned: verify this vCPU's slice. Overlapped: the region, once. */
	if (res->contents_verified && (!cfg->overlap || i == 0)) {
		vp->hva = exp->mem.hva + (cfg->overlap ? 0 : i * exp->slice_size);
		vp->gpa = exp->region_gpa + (cfg->overlap ? 0 : i * exp->slice_size);
		/* Read after every installer has stopped: plain bytes now. */
		vp->installed = exp->resident.faulted ? &exp->resident : NULL;
		vp->installed_first = (vp->gpa - exp->region_gpa) / exp->mem.page_size;
		vp->size = exp->slice_size;
		/* source file: the file maps onto the region byte for byte. */
		vp->expect = exp->source.map ? exp->source.map + (vp->gpa - exp->region_gpa)
					     : NULL;
		vp->visits = exp->visits ? exp->visits + (vp->gpa - exp->region_gpa) /
						      UKVM_PAGE_SIZE : NULL;
		res->bad_pages += ukvm_verify_region(vp, &exp->ctl, &chk->read_sum,
						     res->verify_message,
						     sizeof(res->verify_message));
		if (exp_aborted(exp)) {
			ukvm_err_set(err, UKVM_ERR_CANCELLED, 0, "cancelled during verification");
			return -ECANCELED;
		}
	}
	/* The host's count: its list's length (GA_PAGES) with touch_percent or zipf. */
	if (vr->pages != guest_arg(a, GA_PAGES) * exp->passes && res->verified) {
		snprintf(res->verify_message, sizeof(res->verify_message),
			 "vCPU %u touched %llu pages, expected %llu", i,
			 (unsigned long long)vr->pages,
			 (unsigned long long)(guest_arg(a, GA_PAGES) * exp->passes));
		res->verified = false;
	}
	/* Overlapped lists: each vCPU reads its own draws; their sum is checked after. */
	chk->checksums += guest_arg(a, GA_CHECKSUM);
	if ((cfg->overlap && exp->visits) || !res->contents_verified)
		return 0;
	/* A bad page the guest read explains a bad checksum, and names the page. */
	if (guest_arg(a, GA_CHECKSUM) != chk->read_sum && res->verified &&
	    !res->bad_pages) {
		snprintf(res->verify_message, sizeof(res->verify_message),
			 "vCPU %u read data other than what was resolved: checksum "
			 "0x%llx, expected 0x%llx", i,
			 (unsigned long long)guest_arg(a, GA_CHECKSUM),
			 (unsigned long long)(chk->read_sum));
		res->verified = false;
	}
	return 0;
}

/*
 * The checks over all the vCPUs: overlapped lists' checksums summed, the
 * bad pages (wp_async's dirty map's included), and WP's snapshot.
 */
void ukvm_check_totals(struct ukvm_experiment *exp, struct ukvm_check *chk)
{
	const struct ukvm_config *cfg = &exp->cfg;
	struct ukvm_result *res = &exp->result;

	if (cfg->overlap && exp->visits && chk->checksums != chk->read_sum && res->verified &&
	    !res->bad_pages && res->contents_verified) {
		snprintf(res->verify_message, sizeof(res->verify_message),
			 "the vCPUs read data other than what was resolved: their checksums sum "
			 "to 0x%llx, expected 0x%llx", (unsigned long long)chk->checksums,
			 (unsigned long long)(chk->read_sum));
		res->verified = false;
	}
	if (res->bad_pages)
		res->verified = false;
	/*
	 * wp_async: pages the dirty map got wrong (written and not found, or
	 * found and not written) count as bad pages too; the message is the
	 * last check's that failed.
	 */
	res->bad_pages += chk->dirty_bad;
	if (res->bad_pages)
		res->verified = false;
	if (res->verified && cfg->uffd_mode == UKVM_UFFD_WP && !cfg->wp_async) {
		chk->vp.hva = exp->snapshot;
		chk->vp.gpa = exp->region_gpa;
		chk->vp.size = exp->region_size;
		chk->vp.visits = exp->visits;
		res->bad_pages += ukvm_verify_snapshot(&chk->vp, &exp->ctl, &chk->wp_written,
						       res->verify_message,
						       sizeof(res->verify_message));
		if (res->bad_pages)
			res->verified = false;
	}
}
