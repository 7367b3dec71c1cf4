/* SPDX-License-Identifier: MIT */
/*
 * backing guest_memfd at setup: whether the VM has a guest_memfd, and why a
 * uffd_mode on it is refused even where userfaultfd registers it.
 *
 * userfaultfd sees faults on the host's page tables: a thread (a vCPU
 * thread inside KVM_RUN included) that touches a registered range through
 * its mapping. For ordinary memory KVM reaches guest pages that way, by
 * get_user_pages() on the memslot's userspace address, so a missing page
 * stops the vCPU in handle_userfault(). A guest_memfd memslot is different:
 * KVM takes the guest's pages from the file itself (kvm_gmem_get_pfn(),
 * which allocates a page that is not there yet), never through the host's
 * mapping. The out-of-tree series that lets userfaultfd register
 * guest_memfd ("mm, kvm: allow uffd support in guest_memfd", carried by
 * Firecracker for its 6.18 kernels) adds the hooks for the host mapping's
 * fault path only, so on such a kernel a registered guest_memfd still gets
 * no fault from the guest: a MISSING run's pages are zero-filled by KVM, a
 * MINOR run's mapped as they were filled, and nothing reaches a reader
 * (found on the frontier-6.18 kernel: 2,048 of 2,048 pages bad, and "0
 * faults"). What makes the guest's accesses exit to userspace is KVM
 * Userfault (James Houghton's series: memslot flag KVM_MEM_USERFAULT with a
 * bitmap, exits KVM_EXIT_MEMORY_FAULT with KVM_MEMORY_EXIT_FLAG_USERFAULT),
 * which uffdkvm does not use yet. So every uffd_mode on guest_memfd is
 * refused before a vCPU runs: by the kernel where UFFDIO_REGISTER fails
 * (uffd.c's hint), and here where it succeeds.
 */
#include <errno.h>
#include <stdbool.h>

#include "base/errors.h"
#include "experiment/gmem.h"
#include "kvm/vm.h"
#include "uapi_compat.h"
#include "uffd/backing.h"
#include "ukvm.h"

enum ukvm_backing ukvm_gmem_backing_made(const struct ukvm_config *cfg)
{
#ifdef UKVM_TEST_HOOKS
	/* A kernel whose userfaultfd registers guest_memfd, on any host: shmem registers. */
	if (cfg->backing == UKVM_BACKING_GUEST_MEMFD &&
	    cfg->inject == UKVM_INJECT_GMEM_UFFD_REGISTERS)
		return UKVM_BACKING_SHMEM;
#endif
	return cfg->backing;
}

int ukvm_gmem_check_vm(const struct ukvm_vm *vm, const struct ukvm_config *cfg,
		       struct ukvm_error *err)
{
	int on_dev_kvm, on_vm;

	ukvm_vm_check_cap(vm, UKVM_CAP_GUEST_MEMFD, &on_dev_kvm, &on_vm);
#ifdef UKVM_TEST_HOOKS
	if (cfg->inject == UKVM_INJECT_NO_VM_GUEST_MEMFD)
		on_vm = 0;	/* as a KVM_X86_DEFAULT_VM from Linux 6.8 to 6.17 */
#else
	(void)cfg;
#endif
	return ukvm_backing_gmem_check(on_dev_kvm, on_vm, err);
}

int ukvm_gmem_refuse_uffd(const struct ukvm_vm *vm, const struct ukvm_config *cfg,
			  struct ukvm_error *err)
{
	bool minor = cfg->uffd_mode == UKVM_UFFD_MINOR;
	int on_dev_kvm, on_vm;

	/* The VM's answer: KVM Userfault is a property of the VM's memslots. */
	ukvm_vm_check_cap(vm, UKVM_CAP_USERFAULT, &on_dev_kvm, &on_vm);
	return ukvm_err_set(err, UKVM_ERR_HOST, 0,
			    "uffd_mode '%s' on backing guest_memfd: this kernel's userfaultfd "
			    "registers guest_memfd memory (UFFDIO_REGISTER succeeded), but the "
			    "guest's accesses would not fault through it: KVM maps guest_memfd "
			    "pages for the guest from the file itself, never through the host's "
			    "mapping that userfaultfd watches, so %s. Only KVM Userfault (memslot "
			    "flag KVM_MEM_USERFAULT) makes the guest's accesses exit to userspace, "
			    "and uffdkvm does not use it yet; this KVM %s (KVM_CAP_USERFAULT, 245 "
			    "out of tree, is %d on the VM). Run guest_memfd with uffd_mode=None, or "
			    "demand-page backing 'shmem'",
			    ukvm_uffd_mode_name(cfg->uffd_mode),
			    minor ? "no minor fault would arrive (every page would be mapped as it "
				    "was filled)"
				  : "no missing fault would arrive (every page would read as zeros)",
			    on_vm > 0 ? "offers it" : "does not offer it either", on_vm);
}
