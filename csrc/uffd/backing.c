/* SPDX-License-Identifier: MIT */
/*
 * The memory behind the test region, one kind per enum ukvm_backing.
 *
 *   anonymous              private anonymous, THP off (MADV_NOHUGEPAGE): every
 *                          fault is a 4 KiB fault, as in upstream's default
 *   anonymous_thp          private anonymous, 2 MiB aligned, MADV_HUGEPAGE
 *   anonymous_hugetlb[_1gb] private MAP_HUGETLB, 2 MiB or 1 GiB pages
 *   shmem                  a memfd mapped twice: the guest's mapping, and an
 *                          alias that fills the page cache before a MINOR run
 *                          without mapping a page in the guest's mapping
 *   shared_hugetlb         the same with a hugetlbfs memfd (2 MiB)
 *   guest_memfd            KVM_CREATE_GUEST_MEMFD with GUEST_MEMFD_FLAG_MMAP,
 *                          mapped twice; the memslot points at the fd itself
 *
 * Hugetlb pages must be reserved beforehand; ukvm_backing_check_host() says how
 * many, before anything is built.
 */
#include <errno.h>
#include <linux/memfd.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/util.h"
#include "uffd/backing.h"
#include "uapi_compat.h"

#define SZ_2M	(2ULL << 20)

/* Each backing's page size and kind are the schema's (uffdkvm/schema/fields.py, BACKINGS). */
static const struct backing_kind {
	uint64_t page_size;	/* its faults are resolved at this size */
	bool shared;		/* a page cache: MINOR faults, an alias mapping */
	bool hugetlb;		/* hugetlbfs pages, of the backing's page size */
	bool private_anonymous;	/* no file behind it: UFFDIO_MOVE moves pages into it */
	bool wp;		/* uffd_mode wp runs on it */
} kinds[UKVM_BACKING__COUNT] = {
#define B(backing, bytes, shared, hugetlb, private_anonymous, wp, migrates) \
	[backing] = { (bytes), (shared), (hugetlb), (private_anonymous), (wp) },
	UKVM_BACKINGS(B)
#undef B
};

/* log2 of a hugetlb backing's page size (for MAP_HUGE_* and MFD_HUGE_*), 0 if none. */
static unsigned hugetlb_shift(enum ukvm_backing b)
{
	return kinds[b].hugetlb ? (unsigned)__builtin_ctzll(kinds[b].page_size) : 0;
}

uint64_t ukvm_backing_page_size(enum ukvm_backing b)
{
	return (unsigned)b < UKVM_BACKING__COUNT ? kinds[b].page_size : UKVM_PAGE_SIZE;
}

bool ukvm_backing_is_shared(enum ukvm_backing b)
{
	return (unsigned)b < UKVM_BACKING__COUNT && kinds[b].shared;
}

bool ukvm_backing_is_hugetlb(enum ukvm_backing b)
{
	return (unsigned)b < UKVM_BACKING__COUNT && kinds[b].hugetlb;
}

bool ukvm_backing_is_private_anonymous(enum ukvm_backing b)
{
	return (unsigned)b < UKVM_BACKING__COUNT && kinds[b].private_anonymous;
}

bool ukvm_backing_takes_wp(enum ukvm_backing b)
{
	return (unsigned)b < UKVM_BACKING__COUNT && kinds[b].wp;
}

void ukvm_backing_init(struct ukvm_backing_mem *b)
{
	memset(b, 0, sizeof(*b));
	b->memfd = -1;
}

/* The number a /sys file holds: 0, or -errno (-EINVAL: not a number). */
static int read_long(const char *path, long *v)
{
	FILE *f = fopen(path, "re");
	int ret = 0;

	if (!f)
		return -errno;
	if (fscanf(f, "%ld", v) != 1)
		ret = -EINVAL;
	fclose(f);
	return ret;
}

int ukvm_backing_check_host(enum ukvm_backing kind, uint64_t size, struct ukvm_error *err)
{
	uint64_t page = ukvm_backing_page_size(kind), needed = size / page;
	char dir[96], path[160];
	long nr, free_pages, resv = 0, available;
	int ret;

	if (!ukvm_backing_is_hugetlb(kind))
		return 0;
	snprintf(dir, sizeof(dir), "/sys/kernel/mm/hugepages/hugepages-%llukB",
		 (unsigned long long)(page >> 10));
	snprintf(path, sizeof(path), "%s/nr_hugepages", dir);
	ret = read_long(path, &nr);
	snprintf(path, sizeof(path), "%s/free_hugepages", dir);
	ret = ret ?: read_long(path, &free_pages);
	snprintf(path, sizeof(path), "%s/resv_hugepages", dir);
	if (read_long(path, &resv))
		resv = 0;	/* no reservations to count */
	if (ret) {
		ukvm_err_set(err, UKVM_ERR_HOST, 0,
			     "backing %s needs %llu MiB huge pages, which this kernel does "
			     "not offer (no %s)", ukvm_backing_name(kind),
			     (unsigned long long)(page >> 20), dir);
		return -EOPNOTSUPP;
	}
	available = free_pages - (resv > 0 ? resv : 0);
	if (available < 0)
		available = 0;
	if ((uint64_t)available >= needed)
		return 0;
	ukvm_err_set(err, UKVM_ERR_HOST, 0,
		     "backing %s needs %llu free huge pages of %llu MiB for its %llu MiB, and only "
		     "%ld are free (the pool holds %ld). As root, grow the pool with: echo "
		     "%llu > %s/nr_hugepages%s",
		     ukvm_backing_name(kind), (unsigned long long)needed,
		     (unsigned long long)(page >> 20), (unsigned long long)(size >> 20),
		     available, nr, (unsigned long long)(nr + (long)needed - available), dir,
		     page == SZ_2M ? " (or sysctl vm.nr_hugepages)" : "");
	return -ENOMEM;
}

static int backing_map(struct ukvm_backing_mem *b, int flags, int fd, uint8_t **out,
		       const char *what, struct ukvm_error *err)
{
	void *p = mmap(NULL, b->size, PROT_READ | PROT_WRITE, flags, fd, 0);

	if (p == MAP_FAILED) {
		int e = errno;

		if (e == ENOMEM && ukvm_backing_is_hugetlb(b->kind))
			ukvm_err_set_hint(err, UKVM_ERR_HOST, e, what,
					  "Not enough free huge pages: reserve more in "
					  "/sys/kernel/mm/hugepages");
		else
			ukvm_err_set(err, e == ENOMEM ? UKVM_ERR_HOST : UKVM_ERR_RUN, e,
				     "mmap(%s, %llu bytes)", what, (unsigned long long)b->size);
		return -e;
	}
	*out = p;
	return 0;
}

/* Private anonymous memory aligned to its (transparent) huge page size. */
static int backing_map_thp(struct ukvm_backing_mem *b, struct ukvm_error *err)
{
	uint64_t slack = SZ_2M, head;
	uint8_t *p;

	p = mmap(NULL, b->size + slack, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED) {
		int e = errno;

		ukvm_err_set(err, UKVM_ERR_HOST, e, "mmap(anonymous_thp guest memory)");
		return -e;
	}
	head = ALIGN_UP((uint64_t)(uintptr_t)p, SZ_2M) - (uint64_t)(uintptr_t)p;
	if (head)
		munmap(p, head);
	if (slack - head)
		munmap(p + head + b->size, slack - head);
	b->hva = p + head;
	if (madvise(b->hva, b->size, MADV_HUGEPAGE)) {
		int e = errno;

		ukvm_err_set_hint(err, UKVM_ERR_HOST, e, "madvise(MADV_HUGEPAGE)",
				  "Transparent huge pages are off in this kernel");
		return -e;
	}
	return 0;
}

/*
 * KVM_CAP_GUEST_MEMFD (virt/kvm/kvm_main.c, kvm_vm_ioctl_check_extension_generic):
 * from Linux 6.8 to 6.17 it is "!kvm || kvm_arch_has_private_mem(kvm)", so
 * /dev/kvm (no VM) says 1 wherever KVM was built with private memory, and a
 * VM says 1 only if its type has private memory: on x86
 * KVM_X86_SW_PROTECTED_VM and the vendors' confidential types (SEV-SNP;
 * TDX from 6.16), never KVM_X86_DEFAULT_VM, the type uffdkvm creates (and
 * the only one whose memory the host may read and userfaultfd may page).
 * From Linux 6.18 it is 1 for every VM, and KVM_CAP_GUEST_MEMFD_FLAGS says
 * what a default VM's guest_memfd can do (GUEST_MEMFD_FLAG_MMAP).
 */
int ukvm_backing_gmem_check(int on_dev_kvm, int on_vm, struct ukvm_error *err)
{
	if (on_vm > 0)
		return 0;
	if (on_dev_kvm > 0)
		ukvm_err_set(err, UKVM_ERR_HOST, 0,
			     "backing guest_memfd: KVM_CAP_GUEST_MEMFD is %d on /dev/kvm but %d on "
			     "the VM type uffdkvm creates (KVM_X86_DEFAULT_VM): this KVM offers "
			     "guest_memfd only to VM types with private memory "
			     "(KVM_X86_SW_PROTECTED_VM, SEV-SNP, TDX), as x86 KVM does from Linux "
			     "6.8 to 6.17; a default VM has an mmap-able guest_memfd from Linux "
			     "6.18", on_dev_kvm, on_vm);
	else
		ukvm_err_set(err, UKVM_ERR_HOST, 0,
			     "backing guest_memfd: KVM_CAP_GUEST_MEMFD is %d on /dev/kvm and %d on "
			     "the VM type uffdkvm creates (KVM_X86_DEFAULT_VM): this KVM has no "
			     "guest_memfd (Linux 6.8+ built with CONFIG_KVM_PRIVATE_MEM); a default "
			     "VM has an mmap-able guest_memfd from Linux 6.18", on_dev_kvm, on_vm);
	return -EOPNOTSUPP;
}

static int backing_create_gmem(struct ukvm_backing_mem *b, int vm_fd, struct ukvm_error *err)
{
	struct ukvm_create_guest_memfd gmem = { .size = b->size };
	int caps, e;

	caps = ioctl(vm_fd, KVM_CHECK_EXTENSION, UKVM_CAP_GUEST_MEMFD_FLAGS);
	if (caps <= 0 || !(caps & UKVM_GUEST_MEMFD_FLAG_MMAP)) {
		ukvm_err_set(err, UKVM_ERR_HOST, 0,
			     "backing guest_memfd: this KVM cannot mmap guest_memfd "
			     "(KVM_CAP_GUEST_MEMFD_FLAGS lacks GUEST_MEMFD_FLAG_MMAP; Linux "
			     "6.18+), so the host cannot fill or check it");
		return -EOPNOTSUPP;
	}
	gmem.flags = UKVM_GUEST_MEMFD_FLAG_MMAP;
	if (caps & UKVM_GUEST_MEMFD_FLAG_INIT_SHARED)
		gmem.flags |= UKVM_GUEST_MEMFD_FLAG_INIT_SHARED;
	b->memfd = ioctl(vm_fd, UKVM_CREATE_GUEST_MEMFD, &gmem);
	if (b->memfd < 0) {
		e = errno;
		ukvm_err_set(err, UKVM_ERR_HOST, e, "KVM_CREATE_GUEST_MEMFD(%llu bytes, flags 0x%llx)",
			     (unsigned long long)b->size, (unsigned long long)gmem.flags);
		return -e;
	}
	return 0;
}

int ukvm_backing_create(struct ukvm_backing_mem *b, enum ukvm_backing kind, uint64_t size,
			int vm_fd, struct ukvm_error *err)
{
	unsigned shift = hugetlb_shift(kind);
	int huge = shift ? MAP_HUGETLB | (int)(shift << MAP_HUGE_SHIFT) : 0;
	int ret;

	ukvm_backing_init(b);
	b->kind = kind;
	b->size = size;
	b->page_size = kinds[kind].page_size;

	switch (kind) {
	case UKVM_BACKING_ANONYMOUS:
		ret = backing_map(b, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, &b->hva,
			      "anonymous guest memory", err);
		if (!ret && madvise(b->hva, size, MADV_NOHUGEPAGE)) {
			ret = -errno;
			ukvm_err_set(err, UKVM_ERR_HOST, -ret, "madvise(MADV_NOHUGEPAGE)");
		}
		break;
	case UKVM_BACKING_ANONYMOUS_THP:
		ret = backing_map_thp(b, err);
		break;
	case UKVM_BACKING_ANONYMOUS_HUGETLB:
	case UKVM_BACKING_ANONYMOUS_HUGETLB_1GB:
		/* No MAP_NORESERVE: a shortage must fail here, not as SIGBUS later. */
		ret = backing_map(b, MAP_PRIVATE | MAP_ANONYMOUS | huge, -1, &b->hva,
			      "hugetlb guest memory", err);
		break;
	case UKVM_BACKING_SHMEM:
	case UKVM_BACKING_SHARED_HUGETLB:
		b->memfd = memfd_create("uffdkvm-guest", MFD_CLOEXEC | (shift ? MFD_HUGETLB |
					(int)(shift << MFD_HUGE_SHIFT) : 0));
		if (b->memfd < 0) {
			ret = -errno;
			ukvm_err_set(err, UKVM_ERR_HOST, -ret, "memfd_create(%s)",
				     ukvm_backing_name(kind));
			break;
		}
		if (ftruncate(b->memfd, (off_t)size)) {
			ret = -errno;
			ukvm_err_set(err, UKVM_ERR_HOST, -ret, "ftruncate(memfd, %llu)",
				     (unsigned long long)size);
			break;
		}
		/* then map the fd twice, as for a guest_memfd */
		__attribute__((fallthrough));
	case UKVM_BACKING_GUEST_MEMFD:
		if (kind == UKVM_BACKING_GUEST_MEMFD) {
			ret = backing_create_gmem(b, vm_fd, err);
			if (ret)
				break;
		}
		ret = backing_map(b, MAP_SHARED, b->memfd, &b->hva, "the guest's mapping", err);
		ret = ret ?: backing_map(b, MAP_SHARED, b->memfd, &b->alias, "the alias mapping", err);
		break;
	default:
		ret = -EINVAL;
		ukvm_err_set(err, UKVM_ERR_CONFIG, 0, "backing: unknown backing %d", kind);
	}
	if (ret)
		ukvm_backing_destroy(b);
	return ret;
}

void ukvm_backing_destroy(struct ukvm_backing_mem *b)
{
	if (b->hva)
		munmap(b->hva, b->size);
	if (b->alias)
		munmap(b->alias, b->size);
	if (b->memfd >= 0)
		close(b->memfd);
	ukvm_backing_init(b);
}
