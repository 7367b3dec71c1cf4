/* SPDX-License-Identifier: MIT */
/*
 * The setup of how the run's memory is demand-paged: its uffds (opened,
 * registered, write-protected for wp), a reader pool per uffd, the online
 * statistics the resolvers feed, preinstall, and the prefetch pusher. The
 * pools' shape from the config alone (ukvm_paging_pool_shape) is also what
 * the fd and thread budgets (setup.c) count. What is made here is
 * released by the experiment's teardown (setup.c), on every path.
 */
#include <errno.h>
#include <linux/userfaultfd.h>
#include <stdlib.h>
#include <sys/uio.h>

#include "base/errors.h"
#include "base/util.h"
#include "experiment/gmem.h"
#include "experiment/paging.h"
#include "experiment/state.h"
#include "uapi_compat.h"
#include "uffd/pool.h"
#include "uffd/pusher.h"
#include "uffd/resident.h"
#include "uffd/resolve.h"
#include "uffd/ring.h"
#include "uffd/uffd.h"
#include "ukvm.h"

/* Resolver vCPU: vCPU i resolves its faults through its own resolver, in its uffd's pool. */
static void paging_vcpu_resolvers(struct ukvm_experiment *exp)
{
	uint32_t i;

	for (i = 0; i < exp->cfg.vcpus; i++) {
		bool shared = exp->nr_pools == 1;
		struct ukvm_pool *pool = &exp->pools[shared ? 0 : i];

		exp->vcpus[i].resolver = &pool->resolvers[shared ? i : 0];
		exp->vcpus[i].resolve_fault = ukvm_resolve_fault;
	}
}

/*
 * wait io_uring: the RWF_* flags of the setup's check read (ukvm_ring_check):
 * 0, or in a test build RWF_NOWAIT for UKVM_INJECT_RING_NOWAIT.
 */
static int paging_ring_rw_flags(const struct ukvm_config *cfg)
{
#ifdef UKVM_TEST_HOOKS
	if (cfg->inject == UKVM_INJECT_RING_NOWAIT)
		return RWF_NOWAIT;
#endif
	(void)cfg;
	return 0;
}

/*
 * prefetch background or replay: the pusher, given every pool's range (in
 * region order) and the run's resident map. It waits for the vCPUs' go.
 */
bool ukvm_paging_has_pusher(const struct ukvm_config *cfg)
{
	return cfg->prefetch == UKVM_PREFETCH_BACKGROUND || cfg->prefetch == UKVM_PREFETCH_REPLAY;
}

static int paging_pusher(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	const struct ukvm_config *cfg = &exp->cfg;
	struct ukvm_pusher *p = &exp->pusher;
	uint32_t u;

	if (!ukvm_paging_has_pusher(cfg))
		return 0;
	p->ranges = calloc(exp->nr_pools, sizeof(*p->ranges));
	if (!p->ranges) {
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating the pusher's ranges");
		return -ENOMEM;
	}
	p->nr_ranges = exp->nr_pools;
	for (u = 0; u < exp->nr_pools; u++)
		p->ranges[u] = (struct ukvm_pusher_range){
			.uffd = exp->pools[u].area.uffd,
			.hva = exp->pools[u].area.hva_base,
			.gpa = exp->pools[u].area.gpa_base,
			.size = exp->pools[u].area.region_size,
		};
	p->ctl = &exp->ctl;
	p->resident = &exp->resident;
	p->source = &exp->source;
	p->page_size = exp->mem.page_size;
	p->bandwidth_mbps = cfg->prefetch_bandwidth_mbps;
	if (cfg->prefetch == UKVM_PREFETCH_REPLAY) {
		p->order = cfg->replay;
		p->nr_order = cfg->nr_replay;
	}
	return ukvm_pusher_start(p, err);
}

/*
 * What cfg alone decides of pool u of nr_pools: its mode, resolving, ways
 * of waiting and readers. The same for the run (paging_pool) and for its fd
 * budget's dry pass (setup_pool_fds), which then asks the pool what it will
 * hold; nothing is allocated or opened here.
 */
void ukvm_paging_pool_shape(const struct ukvm_config *cfg, uint32_t nr_pools,
			    struct ukvm_pool *pool, uint32_t u)
{
	struct ukvm_resolve_area *a = &pool->area;

	a->uffd_index = u;
	a->mode = cfg->uffd_mode;
	a->delay_ns = (uint64_t)cfg->delay_us * 1000;
	a->delay_dist = cfg->delay_dist;
	a->resolve = cfg->resolve;
	a->vcpu_resolvers = cfg->resolver == UKVM_RESOLVER_VCPU;
	a->full_stats = cfg->stats == UKVM_STATS_FULL;
	a->seed = cfg->seed;
	a->prefetch = cfg->prefetch;
	a->prefetch_pages = cfg->prefetch_pages;
	pool->wait = cfg->wait;
	pool->read_batch = cfg->read_batch;
	pool->vcpus_sharing = cfg->overlap ? cfg->vcpus : 1;
	pool->pins = cfg->pin_readers;
	pool->nr_pins = cfg->nr_pin_readers;
	pool->first_reader = u * cfg->readers;
	/* Resolver vCPU: a resolver per vCPU this uffd serves, and no threads. */
	pool->first_vcpu = nr_pools == 1 ? 0 : u;
	pool->nr_readers = cfg->resolver == UKVM_RESOLVER_READERS ? cfg->readers :
			   nr_pools == 1 ? cfg->vcpus : 1;
}

/*
 * Pool u of the run, over the u-th range of range bytes: its shape from the
 * config, and where it sits in the run's memory and what it shares with
 * the run. Nothing is opened here.
 */
static void paging_pool(struct ukvm_experiment *exp, struct ukvm_pool *pool, uint32_t u,
			uint64_t range)
{
	struct ukvm_resolve_area *a = &pool->area;

	ukvm_paging_pool_shape(&exp->cfg, exp->nr_pools, pool, u);
	a->ctl = &exp->ctl;
	a->page_size = exp->mem.page_size;
	a->hva_base = (uint64_t)(uintptr_t)exp->mem.hva + u * range;
	a->region_size = range;
	a->gpa_base = exp->region_gpa + u * range;
	a->region_off = u * range;
	a->source = &exp->source;
	a->resident = exp->resident.faulted ? &exp->resident : NULL;
	a->resident_first = u * (range / exp->mem.page_size);
	a->snapshot = exp->snapshot ? exp->snapshot + u * range : NULL;
	a->wp_state = exp->wp_state ? exp->wp_state + u * range / UKVM_PAGE_SIZE : NULL;
}

/* How many uffds (pools) a run of cfg has. */
uint32_t ukvm_paging_nr_pools(const struct ukvm_config *cfg)
{
	if (cfg->uffd_mode == UKVM_UFFD_NONE)
		return 0;
	return cfg->single_uffd || cfg->overlap ? 1 : cfg->vcpus;
}

/*
 * preinstall: each listed page in with its data from the source's local
 * copy, by the uffd of the pool whose range holds it, before any vCPU runs
 * (nobody waits to be woken). Timed, and bounded by cancel and the deadline.
 */
static int paging_preinstall(struct ukvm_experiment *exp, uint64_t range,
			     struct ukvm_error *err)
{
	uint64_t i, t0 = ukvm_now_ns(), size = exp->mem.page_size;
	int ret;

	if (!exp->cfg.nr_preinstall)
		return 0;
	/* The validator's rules (missing, copy, no prefault) are the resident map's. */
	if (!exp->resident.faulted || !exp->source.map)
		return ukvm_err_set(err, UKVM_ERR_RUN, EINVAL, "preinstall: no %s to install into",
				    exp->source.map ? "resident map" : "local copy of the source");
	for (i = 0; i < exp->cfg.nr_preinstall; i++) {
		uint64_t page = exp->cfg.preinstall[i], off = page * size;

		if (i % 4096 == 4095 && (exp_aborted(exp) || exp_past_deadline(exp)))
			return ukvm_err_set(err, exp_aborted(exp) ? UKVM_ERR_CANCELLED : UKVM_ERR_TIMEOUT,
					    exp_aborted(exp) ? 0 : ETIMEDOUT, "preinstall: stopped "
					    "after %llu of %llu pages (%s)", (unsigned long long)i,
					    (unsigned long long)exp->cfg.nr_preinstall,
					    exp_aborted(exp) ? "cancelled" : "past timeout_s");
		ret = ukvm_uffd_copy_dontwake(exp->pools[off / range].area.uffd,
					      (uint64_t)(uintptr_t)(exp->mem.hva + off),
					      exp->source.map + off, size);
		if (ret)
			return ukvm_err_set(err, UKVM_ERR_RUN, -ret, "preinstall: UFFDIO_COPY of page "
					    "%llu (gpa 0x%llx) from source_path %s", (unsigned long long)page,
					    (unsigned long long)(exp->region_gpa + off), exp->source.path);
		ukvm_resident_mark(&exp->resident, page, UKVM_PAGE_PREINSTALLED);
	}
	exp->preinstalled_pages = exp->cfg.nr_preinstall;
	exp->preinstall_ns = ukvm_now_ns() - t0;
	return 0;
}

int ukvm_paging_setup(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	const struct ukvm_config *cfg = &exp->cfg;
	uint64_t wanted = 0, range;
	uint32_t u;
	int ret;

	if (cfg->uffd_mode == UKVM_UFFD_NONE)
		return 0;
	ret = ukvm_uffd_negotiate(cfg, &wanted, err);
	if (ret)
		return ret;
	exp->exact_address = wanted & UFFD_FEATURE_EXACT_ADDRESS;

	exp->nr_pools = ukvm_paging_nr_pools(cfg);
	range = exp->region_size / exp->nr_pools;
	/* Pages that arrive with data by UFFDIO_COPY: how each went in, for prefetch's counts. */
	if (cfg->uffd_mode == UKVM_UFFD_MISSING && cfg->resolve == UKVM_RESOLVE_COPY &&
	    !cfg->prefault && !exp->probe) {
		ret = ukvm_resident_create(&exp->resident, exp->region_size / exp->mem.page_size,
					   cfg->record_touch_order, err);
		if (ret)
			return ret;
		exp->resident.timed = cfg->stats == UKVM_STATS_FULL;
	}
	exp->pools = calloc(exp->nr_pools, sizeof(*exp->pools));
	if (!exp->pools) {
		exp->nr_pools = 0;
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating reader pools");
		return -ENOMEM;
	}
	for (u = 0; u < exp->nr_pools; u++)
		ukvm_pool_init(&exp->pools[u]);
	if (cfg->stats == UKVM_STATS_FULL && !cfg->guest_timing && !exp->probe) {
		/* A queue per resolver: readers per pool, or a vCPU each. */
		uint32_t resolvers = cfg->resolver == UKVM_RESOLVER_READERS ?
				     exp->nr_pools * cfg->readers : cfg->vcpus;

		ret = ukvm_online_create(&exp->online, cfg->vcpus, resolvers, exp->region_gpa,
					 exp->region_size / exp->mem.page_size,
					 exp->mem.page_size);
		if (ret)
			return ukvm_err_set(err, UKVM_ERR_RUN, -ret,
					    "allocating the online statistics (stats full)");
#ifdef UKVM_TEST_HOOKS
		if (cfg->inject == UKVM_INJECT_ONLINE_DRAIN ||
		    cfg->inject == UKVM_INJECT_ONLINE_SKIP_QUEUE)
			exp->online.drain_at = cfg->inject_after ?: 1;
		exp->online.test_skip_last = cfg->inject == UKVM_INJECT_ONLINE_SKIP_QUEUE;
#endif
	}

	for (u = 0; u < exp->nr_pools; u++) {
		struct ukvm_pool *pool = &exp->pools[u];
		struct ukvm_resolve_area *a = &pool->area;

		paging_pool(exp, pool, u, range);
		a->online = exp->online.queues ? &exp->online : NULL;
		a->records = cfg->stats == UKVM_STATS_FULL && (cfg->trace_faults || cfg->guest_timing);
		/* Readers that block in read(2) need a blocking uffd. */
		a->uffd = ukvm_uffd_open(cfg->wait != UKVM_WAIT_READ, wanted, err);
		if (a->uffd < 0)
			return a->uffd;
		ret = ukvm_uffd_register(a->uffd, (void *)(uintptr_t)a->hva_base, range,
					 cfg->uffd_mode, cfg->backing, err);
		/* Registered, yet the guest's accesses would never fault through it (gmem.c). */
		if (!ret && cfg->backing == UKVM_BACKING_GUEST_MEMFD)
			ret = ukvm_gmem_refuse_uffd(&exp->vm, cfg, err);
		/* WP: every (filled) page protected before any vCPU runs. */
		if (!ret && cfg->uffd_mode == UKVM_UFFD_WP) {
			ret = ukvm_uffd_writeprotect(a->uffd, a->hva_base, range, true);
			if (ret)
				ukvm_err_set(err, ret == -EINVAL || ret == -ENOENT ? UKVM_ERR_HOST
					     : UKVM_ERR_RUN, -ret,
					     "UFFDIO_WRITEPROTECT(MODE_WP, %llu bytes of %s memory)",
					     (unsigned long long)range, ukvm_backing_name(cfg->backing));
		}
		/* Whether a ring can wait on a uffd at all: once, before any reader (ring.h). */
		if (!ret && !u && cfg->wait == UKVM_WAIT_IO_URING)
			ret = ukvm_ring_check(a->uffd, paging_ring_rw_flags(cfg), err);
		if (!ret && !exp->probe)
			ret = ukvm_pool_start(pool, err);
		if (ret)
			return ret;
	}
	if (cfg->resolver == UKVM_RESOLVER_VCPU && !exp->probe)
		paging_vcpu_resolvers(exp);
	if (exp->probe)
		return 0;
	/* Before the pusher: it skips what is already there. */
	return paging_preinstall(exp, range, err) ?: paging_pusher(exp, err);
}
