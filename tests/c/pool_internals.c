/* SPDX-License-Identifier: MIT */
/*
 * White-box cases of the reader pools (csrc/uffd/pool.c, reader.c) that no run can show
 * through the public interface, because the run they happen in fails and
 * hands back no result. It includes the core's internal headers (csrc/base,
 * csrc/uffd), as faultlog_accounting.c does.
 *
 *  - A reader that fails to pin still records its counters (getrusage, its
 *    affinity): every exit path of ukvm_reader_thread keeps them.
 *  - Letting go of a uffd while a reader still runs: the fault a thread
 *    waits on completes (the uffd file is released), and the fd number
 *    stays taken (by /dev/null) until the pool is destroyed.
 *  - A swap for /dev/null that fails (dup3, injected): the release says so,
 *    the uffd is still held and marked, and the next release lets it go.
 *  - A lingering experiment's look at its threads (ukvm_stop_wait_threads,
 *    experiment/stop.c) retries a held uffd while a vCPU still waits on
 *    it: the experiment is made by hand around the pool, its vCPU a thread
 *    blocked on a fault (on this host a kick frees a real vCPU waiting on
 *    a userfault, so no run can keep one stuck; a plain thread's fault
 *    waits through every kick, as a vCPU's does on kernels where the
 *    wait is not interruptible).
 *  - Letting go of the uffds while the pusher still runs (it copies into
 *    them by number): each is swapped for /dev/null, not closed with its
 *    pool, and closed once the pusher has gone.
 */
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include "helpers.h"
#undef NSEC_PER_MSEC	/* base/util.h has its own, the same */
#undef NSEC_PER_SEC
#undef ARRAY_SIZE
#include "base/ctl.h"
#include "base/kick.h"
#include "experiment/state.h"
#include "experiment/stop.h"
#include "uffd/pool.h"
#include "uffd/uffd.h"

#define REGION	(64 * PAGE)

struct fixture {
	struct ukvm_ctl ctl;
	struct ukvm_pool pool;
	uint8_t *region;
	int32_t pin;
};

/*
 * A pool of nr readers on a real uffd over a real MISSING-registered region.
 * hold_ms: the pool's ctl lock is held that long while the readers start,
 * so that one that reports a failure waits on it (a voluntary context
 * switch, which getrusage counts).
 */
static bool fixture_start(struct fixture *f, uint32_t nr, enum ukvm_wait wait, int pin,
			  unsigned hold_ms, uint64_t stall_ms, enum ukvm_inject inject,
			  uint64_t inject_after)
{
	bool ok;

	struct ukvm_error err = { 0 };

	memset(f, 0, sizeof(*f));
	if (!CHECK(ukvm_ctl_init(&f->ctl) == 0) || !CHECK(ukvm_kick_init(&err) == 0, "%s",
							     err.message))
		return false;
	if (stall_ms) {	/* uffd 0's last reader stalls */
		f->ctl.inject = UKVM_INJECT_READER_STALL;
		f->ctl.inject_after = stall_ms;
	} else if (inject) {
		f->ctl.inject = inject;
		f->ctl.inject_after = inject_after;
	}
	ukvm_pool_init(&f->pool);
	f->region = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!CHECK(f->region != MAP_FAILED))
		return false;
	f->pool.area.ctl = &f->ctl;
	f->pool.wait = wait;
	f->pool.area.mode = UKVM_UFFD_MISSING;
	f->pool.area.resolve = UKVM_RESOLVE_COPY;
	f->pool.area.page_size = PAGE;
	f->pool.area.hva_base = (uint64_t)(uintptr_t)f->region;
	f->pool.area.region_size = REGION;
	f->pool.area.gpa_base = 1ULL << 32;
	f->pool.vcpus_sharing = 1;
	f->pool.read_batch = 1;
	f->pool.nr_readers = nr;
	f->pin = pin;
	if (pin >= 0) {
		f->pool.pins = &f->pin;
		f->pool.nr_pins = 1;
	}
	f->pool.area.uffd = ukvm_uffd_open(wait != UKVM_WAIT_READ, 0, &err);
	if (f->pool.area.uffd < 0) {
		ukt_skip_case(err.message);
		return false;
	}
	if (!CHECK(ukvm_uffd_register(f->pool.area.uffd, f->region, REGION, UKVM_UFFD_MISSING,
				      UKVM_BACKING_ANONYMOUS, &err) == 0, "%s", err.message))
		return false;
	if (hold_ms)
		pthread_mutex_lock(&f->ctl.lock);
	ok = CHECK(ukvm_pool_start(&f->pool, &err) == 0, "%s", err.message);
	if (hold_ms) {
		ukt_sleep_ms(hold_ms);
		pthread_mutex_unlock(&f->ctl.lock);
	}
	return ok;
}

static void fixture_end(struct fixture *f)
{
	CHECK_EQ(ukvm_pool_stop(&f->pool, 1, NULL, ukt_now_ns() + 5 * NSEC_PER_SEC), 0);
	CHECK_EQ(ukvm_pool_destroy(&f->pool), 0);
	if (f->region && f->region != MAP_FAILED)
		munmap(f->region, REGION);
	ukvm_ctl_destroy(&f->ctl);
}

/* A CPU this process may not run on, or -1. */
static int forbidden_cpu(void)
{
	cpu_set_t set;
	int cpu;

	if (sched_getaffinity(0, sizeof(set), &set))
		return -1;
	for (cpu = CPU_SETSIZE - 1; cpu >= 0; cpu--)
		if (!CPU_ISSET(cpu, &set))
			return cpu;
	return -1;
}

static void *touch(void *arg)
{
	return (void *)(uintptr_t)*(volatile uint8_t *)arg;
}

/* A vCPU of a hand-made experiment: a thread that touches a page, then says it is done. */
struct vcpu_toucher {
	struct ukvm_vcpu *vcpu;
	uint8_t *addr;
};

static void *vcpu_touch(void *arg)
{
	struct vcpu_toucher *t = arg;

	(void)*(volatile uint8_t *)t->addr;
	atomic_store(&t->vcpu->exited, true);
	atomic_store(&t->vcpu->state.done, true);
	return NULL;
}

/* A pusher of a hand-made experiment: a thread that runs until told to leave. */
static atomic_bool pusher_leave;

static void *pusher_waits(void *arg)
{
	struct ukvm_pusher *p = arg;

	while (!atomic_load(&pusher_leave))
		ukt_sleep_ms(1);
	atomic_store(&p->exited, true);
	return NULL;
}

/* What fd names, in buf. */
static const char *fd_target(int fd, char *buf, size_t len)
{
	char path[64];
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, buf, len - 1);
	buf[n > 0 ? n : 0] = '\0';
	return buf;
}

int main(void)
{
	struct fixture f;
	uint32_t i;

	ukt_init("pool_internals");

	UKT_CASE("readers that fail to pin keep their counters") {
		int cpu = forbidden_cpu();

		if (cpu < 0) {
			ukt_skip_case("this process may run on every CPU number");
		} else if (fixture_start(&f, 3, UKVM_WAIT_EPOLL, cpu, 50, 0, UKVM_INJECT_NONE, 0)) {
			CHECK_EQ(ukvm_pool_stop(&f.pool, 1, NULL, ukt_now_ns() + 5 * NSEC_PER_SEC), 0);
			CHECK(f.ctl.failed && strstr(f.ctl.error.message, "pinning to CPU"),
			      "%s", f.ctl.error.message);
			for (i = 0; i < 3; i++) {
				const struct ukvm_reader_result *s = &f.pool.resolvers[i].stats;

				/* Each waited for the ctl lock to report its failure. */
				CHECK(s->context_switches >= 1, "reader %u: %" PRIu64 " context "
				      "switches", i, s->context_switches);
				CHECK(s->cpus[0] || s->cpus[1], "reader %u: no affinity", i);
			}
		}
		fixture_end(&f);
	}

	UKT_CASE("letting go of a uffd whose reader still runs") {
		pthread_t toucher;
		struct timespec ts;
		char path[64], target[64] = "";
		ssize_t n;
		int uffd;

		/* The reader stays 1.5 s after it is told to stop, deaf to kicks. */
		if (fixture_start(&f, 1, UKVM_WAIT_EPOLL_EXCLUSIVE, -1, 0, 1500, UKVM_INJECT_NONE,
				  0)) {
			CHECK_EQ(f.pool.readers[0].stall_ms, 1500);
			ukvm_pool_request_stop(&f.pool);
			CHECK_EQ(ukvm_pool_stop(&f.pool, 1, NULL, ukt_now_ns() + 100 * NSEC_PER_MSEC), 1);
			/* Nobody resolves this fault now: the toucher waits in the kernel. */
			CHECK(pthread_create(&toucher, NULL, touch, f.region + 5 * PAGE) == 0);
			ukt_sleep_ms(100);
			CHECK(pthread_tryjoin_np(toucher, NULL) == EBUSY, "the fault did not wait");
			uffd = f.pool.area.uffd;
			CHECK_EQ(ukvm_pool_release_uffd(&f.pool, false), 0);
			CHECK(!f.pool.uffd_held);
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += 1;
			if (!CHECK(pthread_timedjoin_np(toucher, NULL, &ts) == 0,
				   "the fault still waits after the uffd was let go")) {
				close(uffd);	/* then it is released for sure */
				pthread_join(toucher, NULL);
			}
			/* The reader may still use that number: it names /dev/null, not a new file. */
			snprintf(path, sizeof(path), "/proc/self/fd/%d", uffd);
			n = readlink(path, target, sizeof(target) - 1);
			target[n > 0 ? n : 0] = '\0';
			CHECK(f.pool.area.uffd == uffd && !strcmp(target, "/dev/null"), "fd %d is %s",
			      uffd, target);
			CHECK_EQ(ukvm_pool_destroy(&f.pool), -EBUSY);	/* the reader still runs */
		}
		fixture_end(&f);
	}

	UKT_CASE("a swap for /dev/null that fails keeps the uffd held, and a retry lets it go") {
		pthread_t toucher;
		struct timespec ts;
		char path[64], target[64] = "";
		ssize_t n;
		int uffd;

		/* RELEASE_DUP3 once: the last reader stays 1.5 s after it is told to stop. */
		if (fixture_start(&f, 2, UKVM_WAIT_EPOLL_EXCLUSIVE, -1, 0, 0,
				  UKVM_INJECT_RELEASE_DUP3, 1)) {
			CHECK_EQ(f.pool.readers[1].stall_ms, 1500);
			ukvm_pool_request_stop(&f.pool);
			CHECK_EQ(ukvm_pool_stop(&f.pool, 1, NULL, ukt_now_ns() + 100 * NSEC_PER_MSEC), 1);
			CHECK(pthread_create(&toucher, NULL, touch, f.region + 7 * PAGE) == 0);
			ukt_sleep_ms(100);
			uffd = f.pool.area.uffd;
			snprintf(path, sizeof(path), "/proc/self/fd/%d", uffd);
			CHECK_EQ(ukvm_pool_release_uffd(&f.pool, false), -EINVAL);	/* dup3, injected */
			CHECK(f.pool.uffd_held, "a failed swap must leave the uffd marked held");
			n = readlink(path, target, sizeof(target) - 1);
			target[n > 0 ? n : 0] = '\0';
			CHECK(strstr(target, "userfaultfd"), "fd %d is %s, not the uffd still", uffd,
			      target);
			ukt_sleep_ms(50);
			CHECK(pthread_tryjoin_np(toucher, NULL) == EBUSY,
			      "the fault completed though the uffd is still held");
			/* The retry swaps it: the waiting fault completes. */
			CHECK_EQ(ukvm_pool_release_uffd(&f.pool, false), 0);
			CHECK(!f.pool.uffd_held);
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += 1;
			if (!CHECK(pthread_timedjoin_np(toucher, NULL, &ts) == 0,
				   "the fault still waits after the retry")) {
				close(uffd);
				pthread_join(toucher, NULL);
			}
			n = readlink(path, target, sizeof(target) - 1);
			target[n > 0 ? n : 0] = '\0';
			CHECK(!strcmp(target, "/dev/null"), "fd %d is %s", uffd, target);
		}
		fixture_end(&f);
	}

	UKT_CASE("a lingering look at the threads retries a held uffd while a vCPU waits on it") {
		struct ukvm_experiment *exp = calloc(1, sizeof(*exp));
		struct ukvm_vcpu *vcpu = calloc(1, sizeof(*vcpu));
		struct vcpu_toucher t = { vcpu, NULL };
		uint64_t t0;
		uint32_t running = 0;

		/* RELEASE_DUP3 twice: the last reader stays 3 s after it is told to stop. */
		if (CHECK(exp && vcpu) && CHECK(ukvm_ctl_init(&exp->ctl) == 0) &&
		    fixture_start(&f, 2, UKVM_WAIT_EPOLL_EXCLUSIVE, -1, 0, 0,
				  UKVM_INJECT_RELEASE_DUP3, 2)) {
			CHECK_EQ(f.pool.readers[1].stall_ms, 3000);
			exp->cfg.vcpus = 1;
			exp->vcpus = vcpu;
			exp->pools = &f.pool;
			exp->nr_pools = 1;
			ukvm_pusher_init(&exp->pusher);
			ukvm_pool_request_stop(&f.pool);
			CHECK_EQ(ukvm_pool_stop(&f.pool, 1, NULL, ukt_now_ns() + 100 * NSEC_PER_MSEC), 1);
			/* Its vCPU waits on a fault nobody resolves now, through every kick. */
			t.addr = f.region + 9 * PAGE;
			CHECK(pthread_create(&vcpu->thread, NULL, vcpu_touch, &t) == 0);
			vcpu->thread_started = true;
			ukt_sleep_ms(100);
			CHECK_EQ(ukvm_stop_wait_vcpus(exp, ukt_now_ns() + 50 * NSEC_PER_MSEC,
						      NSEC_PER_MSEC), 1);
			/* As stopping the vCPUs does: the swap fails. */
			CHECK_EQ(ukvm_pool_release_uffd(&f.pool, false), -EINVAL);
			/* As stopping the readers does: the retry fails too, the reader still there. */
			CHECK_EQ(ukvm_stop_wait_pools(exp, ukt_now_ns() + 10 * NSEC_PER_MSEC), 1);
			CHECK(f.pool.uffd_held, "the second swap must have failed as well");
			/* Lingering: once the reader has gone, a look closes the uffd, and the vCPU leaves. */
			t0 = ukt_now_ns();
			do
				running = ukvm_stop_wait_threads(exp, 20 * NSEC_PER_MSEC);
			while (running && ukt_now_ns() - t0 < 6 * NSEC_PER_SEC);
			CHECK_EQ(running, 0);
			CHECK(!vcpu->thread_started, "the vCPU still waits on its held uffd");
			/* Let go of: closed, or swapped once the reader had left but was not yet joined. */
			CHECK(!f.pool.uffd_held);
			if (f.pool.area.uffd >= 0) {
				char path[64], target[64] = "";
				ssize_t n;

				snprintf(path, sizeof(path), "/proc/self/fd/%d", f.pool.area.uffd);
				n = readlink(path, target, sizeof(target) - 1);
				target[n > 0 ? n : 0] = '\0';
				CHECK(!strcmp(target, "/dev/null"), "fd %d is %s", f.pool.area.uffd,
				      target);
			}
			if (vcpu->thread_started) {	/* let it go, for the rest of the program */
				close(f.pool.area.uffd);
				f.pool.area.uffd = -1;
				pthread_join(vcpu->thread, NULL);
			}
		}
		fixture_end(&f);
		if (exp)
			ukvm_ctl_destroy(&exp->ctl);
		free(exp);
		free(vcpu);
	}

	UKT_CASE("a pusher that still runs keeps the uffds' numbers until it is gone") {
		struct ukvm_experiment *exp = calloc(1, sizeof(*exp));
		char target[64];
		int uffd;

		if (CHECK(exp) && CHECK(ukvm_ctl_init(&exp->ctl) == 0) &&
		    fixture_start(&f, 1, UKVM_WAIT_EPOLL, -1, 0, 0, UKVM_INJECT_NONE, 0)) {
			exp->pools = &f.pool;
			exp->nr_pools = 1;
			ukvm_pusher_init(&exp->pusher);
			atomic_store(&pusher_leave, false);
			CHECK(pthread_create(&exp->pusher.thread, NULL, pusher_waits,
					     &exp->pusher) == 0);
			exp->pusher.thread_started = true;
			uffd = f.pool.area.uffd;
			/* A vCPU stuck: the reader leaves, the pusher does not. */
			ukvm_stop_release_uffds(exp);
			CHECK(exp->pusher.thread_started, "the pusher left");
			CHECK(!ukvm_pool_running_reader(&f.pool), "the reader did not leave");
			CHECK(f.pool.area.uffd == uffd && !f.pool.uffd_held &&
			      !strcmp(fd_target(uffd, target, sizeof(target)), "/dev/null"),
			      "uffd %d (now %d) is %s while the pusher runs", uffd, f.pool.area.uffd,
			      target);
			/* Once it has gone, stopping the pools closes the uffd. */
			atomic_store(&pusher_leave, true);
			CHECK_EQ(ukvm_stop_pools(exp, true), 0);
			CHECK(!exp->pusher.thread_started, "the pusher was not joined");
			CHECK(f.pool.area.uffd < 0, "uffd %d still open", f.pool.area.uffd);
		}
		if (exp && exp->pusher.thread_started) {
			atomic_store(&pusher_leave, true);
			pthread_join(exp->pusher.thread, NULL);
		}
		fixture_end(&f);
		if (exp)
			ukvm_ctl_destroy(&exp->ctl);
		free(exp);
	}

	return ukt_exit();
}
