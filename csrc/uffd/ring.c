/* SPDX-License-Identifier: MIT */
/*
 * wait="io_uring": each reader has a ring of its own (liburing), in which
 * it keeps one IORING_OP_READ of the non-blocking uffd in flight, of up to
 * read_batch messages into a buffer of its own, and an IORING_OP_POLL_ADD
 * of the pool's stop eventfd; it sleeps in io_uring_enter() until one of
 * them completes (or a kick's signal interrupts it). pool.c's loop resolves
 * what a read brought exactly as the other modes do.
 *
 * A ring per reader rather than one shared by the pool: a ring's
 * completions go to whoever reaps them, so a shared ring needs a lock or a
 * thread that hands the messages on (one more wakeup per fault, which is
 * what this mode is meant to save); and the kernel runs a request's
 * completion work in the task that submitted it, so a reader that submits
 * its own read is also the one woken for it.
 *
 * How the kernel reads a uffd through io_uring (fs/userfaultfd.c,
 * io_uring/rw.c and poll.c): io_uring first tries the read without
 * blocking; on an empty uffd that fails with EAGAIN, and because the uffd
 * can be polled, io_uring arms a one-shot internal poll on the uffd's wait
 * queue (fd_wqh) and issues the read again when it fires; no CQE until a
 * message is there. What this takes of the kernel: IORING_OP_READ (Linux
 * 5.6), poll-driven retry of a read that would block (5.7), and retry of a
 * file opened O_NONBLOCK at all: until Linux 5.15 (commit 5d329e1286b0,
 * "io_uring: allow retry for O_NONBLOCK if async is supported", also in
 * 5.14's stable releases) io_uring completed such a read at once with
 * EAGAIN. The uffd's own FMODE_NOWAIT and read_iter (Linux 6.10) are not
 * needed: io_uring counts an O_NONBLOCK file as one it may try without
 * blocking (io_file_get_flags), and reads a file that has only ->read
 * through loop_rw_iter(). Readers verify on 6.1, 6.12 and 6.18. No
 * setup flags, registered files or buffers are used. Rather than trust a
 * version, ukvm_ring_check() asks the kernel before the run.
 *
 * The herd: that internal poll joins fd_wqh as poll(2) does, not
 * exclusively (io_uring asks for EPOLLEXCLUSIVE for accept only), and a
 * fault wakes the whole queue (handle_userfault: wake_up_poll(fd_wqh)).
 * So with several readers on one uffd, one fault wakes every reader's
 * ring: each reader's thread is woken to run its request's completion
 * work, issues its read again, and all but one find the uffd empty,
 * re-arm the poll and sleep again inside io_uring_enter(), without a CQE
 * and without returning to user space. As with wait="read" that herd shows
 * in context_switches, not in spurious_wakeups: seen here (2 vCPUs, one
 * uffd, 4 readers, 4096 faults) 2.5 voluntary context switches per fault
 * against 2.3 for "read" and 1.0 for "epoll_exclusive", and 0 spurious
 * wakeups. Now and then the kernel hands a re-issued read to its worker
 * thread (iou-wrk-<tid>, gone with the reader), which completes it with
 * EAGAIN when another reader took the message first: a CQE that is
 * counted in spurious_wakeups (a few per thousand faults, when there are).
 * With a uffd per vCPU and one reader each there is no herd.
 */
#include <errno.h>
#include <stdbool.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/util.h"
#include "uffd/ring.h"

/*
 * The kernel's restart codes (include/linux/errno.h: ERESTARTSYS,
 * ERESTARTNOINTR, ERESTARTNOHAND, ERESTART_RESTARTBLOCK), which user space
 * has no names for; 515 between them is ENOIOCTLCMD, not one.
 */
static bool is_restart_code(int err)
{
	return err == 512 || err == 513 || err == 514 || err == 516;
}

#ifdef UKVM_HAVE_LIBURING
#include <liburing.h>

/* The read, the stop poll and a cancel for each: what can be in flight at once. */
#define RING_DEPTH		4
/* user_data of each request */
#define RING_READ		1
#define RING_STOP		2
#define RING_CANCEL		3
/* ukvm_ring_check(): how long the cancelled read may take to come back */
#define CHECK_CANCEL_NS		(200 * NSEC_PER_MSEC)

struct ukvm_ring {
	struct io_uring ring;
	int uffd;
	int stop_fd;
	uint32_t batch;
	bool read_armed;	/* the read is in the SQ or in flight */
	bool stop_armed;	/* the stop poll is */
	struct uffd_msg msgs[UKVM_MAX_READ_BATCH];	/* where the read puts its messages */
};

/* The kernel's answer to io_uring_setup, explained where it is the host's doing. */
static int ring_setup_error(int ret, struct ukvm_error *err)
{
	char disabled[16] = "";
	FILE *f;

	switch (-ret) {
	case ENOSYS:
		ukvm_err_set_hint(err, UKVM_ERR_HOST, ENOSYS, "wait io_uring: io_uring_setup",
				  "This kernel has no io_uring (CONFIG_IO_URING); use another "
				  "wait mode");
		return ret;
	case EPERM:
	case EACCES:
		f = fopen("/proc/sys/kernel/io_uring_disabled", "re");
		if (f) {
			if (!fgets(disabled, sizeof(disabled), f))
				disabled[0] = '\0';
			fclose(f);
			disabled[strcspn(disabled, "\n")] = '\0';
		}
		ukvm_err_set_hint(err, UKVM_ERR_HOST, -ret, "wait io_uring: io_uring_setup",
				  "The kernel refuses io_uring to this process "
				  "(/proc/sys/kernel/io_uring_disabled is %s: 0 allows it to all, 1 "
				  "only to CAP_SYS_ADMIN or the group in io_uring_group, 2 to none; "
				  "or a seccomp filter forbids it); use another wait mode",
				  disabled[0] ? disabled : "unreadable");
		return ret;
	default:
		ukvm_err_set(err, UKVM_ERR_RUN, -ret, "wait io_uring: io_uring_setup(%d entries)",
			     RING_DEPTH);
		return ret;
	}
}

int ukvm_ring_create(struct ukvm_ring **out, int uffd, int stop_fd, uint32_t batch,
		     struct ukvm_error *err)
{
	struct ukvm_ring *ring;
	int ret;

	*out = NULL;
	if (batch < 1 || batch > UKVM_MAX_READ_BATCH) {
		ukvm_err_set(err, UKVM_ERR_CONFIG, 0, "read_batch must be between 1 and %d, not %u",
			     UKVM_MAX_READ_BATCH, batch);
		return -EINVAL;
	}
	ring = calloc(1, sizeof(*ring));
	if (!ring) {
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating an io_uring");
		return -ENOMEM;
	}
	/*
	 * No setup flags: the ring is made here, by the thread that sets the
	 * pool up, and used by the reader's own (IORING_SETUP_SINGLE_ISSUER
	 * and DEFER_TASKRUN would tie it to this one).
	 */
	ret = io_uring_queue_init(RING_DEPTH, &ring->ring, 0);
	if (ret < 0) {
		free(ring);
		return ring_setup_error(ret, err);
	}
	ring->uffd = uffd;
	ring->stop_fd = stop_fd;
	ring->batch = batch;
	*out = ring;
	return 0;
}

/* Queues the read of the uffd into the ring's buffer, with the RWF_* flags rw_flags. */
static int ring_arm_read(struct ukvm_ring *ring, int rw_flags)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&ring->ring);

	if (!sqe)
		return -EBUSY;	/* cannot happen: RING_DEPTH covers all */
	/* The uffd has no position; 0 keeps io_uring from using the file's. */
	io_uring_prep_read(sqe, ring->uffd, ring->msgs, ring->batch * sizeof(ring->msgs[0]), 0);
	sqe->rw_flags = rw_flags;
	io_uring_sqe_set_data64(sqe, RING_READ);
	ring->read_armed = true;
	return 0;
}

/* Queues the poll of the stop eventfd, which completes once it is readable. */
static int ring_arm_stop(struct ukvm_ring *ring)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&ring->ring);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_poll_add(sqe, ring->stop_fd, POLLIN);
	io_uring_sqe_set_data64(sqe, RING_STOP);
	ring->stop_armed = true;
	return 0;
}

ssize_t ukvm_ring_next(struct ukvm_ring *ring, const struct uffd_msg **msgs, const char **what)
{
	struct io_uring_cqe *cqe;
	uint64_t data;
	int ret, res;

	ret = ring->stop_armed ? 0 : ring_arm_stop(ring);
	if (!ret && !ring->read_armed)
		ret = ring_arm_read(ring, 0);
	if (ret) {
		*what = "io_uring_get_sqe";
		return ret;
	}
	for (;;) {
		/*
		 * Submits what was queued and sleeps for a completion. A
		 * signal ends the sleep: -EINTR, or, when something was
		 * submitted in the same call, a return without a CQE.
		 */
		if (io_uring_peek_cqe(&ring->ring, &cqe)) {
			ret = io_uring_submit_and_wait(&ring->ring, 1);
			if (ret < 0) {
				*what = "io_uring_enter";
				return ret;
			}
			if (io_uring_peek_cqe(&ring->ring, &cqe))
				return -EINTR;
		}
		data = io_uring_cqe_get_data64(cqe);
		res = cqe->res;
		io_uring_cqe_seen(&ring->ring, cqe);
		switch (data) {
		case RING_STOP:
			ring->stop_armed = false;
			if (res < 0) {
				*what = "IORING_OP_POLL_ADD(stop eventfd)";
				return res;
			}
			return UKVM_RING_STOPPED;
		case RING_READ:
			ring->read_armed = false;
			if (res > 0) {
				*msgs = ring->msgs;
				return res;
			}
			/*
			 * A read the uffd cut short for a pending signal
			 * (userfaultfd_ctx_read's -ERESTARTSYS) is a kick, as
			 * -EINTR is: Debian's 6.18.15 completed one, once in
			 * the kernel matrix, with the kernel's own restart
			 * code, 512, which never reaches user space elsewhere.
			 */
			if (is_restart_code(-res))
				return -EINTR;
			*what = "IORING_OP_READ(uffd)";
			return res ? res : -EPROTO;	/* a uffd read returns a message or fails */
		default:
			break;	/* a cancel's own completion: nothing to hand back */
		}
	}
}

/* Queues a cancel of the request whose user_data is data. */
static void ring_cancel_one(struct ukvm_ring *ring, uint64_t data)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&ring->ring);

	if (!sqe)
		return;	/* the ring's teardown cancels it instead */
	io_uring_prep_cancel64(sqe, data, 0);
	io_uring_sqe_set_data64(sqe, RING_CANCEL);
}

void ukvm_ring_cancel(struct ukvm_ring *ring, uint64_t timeout_ns)
{
	uint64_t deadline = ukvm_deadline_after(timeout_ns), now, data;
	struct io_uring_cqe *cqe;
	int ret;

	if (!ring)
		return;
	if (ring->read_armed)
		ring_cancel_one(ring, RING_READ);
	if (ring->stop_armed)
		ring_cancel_one(ring, RING_STOP);
	if (io_uring_submit(&ring->ring) < 0)
		return;	/* the ring's teardown cancels them instead */
	while (ring->read_armed || ring->stop_armed) {
		struct __kernel_timespec ts;

		now = ukvm_now_ns();
		if (now >= deadline)
			return;
		ts.tv_sec = (long long)((deadline - now) / NSEC_PER_SEC);
		ts.tv_nsec = (long long)((deadline - now) % NSEC_PER_SEC);
		cqe = NULL;
		ret = io_uring_wait_cqe_timeout(&ring->ring, &cqe, &ts);
		if (ret < 0 || !cqe)
			continue;	/* ETIME, EINTR: the deadline decides */
		data = io_uring_cqe_get_data64(cqe);
		io_uring_cqe_seen(&ring->ring, cqe);
		if (data == RING_READ)
			ring->read_armed = false;
		else if (data == RING_STOP)
			ring->stop_armed = false;
	}
}

void ukvm_ring_destroy(struct ukvm_ring *ring)
{
	if (!ring)
		return;
	io_uring_queue_exit(&ring->ring);
	free(ring);
}

int ukvm_ring_check(int uffd, int rw_flags, struct ukvm_error *err)
{
	const char *call = "wait io_uring: IORING_OP_READ of an empty non-blocking uffd "
			   "completed at once";
	struct ukvm_ring *ring;
	struct io_uring_cqe *cqe;
	int ret, res;

	ret = ukvm_ring_create(&ring, uffd, -1, 1, err);
	if (ret)
		return ret;
	/* The read alone: nothing is queued on the uffd while setting up. */
	ret = ring_arm_read(ring, rw_flags);
	if (!ret)
		ret = io_uring_submit(&ring->ring);
	if (ret < 0) {
		ukvm_err_set(err, UKVM_ERR_RUN, -ret, "wait io_uring: io_uring_submit(a read of "
			     "the uffd)");
		goto out;
	}
	ret = 0;
	/*
	 * A kernel that cannot wait for the uffd has completed the read by
	 * the time io_uring_enter() returns (inline, before any poll).
	 */
	if (!io_uring_peek_cqe(&ring->ring, &cqe)) {
		res = cqe->res;
		io_uring_cqe_seen(&ring->ring, cqe);
		ring->read_armed = false;
		ret = -EOPNOTSUPP;
		if (res == -EAGAIN)
			ukvm_err_set_hint(err, UKVM_ERR_HOST, EAGAIN, call, UKVM_RING_NO_RETRY
					  "; use another wait mode");
		else if (res == -EINVAL)
			ukvm_err_set_hint(err, UKVM_ERR_HOST, EINVAL, call, UKVM_RING_NO_READ
					  "; use another wait mode");
		else if (res < 0)
			ukvm_err_set_hint(err, UKVM_ERR_HOST, -res, call, "A ring cannot wait for "
					  "this uffd; use another wait mode");
		else
			ukvm_err_set(err, UKVM_ERR_HOST, 0, "%s, with %d bytes: a ring cannot wait for "
				     "this uffd; use another wait mode", call, res);
		goto out;
	}
	/* It waits: a reader must also be able to take it back when it leaves. */
	ukvm_ring_cancel(ring, CHECK_CANCEL_NS);
	if (ring->read_armed) {
		ret = -EOPNOTSUPP;
		ukvm_err_set(err, UKVM_ERR_HOST, 0, "wait io_uring: a read of the uffd through "
			     "io_uring did not come back within %llu ms of its cancel, so a "
			     "reader could not be stopped; use another wait mode",
			     (unsigned long long)(CHECK_CANCEL_NS / NSEC_PER_MSEC));
	}
out:
	ukvm_ring_destroy(ring);
	return ret;
}

int ukvm_ring_built(struct ukvm_error *err)
{
	return 0;
}

#else /* !UKVM_HAVE_LIBURING */

/* What a build without liburing says, wherever io_uring is asked for. */
static int ring_not_built(struct ukvm_error *err)
{
	ukvm_err_set(err, UKVM_ERR_HOST, 0, "wait: this uffdkvm was built without liburing, "
		     "so wait \"io_uring\" is not available; install liburing's headers and "
		     "static library (Debian, Ubuntu: apt-get install liburing-dev) and build "
		     "uffdkvm again (without UFFDKVM_NO_LIBURING=1), or use another wait mode");
	return -EOPNOTSUPP;
}

int ukvm_ring_built(struct ukvm_error *err)
{
	return ring_not_built(err);
}

int ukvm_ring_create(struct ukvm_ring **out, int uffd, int stop_fd, uint32_t batch,
		     struct ukvm_error *err)
{
	*out = NULL;
	return ring_not_built(err);
}

ssize_t ukvm_ring_next(struct ukvm_ring *ring, const struct uffd_msg **msgs, const char **what)
{
	*what = "io_uring (not built)";
	return -EOPNOTSUPP;
}

void ukvm_ring_cancel(struct ukvm_ring *ring, uint64_t timeout_ns)
{
}

void ukvm_ring_destroy(struct ukvm_ring *ring)
{
}

int ukvm_ring_check(int uffd, int rw_flags, struct ukvm_error *err)
{
	return ring_not_built(err);
}

#endif
