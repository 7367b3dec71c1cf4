/* SPDX-License-Identifier: MIT */
/*
 * One experiment's state, shared by the phases that run it:
 *
 *   setup.c       VM, backing memory, memslot, guest page tables, vCPUs, the
 *                 prefill; and the teardown
 *   paging.c      (for setup) uffds and their reader pools, preinstall, the
 *                 pusher
 *   execute.c     vCPU threads start together; the controller waits for all
 *                 of them, a failure, a cancel or the deadline
 *   stop.c        stopping vCPUs and readers, bounded, naming any that
 *                 would not stop
 *   collect.c     KVM stats, reader stats and fault log, uffds closed, every
 *                 page verified (through check.c), the result filled
 *   experiment.c  the controller thread and the public lifecycle (ukvm.h)
 *
 * The phases take everything they share from here and never call up:
 * experiment.c calls setup, execute, stop and collect; setup and collect
 * call stop; stop calls only the objects (vcpu.h, pool.h).
 */
#ifndef UKVM_EXPERIMENT_STATE_H
#define UKVM_EXPERIMENT_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/ctl.h"
#include "base/tsc.h"
#include "base/util.h"
#include "kvm/dirtylog.h"
#include "kvm/kvmstats.h"
#include "kvm/vcpu.h"
#include "kvm/vm.h"
#include "uffd/backing.h"
#include "uffd/online.h"
#include "uffd/pool.h"
#include "uffd/pusher.h"
#include "uffd/resident.h"
#include "uffd/source.h"
#include "ukvm.h"

/* dirty_tracking: the tracker (experiment/dirty.c), its page maps and its records. */
struct ukvm_dirty {
	enum ukvm_dirty_tracking kind;	/* UKVM_DIRTY_NONE: nothing here is used */
	struct ukvm_dirty_slot slot;	/* the test region's memslot */
	uint64_t pages;			/* the region's 4 KiB pages */
	uint64_t *found;		/* this pass: the tracker's pages (a bit each) */
	uint64_t *written;		/* this pass: the guest's pages, by its counts */
	uint32_t *counts;		/* each page's write count (word 2) at the last pass end */
	int uffd;			/* wp_async: the WP_ASYNC uffd, or -1 */
	int pagemap_fd;			/* wp_async: /proc/self/pagemap, or -1 */
	bool acq_rel;			/* ring: KVM_CAP_DIRTY_LOG_RING_ACQ_REL */
	bool logging;			/* tracking is on */
	struct ukvm_dirty_pass *passes;	/* one per tracked pass (the result's) */
	uint32_t nr_passes;
	uint64_t enable_ns;
	uint64_t disable_ns;
	uint64_t pass_start_ns;		/* the gate into the current pass opened */
};

/* migration: the source's sender (experiment/migrate.c) and what it leaves. */
struct ukvm_migrate {
	enum ukvm_migration mode;	/* UKVM_MIGRATION_NONE: nothing here is used */
	uint64_t pages;			/* the region's 4 KiB pages */
	uint8_t *image;			/* the destination's copy: each page as last sent */
	uint64_t *held;			/* pages the destination holds, unwritten since sent */
	uint64_t *todo;			/* pages found dirty and not yet sent again */
	uint64_t link_free_ns;		/* the link is busy until then */
	/* Pages put on the link so far: progress, while the vCPUs are parked (watch.c) */
	atomic_uint_fast64_t pages_sent;
	uint64_t ns_per_page;		/* on the link (0: unlimited) */
	uint32_t throttle_percent;	/* auto_converge: the vCPUs' throttle now */
	uint64_t next_kick_ns;		/* the throttled vCPUs' next time slice */
	struct ukvm_migration_round *rounds;
	uint32_t nr_rounds;
	uint32_t cap_rounds;
	bool converged;
	uint64_t start_ns;
	uint64_t stop_ns;
	uint64_t stopcopy_pages;
	uint64_t stopcopy_ns;
	uint64_t precopy_pages;
	uint32_t *migrated;		/* the held pages at the end, ascending */
	uint64_t nr_migrated;
};

struct ukvm_experiment {
	struct ukvm_config cfg;
	struct ukvm_ctl ctl;
	pthread_t controller;
	bool finished;			/* under ctl.lock */
	struct ukvm_result result;

	struct ukvm_vm vm;
	struct ukvm_backing_mem mem;
	struct ukvm_source source;	/* where resolved pages' bytes come from */
	uint64_t region_gpa;
	uint64_t region_size;
	uint32_t region_slot;		/* its memslot */
	uint64_t slice_size;		/* what one vCPU walks */
	uint64_t passes;
	uint64_t write_key;		/* the guest's write-or-read choice, seeded */
	bool filled;			/* pages arrive with data (else zero-filled) */
	/*
	 * touch_percent, access zipf (access.h): the vCPUs walk host-made
	 * lists, and visits[k] counts the accesses to 4 KiB page k of the
	 * region in one pass, all vCPUs together. NULL: every page, once per
	 * walking vCPU (the default walk).
	 */
	uint32_t *visits;
	uint64_t touch_key;		/* the working set's hash, seeded */
	uint64_t touched_pages;		/* 4 KiB pages with visits */
	uint64_t touched_units;		/* backing pages (mem.page_size) with visits */
	/*
	 * uffd_mode wp: the snapshot, a slot per 4 KiB page of the region at
	 * the page's offset (anonymous memory, populated as pages are saved),
	 * and each page's save state (resolve.h).
	 */
	uint8_t *snapshot;
	_Atomic uint8_t *wp_state;
	int32_t *pin_vcpus;		/* copies of the config's lists */
	int32_t *pin_readers;
	uint64_t *replay;
	uint64_t *preinstall;		/* a copy of the config's list */
	uint64_t preinstall_ns;		/* installing it, before the vCPUs */
	uint64_t preinstalled_pages;
	/* uffd_mode missing, resolve copy: how each page went in (resident.h) */
	struct ukvm_resident resident;
	/* prefetch background or replay: the pusher thread (pusher.h) */
	struct ukvm_pusher pusher;
	struct ukvm_dirty dirty;	/* dirty_tracking (dirty.c) */
	struct ukvm_migrate migrate;	/* migration (migrate.c) */
	struct ukvm_vcpu *vcpus;
	struct ukvm_kvmstats *vcpu_stats;
	struct ukvm_kvmstats vm_stats;
	struct ukvm_pool *pools;
	uint32_t nr_pools;
	uint64_t deadline_ns;
	/* demand_paging_test's window: before the first vCPU thread is created... */
	uint64_t threads_start_ns;
	uint64_t threads_joined_ns;	/* ...after the last one is joined */
	struct ukvm_tsc_clock tsc_clock;	/* guest_timing: sampled while the vCPUs run */
	/* stats full without guest_timing: the statistics, computed during the run */
	struct ukvm_online online;
	bool exact_address;		/* fault messages name the 4 KiB page, hugetlb too */
	bool probe;			/* ukvm_probe(): build, register, stop there */
	bool releasing_memory;		/* under ctl.lock: a failed run's memory, still going */
	/* Under ctl.lock: what the controller is doing, for errors that name it. */
	const char *phase;
	/* Under ctl.lock: the vCPUs' args pages may be read (progress). */
	bool walkable;
	/* Under ctl.lock: a thread would not stop; the controller waits for it. */
	bool lingering;
	uint64_t lingering_since_ns;
	char holdout[640];		/* under ctl.lock: that thread, named */
	atomic_bool controller_done;	/* the controller is returning: join, then free */
	/* Under pending_lock (experiment.c): the caller left it to the background. */
	uint64_t handoff_ns;
	struct ukvm_experiment *next_pending;
};

/* Records err as the experiment's failure unless something failed first. */
static inline void exp_fail(struct ukvm_experiment *exp, const struct ukvm_error *err)
{
	pthread_mutex_lock(&exp->ctl.lock);
	ukvm_ctl_fail_locked(&exp->ctl, err);
	pthread_mutex_unlock(&exp->ctl.lock);
}

static inline bool exp_aborted(struct ukvm_experiment *exp)
{
	return ukvm_ctl_aborted(&exp->ctl);
}

static inline bool exp_past_deadline(struct ukvm_experiment *exp)
{
	return exp->deadline_ns && ukvm_now_ns() >= exp->deadline_ns;
}

/* The vCPU's args page (guest_abi.h, guest_arg()), as the host sees it. */
static inline uint64_t *exp_guest_args(struct ukvm_experiment *exp, struct ukvm_vcpu *vcpu)
{
	return ukvm_vm_sys_hva(&exp->vm, vcpu->args_gpa);
}

#endif
