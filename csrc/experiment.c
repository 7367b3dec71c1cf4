/* SPDX-License-Identifier: MIT */
/*
 * One experiment, from a config to a result, run by a controller thread:
 *
 *   setup     VM, backing memory, memslot, guest page tables, vCPUs, the
 *             MINOR prefill, uffds and their reader pools
 *   execute   vCPU threads start together, the controller waits for all of
 *             them to finish, for a failure, a cancel or the deadline
 *   stop      vCPUs are kicked out of KVM_RUN and joined, readers stopped
 *   collect   KVM stats, reader stats, uffds closed, every page verified
 *   teardown  everything released, on every path
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>

#include "guest_abi.h"
#include "internal.h"

#define SZ_1G			(1ULL << 30)
#define REGION_MIN_GPA		(4ULL << 30)
#define VCPU_STACK_BYTES	(16ULL << 10)
#define THREAD_STACK_BYTES	(512ULL << 10)
#define PREFILL_CHUNK		(2ULL << 20)
#define STUCK_VCPU_NS		(500 * NSEC_PER_MSEC)
/* A failed run verifies nothing, so its uffds may go at once (PVM, for one,
 * does not let the kick interrupt a vCPU waiting on a userfault). */
#define STUCK_VCPU_ABORTED_NS	(10 * NSEC_PER_MSEC)
#define NO_STAT			UINT64_MAX

struct ukvm_experiment {
	struct ukvm_config cfg;
	struct ukvm_ctl ctl;
	pthread_t controller;
	bool finished;			/* under ctl.lock */
	struct ukvm_result result;

	struct ukvm_vm vm;
	struct ukvm_mem mem;
	uint64_t region_gpa;
	uint64_t region_size;
	uint64_t slice_size;		/* what one vCPU walks */
	uint64_t passes;
	uint64_t write_key;		/* the guest's write-or-read choice, seeded */
	bool filled;			/* pages arrive with data (else zero-filled) */
	int32_t *pin_vcpus;		/* copies of the config's lists */
	int32_t *pin_readers;
	struct ukvm_vcpu *vcpus;
	struct ukvm_kvmstats *vcpu_stats;
	struct ukvm_kvmstats vm_stats;
	struct ukvm_pool *pools;
	uint32_t nr_pools;
	uint64_t deadline_ns;
	bool probe;			/* ukvm_probe(): build, register, stop there */
	bool releasing_memory;		/* under ctl.lock: a failed run's memory, still going */
	struct ukvm_experiment *next_pending;
};

/*
 * A failed, cancelled or timed-out run returns to its caller as soon as its
 * threads are joined and its fds closed: handing back a region of several
 * GiB can take the kernel seconds (the page cache of a prefilled shmem
 * region, say), and Ctrl-C must answer within one. Its controller then
 * releases the memory on its own, and the experiment waits on this list
 * until ukvm_wait_idle() (or the next experiment's start) joins the
 * controller and frees it, so nothing piles up and no thread outlives it.
 */
static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ukvm_experiment *pending;

static void experiment_free(struct ukvm_experiment *exp);

void ukvm_wait_idle(void)
{
	struct ukvm_experiment *exp;

	pthread_mutex_lock(&pending_lock);
	while ((exp = pending)) {
		pending = exp->next_pending;
		pthread_join(exp->controller, NULL);
		experiment_free(exp);
	}
	pthread_mutex_unlock(&pending_lock);
}

static void experiment_free(struct ukvm_experiment *exp)
{
	ukvm_result_free(&exp->result);
	ukvm_ctl_destroy(&exp->ctl);
	free(exp->pin_vcpus);
	free(exp->pin_readers);
	free(exp);
}

/* Records err as the experiment's failure unless something failed first. */
static void exp_fail(struct ukvm_experiment *exp, const struct ukvm_error *err)
{
	pthread_mutex_lock(&exp->ctl.lock);
	ukvm_ctl_fail_locked(&exp->ctl, err);
	pthread_mutex_unlock(&exp->ctl.lock);
}

static bool exp_aborted(struct ukvm_experiment *exp)
{
	return ukvm_ctl_aborted(&exp->ctl);
}

/* The vCPU's args page (guest_abi.h), as the host sees it. */
static uint64_t *guest_args(struct ukvm_experiment *exp, struct ukvm_vcpu *vcpu)
{
	return ukvm_vm_sys_hva(&exp->vm, vcpu->args_gpa);
}

#define ARG(args, off) ((args)[(off) / sizeof(uint64_t)])

/* The keys of vCPU i's random walk order; guest.S applies them. */
static void guest_order(const struct ukvm_config *cfg, uint32_t vcpu, uint64_t pages,
			uint64_t *a)
{
	uint64_t state = cfg->seed ^ (0x6f72646572000000ULL + vcpu), mask;
	unsigned bits = 0;

	while (bits < 63 && (1ULL << bits) < pages)
		bits++;
	mask = (1ULL << bits) - 1;
	ARG(a, GA_PATTERN) = (uint64_t)cfg->pattern;
	ARG(a, GA_PERM_MASK) = mask;
	ARG(a, GA_PERM_SHIFT) = bits / 2 + 1;
	ARG(a, GA_PERM_KEY0) = ukvm_splitmix64(&state) & mask;
	ARG(a, GA_PERM_KEY1) = ukvm_splitmix64(&state) & mask;
}

static int setup_vcpus(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	const struct ukvm_config *cfg = &exp->cfg;
	uint64_t args_gpa, stack_gpa;
	uint32_t i;
	int ret;

	exp->vcpus = calloc(cfg->vcpus, sizeof(*exp->vcpus));
	exp->vcpu_stats = calloc(cfg->vcpus, sizeof(*exp->vcpu_stats));
	if (!exp->vcpus || !exp->vcpu_stats) {
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating %u vCPUs", cfg->vcpus);
		return -ENOMEM;
	}
	for (i = 0; i < cfg->vcpus; i++) {
		ukvm_vcpu_init(&exp->vcpus[i]);
		ukvm_kvmstats_init(&exp->vcpu_stats[i]);
	}

	for (i = 0; i < cfg->vcpus; i++) {
		struct ukvm_vcpu *vcpu = &exp->vcpus[i];
		uint64_t *a;

		ret = ukvm_vm_alloc(&exp->vm, GA_SIZE, &args_gpa, err);
		ret = ret ?: ukvm_vm_alloc(&exp->vm, VCPU_STACK_BYTES, &stack_gpa, err);
		if (ret)
			return ret;
		a = ukvm_vm_sys_hva(&exp->vm, args_gpa);
		ARG(a, GA_REGION) = exp->region_gpa + (cfg->overlap ? 0 : i * exp->slice_size);
		ARG(a, GA_PAGES) = exp->slice_size / UKVM_PAGE_SIZE;
		ARG(a, GA_WORK) = cfg->guest_work;
		ARG(a, GA_PASSES) = exp->passes;
		ARG(a, GA_WRITE_PCT) = cfg->write_percent;
		ARG(a, GA_WRITE_KEY) = exp->write_key;
		ARG(a, GA_TIMING) = cfg->guest_timing;
		guest_order(cfg, i, exp->slice_size / UKVM_PAGE_SIZE, a);

		ret = ukvm_vcpu_create(&exp->vm, vcpu, i, args_gpa, stack_gpa + VCPU_STACK_BYTES,
				       err);
		if (ret)
			return ret;
		vcpu->ctl = &exp->ctl;
		vcpu->cpu = cfg->nr_pin_vcpus ? cfg->pin_vcpus[i % cfg->nr_pin_vcpus] : -1;
		vcpu->passes = exp->passes;
		vcpu->pass_end_ns = calloc(exp->passes, sizeof(uint64_t));
		if (!vcpu->pass_end_ns) {
			ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating pass times");
			return -ENOMEM;
		}
		if (i == 0) {
			int khz = ioctl(vcpu->fd, KVM_GET_TSC_KHZ, 0);

			exp->result.tsc_khz = khz > 0 ? (uint64_t)khz : 0;
		}
		/* KVM's statistics are a bonus: a kernel without them still runs. */
		if (ukvm_kvmstats_open(&exp->vcpu_stats[i], vcpu->fd, "vCPU", NULL))
			ukvm_kvmstats_init(&exp->vcpu_stats[i]);
	}
	return 0;
}

/*
 * Writes every page's data before the run, through `where`: the alias for
 * a MINOR run (the page cache fills, the guest's mapping stays empty), the
 * guest's own mapping for prefault (then nothing is left to fault).
 */
static int setup_fill(struct ukvm_experiment *exp, uint8_t *where, struct ukvm_error *err)
{
	uint64_t off, len;

	for (off = 0; off < exp->region_size; off += PREFILL_CHUNK) {
		if (off % (64 * PREFILL_CHUNK) == 0 && exp_aborted(exp)) {
			ukvm_err_set(err, UKVM_ERR_CANCELLED, 0, "cancelled during the prefill");
			return -ECANCELED;
		}
		len = exp->region_size - off < PREFILL_CHUNK ? exp->region_size - off
							     : PREFILL_CHUNK;
		ukvm_fill_pages(where + off, len, exp->region_gpa + off);
	}
	return 0;
}

static int setup_uffds(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	const struct ukvm_config *cfg = &exp->cfg;
	uint64_t available = 0, wanted = 0, range;
	uint32_t u;
	int ret;

	if (cfg->uffd_mode == UKVM_UFFD_NONE)
		return 0;
	ret = ukvm_uffd_features(&available, err);
	if (ret)
		return ret;
	if (cfg->uffd_mode == UKVM_UFFD_MINOR && cfg->backing == UKVM_BACKING_SHMEM)
		wanted |= UFFD_FEATURE_MINOR_SHMEM;
	if (cfg->uffd_mode == UKVM_UFFD_MINOR && cfg->backing == UKVM_BACKING_SHARED_HUGETLB)
		wanted |= UFFD_FEATURE_MINOR_HUGETLBFS;
	if (cfg->uffd_mode == UKVM_UFFD_MISSING && cfg->backing == UKVM_BACKING_SHMEM)
		wanted |= UFFD_FEATURE_MISSING_SHMEM;
	if (cfg->uffd_mode == UKVM_UFFD_MISSING && ukvm_backing_is_hugetlb(cfg->backing))
		wanted |= UFFD_FEATURE_MISSING_HUGETLBFS;
	/* Which vCPU faulted: nice to have, so only if the kernel offers it. */
	if (cfg->stats == UKVM_STATS_FULL)
		wanted |= available & UFFD_FEATURE_THREAD_ID;
	if ((available & wanted) != wanted) {
		ukvm_err_set(err, UKVM_ERR_HOST, 0,
			     "this kernel's userfaultfd lacks features 0x%llx needed for "
			     "uffd_mode %s on %s memory (it has 0x%llx)",
			     (unsigned long long)(wanted & ~available),
			     ukvm_uffd_mode_name(cfg->uffd_mode), ukvm_backing_name(cfg->backing),
			     (unsigned long long)available);
		return -EOPNOTSUPP;
	}

	exp->nr_pools = cfg->single_uffd || cfg->overlap ? 1 : cfg->vcpus;
	range = exp->region_size / exp->nr_pools;
	exp->pools = calloc(exp->nr_pools, sizeof(*exp->pools));
	if (!exp->pools) {
		exp->nr_pools = 0;
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating reader pools");
		return -ENOMEM;
	}
	for (u = 0; u < exp->nr_pools; u++)
		ukvm_pool_init(&exp->pools[u]);

	for (u = 0; u < exp->nr_pools; u++) {
		struct ukvm_pool *pool = &exp->pools[u];

		pool->ctl = &exp->ctl;
		pool->uffd_index = u;
		pool->wait = cfg->wait;
		pool->mode = cfg->uffd_mode;
		pool->page_size = exp->mem.page_size;
		pool->hva_base = (uint64_t)(uintptr_t)exp->mem.hva + u * range;
		pool->region_size = range;
		pool->gpa_base = exp->region_gpa + u * range;
		pool->delay_ns = (uint64_t)cfg->delay_us * 1000;
		pool->delay_dist = cfg->delay_dist;
		pool->resolve = cfg->resolve;
		pool->full_stats = cfg->stats == UKVM_STATS_FULL;
		pool->seed = cfg->seed;
		pool->pins = cfg->pin_readers;
		pool->nr_pins = cfg->nr_pin_readers;
		pool->first_reader = u * cfg->readers;
		pool->nr_readers = cfg->readers;
		/* Readers that block in read(2) need a blocking uffd. */
		pool->uffd = ukvm_uffd_open(cfg->wait != UKVM_WAIT_READ, wanted, err);
		if (pool->uffd < 0)
			return pool->uffd;
		ret = ukvm_uffd_register(pool->uffd, (void *)(uintptr_t)pool->hva_base, range,
					 cfg->uffd_mode, cfg->backing, err);
		if (!ret && !exp->probe)
			ret = ukvm_pool_start(pool, err);
		if (ret)
			return ret;
	}
	return 0;
}

/* UKVM_INJECT_GUEST_*: break the guest's mapping of one page of vCPU 0. */
static int setup_guest_injection(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	uint64_t gva = exp->region_gpa + exp->cfg.inject_after * UKVM_PAGE_SIZE;
	uint64_t *pte;

	if (exp->cfg.inject != UKVM_INJECT_GUEST_FAULT && exp->cfg.inject != UKVM_INJECT_GUEST_MMIO)
		return 0;
	pte = ukvm_vm_leaf_pte(&exp->vm, gva);
	if (!pte || exp->cfg.inject_after >= exp->slice_size / UKVM_PAGE_SIZE) {
		ukvm_err_set(err, UKVM_ERR_CONFIG, 0, "inject_after: beyond vCPU 0's pages");
		return -EINVAL;
	}
	if (exp->cfg.inject == UKVM_INJECT_GUEST_FAULT)
		*pte = 0;
	else	/* a guest-physical address no memslot covers */
		*pte = (*pte & 0xfff) | ALIGN_UP(exp->region_gpa + exp->region_size + SZ_1G, SZ_1G);
	return 0;
}

static int experiment_setup(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	const struct ukvm_config *cfg = &exp->cfg;
	uint64_t sys_size;
	int ret;

	uint64_t state = cfg->seed ^ 0x7772697465000000ULL;

	exp->passes = cfg->passes;
	exp->write_key = ukvm_splitmix64(&state);
	exp->filled = cfg->prefault || cfg->uffd_mode == UKVM_UFFD_MINOR ||
		      (cfg->uffd_mode == UKVM_UFFD_MISSING && cfg->resolve == UKVM_RESOLVE_COPY);
	exp->slice_size = cfg->mem_per_vcpu;
	exp->region_size = cfg->overlap ? cfg->mem_per_vcpu : cfg->mem_per_vcpu * cfg->vcpus;
	sys_size = ukvm_vm_sys_size(cfg->vcpus, exp->region_size);

	ret = ukvm_mem_check_host(cfg->backing, exp->region_size, err);
	ret = ret ?: ukvm_vm_create(&exp->vm, sys_size, err);
	if (ret)
		return ret;
	if (ukvm_kvmstats_open(&exp->vm_stats, exp->vm.vm_fd, "VM", NULL))
		ukvm_kvmstats_init(&exp->vm_stats);
	if (cfg->vcpus > exp->vm.max_vcpus) {
		ukvm_err_set(err, UKVM_ERR_CONFIG, 0,
			     "vcpus: this host's KVM allows at most %u vCPUs per VM, not %u",
			     exp->vm.max_vcpus, cfg->vcpus);
		return -EINVAL;
	}
	exp->region_gpa = ALIGN_UP(sys_size, SZ_1G);
	if (exp->region_gpa < REGION_MIN_GPA)
		exp->region_gpa = REGION_MIN_GPA;
	ret = ukvm_vm_map(&exp->vm, exp->region_gpa, exp->region_size, cfg->guest_page_size, err);
	ret = ret ?: ukvm_mem_create(&exp->mem, cfg->backing, exp->region_size, exp->vm.vm_fd, err);
	if (ret)
		return ret;
	if (cfg->backing == UKVM_BACKING_GUEST_MEMFD)
		ret = ukvm_vm_add_gmem_memslot(&exp->vm, exp->region_gpa, exp->region_size,
					       exp->mem.hva, exp->mem.memfd, err);
	else
		ret = ukvm_vm_add_memslot(&exp->vm, exp->region_gpa, exp->region_size,
					  exp->mem.hva, err);
	if (ret)
		return ret;
	if (exp->probe)
		return setup_uffds(exp, err);
	ret = setup_vcpus(exp, err);
	ret = ret ?: setup_guest_injection(exp, err);
	if (ret)
		return ret;
	if (cfg->prefault)
		ret = setup_fill(exp, exp->mem.hva, err);
	else if (cfg->uffd_mode == UKVM_UFFD_MINOR)
		ret = setup_fill(exp, exp->mem.alias, err);
	return ret ?: setup_uffds(exp, err);
}

/* now + timeout_ns, saturating: a timeout of "forever" must not wrap around. */
static uint64_t deadline_after(uint64_t timeout_ns)
{
	uint64_t now = ukvm_now_ns();

	return timeout_ns > UINT64_MAX - now ? UINT64_MAX : now + timeout_ns;
}

static void set_deadline(struct timespec *ts, uint64_t deadline_ns)
{
	ts->tv_sec = (time_t)(deadline_ns / NSEC_PER_SEC);
	ts->tv_nsec = (long)(deadline_ns % NSEC_PER_SEC);
}

static int experiment_execute(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	struct ukvm_ctl *ctl = &exp->ctl;
	struct timespec ts;
	uint32_t i, ready;
	int ret = 0;

	for (i = 0; i < exp->cfg.vcpus; i++) {
		struct ukvm_vcpu *vcpu = &exp->vcpus[i];

		ret = ukvm_thread_create(ctl, &vcpu->thread, THREAD_STACK_BYTES, ukvm_vcpu_thread,
					 vcpu);
		if (ret) {
			ukvm_err_set(err, UKVM_ERR_RUN, ret, "pthread_create(vCPU %u of %u)", i,
				     exp->cfg.vcpus);
			ret = -ret;
			break;
		}
		vcpu->thread_started = true;
	}
	if (ret)
		return ret;

	/* Thread start-up stays out of the timing: wait until all are ready. */
	pthread_mutex_lock(&ctl->lock);
	for (;;) {
		for (i = 0, ready = 0; i < exp->cfg.vcpus; i++)
			ready += exp->vcpus[i].ready;
		if (ready == exp->cfg.vcpus || ctl->failed)
			break;
		pthread_cond_wait(&ctl->cond, &ctl->lock);
	}
	pthread_mutex_unlock(&ctl->lock);

	ukvm_kvmstats_snapshot(&exp->vm_stats);
	for (i = 0; i < exp->cfg.vcpus; i++)
		ukvm_kvmstats_snapshot(&exp->vcpu_stats[i]);

	pthread_mutex_lock(&ctl->lock);
	ctl->vcpus_running = exp->cfg.vcpus;
	ctl->go = ctl->failed ? -1 : 1;
	pthread_cond_broadcast(&ctl->cond);
	while (ctl->vcpus_running && !ctl->failed) {
		if (!exp->deadline_ns) {
			pthread_cond_wait(&ctl->cond, &ctl->lock);
			continue;
		}
		set_deadline(&ts, exp->deadline_ns);
		if (pthread_cond_timedwait(&ctl->cond, &ctl->lock, &ts) == ETIMEDOUT &&
		    ukvm_now_ns() >= exp->deadline_ns) {
			struct ukvm_error timeout = { 0 };

			ukvm_err_set(&timeout, UKVM_ERR_TIMEOUT, 0,
				     "the run did not finish within timeout_s=%.3f: %u of %u "
				     "vCPUs were still running (a fault never resolved?)",
				     (double)exp->cfg.timeout_ns / NSEC_PER_SEC,
				     ctl->vcpus_running, exp->cfg.vcpus);
			ukvm_ctl_fail_locked(ctl, &timeout);
		}
	}
	pthread_mutex_unlock(&ctl->lock);
	return 0;
}

static void stop_pools(struct ukvm_experiment *exp, bool close_uffds)
{
	uint32_t u;

	for (u = 0; u < exp->nr_pools; u++) {
		ukvm_pool_stop(&exp->pools[u]);
		if (close_uffds)
			ukvm_pool_destroy(&exp->pools[u]);
	}
}

/* Kicks every vCPU out of KVM_RUN and joins it; safe after a partial setup. */
static void experiment_stop_vcpus(struct ukvm_experiment *exp)
{
	struct ukvm_ctl *ctl = &exp->ctl;
	uint64_t start = ukvm_now_ns();
	bool waiting, released = false;
	uint32_t i;

	if (!exp->vcpus)
		return;
	pthread_mutex_lock(&ctl->lock);
	if (ctl->go == 0)
		ctl->go = -1;	/* threads still waiting to start: leave */
	pthread_cond_broadcast(&ctl->cond);
	pthread_mutex_unlock(&ctl->lock);
	atomic_store(&ctl->stop, true);

	for (;;) {
		waiting = false;
		for (i = 0; i < exp->cfg.vcpus; i++) {
			struct ukvm_vcpu *vcpu = &exp->vcpus[i];

			if (vcpu->thread_started && !atomic_load(&vcpu->exited)) {
				waiting = true;
				ukvm_vcpu_kick(vcpu);
			}
		}
		if (!waiting)
			break;
		/*
		 * A vCPU blocked on a fault that no reader will resolve, in a
		 * kernel where that wait is not interruptible: closing the uffd
		 * wakes it and the fault completes without userfaultfd.
		 */
		if (!released && ukvm_now_ns() - start >
		    (exp_aborted(exp) ? STUCK_VCPU_ABORTED_NS : STUCK_VCPU_NS)) {
			stop_pools(exp, true);
			released = true;
		}
		ukvm_sleep_ns(NSEC_PER_MSEC);
	}
	for (i = 0; i < exp->cfg.vcpus; i++) {
		struct ukvm_vcpu *vcpu = &exp->vcpus[i];

		if (vcpu->thread_started) {
			pthread_join(vcpu->thread, NULL);
			vcpu->thread_started = false;
		}
	}
}

/* KVM's VM-wide statistics into the result; absent stats are not an error. */
static int collect_vm_stats(struct ukvm_experiment *exp)
{
	struct ukvm_result *res = &exp->result;
	struct ukvm_kvmstats *s = &exp->vm_stats;

	if (s->fd < 0 || !s->have_before)
		return 0;
	res->vm_stats = calloc(s->nr_scalars ?: 1, sizeof(uint64_t));
	res->vm_stat_names = ukvm_kvmstats_scalar_names(s);
	if (!res->vm_stats || !res->vm_stat_names)
		return -ENOMEM;
	res->nr_vm_stats = s->nr_scalars;
	if (ukvm_kvmstats_deltas(s, res->vm_stats)) {
		ukvm_free_names(res->vm_stat_names, res->nr_vm_stats);
		free(res->vm_stats);
		res->vm_stat_names = NULL;
		res->vm_stats = NULL;
		res->nr_vm_stats = 0;
	}
	return 0;
}

/* One vCPU's statistics; every vCPU has the same set, named once. */
static int collect_vcpu_stats(struct ukvm_experiment *exp, uint32_t i,
			      struct ukvm_vcpu_result *vr)
{
	struct ukvm_result *res = &exp->result;
	struct ukvm_kvmstats *s = &exp->vcpu_stats[i];
	int idx;

	if (s->fd < 0 || !s->have_before)
		return 0;
	if (!res->vcpu_stat_names) {
		res->vcpu_stat_names = ukvm_kvmstats_scalar_names(s);
		if (!res->vcpu_stat_names)
			return -ENOMEM;
		res->nr_vcpu_stats = s->nr_scalars;
	}
	if (s->nr_scalars != res->nr_vcpu_stats)
		return 0;
	vr->kvm_stats = calloc(s->nr_scalars ?: 1, sizeof(uint64_t));
	if (!vr->kvm_stats)
		return -ENOMEM;
	if (ukvm_kvmstats_deltas(s, vr->kvm_stats)) {
		free(vr->kvm_stats);
		vr->kvm_stats = NULL;
		return 0;
	}
	idx = ukvm_kvmstats_find(s, "exits");
	if (idx >= 0)
		vr->exits = vr->kvm_stats[idx];
	return 0;
}

/* Stats full: per-vCPU faults, latency and blocked time, and the VM's blocktime. */
static int collect_faultlog(struct ukvm_experiment *exp)
{
	struct ukvm_result *res = &exp->result;
	struct ukvm_faultlog log = {
		.nr_vcpus = exp->cfg.vcpus,
		.vcpus = res->vcpus,
	};
	int32_t *tids = calloc(exp->cfg.vcpus, sizeof(*tids));
	uint32_t i;
	int ret;

	if (!tids)
		return -ENOMEM;
	for (i = 0; i < exp->cfg.vcpus; i++)
		tids[i] = exp->vcpus[i].tid;
	log.tids = tids;
	ret = ukvm_faultlog_build(&log, exp->pools, exp->nr_pools);
	free(tids);
	if (ret) {
		free(log.all);
		return ret;
	}
	res->blocktime_ns = log.blocktime_ns;
	if (exp->cfg.trace_faults) {
		res->trace = log.all;
		res->nr_trace = log.nr_all;
	} else {
		free(log.all);
	}
	return 0;
}

/* Verifies memory and what each vCPU's guest reported; fills the result. */
static int experiment_collect(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	const struct ukvm_config *cfg = &exp->cfg;
	struct ukvm_result *res = &exp->result;
	uint64_t pages = exp->slice_size / UKVM_PAGE_SIZE, read_sum = 0;
	struct ukvm_verify_params vp = {
		.filled = exp->filled,
		.written_visits = exp->passes * (cfg->overlap ? cfg->vcpus : 1),
		.write_pct = cfg->write_percent,
		.write_key = exp->write_key,
	};
	uint32_t i, u, r, n;
	int ret;

	res->nr_vcpus = cfg->vcpus;
	res->vcpus = calloc(cfg->vcpus, sizeof(*res->vcpus));
	res->nr_uffds = exp->nr_pools;
	res->nr_readers = exp->nr_pools * cfg->readers;
	res->readers = calloc(res->nr_readers ?: 1, sizeof(*res->readers));
	if (!res->vcpus || !res->readers) {
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating the result");
		return -ENOMEM;
	}
	ret = collect_vm_stats(exp);
	if (ret) {
		ukvm_err_set(err, UKVM_ERR_RUN, -ret, "collecting KVM statistics");
		return ret;
	}
	res->pages_per_vcpu = pages;
	res->region_gpa = exp->region_gpa;
	res->passes = (uint32_t)exp->passes;
	res->region_bytes = exp->region_size;
	res->page_size = exp->mem.page_size;

	for (u = 0, n = 0; u < exp->nr_pools; u++)
		for (r = 0; exp->pools[u].readers && r < exp->pools[u].nr_readers; r++)
			res->readers[n++] = exp->pools[u].readers[r].stats;
	res->nr_readers = n;
	res->stats_full = cfg->stats == UKVM_STATS_FULL;
	if (res->stats_full) {
		ret = collect_faultlog(exp);
		if (ret) {
			ukvm_err_set(err, UKVM_ERR_RUN, -ret, "building the fault log");
			return ret;
		}
	}
	/* Closing the uffds first: a page verify reads must not fault into a uffd. */
	stop_pools(exp, true);
	if (cfg->inject == UKVM_INJECT_CORRUPT_PAGE && cfg->inject_after < exp->region_size / UKVM_PAGE_SIZE)
		exp->mem.hva[cfg->inject_after * UKVM_PAGE_SIZE + 100] ^= 0x40;

	res->verified = true;
	for (i = 0; i < cfg->vcpus; i++) {
		struct ukvm_vcpu *vcpu = &exp->vcpus[i];
		struct ukvm_vcpu_result *vr = &res->vcpus[i];
		uint64_t *a = guest_args(exp, vcpu);
		vr->index = i;
		vr->tid = vcpu->tid;
		vr->start_ns = vcpu->start_ns;
		vr->end_ns = vcpu->end_ns;
		vr->pages = ARG(a, GA_ACCESSES);
		vr->userspace_exits = vcpu->userspace_exits;
		vr->cpu_ns = vcpu->cpu_ns;
		memcpy(vr->affinity, vcpu->affinity, sizeof(vr->affinity));
		vr->pass_end_ns = calloc(exp->passes, sizeof(uint64_t));
		if (!vr->pass_end_ns) {
			ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating the result");
			return -ENOMEM;
		}
		memcpy(vr->pass_end_ns, vcpu->pass_end_ns, exp->passes * sizeof(uint64_t));
		if (cfg->guest_timing) {
			vr->access_cycles = ARG(a, GA_TSC_SUM);
			memcpy(vr->access_hist, &ARG(a, GA_TSC_HIST), sizeof(vr->access_hist));
		}
		vr->exits = NO_STAT;
		ret = collect_vcpu_stats(exp, i, vr);
		if (ret) {
			ukvm_err_set(err, UKVM_ERR_RUN, -ret, "collecting KVM statistics");
			return ret;
		}
		if (i == 0 || vr->start_ns < res->start_ns)
			res->start_ns = vr->start_ns;
		if (vr->end_ns > res->end_ns)
			res->end_ns = vr->end_ns;

		/* Partitioned: verify this vCPU's slice. Overlapped: the region, once. */
		if (!cfg->overlap || i == 0) {
			vp.hva = exp->mem.hva + (cfg->overlap ? 0 : i * exp->slice_size);
			vp.gpa = exp->region_gpa + (cfg->overlap ? 0 : i * exp->slice_size);
			vp.size = exp->slice_size;
			res->bad_pages += ukvm_verify_region(&vp, &exp->ctl, &read_sum,
							     res->verify_message,
							     sizeof(res->verify_message));
			if (exp_aborted(exp)) {
				ukvm_err_set(err, UKVM_ERR_CANCELLED, 0, "cancelled during verification");
				return -ECANCELED;
			}
		}
		if (vr->pages != pages * exp->passes && res->verified) {
			snprintf(res->verify_message, sizeof(res->verify_message),
				 "vCPU %u touched %llu pages, expected %llu", i,
				 (unsigned long long)vr->pages,
				 (unsigned long long)(pages * exp->passes));
			res->verified = false;
		}
		if (ARG(a, GA_CHECKSUM) != read_sum * exp->passes && res->verified) {
			snprintf(res->verify_message, sizeof(res->verify_message),
				 "vCPU %u read data other than what was resolved: checksum "
				 "0x%llx, expected 0x%llx", i,
				 (unsigned long long)ARG(a, GA_CHECKSUM),
				 (unsigned long long)(read_sum * exp->passes));
			res->verified = false;
		}
	}
	if (res->bad_pages)
		res->verified = false;
	return 0;
}

/* Releases everything; with keep_memory, all but the test region's memory. */
static void experiment_teardown(struct ukvm_experiment *exp, bool keep_memory)
{
	uint32_t i;

	stop_pools(exp, true);
	free(exp->pools);
	exp->pools = NULL;
	exp->nr_pools = 0;
	for (i = 0; exp->vcpus && i < exp->cfg.vcpus; i++) {
		ukvm_kvmstats_close(&exp->vcpu_stats[i]);
		ukvm_vcpu_destroy(&exp->vcpus[i]);
	}
	free(exp->vcpus);
	free(exp->vcpu_stats);
	exp->vcpus = NULL;
	exp->vcpu_stats = NULL;
	ukvm_kvmstats_close(&exp->vm_stats);
	ukvm_vm_destroy(&exp->vm);
	if (!keep_memory)
		ukvm_mem_destroy(&exp->mem);
}

static void *controller_thread(void *arg)
{
	struct ukvm_experiment *exp = arg;
	struct ukvm_error err = { 0 };
	bool early;
	int ret;

	if (exp->cfg.timeout_ns)
		exp->deadline_ns = deadline_after(exp->cfg.timeout_ns);
	ret = experiment_setup(exp, &err);
	if (!ret && !exp_aborted(exp))
		ret = experiment_execute(exp, &err);
	if (ret)
		exp_fail(exp, &err);
	experiment_stop_vcpus(exp);
	stop_pools(exp, false);
	if (!exp_aborted(exp)) {
		ret = experiment_collect(exp, &err);
		if (ret)
			exp_fail(exp, &err);
	}
	early = exp_aborted(exp) && exp->mem.hva;
	experiment_teardown(exp, early);

	pthread_mutex_lock(&exp->ctl.lock);
	exp->finished = true;
	exp->releasing_memory = early;
	pthread_cond_broadcast(&exp->ctl.cond);
	pthread_mutex_unlock(&exp->ctl.lock);
	if (!early)
		return NULL;

	ukvm_mem_destroy(&exp->mem);	/* the caller may have gone: see ukvm_wait_idle() */
	return NULL;
}

int ukvm_experiment_start(const struct ukvm_config *cfg, struct ukvm_experiment **out,
			  struct ukvm_error *err)
{
	struct ukvm_experiment *exp;
	sigset_t old;
	int ret;

	memset(err, 0, sizeof(*err));
	ret = ukvm_config_validate(cfg, err);
	ret = ret ?: ukvm_kick_init(err);
	if (ret)
		return ret;
	ukvm_wait_idle();	/* an earlier failed run's memory first */
	exp = calloc(1, sizeof(*exp));
	if (!exp) {
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating the experiment");
		return -ENOMEM;
	}
	exp->cfg = *cfg;
	/* The caller's pin lists need not outlive this call: keep copies. */
	if (cfg->nr_pin_vcpus) {
		exp->pin_vcpus = malloc(cfg->nr_pin_vcpus * sizeof(int32_t));
		if (exp->pin_vcpus)
			memcpy(exp->pin_vcpus, cfg->pin_vcpus, cfg->nr_pin_vcpus * sizeof(int32_t));
	}
	if (cfg->nr_pin_readers) {
		exp->pin_readers = malloc(cfg->nr_pin_readers * sizeof(int32_t));
		if (exp->pin_readers)
			memcpy(exp->pin_readers, cfg->pin_readers,
			       cfg->nr_pin_readers * sizeof(int32_t));
	}
	if ((cfg->nr_pin_vcpus && !exp->pin_vcpus) || (cfg->nr_pin_readers && !exp->pin_readers)) {
		free(exp->pin_vcpus);
		free(exp->pin_readers);
		free(exp);
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "copying the pin lists");
		return -ENOMEM;
	}
	exp->cfg.pin_vcpus = exp->pin_vcpus;
	exp->cfg.pin_readers = exp->pin_readers;
	ukvm_vm_init(&exp->vm);
	ukvm_kvmstats_init(&exp->vm_stats);
	ukvm_mem_init(&exp->mem);
	ret = ukvm_ctl_init(&exp->ctl);
	if (ret) {
		ukvm_err_set(err, UKVM_ERR_RUN, -ret, "pthread_mutex_init/pthread_cond_init");
		free(exp->pin_vcpus);
		free(exp->pin_readers);
		free(exp);
		return ret;
	}
	exp->ctl.inject = cfg->inject;
	exp->ctl.inject_after = cfg->inject_after;

	/* The controller, and every thread it makes, starts with all signals blocked. */
	ukvm_block_all_signals(&old);
	ret = pthread_create(&exp->controller, NULL, controller_thread, exp);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret) {
		ukvm_err_set(err, UKVM_ERR_RUN, ret, "pthread_create(controller)");
		ukvm_ctl_destroy(&exp->ctl);
		free(exp->pin_vcpus);
		free(exp->pin_readers);
		free(exp);
		return -ret;
	}
	*out = exp;
	return 0;
}

int ukvm_experiment_wait(struct ukvm_experiment *exp, uint64_t timeout_ns)
{
	struct ukvm_ctl *ctl = &exp->ctl;
	uint64_t deadline = deadline_after(timeout_ns);
	struct timespec ts;
	int ret = 0;

	set_deadline(&ts, deadline);
	pthread_mutex_lock(&ctl->lock);
	while (!exp->finished) {
		if (timeout_ns == UINT64_MAX) {
			pthread_cond_wait(&ctl->cond, &ctl->lock);
		} else if (pthread_cond_timedwait(&ctl->cond, &ctl->lock, &ts) == ETIMEDOUT) {
			ret = exp->finished ? 0 : -ETIMEDOUT;
			break;
		}
	}
	pthread_mutex_unlock(&ctl->lock);
	return ret;
}

void ukvm_experiment_cancel(struct ukvm_experiment *exp)
{
	struct ukvm_ctl *ctl = &exp->ctl;

	struct ukvm_error cancelled = { 0 };

	ukvm_err_set(&cancelled, UKVM_ERR_CANCELLED, 0, "the experiment was cancelled");
	pthread_mutex_lock(&ctl->lock);
	if (!exp->finished) {	/* too late to cancel a finished run: keep its result */
		ctl->cancelled = true;
		ukvm_ctl_fail_locked(ctl, &cancelled);
	}
	pthread_mutex_unlock(&ctl->lock);
}

int ukvm_experiment_finish(struct ukvm_experiment *exp, struct ukvm_result *res,
			   struct ukvm_error *err)
{
	int ret = 0;

	memset(err, 0, sizeof(*err));
	memset(res, 0, sizeof(*res));
	ukvm_experiment_wait(exp, UINT64_MAX);
	pthread_mutex_lock(&exp->ctl.lock);
	if (exp->releasing_memory) {
		/* Failed: answer now; the controller finishes releasing memory. */
		*err = exp->ctl.error;
		pthread_mutex_unlock(&exp->ctl.lock);
		pthread_mutex_lock(&pending_lock);
		exp->next_pending = pending;
		pending = exp;
		pthread_mutex_unlock(&pending_lock);
		return -1;
	}
	pthread_mutex_unlock(&exp->ctl.lock);
	pthread_join(exp->controller, NULL);
	if (exp->ctl.failed) {
		*err = exp->ctl.error;
		ret = -1;
	} else {
		*res = exp->result;
		memset(&exp->result, 0, sizeof(exp->result));	/* now the caller's */
	}
	experiment_free(exp);
	return ret;
}

int ukvm_probe(const struct ukvm_config *cfg, struct ukvm_error *err)
{
	struct ukvm_experiment *exp;
	int ret;

	memset(err, 0, sizeof(*err));
	ret = ukvm_config_validate(cfg, err);
	if (ret)
		return ret;
	exp = calloc(1, sizeof(*exp));
	if (!exp) {
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating the probe");
		return -ENOMEM;
	}
	exp->cfg = *cfg;
	exp->cfg.nr_pin_vcpus = exp->cfg.nr_pin_readers = 0;
	exp->probe = true;
	ukvm_vm_init(&exp->vm);
	ukvm_mem_init(&exp->mem);
	ukvm_kvmstats_init(&exp->vm_stats);
	ret = ukvm_ctl_init(&exp->ctl);
	if (ret) {
		ukvm_err_set(err, UKVM_ERR_RUN, -ret, "pthread_mutex_init/pthread_cond_init");
		free(exp);
		return ret;
	}
	ret = experiment_setup(exp, err);
	experiment_teardown(exp, false);
	experiment_free(exp);
	return ret;
}

int ukvm_run(const struct ukvm_config *cfg, struct ukvm_result *res, struct ukvm_error *err)
{
	struct ukvm_experiment *exp;
	int ret;

	memset(res, 0, sizeof(*res));
	ret = ukvm_experiment_start(cfg, &exp, err);
	if (ret)
		return ret;
	return ukvm_experiment_finish(exp, res, err);
}

void ukvm_result_free(struct ukvm_result *res)
{
	uint32_t i;

	for (i = 0; res->vcpus && i < res->nr_vcpus; i++) {
		free(res->vcpus[i].kvm_stats);
		free(res->vcpus[i].pass_end_ns);
	}
	ukvm_free_names(res->vm_stat_names, res->nr_vm_stats);
	ukvm_free_names(res->vcpu_stat_names, res->nr_vcpu_stats);
	free(res->vm_stats);
	free(res->trace);
	res->trace = NULL;
	res->nr_trace = 0;
	res->vm_stat_names = res->vcpu_stat_names = NULL;
	res->vm_stats = NULL;
	free(res->vcpus);
	free(res->readers);
	res->vcpus = NULL;
	res->readers = NULL;
}
