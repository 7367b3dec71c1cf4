/* SPDX-License-Identifier: MIT */
/*
 * The memory behind the test region.
 *
 *   anonymous  private anonymous memory with THP off (MADV_NOHUGEPAGE), so
 *              every fault is a 4 KiB fault, as in upstream's default.
 *   shmem      a memfd mapped twice: the guest's mapping, and an alias that
 *              fills the page cache before a MINOR run without mapping a
 *              single page in the guest's mapping (so each guest access
 *              still takes a minor fault).
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

bool ukvm_backing_is_shared(enum ukvm_backing kind)
{
	return kind == UKVM_BACKING_SHMEM;
}

void ukvm_mem_init(struct ukvm_mem *b)
{
	memset(b, 0, sizeof(*b));
	b->memfd = -1;
}

static int backing_map(struct ukvm_mem *b, int flags, int fd, uint8_t **out,
		       const char *what, struct ukvm_error *err)
{
	void *p = mmap(NULL, b->size, PROT_READ | PROT_WRITE, flags, fd, 0);

	if (p == MAP_FAILED) {
		int e = errno;

		ukvm_err_set(err, e == ENOMEM ? UKVM_ERR_HOST : UKVM_ERR_RUN, e,
			     "mmap(%s, %llu bytes)", what, (unsigned long long)b->size);
		return -e;
	}
	*out = p;
	return 0;
}

int ukvm_mem_create(struct ukvm_mem *b, enum ukvm_backing kind, uint64_t size,
			struct ukvm_error *err)
{
	int ret;

	ukvm_mem_init(b);
	b->kind = kind;
	b->size = size;
	b->page_size = UKVM_PAGE_SIZE;

	switch (kind) {
	case UKVM_BACKING_ANONYMOUS:
		ret = backing_map(b, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, &b->hva,
				  "anonymous guest memory", err);
		if (ret)
			goto error;
		if (madvise(b->hva, size, MADV_NOHUGEPAGE)) {
			ret = -errno;
			ukvm_err_set(err, UKVM_ERR_HOST, -ret, "madvise(MADV_NOHUGEPAGE)");
			goto error;
		}
		return 0;

	case UKVM_BACKING_SHMEM:
		b->memfd = memfd_create("uffdkvm-guest", MFD_CLOEXEC);
		if (b->memfd < 0) {
			ret = -errno;
			ukvm_err_set(err, UKVM_ERR_HOST, -ret, "memfd_create");
			goto error;
		}
		if (ftruncate(b->memfd, (off_t)size)) {
			ret = -errno;
			ukvm_err_set(err, UKVM_ERR_RUN, -ret, "ftruncate(memfd, %llu)",
				     (unsigned long long)size);
			goto error;
		}
		ret = backing_map(b, MAP_SHARED, b->memfd, &b->hva, "shmem guest mapping", err);
		ret = ret ?: backing_map(b, MAP_SHARED, b->memfd, &b->alias,
					 "shmem alias mapping", err);
		if (ret)
			goto error;
		return 0;

	default:
		ret = -EINVAL;
		ukvm_err_set(err, UKVM_ERR_CONFIG, 0, "backing: unknown backing %d", kind);
		goto error;
	}

error:
	ukvm_mem_destroy(b);
	return ret;
}

void ukvm_mem_destroy(struct ukvm_mem *b)
{
	if (b->hva)
		munmap(b->hva, b->size);
	if (b->alias)
		munmap(b->alias, b->size);
	if (b->memfd >= 0)
		close(b->memfd);
	ukvm_mem_init(b);
}
