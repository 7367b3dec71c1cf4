/* SPDX-License-Identifier: MIT */
/*
 * A reader thread: it waits for its uffd's fault messages, reads them and
 * hands each to the resolver it owns (resolve.c). How it waits is the
 * experiment:
 *
 *   poll            poll(2) on the shared uffd. Every waiting reader wakes for
 *                   every fault, one reads it, the rest read nothing (EAGAIN):
 *                   the thundering herd, counted as spurious wakeups.
 *   epoll           each reader its own epoll set, plain EPOLLIN: the same herd.
 *   epoll_exclusive each reader its own epoll set with EPOLLIN|EPOLLEXCLUSIVE on
 *                   the uffd, so a fault wakes one of them.
 *   read            a blocking read(2). The uffd's read waiters sit on the same
 *                   wait queue as poll's, added non-exclusively (fs/userfaultfd.c
 *                   userfaultfd_ctx_read), so every fault wakes them all: the
 *                   losers find the queue empty in the kernel and sleep again
 *                   without returning, a herd that only context_switches shows.
 *   io_uring        a ring per reader (ring.c) keeps a read of the uffd in flight;
 *                   the kernel parks it on the same wait queue, non-exclusively:
 *                   the same in-kernel herd as read's.
 *   spin            a non-blocking read in a loop, on a CPU of its own: no wait.
 *   spin_idle       spin's loop at SCHED_IDLE, on a CPU it shares with a vCPU:
 *                   it runs when the vCPU blocks, so the CPU that faulted
 *                   resolves, even on a uffd every vCPU shares.
 *
 * Every reader also waits on the pool's stop eventfd (read mode: it is kicked
 * with a signal instead). It keeps its counters in its own cache line and
 * they survive every exit path, errors included. Making, starting and
 * stopping readers is the pool's (pool.c).
 */
#include <errno.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/ctl.h"
#include "base/errors.h"
#include "base/kick.h"
#include "base/thread.h"
#include "base/util.h"
#include "uffd/reader.h"
#include "uffd/resolve.h"
#include "uffd/ring.h"
#include "uffd/uffd.h"

#define EV_UFFD			0
#define EV_STOP			1
/* A leaving io_uring reader waits this long at most for its ring to let go of the uffd. */
#define RING_CANCEL_NS		(100 * NSEC_PER_MSEC)

/*
 * The time a message was read; stats basic reads no clocks at all. Online
 * (online.h), the reader is awake from here.
 */
static uint64_t reader_clock(struct ukvm_reader *r)
{
	struct ukvm_resolve_area *a = r->area;

	if (a->online)
		return ukvm_online_stamp(a->online, r->res->queue);
	return a->full_stats ? ukvm_now_ns() : 0;
}

/* Online: about to wait without a timeout (online.h), or to leave. */
static void reader_sleep(struct ukvm_reader *r)
{
	struct ukvm_resolve_area *a = r->area;

	if (a->online)
		ukvm_online_sleep(a->online, r->res->queue);
}

static bool reader_stopping(struct ukvm_reader *r)
{
	return atomic_load_explicit(&r->area->stop, memory_order_relaxed);
}

/*
 * Why a read is made, which decides what an empty uffd counts as. Empty is
 * EAGAIN, or on a non-blocking uffd EINTR too: the kernel's read looks for
 * a message before it looks for a pending signal, so a kick that lands in
 * a non-blocking read says the queue was empty (userfaultfd_ctx_read).
 */
enum reader_read_kind {
	READ_WOKEN,	/* the first after a wakeup: empty is a spurious wakeup */
	READ_DRAIN,	/* after a full batch: empty is read_sizes[0] */
	READ_SPIN,	/* a spinner's poll: empty is nothing worth counting */
	READ_BLOCKING,	/* wait="read": EINTR is a kick while it waited, no wakeup */
};

/*
 * What one read of the uffd brought, n bytes of messages or -errno (call
 * names the read: read(2) or the ring's), counted and each message
 * resolved in turn: the number of messages (0: nothing read: EAGAIN, or
 * EINTR for a kick), or -errno: leave (the failure is recorded as the
 * run's, and the rest of the batch, already taken from the uffd, stays
 * unresolved: the run ends, and closing the uffd wakes its vCPUs). Every
 * message of a batch is stamped read when the read returned, so a later
 * one's service includes its wait behind the ones before it. Every wait
 * mode's reads come through here, so they count alike.
 */
static int reader_take(struct ukvm_reader *r, const struct uffd_msg *msgs, ssize_t n,
		       enum reader_read_kind kind, const char *call)
{
	uint64_t t_read;
	int i, count, ret;

	if (n < 0) {
		if (n == -EAGAIN || (n == -EINTR && kind != READ_BLOCKING)) {
			if (kind == READ_WOKEN)
				r->res->stats.spurious_wakeups++;
			else if (kind == READ_DRAIN)
				r->res->stats.read_sizes[0]++;
			return 0;
		}
		if (n == -EINTR)
			return 0;
		ukvm_ctl_fail(r->area->ctl, UKVM_ERR_RUN, (int)-n, "%s: %s", r->res->who, call);
		return (int)n;
	}
	if (n == 0 || n % sizeof(msgs[0]) || (size_t)n > r->read_batch * sizeof(msgs[0])) {
		ukvm_ctl_fail(r->area->ctl, UKVM_ERR_RUN, 0,
			      "%s: %s returned %zd bytes, not a multiple "
			      "of %zu up to %u messages", r->res->who, call, n,
			      sizeof(msgs[0]), r->read_batch);
		return -EPROTO;
	}
	t_read = reader_clock(r);
	count = (int)(n / sizeof(msgs[0]));
	r->res->stats.reads++;
	r->res->stats.read_sizes[count]++;
	for (i = 0; i < count; i++) {
		/* Stopping: the run is over, or failed and its uffds will be closed. */
		if (i && reader_stopping(r))
			break;
		ret = ukvm_resolve_message(r->res, &msgs[i], t_read);
		if (ret)
			return ret;
	}
	return count;
}

/* One read(2) of up to read_batch messages, through reader_take(). */
static int reader_read(struct ukvm_reader *r, enum reader_read_kind kind)
{
	struct uffd_msg msgs[UKVM_MAX_READ_BATCH];
	ssize_t n;

	n = read(r->area->uffd, msgs, r->read_batch * sizeof(msgs[0]));
	return reader_take(r, msgs, n < 0 ? -errno : n, kind, "read(uffd)");
}

/*
 * After a wakeup: one read, and while reads come back full (read_batch
 * messages, so more may be queued) more, UKVM_READS_PER_WAKEUP in all at
 * most. A read that comes back short emptied the queue (the kernel returns
 * all it has), and messages that arrive later wake a reader. 0, or -errno.
 */
static int reader_serve(struct ukvm_reader *r)
{
	uint32_t batch = r->read_batch;
	int reads, ret;

	for (reads = 0; reads < UKVM_READS_PER_WAKEUP; reads++) {
		ret = reader_read(r, reads ? READ_DRAIN : READ_WOKEN);
		if (ret <= 0)
			return ret;
		if (batch == 1 || (uint32_t)ret < batch || reader_stopping(r))
			return 0;
	}
	return 0;
}

static void reader_loop_poll(struct ukvm_reader *r)
{
	while (!reader_stopping(r)) {
		struct pollfd fds[2] = {
			{ .fd = r->area->uffd, .events = POLLIN },
			{ .fd = r->stop_fd, .events = POLLIN },
		};

		reader_sleep(r);
		if (poll(fds, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			ukvm_ctl_fail(r->area->ctl, UKVM_ERR_RUN, errno, "%s: poll", r->res->who);
			return;
		}
		if (fds[1].revents)
			return;
		r->res->stats.wakeups++;
		if (fds[0].revents & (POLLERR | POLLHUP | POLLNVAL)) {
			ukvm_ctl_fail(r->area->ctl, UKVM_ERR_RUN, 0,
				      "%s: poll reported 0x%x on the uffd", r->res->who, fds[0].revents);
			return;
		}
		if (reader_serve(r) < 0)
			return;
	}
}

static void reader_loop_epoll(struct ukvm_reader *r)
{
	while (!reader_stopping(r)) {
		struct epoll_event evs[2];
		bool fault = false;
		int n, i;

		reader_sleep(r);
		n = epoll_wait(r->epfd, evs, 2, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			ukvm_ctl_fail(r->area->ctl, UKVM_ERR_RUN, errno,
				      "%s: epoll_wait", r->res->who);
			return;
		}
		for (i = 0; i < n; i++) {
			if (evs[i].data.u32 == EV_STOP)
				return;
			if (evs[i].events & (EPOLLERR | EPOLLHUP)) {
				ukvm_ctl_fail(r->area->ctl, UKVM_ERR_RUN, 0,
					      "%s: epoll reported 0x%x on the uffd", r->res->who, evs[i].events);
				return;
			}
			fault = true;
		}
		if (!fault)
			continue;
		r->res->stats.wakeups++;
		if (reader_serve(r) < 0)
			return;
	}
}

/* The uffd is blocking here: a read returns a message, or EINTR for a kick. */
static void reader_loop_read(struct ukvm_reader *r)
{
	int ret;

	while (!reader_stopping(r)) {
		reader_sleep(r);
		ret = reader_read(r, READ_BLOCKING);
		if (ret < 0)
			return;
		r->res->stats.wakeups += ret > 0;	/* a blocking read that returned messages */
	}
}

/*
 * The uffd is non-blocking here, and the reader never sleeps: it reads, and
 * with nothing there pauses the CPU for a moment and reads again. Meant for
 * readers with a CPU of their own (the latency floor: no wakeup at all); a
 * "wakeup" is a read that found messages after reads that found none.
 */
static void reader_loop_spin(struct ukvm_reader *r)
{
	bool idle = true;
	int ret;

	while (!reader_stopping(r)) {
		ret = reader_read(r, READ_SPIN);
		if (ret < 0)
			return;
		if (ret == 0) {
			if (!idle)
				reader_sleep(r);	/* it reads again at once, but may find nothing for long */
			__builtin_ia32_pause();
			idle = true;
			continue;
		}
		r->res->stats.wakeups += idle;
		idle = false;
	}
}

/*
 * io_uring (ring.c): the reader's own ring keeps one read of the uffd in
 * flight and a poll of the stop eventfd, and the reader sleeps in the ring
 * until one completes; a completion with messages is a wakeup and a read.
 * After a full batch it does not drain with read(2) as reader_serve()
 * does: it resubmits the ring's read, which it must do before it sleeps
 * anyway. Issued at once, that read takes what is queued and completes
 * within the same io_uring_enter() a drain's read(2) would have cost; on
 * an empty uffd it arms the poll and sleeps in that same call, where a
 * drain spends an empty read(2) and then another call to wait. So every
 * read goes through the ring (ring_completions == reads) and read_sizes[0]
 * stays 0. Each trip through io_uring_enter() lets the other readers' rings
 * take messages too, so no bound on reads per wakeup is needed here.
 */
static void reader_loop_ring(struct ukvm_reader *r)
{
	const struct uffd_msg *msgs = NULL;
	const char *what = "io_uring";
	ssize_t n;

	while (!reader_stopping(r)) {
		reader_sleep(r);
		n = ukvm_ring_next(r->ring, &msgs, &what);
		if (n == -EINTR)
			continue;	/* a kick: look at the stop flag again */
		if (n == UKVM_RING_STOPPED)
			break;
		if (n < 0 && n != -EAGAIN) {
			ukvm_ctl_fail(r->area->ctl, UKVM_ERR_RUN, (int)-n, "%s: %s", r->res->who, what);
			break;
		}
		r->res->stats.wakeups++;
		r->res->stats.ring_completions += n > 0;
		if (reader_take(r, msgs, n, READ_WOKEN, "IORING_OP_READ(uffd)") < 0)
			break;
	}
	/* No read of the uffd outlives the reader (ring.h). */
	ukvm_ring_cancel(r->ring, RING_CANCEL_NS);
}

/*
 * The thread's own counters, over its whole life (RUSAGE_THREAD counts from
 * its start), on every way out: a reader that failed to pin has them too.
 */
static void reader_record_usage(struct ukvm_reader *r)
{
	struct ukvm_thread_usage usage;

	if (ukvm_thread_usage(&usage))
		return;
	r->res->stats.context_switches = usage.context_switches;
	r->res->stats.voluntary_context_switches = usage.voluntary_context_switches;
	r->res->stats.cpu_ns = usage.cpu_ns;
}

/*
 * wait="spin_idle": the spinner drops to SCHED_IDLE, so on a CPU it shares it
 * gets the CPU when nothing else there wants it (and a sliver, weight 3 to a
 * normal thread's 1024, of a busy one). Beside its pinned vCPU that is when
 * the vCPU has blocked in a fault: the CPU would go idle, and the reader is
 * already runnable there, so the fault costs a switch on that CPU and no
 * wakeup; the resolving ioctl's wakeup of the vCPU preempts the reader at
 * once (a woken normal thread preempts a SCHED_IDLE one). Lowering one's
 * own policy needs no privilege; raising it back would (CAP_SYS_NICE), and
 * measured here it doubled the cost of a fault, so the reader stays idle.
 */
static int reader_become_idle(struct ukvm_reader *r)
{
	struct sched_param param = { .sched_priority = 0 };
	int err;

	if (sched_setscheduler(0, SCHED_IDLE, &param) == 0)
		return 0;
	err = errno;
	ukvm_ctl_fail(r->area->ctl, UKVM_ERR_RUN, err,
		      "%s: sched_setscheduler(SCHED_IDLE) (wait='spin_idle')", r->res->who);
	return -err;
}

#ifdef UKVM_TEST_HOOKS
/* UKVM_INJECT_READER_CRASH: a fault of this thread's own, as a bug would make. */
static void reader_crash(void)
{
	volatile uint8_t *page = mmap(NULL, UKVM_PAGE_SIZE, PROT_NONE,
				      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (page != MAP_FAILED)
		*page = 1;	/* SIGSEGV, delivered to this thread at once */
}
#endif

void *ukvm_reader_thread(void *arg)
{
	struct ukvm_reader *r = arg;
	struct ukvm_ctl *ctl = r->area->ctl;
	int ret;

	ukvm_kick_thread_init();
	r->res->stats.tid = (int32_t)gettid();
	ukvm_thread_start(&r->state);
	ukvm_uffd_thread_init(ctl, r->res->who);
#ifdef UKVM_TEST_HOOKS
	if (ctl->inject == UKVM_INJECT_READER_CRASH && r->area->uffd_index == 0 &&
	    r->index == 0)
		reader_crash();
#endif
	ret = ukvm_thread_pin(r->cpu, r->res->stats.cpus);
	if (ret) {
		ukvm_ctl_fail(ctl, UKVM_ERR_RUN, -ret, "%s: pinning to CPU %d (pin_readers)",
			      r->res->who, r->cpu);
		goto out;
	}
	ukvm_thread_at(&r->state, "waiting for or resolving faults");
	switch (r->wait) {
	case UKVM_WAIT_POLL:
		reader_loop_poll(r);
		break;
	case UKVM_WAIT_READ:
		reader_loop_read(r);
		break;
	case UKVM_WAIT_SPIN:
		reader_loop_spin(r);
		break;
	case UKVM_WAIT_SPIN_IDLE:
		ret = reader_become_idle(r);
		if (ret == 0)
			reader_loop_spin(r);
		break;
	case UKVM_WAIT_IO_URING:
		reader_loop_ring(r);
		break;
	default:
		reader_loop_epoll(r);
		break;
	}
out:
	reader_sleep(r);	/* gone: it holds no other queue back */
#ifdef UKVM_TEST_HOOKS
	if (r->stall_ms)
		ukvm_thread_stall(&r->state, r->stall_ms);
#endif
	reader_record_usage(r);
	ukvm_thread_at(&r->state, "leaving");
	atomic_store(&r->exited, true);
	return NULL;
}

int ukvm_reader_prepare(struct ukvm_reader *r, struct ukvm_error *err)
{
	struct epoll_event ev;

	if (r->wait == UKVM_WAIT_IO_URING)
		return ukvm_ring_create(&r->ring, r->area->uffd, r->stop_fd, r->read_batch,
					err);

	r->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (r->epfd < 0)
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "%s: epoll_create1", r->res->who);
	ev.events = EPOLLIN;
	if (r->wait == UKVM_WAIT_EPOLL_EXCLUSIVE)
		ev.events |= EPOLLEXCLUSIVE;
	ev.data.u64 = 0;
	ev.data.u32 = EV_UFFD;
	if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, r->area->uffd, &ev))
		return ukvm_err_set(err, UKVM_ERR_HOST, errno, "%s: epoll_ctl(ADD uffd%s)",
				    r->res->who, r->wait == UKVM_WAIT_EPOLL_EXCLUSIVE ?
				    ", EPOLLEXCLUSIVE" : "");
	ev.events = EPOLLIN;
	ev.data.u64 = 0;
	ev.data.u32 = EV_STOP;
	if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, r->stop_fd, &ev))
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "%s: epoll_ctl(ADD stop eventfd)",
				    r->res->who);
	return 0;
}
