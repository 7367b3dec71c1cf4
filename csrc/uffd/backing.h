/* SPDX-License-Identifier: MIT */
/* The memory behind the test region, one kind per enum ukvm_backing (backing.c). */
#ifndef UKVM_UFFD_BACKING_H
#define UKVM_UFFD_BACKING_H

#include <stdbool.h>
#include <stdint.h>

#include "ukvm.h"

/* One backing's memory (a C tag cannot be both the enum's name and a struct's). */
struct ukvm_backing_mem {
	enum ukvm_backing kind;
	int memfd;			/* shared backings; -1 otherwise */
	uint8_t *hva;			/* the guest's mapping */
	uint8_t *alias;			/* second mapping of the memfd, or NULL */
	uint64_t size;
	uint64_t page_size;		/* the backing's page size */
};

/* Puts b in the empty state that ukvm_backing_destroy() accepts. */
void ukvm_backing_init(struct ukvm_backing_mem *b);
/* Before anything is built: are there enough huge pages for size bytes? */
int ukvm_backing_check_host(enum ukvm_backing kind, uint64_t size, struct ukvm_error *err);
/*
 * backing guest_memfd: can the VM have one? From KVM_CAP_GUEST_MEMFD as
 * /dev/kvm answers it and as the VM answers it (ukvm_vm_check_cap()): 0
 * where the VM's answer is positive, else -EOPNOTSUPP with err (UKVM_ERR_HOST)
 * giving both answers and what they mean. Only the VM's answer decides.
 */
int ukvm_backing_gmem_check(int on_dev_kvm, int on_vm, struct ukvm_error *err);
/*
 * vm_fd: the VM a guest_memfd belongs to (ignored for other kinds), which
 * ukvm_backing_gmem_check() found has guest_memfd.
 */
int ukvm_backing_create(struct ukvm_backing_mem *b, enum ukvm_backing kind, uint64_t size,
			int vm_fd, struct ukvm_error *err);
void ukvm_backing_destroy(struct ukvm_backing_mem *b);
/* A page cache behind it (MINOR faults, an alias mapping)? */
bool ukvm_backing_is_shared(enum ukvm_backing kind);
bool ukvm_backing_is_hugetlb(enum ukvm_backing kind);
/* No file behind it (UFFDIO_MOVE's memory; uffd-wp without WP_HUGETLBFS_SHMEM)? */
bool ukvm_backing_is_private_anonymous(enum ukvm_backing kind);
/* Does uffd_mode wp run on it (4 KiB pages whose writes reach userfaultfd)? */
bool ukvm_backing_takes_wp(enum ukvm_backing kind);

#endif
