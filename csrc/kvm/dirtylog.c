/* SPDX-License-Identifier: MIT */
/*
 * KVM's dirty logging of one memslot (dirtylog.h): the calls, their
 * arguments and their errors, and the dirty ring's protocol
 * (Documentation/virt/kvm/api.rst, KVM_CAP_DIRTY_LOG_RING): KVM publishes an
 * entry by setting KVM_DIRTY_GFN_F_DIRTY in its flags last; the harvester
 * reads the flags with acquire, the slot and offset after, and hands the
 * entry back by storing KVM_DIRTY_GFN_F_RESET with release; then
 * KVM_RESET_DIRTY_RINGS write-protects the page again and frees the entry.
 */
#include <errno.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/util.h"
#include "kvm/dirtylog.h"
#include "uapi_compat.h"

/* The schema's, which run.py's memory estimate reads too. */
#define RING_ENTRY_BYTES	UKVM_DIRTY_RING_ENTRY_BYTES
_Static_assert(sizeof(struct kvm_dirty_gfn) == UKVM_DIRTY_RING_ENTRY_BYTES,
	       "the schema's DIRTY_RING_ENTRY_BYTES is KVM's entry");

int ukvm_dirtylog_set_logging(const struct ukvm_dirty_slot *s, bool on, struct ukvm_error *err)
{
	struct kvm_userspace_memory_region region = {
		.slot = s->slot,
		.flags = on ? KVM_MEM_LOG_DIRTY_PAGES : 0,
		.guest_phys_addr = s->gpa,
		.memory_size = s->size,
		.userspace_addr = (uint64_t)(uintptr_t)s->hva,
	};
	int ret = ukvm_ioctl(s->vm_fd, KVM_SET_USER_MEMORY_REGION, &region);

	if (ret)
		return ukvm_err_set(err, UKVM_ERR_RUN, -ret, "KVM_SET_USER_MEMORY_REGION(slot %u, "
				    "KVM_MEM_LOG_DIRTY_PAGES %s)", s->slot, on ? "on" : "off");
	return 0;
}

int ukvm_dirtylog_manual_enable(int vm_fd, struct ukvm_error *err)
{
	struct kvm_enable_cap cap = {
		.cap = KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
		.args = { KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE | KVM_DIRTY_LOG_INITIALLY_SET },
	};
	int have = ioctl(vm_fd, KVM_CHECK_EXTENSION, KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2);
	int ret;

	if (have <= 0 || !(have & KVM_DIRTY_LOG_INITIALLY_SET))
		return ukvm_err_set(err, UKVM_ERR_HOST, EOPNOTSUPP,
				    "dirty_tracking='bitmap_manual': this KVM has no "
				    "KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 with KVM_DIRTY_LOG_INITIALLY_SET "
				    "(it answers %d; Linux 5.8+); use dirty_tracking='bitmap'", have);
	ret = ukvm_ioctl(vm_fd, KVM_ENABLE_CAP, &cap);
	if (ret)
		return ukvm_err_set(err, UKVM_ERR_HOST, -ret,
				    "KVM_ENABLE_CAP(KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2)");
	return 0;
}

int ukvm_dirtylog_get(const struct ukvm_dirty_slot *s, uint64_t *bitmap, struct ukvm_error *err)
{
	struct kvm_dirty_log log = { .slot = s->slot, .dirty_bitmap = bitmap };
	int ret = ukvm_ioctl(s->vm_fd, KVM_GET_DIRTY_LOG, &log);

	if (ret)
		return ukvm_err_set(err, UKVM_ERR_RUN, -ret, "KVM_GET_DIRTY_LOG(slot %u)", s->slot);
	return 0;
}

int ukvm_dirtylog_clear(const struct ukvm_dirty_slot *s, uint64_t first, uint64_t num,
			const uint64_t *bitmap, struct ukvm_error *err)
{
	struct kvm_clear_dirty_log clear = {
		.slot = s->slot,
		.num_pages = (uint32_t)num,
		.first_page = first,
		/* KVM reads the bits of [first, first + num) from the pointer's start. */
		.dirty_bitmap = (void *)(uintptr_t)(bitmap + first / 64),
	};
	int ret = ukvm_ioctl(s->vm_fd, KVM_CLEAR_DIRTY_LOG, &clear);

	if (ret)
		return ukvm_err_set(err, UKVM_ERR_RUN, -ret, "KVM_CLEAR_DIRTY_LOG(slot %u, pages "
				    "%llu..%llu)", s->slot, (unsigned long long)first,
				    (unsigned long long)(first + num));
	return 0;
}

int ukvm_dirtylog_ring_enable(int vm_fd, uint32_t entries, bool *acq_rel, struct ukvm_error *err)
{
	int with_acq_rel = ioctl(vm_fd, KVM_CHECK_EXTENSION, KVM_CAP_DIRTY_LOG_RING_ACQ_REL);
	int plain = ioctl(vm_fd, KVM_CHECK_EXTENSION, KVM_CAP_DIRTY_LOG_RING);
	uint64_t bytes = (uint64_t)entries * RING_ENTRY_BYTES;
	int max = with_acq_rel > 0 ? with_acq_rel : plain;
	struct kvm_enable_cap cap = {
		.cap = with_acq_rel > 0 ? KVM_CAP_DIRTY_LOG_RING_ACQ_REL : KVM_CAP_DIRTY_LOG_RING,
		.args = { bytes },
	};
	int ret;

	if (max <= 0)
		return ukvm_err_set(err, UKVM_ERR_HOST, EOPNOTSUPP,
				    "dirty_tracking='ring': this KVM has no dirty ring "
				    "(KVM_CAP_DIRTY_LOG_RING and _ACQ_REL: Linux 5.11+ on x86); use "
				    "dirty_tracking='bitmap'");
	if (bytes > (uint64_t)max)
		return ukvm_err_set(err, UKVM_ERR_HOST, E2BIG,
				    "dirty_ring_entries: %u entries are %llu bytes, more than this "
				    "KVM's dirty ring allows (%d bytes: %d entries); use at most %d",
				    entries, (unsigned long long)bytes, max,
				    max / (int)RING_ENTRY_BYTES, max / (int)RING_ENTRY_BYTES);
	ret = ukvm_ioctl(vm_fd, KVM_ENABLE_CAP, &cap);
	if (ret == -EINVAL)
		return ukvm_err_set(err, UKVM_ERR_HOST, EINVAL,
				    "dirty_ring_entries: KVM refused a ring of %u entries (%llu "
				    "bytes): it needs a power of two, at least a page and more than "
				    "the entries it reserves (64, plus PML's 512 on Intel); use more",
				    entries, (unsigned long long)bytes);
	if (ret)
		return ukvm_err_set(err, UKVM_ERR_HOST, -ret, "KVM_ENABLE_CAP(%s, %llu bytes)",
				    with_acq_rel > 0 ? "KVM_CAP_DIRTY_LOG_RING_ACQ_REL" :
				    "KVM_CAP_DIRTY_LOG_RING", (unsigned long long)bytes);
	*acq_rel = with_acq_rel > 0;
	return 0;
}

void ukvm_dirty_ring_init(struct ukvm_dirty_ring *ring)
{
	ring->gfns = NULL;
	ring->entries = 0;
	ring->next = 0;
}

int ukvm_dirty_ring_map(struct ukvm_dirty_ring *ring, int vcpu_fd, uint32_t entries,
			struct ukvm_error *err)
{
	size_t bytes = (size_t)entries * RING_ENTRY_BYTES;
	long page = sysconf(_SC_PAGESIZE);
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, vcpu_fd,
		       (off_t)UKVM_DIRTY_LOG_PAGE_OFFSET * page);

	if (p == MAP_FAILED)
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "mmap(the vCPU's dirty ring, %zu "
				    "bytes)", bytes);
	ring->gfns = p;
	ring->entries = entries;
	ring->next = 0;
	return 0;
}

void ukvm_dirty_ring_unmap(struct ukvm_dirty_ring *ring)
{
	if (ring->gfns)
		munmap(ring->gfns, (size_t)ring->entries * RING_ENTRY_BYTES);
	ukvm_dirty_ring_init(ring);
}

uint64_t ukvm_dirty_ring_harvest(struct ukvm_dirty_ring *ring, uint32_t slot, uint64_t pages,
				 _Atomic uint64_t *bitmap, uint64_t *stray)
{
	uint64_t n = 0;

	for (;;) {
		struct kvm_dirty_gfn *e = &ring->gfns[ring->next & (ring->entries - 1)];
		uint32_t flags = __atomic_load_n(&e->flags, __ATOMIC_ACQUIRE);

		/* Not yet published, or published and handed back but not yet reset. */
		if (!(flags & KVM_DIRTY_GFN_F_DIRTY) || (flags & KVM_DIRTY_GFN_F_RESET))
			break;
		if (e->slot == slot && e->offset < pages)
			atomic_fetch_or_explicit(&bitmap[e->offset / 64], 1ULL << (e->offset % 64),
						 memory_order_relaxed);
		else
			(*stray)++;
		__atomic_store_n(&e->flags, KVM_DIRTY_GFN_F_RESET, __ATOMIC_RELEASE);
		ring->next++;
		n++;
	}
	return n;
}

int ukvm_dirtylog_ring_reset(int vm_fd, struct ukvm_error *err)
{
	int r = ioctl(vm_fd, KVM_RESET_DIRTY_RINGS, 0);

	if (r < 0)
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "KVM_RESET_DIRTY_RINGS");
	return r;
}
