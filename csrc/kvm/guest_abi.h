/* SPDX-License-Identifier: MIT */
/*
 * The contract between the host and the guest code in guest.S.
 *
 * This header is included by guest.S (through the C preprocessor) and by C
 * files, so it holds only #defines (guest_arg(), for C, below). The host
 * writes a struct of these offsets into a per-vCPU "args" page and starts
 * the vCPU with
 * %rdi = the args page's guest address; the guest writes its results back
 * into the same page and reports through I/O port writes.
 */
#ifndef UKVM_GUEST_ABI_H
#define UKVM_GUEST_ABI_H

/* Written by the host before the run. */
#define GA_REGION	0x00	/* GVA (== GPA) of the first 4 KiB page to walk */
#define GA_PAGES	0x08	/* pages (accesses) in one pass */
#define GA_WORK		0x10	/* busy-loop iterations after each access */
#define GA_PASSES	0x18	/* how many times to walk the region */
#define GA_PATTERN	0x20	/* GUEST_PATTERN_* */
#define GA_PERM_MASK	0x28	/* random order: 2^b - 1, with 2^b >= pages */
#define GA_PERM_SHIFT	0x30	/* random order: xor-shift distance */
#define GA_PERM_KEY0	0x38	/* random order: keys, masked to PERM_MASK */
#define GA_PERM_KEY1	0x40
#define GA_WRITE_PCT	0x48	/* 0..100: share of pages written, not read */
#define GA_WRITE_KEY	0x50	/* seeds the per-page write/read choice */
#define GA_TIMING	0x58	/* nonzero: time every access with rdtsc */
#define GA_LOG_PTR	0x60	/* timing: where the next access log entry goes */
#define GA_LOG_STRIDE	0x68	/* timing: GA_LOG_ENTRY in the first pass, then 0 */
#define GA_LOG_END	0x70	/* timing: the end of the log, for the pre-touch */
#define GA_SYNC_ROUNDS	0x78	/* timing: clock-sync exits before and after the walk */
#define GA_LIST		0xb0	/* GUEST_PATTERN_LIST: GA_PAGES u32 page indices, a pass */
#define GA_WRITE_ROTATE	0xb8	/* write_set per_pass: pass p's key is GA_WRITE_KEY ^ p x this */

/* Written by the guest, at the end of every pass. */
#define GA_ACCESSES	0x80	/* page accesses so far, all passes */
#define GA_CHECKSUM	0x88	/* sum of word 1 of every page it read */
#define GA_PASSES_DONE	0x90
#define GA_TSC_SUM	0x98	/* timing: TSC cycles spent in accesses */
#define GA_SYNC_TSC	0xa0	/* timing: the TSC, written just before each sync exit */
/* Written by the guest during a pass, every GUEST_STEP_CHUNK pages and at
 * its end, for the host's live progress reports. */
#define GA_STEP		0xa8	/* pages done in the current pass, to the chunk */
#define GA_WRITE_PASS_KEY 0xc0	/* this pass's write key (GA_WRITE_ROTATE), set at its start */
#define GUEST_STEP_CHUNK	256
#define GA_TSC_HIST	0x100	/* timing: 64 counters, [i] counts accesses of 2^i.. cycles */

#define GA_SIZE		0x300
#define GA_TSC_BUCKETS	64

/*
 * The access log (timing): one entry per access of the first pass, the one
 * that faults, in the order the guest made them. The guest stamps an entry
 * before and after each access, so that a fault the readers saw can be
 * placed on the guest's own clock: raised (about to access) and resumed
 * (the access done). After the first pass the stride is 0 and entries land
 * on one spare slot at the end.
 */
#define LOG_RAISED	0x00	/* TSC just before the access */
#define LOG_RESUMED	0x08	/* TSC just after it */
#define LOG_GVA		0x10	/* the page's address */
#define GA_LOG_ENTRY	0x18

#define GUEST_PATTERN_SEQUENTIAL	0
#define GUEST_PATTERN_REVERSE		1
#define GUEST_PATTERN_RANDOM		2
/*
 * The host's list of page indices (from GA_REGION) at GA_LIST, walked in
 * order each pass: touch_percent and access zipf (experiment/access.c).
 * GA_PAGES is then the list's length, and GA_ACCESSES counts its entries.
 */
#define GUEST_PATTERN_LIST		3

/*
 * The guest's I/O port writes. There are no devices in the VM, so every
 * port write exits to the vCPU thread.
 */
#define UKVM_PORT_PASS		0xe000	/* a pass ended */
#define UKVM_PORT_DONE		0xe001	/* all passes ended */
#define UKVM_PORT_EXCEPTION	0xe002	/* rax=vector rbx=error code rcx=rip rsi=cr2 */
#define UKVM_PORT_SYNC		0xe003	/* timing: GA_SYNC_TSC holds the guest's TSC */

/* Constants of the guest's hashes; verify.c computes the same functions. */
#define GUEST_HASH_MUL1	0x9e3779b97f4a7c15
#define GUEST_HASH_MUL2	0xd6e8feb86659fd93
#define GUEST_PERM_MUL1	0x5851f42d4c957f2d
#define GUEST_PERM_MUL2	0x14057b7ef767814f

/*
 * write_set per_pass: GA_WRITE_ROTATE's value (odd, so that no two of the
 * first 2^64 passes share a key); 0 (write_set fixed) keeps one key.
 */
#define GUEST_WRITE_ROTATE	0x2545f4914f6cdd1d

/* What a written page's word 0 holds: its guest physical address ^ MAGIC. */
#define GUEST_WRITE_MAGIC	0x75666664566d5057

#ifndef __ASSEMBLER__
/* The host's view of one field of an args page: the 64-bit word at byte offset off (GA_*). */
#define guest_arg(args, off)	((args)[(off) / sizeof(uint64_t)])
#endif

/*
 * The walk's accesses to the test region (guest.S's ukvm_guest_access_sites,
 * guest.h): three per walk (read, write, the visit count's increment), two
 * walks (plain and timed). guest.S checks that its table has this many.
 */
#define UKVM_GUEST_ACCESS_SITES	6

#endif
