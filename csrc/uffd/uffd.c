/* SPDX-License-Identifier: MIT */
/*
 * userfaultfd: opening one (the syscall, else /dev/userfaultfd), the
 * features a run asks for and the API handshake, registration, and the
 * resolving ioctls with their recoverable errors (EEXIST: resolved already;
 * EAGAIN: the mm changed under us, retry).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/ctl.h"
#include "base/errors.h"
#include "base/util.h"
#include "uapi_compat.h"
#include "uffd/backing.h"
#include "uffd/uffd.h"

/*
 * EAGAIN means "try again" (the address space is changing under the ioctl:
 * an mremap, a fork with UFFD_FEATURE_EVENT_FORK...). Retries back off: a
 * few at once, then yielding the CPU for RETRY_YIELD_NS, then sleeps that
 * double up to RETRY_SLEEP_MAX_NS. Still failing after RETRY_LIMIT_NS is an
 * error; so is a run that fails or is cancelled meanwhile.
 */
#define RETRY_AT_ONCE		16
#define RETRY_YIELD_NS		(100 * 1000ULL)
#define RETRY_SLEEP_MIN_NS	(10 * 1000ULL)
#define RETRY_SLEEP_MAX_NS	NSEC_PER_MSEC
#define RETRY_LIMIT_NS		NSEC_PER_SEC

/* The calling reader's run and name (ukvm_uffd_thread_init), for give-ups. */
static __thread struct ukvm_ctl *thread_ctl;
static __thread char thread_who[48];

void ukvm_uffd_thread_init(struct ukvm_ctl *ctl, const char *who)
{
	thread_ctl = ctl;
	snprintf(thread_who, sizeof(thread_who), "%s", who);
}

/*
 * The ranges registered over hugetlb memory, for the one EEXIST that does
 * not mean "there already" (resolve_present): elsewhere an EEXIST for a
 * page mincore() calls absent is still a page that is there (an anonymous
 * page swapped out and out of the swap cache, a pte marker, shmem's
 * swapped-out pages), and doubting it failed good runs. Each registration
 * drops the ranges it overlaps (that memory is now of its backing) and a
 * hugetlb one adds its own, so a range stays here after its run only until
 * the address is registered again; every address a resolving ioctl works
 * on was registered here first. Full, the oldest slot goes.
 */
#define HUGETLB_RANGES	64
static struct { uint64_t start, end; } hugetlb_ranges[HUGETLB_RANGES];
static unsigned hugetlb_next;
static pthread_mutex_t hugetlb_lock = PTHREAD_MUTEX_INITIALIZER;

static void hugetlb_ranges_note(uint64_t start, uint64_t len, bool hugetlb)
{
	unsigned i, slot = HUGETLB_RANGES;

	pthread_mutex_lock(&hugetlb_lock);
	for (i = 0; i < HUGETLB_RANGES; i++) {
		if (hugetlb_ranges[i].start < start + len && start < hugetlb_ranges[i].end)
			hugetlb_ranges[i].start = hugetlb_ranges[i].end = 0;
		if (hugetlb_ranges[i].start == hugetlb_ranges[i].end && slot == HUGETLB_RANGES)
			slot = i;
	}
	if (hugetlb) {
		if (slot == HUGETLB_RANGES)
			slot = hugetlb_next++ % HUGETLB_RANGES;
		hugetlb_ranges[slot].start = start;
		hugetlb_ranges[slot].end = start + len;
	}
	pthread_mutex_unlock(&hugetlb_lock);
}

/* Whether addr lies in a range registered over hugetlb memory. */
static bool hugetlb_at(uint64_t addr)
{
	bool found = false;
	unsigned i;

	pthread_mutex_lock(&hugetlb_lock);
	for (i = 0; i < HUGETLB_RANGES && !found; i++)
		found = hugetlb_ranges[i].start <= addr && addr < hugetlb_ranges[i].end;
	pthread_mutex_unlock(&hugetlb_lock);
	return found;
}

static int uffd_open_raw(int flags, struct ukvm_error *err)
{
	int fd, dev, sys_errno, dev_errno;

	fd = (int)syscall(__NR_userfaultfd, flags);
	if (fd >= 0)
		return fd;
	sys_errno = errno;
	if (sys_errno == ENOSYS) {
		ukvm_err_set_hint(err, UKVM_ERR_HOST, sys_errno, "userfaultfd()",
				  "This kernel was built without CONFIG_USERFAULTFD");
		return -sys_errno;
	}

	/* /dev/userfaultfd (Linux 6.1+) grants userfaultfd by file permission. */
	dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	if (dev >= 0) {
		fd = ioctl(dev, USERFAULTFD_IOC_NEW, flags);
		dev_errno = errno;
		close(dev);
		if (fd >= 0)
			return fd;
	} else {
		dev_errno = errno;
	}

	if (sys_errno == EPERM)
		ukvm_err_set_hint(err, UKVM_ERR_HOST, sys_errno, "userfaultfd()",
				  "userfaultfd is not permitted: the syscall needs "
				  "CAP_SYS_PTRACE or sysctl vm.unprivileged_userfaultfd=1 "
				  "(KVM's faults are kernel-mode faults), and opening "
				  "/dev/userfaultfd failed too (%s). Run as root, give this "
				  "user read/write access to /dev/userfaultfd, or set "
				  "vm.unprivileged_userfaultfd=1", strerror(dev_errno));
	else
		ukvm_err_set(err, UKVM_ERR_HOST, sys_errno, "userfaultfd()");
	return -sys_errno;
}

static int uffd_api(int fd, uint64_t features, struct uffdio_api *api)
{
	memset(api, 0, sizeof(*api));
	api->api = UFFD_API;
	api->features = features;
	return ukvm_ioctl(fd, UFFDIO_API, api);
}

/* The features this kernel's userfaultfd offers: 0, or -errno with err set. */
static int uffd_features(uint64_t *features, struct ukvm_error *err)
{
	struct uffdio_api api;
	int fd, ret = 0;

	fd = uffd_open_raw(O_CLOEXEC | O_NONBLOCK, err);
	if (fd < 0)
		return fd;
	ret = uffd_api(fd, 0, &api);
	if (ret)
		ukvm_err_set(err, UKVM_ERR_HOST, -ret, "UFFDIO_API");
	else
		*features = api.features;
	close(fd);
	return ret;
}

int ukvm_uffd_negotiate(const struct ukvm_config *cfg, uint64_t *wanted, struct ukvm_error *err)
{
	uint64_t available = 0;
	int ret;

	*wanted = 0;
	if (cfg->uffd_mode == UKVM_UFFD_NONE)
		return 0;
	ret = uffd_features(&available, err);
	if (ret)
		return ret;
#ifdef UKVM_TEST_HOOKS
	if (cfg->inject == UKVM_INJECT_NO_WP_FEATURES)
		available &= ~(uint64_t)(UFFD_FEATURE_PAGEFAULT_FLAG_WP |
					 UFFD_FEATURE_WP_HUGETLBFS_SHMEM | UFFD_FEATURE_WP_ASYNC);
#endif
	if (cfg->uffd_mode == UKVM_UFFD_MINOR && cfg->backing == UKVM_BACKING_SHMEM)
		*wanted |= UFFD_FEATURE_MINOR_SHMEM;
	if (cfg->uffd_mode == UKVM_UFFD_MINOR && cfg->backing == UKVM_BACKING_SHARED_HUGETLB)
		*wanted |= UFFD_FEATURE_MINOR_HUGETLBFS;
	if (cfg->uffd_mode == UKVM_UFFD_MISSING && cfg->backing == UKVM_BACKING_SHMEM)
		*wanted |= UFFD_FEATURE_MISSING_SHMEM;
	if (cfg->uffd_mode == UKVM_UFFD_MISSING && ukvm_backing_is_hugetlb(cfg->backing))
		*wanted |= UFFD_FEATURE_MISSING_HUGETLBFS;
	/* WP faults at all; beyond anonymous memory, uffd-wp PTE markers (Linux 5.19+). */
	if (cfg->uffd_mode == UKVM_UFFD_WP)
		*wanted |= UFFD_FEATURE_PAGEFAULT_FLAG_WP;
	if (cfg->uffd_mode == UKVM_UFFD_WP && cfg->backing != UKVM_BACKING_ANONYMOUS)
		*wanted |= UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
	if (cfg->uffd_mode == UKVM_UFFD_WP && cfg->wp_async)
		*wanted |= UFFD_FEATURE_WP_ASYNC;
	/*
	 * Which vCPU faulted, and the 4 KiB page it touched (hugetlb messages
	 * otherwise name the huge page's start): nice to have, so only if the
	 * kernel offers them.
	 */
	if (cfg->stats == UKVM_STATS_FULL)
		*wanted |= available & (UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_EXACT_ADDRESS);
#ifdef UKVM_TEST_HOOKS
	if (cfg->inject == UKVM_INJECT_NO_EXACT_ADDRESS)
		*wanted &= ~(uint64_t)UFFD_FEATURE_EXACT_ADDRESS;	/* as an older kernel */
#endif
	/* Resolver vCPU: a fault is not queued; the access fails back to KVM_RUN. */
	if (cfg->resolver == UKVM_RESOLVER_VCPU)
		*wanted |= UFFD_FEATURE_SIGBUS;
	/* resolve move: UFFDIO_MOVE, which kernels from 6.8 announce with UFFD_FEATURE_MOVE. */
	if (cfg->uffd_mode == UKVM_UFFD_MISSING && cfg->resolve == UKVM_RESOLVE_MOVE) {
#ifdef UKVM_TEST_HOOKS
		if (cfg->inject == UKVM_INJECT_NO_MOVE)
			available &= ~(uint64_t)UFFD_FEATURE_MOVE;	/* as a kernel before 6.8 */
#endif
		if (!(available & UFFD_FEATURE_MOVE)) {
			ukvm_err_set(err, UKVM_ERR_HOST, 0,
				     "resolve move: this kernel's userfaultfd has no UFFDIO_MOVE "
				     "(UFFD_FEATURE_MOVE, Linux 6.8 and later); use resolve copy, "
				     "or a newer kernel");
			return -EOPNOTSUPP;
		}
		*wanted |= UFFD_FEATURE_MOVE;
	}
	if ((available & *wanted) != *wanted) {
		uint64_t lacks = *wanted & ~available;

		ukvm_err_set(err, UKVM_ERR_HOST, 0,
			     "this kernel's userfaultfd lacks features 0x%llx needed for "
			     "uffd_mode %s on %s memory (it has 0x%llx)%s%s%s",
			     (unsigned long long)lacks,
			     ukvm_uffd_mode_name(cfg->uffd_mode), ukvm_backing_name(cfg->backing),
			     (unsigned long long)available,
			     lacks & UFFD_FEATURE_PAGEFAULT_FLAG_WP ?
			     ": no write-protect faults at all (UFFD_FEATURE_PAGEFAULT_FLAG_WP: "
			     "Linux 5.7+ built with CONFIG_HAVE_ARCH_USERFAULTFD_WP)" : "",
			     lacks & UFFD_FEATURE_WP_HUGETLBFS_SHMEM ?
			     ": no write-protect on shmem (UFFD_FEATURE_WP_HUGETLBFS_SHMEM: Linux "
			     "5.19+ built with CONFIG_PTE_MARKER_UFFD_WP); use backing "
			     "anonymous" : "",
			     lacks & UFFD_FEATURE_WP_ASYNC ?
			     ": no asynchronous write-protect (UFFD_FEATURE_WP_ASYNC: Linux "
			     "6.7+); use wp_async false" : "");
		return -EOPNOTSUPP;
	}
	return 0;
}

int ukvm_uffd_open(bool nonblock, uint64_t features, struct ukvm_error *err)
{
	struct uffdio_api api;
	int fd, ret;

	fd = uffd_open_raw(O_CLOEXEC | (nonblock ? O_NONBLOCK : 0), err);
	if (fd < 0)
		return fd;
	ret = uffd_api(fd, features, &api);
	if (ret) {
		close(fd);
		ukvm_err_set(err, UKVM_ERR_HOST, -ret, "UFFDIO_API(features 0x%llx)",
			     (unsigned long long)features);
		return ret;
	}
	return fd;
}

int ukvm_uffd_register(int uffd, void *addr, uint64_t len, enum ukvm_uffd_mode mode,
		       enum ukvm_backing backing, struct ukvm_error *err)
{
	struct uffdio_register reg = {
		.range = { .start = (uint64_t)(uintptr_t)addr, .len = len },
		.mode = mode == UKVM_UFFD_MINOR ? UFFDIO_REGISTER_MODE_MINOR :
			mode == UKVM_UFFD_WP ? UFFDIO_REGISTER_MODE_WP
					     : UFFDIO_REGISTER_MODE_MISSING,
	};
	uint64_t needed = mode == UKVM_UFFD_MINOR ? 1ULL << _UFFDIO_CONTINUE :
			  mode == UKVM_UFFD_WP ? 1ULL << _UFFDIO_WRITEPROTECT
					       : 1ULL << _UFFDIO_COPY;
	const char *name = mode == UKVM_UFFD_MINOR ? "MINOR" :
			   mode == UKVM_UFFD_WP ? "WP" : "MISSING";
	const char *ioctl_name = mode == UKVM_UFFD_MINOR ? "UFFDIO_CONTINUE" :
				 mode == UKVM_UFFD_WP ? "UFFDIO_WRITEPROTECT" : "UFFDIO_COPY";
	int e = -ukvm_ioctl(uffd, UFFDIO_REGISTER, &reg);

	if (e) {
		/*
		 * No kernel would do better for now: where userfaultfd registers
		 * guest_memfd, the guest's accesses still bypass it (experiment/gmem.c).
		 */
		if (e == EINVAL && backing == UKVM_BACKING_GUEST_MEMFD)
			ukvm_err_set_hint(err, UKVM_ERR_HOST, e, "UFFDIO_REGISTER(guest_memfd)",
					  "This kernel's userfaultfd cannot register guest_memfd "
					  "memory (uffd_mode %s); run guest_memfd with "
					  "uffd_mode=None, or demand-page backing 'shmem' (even a "
					  "kernel that registers guest_memfd gives no fault for the "
					  "guest's accesses: docs/backings.md)", name);
		else if (e == EINVAL)
			ukvm_err_set_hint(err, UKVM_ERR_HOST, e, "UFFDIO_REGISTER",
					  "This kernel cannot register %s memory in mode %s",
					  ukvm_backing_name(backing), name);
		else
			ukvm_err_set(err, UKVM_ERR_RUN, e,
				     "UFFDIO_REGISTER(mode %s, %llu bytes at %p)", name,
				     (unsigned long long)len, addr);
		return -e;
	}
	if ((reg.ioctls & needed) != needed) {
		ukvm_err_set(err, UKVM_ERR_HOST, 0,
			     "UFFDIO_REGISTER(mode %s): the kernel does not offer %s for "
			     "this memory", name, ioctl_name);
		return -EOPNOTSUPP;
	}
	hugetlb_ranges_note(reg.range.start, len, ukvm_backing_is_hugetlb(backing));
	return 0;
}

/*
 * One try of a resolving ioctl over [addr, addr + len): returns 0 or
 * -errno, and sets *done to the bytes it resolved before failing (the
 * kernel reports partial progress in the ioctl's last field).
 */
typedef int (*resolve_try)(int uffd, uint64_t addr, uint64_t len, const uint8_t *src,
			   int64_t *done);

static int try_copy(int uffd, uint64_t addr, uint64_t len, const uint8_t *src, int64_t *done)
{
	struct uffdio_copy copy = {
		.dst = addr, .src = (uint64_t)(uintptr_t)src, .len = len, .mode = 0,
	};
	int ret = ioctl(uffd, UFFDIO_COPY, &copy) ? -errno : 0;

	*done = copy.copy;
	return ret;
}

/* Prefetch: the page goes in, and whoever waits on it sleeps on (see ukvm_uffd_wake). */
static int try_copy_dontwake(int uffd, uint64_t addr, uint64_t len, const uint8_t *src,
			     int64_t *done)
{
	struct uffdio_copy copy = {
		.dst = addr, .src = (uint64_t)(uintptr_t)src, .len = len,
		.mode = UFFDIO_COPY_MODE_DONTWAKE,
	};
	int ret = ioctl(uffd, UFFDIO_COPY, &copy) ? -errno : 0;

	*done = copy.copy;
	return ret;
}

static int try_zeropage(int uffd, uint64_t addr, uint64_t len, const uint8_t *src,
			int64_t *done)
{
	struct uffdio_zeropage zero = { .range = { .start = addr, .len = len }, .mode = 0 };
	int ret = ioctl(uffd, UFFDIO_ZEROPAGE, &zero) ? -errno : 0;

	(void)src;
	*done = zero.zeropage;
	return ret;
}

static int try_continue(int uffd, uint64_t addr, uint64_t len, const uint8_t *src,
			int64_t *done)
{
	struct uffdio_continue cont = { .range = { .start = addr, .len = len }, .mode = 0 };
	int ret = ioctl(uffd, UFFDIO_CONTINUE, &cont) ? -errno : 0;

	(void)src;
	*done = cont.mapped;
	return ret;
}

/*
 * A short move (an error after some pages) fails with EAGAIN and .move the
 * bytes moved: resolve() goes on from there, as it does for a short copy.
 */
static int try_move(int uffd, uint64_t addr, uint64_t len, const uint8_t *src, int64_t *done)
{
	struct uffdio_move move = {
		.dst = addr, .src = (uint64_t)(uintptr_t)src, .len = len, .mode = 0,
	};
	int ret = ioctl(uffd, UFFDIO_MOVE, &move) ? -errno : 0;

	*done = move.move;
	return ret;
}

/* src stands for the mode: non-NULL protects, NULL un-protects (and wakes). */
static int try_writeprotect(int uffd, uint64_t addr, uint64_t len, const uint8_t *src,
			    int64_t *done)
{
	struct uffdio_writeprotect wp = {
		.range = { .start = addr, .len = len },
		.mode = src ? UFFDIO_WRITEPROTECT_MODE_WP : 0,
	};

	*done = 0;	/* no partial progress is reported: a retry redoes the range */
	return ioctl(uffd, UFFDIO_WRITEPROTECT, &wp) ? -errno : 0;
}

#ifdef UKVM_TEST_HOOKS
/* UKVM_INJECT_RESOLVE_EAGAIN: every try fails with EAGAIN for inject_after ms from the first. */
static bool injected_eagain(void)
{
	struct ukvm_ctl *ctl = thread_ctl;
	uint_fast64_t first = 0;
	uint64_t now, window;

	if (!ctl || ctl->inject != UKVM_INJECT_RESOLVE_EAGAIN)
		return false;
	now = ukvm_now_ns();
	/* inject_count holds when the window opened (0: not yet). */
	if (!atomic_compare_exchange_strong(&ctl->inject_count, &first, now))
		now = ukvm_now_ns();
	else
		first = now;
	window = ctl->inject_after > UINT64_MAX / NSEC_PER_MSEC ? UINT64_MAX
		 : ctl->inject_after * NSEC_PER_MSEC;
	return now - first < window;
}
#endif

/*
 * Whether the huge page at addr is there, as EEXIST says it is. It may not
 * be: hugetlb_mfill_atomic_pte (mm/hugetlb.c) answers EEXIST, not ENOMEM,
 * when it cannot allocate the huge page (a hugetlb cgroup's
 * hugetlb.<size>.max met, the pool empty) and a page table is already
 * there; nothing is installed, and the vCPU would fault on the page for
 * ever. Asked only in hugetlb ranges (hugetlb_ranges). An address mincore()
 * cannot say anything about counts as there.
 */
static bool resolve_present(uint64_t addr)
{
	unsigned char vec = 0;

	if (mincore((void *)(uintptr_t)(addr & ~(uint64_t)(UKVM_PAGE_SIZE - 1)), UKVM_PAGE_SIZE,
		    &vec))
		return true;
	return vec & 1;
}

/*
 * 0 resolved here, -EEXIST resolved already (another reader won), or
 * another -errno. EAGAIN (the mm changed under the ioctl) and EINTR are retried
 * from where the kernel got to, as VMMs do, backing off (see RETRY_*);
 * EAGAIN for RETRY_LIMIT_NS is an error, which the reader's run records
 * with the ioctl and how long it tried.
 */
static int resolve(const char *name, resolve_try attempt, int uffd, uint64_t addr,
		   const uint8_t *src, uint64_t len)
{
	uint64_t start = 0, now, pause = RETRY_SLEEP_MIN_NS;
	bool absent = false;
	unsigned tries;
	int ret;

	for (tries = 1;; tries++) {
		int64_t done = 0;

#ifdef UKVM_TEST_HOOKS
		if (injected_eagain())
			ret = -EAGAIN;	/* the ioctl is not even tried */
		else
#endif
			ret = attempt(uffd, addr, len, src, &done);
		/* EEXIST for a huge page that is not there: retried as EAGAIN, then an error. */
		absent = ret == -EEXIST && hugetlb_at(addr) && !resolve_present(addr);
		if (absent)
			ret = -EAGAIN;
		if (ret != -EAGAIN && ret != -EINTR)
			return ret;	/* 0, -EEXIST (another reader won), or a failure */
		if (done > 0) {
			addr += (uint64_t)done;
			if (src)
				src += done;
			len -= (uint64_t)done;
			if (!len)
				return 0;
		}
		if (tries < RETRY_AT_ONCE)
			continue;
		now = ukvm_now_ns();
		if (!start)
			start = now;
		if (thread_ctl && ukvm_ctl_aborted(thread_ctl))
			return ret;	/* the run is over: nobody needs this page */
		if (now - start >= RETRY_LIMIT_NS && absent) {
			if (thread_ctl)
				ukvm_ctl_fail(thread_ctl, UKVM_ERR_RUN, ENOMEM,
					      "%s: %s(%llu bytes at 0x%llx) failed with EEXIST for "
					      "%.1f s (%u tries) and the page is not there: the kernel "
					      "could not allocate it (for huge pages: the hugetlb "
					      "cgroup's hugetlb.<size>.max reached, or the pool empty)",
					      thread_who, name, (unsigned long long)len,
					      (unsigned long long)addr,
					      (double)(now - start) / NSEC_PER_SEC, tries);
			return -ENOMEM;
		}
		if (now - start >= RETRY_LIMIT_NS) {
			if (thread_ctl)
				ukvm_ctl_fail(thread_ctl, UKVM_ERR_RUN, -ret,
					      "%s: %s(%llu bytes at 0x%llx) still failed after "
					      "retrying for %.1f s (%u tries, the last ones 1 ms "
					      "apart)", thread_who, name, (unsigned long long)len,
					      (unsigned long long)addr,
					      (double)(now - start) / NSEC_PER_SEC, tries);
			return ret;
		}
		if (now - start < RETRY_YIELD_NS) {
			sched_yield();
		} else {
			ukvm_sleep_ns(pause);
			pause = pause * 2 < RETRY_SLEEP_MAX_NS ? pause * 2 : RETRY_SLEEP_MAX_NS;
		}
	}
}

int ukvm_uffd_copy(int uffd, uint64_t dst, const void *src, uint64_t len)
{
	return resolve("UFFDIO_COPY", try_copy, uffd, dst, src, len);
}

int ukvm_uffd_copy_dontwake(int uffd, uint64_t dst, const void *src, uint64_t len)
{
	return resolve("UFFDIO_COPY(MODE_DONTWAKE)", try_copy_dontwake, uffd, dst, src, len);
}

int ukvm_uffd_wake(int uffd, uint64_t addr, uint64_t len)
{
	struct uffdio_range range = { .start = addr, .len = len };
	int ret = ukvm_ioctl(uffd, UFFDIO_WAKE, &range);

	return ret < 0 ? ret : 0;
}

int ukvm_uffd_move(int uffd, uint64_t dst, void *src, uint64_t len)
{
	return resolve("UFFDIO_MOVE", try_move, uffd, dst, src, len);
}

int ukvm_uffd_zeropage(int uffd, uint64_t addr, uint64_t len)
{
	return resolve("UFFDIO_ZEROPAGE", try_zeropage, uffd, addr, NULL, len);
}

int ukvm_uffd_continue(int uffd, uint64_t addr, uint64_t len)
{
	return resolve("UFFDIO_CONTINUE", try_continue, uffd, addr, NULL, len);
}

int ukvm_uffd_writeprotect(int uffd, uint64_t addr, uint64_t len, bool protect)
{
	static const uint8_t mode_wp;

	return resolve(protect ? "UFFDIO_WRITEPROTECT(MODE_WP)" : "UFFDIO_WRITEPROTECT",
		       try_writeprotect, uffd, addr, protect ? &mode_wp : NULL, len);
}
