/* SPDX-License-Identifier: MIT */
/*
 * After every run: does every page hold what it must?
 *
 * A page the guest wrote holds (gpa ^ GUEST_WRITE_MAGIC) in word 0 and the
 * number of writes to it in word 2; a page it only read holds what the
 * resolver supplied. Everything else is the resolver's data (fill.c) or
 * zeros, depending on how the page was resolved. The guest's write/read
 * choice is a hash of the page frame that this file computes as guest.S does.
 * With touch_percent or access zipf, the host's visit counts say which pages
 * the guest touches and how often; an untouched page holds what it held
 * before the run: the prefill, or nothing.
 */
#include <stdio.h>
#include <string.h>

#include "base/ctl.h"
#include "base/mapguard.h"
#include "base/util.h"
#include "kvm/guest_abi.h"
#include "uffd/fill.h"
#include "uffd/resident.h"
#include "uffd/verify.h"

#define WORDS_PER_PAGE		(UKVM_PAGE_SIZE / sizeof(uint64_t))
#define VERIFY_CHECK_EVERY	(64ULL << 20)	/* bytes between cancellation checks */

/* Does the guest write the page at gpa (else read it)? As guest.S decides. */
static bool guest_writes_page(uint64_t gpa, uint64_t write_pct, uint64_t write_key)
{
	uint64_t h;

	if (write_pct >= 100)
		return true;
	if (write_pct == 0)
		return false;
	h = ((gpa >> 12) ^ write_key) * GUEST_HASH_MUL1;
	h ^= h >> 32;
	h *= GUEST_HASH_MUL2;
	h ^= h >> 32;
	return (uint64_t)(((unsigned __int128)h * 100) >> 64) < write_pct;
}

bool ukvm_guest_touches(const struct ukvm_verify_params *p, uint64_t gpa)
{
	return !p->visits || p->visits[(gpa - p->gpa) / UKVM_PAGE_SIZE];
}

uint64_t ukvm_guest_write_passes(const struct ukvm_verify_params *p, uint64_t gpa)
{
	uint64_t pass, n = 0;

	if (!ukvm_guest_touches(p, gpa))
		return 0;
	if (!p->write_rotate)
		return guest_writes_page(gpa, p->write_pct, p->write_key) ? p->passes : 0;
	for (pass = 0; pass < p->passes; pass++)
		n += guest_writes_page(gpa, p->write_pct, p->write_key ^ pass * p->write_rotate);
	return n;
}

bool ukvm_guest_writes_in_pass(const struct ukvm_verify_params *p, uint64_t gpa, uint64_t pass)
{
	return ukvm_guest_touches(p, gpa) &&
	       guest_writes_page(gpa, p->write_pct, p->write_key ^ pass * p->write_rotate);
}

/* Does the guest write the page at gpa in any pass? Touched, and chosen for writes. */
static bool guest_writes(const struct ukvm_verify_params *p, uint64_t gpa)
{
	return ukvm_guest_write_passes(p, gpa) != 0;
}

/* How the resident map says the verified range's unit-th page went in. */
static enum ukvm_page_state installed_as(const struct ukvm_verify_params *p, uint64_t unit)
{
	return ukvm_resident_state(p->installed, p->installed_first + unit);
}

static void describe_word(char *msg, size_t len, uint64_t gpa, unsigned word, uint64_t got,
			  uint64_t want, const char *why)
{
	snprintf(msg, len, "page at gpa 0x%llx: word %u is 0x%016llx, expected 0x%016llx (%s)",
		 (unsigned long long)gpa, word, (unsigned long long)got,
		 (unsigned long long)want, why);
}

uint64_t ukvm_verify_region(const struct ukvm_verify_params *p, struct ukvm_ctl *ctl,
			    uint64_t *read_sum, char *msg, size_t msg_len)
{
	uint64_t fill_ref[WORDS_PER_PAGE], zero_ref[WORDS_PER_PAGE], file_ref[WORDS_PER_PAGE];
	uint64_t off, bad = 0, sum = 0, unit = p->unit_size ?: UKVM_PAGE_SIZE, k;
	bool unit_touched = true;
	unsigned i;

	for (i = 0; i < WORDS_PER_PAGE; i++) {
		fill_ref[i] = i >= 3 ? UKVM_FILL_WORD(i) : 0;
		zero_ref[i] = 0;
	}

	for (off = 0; off < p->size; off += UKVM_PAGE_SIZE) {
		const uint64_t *w = (const uint64_t *)(p->hva + off);
		uint64_t gpa = p->gpa + off;
		bool touched = ukvm_guest_touches(p, gpa);
		uint64_t write_passes = ukvm_guest_write_passes(p, gpa);
		bool written = write_passes != 0;
		/* One pass's accesses to the page: its visits, else one per walking vCPU. */
		uint64_t per_pass = p->visits ? p->visits[off / UKVM_PAGE_SIZE] : p->walkers;
		const uint64_t *ref;
		const char *data;
		uint64_t want0, want1, want2, writes;
		bool filled, from_file, first = bad == 0;

		if (p->visits && off % unit == 0)	/* resolved with a page the guest touched? */
			for (k = 0, unit_touched = false; k < unit && !unit_touched;
			     k += UKVM_PAGE_SIZE)
				unit_touched = p->visits[(off + k) / UKVM_PAGE_SIZE];
		/* The data a page holds unless the guest wrote it: resolved, or prefilled. */
		filled = unit_touched ? p->filled : p->untouched_filled ||
			 (p->installed && (installed_as(p, off / unit) == UKVM_PAGE_PREFETCHED ||
					   installed_as(p, off / unit) == UKVM_PAGE_PREINSTALLED));
		from_file = filled && p->expect;
		if (from_file) {
			/* Guarded: the file may have been cut short under its mapping. */
			if (ukvm_mapguard_copy(file_ref, p->expect + off, UKVM_PAGE_SIZE)) {
				if (first)
					snprintf(msg, msg_len, "page at gpa 0x%llx: the source file "
						 "has no bytes at its offset any more: was it "
						 "truncated during the run?", (unsigned long long)gpa);
				if (read_sum)
					*read_sum = sum;
				return bad + 1;	/* nor any further page: nothing to compare with */
			}
			ref = file_ref;
		} else {
			ref = filled ? fill_ref : zero_ref;
		}
		data = touched ? (from_file ? "the source file's bytes at the page's offset"
				  : filled ? "the resolver's data" : "zero")
		       /* untouched: the huge page around it, or prefetch, may have installed it */
		       : unit_touched ? (from_file ? "untouched by the guest, resolved with the page "
						   "around it: the source file's bytes"
				       : filled ? "untouched by the guest, resolved with the page "
						  "around it: the resolver's data"
				       : "untouched by the guest, resolved with the page around it: zero")
		       : p->untouched_filled ? "untouched by the guest: the data it held before the run"
		       /* prefetch's map knows a fault installed it: the record of visits is wrong */
		       : p->installed && installed_as(p, off / unit) == UKVM_PAGE_FAULTED ?
			 "untouched by the guest, yet a fault installed it: zero expected"
		       : !filled ? "untouched by the guest and never installed: zero"
		       : from_file ? "untouched by the guest, installed by prefetch: the source "
				     "file's bytes at the page's offset"
		       : "untouched by the guest, installed by prefetch: the resolver's data";

		if (ctl && off % VERIFY_CHECK_EVERY == 0 && ukvm_ctl_aborted(ctl))
			return bad;

		writes = write_passes * per_pass;
		if (from_file) {
			/* source file: the page is the file's, the guest's writes aside. */
			want0 = written ? gpa ^ GUEST_WRITE_MAGIC : ref[0];
			want1 = ref[1];
			want2 = ref[2] + writes;	/* the guest adds to word 2 */
		} else {
			want0 = written ? gpa ^ GUEST_WRITE_MAGIC : (filled ? ~gpa : 0);
			want1 = filled ? gpa : 0;
			want2 = writes;
		}
		/* Each vCPU sums its own reads (with visits: all vCPUs' together). */
		if (touched)
			sum += want1 * (p->visits ? p->visits[off / UKVM_PAGE_SIZE] : 1) *
			       (p->passes - write_passes);

		if (w[0] != want0) {
			bad++;
			if (first)
				describe_word(msg, msg_len, gpa, 0, w[0], want0,
					      written ? "the guest's write" : data);
		} else if (w[1] != want1) {
			bad++;
			if (first)
				describe_word(msg, msg_len, gpa, 1, w[1], want1,
					      !touched || from_file ? data : filled ?
					      "the resolver's address stamp" : "zero");
		} else if (w[2] != want2) {
			bad++;
			if (first)
				describe_word(msg, msg_len, gpa, 2, w[2], want2,
					      written ? "the count of guest writes to the page" : data);
		} else if (memcmp(w + 3, ref + 3, UKVM_PAGE_SIZE - 3 * sizeof(uint64_t))) {
			bad++;
			for (i = 3; first && i < WORDS_PER_PAGE; i++)
				if (w[i] != ref[i]) {
					describe_word(msg, msg_len, gpa, i, w[i], ref[i], data);
					break;
				}
		}
	}
	if (read_sum)
		*read_sum = sum;
	return bad;
}

uint64_t ukvm_verify_snapshot(const struct ukvm_verify_params *p, struct ukvm_ctl *ctl,
			      uint64_t *written, char *msg, size_t msg_len)
{
	uint64_t old[WORDS_PER_PAGE];
	static const uint64_t zero[WORDS_PER_PAGE];
	uint64_t off, bad = 0, n = 0;
	unsigned i;

	for (off = 0; off < p->size; off += UKVM_PAGE_SIZE) {
		const uint64_t *w = (const uint64_t *)(p->hva + off);
		uint64_t gpa = p->gpa + off;
		bool wrote = guest_writes(p, gpa);
		const uint64_t *want = zero;

		if (ctl && off % VERIFY_CHECK_EVERY == 0 && ukvm_ctl_aborted(ctl))
			break;
		if (wrote) {
			n++;
			ukvm_fill_pages(old, UKVM_PAGE_SIZE, gpa);
			want = old;
		}
		if (!memcmp(w, want, UKVM_PAGE_SIZE))
			continue;
		if (bad++)
			continue;
		for (i = 0; i < WORDS_PER_PAGE; i++)
			if (w[i] != want[i]) {
				snprintf(msg, msg_len, "snapshot slot of the page at gpa 0x%llx: word "
					 "%u is 0x%016llx, expected 0x%016llx (%s)",
					 (unsigned long long)gpa, i, (unsigned long long)w[i],
					 (unsigned long long)want[i],
					 wrote ? "the page's contents before the guest's write"
					       : "zero: the guest only read the page or never "
						 "touched it, so nothing was saved");
				break;
			}
	}
	*written = n;
	return bad;
}

uint64_t ukvm_verify_dirty(const struct ukvm_verify_params *p, const uint8_t *written,
			   uint64_t *dirty, char *msg, size_t msg_len)
{
	uint64_t i, pages = p->size / UKVM_PAGE_SIZE, bad = 0, n = 0;

	for (i = 0; i < pages; i++) {
		uint64_t gpa = p->gpa + i * UKVM_PAGE_SIZE;
		bool wrote = guest_writes(p, gpa);

		n += written[i];
		if (wrote == !!written[i] || bad++)
			continue;
		snprintf(msg, msg_len, "page at gpa 0x%llx: PAGEMAP_SCAN reports it %s, but the "
			 "guest %s", (unsigned long long)gpa,
			 written[i] ? "written" : "still write-protected (not written)",
			 wrote ? "wrote it" : ukvm_guest_touches(p, gpa) ? "only read it"
							     : "never touched it");
	}
	*dirty = n;
	return bad;
}
