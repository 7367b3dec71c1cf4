/* SPDX-License-Identifier: MIT */
/*
 * wp_async's dirty tracking: with UFFD_FEATURE_WP_ASYNC the kernel clears a
 * page's uffd-wp bit itself on the first write, and PAGEMAP_SCAN on
 * /proc/self/pagemap (Linux 6.7+) reports the pages whose bit is clear, as
 * CRIU and the selftests do.
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

int ukvm_pagemap_written(uint64_t addr, uint64_t len, uint8_t *written, struct ukvm_error *err)
{
	struct page_region vec[SCAN_REGIONS];
	uint64_t start = addr, end = addr + len, p;
	int fd, n, i, ret = 0;

	memset(written, 0, len / UKVM_PAGE_SIZE);
	fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		ukvm_err_set(err, UKVM_ERR_HOST, -ret, "open(/proc/self/pagemap)");
		return ret;
	}
	while (start < end) {
		struct pm_scan_arg arg = {
			.size = sizeof(arg),
			.start = start,
			.end = end,
			.vec = (uint64_t)(uintptr_t)vec,
			.vec_len = SCAN_REGIONS,
			.category_mask = PAGE_IS_WRITTEN,
			.return_mask = PAGE_IS_WRITTEN,
		};

		n = ioctl(fd, PAGEMAP_SCAN, &arg);
		if (n < 0) {
			ret = -errno;
			ukvm_err_set_hint(err, ret == -ENOTTY || ret == -EINVAL ? UKVM_ERR_HOST
					  : UKVM_ERR_RUN, -ret, "ioctl(/proc/self/pagemap, PAGEMAP_SCAN)",
					  "wp_async collects the written pages with PAGEMAP_SCAN "
					  "(Linux 6.7+)");
			break;
		}
		for (i = 0; i < n; i++)
			for (p = vec[i].start; p < vec[i].end && p < end; p += UKVM_PAGE_SIZE)
				if (p >= addr)
					written[(p - addr) / UKVM_PAGE_SIZE] = 1;
		/* The kernel stops early when vec fills; it always moves on. */
		if (arg.walk_end <= start) {
			ret = -EIO;
			ukvm_err_set(err, UKVM_ERR_RUN, EIO, "PAGEMAP_SCAN made no progress at 0x%llx",
				     (unsigned long long)start);
			break;
		}
		start = arg.walk_end;
	}
	close(fd);
	return ret;
}
