/* SPDX-License-Identifier: MIT */
/* Small helpers: clocks, sleeping, EINTR-safe ioctls (util.h). */
#include <errno.h>
#include <sys/ioctl.h>
#include <time.h>

#include "base/util.h"

uint64_t ukvm_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

void ukvm_sleep_ns(uint64_t ns)
{
	struct timespec ts = {
		.tv_sec = (time_t)(ns / NSEC_PER_SEC),
		.tv_nsec = (long)(ns % NSEC_PER_SEC),
	};

	/* A kick (EINTR) ends the sleep early: the sleeper re-checks stop. */
	clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, NULL);
}

uint64_t ukvm_deadline_after(uint64_t timeout_ns)
{
	uint64_t now = ukvm_now_ns();

	return timeout_ns > UINT64_MAX - now ? UINT64_MAX : now + timeout_ns;
}

void ukvm_timespec(struct timespec *ts, uint64_t deadline_ns)
{
	ts->tv_sec = (time_t)(deadline_ns / NSEC_PER_SEC);
	ts->tv_nsec = (long)(deadline_ns % NSEC_PER_SEC);
}

int ukvm_ioctl(int fd, unsigned long req, void *arg)
{
	int ret;

	do {
		ret = ioctl(fd, req, arg);
	} while (ret == -1 && errno == EINTR);
	return ret < 0 ? -errno : ret;
}
