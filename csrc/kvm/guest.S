/* SPDX-License-Identifier: MIT */
/*
 * The guest: 64-bit code that walks a region of guest memory page by page.
 *
 * It is written in assembly, not C, so that no compiler choice (stack
 * protector, sanitizer instrumentation, a call to memset, an absolute
 * address) can leak host assumptions into it. Everything here is position
 * independent: the host copies the bytes from ukvm_guest_code_start to
 * ukvm_guest_code_end into guest memory and starts a vCPU at the first byte.
 * Guest virtual addresses equal guest physical addresses.
 *
 * Entry: %rdi = the vCPU's args page (offsets in guest_abi.h),
 *        %rsp = the top of a private stack.
 *
 * The page order is the pattern's (GA_PATTERN), or a list of page indices
 * the host wrote (GUEST_PATTERN_LIST: touch_percent, Zipf draws), where a
 * page may come up many times a pass or never.
 *
 * Per page, the guest either writes (page address ^ GUEST_WRITE_MAGIC) to
 * word 0 and atomically increments word 2 (a visit count: with overlap
 * several vCPUs write the same page), or reads word 1 into a checksum. The
 * host checks both after the run, so a page the guest never reached, or one
 * that held the wrong data when the guest read it, is caught.
 */
#include "guest_abi.h"

/*
 * Timing: GA_SYNC_ROUNDS exits, each with the TSC just read in GA_SYNC_TSC,
 * so the host can bracket the guest's clock between its own readings before
 * and after each KVM_RUN. Uses %rax, %rdx, %r13.
 */
	.macro	SYNC_EXITS
	mov	GA_SYNC_ROUNDS(%r8), %r13
1:	test	%r13, %r13
	jz	2f
	lfence
	rdtsc
	shl	$32, %rdx
	or	%rdx, %rax
	mov	%rax, GA_SYNC_TSC(%r8)
	mov	$UKVM_PORT_SYNC, %dx
	out	%al, %dx
	dec	%r13
	jmp	1b
2:
	.endm

/*
 * Timing: %rsi = the TSC before the access, stamped with the page's address
 * into the access log (the address stays in %rax).
 */
	.macro	TSC_BEGIN
	mov	%rax, %rdi
	lfence
	rdtsc
	shl	$32, %rdx
	or	%rdx, %rax
	mov	%rax, %rsi
	mov	GA_LOG_PTR(%r8), %rdx
	mov	%rsi, LOG_RAISED(%rdx)
	mov	%rdi, LOG_GVA(%rdx)
	mov	%rdi, %rax
	.endm

/*
 * Timing: the TSC after the access into the log entry, which then advances
 * (first pass only: the stride is 0 after it); the access's cycles into
 * GA_TSC_SUM and bucket log2(cycles).
 */
	.macro	TSC_END
	lfence
	rdtsc
	shl	$32, %rdx
	or	%rdx, %rax
	mov	GA_LOG_PTR(%r8), %rdx
	mov	%rax, LOG_RESUMED(%rdx)
	mov	GA_LOG_STRIDE(%r8), %rcx
	add	%rcx, GA_LOG_PTR(%r8)
	sub	%rsi, %rax
	add	%rax, GA_TSC_SUM(%r8)
	or	$1, %rax		/* bsr of 0 is undefined */
	bsr	%rax, %rcx
	incq	GA_TSC_HIST(%r8,%rcx,8)
	.endm

	.macro	WALK timed, s
.Lpass\s:
	cmp	GA_PASSES(%r8), %r12
	jae	.Lwalked\s
	/* This pass's write key: GA_WRITE_KEY, turned by the pass number (write_set per_pass). */
	mov	GA_WRITE_ROTATE(%r8), %rax
	imul	%r12, %rax
	xor	GA_WRITE_KEY(%r8), %rax
	mov	%rax, GA_WRITE_PASS_KEY(%r8)
	xor	%r13d, %r13d
	xor	%ebx, %ebx		/* the first step publishes step 0 and sets the first chunk */

.Lstep\s:
	cmp	%rbx, %r13
	jae	.Lchunk\s
	/* %rax = the index of the page visited at step %r13 */
	mov	%r13, %rax
	test	%rbp, %rbp		/* GUEST_PATTERN_SEQUENTIAL is 0 */
	jnz	.Lordered\s

.Laddress\s:
	shl	$12, %rax
	add	%r9, %rax		/* %rax = the page's address */

	/* Write or read? Decided per page frame and pass key, so every vCPU agrees. */
	cmp	$100, %r15
	jae	.Lwrite\s
	test	%r15, %r15
	jz	.Lread\s
	mov	%rax, %rsi
	shr	$12, %rsi
	xor	GA_WRITE_PASS_KEY(%r8), %rsi
	movabs	$GUEST_HASH_MUL1, %rcx
	imul	%rcx, %rsi
	mov	%rsi, %rcx
	shr	$32, %rcx
	xor	%rcx, %rsi
	movabs	$GUEST_HASH_MUL2, %rcx
	imul	%rcx, %rsi
	mov	%rsi, %rcx
	shr	$32, %rcx
	xor	%rcx, %rsi
	mov	%rax, %rdi		/* keep the address */
	mov	%rsi, %rax
	mov	$100, %ecx
	mul	%rcx			/* %rdx = (hash * 100) >> 64, in 0..99 */
	mov	%rdi, %rax
	cmp	%r15, %rdx
	jb	.Lwrite\s

.Lread\s:
	.if \timed
	TSC_BEGIN
	.endif
.Lread_site\s:
	add	8(%rax), %r14
	.if \timed
	TSC_END
	.endif
	jmp	.Lnext\s

.Lwrite\s:
	.if \timed
	TSC_BEGIN
	.endif
	movabs	$GUEST_WRITE_MAGIC, %rcx
	xor	%rax, %rcx
.Lwrite_site\s:
	mov	%rcx, (%rax)
.Lcount_site\s:
	lock incq 16(%rax)
	.if \timed
	TSC_END
	.endif

.Lnext\s:
	inc	%r13
	test	%r11, %r11
	jnz	.Lwork\s
	jmp	.Lstep\s

	/*
	 * Guest computation between accesses: GA_WORK iterations of four
	 * instructions, two of them stack accesses (the shape of a call).
	 */
.Lwork\s:
	mov	%r11, %rdx
1:	push	%rcx
	pop	%rcx
	dec	%rdx
	jnz	1b
	jmp	.Lstep\s

.Lordered\s:
	cmp	$GUEST_PATTERN_RANDOM, %rbp
	jb	.Lreverse\s
	ja	.Llist\s

	/*
	 * A keyed bijection on [0, 2^b) (xor, multiply by an odd number,
	 * xor-shift, add: each invertible modulo 2^b), applied until the
	 * value falls in [0, pages). This "cycle walking" is a permutation of
	 * [0, pages) and takes under two rounds on average.
	 */
.Lrandom\s:
	mov	GA_PERM_SHIFT(%r8), %rcx
.Lwalk\s:
	xor	GA_PERM_KEY0(%r8), %rax
	movabs	$GUEST_PERM_MUL1, %rdx
	imul	%rdx, %rax
	and	GA_PERM_MASK(%r8), %rax
	mov	%rax, %rdx
	shr	%cl, %rdx
	xor	%rdx, %rax
	add	GA_PERM_KEY1(%r8), %rax
	movabs	$GUEST_PERM_MUL2, %rdx
	imul	%rdx, %rax
	and	GA_PERM_MASK(%r8), %rax
	mov	%rax, %rdx
	shr	%cl, %rdx
	xor	%rdx, %rax
	cmp	%r10, %rax
	jae	.Lwalk\s
	jmp	.Laddress\s

.Lreverse\s:
	mov	%r10, %rax
	sub	%r13, %rax
	dec	%rax
	jmp	.Laddress\s

	/* The host's list: entry %r13 is the page index (u32, zero-extended). */
.Llist\s:
	mov	GA_LIST(%r8), %rdx
	mov	(%rdx,%r13,4), %eax
	jmp	.Laddress\s

	/*
	 * Every GUEST_STEP_CHUNK steps, and at the pass's end: publish the step
	 * for the host's progress reports (GA_STEP), then set %rbx to the next
	 * chunk's end. Keeping the step in memory at every page would cost no
	 * instructions but two memory operands a page, which a host that
	 * emulates guest instructions pays for (~1 us a page on PVM); this
	 * costs 9 instructions per chunk, one of them a store.
	 */
.Lchunk\s:
	mov	%r13, GA_STEP(%r8)
	cmp	%r10, %r13
	jae	.Lpass_end\s
	lea	GUEST_STEP_CHUNK(%r13), %rbx
	cmp	%r10, %rbx
	cmova	%r10, %rbx
	jmp	.Lstep\s

.Lpass_end\s:
	.if \timed
	movq	$0, GA_LOG_STRIDE(%r8)	/* only the first pass faults: log only it */
	.endif
	inc	%r12
	mov	%r12, %rax
	imul	%r10, %rax
	mov	%rax, GA_ACCESSES(%r8)
	mov	%r14, GA_CHECKSUM(%r8)
	mov	%r12, GA_PASSES_DONE(%r8)
	mov	$UKVM_PORT_PASS, %dx
	out	%al, %dx
	jmp	.Lpass\s
	.endm

	.text
	.p2align 6
	.globl	ukvm_guest_code_start
	.hidden	ukvm_guest_code_start
	.globl	ukvm_guest_code_end
	.hidden	ukvm_guest_code_end
	.globl	ukvm_guest_exception_offsets
	.hidden	ukvm_guest_exception_offsets
	.globl	ukvm_guest_access_sites
	.hidden	ukvm_guest_access_sites

/*
 * Registers for the whole walk:
 *   %r8  args            %r12 passes done
 *   %r9  region start    %r13 step within this pass
 *   %r10 steps per pass  %r14 checksum of the words read
 *   %r11 work per access %r15 write percent
 *   %rbx this chunk's end %rbp pattern
 *
 * The walk exists twice, from one macro: plain, and timed (GA_TIMING: rdtsc
 * around every access, into a log2 histogram in the args page). The plain
 * hot path (sequential, all writes, no work) is 17 instructions per page
 * (and 9 per GUEST_STEP_CHUNK pages to publish the step for progress),
 * and choosing between the two costs nothing per page. Both matter on hosts
 * that emulate guest instructions after a fault (software-virtualized KVM
 * such as PVM): there every instruction between two faults costs
 * microseconds, and so does rdtsc.
 */
ukvm_guest_code_start:
	mov	%rdi, %r8
	mov	GA_REGION(%r8), %r9
	mov	GA_PAGES(%r8), %r10
	mov	GA_WORK(%r8), %r11
	mov	GA_WRITE_PCT(%r8), %r15
	mov	GA_PATTERN(%r8), %rbp
	xor	%r14d, %r14d
	xor	%r12d, %r12d
	cmpq	$0, GA_TIMING(%r8)
	jne	.Ltimed
	WALK	0, _plain
.Lwalked_plain:
	jmp	.Ldone

	/*
	 * Timing, before the walk: touch every page of the access log, so that
	 * stamping an access never faults; then the clock-sync exits. After the
	 * walk, the sync exits again: the offset must not have moved between
	 * them (the host checks that the two brackets agree).
	 */
.Ltimed:
	mov	GA_LOG_PTR(%r8), %rcx
.Ltouch:
	cmp	GA_LOG_END(%r8), %rcx
	jae	.Lsync
	movq	$0, (%rcx)
	add	$4096, %rcx
	jmp	.Ltouch
.Lsync:
	SYNC_EXITS
	jmp	.Lpass_timed

	WALK	1, _timed
.Lwalked_timed:
	SYNC_EXITS

.Ldone:
	mov	$UKVM_PORT_DONE, %dx
	out	%al, %dx
	hlt
	jmp	.Ldone

/*
 * Exception stubs, one per architectural vector: the IDT points here. They
 * report the vector, error code, faulting RIP and CR2 to the host, which
 * turns them into an error naming the vCPU, instead of a triple fault.
 */
	.macro	EXC_NOERR vec
exc_\vec:
	pushq	$0
	pushq	$\vec
	jmp	exc_common
	.endm

	.macro	EXC_ERR vec
exc_\vec:
	pushq	$\vec
	jmp	exc_common
	.endm

	.irp	vec, 0,1,2,3,4,5,6,7,9,15,16,18,19,20,22,23,24,25,26,27,28,31
	EXC_NOERR \vec
	.endr
	.irp	vec, 8,10,11,12,13,14,17,21,29,30
	EXC_ERR	\vec
	.endr

exc_common:
	pop	%rax			/* vector */
	pop	%rbx			/* error code */
	mov	(%rsp), %rcx		/* RIP of the faulting instruction */
	mov	%cr2, %rsi
	mov	$UKVM_PORT_EXCEPTION, %dx
	out	%al, %dx
1:	hlt
	jmp	1b

ukvm_guest_code_end:

	.section .rodata
	.p2align 3
/* Offset of each vector's stub from ukvm_guest_code_start. */
ukvm_guest_exception_offsets:
	.irp	vec, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
	.quad	exc_\vec - ukvm_guest_code_start
	.endr

/*
 * Every instruction of the walk that touches the test region, as {offset
 * from ukvm_guest_code_start, 1 if it writes}: each takes the page's address
 * in %rax (the walk's invariant at an access, timed or not). A vCPU thread
 * that resolves its own faults (resolver vcpu) on a KVM that returns a bare
 * EFAULT finds the page from the vCPU's %rip and %rax (vcpu.c).
 */
	.p2align 3
ukvm_guest_access_sites:
	.irp	walk, _plain, _timed
	.quad	.Lread_site\walk - ukvm_guest_code_start, 0
	.quad	.Lwrite_site\walk - ukvm_guest_code_start, 1
	.quad	.Lcount_site\walk - ukvm_guest_code_start, 1
	.endr
	.if	(. - ukvm_guest_access_sites) != UKVM_GUEST_ACCESS_SITES * 16
	.error	"ukvm_guest_access_sites does not hold UKVM_GUEST_ACCESS_SITES entries"
	.endif

	.section .note.GNU-stack, "", @progbits
