/* SPDX-License-Identifier: MIT */
/*
 * What the SIGBUS guard (csrc/base/mapguard.c) adds to a copy from a mapped
 * file, source_read="mmap"'s fetch: blocks of copies of LEN bytes from a
 * warm 4 MiB mapping, with memcpy and with ukvm_mapguard_copy in turns
 * (which goes first alternates), and the median of the blocks' ratios with
 * its 95% interval (order statistics). Beside them, the median of the same
 * copies made by the kernel (process_vm_readv on this process, where a page
 * past the file's end is EFAULT, not SIGBUS): the path the guard was chosen
 * over.
 *
 *   cc -O2 -Icsrc -o /tmp/mapguard_cost benchmarks/mapguard_cost.c csrc/base/mapguard.c -pthread -lm
 *   /tmp/mapguard_cost 4096 400; /tmp/mapguard_cost 2097152 400
 */
#define _GNU_SOURCE	/* process_vm_readv */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "base/mapguard.h"

#define SIZE	(4UL << 20)

static double now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	char path[] = "/var/tmp/mapguard-cost-XXXXXX";
	size_t len = argc > 1 ? strtoul(argv[1], NULL, 0) : 4096, o;
	int blocks = argc > 2 ? atoi(argv[2]) : 400, k, half, fd, lo, hi;
	double *ratio, *plain, *guarded, *kernel;
	const char *map;
	char *buf, *dst;

	if (!len || len > SIZE || SIZE % len || blocks < 4)
		return fprintf(stderr, "usage: %s LEN (dividing 4 MiB) BLOCKS (>= 4)\n", argv[0]), 2;
	fd = mkstemp(path);
	buf = malloc(SIZE);
	dst = aligned_alloc(4096, len);
	ratio = calloc(blocks, sizeof(double));
	plain = calloc(blocks, sizeof(double));
	guarded = calloc(blocks, sizeof(double));
	kernel = calloc(blocks, sizeof(double));
	if (fd < 0 || !buf || !dst || !ratio || !plain || !guarded || !kernel)
		return perror("setup"), 1;
	unlink(path);
	memset(buf, 7, SIZE);
	if (pwrite(fd, buf, SIZE, 0) != (ssize_t)SIZE)
		return perror("pwrite"), 1;
	map = mmap(NULL, SIZE, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
	if (map == MAP_FAILED || ukvm_mapguard_hold())
		return perror("mmap"), 1;
	for (k = 0; k < blocks; k++) {
		for (half = 0; half < 2; half++) {
			int g = (k + half) & 1;
			double t0 = now_ns();

			for (o = 0; o < SIZE; o += len) {
				if (g ? ukvm_mapguard_copy(dst, map + o, len) :
				    (memcpy(dst, map + o, len), 0))
					return fprintf(stderr, "a copy failed\n"), 1;
				__asm__ volatile("" : : "r"(dst) : "memory");
			}
			(g ? guarded : plain)[k] = (now_ns() - t0) / (SIZE / len);
		}
		ratio[k] = guarded[k] / plain[k];
		{
			double t0 = now_ns();

			for (o = 0; o < SIZE; o += len) {
				struct iovec local = { dst, len }, remote = { (void *)(map + o), len };

				if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != (ssize_t)len)
					return perror("process_vm_readv"), 1;
			}
			kernel[k] = (now_ns() - t0) / (SIZE / len);
		}
	}
	qsort(ratio, blocks, sizeof(double), cmp);
	qsort(plain, blocks, sizeof(double), cmp);
	qsort(guarded, blocks, sizeof(double), cmp);
	qsort(kernel, blocks, sizeof(double), cmp);
	lo = blocks / 2 - (int)(0.98 * sqrt(blocks));
	hi = blocks / 2 + (int)(0.98 * sqrt(blocks));
	printf("%zu bytes: memcpy %.1f ns, guarded %.1f ns, process_vm_readv %.1f ns (medians); "
	       "guarded/memcpy %.3f [%.3f, %.3f] (%d blocks of %zu copies)\n", len,
	       plain[blocks / 2], guarded[blocks / 2], kernel[blocks / 2], ratio[blocks / 2],
	       ratio[lo], ratio[hi], blocks, SIZE / len);
	ukvm_mapguard_release();
	return 0;
}
