/* SPDX-License-Identifier: MIT */
/*
 * Dirty tracking as an experiment (dirty.h), beside the kernel's
 * dirty_log_perf_test: the vCPUs stop at every pass's end (vcpu.c's gate,
 * opened by execute.c), and here, with no guest running, the tracker's
 * pages are harvested and re-protected, and checked against the pages the
 * guest wrote in that pass. The guest's record is its own: word 2 of every
 * page it writes counts its writes (guest.S), so a page whose count moved
 * since the last pass end was written in this pass. A written page the
 * tracker did not report fails the run (a migration would have lost it); a
 * page it reported that was not written is counted as excess, which only
 * INITIALLY_SET's first harvest (every page) and huge pages under wp_async
 * (PAGEMAP_SCAN reports the whole page) should give.
 *
 *   bitmap         KVM_GET_DIRTY_LOG, which re-protects what it returns
 *   bitmap_manual  KVM_GET_DIRTY_LOG, then KVM_CLEAR_DIRTY_LOG of what it
 *                  returned, in chunks of dirty_clear_pages (0: at once)
 *   ring           every vCPU's ring harvested, then KVM_RESET_DIRTY_RINGS;
 *                  a ring that fills mid-pass is harvested by its vCPU
 *                  (vcpu.c) into the same pass's pages
 *   wp_async       PAGEMAP_SCAN with PM_SCAN_WP_MATCHING: written pages
 *                  reported and write-protected in one walk
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/util.h"
#include "experiment/dirty.h"
#include "experiment/state.h"
#include "kvm/dirtylog.h"
#include "kvm/vcpu.h"
#include "uapi_compat.h"
#include "uffd/pagemap.h"
#include "uffd/uffd.h"

void ukvm_dirty_init(struct ukvm_dirty *d)
{
	memset(d, 0, sizeof(*d));
	d->uffd = -1;
	d->pagemap_fd = -1;
}

static const char *dirty_name(enum ukvm_dirty_tracking kind)
{
	return ukvm_dirty_tracking_name(kind);
}

/* wp_async: a uffd of WP_ASYNC over the region; nobody reads it (no faults come). */
static int dirty_setup_wp_async(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	struct ukvm_dirty *d = &exp->dirty;
	uint64_t features = UFFD_FEATURE_WP_ASYNC;
	int ret;

	if (!ukvm_backing_is_private_anonymous(exp->cfg.backing))
		features |= UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
	ret = ukvm_uffd_open(false, features, err);
	if (ret < 0) {
		/* uffd.c's error names the ioctl; this one says what is missing (set_hint
		 * keeps a first error, so it starts from none, the ioctl's kept in it). */
		char was[sizeof(err->message)];

		memcpy(was, err->message, sizeof(was));
		*err = (struct ukvm_error){ 0 };
		return ukvm_err_set_hint(err, UKVM_ERR_HOST, -ret, "dirty_tracking='wp_async'",
					 "this kernel's userfaultfd has no asynchronous "
					 "write-protect (UFFD_FEATURE_WP_ASYNC: Linux 6.7+%s; %s); use "
					 "dirty_tracking='bitmap' or 'ring'",
					 features & UFFD_FEATURE_WP_HUGETLBFS_SHMEM ?
					 ", and UFFD_FEATURE_WP_HUGETLBFS_SHMEM for this backing" : "",
					 was);
	}
	d->uffd = ret;
	ret = ukvm_uffd_register(d->uffd, exp->mem.hva, exp->region_size, UKVM_UFFD_WP,
				 exp->cfg.backing, err);
	if (ret)
		return ret;
	ret = ukvm_pagemap_open(err);
	if (ret < 0)
		return ret;
	d->pagemap_fd = ret;
	return 0;
}

int ukvm_dirty_setup(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	struct ukvm_dirty *d = &exp->dirty;
	uint64_t words;

	d->kind = exp->cfg.dirty_tracking;
	if (d->kind == UKVM_DIRTY_NONE)
		return 0;
	d->pages = exp->region_size / UKVM_PAGE_SIZE;
	d->slot = (struct ukvm_dirty_slot){
		.vm_fd = exp->vm.vm_fd,
		.slot = exp->region_slot,
		.gpa = exp->region_gpa,
		.size = exp->region_size,
		.hva = exp->mem.hva,
	};
	/* run.py's memory estimate counts the schema's DIRTY_COUNT_BYTES a page. */
	_Static_assert(sizeof(*d->counts) == UKVM_DIRTY_COUNT_BYTES, "the schema's count size");
	words = (d->pages + 63) / 64;
	d->found = calloc(words, sizeof(*d->found));
	/* A migration's rounds are migrate.c's: no pass records, no compare at gates. */
	if (exp->cfg.migration == UKVM_MIGRATION_NONE) {
		d->written = calloc(words, sizeof(*d->written));
		d->counts = calloc(d->pages, sizeof(*d->counts));
		d->passes = calloc(exp->passes - 1, sizeof(*d->passes));
	}
	if (!d->found || (exp->cfg.migration == UKVM_MIGRATION_NONE &&
			  (!d->written || !d->counts || !d->passes)))
		return ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating dirty tracking's "
				    "page maps (%llu pages)", (unsigned long long)d->pages);
	switch (d->kind) {
	case UKVM_DIRTY_BITMAP_MANUAL:
		return ukvm_dirtylog_manual_enable(exp->vm.vm_fd, err);
	case UKVM_DIRTY_RING:
		return ukvm_dirtylog_ring_enable(exp->vm.vm_fd, exp->cfg.dirty_ring_entries,
						 &d->acq_rel, err);
	case UKVM_DIRTY_WP_ASYNC:
		return dirty_setup_wp_async(exp, err);
	default:
		return 0;
	}
}

int ukvm_dirty_setup_vcpus(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	struct ukvm_dirty *d = &exp->dirty;
	uint32_t i;
	int ret;

	if (d->kind == UKVM_DIRTY_NONE)
		return 0;
	exp->ctl.passes_open = 1;	/* pass 1, then the vCPUs wait for the host */
	for (i = 0; i < exp->cfg.vcpus; i++) {
		struct ukvm_vcpu *vcpu = &exp->vcpus[i];

		vcpu->gated = true;
		if (d->kind != UKVM_DIRTY_RING)
			continue;
		ret = ukvm_dirty_ring_map(&vcpu->ring, vcpu->fd, exp->cfg.dirty_ring_entries, err);
		if (ret)
			return ret;
		vcpu->ring_found = (_Atomic uint64_t *)d->found;
		vcpu->ring_slot = d->slot.slot;
		vcpu->ring_pages = d->pages;
	}
	return 0;
}

/* Tracking on (at pass 1's end), timed as dirty_log_perf_test times it. */
int ukvm_dirty_enable(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	struct ukvm_dirty *d = &exp->dirty;
	uint64_t t0 = ukvm_now_ns();
	int ret;

	if (d->kind == UKVM_DIRTY_WP_ASYNC)
		ret = ukvm_uffd_writeprotect(d->uffd, (uint64_t)(uintptr_t)exp->mem.hva,
					     exp->region_size, true);
	else
		ret = ukvm_dirtylog_set_logging(&d->slot, true, err);
	if (ret && d->kind == UKVM_DIRTY_WP_ASYNC)
		return ukvm_err_set(err, UKVM_ERR_RUN, -ret, "UFFDIO_WRITEPROTECT(the region, "
				    "MODE_WP): dirty_tracking='wp_async' turning on");
	if (ret)
		return ret;
	d->enable_ns = ukvm_now_ns() - t0;
	d->logging = true;
	return 0;
}

int ukvm_dirty_disable(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	struct ukvm_dirty *d = &exp->dirty;
	uint64_t t0 = ukvm_now_ns();
	int ret;

	if (d->kind == UKVM_DIRTY_WP_ASYNC)
		ret = ukvm_uffd_writeprotect(d->uffd, (uint64_t)(uintptr_t)exp->mem.hva,
					     exp->region_size, false);
	else
		ret = ukvm_dirtylog_set_logging(&d->slot, false, err);
	if (ret && d->kind == UKVM_DIRTY_WP_ASYNC)
		return ukvm_err_set(err, UKVM_ERR_RUN, -ret, "UFFDIO_WRITEPROTECT(the region, "
				    "0): dirty_tracking='wp_async' turning off");
	if (ret)
		return ret;
	d->disable_ns = ukvm_now_ns() - t0;
	d->logging = false;
	return 0;
}

#ifdef UKVM_TEST_HOOKS
/* UKVM_INJECT_DIRTY_*: this iteration is the one to break. */
static bool dirty_inject(struct ukvm_experiment *exp, enum ukvm_inject kind, uint32_t iteration)
{
	return exp->cfg.inject == kind && iteration == exp->cfg.inject_after;
}
#endif

/* The tracker's pages of this pass into d->found. */
static int dirty_harvest(struct ukvm_experiment *exp, struct ukvm_dirty_pass *rec,
			 struct ukvm_error *err)
{
	struct ukvm_dirty *d = &exp->dirty;
	uint64_t stray = 0, full = 0;
	bool protect = true;
	uint32_t i;
	int ret = 0;

#ifdef UKVM_TEST_HOOKS
	protect = !dirty_inject(exp, UKVM_INJECT_DIRTY_SKIP_REPROTECT, rec->iteration);
#endif
	switch (d->kind) {
	case UKVM_DIRTY_BITMAP:
	case UKVM_DIRTY_BITMAP_MANUAL:
		ret = ukvm_dirtylog_get(&d->slot, d->found, err);
		break;
	case UKVM_DIRTY_RING:
		for (i = 0; i < exp->cfg.vcpus; i++) {
			struct ukvm_vcpu *vcpu = &exp->vcpus[i];

			ukvm_vcpu_ring_harvest(vcpu, &stray);
			full += atomic_exchange(&vcpu->ring_full_exits, 0);
		}
		rec->ring_full_exits = full;
		if (stray)
			ret = ukvm_err_set(err, UKVM_ERR_RUN, EPROTO, "dirty_tracking='ring': %llu "
					   "ring entries named pages outside the test region's "
					   "memslot %u in iteration %u",
					   (unsigned long long)stray, d->slot.slot, rec->iteration);
		break;
	case UKVM_DIRTY_WP_ASYNC:
		ret = ukvm_pagemap_harvest(d->pagemap_fd, (uint64_t)(uintptr_t)exp->mem.hva,
					   exp->region_size, d->found, protect, err);
		break;
	default:
		break;
	}
#ifdef UKVM_TEST_HOOKS
	if (!ret && dirty_inject(exp, UKVM_INJECT_DIRTY_DROP_PAGE, rec->iteration))
		for (uint64_t w = 0; w < (d->pages + 63) / 64; w++)
			if (d->found[w]) {
				d->found[w] &= d->found[w] - 1;	/* the lowest page found, lost */
				break;
			}
#endif
	return ret;
}

/* Write-protect again what the harvest found: the manual clear, the rings' reset. */
static int dirty_reprotect(struct ukvm_experiment *exp, struct ukvm_dirty_pass *rec,
			   struct ukvm_error *err)
{
	struct ukvm_dirty *d = &exp->dirty;
	uint64_t chunk = exp->cfg.dirty_clear_pages ?: d->pages, first, num;
	int ret;

#ifdef UKVM_TEST_HOOKS
	if (dirty_inject(exp, UKVM_INJECT_DIRTY_SKIP_REPROTECT, rec->iteration))
		return 0;
#endif
	if (d->kind == UKVM_DIRTY_RING) {
		rec->reprotect_calls = 1;
		ret = ukvm_dirtylog_ring_reset(exp->vm.vm_fd, err);
		return ret < 0 ? ret : 0;
	}
	if (d->kind != UKVM_DIRTY_BITMAP_MANUAL)
		return 0;	/* re-protected by the harvest */
	for (first = 0; first < d->pages; first += chunk) {
		num = d->pages - first < chunk ? d->pages - first : chunk;
		ret = ukvm_dirtylog_clear(&d->slot, first, num, d->found, err);
		if (ret)
			return ret;
		rec->reprotect_calls++;
	}
	return 0;
}

/*
 * The guest's own record of this pass: the pages whose write count moved
 * since the last pass end, into d->written; then counts the pass. Only
 * pages the guest touches are read (the rest may not be populated, and a
 * read would fault on the region's userfaultfd).
 */
static int dirty_compare(struct ukvm_experiment *exp, struct ukvm_dirty_pass *rec,
			 bool baseline, struct ukvm_error *err)
{
	struct ukvm_dirty *d = &exp->dirty;
	uint64_t page, words = (d->pages + 63) / 64, w, missed = 0, first_missed = 0;

	memset(d->written, 0, words * sizeof(*d->written));
	for (page = 0; page < d->pages; page++) {
		const volatile uint64_t *words2;
		uint32_t count;

		if (exp->visits && !exp->visits[page])
			continue;
		words2 = (const volatile uint64_t *)(exp->mem.hva + page * UKVM_PAGE_SIZE);
		count = (uint32_t)words2[2];
		if (count != d->counts[page])
			d->written[page / 64] |= 1ULL << (page % 64);
		d->counts[page] = count;
	}
	if (baseline)
		return 0;
	for (w = 0; w < words; w++) {
		uint64_t lost = d->written[w] & ~d->found[w];

		rec->found_pages += (uint64_t)__builtin_popcountll(d->found[w]);
		rec->written_pages += (uint64_t)__builtin_popcountll(d->written[w]);
		rec->excess_pages += (uint64_t)__builtin_popcountll(d->found[w] & ~d->written[w]);
		if (lost && !missed)
			first_missed = w * 64 + (uint64_t)__builtin_ctzll(lost);
		missed += (uint64_t)__builtin_popcountll(lost);
	}
	if (missed)
		return ukvm_err_set(err, UKVM_ERR_RUN, EPROTO, "dirty_tracking='%s' missed %llu of "
				    "the %llu pages the guest wrote in iteration %u (the first at "
				    "gpa 0x%llx): the tracker lost writes%s", dirty_name(d->kind),
				    (unsigned long long)missed,
				    (unsigned long long)rec->written_pages, rec->iteration,
				    (unsigned long long)(exp->region_gpa + first_missed *
							 UKVM_PAGE_SIZE),
				    d->kind == UKVM_DIRTY_RING ? " (a ring KVM overran, warning "
				    "kvm_dirty_ring_push in the kernel log, loses entries: use a larger "
				    "dirty_ring_entries)" : "");
	return 0;
}

int ukvm_dirty_pass_ended(struct ukvm_experiment *exp, uint64_t pass, struct ukvm_error *err)
{
	struct ukvm_dirty *d = &exp->dirty;
	struct ukvm_dirty_pass *rec;
	uint64_t t0, t1, t2, last_end = 0;
	uint32_t i;
	int ret;

	if (pass == 1)
		return dirty_compare(exp, NULL, true, err) ?: ukvm_dirty_enable(exp, err);
	rec = &d->passes[d->nr_passes];
	rec->iteration = (uint32_t)(pass - 1);
	rec->start_ns = d->pass_start_ns;
	for (i = 0; i < exp->cfg.vcpus; i++)
		if (exp->vcpus[i].pass_end_ns[pass - 1] > last_end)
			last_end = exp->vcpus[i].pass_end_ns[pass - 1];
	rec->dirty_ns = last_end - rec->start_ns;
	t0 = ukvm_now_ns();
	ret = dirty_harvest(exp, rec, err);
	t1 = ukvm_now_ns();
	ret = ret ?: dirty_reprotect(exp, rec, err);
	t2 = ukvm_now_ns();
	if (ret)
		return ret;
	rec->harvest_ns = t1 - t0;
	rec->reprotect_ns = d->kind == UKVM_DIRTY_BITMAP_MANUAL || d->kind == UKVM_DIRTY_RING ?
			    t2 - t1 : 0;
	d->nr_passes++;
	ret = dirty_compare(exp, rec, false, err);
	/* The next pass's pages start from none (a ring that fills adds to them). */
	memset(d->found, 0, (d->pages + 63) / 64 * sizeof(*d->found));
	if (!ret && pass == exp->passes)
		ret = ukvm_dirty_disable(exp, err);
	return ret;
}

int ukvm_dirty_take(struct ukvm_experiment *exp, uint32_t round, uint64_t *into,
		    uint64_t *pages, uint64_t *ring_full_exits, struct ukvm_error *err)
{
	struct ukvm_dirty *d = &exp->dirty;
	struct ukvm_dirty_pass rec = { .iteration = round };
	uint64_t w, n = 0;
	int ret;

	ret = dirty_harvest(exp, &rec, err) ?: dirty_reprotect(exp, &rec, err);
	*ring_full_exits += rec.ring_full_exits;
	if (ret)
		return ret;
	/* A vCPU whose ring fills adds to found as it goes: each word taken whole. */
	for (w = 0; w < (d->pages + 63) / 64; w++) {
		uint64_t bits = atomic_exchange((_Atomic uint64_t *)&d->found[w], 0);

		n += (uint64_t)__builtin_popcountll(bits & ~into[w]);
		into[w] |= bits;
	}
	*pages = n;
	return 0;
}

void ukvm_dirty_opened(struct ukvm_dirty *d, uint64_t now_ns)
{
	d->pass_start_ns = now_ns;
}

void ukvm_dirty_collect(struct ukvm_dirty *d, struct ukvm_result *res)
{
	if (d->kind == UKVM_DIRTY_NONE)
		return;
	res->dirty_passes = d->passes;
	res->nr_dirty_passes = d->nr_passes;
	res->dirty_enable_ns = d->enable_ns;
	res->dirty_disable_ns = d->disable_ns;
	d->passes = NULL;
	d->nr_passes = 0;
}

void ukvm_dirty_destroy(struct ukvm_dirty *d)
{
	if (d->pagemap_fd >= 0)
		close(d->pagemap_fd);
	if (d->uffd >= 0)
		close(d->uffd);	/* its pages' uffd-wp bits go with it */
	free(d->found);
	free(d->written);
	free(d->counts);
	free(d->passes);
	ukvm_dirty_init(d);
}
