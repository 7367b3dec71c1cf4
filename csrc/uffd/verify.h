/* SPDX-License-Identifier: MIT */
/* After every run: does every page hold what it must? (verify.c) */
#ifndef UKVM_UFFD_VERIFY_H
#define UKVM_UFFD_VERIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/ctl.h"
#include "uffd/resident.h"

struct ukvm_verify_params {
	const uint8_t *hva;		/* the region as the guest wrote it */
	uint64_t gpa;			/* its guest physical address */
	uint64_t size;
	bool filled;			/* resolved with data, else zero-filled */
	/*
	 * source file: the file's bytes for this range (each page's data
	 * word for word, the guest's writes aside: word 0 replaced, word 2
	 * plus the writes), or NULL: the synthetic fill (fill.h).
	 */
	const uint8_t *expect;
	uint64_t walkers;		/* vCPUs that walk each page (overlap: all), without visits */
	uint64_t write_pct;
	uint64_t write_key;
	uint64_t write_rotate;		/* write_set per_pass: guest_abi.h's GUEST_WRITE_ROTATE, else 0 */
	/*
	 * touch_percent, access zipf: the accesses in one pass to each 4 KiB
	 * page from gpa, all vCPUs together (a page with none is untouched);
	 * a written page's word 2 holds its count x the passes that write it.
	 * NULL: every page is touched, walkers times a pass.
	 */
	const uint32_t *visits;
	uint64_t passes;
	/* A fault resolves this much (the backing's page size; 0: 4 KiB): an
	 * untouched page in a touched huge page was resolved with it. */
	uint64_t unit_size;
	/* What an untouched page holds: the resolver's data (it was filled
	 * before the run), else zeros (nothing may have installed it)... */
	bool untouched_filled;
	/* ...unless prefetch installed it: the resident map (resident.h), whose
	 * page installed_first (of unit_size) is the one at gpa, or NULL. Only
	 * prefetch may install a page the guest never touches: one a fault
	 * installed is not counted as filled, and fails. */
	struct ukvm_resident *installed;
	uint64_t installed_first;
};

/*
 * Does the guest touch the 4 KiB page at gpa (in p's region) at all? The
 * guest's access set is deterministic (its pattern, seed and parameters).
 */
bool ukvm_guest_touches(const struct ukvm_verify_params *p, uint64_t gpa);

/*
 * The passes in which the guest writes the 4 KiB page at gpa (0: it never
 * does), and whether it writes it in pass number pass (0-based), as guest.S
 * decides: per page frame, with the pass's write key (write_set).
 */
uint64_t ukvm_guest_write_passes(const struct ukvm_verify_params *p, uint64_t gpa);
bool ukvm_guest_writes_in_pass(const struct ukvm_verify_params *p, uint64_t gpa, uint64_t pass);

/*
 * Returns the number of bad pages and describes the first in msg. read_sum
 * gets the sum of word 1 over the pages the guest reads, each times its
 * visits (p->visits, else once) in every pass that reads it: a vCPU's
 * checksum over all passes (with visits and overlap, all vCPUs' together).
 * Stops early (with the count so far) once ctl's run is aborted, and at
 * the first page of p->expect the file no longer has (truncated under its
 * mapping: counted bad, msg says so; read with base/mapguard.h's guard).
 */
uint64_t ukvm_verify_region(const struct ukvm_verify_params *p, struct ukvm_ctl *ctl,
			    uint64_t *read_sum, char *msg, size_t msg_len);

/*
 * uffd_mode wp: the snapshot p->hva (a slot per 4 KiB page of the region at
 * p->gpa) must hold, for every page the guest writes, the page's old
 * contents (fill.h: a filled page, before the guest's write), and for every
 * page it only reads, nothing: zeros, since reads never fault and nothing
 * was saved. Returns the number of bad slots, the first described in msg,
 * and sets *written to the pages the guest writes (each one WP fault).
 */
uint64_t ukvm_verify_snapshot(const struct ukvm_verify_params *p, struct ukvm_ctl *ctl,
			      uint64_t *written, char *msg, size_t msg_len);

/*
 * wp_async: written[i] (PAGEMAP_SCAN's PAGE_IS_WRITTEN for page i of the
 * region at p->gpa) must be set exactly for the pages the guest writes.
 * Returns the number of pages where it is not, the first described in msg,
 * and sets *dirty to the pages marked written.
 */
uint64_t ukvm_verify_dirty(const struct ukvm_verify_params *p, const uint8_t *written,
			   uint64_t *dirty, char *msg, size_t msg_len);

#endif
