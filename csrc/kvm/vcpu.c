/* SPDX-License-Identifier: MIT */
/*
 * vCPUs: creation in 64-bit long mode, and the thread that runs each one.
 *
 * The thread runs KVM_RUN until the guest reports it is done through an I/O
 * port write (guest_abi.h). Any other exit ends the experiment with an error
 * that names the vCPU, the exit and the guest's registers.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/ctl.h"
#include "base/errors.h"
#include "base/kick.h"
#include "base/thread.h"
#include "base/tsc.h"
#include "base/util.h"
#include "kvm/dirtylog.h"
#include "kvm/guest.h"
#include "kvm/guest_abi.h"
#include "kvm/vcpu.h"
#include "kvm/vm.h"
#include "uapi_compat.h"

#define CR0_PE	(1ULL << 0)
#define CR0_MP	(1ULL << 1)
#define CR0_ET	(1ULL << 4)
#define CR0_NE	(1ULL << 5)
#define CR0_WP	(1ULL << 16)
#define CR0_PG	(1ULL << 31)
#define CR4_PAE	(1ULL << 5)
#define CR4_OSFXSR (1ULL << 9)
#define CR4_OSXMMEXCPT (1ULL << 10)
#define EFER_LME (1ULL << 8)
#define EFER_LMA (1ULL << 10)
/* How long KVM_RUN may keep failing with EAGAIN before the run fails (vcpu_eagain_retry). */
#define VCPU_EAGAIN_NS	NSEC_PER_SEC
/* The longest a throttle sleep goes before it looks at stop and the throttle. */
#define VCPU_THROTTLE_CHECK_NS	(10 * NSEC_PER_MSEC)

void ukvm_vcpu_init(struct ukvm_vcpu *vcpu)
{
	memset(vcpu, 0, sizeof(*vcpu));
	vcpu->fd = -1;
	vcpu->cpu = -1;
	atomic_init(&vcpu->exited, false);
	atomic_init(&vcpu->ring_full_exits, 0);
	atomic_init(&vcpu->throttle_percent, 0);
	atomic_flag_clear(&vcpu->ring_busy);
	ukvm_dirty_ring_init(&vcpu->ring);
	ukvm_tsc_bracket_init(&vcpu->tsc_bracket);
	ukvm_tsc_bracket_init(&vcpu->tsc_bracket_after);
	ukvm_tsc_offsets_init(&vcpu->kvm_tsc_offsets);
}

static void vcpu_set_segment(struct kvm_segment *seg, uint16_t selector, uint8_t type,
			     bool code)
{
	memset(seg, 0, sizeof(*seg));
	seg->base = 0;
	seg->limit = 0xffffffff;
	seg->selector = selector;
	seg->type = type;
	seg->present = 1;
	seg->s = 1;
	seg->g = 1;
	seg->l = code;		/* 64-bit code segment */
	seg->db = !code;
}

static int vcpu_setup_long_mode(struct ukvm_vcpu *vcpu, uint64_t stack_top_gpa,
				struct ukvm_error *err)
{
	struct ukvm_vm *vm = vcpu->vm;
	struct kvm_sregs sregs;
	struct kvm_regs regs;
	int ret;

	ret = ukvm_ioctl(vcpu->fd, KVM_SET_CPUID2, vm->cpuid);
	if (ret) {
		ukvm_err_set(err, UKVM_ERR_HOST, -ret, "vCPU %u: KVM_SET_CPUID2", vcpu->index);
		return ret;
	}
	ret = ukvm_ioctl(vcpu->fd, KVM_GET_SREGS, &sregs);
	if (ret) {
		ukvm_err_set(err, UKVM_ERR_RUN, -ret, "vCPU %u: KVM_GET_SREGS", vcpu->index);
		return ret;
	}
	vcpu_set_segment(&sregs.cs, UKVM_GDT_CODE, 0xb, true);
	vcpu_set_segment(&sregs.ds, UKVM_GDT_DATA, 0x3, false);
	sregs.es = sregs.fs = sregs.gs = sregs.ss = sregs.ds;

	memset(&sregs.tr, 0, sizeof(sregs.tr));
	sregs.tr.base = vm->tss_gpa;
	sregs.tr.limit = 0x67;
	sregs.tr.selector = UKVM_GDT_TSS;
	sregs.tr.type = 0xb;	/* busy 64-bit TSS */
	sregs.tr.present = 1;
	memset(&sregs.ldt, 0, sizeof(sregs.ldt));
	sregs.ldt.unusable = 1;

	sregs.gdt.base = vm->gdt_gpa;
	sregs.gdt.limit = 5 * 8 - 1;
	sregs.idt.base = vm->idt_gpa;
	sregs.idt.limit = 32 * 16 - 1;
	sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG;
	sregs.cr3 = vm->pml4_gpa;
	sregs.cr4 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT;
	sregs.efer = EFER_LME | EFER_LMA;
	ret = ukvm_ioctl(vcpu->fd, KVM_SET_SREGS, &sregs);
	if (ret) {
		ukvm_err_set(err, UKVM_ERR_HOST, -ret,
			     "vCPU %u: KVM_SET_SREGS (entering long mode)", vcpu->index);
		return ret;
	}

	memset(&regs, 0, sizeof(regs));
	regs.rip = vm->code_gpa;
	regs.rsp = stack_top_gpa;
	regs.rdi = vcpu->args_gpa;
	regs.rflags = 0x2;	/* the reserved bit; interrupts stay off */
	ret = ukvm_ioctl(vcpu->fd, KVM_SET_REGS, &regs);
	if (ret) {
		ukvm_err_set(err, UKVM_ERR_RUN, -ret, "vCPU %u: KVM_SET_REGS", vcpu->index);
		return ret;
	}
	return 0;
}

int ukvm_vcpu_create(struct ukvm_vm *vm, struct ukvm_vcpu *vcpu, uint32_t index,
		     uint64_t args_gpa, uint64_t stack_top_gpa, struct ukvm_error *err)
{
	void *run;
	int ret;

	vcpu->vm = vm;
	vcpu->index = index;
	vcpu->args_gpa = args_gpa;
	vcpu->fd = ioctl(vm->vm_fd, KVM_CREATE_VCPU, (unsigned long)index);
	if (vcpu->fd < 0) {
		ret = -errno;
		ukvm_err_set(err, UKVM_ERR_HOST, -ret, "KVM_CREATE_VCPU(%u)", index);
		return ret;
	}
	run = mmap(NULL, (size_t)vm->run_mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED,
		   vcpu->fd, 0);
	if (run == MAP_FAILED) {
		ret = -errno;
		ukvm_err_set(err, UKVM_ERR_RUN, -ret, "vCPU %u: mmap(kvm_run)", index);
		return ret;
	}
	vcpu->run = run;
	return vcpu_setup_long_mode(vcpu, stack_top_gpa, err);
}

void ukvm_vcpu_destroy(struct ukvm_vcpu *vcpu)
{
	ukvm_dirty_ring_unmap(&vcpu->ring);
	if (vcpu->run)
		munmap(vcpu->run, (size_t)vcpu->vm->run_mmap_size);
	if (vcpu->fd >= 0)
		close(vcpu->fd);
	free(vcpu->pass_end_ns);
	ukvm_vcpu_init(vcpu);
}

int ukvm_vcpu_tsc_offset(struct ukvm_vcpu *vcpu, int64_t *offset)
{
	uint64_t value;
	struct kvm_device_attr attr = {
		.group = KVM_VCPU_TSC_CTRL,
		.attr = KVM_VCPU_TSC_OFFSET,
		.addr = (uint64_t)(uintptr_t)&value,
	};
	int ret;

#ifdef UKVM_TEST_HOOKS
	if (vcpu->ctl->inject == UKVM_INJECT_NO_KVM_TSC_OFFSET)
		return -ENXIO;	/* what a KVM without the attribute answers */
#endif
	ret = ukvm_ioctl(vcpu->fd, KVM_GET_DEVICE_ATTR, &attr);
	if (ret)
		return ret;
#ifdef UKVM_TEST_HOOKS
	value += vcpu->tsc_bias;	/* UKVM_INJECT_TSC_OFFSET: as if KVM had applied it */
	/* As KVM's moves where the host's TSC is unstable: on at every reading. */
	if (vcpu->ctl->inject == UKVM_INJECT_TSC_OFFSET_MOVES)
		value += vcpu->tsc_offset_reads++ * vcpu->ctl->inject_after;
#endif
	*offset = (int64_t)value;
	return 0;
}

void ukvm_vcpu_kick(struct ukvm_vcpu *vcpu)
{
	/* immediate_exit covers the window before the thread enters KVM_RUN. */
	if (vcpu->run)
		__atomic_store_n(&vcpu->run->immediate_exit, 1, __ATOMIC_RELEASE);
	if (vcpu->thread_started && !atomic_load(&vcpu->exited))
		pthread_kill(vcpu->thread, ukvm_kick_signal());
}

/*
 * Out of KVM_RUN by a kick: a stop (seen at the loop's top), or a throttled
 * vCPU's time slice. Throttled at p%, the vCPU sleeps p/(100 - p) of the
 * time the guest ran since its last sleep, a slice at most (a late kick, or
 * a thread the host descheduled, must not turn into one long sleep), so
 * the guest keeps (100 - p)% of the vCPU's time, as QEMU's cpu-throttle
 * does. The sleep ends early at a stop or when the throttle is lifted, and
 * a kick during it is absorbed.
 */
static void vcpu_kicked(struct ukvm_vcpu *vcpu)
{
	uint32_t p = atomic_load_explicit(&vcpu->throttle_percent, memory_order_relaxed);
	uint64_t now = ukvm_now_ns(), start = now, until, ran;

	if (p && p < 100 && vcpu->throttle_since_ns) {
		ran = now - vcpu->throttle_since_ns;
		if (ran > UKVM_THROTTLE_SLICE_NS)
			ran = UKVM_THROTTLE_SLICE_NS;
		until = now + ran * p / (100 - p);
		/* Lifted (the rounds are over) or stopped: the guest goes on at once. */
		while (now < until && !ukvm_ctl_stopping(vcpu->ctl) &&
		       atomic_load_explicit(&vcpu->throttle_percent, memory_order_relaxed)) {
			ukvm_sleep_ns(until - now < VCPU_THROTTLE_CHECK_NS ? until - now
									   : VCPU_THROTTLE_CHECK_NS);
			now = ukvm_now_ns();
		}
		vcpu->throttled_ns += now - start;
	}
	vcpu->throttle_since_ns = p ? now : 0;
	if (!vcpu->run)
		return;
	/*
	 * The kick's immediate_exit, cleared so that the next KVM_RUN enters the
	 * guest. A stop raises ctl->stop before it kicks: with the fence, either
	 * the loop's check sees the stop, or the stop's kick sets immediate_exit
	 * again after this store, and KVM_RUN returns at once.
	 */
	__atomic_store_n(&vcpu->run->immediate_exit, 0, __ATOMIC_RELAXED);
	atomic_thread_fence(memory_order_seq_cst);
}

static const char *exit_reason_name(uint32_t reason)
{
	static const char *const names[] = {
		[KVM_EXIT_UNKNOWN] = "UNKNOWN",
		[KVM_EXIT_EXCEPTION] = "EXCEPTION",
		[KVM_EXIT_IO] = "IO",
		[KVM_EXIT_HYPERCALL] = "HYPERCALL",
		[KVM_EXIT_DEBUG] = "DEBUG",
		[KVM_EXIT_HLT] = "HLT",
		[KVM_EXIT_MMIO] = "MMIO",
		[KVM_EXIT_IRQ_WINDOW_OPEN] = "IRQ_WINDOW_OPEN",
		[KVM_EXIT_SHUTDOWN] = "SHUTDOWN (triple fault)",
		[KVM_EXIT_FAIL_ENTRY] = "FAIL_ENTRY",
		[KVM_EXIT_INTR] = "INTR",
		[KVM_EXIT_SET_TPR] = "SET_TPR",
		[KVM_EXIT_TPR_ACCESS] = "TPR_ACCESS",
		[KVM_EXIT_NMI] = "NMI",
		[KVM_EXIT_INTERNAL_ERROR] = "INTERNAL_ERROR",
		[KVM_EXIT_SYSTEM_EVENT] = "SYSTEM_EVENT",
	};

	if (reason < ARRAY_SIZE(names) && names[reason])
		return names[reason];
	return "?";
}

/* "rip=... rsp=... ..." for an error message. */
static void vcpu_format_regs(struct ukvm_vcpu *vcpu, char *buf, size_t len)
{
	struct kvm_regs r;

	if (ioctl(vcpu->fd, KVM_GET_REGS, &r)) {
		int e = errno;

		snprintf(buf, len, "(KVM_GET_REGS failed: %s)", strerror(e));
		return;
	}
	snprintf(buf, len,
		 "rip=0x%llx rsp=0x%llx rax=0x%llx rbx=0x%llx rcx=0x%llx rdx=0x%llx "
		 "rsi=0x%llx rdi=0x%llx r8=0x%llx r13=0x%llx rflags=0x%llx",
		 r.rip, r.rsp, r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.r8, r.r13,
		 r.rflags);
}

static void vcpu_fail_guest_exception(struct ukvm_vcpu *vcpu)
{
	static const char *const vectors[32] = {
		"#DE divide error", "#DB debug", "NMI", "#BP breakpoint", "#OF overflow",
		"#BR bound range", "#UD invalid opcode", "#NM no FPU", "#DF double fault",
		NULL, "#TS invalid TSS", "#NP segment not present", "#SS stack fault",
		"#GP general protection", "#PF page fault", NULL, "#MF x87 error",
		"#AC alignment check", "#MC machine check", "#XM SIMD error",
		"#VE virtualization exception", "#CP control protection",
	};
	struct kvm_regs r;
	char regs[512];

	if (ioctl(vcpu->fd, KVM_GET_REGS, &r)) {
		ukvm_ctl_fail(vcpu->ctl, UKVM_ERR_RUN, errno,
			      "vCPU %u: the guest took an exception; KVM_GET_REGS", vcpu->index);
		return;
	}
	vcpu_format_regs(vcpu, regs, sizeof(regs));
	ukvm_ctl_fail(vcpu->ctl, UKVM_ERR_RUN, 0,
		      "vCPU %u: guest exception %s (vector %llu, error code 0x%llx) at "
		      "rip=0x%llx, cr2=0x%llx; registers in the handler: %s",
		      vcpu->index, r.rax < 32 && vectors[r.rax] ? vectors[r.rax] : "reserved",
		      r.rax, r.rbx, r.rcx, r.rsi, regs);
}

static void vcpu_fail_exit(struct ukvm_vcpu *vcpu, const char *what)
{
	struct kvm_run *run = vcpu->run;
	char regs[512], detail[160] = "";

	vcpu_format_regs(vcpu, regs, sizeof(regs));
	if (run->exit_reason == KVM_EXIT_FAIL_ENTRY)
		snprintf(detail, sizeof(detail), " (hardware entry failure reason 0x%llx)",
			 run->fail_entry.hardware_entry_failure_reason);
	else if (run->exit_reason == KVM_EXIT_INTERNAL_ERROR)
		snprintf(detail, sizeof(detail), " (suberror %u)", run->internal.suberror);
	else if (run->exit_reason == KVM_EXIT_IO)
		snprintf(detail, sizeof(detail), " (port 0x%x, %s)", run->io.port,
			 run->io.direction == KVM_EXIT_IO_OUT ? "out" : "in");
	else if (run->exit_reason == KVM_EXIT_MMIO)
		snprintf(detail, sizeof(detail), " (address 0x%llx)", run->mmio.phys_addr);
	ukvm_ctl_fail(vcpu->ctl, UKVM_ERR_RUN, 0, "vCPU %u: %s: exit reason %u %s%s; %s",
		      vcpu->index, what, run->exit_reason, exit_reason_name(run->exit_reason),
		      detail, regs);
}

/*
 * Resolver vCPU, where KVM emulated the access (a host that emulates guest
 * instructions, such as PVM, does so for every kernel-mode one): the
 * emulator could not reach the missing page through the host mapping
 * (the uffd answers SIGBUS) and handed the access to user space as MMIO at
 * the page's address. Resolve the page, then complete the access from it
 * as the emulator would have: a write lands in the page, a read takes its
 * bytes. 0, or -errno (recorded as the run's failure).
 */
static int vcpu_complete_fault_mmio(struct ukvm_vcpu *vcpu)
{
	struct kvm_run *run = vcpu->run;
	uint64_t gpa = run->mmio.phys_addr, offset = gpa & (UKVM_PAGE_SIZE - 1);
	uint8_t *page;
	int ret;

	ret = vcpu->resolve_fault(vcpu->resolver, gpa, run->mmio.is_write, &page);
	if (ret == -ENOENT) {
		vcpu_fail_exit(vcpu, "unexpected exit from the guest");	/* real MMIO: none here */
		return -EPROTO;
	}
	if (ret)
		return ret;
	if (run->mmio.len > sizeof(run->mmio.data) || offset + run->mmio.len > UKVM_PAGE_SIZE) {
		vcpu_fail_exit(vcpu, "an emulated access across pages, which resolver vcpu "
			       "cannot complete");
		return -EPROTO;
	}
	page = (uint8_t *)((uintptr_t)page & ~(uintptr_t)(UKVM_PAGE_SIZE - 1));
	if (run->mmio.is_write)
		memcpy(page + offset, run->mmio.data, run->mmio.len);
	else
		memcpy(run->mmio.data, page + offset, run->mmio.len);
	vcpu->fault_exits++;
	return 0;
}

/*
 * Resolver vCPU, a bare EFAULT (no KVM_EXIT_MEMORY_FAULT: x86 KVM annotates
 * only faults on private memory, up to 6.12 at least): KVM has not moved the
 * guest past the access, so %rip is the instruction that faulted. The guest
 * is ours: if %rip is one of the walk's accesses (guest.S's access sites),
 * the page is in %rax (guest virtual = guest physical) and the site says
 * whether it writes. 0 with *gpa and *write, -ENOENT (not an access of the
 * walk: the caller reports the EFAULT), or -errno from KVM_GET_REGS.
 */
static int vcpu_efault_site(struct ukvm_vcpu *vcpu, uint64_t *gpa, bool *write)
{
	struct kvm_regs regs;
	uint64_t offset;
	int ret, i;

	ret = ukvm_ioctl(vcpu->fd, KVM_GET_REGS, &regs);
	if (ret)
		return ret;
	vcpu->efault_rip = regs.rip;
	offset = regs.rip - vcpu->vm->code_gpa;
	for (i = 0; i < UKVM_GUEST_ACCESS_SITES; i++) {
		if (ukvm_guest_access_sites[i].offset == offset) {
			*gpa = regs.rax;
			*write = ukvm_guest_access_sites[i].write != 0;
			return 0;
		}
	}
	return -ENOENT;
}

/*
 * Resolver vCPU, where KVM_RUN failed with EFAULT: KVM could not fault the
 * page in (the uffd answered SIGBUS). KVM says which page with
 * KVM_EXIT_MEMORY_FAULT where it annotates the exit; otherwise the guest's
 * registers do (vcpu_efault_site). Resolve it; KVM_RUN then retries the
 * access. 0 (resolved), -ENOENT (not such a fault: the caller reports the
 * EFAULT), or -errno.
 */
static int vcpu_resolve_efault(struct ukvm_vcpu *vcpu)
{
	const struct ukvm_memory_fault_exit *fault =
		(const struct ukvm_memory_fault_exit *)(const void *)&vcpu->run->mmio;
	uint64_t gpa;
	uint8_t *page;
	bool write;
	int ret;

	vcpu->efault_named = UKVM_EFAULT_UNNAMED;
	if (!vcpu->resolve_fault)
		return -ENOENT;
	if (vcpu->run->exit_reason == KVM_EXIT_MEMORY_FAULT) {
		gpa = fault->gpa;
		write = true;	/* KVM does not say whether it was a write: recorded as one */
		vcpu->efault_named = UKVM_EFAULT_BY_KVM;
		/*
		 * Consumed: KVM leaves exit_reason as it was on an error it does
		 * not annotate, and a stale annotation must not name a page.
		 */
		vcpu->run->exit_reason = KVM_EXIT_UNKNOWN;
	} else {
		ret = vcpu_efault_site(vcpu, &gpa, &write);
		if (ret == -ENOENT)
			return ret;
		if (ret) {
			ukvm_ctl_fail(vcpu->ctl, UKVM_ERR_RUN, -ret,
				      "vCPU %u: KVM_GET_REGS (after KVM_RUN's EFAULT)", vcpu->index);
			return ret;
		}
		vcpu->efault_named = UKVM_EFAULT_BY_REGS;
	}
	/*
	 * The same page again, right after it was resolved: KVM cannot use
	 * what was installed, and another round would only repeat this.
	 */
	if (vcpu->efault_pending && vcpu->efault_gpa == gpa) {
		ukvm_ctl_fail(vcpu->ctl, UKVM_ERR_RUN, EFAULT,
			      "vCPU %u: KVM_RUN reported gpa 0x%llx missing again after the "
			      "vCPU resolved it", vcpu->index, (unsigned long long)gpa);
		return -EFAULT;
	}
	vcpu->efault_gpa = gpa;
	ret = vcpu->resolve_fault(vcpu->resolver, gpa, write, &page);
	if (!ret) {
		vcpu->fault_exits++;
		if (vcpu->efault_named == UKVM_EFAULT_BY_REGS)
			vcpu->regs_fault_exits++;
		vcpu->efault_pending = true;
	}
	return ret;
}

/*
 * How often a vCPU at a pass gate looks at stop, besides being woken. The
 * poll is what releases it when a stop (stop.c) broadcasts before it sets
 * ctl->stop: keep it.
 */
#define GATE_POLL_NS	(10 * NSEC_PER_MSEC)

/*
 * Dirty tracking: the vCPU has ended pass vcpu->passes_seen; it says so and
 * waits until the controller lets it into the next pass (ctl->passes_open),
 * or the run stops. 0 either way: the run loop looks at stop next.
 */
static int vcpu_wait_at_gate(struct ukvm_vcpu *vcpu)
{
	struct ukvm_ctl *ctl = vcpu->ctl;
	struct timespec ts;

	pthread_mutex_lock(&ctl->lock);
	vcpu->at_gate = vcpu->passes_seen;
	pthread_cond_broadcast(&ctl->cond);
	while (ctl->passes_open <= vcpu->passes_seen && vcpu->passes_seen < ctl->passes_end &&
	       !ukvm_ctl_stopping(ctl)) {
		ukvm_timespec(&ts, ukvm_deadline_after(GATE_POLL_NS));
		pthread_cond_timedwait(&ctl->cond, &ctl->lock, &ts);
	}
	/* migration: the source stopped here; its guest is not entered again. */
	if (vcpu->passes_seen >= ctl->passes_end && !ukvm_ctl_stopping(ctl)) {
		vcpu->end_ns = vcpu->pass_end_ns[(vcpu->passes_seen < vcpu->passes ?
						  vcpu->passes_seen : vcpu->passes) - 1];
		vcpu->done = true;
	}
	pthread_mutex_unlock(&ctl->lock);
	return 0;
}

uint64_t ukvm_vcpu_ring_harvest(struct ukvm_vcpu *vcpu, uint64_t *stray)
{
	uint64_t n;

	while (atomic_flag_test_and_set_explicit(&vcpu->ring_busy, memory_order_acquire))
		sched_yield();
	n = ukvm_dirty_ring_harvest(&vcpu->ring, vcpu->ring_slot, vcpu->ring_pages,
				    vcpu->ring_found, &vcpu->ring_stray);
	if (stray) {
		*stray += vcpu->ring_stray;
		vcpu->ring_stray = 0;
	}
	atomic_flag_clear_explicit(&vcpu->ring_busy, memory_order_release);
	return n;
}

/*
 * KVM_EXIT_DIRTY_RING_FULL: the ring's entries into ring_found, handed back,
 * and KVM_RESET_DIRTY_RINGS, which re-protects their pages; then the vCPU
 * can go on. 0, or -errno failed (recorded).
 */
static int vcpu_dirty_ring_full(struct ukvm_vcpu *vcpu)
{
	struct ukvm_error err = { 0 };
	uint64_t harvested;
	int ret;

	if (!vcpu->ring.gfns) {
		vcpu_fail_exit(vcpu, "a dirty ring full exit, with no dirty ring");
		return -EPROTO;
	}
	atomic_fetch_add(&vcpu->ring_full_exits, 1);
	harvested = ukvm_vcpu_ring_harvest(vcpu, NULL);
	ret = ukvm_dirtylog_ring_reset(vcpu->vm->vm_fd, &err);
	if (ret < 0) {
		ukvm_ctl_fail(vcpu->ctl, err.kind, err.errnum, "vCPU %u, its dirty ring full: %s",
			      vcpu->index, err.message);
		return ret;
	}
	/*
	 * Full, and nothing to hand back: KVM filled the ring past its reserve
	 * (it warns "kvm_dirty_ring_push" in the kernel log) and overwrote
	 * entries, so the protocol's order is lost and every KVM_RUN would
	 * exit full again. kvm_pvm was seen to do this with a small ring.
	 */
	if (!harvested && !ret) {
		ukvm_ctl_fail(vcpu->ctl, UKVM_ERR_RUN, EOVERFLOW,
			      "vCPU %u: its dirty ring is full and holds no entry to harvest: KVM "
			      "overran the ring's reserve (see the kernel log) and entries are "
			      "lost; use a larger dirty_ring_entries (%u now)", vcpu->index,
			      vcpu->ring.entries);
		return -EOVERFLOW;
	}
	return 0;
}

/*
 * Handles one return from KVM_RUN: 0 (vcpu->done set once the guest has
 * finished its walk), or -errno failed (recorded as the run's failure).
 * tsc_before/tsc_after: the host's TSC around that KVM_RUN (guest_timing).
 */
static int vcpu_handle_exit(struct ukvm_vcpu *vcpu, uint64_t tsc_before, uint64_t tsc_after)
{
	struct kvm_run *run = vcpu->run;

	switch (run->exit_reason) {
	case KVM_EXIT_IO:
		if (run->io.direction != KVM_EXIT_IO_OUT)
			break;
		if (run->io.port == UKVM_PORT_SYNC && vcpu->timing) {
			const volatile uint64_t *args = ukvm_vm_sys_hva(vcpu->vm, vcpu->args_gpa);
			bool after = vcpu->passes_seen >= vcpu->passes;
			uint64_t guest_tsc = guest_arg(args, GA_SYNC_TSC);
			int64_t offset;

#ifdef UKVM_TEST_HOOKS
			guest_tsc += vcpu->tsc_bias;	/* UKVM_INJECT_TSC_OFFSET */
			if (after && vcpu->ctl->inject == UKVM_INJECT_TSC_JUMP)
				guest_tsc += vcpu->ctl->inject_after;
#endif
			/* Before the walk, or after its last pass (guest.S). */
			ukvm_tsc_bracket_add(after ? &vcpu->tsc_bracket_after : &vcpu->tsc_bracket,
					     guest_tsc, tsc_before, tsc_after);
			/* And KVM's own offset, which collect.c checks held still (tsc.h). */
			if (!ukvm_vcpu_tsc_offset(vcpu, &offset))
				ukvm_tsc_offsets_add(&vcpu->kvm_tsc_offsets, offset);
			return 0;
		}
		if (run->io.port == UKVM_PORT_PASS) {
			if (vcpu->passes_seen < vcpu->passes)
				vcpu->pass_end_ns[vcpu->passes_seen] = ukvm_now_ns();
			vcpu->passes_seen++;
			return vcpu->gated ? vcpu_wait_at_gate(vcpu) : 0;
		}
		if (run->io.port == UKVM_PORT_DONE) {
			/* The walk ended with the last pass: one clock for both. */
			vcpu->end_ns = vcpu->passes_seen && vcpu->passes_seen <= vcpu->passes ?
				       vcpu->pass_end_ns[vcpu->passes_seen - 1] : ukvm_now_ns();
			vcpu->done = true;
			return 0;
		}
		if (run->io.port == UKVM_PORT_EXCEPTION) {
			vcpu_fail_guest_exception(vcpu);
			return -EFAULT;
		}
		break;
	case KVM_EXIT_INTR:
		return 0;
	case KVM_EXIT_DIRTY_RING_FULL:
		return vcpu_dirty_ring_full(vcpu);
	case KVM_EXIT_MMIO:
		if (vcpu->resolve_fault)
			return vcpu_complete_fault_mmio(vcpu);
		break;
	default:
		break;
	}
	vcpu_fail_exit(vcpu, "unexpected exit from the guest");
	return -EPROTO;
}

/*
 * KVM_RUN failed with EAGAIN. KVM starts a worker task of the VM's
 * (kvm-nx-lpage-recovery, a vhost_task since Linux 6.13) at a vCPU's first
 * KVM_RUN and fails the ioctl with fork's EAGAIN when the pids cgroup or
 * RLIMIT_NPROC refuses it, again on every retry: retried, 1 ms apart, for
 * VCPU_EAGAIN_NS; then the run fails naming the limits. True: retry.
 */
static bool vcpu_eagain_retry(struct ukvm_vcpu *vcpu, uint64_t *since_ns)
{
	uint64_t now = ukvm_now_ns();

	if (!*since_ns)
		*since_ns = now;
	if (now - *since_ns < VCPU_EAGAIN_NS) {
		ukvm_sleep_ns(NSEC_PER_MSEC);
		return true;
	}
	ukvm_ctl_fail(vcpu->ctl, UKVM_ERR_RUN, EAGAIN,
		      "vCPU %u: KVM_RUN failed with EAGAIN for %.1f s: KVM could not start the "
		      "VM's worker thread (kvm-nx-lpage-recovery), which counts against the "
		      "pids cgroup's pids.max and RLIMIT_NPROC (ulimit -u) like any thread; "
		      "raise the limit or use fewer vCPUs or readers", vcpu->index,
		      (double)VCPU_EAGAIN_NS / NSEC_PER_SEC);
	return false;
}

/* What a KVM_RUN failure's message names of the fault, before the reason. */
enum vcpu_fault_detail {
	DETAIL_NONE,
	DETAIL_GPA,	/* the address KVM or the guest named, and which of them named it */
	DETAIL_RIP,	/* no address named: the guest's rip, and KVM's exit reason */
};

/*
 * KVM_RUN's failures that nothing resolved, as the run's error says them:
 * "vCPU N: KVM_RUN", the detail, then why. The first row that matches
 * speaks: its errno (0: any), a vCPU that resolves its own faults if the
 * row asks for one, and for DETAIL_GPA an address that was named.
 */
static const struct vcpu_run_failure {
	int err;
	bool resolving;
	enum vcpu_fault_detail detail;
	const char *why;
} vcpu_run_failures[] = {
	{ EIO, false, DETAIL_NONE, ": KVM killed the VM" },
	{ EFAULT, true, DETAIL_GPA, ", outside the memory this vCPU resolves" },
	{ EFAULT, true, DETAIL_RIP, ": the guest touched memory the host could not provide" },
	{ EFAULT, false, DETAIL_NONE, ": the guest touched memory the host could not provide "
				      "(a fault that could not be resolved?)" },
	{ 0, false, DETAIL_NONE, "" },	/* any other errno: the call and its errno */
};

/* KVM_RUN failed with errno e, and nothing resolved it: the run fails, saying why. */
static void vcpu_fail_run(struct ukvm_vcpu *vcpu, int e)
{
	const struct vcpu_run_failure *f;
	char detail[192] = "";

	for (f = vcpu_run_failures; ; f++)	/* the last row matches every failure */
		if ((!f->err || f->err == e) && (!f->resolving || vcpu->resolve_fault) &&
		    (f->detail != DETAIL_GPA || vcpu->efault_named != UKVM_EFAULT_UNNAMED))
			break;
	if (f->detail == DETAIL_GPA)
		snprintf(detail, sizeof(detail), ": EFAULT at gpa 0x%llx (named by %s)",
			 (unsigned long long)vcpu->efault_gpa,
			 vcpu->efault_named == UKVM_EFAULT_BY_KVM ?
			 "KVM_EXIT_MEMORY_FAULT" : "the guest's %rax");
	else if (f->detail == DETAIL_RIP)
		snprintf(detail, sizeof(detail), ": EFAULT at guest rip 0x%llx, not one of the "
			 "walk's accesses and not KVM_EXIT_MEMORY_FAULT (exit reason %u)",
			 (unsigned long long)vcpu->efault_rip, vcpu->run->exit_reason);
	ukvm_ctl_fail(vcpu->ctl, UKVM_ERR_RUN, e, "vCPU %u: KVM_RUN%s%s", vcpu->index, detail,
		      f->why);
}

void *ukvm_vcpu_thread(void *arg)
{
	struct ukvm_vcpu *vcpu = arg;
	struct ukvm_ctl *ctl = vcpu->ctl;
	struct ukvm_thread_usage usage;
	uint64_t eagain_since_ns;
	int go, ret;

	ukvm_kick_thread_init();
	vcpu->tid = (int32_t)gettid();
	ret = ukvm_thread_pin(vcpu->cpu, vcpu->affinity);
	if (ret)
		ukvm_ctl_fail(ctl, UKVM_ERR_RUN, -ret,
			      "vCPU %u: pinning to CPU %d (pin_vcpus): sched_setaffinity",
			      vcpu->index, vcpu->cpu);

	pthread_mutex_lock(&ctl->lock);
	vcpu->ready = true;
	pthread_cond_broadcast(&ctl->cond);
	while (ctl->go == 0)
		pthread_cond_wait(&ctl->cond, &ctl->lock);
	go = ctl->go;
	pthread_mutex_unlock(&ctl->lock);
	if (go < 0)
		goto out;
#ifdef UKVM_TEST_HOOKS
	/* UKVM_INJECT_VCPU_HANG: no progress until stopped (a kick ends a sleep early). */
	while (vcpu->hang && !ukvm_ctl_stopping(ctl))
		ukvm_sleep_ns(NSEC_PER_MSEC);
	if (vcpu->hang)
		goto out;
#endif

	vcpu->done = false;
	vcpu->start_ns = ukvm_now_ns();
	eagain_since_ns = 0;
	for (;;) {
		uint64_t tsc_before = 0, tsc_after = 0;

		if (ukvm_ctl_stopping(ctl))
			break;
		if (vcpu->timing)
			tsc_before = ukvm_tsc_read();
		ret = ioctl(vcpu->fd, KVM_RUN, 0);
		if (vcpu->timing)
			tsc_after = ukvm_tsc_read();
		/*
		 * A return from the guest. KVM_RUN's EAGAIN (its worker could not
		 * be started, vcpu_eagain_retry) comes before the guest is
		 * entered: a retry of it is no exit.
		 */
		if (ret == 0 || errno != EAGAIN)
			vcpu->userspace_exits++;
		if (ret == 0) {
			vcpu->efault_pending = false;	/* the guest ran on */
			eagain_since_ns = 0;
		}
		if (ret < 0) {
			int e = errno;

			if (e == EINTR) {
				vcpu_kicked(vcpu);
				continue;	/* the loop re-checks stop */
			}
			if (e == EAGAIN && vcpu_eagain_retry(vcpu, &eagain_since_ns))
				continue;
			if (e == EAGAIN)
				break;	/* the failure is recorded */
			if (e == EFAULT) {
				ret = vcpu_resolve_efault(vcpu);
				if (!ret)
					continue;
				if (ret != -ENOENT)
					break;	/* the failure is recorded */
			}
			vcpu_fail_run(vcpu, e);
			break;
		}
		if (vcpu_handle_exit(vcpu, tsc_before, tsc_after) || vcpu->done)
			break;
	}

out:
	if (ukvm_thread_usage(&usage) == 0) {
		vcpu->cpu_ns = usage.cpu_ns;
		vcpu->context_switches = usage.context_switches;
		vcpu->voluntary_context_switches = usage.voluntary_context_switches;
	}
	pthread_mutex_lock(&ctl->lock);
	atomic_store(&vcpu->exited, true);
	if (vcpu->done)
		ctl->vcpus_running--;
	pthread_cond_broadcast(&ctl->cond);
	pthread_mutex_unlock(&ctl->lock);
	return NULL;
}
