/* SPDX-License-Identifier: MIT */
/*
 * White-box cases of a reader's io_uring (csrc/uffd/ring.c) that a run
 * cannot show: what ukvm_ring_next() hands back for each kind of
 * completion, that a cancelled ring leaves the uffd to others, and what
 * ukvm_ring_check() refuses. On a real uffd over a real MISSING-registered
 * region. Built without liburing, every entry point refuses, saying so.
 */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include "helpers.h"
#undef NSEC_PER_MSEC	/* base/util.h has its own, the same */
#undef NSEC_PER_SEC
#undef ARRAY_SIZE
#include "base/kick.h"
#include "base/util.h"
#include "uffd/ring.h"
#include "uffd/uffd.h"

#define REGION	(16 * PAGE)

#ifdef UKVM_HAVE_LIBURING
struct fixture {
	uint8_t *region;
	int uffd;
	int stop_fd;
	struct ukvm_ring *ring;
};

/* A MISSING-registered region, its non-blocking uffd, a stop eventfd and a ring (batch 4). */
static bool fixture_start(struct fixture *f)
{
	struct ukvm_error err = { 0 };

	memset(f, 0, sizeof(*f));
	f->uffd = f->stop_fd = -1;
	f->region = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!CHECK(f->region != MAP_FAILED))
		return false;
	f->uffd = ukvm_uffd_open(true, 0, &err);
	if (f->uffd < 0) {
		ukt_skip_case(err.message);
		return false;
	}
	f->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (!CHECK(f->stop_fd >= 0) ||
	    !CHECK(ukvm_uffd_register(f->uffd, f->region, REGION, UKVM_UFFD_MISSING,
				      UKVM_BACKING_ANONYMOUS, &err) == 0, "%s", err.message))
		return false;
	if (ukvm_ring_create(&f->ring, f->uffd, f->stop_fd, 4, &err)) {
		CHECK(err.kind == UKVM_ERR_HOST, "%s", err.message);
		ukt_skip_case(err.message);
		return false;
	}
	return true;
}

static void fixture_end(struct fixture *f)
{
	ukvm_ring_destroy(f->ring);
	if (f->stop_fd >= 0)
		close(f->stop_fd);
	if (f->uffd >= 0)
		close(f->uffd);	/* wakes a toucher left waiting, if a case failed */
	if (f->region && f->region != MAP_FAILED)
		munmap(f->region, REGION);
}

static void *touch(void *arg)
{
	return (void *)(uintptr_t)*(volatile uint8_t *)arg;
}

/* A thread that touches page (and waits in the fault until it is resolved). */
static bool touch_page(struct fixture *f, unsigned page, pthread_t *thread)
{
	return CHECK(pthread_create(thread, NULL, touch, f->region + page * PAGE) == 0);
}

/*
 * A case that failed leaves its toucher waiting in the fault: letting go of
 * the ring (which may hold a read of the uffd) and the uffd releases it.
 */
static void release_toucher(struct fixture *f, pthread_t thread)
{
	struct timespec ts;

	ukvm_ring_destroy(f->ring);
	f->ring = NULL;
	close(f->uffd);
	f->uffd = -1;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 2;
	CHECK(pthread_timedjoin_np(thread, NULL, &ts) == 0, "the toucher still waits");
}

/* Resolves the page of msg with a zero page and joins its toucher. */
static void resolve(struct fixture *f, const struct uffd_msg *msg, pthread_t thread)
{
	CHECK_EQ(msg->event, UFFD_EVENT_PAGEFAULT);
	CHECK_EQ(ukvm_uffd_zeropage(f->uffd, msg->arg.pagefault.address & ~(PAGE - 1), PAGE), 0);
	pthread_join(thread, NULL);
}

struct waiter {
	struct ukvm_ring *ring;
	ssize_t ret;
	const char *what;
};

/* Waits in the ring as a reader does, then cancels what it submitted, as a leaving one does. */
static void *wait_in_ring(void *arg)
{
	struct waiter *w = arg;
	const struct uffd_msg *msgs;

	ukvm_kick_thread_init();
	w->ret = ukvm_ring_next(w->ring, &msgs, &w->what);
	ukvm_ring_cancel(w->ring, 100 * NSEC_PER_MSEC);
	return NULL;
}
#endif

int main(void)
{
	struct ukvm_error err = { 0 };

	ukt_init("ring_internals");

#ifdef UKVM_HAVE_LIBURING
	struct fixture f;
	const struct uffd_msg *msgs;
	const char *what = "";
	pthread_t toucher;
	uint64_t one = 1;
	ssize_t n;

	UKT_CASE("a fault's message, then the stop eventfd") {
		if (fixture_start(&f) && touch_page(&f, 3, &toucher)) {
			n = ukvm_ring_next(f.ring, &msgs, &what);
			if (CHECK_EQ(n, (ssize_t)sizeof(struct uffd_msg)))
				resolve(&f, msgs, toucher);
			else
				release_toucher(&f, toucher);
			CHECK_EQ(write(f.stop_fd, &one, sizeof(one)), (ssize_t)sizeof(one));
			CHECK_EQ(ukvm_ring_next(f.ring, &msgs, &what), UKVM_RING_STOPPED);
			ukvm_ring_cancel(f.ring, 100 * NSEC_PER_MSEC);
		}
		fixture_end(&f);
	}

	UKT_CASE("a cancelled ring leaves the next fault to read(2)") {
		struct uffd_msg msg;

		if (fixture_start(&f)) {
			/* Both in flight: the ring waits for a fault that does not come. */
			CHECK_EQ(write(f.stop_fd, &one, sizeof(one)), (ssize_t)sizeof(one));
			CHECK_EQ(ukvm_ring_next(f.ring, &msgs, &what), UKVM_RING_STOPPED);
			ukvm_ring_cancel(f.ring, 100 * NSEC_PER_MSEC);
			/* Had the ring's read stayed, it would have taken this message. */
			if (touch_page(&f, 5, &toucher)) {
				ukt_sleep_ms(50);
				n = read(f.uffd, &msg, sizeof(msg));
				if (CHECK_EQ(n, (ssize_t)sizeof(msg)))
					resolve(&f, &msg, toucher);
				else
					release_toucher(&f, toucher);
			}
		}
		fixture_end(&f);
	}

	UKT_CASE("a kick ends the wait with -EINTR") {
		struct waiter w = { 0 };
		pthread_t thread;

		if (fixture_start(&f) && CHECK(ukvm_kick_init(&err) == 0, "%s", err.message)) {
			w.ring = f.ring;
			w.ret = 1;
			if (CHECK(pthread_create(&thread, NULL, wait_in_ring, &w) == 0)) {
				ukt_sleep_ms(50);
				CHECK(pthread_tryjoin_np(thread, NULL) == EBUSY, "the ring did not wait");
				pthread_kill(thread, ukvm_kick_signal());
				pthread_join(thread, NULL);
				CHECK_EQ(w.ret, -EINTR);
			}
		}
		fixture_end(&f);
	}

	UKT_CASE("check: a ring can wait on an empty uffd") {
		if (fixture_start(&f))
			CHECK(ukvm_ring_check(f.uffd, 0, &err) == 0, "%s", err.message);
		fixture_end(&f);
	}

	UKT_CASE("check: refused, saying why, where the kernel does not retry the read") {
		/*
		 * RWF_NOWAIT makes the kernel's io_uring complete the read of the
		 * empty O_NONBLOCK uffd at once with EAGAIN (REQ_F_NOWAIT), as it
		 * did for every O_NONBLOCK file before Linux 5.15.
		 */
		if (fixture_start(&f)) {
			err = (struct ukvm_error){ 0 };
			CHECK_EQ(ukvm_ring_check(f.uffd, RWF_NOWAIT, &err), -EOPNOTSUPP);
			CHECK(err.kind == UKVM_ERR_HOST, "kind %s", ukt_kind_name(err.kind));
			/* (where the uffd is not FMODE_NOWAIT, 6.1, the kernel refuses
			 * RWF_NOWAIT itself: EOPNOTSUPP, refused alike) */
			CHECK((strstr(err.message, "completed at once: Resource temporarily "
				      "unavailable (EAGAIN)") &&
			       strstr(err.message, "retries O_NONBLOCK files from Linux 5.15")) ||
			      strstr(err.message, "completed at once: Operation not supported"),
			      "%s", err.message);
			/* and the readers' own read (no flags) still waits on it */
			CHECK(ukvm_ring_check(f.uffd, 0, &err) == 0, "%s", err.message);
		}
		fixture_end(&f);
	}

	UKT_CASE("check: refused where a read completes at once instead of waiting") {
		int fds[2];

		/* A pipe's write end: its read fails at once (EBADF), as an old kernel's uffd read does (EAGAIN). */
		if (CHECK(pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0)) {
			err = (struct ukvm_error){ 0 };
			CHECK_EQ(ukvm_ring_check(fds[1], 0, &err), -EOPNOTSUPP);
			CHECK(err.kind == UKVM_ERR_HOST, "kind %s", ukt_kind_name(err.kind));
			CHECK(strstr(err.message, "completed at once"), "%s", err.message);
			close(fds[0]);
			close(fds[1]);
		}
	}
#else
	UKT_CASE("a build without liburing refuses, saying how to get it") {
		struct ukvm_ring *ring = (struct ukvm_ring *)&err;

		CHECK_EQ(ukvm_ring_create(&ring, 0, 0, 1, &err), -EOPNOTSUPP);
		CHECK(ring == NULL);
		CHECK(err.kind == UKVM_ERR_HOST && strstr(err.message, "apt-get install liburing-dev"),
		      "%s", err.message);
		err = (struct ukvm_error){ 0 };
		CHECK_EQ(ukvm_ring_check(0, 0, &err), -EOPNOTSUPP);
		CHECK(err.kind == UKVM_ERR_HOST, "kind %s", ukt_kind_name(err.kind));
	}
#endif

	return ukt_exit();
}
