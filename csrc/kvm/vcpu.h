/* SPDX-License-Identifier: MIT */
/*
 * vCPUs: creation in 64-bit long mode, and the thread that runs one until
 * its guest reports it is done.
 */
#ifndef UKVM_KVM_VCPU_H
#define UKVM_KVM_VCPU_H

#include <linux/kvm.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/ctl.h"
#include "base/thread.h"
#include "base/tsc.h"
#include "kvm/dirtylog.h"
#include "kvm/vm.h"
#include "ukvm.h"

/* A throttled vCPU's time slice (QEMU's CPU_THROTTLE_TIMESLICE_NS): its kicks' period. */
#define UKVM_THROTTLE_SLICE_NS	(10 * 1000 * 1000ULL)

struct ukvm_fault_resolver;

struct ukvm_vcpu {
	struct ukvm_vm *vm;
	struct ukvm_ctl *ctl;
	uint32_t index;
	int fd;
	struct kvm_run *run;
	uint64_t args_gpa;
	pthread_t thread;
	bool thread_started;
	atomic_bool exited;		/* the thread is past its last KVM_RUN */
	bool ready;			/* under ctl->lock: waiting for go */
	/* Written by the vCPU thread, read after it is joined. */
	int32_t tid;
	uint64_t start_ns;
	uint64_t end_ns;
	uint64_t userspace_exits;
	/*
	 * Resolver vCPU: resolve_fault(resolver, gpa, write, &hva) makes the
	 * page at gpa present and says where it is on the host: 0, -ENOENT if
	 * gpa is not a page it resolves, or -errno (recorded as the run's
	 * failure). NULL: a fault exit is an error, as it always was. The
	 * experiment's setup hands both in (uffd/resolve.h), so that this
	 * layer knows the resolver's type by name only.
	 */
	int (*resolve_fault)(struct ukvm_fault_resolver *resolver, uint64_t gpa, bool write,
			     uint8_t **hva);
	struct ukvm_fault_resolver *resolver;
	uint64_t fault_exits;		/* faults resolved through resolve_fault */
	/* of those, the bare EFAULTs whose page the guest's registers named (KVM_GET_REGS) */
	uint64_t regs_fault_exits;
	bool efault_pending;		/* the last KVM_RUN's EFAULT, resolved: at efault_gpa */
	uint64_t efault_gpa;		/* the last EFAULT's page, however it was named */
	uint64_t efault_rip;		/* the guest's %rip at the last bare EFAULT */
	enum ukvm_efault_named {
		UKVM_EFAULT_UNNAMED,	/* no page: not an access of the walk */
		UKVM_EFAULT_BY_KVM,	/* KVM_EXIT_MEMORY_FAULT's gpa */
		UKVM_EFAULT_BY_REGS,	/* the walk's access at %rip, its page in %rax */
	} efault_named;
	bool done;
	/*
	 * Dirty tracking: at the end of each pass the vCPU waits until
	 * ctl->passes_open lets it into the next (the controller harvests
	 * meanwhile); at_gate (under ctl->lock) is the pass it has ended.
	 */
	bool gated;
	uint64_t at_gate;
	/*
	 * dirty_tracking ring: the vCPU's dirty ring, mapped; a
	 * KVM_EXIT_DIRTY_RING_FULL is handled here, harvesting the ring into
	 * ring_found (ring_pages bits, for memslot ring_slot) and resetting.
	 */
	struct ukvm_dirty_ring ring;
	_Atomic uint64_t *ring_found;
	uint32_t ring_slot;
	uint64_t ring_pages;
	atomic_uint_fast64_t ring_full_exits;
	uint64_t ring_stray;		/* entries of no page ring_found covers */
	/* Held by whoever harvests the ring: the vCPU at a full exit, or the host
	 * while the vCPU runs (a migration's rounds) */
	atomic_flag ring_busy;
	/*
	 * auto_converge (experiment/migrate.c): the share of the vCPU's time
	 * the guest gives up, which its controller sets and kicks it for once a
	 * UKVM_THROTTLE_SLICE_NS;
	 * throttle_since_ns: when the guest last resumed from a throttle sleep
	 * (0: unthrottled); throttled_ns: the sleeps, summed.
	 */
	atomic_uint throttle_percent;
	uint64_t throttle_since_ns;
	uint64_t throttled_ns;
	uint64_t *pass_end_ns;		/* one per pass, freed by destroy */
	uint64_t passes;
	uint64_t passes_seen;
	int cpu;			/* pinned to, or -1 */
	uint64_t affinity[16];
	uint64_t cpu_ns;
	uint64_t context_switches;	/* getrusage(RUSAGE_THREAD), at the thread's end */
	uint64_t voluntary_context_switches;
	/* The thread around ukvm_vcpu_thread() (execute.c): its state, and stop waits on done. */
	struct ukvm_thread_state state;
#ifdef UKVM_TEST_HOOKS
	uint64_t stall_ms;		/* UKVM_INJECT_VCPU_STALL, for this vCPU */
	bool hang;			/* UKVM_INJECT_VCPU_HANG, for this vCPU */
	uint64_t tsc_bias;		/* UKVM_INJECT_TSC_OFFSET: added to every guest TSC read */
	uint64_t tsc_offset_reads;	/* UKVM_INJECT_TSC_OFFSET_MOVES: KVM's offset read so far */
#endif
	/* guest_timing: the guest's access log, and its TSC bracketed at sync exits */
	bool timing;
	uint64_t log_gpa;
	uint64_t log_entries;		/* first-pass pages, plus the spare slot */
	struct ukvm_tsc_bracket tsc_bracket;		/* before the walk */
	struct ukvm_tsc_bracket tsc_bracket_after;	/* after it */
	struct ukvm_tsc_offsets kvm_tsc_offsets;	/* KVM's offset, read at each sync exit */
};

void ukvm_vcpu_init(struct ukvm_vcpu *vcpu);
int ukvm_vcpu_create(struct ukvm_vm *vm, struct ukvm_vcpu *vcpu, uint32_t index,
		     uint64_t args_gpa, uint64_t stack_top_gpa, struct ukvm_error *err);
void ukvm_vcpu_destroy(struct ukvm_vcpu *vcpu);
/*
 * The vCPU's dirty ring harvested into ring_found, with ring_busy held: the
 * vCPU's full exit and a host thread may both harvest it. The entries
 * harvested; stray (if not NULL) gets the entries of no page ring_found
 * covers, which are then forgotten.
 */
uint64_t ukvm_vcpu_ring_harvest(struct ukvm_vcpu *vcpu, uint64_t *stray);
/* The thread's body: runs the guest until it is done, fails or must stop. */
void *ukvm_vcpu_thread(void *arg);
/* KVM's TSC offset of the vCPU (guest TSC - host TSC): 0, or -errno where KVM does not say. */
int ukvm_vcpu_tsc_offset(struct ukvm_vcpu *vcpu, int64_t *offset);
/* Makes a running vCPU leave KVM_RUN soon; call repeatedly until it exits. */
void ukvm_vcpu_kick(struct ukvm_vcpu *vcpu);

#endif
