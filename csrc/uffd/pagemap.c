/* SPDX-License-Identifier: MIT */
/*
 * The pages written under userfaultfd's WP_ASYNC: with
 * UFFD_FEATURE_WP_ASYNC the kernel clears a page's uffd-wp bit itself on
 * the first write, and PAGEMAP_SCAN on /proc/self/pagemap (Linux 6.7+)
 * reports the pages whose bit is clear, as CRIU and the selftests do; with
 * PM_SCAN_WP_MATCHING it write-protects the pages it reports in the same
 * walk (dirty_tracking wp_async's harvest and re-protect in one call).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>	/* PAGEMAP_SCAN where the headers have it; else uapi_compat.h */
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/util.h"
#include "uapi_compat.h"
#include "uffd/pagemap.h"

#define SCAN_REGIONS	256	/* page_region entries per ioctl: runs of written pages */

int ukvm_pagemap_open(struct ukvm_error *err)
{
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return ukvm_err_set(err, UKVM_ERR_HOST, errno, "open(/proc/self/pagemap)");
	return fd;
}

/*
 * The written pages of [addr, addr + len) into written[] (a byte a page)
 * or bitmap (a bit a page), whichever is given; flags: PAGEMAP_SCAN's.
 */
static int pagemap_scan(int fd, uint64_t addr, uint64_t len, uint64_t flags, uint8_t *written,
			uint64_t *bitmap, struct ukvm_error *err)
{
	struct page_region vec[SCAN_REGIONS];
	uint64_t start = addr, end = addr + len, p, page;
	int n, i;

	while (start < end) {
		struct pm_scan_arg arg = {
			.size = sizeof(arg),
			.flags = flags,
			.start = start,
			.end = end,
			.vec = (uint64_t)(uintptr_t)vec,
			.vec_len = SCAN_REGIONS,
			.category_mask = PAGE_IS_WRITTEN,
			.return_mask = PAGE_IS_WRITTEN,
		};

		n = ioctl(fd, PAGEMAP_SCAN, &arg);
		if (n < 0) {
			int ret = -errno;

			return ukvm_err_set_hint(err, ret == -ENOTTY || ret == -EINVAL ?
						 UKVM_ERR_HOST : UKVM_ERR_RUN, -ret,
						 "ioctl(/proc/self/pagemap, PAGEMAP_SCAN)",
						 "wp_async collects the written pages with "
						 "PAGEMAP_SCAN (Linux 6.7+)");
		}
		for (i = 0; i < n; i++)
			for (p = vec[i].start; p < vec[i].end && p < end; p += UKVM_PAGE_SIZE) {
				if (p < addr)
					continue;
				page = (p - addr) / UKVM_PAGE_SIZE;
				if (written)
					written[page] = 1;
				else
					bitmap[page / 64] |= 1ULL << (page % 64);
			}
		/* The kernel stops early when vec fills; it always moves on. */
		if (arg.walk_end <= start)
			return ukvm_err_set(err, UKVM_ERR_RUN, EIO, "PAGEMAP_SCAN made no progress "
					    "at 0x%llx", (unsigned long long)start);
		start = arg.walk_end;
	}
	return 0;
}

int ukvm_pagemap_written(uint64_t addr, uint64_t len, uint8_t *written, struct ukvm_error *err)
{
	int fd, ret;

	memset(written, 0, len / UKVM_PAGE_SIZE);
	fd = ukvm_pagemap_open(err);
	if (fd < 0)
		return fd;
	ret = pagemap_scan(fd, addr, len, 0, written, NULL, err);
	close(fd);
	return ret;
}

int ukvm_pagemap_harvest(int fd, uint64_t addr, uint64_t len, uint64_t *bitmap, bool protect,
			 struct ukvm_error *err)
{
	return pagemap_scan(fd, addr, len, protect ? PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC
					       : 0, NULL, bitmap, err);
}
