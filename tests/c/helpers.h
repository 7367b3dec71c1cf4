/* SPDX-License-Identifier: MIT */
/*
 * Shared by the C test programs of the core (liburing style: one program
 * per concern; exit 0 pass, 1 fail, 77 skip). Only the public interface,
 * csrc/ukvm.h, is used.
 *
 * A program is a list of cases:
 *
 *	int main(void)
 *	{
 *		ukt_init("wait_modes");		// exits 77 when the host lacks KVM
 *		UKT_CASE("poll") { ... CHECK(...); ... }
 *		return ukt_exit();
 *	}
 *
 * CHECK does not stop the case, so a case always frees what it made and
 * LeakSanitizer stays quiet about tests that failed for another reason.
 */
#ifndef UKVM_TEST_HELPERS_H
#define UKVM_TEST_HELPERS_H

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ukvm.h"

#define T_EXIT_PASS	0
#define T_EXIT_FAIL	1
#define T_EXIT_SKIP	77

#define PAGE		UINT64_C(4096)
#define MiB		(UINT64_C(1) << 20)
#define NSEC_PER_MSEC	UINT64_C(1000000)
#define NSEC_PER_SEC	UINT64_C(1000000000)
#define ARRAY_SIZE(a)	(sizeof(a) / sizeof((a)[0]))

static const char *ukt_program;
static char ukt_case_name[256] = "(setup)";
static unsigned ukt_cases, ukt_case_failures, ukt_failures, ukt_skips;
static bool ukt_case_skipped;
static uint64_t ukt_case_start_ns;

static inline uint64_t ukt_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

/* ---- assertions: report and carry on ---- */

/* A formatted string for CHECK's message, valid until the next call. */
__attribute__((format(printf, 1, 2)))
static inline const char *ukt_fmt(const char *fmt, ...)
{
	static char buf[1536];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	return buf;
}

static inline bool ukt_check(bool ok, const char *file, int line, const char *expr,
			     const char *msg)
{
	if (ok)
		return true;
	ukt_failures++;
	ukt_case_failures++;
	msg += *msg == ' ';	/* ukt_fmt(" " ...): the space keeps the format non-empty */
	fprintf(stderr, "%s:%d: [%s] check failed: %s%s%s\n", file, line, ukt_case_name, expr,
		*msg ? ": " : "", msg);
	return false;
}

/* CHECK(cond) or CHECK(cond, "fmt", args...): true when cond held. */
#define CHECK(cond, ...) \
	ukt_check(!!(cond), __FILE__, __LINE__, #cond, ukt_fmt(" " __VA_ARGS__))
/* Unsigned comparisons that print both sides. */
#define CHECK_OP(a, op, b) ({ \
	unsigned long long _a = (unsigned long long)(a), _b = (unsigned long long)(b); \
	ukt_check(_a op _b, __FILE__, __LINE__, #a " " #op " " #b, \
		  ukt_fmt(" %llu vs %llu", _a, _b)); \
})
#define CHECK_EQ(a, b)	CHECK_OP(a, ==, b)
#define CHECK_LE(a, b)	CHECK_OP(a, <=, b)
#define CHECK_GE(a, b)	CHECK_OP(a, >=, b)
#define CHECK_LT(a, b)	CHECK_OP(a, <, b)

/* ---- cases ---- */

__attribute__((format(printf, 1, 2)))
static inline void ukt_case_begin(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(ukt_case_name, sizeof(ukt_case_name), fmt, ap);
	va_end(ap);
	ukt_case_failures = 0;
	ukt_case_skipped = false;
	ukt_cases++;
	ukt_case_start_ns = ukt_now_ns();
}

static inline void ukt_case_end(void)
{
	uint64_t ms = (ukt_now_ns() - ukt_case_start_ns) / NSEC_PER_MSEC;

	printf("  %s %s (%llu ms)\n",
	       ukt_case_failures ? "FAIL" : ukt_case_skipped ? "skip" : "ok  ", ukt_case_name,
	       (unsigned long long)ms);
	fflush(stdout);
}

/* UKT_CASE("fmt", ...) { body }: runs body once as a named case. */
#define UKT_CASE(...) \
	for (int _once = (ukt_case_begin(__VA_ARGS__), 1); _once; _once = (ukt_case_end(), 0))

/* Marks the current case skipped (the host lacks something it needs). */
static inline void ukt_skip_case(const char *why)
{
	if (!ukt_case_skipped)
		ukt_skips++;
	ukt_case_skipped = true;
	fprintf(stderr, "[%s] skipped: %s\n", ukt_case_name, why);
}

/* A mkstemp()/mkdtemp() template for NAME in $TMPDIR, where the runner
 * says files go (a booted kernel's / is read-only; the matrix points TMPDIR
 * at a disk), else in FALLBACK: "/tmp", or "/var/tmp" for a file that must
 * be on a disk. A $TMPDIR too long for a Unix socket path under it falls
 * back too. */
static inline void ukt_temp_template(char *buf, size_t size, const char *fallback,
				     const char *name)
{
	const char *dir = getenv("TMPDIR");

	if (!dir || !*dir || strlen(dir) > 48)
		dir = fallback;
	snprintf(buf, size, "%s/%s-XXXXXX", dir, name);
}

static inline void ukt_sleep_ms(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/*
 * Reads a forked page server's "ready ADDRESS\n" line from fd (10 s at
 * most), puts ADDRESS in address and closes fd: true when the line came.
 */
static inline bool ukt_read_ready(int fd, char *address, size_t size)
{
	char line[256] = "";
	size_t got = 0;

	while (!strchr(line, '\n') && got < sizeof(line) - 1) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t n;

		if (poll(&p, 1, 10000) <= 0)
			break;
		n = read(fd, line + got, sizeof(line) - 1 - got);
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	if (strncmp(line, "ready ", 6) || !strchr(line, '\n')) {
		CHECK(false, "the server said \"%s\", not ready", line);
		return false;
	}
	*strchr(line, '\n') = '\0';
	snprintf(address, size, "%s", line + 6);
	return true;
}

/* ---- configs ---- */

/* The small experiment most cases start from: 2 vCPUs x 2 MiB, one reader per uffd. */
static inline struct ukvm_config ukt_small(void)
{
	struct ukvm_config cfg;

	ukvm_config_init(&cfg);
	cfg.vcpus = 2;
	cfg.mem_per_vcpu = 2 * MiB;
	cfg.readers = 1;
	return cfg;
}

static inline const char *ukt_cfg_str(const struct ukvm_config *c)
{
	static char buf[256];

	snprintf(buf, sizeof(buf),
		 "vcpus=%u mem_per_vcpu=%" PRIu64 " %s %s%s readers=%u wait=%s%s delay_us=%u "
		 "timeout_ns=%" PRIu64 " inject=%d/%" PRIu64,
		 c->vcpus, c->mem_per_vcpu, ukvm_backing_name(c->backing),
		 ukvm_uffd_mode_name(c->uffd_mode), c->single_uffd ? " single_uffd" : "",
		 c->readers, ukvm_wait_name(c->wait), c->overlap ? " overlap" : "", c->delay_us,
		 c->timeout_ns, (int)c->inject, c->inject_after);
	return buf;
}

static inline const char *ukt_kind_name(enum ukvm_error_kind k)
{
	static const char *const names[] = {
		[UKVM_ERR_NONE] = "NONE", [UKVM_ERR_CONFIG] = "CONFIG", [UKVM_ERR_HOST] = "HOST",
		[UKVM_ERR_RUN] = "RUN", [UKVM_ERR_TIMEOUT] = "TIMEOUT",
		[UKVM_ERR_CANCELLED] = "CANCELLED",
	};

	return (unsigned)k < ARRAY_SIZE(names) && names[k] ? names[k] : "?";
}

/* ---- runs ---- */

/*
 * Runs cfg and expects success. Returns true with res filled (the caller
 * frees it), false after reporting a failure, or false after skipping the
 * case when the host lacks what cfg needs (UKVM_ERR_HOST).
 */
static inline bool ukt_run_ok(const struct ukvm_config *cfg, struct ukvm_result *res)
{
	struct ukvm_error err;
	int ret = ukvm_run(cfg, res, &err);

	if (ret && err.kind == UKVM_ERR_HOST) {
		ukt_skip_case(err.message);
		return false;
	}
	if (!CHECK(ret == 0 && err.kind == UKVM_ERR_NONE, "%s: ukvm_run returned %d, kind %s: %s",
		   ukt_cfg_str(cfg), ret, ukt_kind_name(err.kind), err.message))
		return false;
	return true;
}

/*
 * Runs cfg and expects it to fail with kind, errnum (unless -1) and a
 * message containing needle (unless NULL). Returns false, after skipping the
 * case, when the host lacks something instead.
 */
static inline bool ukt_run_fails(const struct ukvm_config *cfg, enum ukvm_error_kind kind,
				 int errnum, const char *needle, struct ukvm_error *out)
{
	struct ukvm_result res;
	struct ukvm_error err;
	int ret = ukvm_run(cfg, &res, &err);

	if (out)
		*out = err;
	if (ret && err.kind == UKVM_ERR_HOST && kind != UKVM_ERR_HOST) {
		ukt_skip_case(err.message);
		return false;
	}
	if (!ret)
		ukvm_result_free(&res);
	CHECK(ret != 0, "%s: succeeded, expected %s", ukt_cfg_str(cfg), ukt_kind_name(kind));
	CHECK(err.kind == kind, "%s: kind %s, expected %s: %s", ukt_cfg_str(cfg),
	      ukt_kind_name(err.kind), ukt_kind_name(kind), err.message);
	if (errnum >= 0)
		CHECK(err.errnum == errnum, "%s: errnum %d (%s), expected %d (%s): %s",
		      ukt_cfg_str(cfg), err.errnum, strerror(err.errnum), errnum,
		      strerror(errnum), err.message);
	if (needle)
		CHECK(strstr(err.message, needle), "%s: message lacks \"%s\": %s",
		      ukt_cfg_str(cfg), needle, err.message);
	CHECK(err.message[0] != '\0', "an error with an empty message");
	/* A failed run hands back an empty result that is safe to free. */
	CHECK(res.vcpus == NULL && res.readers == NULL && res.kvm_stats == NULL);
	ukvm_result_free(&res);
	return true;
}

/* A uffd's resolvers: its reader threads, or with resolver vCPU the vCPUs it serves. */
static inline uint32_t ukt_resolvers_per_uffd(const struct ukvm_config *cfg)
{
	if (cfg->resolver == UKVM_RESOLVER_VCPU)
		return cfg->single_uffd || cfg->overlap ? cfg->vcpus : 1;
	return cfg->readers;
}

/* Readers per uffd, sorted by (uffd, index), every pair present once. */
static inline void ukt_check_reader_layout(const struct ukvm_result *r, uint32_t uffds,
					   uint32_t readers)
{
	uint32_t i;

	CHECK_EQ(r->uffds, uffds);
	if (!CHECK_EQ(r->nr_readers, uffds * readers))
		return;
	for (i = 0; i < r->nr_readers; i++) {
		CHECK_EQ(r->readers[i].uffd, i / readers);
		CHECK_EQ(r->readers[i].index, i % readers);
	}
}

/* Counters that hold for every reader of every run. */
static inline void ukt_check_reader_counters(const struct ukvm_result *r,
					     const struct ukvm_config *cfg)
{
	uint64_t spurious = 0, wakes = 0, source_bytes = r->pusher_source_bytes;
	uint32_t i, n;

	for (i = 0; i < r->nr_readers; i++) {
		spurious += r->readers[i].spurious_wakeups;
		wakes += r->readers[i].wakes;
		source_bytes += r->readers[i].source_bytes;
	}
	/* The run's sums, from collect.c: its readers' (and the pusher's) */
	CHECK_EQ(r->spurious_wakeups, spurious);
	CHECK_EQ(r->wakes, wakes);
	CHECK_EQ(r->source_bytes, source_bytes);
	for (i = 0; i < r->nr_readers; i++) {
		const struct ukvm_reader_result *x = &r->readers[i];
		uint64_t messages = 0, reads = 0;

		/* Resolver vCPU: no messages, no waits; its vCPU's exits are its faults. */
		if (cfg->resolver == UKVM_RESOLVER_VCPU) {
			CHECK_EQ(x->reads, 0);
			CHECK_EQ(x->wakeups, 0);
			CHECK_EQ(x->spurious_wakeups, 0);
			continue;
		}

		/* The reads' sizes add up to the messages, none above the batch. */
		for (n = 1; n <= UKVM_MAX_READ_BATCH; n++) {
			messages += n * x->read_sizes[n];
			reads += x->read_sizes[n];
			if (n > cfg->read_batch)
				CHECK_EQ(x->read_sizes[n], 0);
		}
		/* An empty read after a full batch: none without batches. */
		if (cfg->read_batch == 1)
			CHECK_EQ(x->read_sizes[0], 0);
		CHECK_EQ(reads, x->reads);
		CHECK_EQ(messages, x->faults + x->eexist);
		/*
		 * A wakeup reads messages or is spurious; with batches it may read
		 * more than once (a blocking read is its own wakeup).
		 */
		bool spins = cfg->wait == UKVM_WAIT_SPIN || cfg->wait == UKVM_WAIT_SPIN_IDLE;

		if ((cfg->read_batch == 1 && !spins) ||
		    cfg->wait == UKVM_WAIT_READ || cfg->wait == UKVM_WAIT_IO_URING)
			CHECK_EQ(x->wakeups, x->reads + x->spurious_wakeups);
		else
			CHECK(x->wakeups <= x->reads + x->spurious_wakeups);
		if (cfg->wait == UKVM_WAIT_READ || spins)
			CHECK_EQ(x->spurious_wakeups, 0);
		/*
		 * io_uring: every read is a completion of the reader's ring (it
		 * resubmits rather than drains: never an empty read(2) after a
		 * full batch); no other mode has a ring.
		 */
		if (cfg->wait == UKVM_WAIT_IO_URING) {
			CHECK_EQ(x->ring_completions, x->reads);
			CHECK_EQ(x->read_sizes[0], 0);
		} else {
			CHECK_EQ(x->ring_completions, 0);
		}
	}
}

/*
 * Faults a run of cfg takes: one per page of the backing (a 2 MiB page is
 * resolved whole), none when the region was filled beforehand (prefault) or
 * without userfaultfd.
 */
static inline uint64_t ukt_expected_faults(const struct ukvm_config *cfg)
{
	uint64_t region = cfg->overlap ? cfg->mem_per_vcpu : cfg->mem_per_vcpu * cfg->vcpus;

	if (cfg->prefault || cfg->uffd_mode == UKVM_UFFD_NONE)
		return 0;
	return region / ukvm_backing_page_size(cfg->backing);
}

/* What a successful run must hand back, whatever its config. */
static inline void ukt_check_result(const struct ukvm_config *cfg, const struct ukvm_result *r)
{
	uint64_t pages = cfg->mem_per_vcpu / PAGE;
	uint64_t region = cfg->overlap ? cfg->mem_per_vcpu : cfg->mem_per_vcpu * cfg->vcpus;
	uint64_t expected = ukt_expected_faults(cfg);
	uint32_t uffds, i, u;
	uint64_t faults = 0, eexist = 0;

	CHECK(r->verified, "%s: not verified (%" PRIu64 " bad pages): %s", ukt_cfg_str(cfg),
	      r->bad_pages, r->verify_message);
	CHECK_EQ(r->bad_pages, 0);
	CHECK_EQ(r->page_size, ukvm_backing_page_size(cfg->backing));
	CHECK_EQ(r->pages_per_vcpu, pages);
	CHECK_EQ(r->region_bytes, region);
	CHECK_EQ(r->passes, cfg->passes);
	CHECK_LE(r->start_ns, r->end_ns);
	if (!CHECK_EQ(r->nr_vcpus, cfg->vcpus) || !CHECK(r->vcpus))
		return;
	for (i = 0; i < r->nr_vcpus; i++) {
		const struct ukvm_vcpu_result *v = &r->vcpus[i];

		CHECK_EQ(v->index, i);
		/* Every page in every pass: the guest counts its accesses. */
		CHECK_EQ(v->pages, pages * cfg->passes);
		CHECK(v->tid > 0);
		CHECK_LE(r->start_ns, v->start_ns);
		CHECK_LE(v->start_ns, v->end_ns);
		CHECK_LE(v->end_ns, r->end_ns);
		CHECK_GE(v->userspace_exits, 1);
		/* Resolver vCPU: the vCPU's own faults came back as exits; else none do. */
		if (cfg->resolver == UKVM_RESOLVER_VCPU && ukt_expected_faults(cfg) && !cfg->overlap)
			CHECK_EQ(v->fault_exits, ukt_expected_faults(cfg) / cfg->vcpus);
		else if (cfg->resolver != UKVM_RESOLVER_VCPU)
			CHECK_EQ(v->fault_exits, 0);
		/*
		 * Not exits >= pages: KVM may map a page without an exit (seen
		 * here: 509 exits for 512 pages, about one vCPU run in 250).
		 */
		if (v->kvm_stats)
			CHECK_GE(v->exits, 1);
	}

	if (cfg->uffd_mode == UKVM_UFFD_NONE) {
		ukt_check_reader_layout(r, 0, 0);
		return;
	}
	uffds = cfg->single_uffd || cfg->overlap ? 1 : cfg->vcpus;
	ukt_check_reader_layout(r, uffds, ukt_resolvers_per_uffd(cfg));
	ukt_check_reader_counters(r, cfg);
	for (u = 0; u < r->uffds; u++) {
		uint64_t sum = 0;

		for (i = 0; i < r->nr_readers; i++)
			if (r->readers[i].uffd == u)
				sum += r->readers[i].faults;
		/* Each uffd covers an equal share of the region; each page faults once. */
		CHECK(sum == expected / uffds, "uffd %u resolved %" PRIu64 " faults, expected "
		      "%" PRIu64, u, sum, expected / uffds);
	}
	for (i = 0; i < r->nr_readers; i++) {
		faults += r->readers[i].faults;
		eexist += r->readers[i].eexist;
	}
	CHECK_EQ(faults, expected);
	/* the run's counts: its readers' */
	CHECK_EQ(r->faults, faults);
	CHECK_EQ(r->eexist, eexist);
	if (cfg->stats == UKVM_STATS_FULL && cfg->uffd_mode != UKVM_UFFD_NONE) {
		uint64_t vcpu_faults = 0, vcpu_eexist = 0;

		/* faults and eexist mean the same for the vCPUs as for the readers */
		for (i = 0; i < r->nr_vcpus; i++) {
			vcpu_faults += r->vcpus[i].faults;
			vcpu_eexist += r->vcpus[i].eexist;
		}
		if (r->vcpus[0].faults + r->vcpus[0].eexist)	/* UFFD_FEATURE_THREAD_ID named them */
			CHECK(vcpu_faults == faults && vcpu_eexist == eexist,
			      "the vCPUs' faults %" PRIu64 " + eexist %" PRIu64 ", the readers' %"
			      PRIu64 " + %" PRIu64, vcpu_faults, vcpu_eexist, faults, eexist);
	}
	if (cfg->overlap)
		/* The other vCPUs' faults on a page already being resolved. */
		CHECK_LE(eexist, (uint64_t)(cfg->vcpus - 1) * expected);
	else
		CHECK_EQ(eexist, 0);
}

/*
 * trace_faults: the records say what happened. One per fault message, in
 * the order the readers read them; each inside the region, from the vCPU
 * whose slice holds the page (UFFD_FEATURE_THREAD_ID), through the uffd
 * that covers it; every page of the backing resolved once; and each reader
 * holds as many records as it counted faults.
 */
static inline void ukt_check_trace(const struct ukvm_config *cfg, const struct ukvm_result *r)
{
	uint64_t unit = r->page_size, units = r->region_bytes / unit, i, resolved = 0;
	uint64_t *per_reader = calloc(r->nr_readers ?: 1, sizeof(*per_reader));
	uint8_t *seen = calloc(units ?: 1, 1);
	unsigned bad = 0;

	if (!CHECK(per_reader && seen, "out of memory")) {
		free(per_reader);
		free(seen);
		return;
	}
	CHECK(r->nr_fault_trace == 0 || r->fault_trace, "nr_fault_trace %" PRIu64 " without a trace",
	      r->nr_fault_trace);
	for (i = 0; i < r->nr_fault_trace && bad < 5; i++) {
		const struct ukvm_fault_record *t = &r->fault_trace[i];
		uint64_t off = t->gpa - r->region_gpa;
		uint32_t owner = cfg->overlap ? 0 : (uint32_t)(off / cfg->mem_per_vcpu);
		uint32_t k = t->uffd * ukt_resolvers_per_uffd(cfg) + t->reader;
		bool ok = true;

		ok &= CHECK(i == 0 || r->fault_trace[i - 1].read_ns <= t->read_ns,
			    "record %" PRIu64 " was read before the one ahead of it", i);
		ok &= CHECK(t->read_ns <= t->resolved_ns, "record %" PRIu64 ": resolved before read", i);
		ok &= CHECK(t->gpa >= r->region_gpa && off < r->region_bytes,
			    "record %" PRIu64 ": gpa 0x%" PRIx64 " outside the region", i, t->gpa);
		ok &= CHECK(t->uffd < r->uffds && t->reader < ukt_resolvers_per_uffd(cfg) &&
			    k < r->nr_readers,
			    "record %" PRIu64 ": uffd %u reader %u", i, t->uffd, t->reader);
		if (!ok) {
			bad++;
			continue;
		}
		per_reader[k]++;
		if (cfg->overlap) {
			bad += !CHECK(t->vcpu >= 0 && (uint32_t)t->vcpu < cfg->vcpus,
				      "record %" PRIu64 ": vCPU %d", i, t->vcpu);
		} else {
			bad += !CHECK(t->vcpu == (int32_t)owner, "record %" PRIu64 ": gpa 0x%"
				      PRIx64 " is vCPU %u's, the record says vCPU %d", i, t->gpa,
				      owner, t->vcpu);
			if (r->uffds == cfg->vcpus)
				bad += !CHECK_EQ(t->uffd, owner);
		}
		if (!t->eexist) {
			bad += !CHECK(!seen[off / unit], "record %" PRIu64 ": page 0x%" PRIx64
				      " resolved twice", i, t->gpa - off % unit);
			seen[off / unit] = 1;
			resolved++;
		}
	}
	CHECK_EQ(resolved, ukt_expected_faults(cfg));
	for (i = 0; i < r->nr_readers; i++)
		CHECK(per_reader[i] == r->readers[i].faults + r->readers[i].eexist,
		      "reader %u of uffd %u: %" PRIu64 " records, %" PRIu64 " faults + %" PRIu64
		      " EEXIST counted", r->readers[i].index, r->readers[i].uffd, per_reader[i],
		      r->readers[i].faults, r->readers[i].eexist);
	free(per_reader);
	free(seen);
}

/*
 * Runs cfg on a backing of 2 MiB pages (the page size said here, not taken
 * from the core's table) and checks one fault per 2 MiB page, and the trace
 * where there is one.
 */
static inline void ukt_run_2m_pages(struct ukvm_config *cfg, enum ukvm_backing backing)
{
	struct ukvm_result res;
	uint64_t faults = 0;
	uint32_t i;

	cfg->backing = backing;
	if (!ukt_run_ok(cfg, &res))
		return;
	ukt_check_result(cfg, &res);
	CHECK_EQ(res.page_size, 2 * MiB);
	if (cfg->uffd_mode != UKVM_UFFD_NONE) {
		for (i = 0; i < res.nr_readers; i++)
			faults += res.readers[i].faults;
		CHECK_EQ(faults, res.region_bytes / (2 * MiB));
	}
	if (cfg->trace_faults)
		ukt_check_trace(cfg, &res);
	ukvm_result_free(&res);
}

/* ---- process resources ---- */

static inline int ukt_count_dir(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - (strcmp(path, "/proc/self/fd") == 0);	/* the DIR's own fd */
}

static inline int ukt_open_fds(void)
{
	ukvm_wait_idle();
	return ukt_count_dir("/proc/self/fd");
}

static inline int ukt_threads(void)
{
	ukvm_wait_idle();	/* a failed run's controller may still be releasing memory */
	return ukt_count_dir("/proc/self/task");
}

/* Lines of /proc/self/maps that contain needle: mappings the core made, by name. */
static inline int ukt_mappings(const char *needle)
{
	ukvm_wait_idle();
	FILE *f = fopen("/proc/self/maps", "re");
	char line[4096];
	int n = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

/* ---- program ---- */

/*
 * Names the program and checks the host once with the smallest run: a host
 * without KVM or userfaultfd makes the whole program a skip.
 */
static inline void ukt_init(const char *program)
{
	struct ukvm_config cfg;
	struct ukvm_result res;
	struct ukvm_error err;

	ukt_program = program;
	setvbuf(stderr, NULL, _IOLBF, 0);
	ukvm_config_init(&cfg);
	cfg.mem_per_vcpu = 64 << 10;
	if (ukvm_run(&cfg, &res, &err)) {
		if (err.kind == UKVM_ERR_HOST) {
			printf("%s: skipped, the host cannot run experiments: %s\n", program,
			       err.message);
			exit(T_EXIT_SKIP);
		}
		fprintf(stderr, "%s: the smallest run failed (kind %s): %s\n", program,
			ukt_kind_name(err.kind), err.message);
		exit(T_EXIT_FAIL);
	}
	ukvm_result_free(&res);
}

/* Ends the program as a skip: the host lacks what every case needs. */
__attribute__((format(printf, 1, 2), noreturn))
static inline void ukt_skip_program(const char *fmt, ...)
{
	va_list ap;

	printf("%s: skipped, ", ukt_program);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	exit(T_EXIT_SKIP);
}

static inline int ukt_exit(void)
{
	ukvm_wait_idle();
	printf("%s: %u cases, %u checks failed, %u skipped\n", ukt_program, ukt_cases,
	       ukt_failures, ukt_skips);
	if (ukt_failures)
		return T_EXIT_FAIL;
	return ukt_skips == ukt_cases ? T_EXIT_SKIP : T_EXIT_PASS;
}


/* Every uffd mode on the backings it applies to, and every wait mode. */
static const struct {
	enum ukvm_uffd_mode mode;
	enum ukvm_backing backing;
} ukt_modes[] = {
	{ UKVM_UFFD_MISSING, UKVM_BACKING_ANONYMOUS },
	{ UKVM_UFFD_MISSING, UKVM_BACKING_SHMEM },
	{ UKVM_UFFD_MINOR, UKVM_BACKING_SHMEM },
	{ UKVM_UFFD_NONE, UKVM_BACKING_ANONYMOUS },
	{ UKVM_UFFD_NONE, UKVM_BACKING_SHMEM },
};

/* Every way of waiting that sleeps (spin has its own cases); io_uring where built (Makefile). */
static const enum ukvm_wait ukt_waits[] = {
	UKVM_WAIT_POLL, UKVM_WAIT_EPOLL, UKVM_WAIT_EPOLL_EXCLUSIVE, UKVM_WAIT_READ,
#ifdef UKVM_HAVE_LIBURING
	UKVM_WAIT_IO_URING,
#endif
};

/* The first CPU this process may run on (0 if it cannot tell). */
static inline int32_t ukt_first_cpu(void)
{
	cpu_set_t set;
	int cpu;

	if (sched_getaffinity(0, sizeof(set), &set) == 0)
		for (cpu = 0; cpu < CPU_SETSIZE; cpu++)
			if (CPU_ISSET(cpu, &set))
				return cpu;
	return 0;
}

/* A run that must succeed and pass ukt_check_result(). */
static inline void ukt_run_checked(const struct ukvm_config *cfg)
{
	struct ukvm_result res;

	if (!ukt_run_ok(cfg, &res))
		return;
	ukt_check_result(cfg, &res);
	ukvm_result_free(&res);
}

#endif
