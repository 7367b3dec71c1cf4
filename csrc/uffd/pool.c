/* SPDX-License-Identifier: MIT */
/*
 * Reader pools: the readers of one uffd (reader.c: the threads, and their
 * ways of waiting) and the resolvers they own, made, started and stopped
 * together. Stopping waits for the readers until a deadline, never longer,
 * and a uffd whose reader would not stop is let go of by its number.
 *
 * What resolving a message takes (the fetch, the ioctl, the wake, the
 * record, readahead) is resolve.c's and prefetch.c's; with resolver vcpu
 * the pool only makes and frees the vCPUs' resolvers.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/kick.h"
#include "base/thread.h"
#include "base/util.h"
#include "uffd/pool.h"
#include "uffd/prefetch.h"
#include "uffd/pusher.h"
#include "uffd/reader.h"
#include "uffd/resolve.h"
#include "uffd/ring.h"

#define READER_STACK_BYTES	(512ULL << 10)
#ifdef UKVM_TEST_HOOKS
/*
 * UKVM_INJECT_RELEASE_DUP3: how long uffd 0's last reader stays, holding
 * the uffd's number, for each failing swap: each swap (stop.c tries once
 * as it stops the vCPUs, 2 s at most, and again as it stops the readers)
 * then meets the reader still there.
 */
#define RELEASE_DUP3_STALL_MS	1500
#endif

/* Whether each reader waits through an fd of its own (an epoll set or a ring). */
static bool pool_wait_fd(const struct ukvm_pool *pool)
{
	return !pool->area.vcpu_resolvers &&
	       (pool->wait == UKVM_WAIT_IO_URING || pool->wait == UKVM_WAIT_EPOLL ||
		pool->wait == UKVM_WAIT_EPOLL_EXCLUSIVE);
}

uint32_t ukvm_pool_fds(const struct ukvm_pool *pool, enum ukvm_source_kind source)
{
	/* The uffd and the stop eventfd; per reader its wait fd; per resolver its conn. */
	return 2 + pool->nr_readers * ((pool_wait_fd(pool) ? 1 : 0) + ukvm_resolve_fds(source));
}

uint32_t ukvm_pool_threads(const struct ukvm_pool *pool)
{
	return pool->area.vcpu_resolvers ? 0 : pool->nr_readers;
}

#ifdef UKVM_TEST_HOOKS
/* The fds a started pool holds, from its state: what ukvm_pool_fds() must have said. */
static uint32_t pool_fds_held(const struct ukvm_pool *pool)
{
	uint32_t i, n = (pool->area.uffd >= 0) + (pool->stop_fd >= 0);

	for (i = 0; i < pool->made; i++) {
		if (pool->readers)
			n += (pool->readers[i].epfd >= 0) + (pool->readers[i].ring != NULL);
		n += pool->resolvers[i].conn.remote != NULL;
	}
	return n;
}
#endif

void ukvm_pool_init(struct ukvm_pool *pool)
{
	memset(pool, 0, sizeof(*pool));
	ukvm_resolve_area_init(&pool->area);
	pool->stop_fd = -1;
}

/* An array of n aligned entries of size bytes, zeroed: 0 or -ENOMEM. */
static int pool_alloc(void **out, uint32_t n, size_t size)
{
	if (posix_memalign(out, UKVM_CACHELINE, (n ?: 1) * size)) {
		*out = NULL;
		return -ENOMEM;
	}
	memset(*out, 0, (n ?: 1) * size);
	return 0;
}

/* Resolver i of the pool, and with reader threads reader i that owns it: made, prepared. */
static int pool_make(struct ukvm_pool *pool, uint32_t i, struct ukvm_error *err)
{
	struct ukvm_fault_resolver *res = &pool->resolvers[i];
	struct ukvm_reader *r = pool->readers ? &pool->readers[i] : NULL;
	bool vcpu = pool->area.vcpu_resolvers;
	uint32_t k = pool->first_reader + i;
	int ret;

	ukvm_resolve_init(res, &pool->area, i, k, vcpu ? (int32_t)(pool->first_vcpu + i) : -1);
	if (pool->area.online) {
		res->queue = ukvm_online_attach(pool->area.online);
		if (!res->queue)
			return ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM,
					    "uffd %u: the online statistics' queue of resolver %u",
					    pool->area.uffd_index, i);
	}
	if (r) {
		r->area = &pool->area;
		r->wait = pool->wait;
		r->read_batch = pool->read_batch;
		r->stop_fd = pool->stop_fd;
		r->res = res;
		r->index = i;
		r->epfd = -1;
		r->cpu = pool->nr_pins ? pool->pins[k % pool->nr_pins] : -1;
		atomic_init(&r->exited, false);
#ifdef UKVM_TEST_HOOKS
		/* The stalled reader of UKVM_INJECT_READER_STALL (and RELEASE_DUP3): uffd 0's last. */
		if (pool->area.uffd_index == 0 && i == pool->nr_readers - 1)
			r->stall_ms = pool->area.ctl->inject == UKVM_INJECT_READER_STALL ?
				      pool->area.ctl->inject_after :
				      pool->area.ctl->inject == UKVM_INJECT_RELEASE_DUP3 ?
				      RELEASE_DUP3_STALL_MS * pool->area.ctl->inject_after : 0;
#endif
	}
	pool->made = i + 1;
	ret = ukvm_resolve_prepare(res, pool->stop_fd, err);
	ret = ret ?: ukvm_prefetch_prepare(res, err);
	return ret ?: r && pool_wait_fd(pool) ? ukvm_reader_prepare(r, err) : 0;
}

int ukvm_pool_start(struct ukvm_pool *pool, struct ukvm_error *err)
{
	struct ukvm_resolve_area *a = &pool->area;
	uint32_t i;
	int ret;

	pool->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (pool->stop_fd < 0)
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "uffd %u: eventfd", a->uffd_index);
	ret = pool_alloc((void **)&pool->resolvers, pool->nr_readers, sizeof(*pool->resolvers));
	if (!ret && !a->vcpu_resolvers)
		ret = pool_alloc((void **)&pool->readers, pool->nr_readers, sizeof(*pool->readers));
	if (ret)
		return ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "uffd %u: allocating %u %s",
				    a->uffd_index, pool->nr_readers,
				    a->vcpu_resolvers ? "resolvers" : "readers");
	ret = ukvm_resolve_area_create(a, pool->nr_readers, pool->vcpus_sharing, err);
	for (i = 0; !ret && i < pool->nr_readers; i++)
		ret = pool_make(pool, i, err);
#ifdef UKVM_TEST_HOOKS
	/* The run's fd budget counts this pool by ukvm_pool_fds(): a drift shows in any test. */
	if (!ret && pool_fds_held(pool) != ukvm_pool_fds(pool, a->source->kind))
		ret = ukvm_err_set(err, UKVM_ERR_RUN, 0, "uffd %u holds %u fds, but its fd budget "
				   "(ukvm_pool_fds) counts %u: the two have drifted apart",
				   a->uffd_index, pool_fds_held(pool),
				   ukvm_pool_fds(pool, a->source->kind));
#endif
	if (ret || a->vcpu_resolvers)
		return ret;	/* resolver vcpu: the vCPU threads resolve their own faults */
	for (i = 0; i < pool->nr_readers; i++) {
		struct ukvm_reader *r = &pool->readers[i];

		ret = ukvm_thread_create(a->ctl, &r->thread, READER_STACK_BYTES, ukvm_reader_thread,
					 r);
		if (ret)
			return ukvm_err_set(err, UKVM_ERR_RUN, -ret,
					    "uffd %u: pthread_create(reader %u of %u)",
					    a->uffd_index, i, pool->nr_readers);
		r->thread_started = true;
	}
	return 0;
}

void ukvm_pool_request_stop(struct ukvm_pool *pool)
{
	uint64_t one = 1;

	if (atomic_exchange(&pool->area.stop, true))
		return;
	if (pool->stop_fd >= 0 && write(pool->stop_fd, &one, sizeof(one)) < 0) {
		/* The eventfd counter cannot overflow from one write; kicks still work. */
	}
}

uint32_t ukvm_pool_reap(struct ukvm_pool *pool, bool kick)
{
	uint32_t i, running = 0;

	for (i = 0; pool->readers && i < pool->made; i++) {
		struct ukvm_reader *r = &pool->readers[i];

		if (!r->thread_started)
			continue;
		if (atomic_load(&r->exited)) {
			pthread_join(r->thread, NULL);	/* it is returning: prompt */
			r->thread_started = false;
			continue;
		}
		running++;
		if (kick)
			pthread_kill(r->thread, ukvm_kick_signal());
	}
	return running;
}

uint32_t ukvm_pool_stop(struct ukvm_pool *pools, uint32_t nr, struct ukvm_pusher *pusher,
			uint64_t deadline_ns)
{
	uint32_t u, running;
	int rounds;

	/* The pusher first: it installs into the pools' uffds. */
	if (pusher)
		ukvm_pusher_request_stop(pusher);
	for (u = 0; u < nr; u++)
		ukvm_pool_request_stop(&pools[u]);
	/*
	 * Readers in poll/epoll wake on the eventfd. A reader blocked in
	 * read(2) (or sleeping out a delay) needs a signal; a kick can land
	 * just before it blocks, so kick until it has left. One that does not
	 * leave by the deadline is left running for the caller to report,
	 * never waited for without a bound.
	 */
	for (rounds = 0;; rounds++) {
		running = pusher ? ukvm_pusher_reap(pusher, rounds > 0) : 0;
		for (u = 0; u < nr; u++)
			running += ukvm_pool_reap(&pools[u], rounds > 0);
		if (!running || ukvm_now_ns() >= deadline_ns)
			return running;
		ukvm_sleep_ns(rounds ? NSEC_PER_MSEC : 100000);
	}
}

struct ukvm_reader *ukvm_pool_running_reader(struct ukvm_pool *pool)
{
	uint32_t i;

	for (i = 0; pool->readers && i < pool->made; i++)
		if (pool->readers[i].thread_started)
			return &pool->readers[i];
	return NULL;
}

/* dup3(nul, uffd): in a test build, UKVM_INJECT_RELEASE_DUP3 makes it fail for real. */
static int pool_dup3(struct ukvm_pool *pool, int nul)
{
	int target = pool->area.uffd;

#ifdef UKVM_TEST_HOOKS
	/* The first inject_after swaps: dup3 onto its own fd number, which is EINVAL. */
	if (pool->area.ctl->inject == UKVM_INJECT_RELEASE_DUP3 &&
	    atomic_fetch_add(&pool->area.ctl->inject_count, 1) < pool->area.ctl->inject_after)
		target = nul;
#endif
	return dup3(nul, target, O_CLOEXEC) < 0 ? -errno : 0;
}

int ukvm_pool_release_uffd(struct ukvm_pool *pool, bool keep_number)
{
	int nul, ret;

	if (pool->area.uffd < 0)
		return 0;
	if (!keep_number && !ukvm_pool_running_reader(pool)) {
		close(pool->area.uffd);
		pool->area.uffd = -1;
		pool->uffd_held = false;
		return 0;
	}
	/*
	 * A reader (or the pusher) that still runs may use this fd number any
	 * time: closed, the number could name another file (the next run's
	 * uffd). dup3 swaps the uffd for /dev/null under the same number; the
	 * uffd itself is released once no call of that thread holds it.
	 * Without a spare fd, or if the swap fails, the uffd stays held, and a
	 * vCPU waiting on it with it: the caller says so and tries again
	 * (stop.c).
	 */
	nul = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (nul < 0) {
		pool->uffd_held = true;
		return -errno;
	}
	ret = pool_dup3(pool, nul);
	close(nul);
	pool->uffd_held = ret != 0;
	return ret;
}

int ukvm_pool_destroy(struct ukvm_pool *pool)
{
	uint32_t i;

	/* Joins readers that have left; one still running keeps everything. */
	if (ukvm_pool_reap(pool, false))
		return -EBUSY;
	for (i = 0; i < pool->made; i++) {
		struct ukvm_reader *r = pool->readers ? &pool->readers[i] : NULL;

		if (r && r->epfd >= 0)
			close(r->epfd);
		if (r)
			ukvm_ring_destroy(r->ring);
		ukvm_prefetch_destroy(&pool->resolvers[i]);
		ukvm_resolve_destroy(&pool->resolvers[i]);
	}
	pool->made = 0;
	free(pool->readers);
	pool->readers = NULL;
	free(pool->resolvers);
	pool->resolvers = NULL;
	ukvm_resolve_area_destroy(&pool->area);
	if (pool->stop_fd >= 0)
		close(pool->stop_fd);
	pool->stop_fd = -1;
	if (pool->area.uffd >= 0)
		close(pool->area.uffd);
	pool->area.uffd = -1;
	pool->uffd_held = false;
	return 0;
}
