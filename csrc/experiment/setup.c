/* SPDX-License-Identifier: MIT */
/*
 * Building an experiment and taking it apart: the VM, the backing memory
 * and its memslot, the guest's page tables and args, the vCPUs, the prefill,
 * the uffds and their reader pools (paging.c); and the fd and thread
 * budgets of all that. Every step can fail; teardown releases whatever was
 * built, in reverse, on every path.
 */
#include <errno.h>
#include <linux/kvm.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

#include "base/errors.h"
#include "base/util.h"
#include "experiment/access.h"
#include "experiment/dirty.h"
#include "experiment/gmem.h"
#include "experiment/migrate.h"
#include "experiment/paging.h"
#include "experiment/setup.h"
#include "experiment/state.h"
#include "experiment/stop.h"
#include "kvm/guest_abi.h"
#include "kvm/kvmstats.h"
#include "kvm/vcpu.h"
#include "kvm/vm.h"
#include "uffd/backing.h"
#include "uffd/fill.h"
#include "uffd/pool.h"
#include "uffd/pusher.h"
#include "uffd/resident.h"
#include "uffd/source.h"
#include "ukvm.h"

#define SZ_1G			(1ULL << 30)
/* The test region starts at or above 4 GiB, beyond the system memslot. */
#define REGION_MIN_GPA		(4ULL << 30)
#define PREFILL_CHUNK		(2ULL << 20)
/* guest_timing: the guest's clock-sync exits before its walk (tsc.h) */
#define SYNC_ROUNDS		16

/* The keys of vCPU i's random walk order; guest.S applies them. */
static void setup_guest_order(const struct ukvm_config *cfg, uint32_t vcpu, uint64_t pages,
			      uint64_t *a)
{
	uint64_t state = cfg->seed ^ (0x6f72646572000000ULL + vcpu), mask;
	unsigned bits = 0;

	while (bits < 63 && (1ULL << bits) < pages)
		bits++;
	mask = (1ULL << bits) - 1;
	guest_arg(a, GA_PATTERN) = (uint64_t)cfg->pattern;
	guest_arg(a, GA_PERM_MASK) = mask;
	guest_arg(a, GA_PERM_SHIFT) = bits / 2 + 1;
	guest_arg(a, GA_PERM_KEY0) = ukvm_splitmix64(&state) & mask;
	guest_arg(a, GA_PERM_KEY1) = ukvm_splitmix64(&state) & mask;
}

/* A vCPU's accesses in one pass, at most: its pages, or its access list's entries. */
static uint64_t setup_max_accesses(const struct ukvm_experiment *exp)
{
	return ukvm_access_listed(&exp->cfg) ? ukvm_access_max_entries(&exp->cfg)
					     : exp->slice_size / UKVM_PAGE_SIZE;
}

/* guest_timing: a vCPU's access log, one entry per access and a spare (guest_abi.h). */
static uint64_t setup_guest_log_bytes(const struct ukvm_experiment *exp)
{
	return ALIGN_UP((setup_max_accesses(exp) + 1) * GA_LOG_ENTRY, UKVM_PAGE_SIZE);
}

/* touch_percent, access zipf: a vCPU's access list, in the guest's system memory. */
static uint64_t setup_list_bytes(const struct ukvm_experiment *exp)
{
	return ukvm_access_listed(&exp->cfg) ?
	       ALIGN_UP(setup_max_accesses(exp) * sizeof(uint32_t), UKVM_PAGE_SIZE) : 0;
}

/*
 * touch_percent, access zipf: vCPU i's access list, written into guest
 * memory for the guest to walk (GUEST_PATTERN_LIST) and counted into
 * exp->visits for verification.
 */
static int setup_guest_list(struct ukvm_experiment *exp, uint32_t i, uint64_t *a,
			    struct ukvm_error *err)
{
	uint64_t pages = exp->slice_size / UKVM_PAGE_SIZE, first = exp->cfg.overlap ? 0 : i * pages;
	uint64_t list_gpa;
	int64_t n;
	int ret;

	ret = ukvm_vm_alloc(&exp->vm, setup_list_bytes(exp), &list_gpa, err);
	if (ret)
		return ret;
	n = ukvm_access_build(&exp->cfg, i, exp->region_gpa + first * UKVM_PAGE_SIZE, pages,
			      exp->touch_key, ukvm_vm_sys_hva(&exp->vm, list_gpa),
			      exp->visits + first);
	if (n < 0) {
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating vCPU %u's access list", i);
		return (int)n;
	}
	guest_arg(a, GA_PAGES) = (uint64_t)n;
	guest_arg(a, GA_PATTERN) = GUEST_PATTERN_LIST;
	guest_arg(a, GA_LIST) = list_gpa;
	return 0;
}

/*
 * After the lists: the distinct pages the guest touches, in 4 KiB pages
 * and in backing pages (one fault each in a uffd mode).
 */
static void setup_count_touched(struct ukvm_experiment *exp)
{
	uint64_t k, pages = exp->region_size / UKVM_PAGE_SIZE;
	uint64_t per_unit = exp->mem.page_size / UKVM_PAGE_SIZE, last_unit = UINT64_MAX;

	exp->touched_pages = 0;
	exp->touched_units = 0;
	for (k = 0; k < pages; k++) {
		if (!exp->visits[k])
			continue;
		exp->touched_pages++;
		if (k / per_unit != last_unit)
			exp->touched_units++;
		last_unit = k / per_unit;
	}
#ifdef UKVM_TEST_HOOKS
	/* The host forgets one touched page: verification must notice. */
	if (exp->cfg.inject == UKVM_INJECT_UNTOUCHED_PAGE)
		for (k = exp->cfg.inject_after; k < pages; k++)
			if (exp->visits[k]) {
				exp->visits[k] = 0;
				break;
			}
#endif
}

/*
 * guest_timing: the vCPU's access log and clock-sync exits. The log's pages
 * are written here once, so that the guest's stamps never wait for the host
 * to find memory (the guest touches them too, for KVM's own mapping).
 */
static int setup_guest_log(struct ukvm_experiment *exp, struct ukvm_vcpu *vcpu, uint64_t *a,
			   struct ukvm_error *err)
{
	uint64_t bytes = setup_guest_log_bytes(exp);
	int ret;

	ret = ukvm_vm_alloc(&exp->vm, bytes, &vcpu->log_gpa, err);
	if (ret)
		return ret;
	memset(ukvm_vm_sys_hva(&exp->vm, vcpu->log_gpa), 0, bytes);
	vcpu->timing = true;
#ifdef UKVM_TEST_HOOKS
	/* The guest's clock as if it ran ahead of the host's (tests of the conversion). */
	if (exp->cfg.inject == UKVM_INJECT_TSC_OFFSET)
		vcpu->tsc_bias = exp->cfg.inject_after;
#endif
	vcpu->log_entries = setup_max_accesses(exp) + 1;
	guest_arg(a, GA_LOG_PTR) = vcpu->log_gpa;
	guest_arg(a, GA_LOG_STRIDE) = GA_LOG_ENTRY;
	guest_arg(a, GA_LOG_END) = vcpu->log_gpa + bytes;
	guest_arg(a, GA_SYNC_ROUNDS) = SYNC_ROUNDS;
	return 0;
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
		ret = ret ?: ukvm_vm_alloc(&exp->vm, UKVM_VCPU_STACK_BYTES, &stack_gpa, err);
		if (ret)
			return ret;
		a = ukvm_vm_sys_hva(&exp->vm, args_gpa);
		guest_arg(a, GA_REGION) = exp->region_gpa + (cfg->overlap ? 0 : i * exp->slice_size);
		guest_arg(a, GA_PAGES) = exp->slice_size / UKVM_PAGE_SIZE;
		guest_arg(a, GA_WORK) = cfg->guest_work;
		guest_arg(a, GA_PASSES) = exp->passes;
		guest_arg(a, GA_WRITE_PCT) = cfg->write_percent;
		guest_arg(a, GA_WRITE_KEY) = exp->write_key;
		guest_arg(a, GA_WRITE_ROTATE) = cfg->write_set == UKVM_WRITE_SET_PER_PASS ?
						GUEST_WRITE_ROTATE : 0;
		guest_arg(a, GA_TIMING) = cfg->guest_timing;
		setup_guest_order(cfg, i, exp->slice_size / UKVM_PAGE_SIZE, a);
		if (exp->visits) {
			ret = setup_guest_list(exp, i, a, err);
			if (ret)
				return ret;
		}
		if (cfg->guest_timing) {
			ret = setup_guest_log(exp, vcpu, a, err);
			if (ret)
				return ret;
		}

		ret = ukvm_vcpu_create(&exp->vm, vcpu, i, args_gpa, stack_gpa + UKVM_VCPU_STACK_BYTES,
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
	if (exp->visits)
		setup_count_touched(exp);
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
		if (off % (64 * PREFILL_CHUNK) == 0) {
			if (exp_aborted(exp)) {
				ukvm_err_set(err, UKVM_ERR_CANCELLED, 0, "cancelled during the prefill");
				return -ECANCELED;
			}
			if (exp_past_deadline(exp)) {
				ukvm_err_set(err, UKVM_ERR_TIMEOUT, 0,
					     "the run did not finish within timeout_s=%.3f: it was still "
					     "filling the guest's memory before the vCPUs started "
					     "(%llu of %llu MiB)",
					     (double)exp->cfg.timeout_ns / NSEC_PER_SEC,
					     (unsigned long long)(off >> 20),
					     (unsigned long long)(exp->region_size >> 20));
				return -ETIMEDOUT;
			}
		}
		len = exp->region_size - off < PREFILL_CHUNK ? exp->region_size - off
							     : PREFILL_CHUNK;
		ukvm_fill_pages(where + off, len, exp->region_gpa + off);
	}
	return 0;
}

/*
 * uffd_mode wp: the snapshot the resolvers save old pages into, and a save
 * state per page. Ordinary private memory, left unpopulated: only the pages
 * the guest writes are ever copied in, and the rest must read as zero.
 */
static int setup_snapshot(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	uint64_t pages = exp->region_size / UKVM_PAGE_SIZE;
	void *p;

	p = mmap(NULL, exp->region_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		 -1, 0);
	if (p == MAP_FAILED)
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "mmap(snapshot, %llu bytes)",
				    (unsigned long long)exp->region_size);
	exp->snapshot = p;
	exp->wp_state = calloc(pages, sizeof(*exp->wp_state));
	if (!exp->wp_state) {
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating the snapshot's page states");
		return -ENOMEM;
	}
	return 0;
}

#ifdef UKVM_TEST_HOOKS
/*
 * UKVM_INJECT_UNFAULTED_PAGE: page inject_after of the region is mapped
 * before userfaultfd is registered, with the data it would have got, as a
 * kernel that maps memory without asking would: the contents are right,
 * the page never faults.
 */
static void setup_unfaulted_injection(struct ukvm_experiment *exp)
{
	uint64_t off = exp->cfg.inject_after * exp->mem.page_size;
	volatile uint8_t *page = exp->mem.hva + off;

	if (exp->cfg.inject != UKVM_INJECT_UNFAULTED_PAGE || off >= exp->region_size ||
	    exp->cfg.uffd_mode == UKVM_UFFD_NONE || exp->cfg.prefault)
		return;
	if (exp->cfg.uffd_mode == UKVM_UFFD_MINOR)
		(void)page[0];	/* maps the page cache's page: no minor fault left */
	else if (exp->filled)
		ukvm_fill_pages((void *)page, exp->mem.page_size, exp->region_gpa + off);
	else
		page[0] = 0;	/* zero-filled, as UFFDIO_ZEROPAGE would leave it */
}

/* UKVM_INJECT_GUEST_*: break the guest's mapping of one page of vCPU 0. */
static int setup_guest_injection(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	uint64_t *pte = NULL;

	if (exp->cfg.inject != UKVM_INJECT_GUEST_FAULT && exp->cfg.inject != UKVM_INJECT_GUEST_MMIO)
		return 0;
	/* The page index first: inject_after * 4 KiB could wrap. */
	if (exp->cfg.inject_after < exp->slice_size / UKVM_PAGE_SIZE)
		pte = ukvm_vm_leaf_pte(&exp->vm,
				       exp->region_gpa + exp->cfg.inject_after * UKVM_PAGE_SIZE);
	if (!pte) {
		ukvm_err_set(err, UKVM_ERR_CONFIG, 0, "inject_after: beyond vCPU 0's pages");
		return -EINVAL;
	}
	if (exp->cfg.inject == UKVM_INJECT_GUEST_FAULT)
		*pte = 0;
	else	/* a guest-physical address no memslot covers */
		*pte = (*pte & 0xfff) | ALIGN_UP(exp->region_gpa + exp->region_size + SZ_1G, SZ_1G);
	return 0;
}
#endif

int ukvm_setup_build(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	const struct ukvm_config *cfg = &exp->cfg;
	enum ukvm_backing made = ukvm_gmem_backing_made(cfg);
	uint64_t sys_size;
	int ret;

	uint64_t state = cfg->seed ^ 0x7772697465000000ULL;

	exp->passes = cfg->passes;
	exp->write_key = ukvm_splitmix64(&state);
	exp->filled = cfg->prefault || cfg->uffd_mode == UKVM_UFFD_MINOR ||
		      cfg->uffd_mode == UKVM_UFFD_WP ||
		      (cfg->uffd_mode == UKVM_UFFD_MISSING && (cfg->resolve == UKVM_RESOLVE_COPY ||
						       cfg->resolve == UKVM_RESOLVE_MOVE));
	exp->slice_size = cfg->mem_per_vcpu;
	exp->region_size = cfg->overlap ? cfg->mem_per_vcpu : cfg->mem_per_vcpu * cfg->vcpus;

	/* KVM's vCPU limit was checked before (ukvm_setup_check_vcpus); nothing is sized yet. */
	ret = ukvm_vm_open(&exp->vm, err);
	if (ret)
		return ret;
	sys_size = ukvm_vm_sys_size(cfg->vcpus, exp->region_size,
				    (cfg->guest_timing ? cfg->vcpus * setup_guest_log_bytes(exp) : 0) +
				    cfg->vcpus * setup_list_bytes(exp));
	if (ukvm_access_listed(cfg)) {
		exp->touch_key = ukvm_splitmix64(&state);
		exp->visits = calloc(exp->region_size / UKVM_PAGE_SIZE, sizeof(*exp->visits));
		if (!exp->visits) {
			ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating the page visit counts");
			return -ENOMEM;
		}
	}
	ret = ukvm_backing_check_host(cfg->backing, exp->region_size, err);
	ret = ret ?: ukvm_vm_create(&exp->vm, sys_size, err);
	if (ret)
		return ret;
	if (ukvm_kvmstats_open(&exp->vm_stats, exp->vm.vm_fd, "VM", NULL))
		ukvm_kvmstats_init(&exp->vm_stats);
	exp->region_gpa = ALIGN_UP(sys_size, SZ_1G);
	if (exp->region_gpa < REGION_MIN_GPA)
		exp->region_gpa = REGION_MIN_GPA;
	ret = ukvm_vm_map(&exp->vm, exp->region_gpa, exp->region_size, cfg->guest_page_size, err);
	if (!ret && made == UKVM_BACKING_GUEST_MEMFD)
		ret = ukvm_gmem_check_vm(&exp->vm, cfg, err);
	ret = ret ?: ukvm_backing_create(&exp->mem, made, exp->region_size, exp->vm.vm_fd, err);
	if (ret)
		return ret;
	if (made == UKVM_BACKING_GUEST_MEMFD)
		ret = ukvm_vm_add_gmem_memslot(&exp->vm, exp->region_gpa, exp->region_size,
					       exp->mem.hva, exp->mem.memfd, err);
	else
		ret = ukvm_vm_add_memslot(&exp->vm, exp->region_gpa, exp->region_size,
					  exp->mem.hva, err);
	if (ret)
		return ret;
	exp->region_slot = exp->vm.nr_slots - 1;
	/* Before the vCPUs: the dirty ring can only be had then (a probe asks too). */
	ret = ukvm_dirty_setup(exp, err);
	if (ret)
		return ret;
	/* The page source, its cache made cold or warm as late as can be: just before the uffds. */
	if (exp->probe)
		return ukvm_source_open(&exp->source, cfg, exp->region_size, err) ?:
		       ukvm_paging_setup(exp, err);
	ret = setup_vcpus(exp, err);
	ret = ret ?: ukvm_dirty_setup_vcpus(exp, err);
	ret = ret ?: ukvm_migrate_setup(exp, err);
#ifdef UKVM_TEST_HOOKS
	ret = ret ?: setup_guest_injection(exp, err);
#endif
	if (ret)
		return ret;
	/* WP: the old contents are in place, through the guest's mapping, before protecting. */
	if (cfg->prefault || cfg->uffd_mode == UKVM_UFFD_WP)
		ret = setup_fill(exp, exp->mem.hva, err);
	else if (cfg->uffd_mode == UKVM_UFFD_MINOR)
		ret = setup_fill(exp, exp->mem.alias, err);
	if (!ret && cfg->uffd_mode == UKVM_UFFD_WP && !cfg->wp_async)
		ret = setup_snapshot(exp, err);
#ifdef UKVM_TEST_HOOKS
	setup_unfaulted_injection(exp);
#endif
	ret = ret ?: ukvm_source_open(&exp->source, cfg, exp->region_size, err);
	ret = ret ?: ukvm_paging_setup(exp, err);
	if (!ret && exp_past_deadline(exp)) {
		ukvm_err_set(err, UKVM_ERR_TIMEOUT, 0,
			     "the run did not finish within timeout_s=%.3f: it was still being set "
			     "up, before the vCPUs started",
			     (double)exp->cfg.timeout_ns / NSEC_PER_SEC);
		ret = -ETIMEDOUT;
	}
	return ret;
}

int ukvm_setup_check_vcpus(const struct ukvm_config *cfg, struct ukvm_error *err)
{
	struct ukvm_vm vm;
	uint32_t max;
	int ret;

	ret = ukvm_vm_open(&vm, err);
	if (ret)
		return ret;
	max = vm.max_vcpus;
	ukvm_vm_destroy(&vm);
	if (cfg->vcpus <= max)
		return 0;
	ukvm_err_set(err, UKVM_ERR_CONFIG, 0,
		     "vcpus: this host's KVM allows at most %u vCPUs per VM, not %u "
		     "(KVM_CAP_MAX_VCPUS of /dev/kvm): use at most %u", max, cfg->vcpus, max);
	return -EINVAL;
}

/*
 * The fds the pools of a run (or probe) of cfg hold, from a dry pass: each
 * pool shaped by ukvm_paging_pool_shape() as the run's will be, then asked
 * what it holds once started (ukvm_pool_fds), *conns of them its
 * resolvers' connections to a page server; a probe registers its uffds and
 * starts no pool. Nothing is allocated: the count cannot fail.
 */
static uint64_t setup_pool_fds(const struct ukvm_config *cfg, bool probe, uint32_t nr_pools,
			       uint64_t *conns)
{
	struct ukvm_pool pool;
	uint64_t n = 0;
	uint32_t u;

	*conns = 0;
	if (probe || !nr_pools)
		return nr_pools;
	for (u = 0; u < nr_pools; u++) {
		ukvm_pool_init(&pool);
		ukvm_paging_pool_shape(cfg, nr_pools, &pool, u);
		n += ukvm_pool_fds(&pool, cfg->source);
		*conns += ukvm_pool_fds(&pool, cfg->source) -
			  ukvm_pool_fds(&pool, UKVM_SOURCE_SYNTHETIC);
	}
	return n;
}

/*
 * The most fds the setup above holds at once, for cfg: what fds_check()
 * compares with the process's limit. The pools' and the pusher's come from
 * their own counts (setup_pool_fds, ukvm_pusher_fds), which a test build
 * checks against what they hold once started.
 */
uint64_t ukvm_setup_fds_needed(const struct ukvm_config *cfg, bool probe, char *why,
			       size_t why_len)
{
	uint64_t vcpus = probe ? 0 : cfg->vcpus;
	uint64_t memfd = ukvm_backing_is_shared(cfg->backing) ? 1 : 0;
	/* source file or remote: the snapshot stays open (remote: mapped to verify against). */
	uint64_t source = cfg->source != UKVM_SOURCE_SYNTHETIC ? 1 : 0;
	/* dirty_tracking wp_async: its uffd and /proc/self/pagemap, for the whole run. */
	uint64_t dirty = cfg->dirty_tracking == UKVM_DIRTY_WP_ASYNC ? 2 : 0;
	uint64_t pusher = !probe && ukvm_paging_has_pusher(cfg) ? ukvm_pusher_fds(cfg->source) : 0;
	uint32_t nr_pools = ukvm_paging_nr_pools(cfg);
	uint64_t conns, pools = setup_pool_fds(cfg, probe, nr_pools, &conns);
	uint64_t waits = probe ? 0 : pools - conns - 2ULL * nr_pools;	/* epoll sets or rings */
	size_t n;

	/*
	 * /dev/kvm, the VM and its statistics; each vCPU and its statistics;
	 * the memfd; the pools; and 1 that setup may hold for a moment beside
	 * all of those (/dev/userfaultfd while it makes a uffd). The fds it
	 * holds for a moment earlier (the uffd that asks for features, /sys
	 * files) come when fewer are open.
	 */
	n = (size_t)snprintf(why, why_len, "3 for KVM, the VM and its statistics");
	if (vcpus && n < why_len)
		n += (size_t)snprintf(why + n, why_len - n, ", %llu for %llu vCPUs and their "
				      "statistics", (unsigned long long)(2 * vcpus),
				      (unsigned long long)vcpus);
	if (memfd && n < why_len)
		n += (size_t)snprintf(why + n, why_len - n, ", 1 for the %s memfd",
				      ukvm_backing_name(cfg->backing));
	if (pools && n < why_len)
		n += (size_t)snprintf(why + n, why_len - n, ", %llu for %u uffd%s%s%s",
				      (unsigned long long)(pools - conns), nr_pools,
				      nr_pools > 1 ? "s" : "", probe ? "" : " with their stop eventfds",
				      !waits ? "" : cfg->wait == UKVM_WAIT_IO_URING ?
				      " and an io_uring per reader" : " and an epoll set per reader");
	if (source && n < why_len)
		n += (size_t)snprintf(why + n, why_len - n, ", 1 for the source file");
	if (dirty && n < why_len)
		n += (size_t)snprintf(why + n, why_len - n, ", 2 for wp_async's uffd and "
				      "/proc/self/pagemap");
	if (conns && n < why_len)
		n += (size_t)snprintf(why + n, why_len - n, ", %llu for page server connections",
				      (unsigned long long)conns);
	if (pusher && n < why_len)
		n += (size_t)snprintf(why + n, why_len - n, ", %llu for the prefetch pusher",
				      (unsigned long long)pusher);
	if (n < why_len)
		snprintf(why + n, why_len - n, ", 1 while setting up");
	return 3 + 2 * vcpus + memfd + pools + source + dirty + pusher + 1;
}

/*
 * The threads a run of cfg starts, besides the caller's: the controller,
 * a thread per vCPU, each pool's readers (ukvm_pool_threads, of pools
 * shaped by ukvm_paging_pool_shape() as the run's will be), the pusher, and the
 * worker task KVM itself starts for the VM at the first KVM_RUN
 * (kvm-nx-lpage-recovery, in this process's cgroups and counted against
 * RLIMIT_NPROC; refused, KVM_RUN fails with EAGAIN). Nothing is allocated:
 * the count cannot fail.
 */
uint64_t ukvm_setup_threads_needed(const struct ukvm_config *cfg, char *why, size_t why_len)
{
	uint32_t nr_pools = ukvm_paging_nr_pools(cfg), u;
	uint64_t readers = 0, pusher = ukvm_paging_has_pusher(cfg) ? 1 : 0;
	struct ukvm_pool pool;
	size_t n;

	for (u = 0; u < nr_pools; u++) {
		ukvm_pool_init(&pool);
		ukvm_paging_pool_shape(cfg, nr_pools, &pool, u);
		readers += ukvm_pool_threads(&pool);
	}
	n = (size_t)snprintf(why, why_len, "1 controller, %u for the vCPUs, 1 KVM worker "
			     "(kvm-nx-lpage-recovery)", cfg->vcpus);
	if (readers && n < why_len)
		n += (size_t)snprintf(why + n, why_len - n, ", %llu reader%s of %u uffd%s",
				      (unsigned long long)readers, readers > 1 ? "s" : "",
				      nr_pools, nr_pools > 1 ? "s" : "");
	if (pusher && n < why_len)
		snprintf(why + n, why_len - n, ", 1 prefetch pusher");
	return 1 + cfg->vcpus + 1 + readers + pusher;
}

void ukvm_setup_teardown(struct ukvm_experiment *exp, bool keep_memory)
{
	uint32_t i;

	ukvm_stop_pools(exp, true);	/* the pusher with the readers, before their uffds go */
	ukvm_pusher_destroy(&exp->pusher);
	ukvm_resident_destroy(&exp->resident);
	free(exp->pools);
	ukvm_online_destroy(&exp->online);	/* after the pools: their resolvers' queues */
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
	ukvm_dirty_destroy(&exp->dirty);	/* after the vCPUs: their rings point into it */
	ukvm_migrate_destroy(&exp->migrate);
	ukvm_kvmstats_close(&exp->vm_stats);
	ukvm_vm_destroy(&exp->vm);
	if (!keep_memory)
		ukvm_backing_destroy(&exp->mem);
	/* After the pools: no resolver writes it any more. */
	if (exp->snapshot)
		munmap(exp->snapshot, exp->region_size);
	exp->snapshot = NULL;
	free((void *)exp->wp_state);
	exp->wp_state = NULL;
	ukvm_source_close(&exp->source);	/* after the pools: nothing fetches any more */
	free(exp->visits);
	exp->visits = NULL;
}
