/* SPDX-License-Identifier: MIT */
/*
 * Kernel ABI newer than the oldest headers uffdkvm builds against (Linux
 * 5.10's, as on older manylinux images and distributions): everything the
 * core uses that 5.10's <linux/userfaultfd.h>, <linux/kvm.h> or the C
 * library's <sys/mman.h> may lack. The numbers are the kernel's stable ABI.
 * Each is defined here only where the system headers do not define it
 * (#ifndef, keyed on the macro that arrived with it), except guest_memfd,
 * which keeps UKVM_ names so it never clashes with newer headers.
 *
 * Compiling against old headers does not claim the kernel has the feature:
 * the running kernel decides, as it always did (UFFDIO_API's feature mask,
 * UFFDIO_REGISTER's ioctl mask, KVM_CHECK_EXTENSION, and each ioctl's own
 * answer: KVM_GET_STATS_FD and KVM_GET_DEVICE_ATTR fail where they are not
 * offered, and the core goes on without them).
 */
#ifndef UKVM_UAPI_COMPAT_H
#define UKVM_UAPI_COMPAT_H

#include <linux/kvm.h>
#include <linux/types.h>
#include <linux/userfaultfd.h>
#include <stdint.h>
#include <sys/mman.h>

/* ---- userfaultfd ---- */

/* Linux 5.13: MINOR faults on hugetlbfs, UFFDIO_CONTINUE (5.14: on shmem). */
#ifndef UFFD_FEATURE_MINOR_HUGETLBFS
#define UFFD_FEATURE_MINOR_HUGETLBFS	(1 << 9)
#endif
#ifndef UFFD_FEATURE_MINOR_SHMEM
#define UFFD_FEATURE_MINOR_SHMEM	(1 << 10)
#endif
#ifndef UFFDIO_REGISTER_MODE_MINOR
#define UFFDIO_REGISTER_MODE_MINOR	((__u64)1 << 2)
#endif
#ifndef UFFDIO_CONTINUE
#define _UFFDIO_CONTINUE		(0x07)
struct uffdio_continue {
	struct uffdio_range range;
	__u64 mode;
	__s64 mapped;
};
#define UFFDIO_CONTINUE			_IOWR(UFFDIO, _UFFDIO_CONTINUE, struct uffdio_continue)
#endif

/* Linux 5.18: a hugetlb fault message names the 4 KiB page, not the huge page. */
#ifndef UFFD_FEATURE_EXACT_ADDRESS
#define UFFD_FEATURE_EXACT_ADDRESS	(1 << 11)
#endif

/* Linux 6.8: UFFDIO_MOVE, which moves a private anonymous page into place. */
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE		(1 << 16)
#endif
#ifndef UFFDIO_MOVE
#define _UFFDIO_MOVE			(0x05)
struct uffdio_move {
	__u64 dst;
	__u64 src;
	__u64 len;
	__u64 mode;
	__s64 move;	/* written by the kernel: bytes moved, or -errno */
};
#define UFFDIO_MOVE_MODE_DONTWAKE		((__u64)1 << 0)
#define UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES	((__u64)1 << 1)
#define UFFDIO_MOVE			_IOWR(UFFDIO, _UFFDIO_MOVE, struct uffdio_move)
#endif

/* Linux 6.1: /dev/userfaultfd. */
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC			0xAA
#define USERFAULTFD_IOC_NEW		_IO(USERFAULTFD_IOC, 0x00)
#endif

/* Linux 5.19: write-protect on shmem and hugetlbfs (uffd-wp PTE markers). */
#ifndef UFFD_FEATURE_WP_HUGETLBFS_SHMEM
#define UFFD_FEATURE_WP_HUGETLBFS_SHMEM	(1 << 12)
#endif

/* Linux 6.7: write-protect without faults (the kernel un-protects on a write). */
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED	(1 << 13)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC		(1 << 15)
#endif

/* Linux 6.7: PAGEMAP_SCAN on /proc/PID/pagemap (<linux/fs.h>). */
#ifndef PAGEMAP_SCAN
#define PAGE_IS_WRITTEN		(1 << 1)
struct page_region {
	__u64 start;
	__u64 end;
	__u64 categories;
};
struct pm_scan_arg {
	__u64 size;
	__u64 flags;
	__u64 start;
	__u64 end;
	__u64 walk_end;
	__u64 vec;
	__u64 vec_len;
	__u64 max_pages;
	__u64 category_inverted;
	__u64 category_mask;
	__u64 category_anyof_mask;
	__u64 return_mask;
};
#define PAGEMAP_SCAN	_IOWR('f', 16, struct pm_scan_arg)
#define PM_SCAN_WP_MATCHING	(1 << 0)
#define PM_SCAN_CHECK_WPASYNC	(1 << 1)
#endif

/* ---- KVM ---- */

/* Linux 5.14: binary statistics. */
#ifndef KVM_GET_STATS_FD
#define KVM_CAP_BINARY_STATS_FD		203
struct kvm_stats_header {
	__u32 flags;
	__u32 name_size;
	__u32 num_desc;
	__u32 id_offset;
	__u32 desc_offset;
	__u32 data_offset;
};
struct kvm_stats_desc {
	__u32 flags;
	__s16 exponent;
	__u16 size;
	__u32 offset;
	__u32 bucket_size;
	char name[];
};
#define KVM_STATS_TYPE_SHIFT		0
#define KVM_STATS_TYPE_MASK		(0xF << KVM_STATS_TYPE_SHIFT)
#define KVM_STATS_TYPE_CUMULATIVE	(0x0 << KVM_STATS_TYPE_SHIFT)
#define KVM_GET_STATS_FD		_IO(KVMIO, 0xce)
#endif

/* Linux 5.16 (x86): the vCPU's TSC offset as a device attribute. */
#ifndef KVM_VCPU_TSC_CTRL
#define KVM_VCPU_TSC_CTRL		0
#define KVM_VCPU_TSC_OFFSET		0
#endif

/* Linux 5.11: the dirty ring (x86); 6.0: its acquire/release variant. */
#ifndef KVM_CAP_DIRTY_LOG_RING
#define KVM_CAP_DIRTY_LOG_RING		192
#endif
#ifndef KVM_CAP_DIRTY_LOG_RING_ACQ_REL
#define KVM_CAP_DIRTY_LOG_RING_ACQ_REL	223
#endif
#ifndef KVM_EXIT_DIRTY_RING_FULL
#define KVM_EXIT_DIRTY_RING_FULL	31
#endif
#ifndef KVM_RESET_DIRTY_RINGS
#define KVM_RESET_DIRTY_RINGS		_IO(KVMIO, 0xc7)
#define KVM_DIRTY_GFN_F_DIRTY		(1U << 0)
#define KVM_DIRTY_GFN_F_RESET		(1U << 1)
struct kvm_dirty_gfn {
	__u32 flags;
	__u32 slot;
	__u64 offset;
};
#endif
/* The ring's pages in the vCPU's mapping, x86's (the generic header's 0 means none). */
#define UKVM_DIRTY_LOG_PAGE_OFFSET	64

/* Linux 6.8: guest_memfd and the second memslot ioctl (UKVM_ names: the ABI is still moving). */
#define UKVM_CAP_USER_MEMORY2		231
#define UKVM_CAP_GUEST_MEMFD		234
#define UKVM_CAP_GUEST_MEMFD_FLAGS	244	/* was KVM_CAP_GUEST_MEMFD_MMAP in 6.17 */

/*
 * KVM Userfault (memslot flag KVM_MEM_USERFAULT: a vCPU's access to a page
 * marked in the slot's bitmap exits to userspace) exists only out of tree
 * (James Houghton's series, carried by Firecracker for its 6.18 kernels),
 * which numbers its capability 245. Upstream KVM has since given 245 to
 * KVM_CAP_ARM_SEA_TO_USER, an arm64 capability that x86 KVM answers 0, so on
 * x86 a positive answer means KVM Userfault. uffdkvm only asks, to say why
 * it refuses userfaultfd on guest_memfd (experiment/gmem.c).
 */
#define UKVM_CAP_USERFAULT		245

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

/*
 * Linux 6.8: KVM_RUN's -EFAULT can say which guest memory it could not
 * provide (KVM_CAP_MEMORY_FAULT_INFO): exit reason KVM_EXIT_MEMORY_FAULT,
 * with this in kvm_run's exit union (where struct kvm_run's mmio member
 * also starts). Kept under a UKVM_ name, like guest_memfd's.
 */
#ifndef KVM_EXIT_MEMORY_FAULT
#define KVM_EXIT_MEMORY_FAULT		39
#endif
struct ukvm_memory_fault_exit {
	uint64_t flags;
	uint64_t gpa;
	uint64_t size;
};

/* ---- the C library ---- */

/* Linux 5.14; glibc 2.35 names it. */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE		23
#endif

#endif
