/* SPDX-License-Identifier: MIT */
/*
 * The helpers every layer uses: sizes, clocks, sleeping, EINTR-safe ioctls,
 * cheap per-thread random numbers. Nothing here knows about KVM or
 * userfaultfd.
 */
#ifndef UKVM_BASE_UTIL_H
#define UKVM_BASE_UTIL_H

#include <stdint.h>
#include <time.h>

#define UKVM_PAGE_SIZE		4096ULL
#define UKVM_CACHELINE		64
#define ALIGN_UP(x, a)		(((x) + (a) - 1) / (a) * (a))
#define ARRAY_SIZE(a)		(sizeof(a) / sizeof((a)[0]))
#define NSEC_PER_SEC		1000000000ULL
#define NSEC_PER_MSEC		1000000ULL
#define NSEC_PER_USEC		1000ULL

/* CLOCK_MONOTONIC, in nanoseconds. */
uint64_t ukvm_now_ns(void);
/* Sleeps ns on CLOCK_MONOTONIC; a kick (EINTR) ends it early. */
void ukvm_sleep_ns(uint64_t ns);
/* now + timeout_ns, saturating: a timeout of "forever" must not wrap around. */
uint64_t ukvm_deadline_after(uint64_t timeout_ns);
/* A CLOCK_MONOTONIC deadline as the timespec pthread_cond_timedwait() takes. */
void ukvm_timespec(struct timespec *ts, uint64_t deadline_ns);
/* An ioctl that retries on EINTR: its result (>= 0), or -errno. */
int ukvm_ioctl(int fd, unsigned long req, void *arg);

/* splitmix64: seeds and cheap per-thread random numbers, no shared state. */
static inline uint64_t ukvm_splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* A uniform double in [0, 1). */
static inline double ukvm_random_unit(uint64_t *state)
{
	return (double)(ukvm_splitmix64(state) >> 11) * 0x1.0p-53;
}

#endif
