/* SPDX-License-Identifier: MIT */
/*
 * The VM: /dev/kvm, KVM_CREATE_VM, the guest's CPUID, and the "system"
 * memslot at GPA 0 that holds everything but the test region: GDT, IDT,
 * TSS, the guest code, per-vCPU args pages and stacks, and the page tables.
 *
 * Guest virtual addresses equal guest physical ones. The system memslot is
 * identity-mapped with 2 MiB pages; the test region (its own memslot, see
 * setup.c) with 4 KiB pages, as upstream's demand_paging_test does.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/util.h"
#include "kvm/guest.h"
#include "kvm/vm.h"
#include "uapi_compat.h"

#define PTE_PRESENT	(1ULL << 0)
#define PTE_WRITE	(1ULL << 1)
#define PTE_ACCESSED	(1ULL << 5)
#define PTE_DIRTY	(1ULL << 6)
#define PTE_LARGE	(1ULL << 7)
#define PTE_ADDR_MASK	0x000ffffffffff000ULL

#define SZ_2M		(2ULL << 20)
#define SZ_1G		(1ULL << 30)

#define SYS_FIXED_BYTES	(64ULL << 10)	/* null page, GDT, IDT, TSS, code */
#define VCPU_SYS_BYTES	(UKVM_PAGE_SIZE + UKVM_VCPU_STACK_BYTES)	/* args page and stack */
#define GDT_ENTRIES	5		/* null, code, data, TSS (two slots) */
#define IDT_VECTORS	32

/* x / unit rounded up, for any x: x + unit - 1 would wrap near UINT64_MAX. */
static uint64_t units_in(uint64_t x, uint64_t unit)
{
	return x / unit + (x % unit != 0);
}

/*
 * No sum here can wrap, whatever the arguments (ukvm_config_validate
 * bounds the region at 64 TiB anyway): tables is at most 2^44, so
 * tables * 4 KiB stays below 2^56, and vcpus * VCPU_SYS_BYTES below 2^47;
 * extra_bytes (the guest's access logs: 24 bytes per 4 KiB of a bounded
 * region) is below 2^43.
 */
uint64_t ukvm_vm_sys_size(uint32_t vcpus, uint64_t region_bytes, uint64_t extra_bytes)
{
	uint64_t tables, bytes;

	/* 4 KiB page tables for the region, plus the upper levels and slack. */
	tables = units_in(region_bytes, SZ_2M) + units_in(region_bytes, SZ_1G) + 2 + 16;
	bytes = SYS_FIXED_BYTES + (uint64_t)vcpus * VCPU_SYS_BYTES + tables * UKVM_PAGE_SIZE +
		extra_bytes;
	/* The 2 MiB identity map of the system memslot itself. */
	bytes += (units_in(bytes, SZ_1G) + 2) * UKVM_PAGE_SIZE;
	return units_in(bytes, SZ_2M) * SZ_2M;
}

static int vm_open_kvm(struct ukvm_vm *vm, struct ukvm_error *err)
{
	int version;

	vm->kvm_fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (vm->kvm_fd < 0) {
		int e = errno;

		if (e == ENOENT || e == ENXIO || e == ENODEV)
			ukvm_err_set_hint(err, UKVM_ERR_HOST, e, "open(/dev/kvm)",
					  "KVM is not available on this host: load the kvm_intel "
					  "or kvm_amd module and enable virtualization in firmware "
					  "(inside a VM: enable nested virtualization)");
		else if (e == EACCES || e == EPERM)
			ukvm_err_set_hint(err, UKVM_ERR_HOST, e, "open(/dev/kvm)",
					  "Run as root, or give this user read/write access to "
					  "/dev/kvm (usually by joining the 'kvm' group)");
		else
			return ukvm_err_set(err, UKVM_ERR_HOST, e, "open(/dev/kvm)");
		return -e;
	}
	version = ioctl(vm->kvm_fd, KVM_GET_API_VERSION, 0);
	if (version != KVM_API_VERSION)
		return ukvm_err_set(err, UKVM_ERR_HOST, version < 0 ? errno : 0,
				    "KVM_GET_API_VERSION returned %d, expected %d", version,
				    KVM_API_VERSION);
	vm->run_mmap_size = ioctl(vm->kvm_fd, KVM_GET_VCPU_MMAP_SIZE, 0);
	if (vm->run_mmap_size < (int)sizeof(struct kvm_run))
		return ukvm_err_set(err, UKVM_ERR_HOST, vm->run_mmap_size < 0 ? errno : 0,
				    "KVM_GET_VCPU_MMAP_SIZE returned %d, less than struct "
				    "kvm_run's %zu bytes", vm->run_mmap_size, sizeof(struct kvm_run));
	return 0;
}

static int vm_get_cpuid(struct ukvm_vm *vm, struct ukvm_error *err)
{
	uint32_t nent = 64, i;

	for (;;) {
		vm->cpuid = calloc(1, sizeof(*vm->cpuid) + nent * sizeof(vm->cpuid->entries[0]));
		if (!vm->cpuid)
			return ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating the CPUID table");
		vm->cpuid->nent = nent;
		if (ioctl(vm->kvm_fd, KVM_GET_SUPPORTED_CPUID, vm->cpuid) == 0)
			break;
		int e = errno;

		free(vm->cpuid);
		vm->cpuid = NULL;
		if (e != E2BIG || nent >= 4096)
			return ukvm_err_set(err, UKVM_ERR_HOST, e, "KVM_GET_SUPPORTED_CPUID");
		nent *= 2;
	}

	vm->phys_bits = 36;	/* what CPUs without leaf 0x80000008 have */
	for (i = 0; i < vm->cpuid->nent; i++) {
		struct kvm_cpuid_entry2 *e = &vm->cpuid->entries[i];

		if (e->function == 0x80000008 && (e->eax & 0xff))
			vm->phys_bits = e->eax & 0xff;
		if (e->function == 0x80000001)
			vm->gbpages = e->edx & (1U << 26);	/* pdpe1gb */
	}
	return 0;
}

int ukvm_vm_alloc(struct ukvm_vm *vm, uint64_t bytes, uint64_t *gpa, struct ukvm_error *err)
{
	uint64_t size = units_in(bytes, UKVM_PAGE_SIZE) * UKVM_PAGE_SIZE;

	if (size > vm->sys_size - vm->sys_next)
		return ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM,
				    "the guest's system memory (%llu bytes) is full: this is a "
				    "sizing bug in uffdkvm", (unsigned long long)vm->sys_size);
	*gpa = vm->sys_next;
	vm->sys_next += size;
	/* The memory is fresh anonymous memory: already zero. */
	return 0;
}

void *ukvm_vm_sys_hva(struct ukvm_vm *vm, uint64_t gpa)
{
	return vm->sys_hva + gpa;
}

int ukvm_vm_add_memslot(struct ukvm_vm *vm, uint64_t gpa, uint64_t size, void *hva,
			struct ukvm_error *err)
{
	struct kvm_userspace_memory_region region = {
		.slot = vm->nr_slots,
		.flags = 0,
		.guest_phys_addr = gpa,
		.memory_size = size,
		.userspace_addr = (uint64_t)(uintptr_t)hva,
	};

	int ret = ukvm_ioctl(vm->vm_fd, KVM_SET_USER_MEMORY_REGION, &region);

	if (ret) {
		ukvm_err_set(err, UKVM_ERR_RUN, -ret,
			     "KVM_SET_USER_MEMORY_REGION(slot %u, gpa 0x%llx, %llu bytes)",
			     region.slot, (unsigned long long)gpa, (unsigned long long)size);
		return ret;
	}
	vm->nr_slots++;
	return 0;
}

int ukvm_vm_add_gmem_memslot(struct ukvm_vm *vm, uint64_t gpa, uint64_t size, void *hva,
			     int gmem_fd, struct ukvm_error *err)
{
	struct ukvm_userspace_memory_region2 region = {
		.slot = vm->nr_slots,
		.flags = UKVM_MEM_GUEST_MEMFD,
		.guest_phys_addr = gpa,
		.memory_size = size,
		.userspace_addr = (uint64_t)(uintptr_t)hva,
		.guest_memfd_offset = 0,
		.guest_memfd = (uint32_t)gmem_fd,
	};

	int ret = ukvm_ioctl(vm->vm_fd, UKVM_SET_USER_MEMORY_REGION2, &region);

	if (ret) {
		ukvm_err_set(err, UKVM_ERR_HOST, -ret,
			     "KVM_SET_USER_MEMORY_REGION2(slot %u, KVM_MEM_GUEST_MEMFD, %llu bytes)",
			     region.slot, (unsigned long long)size);
		return ret;
	}
	vm->nr_slots++;
	return 0;
}

/* The table an entry points to, allocating it if the entry is empty. */
static int vm_next_table(struct ukvm_vm *vm, uint64_t *entry, uint64_t **table,
			 struct ukvm_error *err)
{
	uint64_t gpa = 0;	/* set unless ukvm_vm_alloc() fails, which gcc cannot see */
	int ret;

	if (!(*entry & PTE_PRESENT)) {
		ret = ukvm_vm_alloc(vm, UKVM_PAGE_SIZE, &gpa, err);
		if (ret)
			return ret;
		*entry = gpa | PTE_PRESENT | PTE_WRITE | PTE_ACCESSED;
	} else if (*entry & PTE_LARGE) {
		return ukvm_err_set(err, UKVM_ERR_RUN, EEXIST,
				    "guest page tables: a large page is already mapped here");
	}
	*table = ukvm_vm_sys_hva(vm, *entry & PTE_ADDR_MASK);
	return 0;
}

/* Maps one page of page_size (4 KiB, 2 MiB or 1 GiB) at gva = gpa. */
static int vm_map_page(struct ukvm_vm *vm, uint64_t gpa, uint64_t page_size,
		       struct ukvm_error *err)
{
	uint64_t *pml4 = ukvm_vm_sys_hva(vm, vm->pml4_gpa), *pdpt, *pd, *pt;
	uint64_t leaf = gpa | PTE_PRESENT | PTE_WRITE | PTE_ACCESSED | PTE_DIRTY;
	int ret;

	/* Consecutive 4 KiB pages share a page table: skip the walk. */
	if (page_size == UKVM_PAGE_SIZE && vm->pt_cache &&
	    vm->pt_cache_base == (gpa & ~(SZ_2M - 1))) {
		vm->pt_cache[(gpa >> 12) & 511] = leaf;
		return 0;
	}

	ret = vm_next_table(vm, &pml4[(gpa >> 39) & 511], &pdpt, err);
	if (ret)
		return ret;
	if (page_size == SZ_1G) {
		pdpt[(gpa >> 30) & 511] = leaf | PTE_LARGE;
		return 0;
	}
	ret = vm_next_table(vm, &pdpt[(gpa >> 30) & 511], &pd, err);
	if (ret)
		return ret;
	if (page_size == SZ_2M) {
		pd[(gpa >> 21) & 511] = leaf | PTE_LARGE;
		return 0;
	}
	ret = vm_next_table(vm, &pd[(gpa >> 21) & 511], &pt, err);
	if (ret)
		return ret;
	pt[(gpa >> 12) & 511] = leaf;
	vm->pt_cache = pt;
	vm->pt_cache_base = gpa & ~(SZ_2M - 1);
	return 0;
}

static int vm_map_range(struct ukvm_vm *vm, uint64_t gpa, uint64_t size, uint64_t page_size,
			struct ukvm_error *err)
{
	uint64_t off;
	int ret;

	for (off = 0; off < size; off += page_size) {
		ret = vm_map_page(vm, gpa + off, page_size, err);
		if (ret)
			return ret;
	}
	return 0;
}

uint64_t *ukvm_vm_leaf_pte(struct ukvm_vm *vm, uint64_t gva)
{
	uint64_t *table = ukvm_vm_sys_hva(vm, vm->pml4_gpa), *entry;
	int shift;

	for (shift = 39;; shift -= 9) {
		entry = &table[(gva >> shift) & 511];
		if (!(*entry & PTE_PRESENT))
			return NULL;
		if (shift == 12 || (*entry & PTE_LARGE))
			return entry;
		table = ukvm_vm_sys_hva(vm, *entry & PTE_ADDR_MASK);
	}
}

int ukvm_vm_map(struct ukvm_vm *vm, uint64_t gpa, uint64_t size, uint64_t page_size,
		struct ukvm_error *err)
{
	uint64_t limit;

	if ((gpa | size) & (page_size - 1))
		return ukvm_err_set(err, UKVM_ERR_RUN, EINVAL, "ukvm_vm_map: unaligned range");
	if (page_size == SZ_1G && !vm->gbpages)
		return ukvm_err_set(err, UKVM_ERR_HOST, 0,
				    "guest_page_size 1G: this KVM does not offer 1 GiB pages to "
				    "guests (CPUID pdpe1gb is not in KVM_GET_SUPPORTED_CPUID); use "
				    "2M or 4K");
	limit = 1ULL << (vm->phys_bits < 48 ? vm->phys_bits : 48);
	/* Compared without gpa + size, which could wrap. */
	if (size > limit || gpa > limit - size)
		return ukvm_err_set(err, UKVM_ERR_HOST, 0,
				    "the test region of %llu bytes at guest physical 0x%llx ends "
				    "beyond what this CPU can address (%u bits): use less memory",
				    (unsigned long long)size, (unsigned long long)gpa, vm->phys_bits);
	return vm_map_range(vm, gpa, size, page_size, err);
}

static uint64_t gdt_segment(uint64_t type, uint64_t flags)
{
	/* Base 0, limit 0xfffff; flags are the G/DB/L nibble. */
	return 0xffffULL | (type << 40) | (1ULL << 44) | (1ULL << 47) | (0xfULL << 48) |
	       (flags << 52);
}

static int vm_build_system(struct ukvm_vm *vm, struct ukvm_error *err)
{
	uint64_t code_size = (uint64_t)(ukvm_guest_code_end - ukvm_guest_code_start);
	uint64_t *gdt, base, code, i;
	uint8_t *idt;
	int ret;

	vm->sys_next = UKVM_PAGE_SIZE;	/* leave GPA 0 unused: null stays null */
	ret = ukvm_vm_alloc(vm, UKVM_PAGE_SIZE, &vm->pml4_gpa, err);
	ret = ret ?: ukvm_vm_alloc(vm, UKVM_PAGE_SIZE, &vm->gdt_gpa, err);
	ret = ret ?: ukvm_vm_alloc(vm, UKVM_PAGE_SIZE, &vm->idt_gpa, err);
	ret = ret ?: ukvm_vm_alloc(vm, UKVM_PAGE_SIZE, &vm->tss_gpa, err);
	ret = ret ?: ukvm_vm_alloc(vm, code_size, &vm->code_gpa, err);
	if (ret)
		return ret;

	memcpy(ukvm_vm_sys_hva(vm, vm->code_gpa), ukvm_guest_code_start, code_size);

	gdt = ukvm_vm_sys_hva(vm, vm->gdt_gpa);
	gdt[UKVM_GDT_CODE / 8] = gdt_segment(0xb, 0xa);	/* exec/read, G + L */
	gdt[UKVM_GDT_DATA / 8] = gdt_segment(0x3, 0xc);	/* read/write, G + DB */
	base = vm->tss_gpa;
	gdt[UKVM_GDT_TSS / 8] = 0x67 | ((base & 0xffffff) << 16) | (0xbULL << 40) |
				(1ULL << 47) | ((base >> 24 & 0xff) << 56);
	gdt[UKVM_GDT_TSS / 8 + 1] = base >> 32;

	/* 64-bit interrupt gates to the exception stubs of guest.S. */
	idt = ukvm_vm_sys_hva(vm, vm->idt_gpa);
	for (i = 0; i < IDT_VECTORS; i++) {
		uint64_t *gate = (uint64_t *)(idt + i * 16);

		code = vm->code_gpa + ukvm_guest_exception_offsets[i];
		gate[0] = (code & 0xffff) | ((uint64_t)UKVM_GDT_CODE << 16) |
			  (0x8eULL << 40) | ((code >> 16 & 0xffff) << 48);
		gate[1] = code >> 32;
	}

	/* Identity-map all of system memory with 2 MiB pages. */
	return vm_map_range(vm, 0, vm->sys_size, SZ_2M, err);
}

void ukvm_vm_init(struct ukvm_vm *vm)
{
	memset(vm, 0, sizeof(*vm));
	vm->kvm_fd = vm->vm_fd = -1;
}

int ukvm_vm_open(struct ukvm_vm *vm, struct ukvm_error *err)
{
	int ret;

	ukvm_vm_init(vm);
	ret = vm_open_kvm(vm, err);
	if (ret) {
		ukvm_vm_destroy(vm);
		return ret;
	}
	/* The system ioctl: what any VM of this host may have (KVM_MAX_VCPUS). */
	ret = ioctl(vm->kvm_fd, KVM_CHECK_EXTENSION, KVM_CAP_MAX_VCPUS);
	if (ret <= 0)
		ret = ioctl(vm->kvm_fd, KVM_CHECK_EXTENSION, KVM_CAP_NR_VCPUS);
	vm->max_vcpus = ret > 0 ? (uint32_t)ret : 1;
	return 0;
}

void ukvm_vm_check_cap(const struct ukvm_vm *vm, long cap, int *on_dev_kvm, int *on_vm)
{
	int r;

	r = vm->kvm_fd < 0 ? -1 : ioctl(vm->kvm_fd, KVM_CHECK_EXTENSION, cap);
	*on_dev_kvm = r < 0 ? 0 : r;
	r = vm->vm_fd < 0 ? -1 : ioctl(vm->vm_fd, KVM_CHECK_EXTENSION, cap);
	*on_vm = r < 0 ? 0 : r;
}

int ukvm_vm_create(struct ukvm_vm *vm, uint64_t sys_size, struct ukvm_error *err)
{
	int ret;

	if (vm->kvm_fd < 0) {
		ret = ukvm_vm_open(vm, err);
		if (ret)
			return ret;
	}
	/*
	 * KVM_CREATE_VM can fail with EINTR when a signal is pending (the MMU
	 * notifier's registration takes every lock of the mm, giving up on a
	 * signal); CI saw it once in a host-facts probe. A few tries, then the
	 * error: a Ctrl-C is still seen by the caller.
	 */
	for (int tries = 0; tries < 8; tries++) {
		vm->vm_fd = ioctl(vm->kvm_fd, KVM_CREATE_VM, 0);
		if (vm->vm_fd >= 0 || errno != EINTR)
			break;
	}
	if (vm->vm_fd < 0) {
		ret = -errno;
		ukvm_err_set(err, UKVM_ERR_HOST, -ret, "KVM_CREATE_VM");
		goto error;
	}

	ret = vm_get_cpuid(vm, err);
	if (ret)
		goto error;

	vm->sys_size = sys_size;
	vm->sys_hva = mmap(NULL, sys_size, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (vm->sys_hva == MAP_FAILED) {
		vm->sys_hva = NULL;
		ret = -errno;
		ukvm_err_set(err, UKVM_ERR_RUN, -ret, "mmap(system memory, %llu bytes)",
			     (unsigned long long)sys_size);
		goto error;
	}
	ret = ukvm_vm_add_memslot(vm, 0, sys_size, vm->sys_hva, err);
	if (ret)
		goto error;
	ret = vm_build_system(vm, err);
	if (ret)
		goto error;
	return 0;

error:
	ukvm_vm_destroy(vm);
	return ret;
}

void ukvm_vm_destroy(struct ukvm_vm *vm)
{
	if (vm->vm_fd >= 0)
		close(vm->vm_fd);
	if (vm->kvm_fd >= 0)
		close(vm->kvm_fd);
	if (vm->sys_hva)
		munmap(vm->sys_hva, vm->sys_size);
	free(vm->cpuid);
	ukvm_vm_init(vm);
}
