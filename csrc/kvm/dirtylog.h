/* SPDX-License-Identifier: MIT */
/*
 * KVM's dirty logging of one memslot (dirtylog.c): the bitmap, read with
 * KVM_GET_DIRTY_LOG and, under MANUAL_DIRTY_LOG_PROTECT2, cleared with
 * KVM_CLEAR_DIRTY_LOG; and the per-vCPU dirty ring, harvested and reset.
 * Bitmaps here are little-endian u64 words, bit i for the slot's page i,
 * as KVM writes them.
 */
#ifndef UKVM_KVM_DIRTYLOG_H
#define UKVM_KVM_DIRTYLOG_H

#include <linux/kvm.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "uapi_compat.h"
#include "ukvm.h"

/* The memslot as it was added (vm.c), which a flags change must repeat. */
struct ukvm_dirty_slot {
	int vm_fd;
	uint32_t slot;
	uint64_t gpa;
	uint64_t size;
	void *hva;
};

/* KVM_MEM_LOG_DIRTY_PAGES on (on) or off: KVM_SET_USER_MEMORY_REGION with the flag changed. */
int ukvm_dirtylog_set_logging(const struct ukvm_dirty_slot *s, bool on, struct ukvm_error *err);
/*
 * KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 with INITIALLY_SET: KVM_GET_DIRTY_LOG
 * then only reads, KVM_CLEAR_DIRTY_LOG re-protects, and logging starts with
 * every bit set and no page protected. Before logging is turned on.
 */
int ukvm_dirtylog_manual_enable(int vm_fd, struct ukvm_error *err);
/* KVM_GET_DIRTY_LOG into bitmap (the slot's pages, rounded up to 64). */
int ukvm_dirtylog_get(const struct ukvm_dirty_slot *s, uint64_t *bitmap, struct ukvm_error *err);
/*
 * KVM_CLEAR_DIRTY_LOG of the bits set in bitmap (the whole slot's) over
 * pages [first, first + num): first a multiple of 64, num too unless the
 * range ends at the slot's end.
 */
int ukvm_dirtylog_clear(const struct ukvm_dirty_slot *s, uint64_t first, uint64_t num,
			const uint64_t *bitmap, struct ukvm_error *err);

/*
 * The dirty ring: KVM_CAP_DIRTY_LOG_RING_ACQ_REL where KVM has it, else
 * KVM_CAP_DIRTY_LOG_RING, of entries x 16 bytes per vCPU. Before any vCPU
 * is created. *acq_rel says which; -EOPNOTSUPP or -E2BIG (err says why and
 * the host's size) where it cannot be had.
 */
int ukvm_dirtylog_ring_enable(int vm_fd, uint32_t entries, bool *acq_rel, struct ukvm_error *err);

struct ukvm_dirty_ring {
	struct kvm_dirty_gfn *gfns;	/* the vCPU's ring, mapped; NULL: none */
	uint32_t entries;
	uint32_t next;			/* the next entry to harvest (mod entries) */
};

void ukvm_dirty_ring_init(struct ukvm_dirty_ring *ring);
/* Maps the vCPU's ring (vcpu_fd's KVM_DIRTY_LOG_PAGE_OFFSET pages). */
int ukvm_dirty_ring_map(struct ukvm_dirty_ring *ring, int vcpu_fd, uint32_t entries,
			struct ukvm_error *err);
void ukvm_dirty_ring_unmap(struct ukvm_dirty_ring *ring);
/*
 * Harvests every published entry: each one of slot sets its page's bit in
 * bitmap (pages bits; atomic, since several vCPUs' rings share it) and is
 * marked for reset, with the acquire and release the ring's protocol asks
 * for. Returns the entries harvested; *stray counts those of another slot
 * or beyond pages (none are expected).
 */
uint64_t ukvm_dirty_ring_harvest(struct ukvm_dirty_ring *ring, uint32_t slot, uint64_t pages,
				 _Atomic uint64_t *bitmap, uint64_t *stray);
/*
 * KVM_RESET_DIRTY_RINGS: re-protects every harvested entry's page, all
 * vCPUs' rings. The entries it reset (>= 0), or -errno.
 */
int ukvm_dirtylog_ring_reset(int vm_fd, struct ukvm_error *err);

#endif
