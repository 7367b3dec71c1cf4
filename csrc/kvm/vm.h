/* SPDX-License-Identifier: MIT */
/*
 * The VM: /dev/kvm, KVM_CREATE_VM, the guest's CPUID, its memslots, and the
 * system memslot at GPA 0 with the GDT, IDT, TSS, guest code, per-vCPU args
 * pages and stacks, and the page tables (vm.c says how).
 */
#ifndef UKVM_KVM_VM_H
#define UKVM_KVM_VM_H

#include <linux/kvm.h>
#include <stdbool.h>
#include <stdint.h>

#include "ukvm.h"

struct ukvm_vm {
	int kvm_fd;
	int vm_fd;
	int run_mmap_size;
	struct kvm_cpuid2 *cpuid;
	uint32_t max_vcpus;		/* KVM_CAP_MAX_VCPUS of /dev/kvm */
	uint32_t phys_bits;		/* guest physical address width */
	bool gbpages;			/* 1 GiB guest pages allowed */
	uint8_t *sys_hva;		/* the system memslot at GPA 0 */
	uint64_t sys_size;
	uint64_t sys_next;		/* bump allocator within it */
	uint64_t pml4_gpa;
	uint64_t gdt_gpa;
	uint64_t idt_gpa;
	uint64_t tss_gpa;
	uint64_t code_gpa;
	uint32_t nr_slots;
	uint64_t *pt_cache;		/* last page table written, see vm_map_page() */
	uint64_t pt_cache_base;
};

/* Each vCPU's stack in the system memslot (ukvm_vm_sys_size() counts them). */
#define UKVM_VCPU_STACK_BYTES	(16ULL << 10)

#define UKVM_GDT_CODE	0x08
#define UKVM_GDT_DATA	0x10
#define UKVM_GDT_TSS	0x18

/* Puts vm in the empty state that ukvm_vm_destroy() accepts. */
void ukvm_vm_init(struct ukvm_vm *vm);
/* Opens /dev/kvm and reads max_vcpus; builds nothing else. */
int ukvm_vm_open(struct ukvm_vm *vm, struct ukvm_error *err);
/* sys_size: bytes for the system memslot, from ukvm_vm_sys_size(); opens /dev/kvm if needed. */
int ukvm_vm_create(struct ukvm_vm *vm, uint64_t sys_size, struct ukvm_error *err);
void ukvm_vm_destroy(struct ukvm_vm *vm);
/*
 * KVM_CHECK_EXTENSION(cap) as /dev/kvm answers it (*on_dev_kvm: what this KVM
 * offers some VM type) and as the VM answers it (*on_vm: what the VM type
 * uffdkvm creates, KVM_X86_DEFAULT_VM, has); a failed ask gives 0. The two
 * differ for capabilities KVM offers only to some VM types (guest_memfd).
 */
void ukvm_vm_check_cap(const struct ukvm_vm *vm, long cap, int *on_dev_kvm, int *on_vm);
/* extra_bytes: more for ukvm_vm_alloc() (the guest's access logs, say). */
uint64_t ukvm_vm_sys_size(uint32_t vcpus, uint64_t region_bytes, uint64_t extra_bytes);
int ukvm_vm_alloc(struct ukvm_vm *vm, uint64_t bytes, uint64_t *gpa, struct ukvm_error *err);
void *ukvm_vm_sys_hva(struct ukvm_vm *vm, uint64_t gpa);
int ukvm_vm_add_memslot(struct ukvm_vm *vm, uint64_t gpa, uint64_t size, void *hva,
			struct ukvm_error *err);
/* A memslot whose memory is a guest_memfd (hva: its mmap, for the host's access). */
int ukvm_vm_add_gmem_memslot(struct ukvm_vm *vm, uint64_t gpa, uint64_t size, void *hva,
			     int gmem_fd, struct ukvm_error *err);
/* Identity-maps [gpa, gpa + size) in the guest page tables with page_size pages. */
int ukvm_vm_map(struct ukvm_vm *vm, uint64_t gpa, uint64_t size, uint64_t page_size,
		struct ukvm_error *err);
/* The guest page-table entry that maps gva (any level), or NULL. */
uint64_t *ukvm_vm_leaf_pte(struct ukvm_vm *vm, uint64_t gva);

#endif
