/* SPDX-License-Identifier: MIT */
/*
 * uffdkvm core: a KVM demand-paging experiment driven by userfaultfd.
 *
 * This is the whole public interface of the C core. It is a plain library:
 * no Python, no exit(), no abort(). Every function reports failure through a
 * struct ukvm_error (a kind, an errno and a message naming the failing call)
 * and releases everything it created on every path.
 *
 * Return convention, here and in every internal header of csrc/: a function
 * that can fail returns 0 on success (or a non-negative value where it says
 * so: an fd, an index, a count) and -errno on failure, never -1 with errno
 * set. A failure without an errno of its own returns the one its error kind
 * stands for: -EINVAL (UKVM_ERR_CONFIG), -EOPNOTSUPP (UKVM_ERR_HOST), -EIO
 * (UKVM_ERR_RUN), -ETIMEDOUT, -ECANCELED. Predicates return bool; functions
 * that return a pointer return NULL only when out of memory; functions that
 * cannot fail return void or their value.
 *
 * The files behind this header and how they layer: csrc/README.md.
 *
 * One experiment is: build a VM with N vCPUs in long mode, back its test
 * region with the chosen memory, register the region with userfaultfd,
 * start pools of reader threads that resolve the faults, let every vCPU
 * touch every 4 KiB page of its part of the region, then verify every page
 * and hand back per-vCPU and per-reader statistics.
 */
#ifndef UKVM_H
#define UKVM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef UKVM_TEST_HOOKS
#include "testhooks.h"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Memory behind the test region; faults are resolved at its page size. */
enum ukvm_backing {
	UKVM_BACKING_ANONYMOUS = 0,	/* private anonymous, THP off: 4 KiB */
	UKVM_BACKING_SHMEM,		/* memfd, mapped twice (guest + alias): 4 KiB */
	UKVM_BACKING_ANONYMOUS_THP,	/* private anonymous, MADV_HUGEPAGE: 2 MiB */
	UKVM_BACKING_ANONYMOUS_HUGETLB,	/* private hugetlb: 2 MiB */
	UKVM_BACKING_ANONYMOUS_HUGETLB_1GB, /* private hugetlb: 1 GiB */
	UKVM_BACKING_SHARED_HUGETLB,	/* hugetlbfs memfd, mapped twice: 2 MiB */
	UKVM_BACKING_GUEST_MEMFD,	/* KVM_CREATE_GUEST_MEMFD, mmap'ed: 4 KiB */
	UKVM_BACKING__COUNT
};

enum ukvm_pattern {
	UKVM_PATTERN_SEQUENTIAL = 0,
	UKVM_PATTERN_REVERSE,
	UKVM_PATTERN_RANDOM,		/* a seeded permutation: every page once a pass */
	UKVM_PATTERN__COUNT
};

/* How often the guest visits each page it touches, in one pass. */
enum ukvm_access {
	UKVM_ACCESS_UNIFORM = 0,	/* every touched page once */
	UKVM_ACCESS_ZIPF,		/* `accesses` Zipf(zipf_theta) draws over the touched pages */
	UKVM_ACCESS__COUNT
};

/* How a MISSING fault is resolved. */
enum ukvm_resolve {
	UKVM_RESOLVE_COPY = 0,		/* UFFDIO_COPY of a page of known data */
	UKVM_RESOLVE_ZEROPAGE,		/* UFFDIO_ZEROPAGE */
	UKVM_RESOLVE_MOVE,		/* UFFDIO_MOVE of a staged page (Linux 6.8+, anonymous) */
	UKVM_RESOLVE__COUNT
};

/* The distribution of the per-fault delay, around delay_us. */
enum ukvm_delay_dist {
	UKVM_DELAY_FIXED = 0,		/* exactly delay_us */
	UKVM_DELAY_UNIFORM,		/* uniform on [0, 2 * delay_us] */
	UKVM_DELAY_EXPONENTIAL,		/* exponential with mean delay_us */
	UKVM_DELAY__COUNT
};

enum ukvm_uffd_mode {
	UKVM_UFFD_NONE = 0,	/* no userfaultfd: the kernel pages memory in */
	UKVM_UFFD_MISSING,	/* resolve with UFFDIO_COPY */
	UKVM_UFFD_MINOR,	/* page cache prefilled; resolve with UFFDIO_CONTINUE */
	/*
	 * Write-protect (QEMU's background snapshot): the region is filled and
	 * write-protected before the vCPUs start; the guest's first write to a
	 * page faults (UFFD_PAGEFAULT_FLAG_WP), the resolver copies the page's
	 * old contents into the snapshot and un-protects it (UFFDIO_WRITEPROTECT
	 * mode 0, which wakes the vCPU). Reads never fault. 4 KiB backings only
	 * (anonymous, shmem).
	 */
	UKVM_UFFD_WP,
	UKVM_UFFD__COUNT
};

/*
 * Who resolves a fault. Readers: threads that read the uffd's messages,
 * while the faulting vCPU thread sleeps in the kernel until one of them
 * resolves it. vCPU: the uffd is opened with UFFD_FEATURE_SIGBUS, so a
 * fault is not queued at all: the access fails, KVM_RUN returns to the
 * vCPU's own thread, which resolves the page and runs on: no message, no
 * wakeup, no other thread. (KVM reports it as KVM_EXIT_MEMORY_FAULT, or,
 * where KVM emulated the access, as an MMIO exit at the page's address,
 * which the thread then completes from the resolved page.)
 */
enum ukvm_resolver {
	UKVM_RESOLVER_READERS = 0,
	UKVM_RESOLVER_VCPU,
	UKVM_RESOLVER__COUNT
};

/* How a reader thread waits for fault messages. */
enum ukvm_wait {
	UKVM_WAIT_POLL = 0,		/* poll(2) on the shared uffd */
	UKVM_WAIT_EPOLL,		/* own epoll set, plain EPOLLIN */
	UKVM_WAIT_EPOLL_EXCLUSIVE,	/* own epoll set, EPOLLIN|EPOLLEXCLUSIVE */
	UKVM_WAIT_READ,			/* blocking read(2), no poll at all */
	UKVM_WAIT_SPIN,			/* non-blocking read(2) in a loop: never sleeps */
	UKVM_WAIT_IO_URING,		/* a read of the uffd in flight in the reader's own
					 * io_uring (needs a build with liburing) */
	UKVM_WAIT__COUNT
};

/* How guest TSC stamps became host CLOCK_MONOTONIC times (guest_timing). */
enum ukvm_clock_sync {
	UKVM_CLOCK_SYNC_NONE = 0,	/* not converted: the stages are unknown */
	UKVM_CLOCK_SYNC_KVM_OFFSET,	/* KVM's TSC offset, confirmed by the sync exits */
	UKVM_CLOCK_SYNC_EXITS,		/* the offset bracketed by sync exits alone */
};

/*
 * Where a resolved page's bytes come from (uffd_mode missing, resolve copy
 * or move): the synthetic fill, a snapshot file that maps onto the region
 * byte for byte (region offset o is file offset o; see
 * ukvm_snapshot_write), or a page server serving such a file
 * (source_address; the caller starts it: uffdkvm/pageserver.py).
 */
enum ukvm_source_kind {
	UKVM_SOURCE_SYNTHETIC = 0,
	UKVM_SOURCE_FILE,
	UKVM_SOURCE_REMOTE,
	UKVM_SOURCE__COUNT
};

/* source file: how a page is read from it. */
enum ukvm_source_read {
	UKVM_SOURCE_READ_PREAD = 0,	/* pread(2) from an fd */
	UKVM_SOURCE_READ_MMAP,		/* memcpy from a read-only MAP_SHARED mapping */
	UKVM_SOURCE_READ__COUNT
};

/* source file: the file's page cache when the vCPUs start. */
enum ukvm_source_cache {
	UKVM_SOURCE_CACHE_WARM = 0,	/* read through once: every page cached */
	UKVM_SOURCE_CACHE_COLD,		/* written back and dropped (POSIX_FADV_DONTNEED) */
	UKVM_SOURCE_CACHE__COUNT
};

#define UKVM_SOURCE_PATH_MAX	4096	/* bytes of source_path, its NUL included */
#define UKVM_SOURCE_ADDRESS_MAX	256	/* bytes of source_address, its NUL included */

/*
 * Prefetch (uffd_mode missing, resolve copy): pages installed before the
 * guest asks for them, with UFFDIO_COPY_MODE_DONTWAKE (a vCPU already
 * waiting on such a page is woken by the reader that then reads its fault
 * and finds the page there: EEXIST, then UFFDIO_WAKE).
 */
enum ukvm_prefetch {
	UKVM_PREFETCH_NONE = 0,
	UKVM_PREFETCH_READAHEAD,	/* after each fault, the next prefetch_pages of its uffd */
	UKVM_PREFETCH_BACKGROUND,	/* a pusher thread installs the region in address order */
	UKVM_PREFETCH_REPLAY,		/* the pusher installs replay[] in that order */
	UKVM_PREFETCH__COUNT
};

/* What the readers measure beyond counters. */
enum ukvm_stats {
	UKVM_STATS_FULL = 0,	/* timestamps per fault: latency, attribution, blocktime */
	UKVM_STATS_BASIC,	/* counters only: nothing on the hot path but increments */
	UKVM_STATS__COUNT
};

/*
 * A latency histogram in nanoseconds: exact below 16 ns, then four buckets
 * per power of two, so a percentile read from it is within 25%.
 */
#define UKVM_HIST_BUCKETS	160
struct ukvm_hist {
	uint64_t count;
	uint64_t sum;
	uint64_t min;
	uint64_t max;
	uint64_t buckets[UKVM_HIST_BUCKETS];
};

/* The smallest value bucket b holds (b in 0..UKVM_HIST_BUCKETS). */
uint64_t ukvm_hist_bucket_lower(unsigned b);

/*
 * One fault (stats full), CLOCK_MONOTONIC nanoseconds. The reader stamps
 * read_ns and resolved_ns; with guest_timing the guest's own stamps of the
 * access give raised_ns and resumed_ns (0 where unknown). The vCPU's stages
 * (faultlog.c) are queue = read - raised, service = read to the page's
 * arrival (resolved, or resumed if the vCPU resumed before the reader saw
 * its ioctl return) and resume = arrival to resumed.
 *
 * gpa: for hugetlb memory on a kernel without UFFD_FEATURE_EXACT_ADDRESS
 * (Linux 5.18+), the start of the huge page.
 */
struct ukvm_fault_record {
	uint64_t raised_ns;	/* the guest was about to make the faulting access */
	uint64_t read_ns;	/* a reader's read() returned the fault message */
	uint64_t resolved_ns;	/* the resolving ioctl returned */
	uint64_t resumed_ns;	/* the guest's access completed */
	uint64_t gpa;		/* the 4 KiB page the vCPU touched, guest-physical (see above) */
	int32_t vcpu;		/* the vCPU that faulted (UFFD_FEATURE_THREAD_ID), or -1 */
	uint16_t uffd;
	uint16_t reader;
	uint32_t eexist;	/* 1 if another reader had resolved it */
	uint32_t write;		/* 1 if the kernel reported a write fault (UFFD_PAGEFAULT_FLAG_WRITE) */
};

struct ukvm_config {
	uint32_t vcpus;
	uint64_t mem_per_vcpu;		/* bytes, a multiple of 4 KiB */
	enum ukvm_backing backing;
	enum ukvm_uffd_mode uffd_mode;
	/*
	 * uffd_mode wp: UFFD_FEATURE_WP_ASYNC (Linux 6.7+). No fault is
	 * delivered: the kernel un-protects a page as the guest first writes
	 * it, and after the run PAGEMAP_SCAN collects the pages written
	 * (ukvm_result.dirty_pages): dirty tracking, with no snapshot.
	 */
	bool wp_async;
	bool single_uffd;		/* one uffd for the whole region */
	enum ukvm_resolver resolver;
	uint32_t readers;		/* reader threads per uffd (resolver readers) */
	enum ukvm_wait wait;
	/* Messages one read(2) of the uffd may return, 1..UKVM_MAX_READ_BATCH.
	 * Above 1, while reads come back full a reader reads again before it
	 * waits (UKVM_READS_PER_WAKEUP reads at most). */
	uint32_t read_batch;
	uint32_t delay_us;		/* sleep per fault before resolving it */
	bool overlap;			/* every vCPU walks the same region */
	uint32_t guest_work;		/* guest busy-loop iterations per access */
	uint64_t guest_page_size;	/* how the guest maps the region: 4K, 2M, 1G */
	enum ukvm_pattern pattern;
	uint64_t seed;			/* for everything random */
	uint32_t write_percent;		/* 0..100: pages written rather than read */
	uint32_t passes;		/* walks of the region per vCPU; only the first faults */
	/* Guest access models (experiment/access.c): the defaults walk every page once a pass. */
	uint32_t touch_percent;		/* 1..100: the seeded share of pages the guest touches */
	enum ukvm_access access;
	double zipf_theta;		/* access zipf: the skew, > 0 */
	uint64_t accesses;		/* access zipf: draws per pass per vCPU; 0: its touched pages */
	enum ukvm_resolve resolve;
	enum ukvm_delay_dist delay_dist;
	bool prefault;			/* populate the region before the vCPUs start */
	/* Host CPUs for vCPU i and reader k: pins[i % nr] (copied at start). */
	uint32_t nr_pin_vcpus;
	const int32_t *pin_vcpus;
	uint32_t nr_pin_readers;
	const int32_t *pin_readers;
	enum ukvm_stats stats;
	bool guest_timing;		/* the guest times every access with rdtsc */
	bool trace_faults;		/* return every fault record */
	uint64_t timeout_ns;		/* 0: no limit */
	/* Page source (enum ukvm_source_kind): the path is copied with the config. */
	enum ukvm_source_kind source;
	char source_path[UKVM_SOURCE_PATH_MAX];	/* file, remote: the snapshot */
	/* remote: the page server's address, "unix:/path" or "tcp:HOST:PORT" */
	char source_address[UKVM_SOURCE_ADDRESS_MAX];
	enum ukvm_source_read source_read;
	enum ukvm_source_cache source_cache;
	/* Prefetch (enum ukvm_prefetch); pages are of the backing's page size. */
	enum ukvm_prefetch prefetch;
	uint32_t prefetch_pages;	/* readahead: the window after each fault (default 8) */
	uint64_t prefetch_bandwidth_mbps; /* the pusher's rate, 10^6 bits/s; 0: unlimited */
	uint64_t nr_replay;		/* replay: page indices from the region's start, */
	const uint64_t *replay;		/* in install order, no repeats (copied at start) */
#ifdef UKVM_TEST_HOOKS
	UKVM_TEST_CONFIG_FIELDS		/* testhooks.h: fault injection, test builds only */
#endif
};

void ukvm_config_init(struct ukvm_config *cfg);

enum ukvm_error_kind {
	UKVM_ERR_NONE = 0,
	UKVM_ERR_CONFIG,	/* the config is invalid: fix the named field */
	UKVM_ERR_HOST,		/* the host lacks or refuses something */
	UKVM_ERR_RUN,		/* a call failed while the experiment ran */
	UKVM_ERR_TIMEOUT,	/* cfg.timeout_ns passed before the run ended */
	UKVM_ERR_CANCELLED,	/* ukvm_experiment_cancel() was called */
};

struct ukvm_error {
	enum ukvm_error_kind kind;
	int errnum;		/* errno of the failing call, 0 if none */
	char message[1024];
};

struct ukvm_vcpu_result {
	uint32_t index;
	int32_t tid;		/* host thread that ran the vCPU */
	uint64_t start_ns;	/* CLOCK_MONOTONIC, first KVM_RUN */
	uint64_t end_ns;	/* the guest reported it was done */
	uint64_t pages;		/* pages the guest says it touched */
	uint64_t exits;		/* VM exits, from KVM's own "exits" stat */
	uint64_t userspace_exits; /* returns from KVM_RUN */
	uint64_t fault_exits;	/* resolver vCPU: of those, faults it resolved itself */
	uint64_t regs_fault_exits; /* of those, bare EFAULTs whose page the guest's registers named */
	uint64_t *kvm_stats;	/* ukvm_result.nr_vcpu_stats values, or NULL */
	uint64_t *pass_end_ns;	/* when each of ukvm_result.passes ended */
	uint64_t cpu_ns;	/* CPU time of the thread (getrusage) */
	uint64_t affinity[16];	/* CPUs the thread may run on, as it saw them: a bitmap */
	/* stats full: the faults this vCPU took (UFFD_FEATURE_THREAD_ID) */
	uint64_t faults;	/* fault messages from this vCPU (EEXIST ones included) */
	uint64_t eexist;	/* of those, ones another reader had resolved first */
	uint64_t blocked_ns;	/* time with a fault of this vCPU outstanding */
	struct ukvm_hist service_latency; /* read -> the page's arrival (see the fault record) */
	/* stats full + guest_timing: the stages the readers cannot see alone */
	struct ukvm_hist queue_latency;	/* raised -> read */
	struct ukvm_hist resume_latency; /* arrival -> the guest's access completed */
	struct ukvm_hist fault_latency;	/* raised -> resumed: the whole fault; with overlap
					 * also stalls another vCPU's fault ended (EEXIST) */
	/* guest_timing: the guest's own view, in TSC cycles */
	uint64_t access_cycles;	/* summed over all accesses */
	uint64_t access_hist[64]; /* [i]: accesses of 2^i to 2^(i+1) - 1 cycles */
};

/* Every counter is kept by the reader thread itself and kept on every exit. */
#define UKVM_MAX_READ_BATCH	64
#define UKVM_READS_PER_WAKEUP	16	/* a bound, so that one reader cannot starve the rest */

struct ukvm_reader_result {
	uint32_t uffd;		/* which uffd of the experiment */
	uint32_t index;		/* which reader of that uffd */
	uint64_t faults;	/* faults this reader resolved */
	uint64_t wakeups;	/* returns from its wait */
	uint64_t spurious_wakeups; /* woke, then read nothing (EAGAIN) */
	uint64_t eexist;	/* resolved by someone else first */
	int32_t tid;		/* the reader's host thread */
	uint64_t busy_ns;	/* message read to resolving ioctl done */
	/* Messages resolved by each ioctl (EEXIST included): which one ran. */
	uint64_t copies;	/* UFFDIO_COPY */
	uint64_t zeropages;	/* UFFDIO_ZEROPAGE */
	uint64_t continues;	/* UFFDIO_CONTINUE */
	uint64_t moves;		/* UFFDIO_MOVE */
	uint64_t unprotects;	/* UFFDIO_WRITEPROTECT mode 0 (uffd_mode wp) */
	uint64_t reads;		/* read(2)s of the uffd that returned messages */
	/* [n]: reads that returned n messages; [0]: reads after a full batch
	 * that found the uffd empty (not in reads) */
	uint64_t read_sizes[UKVM_MAX_READ_BATCH + 1];
	/* wait io_uring: completions of the ring's reads of the uffd that
	 * brought messages (each is one of reads) */
	uint64_t ring_completions;
	/* Prefetch: readahead installs, those that found the page there, and
	 * UFFDIO_WAKEs after an EEXIST (the page may have come with DONTWAKE). */
	uint64_t prefetched;
	uint64_t prefetch_eexist;
	uint64_t wakes;
	/*
	 * Times the thread was switched out in all its life, from
	 * getrusage(RUSAGE_THREAD).
	 * A waiter that the kernel wakes and puts back to sleep without
	 * returning to userspace (poll re-checks the uffd first) is invisible
	 * to spurious_wakeups but still costs a switch: this counts it.
	 */
	uint64_t context_switches;
	uint64_t voluntary_context_switches; /* of those, the thread's own sleeps */
	uint64_t cpu_ns;	/* user + system CPU time of the thread, all its life */
	uint64_t affinity[16];	/* CPUs the thread may run on, as it saw them: a bitmap */
	struct ukvm_hist service_latency; /* stats full: message read to ioctl done */
	struct ukvm_hist queue_latency;	/* stats full + guest_timing: raised -> read */
	uint64_t source_bytes;	/* bytes it fetched from the page source */
	uint64_t source_ns;	/* stats full, source not synthetic: time spent fetching */
};

struct ukvm_result {
	/* demand_paging_test's window: vCPU threads created ... all joined */
	uint64_t threads_start_ns;
	uint64_t threads_joined_ns;
	uint64_t start_ns;	/* first KVM_RUN of any vCPU */
	uint64_t end_ns;	/* last vCPU done */
	uint64_t pages_per_vcpu;
	uint64_t region_bytes;
	uint64_t page_size;	/* the unit faults are resolved in */
	uint64_t region_gpa;	/* where the test region starts, guest-physical */
	uint32_t passes;
	bool stats_full;
	uint64_t blocktime_ns;	/* stats full: time during which every vCPU was blocked */
	uint64_t tsc_khz;	/* guest TSC frequency, for guest_timing */
	/* guest_timing: how the guest's TSC stamps were put on CLOCK_MONOTONIC */
	enum ukvm_clock_sync clock_sync;
	uint64_t clock_error_ns;	/* a bound on that conversion's error */
	uint64_t misordered;	/* faults whose stamps contradict the readers' (clock error) */
	uint64_t nr_trace;	/* trace_faults: every fault, by start time */
	struct ukvm_fault_record *trace;
	uint32_t nr_uffds;
	uint32_t nr_vcpus;
	struct ukvm_vcpu_result *vcpus;
	uint32_t nr_readers;
	struct ukvm_reader_result *readers;
	/*
	 * KVM's binary statistics over the run (names from the kernel):
	 * cumulative ones as deltas, instant and peak ones at the end. Empty
	 * where the kernel has no KVM_GET_STATS_FD.
	 */
	uint32_t nr_vm_stats;
	char **vm_stat_names;
	uint64_t *vm_stats;
	uint32_t nr_vcpu_stats;
	char **vcpu_stat_names;	/* values in each ukvm_vcpu_result.kvm_stats */
	uint64_t dirty_pages;	/* wp_async: pages PAGEMAP_SCAN found written */
	enum ukvm_source_kind source;	/* the page source that ran */
	uint64_t source_cached_pages_at_start; /* source file: its pages in the page cache
						* as the vCPUs started (mincore) */
	uint64_t touched_pages;	/* distinct 4 KiB pages the guest touched (touch_percent) */
	uint64_t accesses;	/* the guest's accesses, all vCPUs and passes */
	/* trace_faults with touch_percent or access zipf: accesses per pass to
	 * each 4 KiB page of the region, all vCPUs (verified against the
	 * guest's own write counts); else NULL */
	uint32_t *page_visits;
	uint64_t nr_page_visits;
	/*
	 * uffd_mode missing with resolve copy: which pages went in how (pages
	 * of page_size). touch_order: the pages faults installed, in the order
	 * they were resolved (first installs only).
	 */
	bool resident_tracked;
	uint64_t prefetched_pages;	/* installed by prefetch (readahead and pusher) */
	uint64_t wasted_prefetch_pages;	/* of those, pages the guest never touches */
	uint64_t touched_units;		/* pages of page_size the guest touches (any 4 KiB) */
	uint64_t waited_units;		/* of those, pages a vCPU faulted on and waited for,
					 * whoever installed them (EEXIST included) */
	uint64_t resident_ns;		/* the last page of the region went in; 0: never, or
					 * stats basic (no clock read on the hot path) */
	uint64_t pusher_pages;		/* of prefetched_pages, the pusher's */
	uint64_t pusher_eexist;		/* the pusher's installs that found the page there */
	uint64_t pusher_source_bytes;	/* bytes the pusher fetched from the page source
					 * (its own connection; not in readers[]) */
	uint64_t nr_touch_order;
	uint64_t *touch_order;
	bool verified;		/* every page holds what it must */
	uint64_t bad_pages;	/* pages that did not, when !verified */
	char verify_message[256]; /* the first bad page, explained */
};

/* Frees the arrays of a result filled by ukvm_experiment_finish(). */
void ukvm_result_free(struct ukvm_result *res);

/*
 * An experiment runs in a controller thread of its own, so the caller can
 * wait in slices and cancel (a Python binding checks for Ctrl-C between
 * waits). All threads the core makes block every signal but one private
 * "kick" signal (see kick.c) and the synchronous ones (SIGSEGV, SIGBUS,
 * SIGILL, SIGFPE, SIGTRAP, SIGSYS, SIGABRT), so process signals reach the
 * caller and a crash in a core thread still reaches its handler.
 */
struct ukvm_experiment;

/*
 * Validates cfg and starts the controller; the VM is built in the
 * background. An earlier failed run still releasing its memory is waited
 * for first, 10 s at most from when its caller left it.
 */
int ukvm_experiment_start(const struct ukvm_config *cfg,
			  struct ukvm_experiment **out, struct ukvm_error *err);
/* 0 once the experiment has ended, -ETIMEDOUT if still running after timeout_ns. */
int ukvm_experiment_wait(struct ukvm_experiment *exp, uint64_t timeout_ns);
/*
 * How far a running experiment has got, for progress displays: its phase (a
 * static string: "setting up", "running", "verifying", ...) and, for each of
 * the first n vCPUs, the pages its guest has touched so far (all passes, read
 * live from the guest's own counters) and the pages it will touch in all.
 * Both are 0 before the vCPUs exist and after the experiment has released
 * them. Any thread may call it before ukvm_experiment_finish().
 */
void ukvm_experiment_progress(struct ukvm_experiment *exp, const char **phase,
			      uint64_t *pages_done, uint64_t *pages_total, uint32_t n);
/*
 * Asks a running experiment to stop; it ends with UKVM_ERR_CANCELLED (a run
 * that has already finished keeps its result). Any thread may call it, but
 * only before ukvm_experiment_finish(), which frees the experiment.
 */
void ukvm_experiment_cancel(struct ukvm_experiment *exp);
/*
 * Waits for the end, fills res (or err), frees the experiment. A run that
 * failed (cancelled, timed out) returns as soon as its threads are joined
 * and its fds closed; its memory is then released in the background, and
 * the next ukvm_experiment_start() waits for that (as ukvm_wait_idle() does).
 * Once a run has failed, nothing is waited for without a bound: a thread
 * that does not stop within 2 s fails the run with an error naming it
 * (UKVM_ERR_RUN, or appended to the first failure) and the experiment is
 * kept in the background until the thread leaves; after a cancel this
 * returns within half a second whatever the threads do. A run without a
 * time limit (timeout_ns 0) is waited for as long as its guests make
 * progress; one that has walked without any for a minute (more for slow
 * configs: delay_us, guest_work, source remote) fails with UKVM_ERR_TIMEOUT.
 */
int ukvm_experiment_finish(struct ukvm_experiment *exp, struct ukvm_result *res,
			   struct ukvm_error *err);

/*
 * Can this host run cfg? Builds the VM, the memory and the uffds and
 * registers them, runs nothing, releases everything: 0, or the error the
 * run would have met while setting up (kind UKVM_ERR_HOST for a missing
 * capability). Like ukvm_experiment_start(), it first waits (a bounded
 * while) for earlier failed runs to release their memory.
 */
int ukvm_probe(const struct ukvm_config *cfg, struct ukvm_error *err);

/*
 * Waits until every earlier experiment has released all of its threads, fds
 * and memory, timeout_ns at most: 0, or -ETIMEDOUT with err saying which
 * one still holds on (a thread that would not stop, named).
 */
int ukvm_wait_idle_for(uint64_t timeout_ns, struct ukvm_error *err);
/* ukvm_wait_idle_for() with a timeout of 10 s and no error. */
void ukvm_wait_idle(void);

/*
 * Writes a snapshot file for source file: size bytes (a multiple of 8)
 * whose every 8-byte word is a seeded function of (seed, its offset), so
 * that each page differs from every other and from the synthetic fill.
 * 0, or -errno with err set.
 */
int ukvm_snapshot_write(const char *path, uint64_t size, uint64_t seed, struct ukvm_error *err);

/* start + finish in one call, for C programs. */
int ukvm_run(const struct ukvm_config *cfg, struct ukvm_result *res,
	     struct ukvm_error *err);

const char *ukvm_backing_name(enum ukvm_backing b);
const char *ukvm_uffd_mode_name(enum ukvm_uffd_mode m);
const char *ukvm_wait_name(enum ukvm_wait w);
const char *ukvm_resolver_name(enum ukvm_resolver r);
const char *ukvm_pattern_name(enum ukvm_pattern p);
const char *ukvm_prefetch_name(enum ukvm_prefetch p);
/* The page size faults on this backing are resolved at. */
uint64_t ukvm_backing_page_size(enum ukvm_backing b);

/*
 * ---- The page server (csrc/remote/) ----
 *
 * A process of its own (uffdkvm/pageserver.py starts it) serves byte
 * ranges of a snapshot file over a Unix or TCP socket, with a model of a
 * remote source on its side: a latency per request, one link of a given
 * bandwidth, a cap on requests in flight, faults (URGENT) ahead of
 * background requests. The wire protocol: csrc/remote/protocol.h; the
 * model: csrc/remote/server.c; the client readers use: csrc/remote/client.h.
 */
struct ukvm_pageserver_config {
	const char *snapshot_path;	/* the file served, opened read-only */
	const char *listen;		/* "unix:/path" or "tcp:HOST:PORT" (0: any free port) */
	uint64_t latency_ns;		/* from a request taking its slot to its reply being ready */
	uint64_t bandwidth_mbps;	/* megabits (10^6 bits) per second, 0 = unlimited */
	uint32_t max_inflight;		/* requests served at once, 0 = no cap */
};

/*
 * The server's counters since it started (a STATS reply carries them).
 * Queue time is what a request waited beyond its latency: for an inflight
 * slot, then for the link.
 */
struct ukvm_remote_stats {
	uint64_t requests;		/* page requests read (STATS not counted) */
	uint64_t urgent;		/* of those, URGENT (a fault waits) */
	uint64_t background;		/* of those, not */
	uint64_t served;		/* replies put on the link */
	uint64_t errors;		/* requests refused (bad length, past the end) */
	uint64_t bytes;			/* payload bytes served */
	uint64_t queue_ns_total;	/* summed over served requests */
	uint64_t queue_ns_max;
	uint64_t connections;		/* accepted since the start */
	uint64_t dropped;		/* requests whose connection closed before the reply */
	uint64_t stats_requests;
};

/*
 * Binds and listens, writes one line "ready ADDRESS\n" to ready_fd (if >= 0;
 * a TCP port 0 replaced by the real one), then serves until SIGTERM or
 * SIGINT (blocked in the calling thread meanwhile and taken through a
 * signalfd: call it from the process's only thread) or until stop_fd (if
 * >= 0: the server's stdin) polls readable or hung up, so that a server
 * whose parent dies follows it. A Unix socket file it made is unlinked on
 * the way out. stats (may be NULL) gets the final counters.
 * 0 after a stop, or -errno with err set.
 */
int ukvm_pageserver_serve(const struct ukvm_pageserver_config *cfg, int ready_fd, int stop_fd,
			  struct ukvm_remote_stats *stats, struct ukvm_error *err);

#ifdef UKVM_TEST_HOOKS
/*
 * For the Python tests of the client (csrc/remote/client.h): connect to
 * address, fetch len bytes at offset into dst, close. timeout_ns bounds
 * the fetch; the return is the fetch's (0 or -errno, err set).
 */
int ukvm_remote_fetch_once(const char *address, uint64_t offset, uint64_t len, bool urgent,
			   void *dst, uint64_t timeout_ns, struct ukvm_error *err);
#endif

#ifdef __cplusplus
}
#endif
#endif /* UKVM_H */
