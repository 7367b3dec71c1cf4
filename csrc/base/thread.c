/* SPDX-License-Identifier: MIT */
/* The core's threads: start, pin, and say where one that would not stop was. */
#include <errno.h>
#include <fcntl.h>
#include <linux/kvm.h>
#include <linux/userfaultfd.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/thread.h"
#include "base/util.h"
#include "uapi_compat.h"

int ukvm_thread_create(struct ukvm_ctl *ctl, pthread_t *thread, size_t stack_bytes,
		       void *(*fn)(void *), void *arg)
{
	pthread_attr_t attr;
	int ret;

#ifdef UKVM_TEST_HOOKS
	if (ukvm_ctl_inject(ctl, UKVM_INJECT_THREAD_CREATE))
		return -EAGAIN;
#endif
	ret = pthread_attr_init(&attr);
	if (ret)
		return -ret;
	ret = pthread_attr_setstacksize(&attr, stack_bytes);
	if (!ret)
		ret = pthread_create(thread, &attr, fn, arg);
	pthread_attr_destroy(&attr);
#ifdef UKVM_TEST_HOOKS
	if (!ret)
		atomic_fetch_add(&ctl->threads_made, 1);
#endif
	return -ret;
}

int ukvm_thread_pin(int cpu, uint64_t affinity[16])
{
	cpu_set_t set;
	int i, ret = 0;

	if (cpu >= 0) {
		CPU_ZERO(&set);
		CPU_SET(cpu, &set);
		if (sched_setaffinity(0, sizeof(set), &set))
			ret = -errno;
	}
	/* Recorded either way: a thread that failed to pin still reports where it ran. */
	memset(affinity, 0, 16 * sizeof(uint64_t));
	if (sched_getaffinity(0, sizeof(set), &set) == 0)
		for (i = 0; i < 1024 && i < CPU_SETSIZE; i++)
			if (CPU_ISSET(i, &set))
				affinity[i / 64] |= 1ULL << (i % 64);
	return ret;
}

static uint64_t timeval_ns(struct timeval tv)
{
	return (uint64_t)tv.tv_sec * NSEC_PER_SEC + (uint64_t)tv.tv_usec * 1000;
}

int ukvm_thread_usage(struct ukvm_thread_usage *usage)
{
	struct rusage ru;

	memset(usage, 0, sizeof(*usage));
	if (getrusage(RUSAGE_THREAD, &ru))
		return -errno;
	usage->cpu_ns = timeval_ns(ru.ru_utime) + timeval_ns(ru.ru_stime);
	usage->context_switches = (uint64_t)ru.ru_nvcsw + (uint64_t)ru.ru_nivcsw;
	usage->voluntary_context_switches = (uint64_t)ru.ru_nvcsw;
	return 0;
}

void ukvm_thread_start(struct ukvm_thread_state *st)
{
	atomic_store(&st->tid, (int)gettid());
}

#ifdef UKVM_TEST_HOOKS
void ukvm_thread_stall(struct ukvm_thread_state *st, uint64_t ms)
{
	uint64_t end = ukvm_now_ns() + ms * NSEC_PER_MSEC, now;

	ukvm_thread_at(st, "stalled (injected: it ignores stop and kicks)");
	/* A kick ends each sleep early (EINTR); this thread goes back to sleep. */
	while ((now = ukvm_now_ns()) < end)
		ukvm_sleep_ns(end - now);
}
#endif

/* A line of a /proc file of the thread, without its newline; "" if unreadable. */
static void read_task_file(int tid, const char *name, char *buf, size_t len)
{
	char path[64];
	ssize_t n;
	int fd;

	buf[0] = '\0';
	snprintf(path, sizeof(path), "/proc/self/task/%d/%s", tid, name);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	n = read(fd, buf, len - 1);
	close(fd);
	buf[n > 0 ? n : 0] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
}

static const char *syscall_name(long nr, unsigned long arg1)
{
	switch (nr) {
	case SYS_read: return "read";
	case SYS_poll: return "poll";
	case SYS_ppoll: return "ppoll";
	case SYS_epoll_wait: return "epoll_wait";
	case SYS_epoll_pwait: return "epoll_pwait";
	case SYS_nanosleep: return "nanosleep";
	case SYS_clock_nanosleep: return "clock_nanosleep";
	case SYS_futex: return "futex";
	case SYS_ioctl:
		switch (arg1) {
		case KVM_RUN: return "ioctl(KVM_RUN)";
		case UFFDIO_COPY: return "ioctl(UFFDIO_COPY)";
		case UFFDIO_ZEROPAGE: return "ioctl(UFFDIO_ZEROPAGE)";
		case UFFDIO_CONTINUE: return "ioctl(UFFDIO_CONTINUE)";
		case UFFDIO_WAKE: return "ioctl(UFFDIO_WAKE)";
		default: return "ioctl";
		}
	default: return NULL;
	}
}

void ukvm_thread_describe(struct ukvm_thread_state *st, char *buf, size_t len)
{
	const char *where = atomic_load_explicit(&st->where, memory_order_relaxed);
	int tid = atomic_load(&st->tid);
	char sys[256], wchan[128], call[64];
	unsigned long arg0 = 0, arg1 = 0;
	const char *name;
	int tries;
	long nr;

	if (tid <= 0) {
		snprintf(buf, len, "it had not started yet");
		return;
	}
	/*
	 * "NR arg0 arg1 ...", "running", or "-1 sp pc" outside a system call.
	 * Just kicked, a blocked thread runs for a moment before it blocks
	 * again: look a few times before saying it runs.
	 */
	for (tries = 0; tries < 5; tries++) {
		read_task_file(tid, "syscall", sys, sizeof(sys));
		if (strncmp(sys, "running", 7))
			break;
		ukvm_sleep_ns(NSEC_PER_MSEC);
	}
	read_task_file(tid, "wchan", wchan, sizeof(wchan));
	if (sscanf(sys, "%ld %lx %lx", &nr, &arg0, &arg1) >= 1 && nr >= 0) {
		name = syscall_name(nr, arg1);
		if (name)
			snprintf(call, sizeof(call), "in %s", name);
		else
			snprintf(call, sizeof(call), "in system call %ld", nr);
	} else {
		snprintf(call, sizeof(call), "%s", sys[0] == 'r' ? "running" :
			 sys[0] ? "outside any system call" : "state unknown");
	}
	snprintf(buf, len, "it was %s (thread %d: %s%s%s)", where ?: "starting", tid, call,
		 wchan[0] && strcmp(wchan, "0") ? ", in the kernel at " : "",
		 wchan[0] && strcmp(wchan, "0") ? wchan : "");
}
