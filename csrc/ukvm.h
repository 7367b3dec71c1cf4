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

/*
 * The config's enums (enum ukvm_backing, ukvm_uffd_mode, ukvm_resolver,
 * ukvm_wait, ukvm_pattern, ukvm_resolve, ukvm_delay_dist, ukvm_stats,
 * ukvm_source_kind, ukvm_source_read, ukvm_source_cache, ukvm_access,
 * ukvm_prefetch), struct ukvm_config's members, their defaults, ranges and
 * the rules of which field applies when, and the limits the core and Python
 * share (UKVM_MAX_READ_BATCH, UKVM_SOURCE_PATH_MAX, ...) are declared once,
 * in uffdkvm/schema/fields.py, and generated into config_schema.h
 * (python tools/gen_schema.py --write). What the values mean:
 *
 * backing: anonymous (private, THP off: 4 KiB), shmem (memfd, mapped twice:
 *   guest + alias), anonymous_thp (MADV_HUGEPAGE: 2 MiB), anonymous_hugetlb
 *   (2 MiB), anonymous_hugetlb_1gb, shared_hugetlb (hugetlbfs memfd, mapped
 *   twice: 2 MiB), guest_memfd (KVM_CREATE_GUEST_MEMFD, mmap'ed: 4 KiB).
 * uffd_mode: none (the kernel pages memory in), missing (UFFDIO_COPY),
 *   minor (page cache prefilled; UFFDIO_CONTINUE), wp (write-protect,
 *   QEMU's background snapshot: the region is filled and write-protected
 *   before the vCPUs start; the guest's first write to a page faults
 *   (UFFD_PAGEFAULT_FLAG_WP), the resolver copies the page's old contents
 *   into the snapshot and un-protects it (UFFDIO_WRITEPROTECT mode 0, which
 *   wakes the vCPU); reads never fault; 4 KiB backings only).
 * resolver: readers (threads that read the uffd's messages while the
 *   faulting vCPU thread sleeps in the kernel) or vcpu (the uffd is opened
 *   with UFFD_FEATURE_SIGBUS, so a fault is not queued: KVM_RUN returns to
 *   the vCPU's own thread, as KVM_EXIT_MEMORY_FAULT or, where KVM emulated
 *   the access, an MMIO exit at the page's address, and the thread resolves
 *   the page and runs on).
 * wait: poll(2) on the shared uffd; own epoll set, plain EPOLLIN; own epoll
 *   set, EPOLLIN|EPOLLEXCLUSIVE; blocking read(2); spin (non-blocking read(2)
 *   in a loop: never sleeps); io_uring (a read of the uffd in flight in the
 *   reader's own ring; needs a build with liburing).
 * pattern random: a seeded permutation, every page once a pass.
 * access: uniform (every touched page once), zipf (`accesses` Zipf(zipf_theta)
 *   draws over the touched pages).
 * resolve: copy (UFFDIO_COPY of known data), zeropage, move (UFFDIO_MOVE of
 *   a staged page: Linux 6.8+, anonymous).
 * delay_dist: fixed (delay_us), uniform on [0, 2 * delay_us], exponential
 *   with mean delay_us.
 * source (uffd_mode missing, resolve copy or move): the synthetic fill, a
 *   snapshot file that maps onto the region byte for byte (region offset o
 *   is file offset o; see ukvm_snapshot_write), or a page server serving
 *   such a file (source_address; the caller starts it:
 *   uffdkvm/pages/server.py). source_read: pread(2) from an fd, or memcpy from
 *   a read-only MAP_SHARED mapping; source_cache: warm (read through once)
 *   or cold (written back and dropped, POSIX_FADV_DONTNEED).
 * prefetch (uffd_mode missing, resolve copy): pages installed before the
 *   guest asks, with UFFDIO_COPY_MODE_DONTWAKE (a vCPU already waiting on
 *   such a page is woken by the reader that then reads its fault and finds
 *   the page there: EEXIST, then UFFDIO_WAKE): readahead (after each fault,
 *   the next prefetch_pages of its uffd), background (a pusher thread
 *   installs the region in address order), replay (the pusher installs
 *   replay[] in that order).
 * stats: full (timestamps per fault: latency, attribution, blocktime) or
 *   basic (counters only: nothing on the hot path but increments).
 */
#include "config_schema.h"
#include "result_schema.h"

/* How guest TSC stamps became host CLOCK_MONOTONIC times (guest_timing). */
enum ukvm_clock_sync {
	UKVM_CLOCK_SYNC_NONE = 0,	/* not converted: the stages are unknown */
	UKVM_CLOCK_SYNC_KVM_OFFSET,	/* KVM's TSC offset, confirmed by the sync exits */
	UKVM_CLOCK_SYNC_EXITS,		/* the offset bracketed by sync exits alone */
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
	UKVM_FAULT_RECORD_MEMBERS
};

/*
 * One experiment's config. Its members are declared in uffdkvm/schema/fields.py (a
 * field's kind, default, range, what it means and when it applies) and
 * generated into config_schema.h's UKVM_CONFIG_MEMBERS; ukvm_config_init()
 * sets the schema's defaults. The ones that need a word more:
 * mem_per_vcpu is bytes, a multiple of the backing's and the guest's page
 * size; guest_page_size how the guest maps the region (4 KiB, 2 MiB, 1 GiB);
 * pins: host CPUs for vCPU i and reader k, pins[i % nr] (copied at start);
 * timeout_ns 0: no limit; zipf_theta and accesses 0: unset (accesses 0:
 * the touched pages' count); replay: page indices from the region's start
 * in install order, no repeats (copied at start); source_path and
 * source_address are copied with the config; read_batch above 1 makes a
 * reader read again while reads come back full (UKVM_READS_PER_WAKEUP at
 * most); wp_async: UFFD_FEATURE_WP_ASYNC (Linux 6.7+), no fault delivered,
 * PAGEMAP_SCAN collects the pages written (ukvm_result.dirty_pages).
 */
struct ukvm_config {
	UKVM_CONFIG_MEMBERS
#ifdef UKVM_TEST_HOOKS
	UKVM_TEST_CONFIG_FIELDS		/* testhooks.h: fault injection, test builds only */
#endif
};

struct ukvm_error;

/* The schema's defaults (config_schema.h). */
void ukvm_config_init(struct ukvm_config *cfg);
/*
 * The one validator (experiment/config.c), pure: 0, or -EINVAL with a
 * UKVM_ERR_CONFIG error whose message starts with the field's name as
 * Python spells it ("readers: ..."). ukvm_experiment_start() and
 * ukvm_probe() call it first; what the host or build lacks they say after.
 */
int ukvm_config_validate(const struct ukvm_config *cfg, struct ukvm_error *err);

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

/*
 * The result structs' members (the fault record above and the structs
 * below) are declared once, in uffdkvm/schema/results.py (a value's C type,
 * unit, meaning and when it is measured), and generated into
 * result_schema.h (python tools/gen_schema.py --write): UKVM_<STRUCT>_MEMBERS,
 * whose comments say what each means, and the tables by which the binding
 * (csrc/python/result.c) hands each one over under its own name, the name
 * of its Python field (uffdkvm/result.py). The one conversion is a unit: a
 * duration X_ns here is X_seconds in Python (X_ns / 1e9); a time stamp
 * (CLOCK_MONOTONIC) keeps its _ns. UKVM_RESULT_NONE marks a counter the run
 * could not measure: None in Python.
 */
#define UKVM_RESULT_NONE	UINT64_MAX

/* One vCPU: its thread, its faults (stats full), the guest's own timing (guest_timing). */
struct ukvm_vcpu_result {
	UKVM_VCPU_RESULT_MEMBERS
};

/* One reader: every counter is kept by the reader thread itself and kept on every exit. */
struct ukvm_reader_result {
	UKVM_READER_RESULT_MEMBERS
};

/*
 * dirty_tracking: one tracked pass (experiment/dirty.c), iteration i being
 * pass i + 1 (pass 1 populates). The vCPUs wait at each pass's end while the
 * host harvests and re-protects, as dirty_log_perf_test's do.
 */
struct ukvm_dirty_pass {
	UKVM_DIRTY_PASS_MEMBERS
};

/*
 * migration: one pre-copy round of the source (experiment/migrate.c), its
 * vCPUs running. Round 1 sends every page; each later round sends what the
 * tracker found dirty during the round before.
 */
struct ukvm_migration_round {
	UKVM_MIGRATION_ROUND_MEMBERS
};

/*
 * The run: its windows, the readers' sums (collect.c), the per-thread
 * arrays (each beside its count), KVM's statistics, dirty tracking,
 * migration, prefetch and verification.
 */
struct ukvm_result {
	UKVM_RESULT_MEMBERS
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
/*
 * The config the experiment runs, as the core holds it (its own copy, the
 * lists included): valid from ukvm_experiment_start() until
 * ukvm_experiment_finish().
 */
const struct ukvm_config *ukvm_experiment_config(const struct ukvm_experiment *exp);

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
 * The threads a run of cfg starts, besides the caller's (the controller,
 * the vCPUs, the readers, the pusher), counted from the shapes the run
 * builds; why: what they are, for a message. Each counts against the pids
 * cgroup and RLIMIT_NPROC, which the Python layer checks before a run.
 */
uint64_t ukvm_threads_needed(const struct ukvm_config *cfg, char *why, size_t why_len);

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

/* ukvm_backing_name() ...: each config enum's value by name ("?" if none). */
#define UKVM_NAME_DECL(type, field, prefix) const char *ukvm_##type##_name(enum ukvm_##type v);
UKVM_CONFIG_ENUMS(UKVM_NAME_DECL)
#undef UKVM_NAME_DECL
/* The page size faults on this backing are resolved at. */
uint64_t ukvm_backing_page_size(enum ukvm_backing b);

/*
 * ---- The page server (csrc/remote/) ----
 *
 * A process of its own (uffdkvm/pages/server.py starts it) serves byte
 * ranges of a snapshot file over a Unix or TCP socket, with a model of a
 * remote source on its side: a latency per request, one link of a given
 * bandwidth, a cap on requests in flight, faults (URGENT) ahead of
 * background requests. The wire protocol, defined in one place:
 * csrc/remote/protocol.h; the model: csrc/remote/model.c; the sockets and
 * the loop: csrc/remote/server.c; the client: csrc/remote/client.c.
 */
struct ukvm_pageserver_config {
	const char *snapshot_path;	/* the file served, opened read-only */
	const char *listen;		/* "unix:/path" or "tcp:HOST:PORT" (0: any free port) */
	/*
	 * The key every client must prove it holds (ukvm_remote_key_load's
	 * file), or NULL: then only a Unix socket, whose peers are checked by
	 * uid (SO_PEERCRED: the server's own, or root). A TCP server needs one.
	 */
	const char *key_file;
	uint64_t handshake_timeout_ns;	/* a new connection's handshake, at most (0: 5 s) */
	uint64_t latency_ns;		/* from a request taking its slot to its reply being ready */
	uint64_t bandwidth_mbps;	/* megabits (10^6 bits) per second, 0 = unlimited */
	uint32_t max_inflight;		/* requests served at once, 0 = no cap */
};

/*
 * The server's counters since it started, the one list of them: the
 * struct below, a STATS reply's payload (protocol.h: one u64 each, in this
 * order), the binding's dict and _core.REMOTE_STATS_FIELDS (which
 * uffdkvm/pages/server.py reads) are all built from it.
 * X(name, meaning). Queue time is what a request waited beyond its
 * latency: for an inflight slot, then for the link.
 */
#define UKVM_REMOTE_STATS_FIELDS(X) \
	X(requests,       "page requests read (STATS requests not counted)") \
	X(urgent,         "of those, URGENT: a fault waited for them") \
	X(background,     "of those, background (prefetch)") \
	X(served,         "replies put on the link") \
	X(errors,         "requests refused (bad length or flags, past the end)") \
	X(bytes,          "payload bytes served") \
	X(queue_ns_total, "queue time summed over served requests, in ns") \
	X(queue_ns_max,   "the longest queue time of a served request, in ns") \
	X(connections,    "connections accepted since the start") \
	X(dropped,        "requests whose connection closed before the reply") \
	X(stats_requests, "STATS requests answered") \
	X(refused,        "connections refused: no key or a wrong one, a bad or late " \
			  "handshake, closed in its handshake for a newer connection, " \
			  "a Unix peer of another uid")

struct ukvm_remote_stats {
#define UKVM_REMOTE_STATS_MEMBER(name, meaning) uint64_t name;
	UKVM_REMOTE_STATS_FIELDS(UKVM_REMOTE_STATS_MEMBER)
#undef UKVM_REMOTE_STATS_MEMBER
};

/*
 * The one check of a page server's limits (UKVM_MAX_REMOTE_LATENCY_US,
 * UKVM_MAX_REMOTE_BANDWIDTH_MBPS, UKVM_MAX_INFLIGHT): 0, or -EINVAL with a
 * UKVM_ERR_CONFIG error whose message starts with the field's name as
 * uffdkvm.PageServer spells it ("latency_us: ..."). ukvm_pageserver_serve()
 * calls it first.
 */
int ukvm_pageserver_check(const struct ukvm_pageserver_config *cfg, struct ukvm_error *err);

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

/*
 * A page server's client for callers above the core: the binding's
 * PageClient (uffdkvm/pages/server.py speaks the protocol only through
 * these, so it has no wire format of its own). The same client the
 * readers use (csrc/remote/client.h: its returns), with a timeout per call
 * instead of a deadline and err filled on every failure. One connection,
 * one thread at a time.
 */
struct ukvm_remote_conn;

/* The longest range one request may ask for (protocol.h): 1 GiB, a guest's largest page. */
#define UKVM_REMOTE_MAX_LENGTH	(1u << 30)

/* One range of the snapshot a request asks for. */
struct ukvm_remote_range {
	uint64_t offset;
	uint64_t length;		/* 1..UKVM_REMOTE_MAX_LENGTH */
};

/* A reply taken by ukvm_remote_recv_for(). */
struct ukvm_remote_answer {
	uint64_t offset;		/* the request's */
	uint64_t length;		/* payload bytes in dst (0 when status is set) */
	bool urgent;			/* the request's URGENT flag */
	int32_t status;			/* 0, or the server's refusal: -EINVAL, -ERANGE */
};

/*
 * A page server's key: 32 to 64 bytes, from a file of 64 to 128 hex digits
 * (whitespace at its end ignored) that is a regular file of its owner's
 * (the effective uid's) with no group or other permission bits (0600 or
 * 0400). load: 0, or -errno with err (UKVM_ERR_CONFIG, its message
 * starting with "FIELD: ", field naming where the path came from, e.g.
 * "source_key_file", and saying what to do: chmod 600 PATH).
 * A key proves itself by HMAC-SHA256 (OpenSSL's libcrypto) and never goes on
 * the wire (csrc/remote/protocol.h: the handshake).
 */
#define UKVM_REMOTE_KEY_MIN	32
#define UKVM_REMOTE_KEY_MAX	64
struct ukvm_remote_key {
	uint32_t len;			/* 0: no key */
	uint8_t bytes[UKVM_REMOTE_KEY_MAX];
};
int ukvm_remote_key_load(const char *path, const char *field, struct ukvm_remote_key *key,
			 struct ukvm_error *err);
/* Whether this build checks keys (built with libcrypto: UKVM_HAVE_LIBCRYPTO). */
bool ukvm_remote_auth_available(void);

/*
 * address: "unix:/path" or "tcp:HOST:PORT"; key: the server's, or NULL (a
 * Unix socket's server without one). Connects, then the handshake: both
 * sides prove they hold the key. 0 and *out, or -errno with err set naming
 * the address: -EACCES for a key refused or missing, -EKEYREJECTED for a
 * server that could not prove it holds the key.
 */
int ukvm_remote_connect(const char *address, const struct ukvm_remote_key *key,
			struct ukvm_remote_conn **out, struct ukvm_error *err);
void ukvm_remote_close(struct ukvm_remote_conn *c);
/* Requests sent and whose replies are not yet taken by recv. */
uint32_t ukvm_remote_outstanding(const struct ukvm_remote_conn *c);
/*
 * fetch: len bytes at offset into dst (one request, its reply; the
 * server's refusal is its -errno). send: n requests in one write (every
 * length checked first), no wait for their replies. recv: the next reply (in the order served), whole, its payload
 * into dst (dst_len at least the longest length asked). stats: the
 * server's counters. Each waits timeout_ns at most (-ETIMEDOUT); 0, or
 * -errno with err naming the call and what the return means.
 */
int ukvm_remote_fetch_for(struct ukvm_remote_conn *c, uint64_t offset, uint64_t len,
			  bool urgent, void *dst, uint64_t timeout_ns, struct ukvm_error *err);
int ukvm_remote_send_for(struct ukvm_remote_conn *c, const struct ukvm_remote_range *ranges,
			 uint32_t n, bool urgent, uint64_t timeout_ns, struct ukvm_error *err);
int ukvm_remote_recv_for(struct ukvm_remote_conn *c, struct ukvm_remote_answer *answer,
			 void *dst, uint64_t dst_len, uint64_t timeout_ns,
			 struct ukvm_error *err);
int ukvm_remote_stats_for(struct ukvm_remote_conn *c, struct ukvm_remote_stats *stats,
			  uint64_t timeout_ns, struct ukvm_error *err);

#ifdef __cplusplus
}
#endif
#endif /* UKVM_H */
