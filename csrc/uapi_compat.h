/* SPDX-License-Identifier: MIT */
/*
 * Kernel ABI that distributions' <linux/kvm.h> may predate (Debian 12 ships
 * the 6.1 headers): guest_memfd and the second memslot ioctl. The numbers are
 * the kernel's stable ABI; the names carry a UKVM_ prefix so they never clash
 * with newer headers.
 */
#ifndef UKVM_UAPI_COMPAT_H
#define UKVM_UAPI_COMPAT_H

#include <linux/kvm.h>
#include <stdint.h>

#define UKVM_CAP_USER_MEMORY2		231
#define UKVM_CAP_GUEST_MEMFD		234
#define UKVM_CAP_GUEST_MEMFD_FLAGS	244	/* was KVM_CAP_GUEST_MEMFD_MMAP in 6.17 */

#define UKVM_GUEST_MEMFD_FLAG_MMAP		(1ULL << 0)
#define UKVM_GUEST_MEMFD_FLAG_INIT_SHARED	(1ULL << 1)

#define UKVM_MEM_GUEST_MEMFD		(1U << 2)

struct ukvm_create_guest_memfd {
	uint64_t size;
	uint64_t flags;
	uint64_t reserved[6];
};

struct ukvm_userspace_memory_region2 {
	uint32_t slot;
	uint32_t flags;
	uint64_t guest_phys_addr;
	uint64_t memory_size;
	uint64_t userspace_addr;
	uint64_t guest_memfd_offset;
	uint32_t guest_memfd;
	uint32_t pad1;
	uint64_t pad2[14];
};

#define UKVM_CREATE_GUEST_MEMFD		_IOWR(KVMIO, 0xd4, struct ukvm_create_guest_memfd)
#define UKVM_SET_USER_MEMORY_REGION2	_IOW(KVMIO, 0x49, struct ukvm_userspace_memory_region2)

#endif
