/* SPDX-License-Identifier: MIT */
/*
 * Shared by the core's files, not part of the public interface.
 *
 * Ownership: struct ukvm_experiment (experiment.c) owns one ukvm_vm, one
 * ukvm_backing, the vCPUs and the reader pools; each of those has a
 * create/destroy pair, and destroy is safe on a zeroed or half-built object,
 * so every error path can call it; a pool's destroy refuses (-EBUSY) while
 * one of its readers still runs, and teardown waits until none does.
 */
#ifndef UKVM_INTERNAL_H
#define UKVM_INTERNAL_H

#include <linux/kvm.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>

#include "tsc.h"
#include "ukvm.h"

#define UKVM_PAGE_SIZE		4096ULL
#define UKVM_CACHELINE		64
#define ALIGN_UP(x, a)		(((x) + (a) - 1) / (a) * (a))
#define ARRAY_SIZE(a)		(sizeof(a) / sizeof((a)[0]))
#define NSEC_PER_SEC		1000000000ULL
#define NSEC_PER_MSEC		1000000ULL

/* ---- util.c ---- */
uint64_t ukvm_now_ns(void);
void ukvm_sleep_ns(uint64_t ns);
/* Sets err once: the first error explains the failure; later ones are echoes. */
void ukvm_err_set(struct ukvm_error *err, enum ukvm_error_kind kind, int errnum,
		  const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void ukvm_err_vset(struct ukvm_error *err, enum ukvm_error_kind kind, int errnum,
		   const char *fmt, va_list ap);
/* "call: strerror (ENAME). hint": for failures the user can act on. */
void ukvm_err_set_hint(struct ukvm_error *err, enum ukvm_error_kind kind, int errnum,
		       const char *call, const char *hint_fmt, ...)
	__attribute__((format(printf, 5, 6)));
/* An ioctl that retries on EINTR; returns its result, -1 with errno on failure. */
int ukvm_ioctl(int fd, unsigned long req, void *arg);

/* splitmix64: seeds and cheap per-thread random numbers, no shared state. */
static inline uint64_t ukvm_splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* A uniform double in [0, 1). */
static inline double ukvm_random_unit(uint64_t *state)
{
	return (double)(ukvm_splitmix64(state) >> 11) * 0x1.0p-53;
}

/* Pins the calling thread to cpu (if >= 0); records the affinity it then has, pinned or not. */
int ukvm_thread_pin(int cpu, uint64_t affinity[16]);

/* ---- hist.c ---- */
unsigned ukvm_hist_bucket(uint64_t v);
void ukvm_hist_add(struct ukvm_hist *h, uint64_t v);
void ukvm_hist_merge(struct ukvm_hist *dst, const struct ukvm_hist *src);

/* ---- kick.c: the private signal that interrupts KVM_RUN and read(2) ---- */
int ukvm_kick_init(struct ukvm_error *err);
int ukvm_kick_signal(void);
/*
 * Called first by every thread the core starts: block all signals but the
 * kick and the synchronous ones (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP,
 * SIGSYS, SIGABRT), which must reach their handlers.
 */
void ukvm_thread_signals_init(void);
/* The controller's own mask, inherited by the threads it makes: the same, kick blocked too. */
void ukvm_block_all_signals(sigset_t *old);

/* ---- ctl: the coordination shared by the controller and its threads ---- */
struct ukvm_ctl {
	pthread_mutex_t lock;
	pthread_cond_t cond;		/* signalled on every change below */
	int go;				/* 0 wait, 1 run, -1 give up */
	uint32_t vcpus_running;
	bool failed;
	bool cancelled;
	struct ukvm_error error;	/* the first failure */
	atomic_bool stop;		/* every thread: leave now */
	atomic_bool abort;		/* the experiment failed or was cancelled */
	/* Test-only fault injection (ukvm.h): what, when, and how far along. */
	enum ukvm_inject inject;
	uint64_t inject_after;
	atomic_uint_fast64_t inject_count;
};

/* True once per run: when the inject_after-th event of this kind happens. */
static inline bool ukvm_ctl_inject(struct ukvm_ctl *ctl, enum ukvm_inject kind)
{
	if (__builtin_expect(ctl->inject != kind, 1))
		return false;
	return atomic_fetch_add(&ctl->inject_count, 1) + 1 == ctl->inject_after;
}

/* pthread_create, and the place where UKVM_INJECT_THREAD_CREATE strikes. */
int ukvm_thread_create(struct ukvm_ctl *ctl, pthread_t *thread, size_t stack_bytes,
		       void *(*fn)(void *), void *arg);

int ukvm_config_validate(const struct ukvm_config *c, struct ukvm_error *err);

int ukvm_ctl_init(struct ukvm_ctl *ctl);
void ukvm_ctl_destroy(struct ukvm_ctl *ctl);
/* Records the first failure, raises stop and wakes the controller. */
void ukvm_ctl_fail(struct ukvm_ctl *ctl, enum ukvm_error_kind kind, int errnum,
		   const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static inline bool ukvm_ctl_stopping(struct ukvm_ctl *ctl)
{
	return atomic_load_explicit(&ctl->stop, memory_order_relaxed);
}
static inline bool ukvm_ctl_aborted(struct ukvm_ctl *ctl)
{
	return atomic_load_explicit(&ctl->abort, memory_order_relaxed);
}
/* Under ctl->lock: record err as the failure unless one came first; stop and abort. */
void ukvm_ctl_fail_locked(struct ukvm_ctl *ctl, const struct ukvm_error *err);
/*
 * A failure found while stopping (a thread that would not stop): the run's
 * failure (UKVM_ERR_RUN) if none came first, else appended to the first
 * one's message ("...; then ..."), so that neither is lost.
 */
void ukvm_ctl_fail_or_append(struct ukvm_ctl *ctl, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/*
 * What a core thread is doing, kept by the thread itself, so that one that
 * would not stop can be named with where it was. done is the thread's last
 * store before it returns: once it is set, pthread_join() does not wait.
 */
struct ukvm_thread_state {
	_Atomic(const char *) where;	/* a string literal */
	atomic_int tid;
	atomic_bool done;
};

static inline void ukvm_thread_at(struct ukvm_thread_state *st, const char *where)
{
	atomic_store_explicit(&st->where, where, memory_order_relaxed);
}
/* Records the calling thread's id in st. */
void ukvm_thread_start(struct ukvm_thread_state *st);
/*
 * "it was <where> (thread <tid>: <syscall>, in the kernel at <wchan>)": the
 * thread's own words and what /proc/self/task/<tid> says of it.
 */
void ukvm_thread_describe(struct ukvm_thread_state *st, char *buf, size_t len);
/* UKVM_INJECT_*_STALL: stays ms milliseconds, whatever kicks or stop say. */
void ukvm_thread_stall(struct ukvm_thread_state *st, uint64_t ms);

/* ---- vm.c: the VM, its memslots, page tables, GDT and IDT ---- */
struct ukvm_vm {
	int kvm_fd;
	int vm_fd;
	int run_mmap_size;
	struct kvm_cpuid2 *cpuid;
	uint32_t max_vcpus;		/* KVM_CAP_MAX_VCPUS of /dev/kvm */
	uint32_t phys_bits;		/* guest physical address width */
	bool gbpages;			/* 1 GiB guest pages allowed */
	uint8_t *sys_hva;		/* the system memslot at GPA 0 */
	uint64_t sys_size;
	uint64_t sys_next;		/* bump allocator within it */
	uint64_t pml4_gpa;
	uint64_t gdt_gpa;
	uint64_t idt_gpa;
	uint64_t tss_gpa;
	uint64_t code_gpa;
	uint32_t nr_slots;
	uint64_t *pt_cache;		/* last page table written, see vm_map_page() */
	uint64_t pt_cache_base;
};

#define UKVM_GDT_CODE	0x08
#define UKVM_GDT_DATA	0x10
#define UKVM_GDT_TSS	0x18

/* Puts vm in the empty state that ukvm_vm_destroy() accepts. */
void ukvm_vm_init(struct ukvm_vm *vm);
/* Opens /dev/kvm and reads max_vcpus; builds nothing else. */
int ukvm_vm_open(struct ukvm_vm *vm, struct ukvm_error *err);
/* sys_size: bytes for the system memslot, from ukvm_vm_sys_size(); opens /dev/kvm if needed. */
int ukvm_vm_create(struct ukvm_vm *vm, uint64_t sys_size, struct ukvm_error *err);
void ukvm_vm_destroy(struct ukvm_vm *vm);
/* extra_bytes: more for ukvm_vm_alloc() (the guest's access logs, say). */
uint64_t ukvm_vm_sys_size(uint32_t vcpus, uint64_t region_bytes, uint64_t extra_bytes);
int ukvm_vm_alloc(struct ukvm_vm *vm, uint64_t bytes, uint64_t *gpa, struct ukvm_error *err);
void *ukvm_vm_sys_hva(struct ukvm_vm *vm, uint64_t gpa);
int ukvm_vm_add_memslot(struct ukvm_vm *vm, uint64_t gpa, uint64_t size, void *hva,
			struct ukvm_error *err);
/* A memslot whose memory is a guest_memfd (hva: its mmap, for the host's access). */
int ukvm_vm_add_gmem_memslot(struct ukvm_vm *vm, uint64_t gpa, uint64_t size, void *hva,
			     int gmem_fd, struct ukvm_error *err);
/* Identity-maps [gpa, gpa + size) in the guest page tables with page_size pages. */
int ukvm_vm_map(struct ukvm_vm *vm, uint64_t gpa, uint64_t size, uint64_t page_size,
		struct ukvm_error *err);
/* The guest page-table entry that maps gva (any level), or NULL. */
uint64_t *ukvm_vm_leaf_pte(struct ukvm_vm *vm, uint64_t gva);

/* ---- vcpu.c ---- */
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
	bool done;
	uint64_t *pass_end_ns;		/* one per pass, freed by destroy */
	uint64_t passes;
	uint64_t passes_seen;
	int cpu;			/* pinned to, or -1 */
	uint64_t affinity[16];
	uint64_t cpu_ns;
	/* The thread around ukvm_vcpu_thread() (execute.c): its state, and stop waits on done. */
	struct ukvm_thread_state state;
	uint64_t stall_ms;		/* UKVM_INJECT_VCPU_STALL, for this vCPU */
	/* guest_timing: the guest's access log, and its TSC bracketed at sync exits */
	bool timing;
	uint64_t log_gpa;
	uint64_t log_entries;		/* first-pass pages, plus the spare slot */
	struct ukvm_tsc_bracket tsc_bracket;		/* before the walk */
	struct ukvm_tsc_bracket tsc_bracket_after;	/* after it */
	uint64_t tsc_bias;		/* UKVM_INJECT_TSC_OFFSET: added to every guest TSC read */
};

void ukvm_vcpu_init(struct ukvm_vcpu *vcpu);

int ukvm_vcpu_create(struct ukvm_vm *vm, struct ukvm_vcpu *vcpu, uint32_t index,
		     uint64_t args_gpa, uint64_t stack_top_gpa, struct ukvm_error *err);
void ukvm_vcpu_destroy(struct ukvm_vcpu *vcpu);
void *ukvm_vcpu_thread(void *arg);
/* KVM's TSC offset of the vCPU (guest TSC - host TSC): 0, or -1 where KVM does not say. */
int ukvm_vcpu_tsc_offset(struct ukvm_vcpu *vcpu, int64_t *offset);
/* Makes a running vCPU leave KVM_RUN soon; call repeatedly until it exits. */
void ukvm_vcpu_kick(struct ukvm_vcpu *vcpu);

/* ---- backing.c: the memory behind the test region ---- */
struct ukvm_mem {
	enum ukvm_backing kind;
	int memfd;			/* shared backings; -1 otherwise */
	uint8_t *hva;			/* the guest's mapping */
	uint8_t *alias;			/* second mapping of the memfd, or NULL */
	uint64_t size;
	uint64_t page_size;		/* the backing's page size */
};

void ukvm_mem_init(struct ukvm_mem *b);
/* Before anything is built: are there enough huge pages for size bytes? */
int ukvm_mem_check_host(enum ukvm_backing kind, uint64_t size, struct ukvm_error *err);
/* vm_fd: the VM a guest_memfd belongs to (ignored for other kinds). */
int ukvm_mem_create(struct ukvm_mem *b, enum ukvm_backing kind, uint64_t size, int vm_fd,
		    struct ukvm_error *err);
void ukvm_mem_destroy(struct ukvm_mem *b);
bool ukvm_backing_is_shared(enum ukvm_backing kind);
bool ukvm_backing_is_hugetlb(enum ukvm_backing kind);

/* ---- pattern.c: what every page must hold ---- */
/*
 * A page resolved with data (UFFDIO_COPY, or the page cache a MINOR run
 * prefills) holds, per 4 KiB at guest physical address gpa:
 *   word 0: ~gpa, word 1: gpa, word 2: 0, word i >= 3: UKVM_FILL_WORD(i).
 * Words 0 and 1 tie the page to its address; the rest catch corruption.
 */
#define UKVM_FILL_BASE		0xa5c3a5c3a5c3a5c3ULL
#define UKVM_FILL_WORD(i)	(UKVM_FILL_BASE ^ (uint64_t)(i))
void ukvm_fill_template(void *dst, uint64_t len);
/* Writes the address-dependent words of every 4 KiB page of dst. */
void ukvm_fill_stamp(void *dst, uint64_t len, uint64_t gpa);
/* Template and stamps at once: what a prefill writes. */
void ukvm_fill_pages(void *dst, uint64_t len, uint64_t gpa);

/* ---- uffd.c ---- */
int ukvm_uffd_open(bool nonblock, uint64_t features, struct ukvm_error *err);
int ukvm_uffd_features(uint64_t *features, struct ukvm_error *err);
int ukvm_uffd_register(int uffd, void *addr, uint64_t len, enum ukvm_uffd_mode mode,
		       enum ukvm_backing backing, struct ukvm_error *err);
/*
 * The calling thread's run and name ("reader 2 of uffd 0"): its resolving
 * ioctls give up early once that run is aborted, and one that keeps failing
 * with EAGAIN is recorded as the run's failure, named.
 */
void ukvm_uffd_thread_init(struct ukvm_ctl *ctl, const char *who);
/*
 * 0 resolved here, 1 already resolved by another (EEXIST), -errno on
 * failure. EAGAIN and EINTR are retried with backoff, for 1 s at most.
 */
int ukvm_uffd_copy(int uffd, uint64_t dst, const void *src, uint64_t len);
int ukvm_uffd_continue(int uffd, uint64_t addr, uint64_t len);
int ukvm_uffd_zeropage(int uffd, uint64_t addr, uint64_t len);

/* ---- readers.c: pools of threads resolving one uffd's faults ---- */
struct ukvm_pool;

/*
 * What UFFDIO_COPY copies from. A page must be whole when the copy makes it
 * present: a vCPU may read it that very moment (a faulting vCPU that finds
 * the page already mapped does not wait for a wake, and with overlap any
 * vCPU may touch it). So the data, address words included, goes in with
 * the copy. Each reader stamps a source of its own for pages up to
 * UKVM_READER_SRC_MAX (4 KiB: anonymous memory; 2 MiB: a memfd named
 * "uffdkvm-reader-source" in /proc/PID/maps); 1 GiB pages, too large for
 * one per reader, share one buffer per uffd ("uffdkvm-source"), stamped
 * and copied under a lock: the readers of one uffd take turns with it,
 * those of different uffds (different vCPUs' memory) do not wait for each
 * other. All of it is ordinary memory whatever
 * the backing, and uffdkvm/run.py counts it in its memory check.
 */
#define UKVM_READER_SRC_MAX	(2ULL << 20)

struct ukvm_source {
	uint64_t page_size;
	uint8_t *buffer;		/* stamped per fault, under lock */
	pthread_mutex_t lock;
	bool lock_made;
};


struct ukvm_reader {
	struct ukvm_pool *pool;
	uint32_t index;
	pthread_t thread;
	bool thread_started;
	atomic_bool exited;
	int epfd;
	uint8_t *src;			/* up to 2 MiB pages: UFFDIO_COPY source, stamped per fault */
	int cpu;			/* pinned to, or -1 */
	uint64_t rng;			/* delay distribution state */
	struct ukvm_thread_state state;	/* where it is, for one that would not stop */
	uint64_t stall_ms;		/* UKVM_INJECT_READER_STALL, for this reader */
	/* stats full: the chunk of the pool's fault log this reader fills (vcpu = tid) */
	struct ukvm_fault_record *rec_next;
	struct ukvm_fault_record *rec_end;
	struct ukvm_reader_result stats;	/* the thread's own; read after join */
} __attribute__((aligned(UKVM_CACHELINE)));

struct ukvm_pool {
	struct ukvm_ctl *ctl;
	uint32_t uffd_index;
	int uffd;
	int stop_fd;			/* eventfd, readable once readers must leave */
	enum ukvm_wait wait;
	enum ukvm_uffd_mode mode;
	uint64_t page_size;
	uint64_t hva_base;		/* the registered range... */
	uint64_t region_size;
	uint64_t gpa_base;		/* ...and its guest physical address */
	uint64_t delay_ns;
	enum ukvm_delay_dist delay_dist;
	enum ukvm_resolve resolve;
	bool full_stats;
	uint64_t seed;
	const int32_t *pins;		/* reader k of all pools runs on pins[k % nr_pins] */
	uint32_t nr_pins;
	uint32_t first_reader;		/* this pool's first reader, counted over all pools */
	/* MISSING with copy, pages above 4 KiB: the experiment's (not owned). */
	struct ukvm_source source;	/* 1 GiB pages: the readers' shared copy source */
	uint32_t nr_readers;
	uint32_t readers_made;		/* entries of readers[] to clean up */
	struct ukvm_reader *readers;
	atomic_bool stop;
	/*
	 * Stats full: every fault record, in chunks of UKVM_LOG_CHUNK that the
	 * readers claim one at a time (one atomic per chunk, no allocation on
	 * the hot path). The mapping is reserved for the most records the pool
	 * can see and touched only as far as it fills; a record whose read_ns
	 * is 0 was never written.
	 */
	uint32_t vcpus_sharing;		/* vCPUs that may fault one page (overlap) */
	struct ukvm_fault_record *log;
	uint64_t log_cap;		/* records */
	atomic_uint_fast64_t log_chunks; /* chunks claimed */
};

#define UKVM_LOG_CHUNK	1024

/* Empty, destroyable state; the caller then fills in the fields above readers. */
void ukvm_pool_init(struct ukvm_pool *pool);
int ukvm_pool_start(struct ukvm_pool *pool, struct ukvm_error *err);
/* Tells every reader to leave (the stop flag and eventfd); returns at once. */
void ukvm_pool_request_stop(struct ukvm_pool *pool);
/*
 * One look, without waiting: joins the readers that have left (their join
 * is prompt) and, with kick, signals the others. Returns how many still run.
 */
uint32_t ukvm_pool_reap(struct ukvm_pool *pool, bool kick);
/*
 * Asks the readers to leave, kicks and joins them until deadline_ns:
 * returns how many still run (not joined). Safe on a pool that never started.
 */
uint32_t ukvm_pool_stop(struct ukvm_pool *pool, uint64_t deadline_ns);
/* The first reader that still runs, or NULL. */
struct ukvm_reader *ukvm_pool_running_reader(struct ukvm_pool *pool);
/*
 * Lets go of the uffd, so that a vCPU waiting on a fault is released: it is
 * closed, or, while a reader still runs and may use its number, replaced
 * by /dev/null until the pool is destroyed.
 */
void ukvm_pool_release_uffd(struct ukvm_pool *pool);
/* Frees everything: 0, or -EBUSY (and nothing freed) while a reader still runs. */
int ukvm_pool_destroy(struct ukvm_pool *pool);

/* ---- kvmstats.c: KVM's binary statistics (KVM_GET_STATS_FD) ---- */
struct ukvm_kvmstats {
	int fd;
	uint32_t nr;			/* descriptors */
	char **names;
	uint32_t *offsets;		/* of each value, in u64s from data_offset */
	uint32_t *sizes;		/* u64s per value (histograms have several) */
	uint32_t *flags;
	uint64_t data_offset;
	uint32_t nr_values;
	uint32_t nr_scalars;		/* statistics of one value... */
	uint32_t *scalars;		/* ...and their descriptor indexes */
	uint64_t *before;		/* the snapshot, nr_values long */
	bool have_before;
};

void ukvm_kvmstats_init(struct ukvm_kvmstats *s);
int ukvm_kvmstats_open(struct ukvm_kvmstats *s, int kvm_obj_fd, const char *what,
		       struct ukvm_error *err);
int ukvm_kvmstats_read(struct ukvm_kvmstats *s, uint64_t *values, struct ukvm_error *err);
int ukvm_kvmstats_snapshot(struct ukvm_kvmstats *s);
/* The scalar statistics (nr_scalars of them) relative to the snapshot. */
int ukvm_kvmstats_deltas(struct ukvm_kvmstats *s, uint64_t *out);
/* Index of a scalar statistic by name, or -1. */
int ukvm_kvmstats_find(const struct ukvm_kvmstats *s, const char *name);
/* A strdup'd copy of the scalar statistics' names, for a result. */
char **ukvm_kvmstats_scalar_names(const struct ukvm_kvmstats *s);
void ukvm_free_names(char **names, uint32_t nr);
void ukvm_kvmstats_close(struct ukvm_kvmstats *s);

/* ---- verify.c ---- */
struct ukvm_verify_params {
	const uint8_t *hva;		/* the region as the guest wrote it */
	uint64_t gpa;			/* its guest physical address */
	uint64_t size;
	bool filled;			/* resolved with data, else zero-filled */
	uint64_t written_visits;	/* what word 2 of every written page holds */
	uint64_t write_pct;
	uint64_t write_key;
};

/*
 * Returns the number of bad pages and describes the first in msg. read_sum
 * gets the sum of word 1 over the pages the guest reads: one pass's checksum.
 */
uint64_t ukvm_verify_region(const struct ukvm_verify_params *p, struct ukvm_ctl *ctl,
			    uint64_t *read_sum, char *msg, size_t msg_len);
bool ukvm_guest_writes_page(uint64_t gpa, uint64_t write_pct, uint64_t write_key);

/* ---- guest.S ---- */
extern const uint8_t ukvm_guest_code_start[];
extern const uint8_t ukvm_guest_code_end[];
extern const uint64_t ukvm_guest_exception_offsets[32];

#endif
