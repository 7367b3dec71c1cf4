/* SPDX-License-Identifier: MIT */
/*
 * After the run: KVM's statistics, the readers' counters and fault log, the
 * uffds closed (a page the check reads must not fault into one), and the
 * result filled in; between those steps, every page verified and the
 * guests' reports checked (check.c).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/tsc.h"
#include "base/util.h"
#include "experiment/check.h"
#include "experiment/collect.h"
#include "experiment/dirty.h"
#include "experiment/migrate.h"
#include "experiment/state.h"
#include "experiment/stop.h"
#include "kvm/guest_abi.h"
#include "kvm/kvmstats.h"
#include "kvm/vcpu.h"
#include "kvm/vm.h"
#include "uffd/backing.h"
#include "uffd/faultlog.h"
#include "uffd/resident.h"
#include "uffd/source.h"
#include "uffd/verify.h"

/* KVM's VM-wide statistics into the result; absent stats are not an error. */
static int collect_vm_stats(struct ukvm_experiment *exp)
{
	struct ukvm_result *res = &exp->result;
	struct ukvm_kvmstats *s = &exp->vm_stats;

	if (s->fd < 0 || !s->have_before)
		return 0;
	res->kvm_stats = calloc(s->nr_scalars ?: 1, sizeof(uint64_t));
	res->kvm_stat_names = ukvm_kvmstats_scalar_names(s);
	if (!res->kvm_stats || !res->kvm_stat_names)
		return -ENOMEM;
	res->nr_kvm_stats = s->nr_scalars;
	if (ukvm_kvmstats_deltas(s, res->kvm_stats)) {
		ukvm_kvmstats_free_names(res->kvm_stat_names, res->nr_kvm_stats);
		free(res->kvm_stats);
		res->kvm_stat_names = NULL;
		res->kvm_stats = NULL;
		res->nr_kvm_stats = 0;
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

/* No conversion: clock_sync NONE, and why in clock_sync_message. */
static void clock_unsynced(struct ukvm_result *res, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void clock_unsynced(struct ukvm_result *res, const char *fmt, ...)
{
	va_list ap;

	res->clock_sync = UKVM_CLOCK_SYNC_NONE;
	va_start(ap, fmt);
	vsnprintf(res->clock_sync_message, sizeof(res->clock_sync_message), fmt, ap);
	va_end(ap);
}

/*
 * One vCPU's offset (guest TSC - host TSC): KVM's (*from_kvm, *half_width
 * 0), or the middle of where the brackets meet and their half-width; or
 * false where there is none to trust (clock_unsynced() has said why). KVM's
 * offset must read the same at every sync exit and now: where it moved,
 * the guest's stamps between two readings are on no one offset, even
 * where brackets wider than its moves still meet (tsc.h). The brackets
 * before and after the walk must meet too: the guest's TSC may move with
 * no KVM that says so.
 */
static bool collect_clock_offset(struct ukvm_experiment *exp, struct ukvm_vcpu *vcpu,
				 int64_t *offset, double *half_width, bool *from_kvm)
{
	struct ukvm_result *res = &exp->result;
	struct ukvm_tsc_offsets *kvm = &vcpu->kvm_tsc_offsets;
	const struct ukvm_tsc_bracket *before = &vcpu->tsc_bracket;
	const struct ukvm_tsc_bracket *after = &vcpu->tsc_bracket_after;
	struct ukvm_tsc_bracket both = *before;
	bool have_kvm;
	int64_t now;

	have_kvm = !ukvm_vcpu_tsc_offset(vcpu, &now);
	if (have_kvm)
		ukvm_tsc_offsets_add(kvm, now);
	if (!ukvm_tsc_offsets_steady(kvm)) {
		clock_unsynced(res, "KVM's TSC offset of vCPU %u moved during the run "
			       "(KVM_VCPU_TSC_OFFSET read %u times, at its clock-sync exits and "
			       "after the run: %u changes, %llu cycles apart), as KVM moves it where "
			       "the host kernel marked its TSC unstable: no one offset converts the "
			       "guest's stamps", vcpu->index, kvm->reads, kvm->changes,
			       (unsigned long long)((uint64_t)kvm->hi - (uint64_t)kvm->lo));
		return false;
	}
	if (!before->rounds || !after->rounds) {
		clock_unsynced(res, "vCPU %u made no clock-sync exit %s its walk", vcpu->index,
			       before->rounds ? "after" : "before");
		return false;
	}
	if (!ukvm_tsc_bracket_meet(&both, after)) {
		clock_unsynced(res, "the clock-sync exits of vCPU %u before and after its walk "
			       "bracket no one offset: the guest's TSC moved against the host's by "
			       "%llu cycles or more during the run", vcpu->index,
			       (unsigned long long)(after->lo > before->hi ?
						    (uint64_t)after->lo - (uint64_t)before->hi :
						    (uint64_t)before->lo - (uint64_t)after->hi));
		return false;
	}
	*from_kvm = have_kvm && now >= both.lo && now <= both.hi;
	if (*from_kvm) {
		*offset = now;
		*half_width = 0;
	} else {
		*offset = both.lo + (both.hi - both.lo) / 2;
		*half_width = (double)(both.hi - both.lo) / 2;
	}
	return true;
}

/*
 * guest_timing: how each vCPU's TSC maps to the host's (tsc.h), or why it
 * cannot (collect_clock_offset). KVM's offset is taken where it held still
 * and lies in both brackets; else the middle of where they meet, whose
 * half-width goes into the error bound. A guest TSC running at another
 * rate than the host's (KVM scaling, which uffdkvm never asks for) cannot
 * be converted at all.
 */
static void collect_clock(struct ukvm_experiment *exp, struct ukvm_guest_log *logs)
{
	struct ukvm_result *res = &exp->result;
	double per_ns = ukvm_tsc_clock_cycles_per_ns(&exp->tsc_clock);
	double half_width = 0, half;
	bool all_kvm = true, from_kvm;
	uint32_t i;

	res->clock_sync = UKVM_CLOCK_SYNC_NONE;
	if (per_ns <= 0) {
		clock_unsynced(res, "the host's TSC was not paired with CLOCK_MONOTONIC twice "
			       "during the run");
		return;
	}
	if (!res->tsc_khz) {
		clock_unsynced(res, "KVM gave no rate for the guest's TSC (KVM_GET_TSC_KHZ)");
		return;
	}
	if ((double)res->tsc_khz > per_ns * 1e6 * 1.001 ||
	    (double)res->tsc_khz < per_ns * 1e6 * 0.999) {
		clock_unsynced(res, "the guest's TSC runs at %llu kHz (KVM_GET_TSC_KHZ) and the "
			       "host's at %.0f kHz (against CLOCK_MONOTONIC), more than 0.1%% "
			       "apart: no offset converts one into the other",
			       (unsigned long long)res->tsc_khz, per_ns * 1e6);
		return;
	}
	for (i = 0; i < exp->cfg.vcpus; i++) {
		if (!collect_clock_offset(exp, &exp->vcpus[i], &logs[i].tsc_offset, &half,
					  &from_kvm))
			return;		/* nothing to trust */
		all_kvm = all_kvm && from_kvm;
		if (half > half_width)
			half_width = half;
	}
	for (i = 0; i < exp->cfg.vcpus; i++)
		logs[i].usable = exp->vcpus[i].passes_seen >= 1;
	res->clock_sync = all_kvm ? UKVM_CLOCK_SYNC_KVM_OFFSET : UKVM_CLOCK_SYNC_EXITS;
	res->clock_error_ns = (uint64_t)(ukvm_tsc_clock_error_ns(&exp->tsc_clock) +
					 half_width / per_ns) + 1;
}

/*
 * Stats full: per-vCPU faults, stages and blocked time, the VM's blocktime,
 * per-page resolution counts (online.h's, or without it from the records
 * after the run); and the trace.
 */
static int collect_faultlog(struct ukvm_experiment *exp, struct ukvm_faultlog *log,
			    struct ukvm_error *err)
{
	const struct ukvm_config *cfg = &exp->cfg;
	struct ukvm_result *res = &exp->result;
	struct ukvm_guest_log *logs = NULL;
	struct ukvm_faultlog_store **stores = NULL;
	int32_t *tids = calloc(cfg->vcpus, sizeof(*tids));
	uint32_t i, u;
	int ret = -ENOMEM;

	if (!tids)
		return -ENOMEM;
	if (cfg->guest_timing) {
		logs = calloc(cfg->vcpus, sizeof(*logs));
		if (!logs)
			goto out;
		for (i = 0; i < cfg->vcpus; i++) {
			logs[i].entries = ukvm_vm_sys_hva(&exp->vm, exp->vcpus[i].log_gpa);
			logs[i].nr = guest_arg(exp_guest_args(exp, &exp->vcpus[i]), GA_PAGES);
			logs[i].pages = exp->slice_size / UKVM_PAGE_SIZE;
			logs[i].base_gpa = guest_arg(exp_guest_args(exp, &exp->vcpus[i]), GA_REGION);
#ifdef UKVM_TEST_HOOKS
			logs[i].tsc_bias = exp->vcpus[i].tsc_bias;
#endif
		}
		collect_clock(exp, logs);
	}
	for (i = 0; i < cfg->vcpus; i++)
		tids[i] = exp->vcpus[i].tid;
	*log = (struct ukvm_faultlog){
		.nr_vcpus = cfg->vcpus,
		.tids = tids,
		.guest = logs,
		.clock = &exp->tsc_clock,
		.region_gpa = exp->region_gpa,
		.region_pages = exp->region_size / exp->mem.page_size,
		.page_size = exp->mem.page_size,
		.match_bytes = ukvm_backing_is_hugetlb(cfg->backing) && !exp->exact_address ?
			       exp->mem.page_size : UKVM_PAGE_SIZE,
		.visits = exp->visits,
		/* Without guest_timing the statistics were computed online (online.h). */
		.trace_only = exp->online.queues != NULL,
		.vcpus = res->vcpus,
		.readers = res->readers,
		/* The same for every pool: cfg->readers, or the vCPUs a pool serves. */
		.readers_per_uffd = exp->nr_pools ? exp->pools[0].nr_readers : cfg->readers,
	};
	stores = calloc(exp->nr_pools ?: 1, sizeof(*stores));
	if (!stores) {
		ret = -ENOMEM;
		goto out;
	}
	for (u = 0; u < exp->nr_pools; u++)
		stores[u] = &exp->pools[u].area.log;
	if (!log->trace_only || cfg->trace_faults)
		ret = ukvm_faultlog_build(log, stores, exp->nr_pools);
	else
		ret = 0;
	if (!ret && log->trace_only)
		ret = ukvm_online_finish(&exp->online, log, err);	/* its own message */
	if (ret)
		goto out;
	res->blocktime_ns = log->blocktime_ns;
	res->misordered_faults = log->misordered;
	if (cfg->trace_faults) {
		res->fault_trace = log->all;
		res->nr_fault_trace = log->nr_all;
		log->all = NULL;
	}
out:
	free(stores);
	free(log->all);
	log->all = NULL;
	free(tids);
	free(logs);
	return ret;
}

/*
 * uffd_mode missing with resolve copy: how each page went in. Prefetched
 * pages the guest never touches are waste; pages the guest touches that
 * prefetch installed are faults avoided (what the same run without
 * prefetch would have faulted). A page of page_size counts as touched when
 * the guest touches any 4 KiB of it.
 */
static int collect_resident(struct ukvm_experiment *exp, const struct ukvm_verify_params *vp0,
			    uint64_t *installed_touched)
{
	struct ukvm_result *res = &exp->result;
	struct ukvm_resident *rs = &exp->resident;
	struct ukvm_verify_params vp = *vp0;
	uint64_t page, sub, n, all_ns;
	uint32_t i;

	*installed_touched = 0;
	if (!rs->faulted)
		return 0;
	vp.gpa = exp->region_gpa;
	vp.hva = exp->mem.hva;
	vp.size = exp->region_size;
	vp.visits = exp->visits;	/* the whole region's (touch_percent, access) */
	res->resident_tracked = true;
	for (page = 0; page < rs->pages; page++) {
		uint64_t gpa = exp->region_gpa + page * exp->mem.page_size;
		enum ukvm_page_state how = ukvm_resident_state(rs, page);
		bool touched = false, prefetched = how == UKVM_PAGE_PREFETCHED;

		for (sub = 0; sub < exp->mem.page_size && !touched; sub += UKVM_PAGE_SIZE)
			touched = ukvm_guest_touches(&vp, gpa + sub);
		res->touched_units += touched;
		res->faulted_pages += ukvm_resident_bit(rs->waited, page);
		res->prefetched_pages += prefetched;
		res->wasted_prefetch_pages += prefetched && !touched;
		/* Touched, and there before the guest asked: no fault for it. */
		*installed_touched += (prefetched || how == UKVM_PAGE_PREINSTALLED) && touched;
	}
	res->faults_avoided = res->touched_units - res->faulted_pages;
	res->pushed_pages = exp->pusher.pages;
	res->pusher_eexist = exp->pusher.eexist;
	res->prefetch_eexist = res->pusher_eexist;
	for (i = 0; i < res->nr_readers; i++)
		res->prefetch_eexist += res->readers[i].prefetch_eexist;
	/* From the first vCPU's start (a page the pusher put in before it: 0). */
	all_ns = atomic_load(&rs->all_ns);
	res->resident_ns = !all_ns ? UKVM_RESULT_NONE :
			   all_ns > res->start_ns ? all_ns - res->start_ns : 0;
	n = rs->order ? atomic_load(&rs->nr_order) : 0;	/* touch_order: asked for */
	n = n < rs->pages ? n : rs->pages;
	/* Handed over, not copied: the result frees it. */
	res->touch_order = rs->order;
	rs->order = NULL;
	res->nr_touch_order = n;
	return 0;
}

/*
 * Resolver vCPU: the resolver is the vCPU thread itself, so the thread's
 * own counters (context switches, CPU time, CPUs, tid) are the vCPU
 * thread's, guest time included; it never waited, and its fault counts are
 * its own.
 */
static void collect_vcpu_resolver(struct ukvm_reader_result *x, const struct ukvm_vcpu *vcpu)
{
	x->tid = vcpu->tid;
	x->cpu_ns = vcpu->cpu_ns;
	x->context_switches = vcpu->context_switches;
	x->voluntary_context_switches = vcpu->voluntary_context_switches;
	memcpy(x->cpus, vcpu->affinity, sizeof(x->cpus));
}

/* The run's counters that are its readers' summed. */
static void collect_reader_sums(struct ukvm_result *res, const struct ukvm_reader_result *x)
{
	res->faults += x->faults;
	res->eexist += x->eexist;
	res->spurious_wakeups += x->spurious_wakeups;
	res->wakes += x->wakes;
	res->source_bytes += x->source_bytes;
	res->source_ns += x->source_ns;
}

/*
 * The result's arrays, and what the run, its readers and the pusher
 * counted: the result filled up to the fault log. 0, or -errno with err.
 */
static int collect_fill_run(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	const struct ukvm_config *cfg = &exp->cfg;
	struct ukvm_result *res = &exp->result;
	uint32_t i, u, r, n;
	int ret;

	res->nr_vcpus = cfg->vcpus;
	res->vcpus = calloc(cfg->vcpus, sizeof(*res->vcpus));
	res->uffds = exp->nr_pools;
	for (u = 0, res->nr_readers = 0; u < exp->nr_pools; u++)
		res->nr_readers += exp->pools[u].nr_readers;
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
	res->pages_per_vcpu = exp->slice_size / UKVM_PAGE_SIZE;
	res->threads_start_ns = exp->threads_start_ns;
	res->threads_joined_ns = exp->threads_joined_ns;
	res->region_gpa = exp->region_gpa;
	res->passes = (uint32_t)exp->passes;
	res->region_bytes = exp->region_size;
	res->page_size = exp->mem.page_size;
	res->source = exp->source.kind;
	res->source_cached_pages_at_start = exp->source.cached_pages_at_start;
	for (i = 0; i < cfg->vcpus; i++) {
		if (i == 0 || exp->vcpus[i].start_ns < res->start_ns)
			res->start_ns = exp->vcpus[i].start_ns;
		if (exp->vcpus[i].end_ns > res->end_ns)
			res->end_ns = exp->vcpus[i].end_ns;
	}

	for (u = 0, n = 0; u < exp->nr_pools; u++)
		for (r = 0; exp->pools[u].resolvers && r < exp->pools[u].nr_readers; r++) {
			const struct ukvm_fault_resolver *x = &exp->pools[u].resolvers[r];

			res->readers[n] = x->stats;
			res->readers[n].source_bytes = x->conn.bytes;
			res->readers[n].source_ns = x->conn.ns;
			if (x->vcpu >= 0)	/* resolver vCPU: the vCPU's own thread */
				collect_vcpu_resolver(&res->readers[n], &exp->vcpus[x->vcpu]);
			collect_reader_sums(res, &res->readers[n]);
			n++;
		}
	res->nr_readers = n;
	/* The pusher fetches over a connection of its own (pusher.h). */
	res->pusher_source_bytes = exp->pusher.conn.bytes;
	res->source_bytes += res->pusher_source_bytes;
	res->stats_full = cfg->stats == UKVM_STATS_FULL;
	return 0;
}

/* vCPU i's part of the result: its times, exits, CPUs, passes and KVM's statistics. */
static int collect_fill_vcpu(struct ukvm_experiment *exp, uint32_t i, struct ukvm_error *err)
{
	struct ukvm_result *res = &exp->result;
	struct ukvm_vcpu *vcpu = &exp->vcpus[i];
	struct ukvm_vcpu_result *vr = &res->vcpus[i];
	uint64_t *a = exp_guest_args(exp, vcpu);
	int ret;

	vr->index = i;
	vr->tid = vcpu->tid;
	vr->start_ns = vcpu->start_ns;
	vr->end_ns = vcpu->end_ns;
	vr->pages = guest_arg(a, GA_ACCESSES);
	vr->userspace_exits = vcpu->userspace_exits;
	vr->throttled_ns = vcpu->throttled_ns;
	vr->fault_exits = vcpu->fault_exits;
	vr->regs_fault_exits = vcpu->regs_fault_exits;
	vr->cpu_ns = vcpu->cpu_ns;
	memcpy(vr->cpus, vcpu->affinity, sizeof(vr->cpus));
	vr->pass_end_ns = calloc(exp->passes, sizeof(uint64_t));
	if (!vr->pass_end_ns) {
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating the result");
		return -ENOMEM;
	}
	memcpy(vr->pass_end_ns, vcpu->pass_end_ns, exp->passes * sizeof(uint64_t));
	if (exp->cfg.guest_timing) {
		vr->access_cycles = guest_arg(a, GA_TSC_SUM);
		memcpy(vr->access_hist, &guest_arg(a, GA_TSC_HIST), sizeof(vr->access_hist));
	}
	vr->exits = UKVM_RESULT_NONE;
	ret = collect_vcpu_stats(exp, i, vr);
	if (ret) {
		ukvm_err_set(err, UKVM_ERR_RUN, -ret, "collecting KVM statistics");
		return ret;
	}
	res->guest_accesses += vr->pages;
	return 0;
}

/* The result's parts that come after the vCPUs': dirty passes, migration, page visits. */
static int collect_fill_rest(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	struct ukvm_result *res = &exp->result;

	ukvm_dirty_collect(&exp->dirty, res);
	ukvm_migrate_collect(&exp->migrate, res);
	res->touched_pages = exp->visits ? exp->touched_pages : exp->region_size / UKVM_PAGE_SIZE;
	if (exp->cfg.trace_faults && exp->visits) {
		res->nr_page_visits = exp->region_size / UKVM_PAGE_SIZE;
		res->page_visits = malloc(res->nr_page_visits * sizeof(*res->page_visits));
		if (!res->page_visits) {
			ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating the page visit counts");
			return -ENOMEM;
		}
		memcpy(res->page_visits, exp->visits, res->nr_page_visits * sizeof(*exp->visits));
	}
	return 0;
}

/*
 * Fills the result and verifies memory and what each vCPU's guest
 * reported, in the order the checks need: the dirty map while the uffds
 * are open, then the uffds closed, then the pages.
 */
int ukvm_collect_result(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	const struct ukvm_config *cfg = &exp->cfg;
	struct ukvm_result *res = &exp->result;
	struct ukvm_faultlog log = { 0 };
	struct ukvm_check chk;
	uint32_t i;
	int ret;

	ukvm_check_init(&chk, exp);
	ret = collect_fill_run(exp, err);
	if (ret)
		return ret;
	if (res->stats_full) {
		ret = collect_faultlog(exp, &log, err);
		if (ret) {
			ukvm_err_set(err, UKVM_ERR_RUN, -ret, "building the fault log");	/* unless set already */
			return ret;
		}
	}
	if (cfg->wp_async) {
		ret = ukvm_check_dirty_map(exp, &chk, err);
		if (ret)
			return ret;
	}
	/* Closing the uffds first: a page verify reads must not fault into a uffd. */
	ukvm_stop_pools(exp, true);
	res->preinstalled_pages = exp->preinstalled_pages;
	res->preinstall_ns = exp->preinstall_ns;
	if (collect_resident(exp, &chk.vp, &chk.installed_touched)) {
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating the touch order");
		return -ENOMEM;
	}
#ifdef UKVM_TEST_HOOKS
	if (cfg->inject == UKVM_INJECT_CORRUPT_PAGE &&
	    cfg->inject_after < exp->region_size / UKVM_PAGE_SIZE)
		exp->mem.hva[cfg->inject_after * UKVM_PAGE_SIZE + 100] ^= 0x40;
#endif

	/* A file cut short or replaced under the run fails it, before verify reads it. */
	ret = ukvm_source_check(&exp->source, &chk.source_modified, err);
	if (ret)
		return ret;
	res->verified = true;
	/* A page server's bytes with no local copy to hold them against: counts only. */
	res->contents_verified = !(cfg->source == UKVM_SOURCE_REMOTE && !exp->source.map);
	for (i = 0; i < cfg->vcpus; i++) {
		ret = collect_fill_vcpu(exp, i, err);
		ret = ret ?: ukvm_check_vcpu(exp, i, &chk, err);
		if (ret)
			return ret;
	}
	ret = collect_fill_rest(exp, err);
	if (ret)
		return ret;
	ukvm_check_totals(exp, &chk);
	/* Or during verification, which then stopped at the first page gone. */
	ret = ukvm_source_check(&exp->source, &chk.source_modified, err);
	if (ret)
		return ret;
	if (!res->verified && chk.source_modified)
		ukvm_check_source_changed(res);
	if (res->verified)
		ukvm_check_faults(exp, &log, chk.wp_written, chk.installed_touched);
	return 0;
}
