/* SPDX-License-Identifier: MIT */
/* backing guest_memfd at setup: whether the VM has it, and userfaultfd on it (gmem.c). */
#ifndef UKVM_EXPERIMENT_GMEM_H
#define UKVM_EXPERIMENT_GMEM_H

#include "kvm/vm.h"
#include "ukvm.h"

/*
 * The backing setup makes for cfg: cfg->backing, but in a test build with
 * UKVM_INJECT_GMEM_UFFD_REGISTERS a shmem memfd stands in for a guest_memfd.
 */
enum ukvm_backing ukvm_gmem_backing_made(const struct ukvm_config *cfg);
/*
 * Can vm (created, of the type uffdkvm makes) have a guest_memfd? 0, or
 * -EOPNOTSUPP with err giving /dev/kvm's and the VM's KVM_CAP_GUEST_MEMFD.
 */
int ukvm_gmem_check_vm(const struct ukvm_vm *vm, const struct ukvm_config *cfg,
		       struct ukvm_error *err);
/*
 * After UFFDIO_REGISTER of guest_memfd memory succeeded: always
 * -EOPNOTSUPP, err (UKVM_ERR_HOST) saying why no run could demand-page it
 * and whether vm's KVM offers KVM Userfault.
 */
int ukvm_gmem_refuse_uffd(const struct ukvm_vm *vm, const struct ukvm_config *cfg,
			  struct ukvm_error *err);

#endif
