/* SPDX-License-Identifier: MIT */
/*
 * Config defaults, names and validation. The Python layer validates first
 * and explains in Python terms; this is the core's own guard, so a C caller
 * with a bad config gets an error rather than undefined behaviour.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/util.h"
#include "experiment/config.h"
#include "uffd/backing.h"
#include "uffd/ring.h"

#define MAX_READERS	4096
#define MAX_DELAY_US	(10U * 1000 * 1000)
#define MAX_GUEST_WORK	1000000U
#define MAX_PASSES	1000000U
/* The largest test region: uffdkvm/config.py MAX_REGION_BYTES. */
#define MAX_REGION_BYTES	(1ULL << 46)
/*
 * Access lists (experiment/access.c) live in the guest's system memory, 4
 * bytes an entry: 2^24 entries (64 MiB, a 64 GiB vCPU's pages) at most.
 */
#define MAX_ACCESSES		(1ULL << 24)
#define MAX_ZIPF_THETA		100.0

void ukvm_config_init(struct ukvm_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->vcpus = 1;
	cfg->mem_per_vcpu = 1ULL << 30;
	cfg->backing = UKVM_BACKING_ANONYMOUS;
	cfg->uffd_mode = UKVM_UFFD_MISSING;
	cfg->readers = 1;
	cfg->wait = UKVM_WAIT_EPOLL_EXCLUSIVE;
	cfg->read_batch = 1;
	cfg->guest_page_size = UKVM_PAGE_SIZE;
	cfg->write_percent = 100;
	cfg->passes = 1;
	cfg->touch_percent = 100;
	cfg->prefetch_pages = 8;
}

const char *ukvm_prefetch_name(enum ukvm_prefetch p)
{
	static const char *const names[] = {
		[UKVM_PREFETCH_NONE] = "none",
		[UKVM_PREFETCH_READAHEAD] = "readahead",
		[UKVM_PREFETCH_BACKGROUND] = "background",
		[UKVM_PREFETCH_REPLAY] = "replay",
	};

	return (unsigned)p < ARRAY_SIZE(names) ? names[p] : "?";
}

const char *ukvm_backing_name(enum ukvm_backing b)
{
	static const char *const names[] = {
		[UKVM_BACKING_ANONYMOUS] = "anonymous",
		[UKVM_BACKING_SHMEM] = "shmem",
		[UKVM_BACKING_ANONYMOUS_THP] = "anonymous_thp",
		[UKVM_BACKING_ANONYMOUS_HUGETLB] = "anonymous_hugetlb",
		[UKVM_BACKING_ANONYMOUS_HUGETLB_1GB] = "anonymous_hugetlb_1gb",
		[UKVM_BACKING_SHARED_HUGETLB] = "shared_hugetlb",
		[UKVM_BACKING_GUEST_MEMFD] = "guest_memfd",
	};

	return (unsigned)b < ARRAY_SIZE(names) ? names[b] : "?";
}

const char *ukvm_uffd_mode_name(enum ukvm_uffd_mode m)
{
	static const char *const names[] = {
		[UKVM_UFFD_NONE] = "none",
		[UKVM_UFFD_MISSING] = "missing",
		[UKVM_UFFD_MINOR] = "minor",
		[UKVM_UFFD_WP] = "wp",
	};

	return (unsigned)m < ARRAY_SIZE(names) ? names[m] : "?";
}

/* The guest's access model (experiment/access.c): touch_percent, access, zipf_theta, accesses. */
#define BAD(...) do { ukvm_err_set(err, UKVM_ERR_CONFIG, 0, __VA_ARGS__); return -EINVAL; } while (0)
static int config_check_access(const struct ukvm_config *c, struct ukvm_error *err)
{
	if (c->touch_percent < 1 || c->touch_percent > 100)
		BAD("touch_percent must be between 1 and 100, not %u", c->touch_percent);
	if ((unsigned)c->access >= UKVM_ACCESS__COUNT)
		BAD("access: unknown value %d", c->access);
	if (c->access != UKVM_ACCESS_ZIPF && c->zipf_theta != 0)
		BAD("zipf_theta applies to access zipf only: set access=\"zipf\" or leave "
		    "zipf_theta unset");
	if (c->access != UKVM_ACCESS_ZIPF && c->accesses)
		BAD("accesses applies to access zipf only (with access uniform every touched "
		    "page is visited once a pass): set access=\"zipf\" or leave accesses unset");
	if (c->access == UKVM_ACCESS_ZIPF && !(c->zipf_theta > 0 && c->zipf_theta <= MAX_ZIPF_THETA))
		BAD("zipf_theta must be a number above 0 and at most %g with access zipf "
		    "(0.99 is the usual skew), not %g", MAX_ZIPF_THETA, c->zipf_theta);
	if (c->access == UKVM_ACCESS_ZIPF && c->pattern != UKVM_PATTERN_SEQUENTIAL)
		BAD("pattern %s has no meaning with access zipf: its accesses are random draws "
		    "from the Zipf distribution; leave pattern sequential",
		    ukvm_pattern_name(c->pattern));
	if (c->accesses > MAX_ACCESSES)
		BAD("accesses must be at most %llu a pass per vCPU, not %llu",
		    (unsigned long long)MAX_ACCESSES, (unsigned long long)c->accesses);
	/* A page's visits per pass, all vCPUs together, are counted in 32 bits. */
	if (c->overlap && c->accesses * c->vcpus > UINT32_MAX)
		BAD("accesses: with overlap, vcpus x accesses (%u x %llu) must stay below 2^32 "
		    "(a page's visits a pass are counted in 32 bits); use fewer accesses",
		    c->vcpus, (unsigned long long)c->accesses);
	/* The access lists hold 32-bit page indices. */
	if ((c->touch_percent < 100 || c->access != UKVM_ACCESS_UNIFORM) &&
	    c->mem_per_vcpu / UKVM_PAGE_SIZE > MAX_ACCESSES)
		BAD("mem_per_vcpu: touch_percent and access zipf take at most %llu pages "
		    "(%llu GiB) per vCPU, not %llu bytes; use less memory per vCPU",
		    (unsigned long long)MAX_ACCESSES, (unsigned long long)(MAX_ACCESSES >> 18),
		    (unsigned long long)c->mem_per_vcpu);
	return 0;
}
#undef BAD

const char *ukvm_pattern_name(enum ukvm_pattern p)
{
	static const char *const names[] = { "sequential", "reverse", "random" };

	return (unsigned)p < ARRAY_SIZE(names) ? names[p] : "?";
}

const char *ukvm_wait_name(enum ukvm_wait w)
{
	static const char *const names[] = {
		[UKVM_WAIT_POLL] = "poll",
		[UKVM_WAIT_EPOLL] = "epoll",
		[UKVM_WAIT_EPOLL_EXCLUSIVE] = "epoll_exclusive",
		[UKVM_WAIT_READ] = "read",
		[UKVM_WAIT_SPIN] = "spin",
		[UKVM_WAIT_IO_URING] = "io_uring",
	};

	return (unsigned)w < ARRAY_SIZE(names) ? names[w] : "?";
}

const char *ukvm_resolver_name(enum ukvm_resolver r)
{
	static const char *const names[] = {
		[UKVM_RESOLVER_READERS] = "readers",
		[UKVM_RESOLVER_VCPU] = "vcpu",
	};

	return (unsigned)r < ARRAY_SIZE(names) ? names[r] : "?";
}

#define BAD(...) do { ukvm_err_set(err, UKVM_ERR_CONFIG, 0, __VA_ARGS__); return -EINVAL; } while (0)

/*
 * Prefetch installs pages with data (UFFDIO_COPY) into missing pages, and
 * replay's pages must be pages of the region, each once. Called once the
 * region's size is known to be sound.
 */
static int config_check_prefetch(const struct ukvm_config *c, struct ukvm_error *err)
{
	uint64_t region = c->overlap ? c->mem_per_vcpu : c->mem_per_vcpu * c->vcpus;
	uint64_t pages = region / ukvm_backing_page_size(c->backing), i, *seen;

	if ((unsigned)c->prefetch >= UKVM_PREFETCH__COUNT)
		BAD("prefetch: unknown value %d", c->prefetch);
	if (c->prefetch == UKVM_PREFETCH_NONE) {
		if (c->nr_replay)
			BAD("replay_from: applies to prefetch replay only, not %s",
			    ukvm_prefetch_name(c->prefetch));
		return 0;
	}
	if (c->uffd_mode != UKVM_UFFD_MISSING || c->resolve != UKVM_RESOLVE_COPY)
		BAD("prefetch: %s installs pages with their data (UFFDIO_COPY), so it needs "
		    "uffd_mode missing and resolve copy, not uffd_mode %s with resolve %s",
		    ukvm_prefetch_name(c->prefetch), ukvm_uffd_mode_name(c->uffd_mode),
		    c->resolve == UKVM_RESOLVE_ZEROPAGE ? "zeropage" :
		    c->resolve == UKVM_RESOLVE_MOVE ? "move" : "copy");
	if (c->prefault)
		BAD("prefetch: %s has nothing to install with prefault (every page is "
		    "populated before the vCPUs start)", ukvm_prefetch_name(c->prefetch));
	if (c->prefetch == UKVM_PREFETCH_READAHEAD && c->prefetch_pages < 1)
		BAD("prefetch_pages: readahead needs a window of at least 1 page");
	if (c->prefetch != UKVM_PREFETCH_REPLAY) {
		if (c->nr_replay)
			BAD("replay_from: applies to prefetch replay only, not %s",
			    ukvm_prefetch_name(c->prefetch));
		return 0;
	}
	if (!c->nr_replay || !c->replay)
		BAD("replay_from: prefetch replay needs an order of pages to install (a "
		    "touch_order saved by an earlier run)");
	if (c->nr_replay > pages)
		BAD("replay_from: %llu pages, more than the region's %llu",
		    (unsigned long long)c->nr_replay, (unsigned long long)pages);
	seen = calloc(pages / 64 + 1, sizeof(*seen));
	if (!seen) {
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating replay's page set");
		return -ENOMEM;
	}
	for (i = 0; i < c->nr_replay; i++) {
		uint64_t page = c->replay[i];

		if (page >= pages || (seen[page / 64] & (1ULL << (page % 64)))) {
			free(seen);
			if (page >= pages)
				BAD("replay_from: entry %llu is page %llu, beyond the region's %llu "
				    "pages", (unsigned long long)i, (unsigned long long)page,
				    (unsigned long long)pages);
			BAD("replay_from: entry %llu repeats page %llu", (unsigned long long)i,
			    (unsigned long long)page);
		}
		seen[page / 64] |= 1ULL << (page % 64);
	}
	free(seen);
	return 0;
}

int ukvm_config_validate(const struct ukvm_config *c, struct ukvm_error *err)
{
	int ret;

	if (c->vcpus < 1)
		BAD("vcpus must be at least 1");
	uint64_t unit;
	uint32_t i;

	if ((unsigned)c->backing >= UKVM_BACKING__COUNT)
		BAD("backing: unknown value %d", c->backing);
	if (c->guest_page_size != UKVM_PAGE_SIZE && c->guest_page_size != (2ULL << 20) &&
	    c->guest_page_size != (1ULL << 30))
		BAD("guest_page_size must be 4 KiB, 2 MiB or 1 GiB, not %llu",
		    (unsigned long long)c->guest_page_size);
	unit = ukvm_backing_page_size(c->backing);
	if (c->guest_page_size > unit)
		unit = c->guest_page_size;
	if (c->mem_per_vcpu < unit || c->mem_per_vcpu % unit)
		BAD("mem_per_vcpu must be a positive multiple of %llu KiB (the page size of "
		    "the backing and of the guest's mappings), not %llu",
		    (unsigned long long)(unit >> 10), (unsigned long long)c->mem_per_vcpu);
	/*
	 * The region, not just its factors: vm.c sizes page tables and adds
	 * guest addresses from it, and the Python layer has the same limit
	 * (uffdkvm/config.py MAX_REGION_BYTES). Divided, so nothing overflows.
	 */
	if (c->overlap && c->mem_per_vcpu > MAX_REGION_BYTES)
		BAD("mem_per_vcpu: %llu bytes is more guest memory than a test region may have "
		    "(%llu, 64 TiB); use less memory per vCPU",
		    (unsigned long long)c->mem_per_vcpu, MAX_REGION_BYTES);
	if (!c->overlap && c->mem_per_vcpu > MAX_REGION_BYTES / c->vcpus)
		BAD("mem_per_vcpu: vcpus x mem_per_vcpu (%u x %llu bytes) is more guest memory "
		    "than a test region may have (%llu, 64 TiB); use less memory per vCPU or "
		    "fewer vCPUs", c->vcpus, (unsigned long long)c->mem_per_vcpu,
		    MAX_REGION_BYTES);
	if ((unsigned)c->uffd_mode >= UKVM_UFFD__COUNT)
		BAD("uffd_mode: unknown value %d", c->uffd_mode);
	if ((unsigned)c->resolver >= UKVM_RESOLVER__COUNT)
		BAD("resolver: unknown value %d", c->resolver);
	if ((unsigned)c->wait >= UKVM_WAIT__COUNT)
		BAD("wait: unknown value %d", c->wait);
	if (c->read_batch < 1 || c->read_batch > UKVM_MAX_READ_BATCH)
		BAD("read_batch must be between 1 and %d, not %u", UKVM_MAX_READ_BATCH,
		    c->read_batch);
	if (c->uffd_mode != UKVM_UFFD_NONE && (c->readers < 1 || c->readers > MAX_READERS))
		BAD("readers must be between 1 and %d, not %u", MAX_READERS, c->readers);
	if (c->uffd_mode == UKVM_UFFD_MINOR && !ukvm_backing_is_shared(c->backing))
		BAD("uffd_mode minor needs a shared backing (shmem, shared_hugetlb, "
		    "guest_memfd): MINOR faults happen when the page cache has the page but "
		    "the mapping does not, and %s memory has no page cache",
		    ukvm_backing_name(c->backing));
	/*
	 * The snapshot keeps one 4 KiB slot per page and verification checks it
	 * per 4 KiB page; a huge page's first write would save 2 MiB at once,
	 * and guest_memfd cannot be registered with userfaultfd.
	 */
	if (c->uffd_mode == UKVM_UFFD_WP && c->backing != UKVM_BACKING_ANONYMOUS &&
	    c->backing != UKVM_BACKING_SHMEM)
		BAD("uffd_mode wp needs a 4 KiB backing (anonymous or shmem), not %s: the "
		    "snapshot is saved and verified a 4 KiB page at a time",
		    ukvm_backing_name(c->backing));
	if (c->wp_async && c->uffd_mode != UKVM_UFFD_WP)
		BAD("wp_async applies to uffd_mode wp only");
	if (c->wp_async && c->resolver == UKVM_RESOLVER_VCPU)
		BAD("wp_async delivers no faults, so a vCPU has nothing to resolve: use "
		    "resolver readers");
	if ((unsigned)c->pattern >= UKVM_PATTERN__COUNT)
		BAD("pattern: unknown value %d", c->pattern);
	if ((unsigned)c->resolve >= UKVM_RESOLVE__COUNT)
		BAD("resolve: unknown value %d", c->resolve);
	if ((unsigned)c->delay_dist >= UKVM_DELAY__COUNT)
		BAD("delay_dist: unknown value %d", c->delay_dist);
	if (c->write_percent > 100)
		BAD("write_percent must be between 0 and 100, not %u", c->write_percent);
	if (c->passes < 1 || c->passes > MAX_PASSES)
		BAD("passes must be between 1 and %u, not %u", MAX_PASSES, c->passes);
	if (config_check_access(c, err))
		return -EINVAL;
	if (c->resolve == UKVM_RESOLVE_ZEROPAGE && c->uffd_mode != UKVM_UFFD_MISSING)
		BAD("resolve zeropage applies to uffd_mode missing only");
	if (c->resolve == UKVM_RESOLVE_ZEROPAGE && ukvm_backing_is_hugetlb(c->backing))
		BAD("resolve zeropage does not work on hugetlb memory (no UFFDIO_ZEROPAGE "
		    "there): use resolve copy");
	/*
	 * UFFDIO_MOVE takes a private anonymous page out of one mapping and
	 * puts it in another (mm/userfaultfd.c validate_move_areas): both
	 * must be private anonymous memory; shared or hugetlb memory (and
	 * guest_memfd) is refused by the kernel with EINVAL.
	 */
	if (c->resolve == UKVM_RESOLVE_MOVE && c->uffd_mode != UKVM_UFFD_MISSING)
		BAD("resolve move applies to uffd_mode missing only (a MINOR fault's page "
		    "is in the page cache already: nothing to move)");
	if (c->resolve == UKVM_RESOLVE_MOVE && c->backing != UKVM_BACKING_ANONYMOUS &&
	    c->backing != UKVM_BACKING_ANONYMOUS_THP)
		BAD("resolve move needs private anonymous memory (backing anonymous or "
		    "anonymous_thp): UFFDIO_MOVE cannot move pages of %s memory; use resolve "
		    "copy", ukvm_backing_name(c->backing));
	if ((unsigned)c->source >= UKVM_SOURCE__COUNT)
		BAD("source: unknown value %d", c->source);
	if ((unsigned)c->source_read >= UKVM_SOURCE_READ__COUNT)
		BAD("source_read: unknown value %d", c->source_read);
	if ((unsigned)c->source_cache >= UKVM_SOURCE_CACHE__COUNT)
		BAD("source_cache: unknown value %d", c->source_cache);
	if (c->source == UKVM_SOURCE_REMOTE && !c->source_address[0])
		BAD("source_address: source remote needs the page server's address "
		    "(uffdkvm.run starts the server and gives it)");
	if (c->source != UKVM_SOURCE_REMOTE && c->source_address[0])
		BAD("source_address applies to source remote only");
	/* A source supplies the data of a fault resolved with data; nothing else fetches. */
	if (c->source != UKVM_SOURCE_SYNTHETIC &&
	    (c->uffd_mode != UKVM_UFFD_MISSING || c->prefault ||
	     (c->resolve != UKVM_RESOLVE_COPY && c->resolve != UKVM_RESOLVE_MOVE)))
		BAD("source: %s applies where a missing fault is resolved with data (uffd_mode "
		    "missing with resolve copy or move, no prefault), not uffd_mode %s, resolve "
		    "%s%s", c->source == UKVM_SOURCE_FILE ? "file" : "remote",
		    ukvm_uffd_mode_name(c->uffd_mode),
		    c->resolve == UKVM_RESOLVE_ZEROPAGE ? "zeropage" :
		    c->resolve == UKVM_RESOLVE_MOVE ? "move" : "copy",
		    c->prefault ? " with prefault" : "");
	if (c->source == UKVM_SOURCE_SYNTHETIC && c->source_path[0])
		BAD("source_path applies to source file or remote only");
	if (c->source != UKVM_SOURCE_FILE && (c->source_read || c->source_cache))
		BAD("source_read and source_cache apply to source file only (a page server "
		    "reads its file itself)");
	/* Before the lists are read: a count with a NULL list is the caller's bug. */
	if (c->nr_pin_vcpus && !c->pin_vcpus)
		BAD("pin_vcpus: nr_pin_vcpus is %u but the list is NULL", c->nr_pin_vcpus);
	if (c->nr_pin_readers && !c->pin_readers)
		BAD("pin_readers: nr_pin_readers is %u but the list is NULL", c->nr_pin_readers);
	for (i = 0; i < c->nr_pin_vcpus; i++)
		if (c->pin_vcpus[i] < 0 || c->pin_vcpus[i] >= CPU_SETSIZE)
			BAD("pin_vcpus: %d is not a CPU number", c->pin_vcpus[i]);
	for (i = 0; i < c->nr_pin_readers; i++)
		if (c->pin_readers[i] < 0 || c->pin_readers[i] >= CPU_SETSIZE)
			BAD("pin_readers: %d is not a CPU number", c->pin_readers[i]);
	if (c->delay_us > MAX_DELAY_US)
		BAD("delay_us must be at most %u (10 s), not %u", MAX_DELAY_US, c->delay_us);
	if ((unsigned)c->stats >= UKVM_STATS__COUNT)
		BAD("stats: unknown value %d", c->stats);
	if (c->trace_faults && c->stats != UKVM_STATS_FULL)
		BAD("trace_faults needs stats full: stats basic keeps no fault records");
	ret = config_check_prefetch(c, err);
	if (ret)
		return ret;
#ifdef UKVM_TEST_HOOKS
	if ((unsigned)c->inject >= UKVM_INJECT__COUNT)
		BAD("inject: unknown value %d", c->inject);
#endif
	if (c->guest_work > MAX_GUEST_WORK)
		BAD("guest_work must be at most %u, not %u", MAX_GUEST_WORK, c->guest_work);
	/* Last, once the config is sound: a build without liburing is the host's lack. */
	if (c->wait == UKVM_WAIT_IO_URING && c->uffd_mode != UKVM_UFFD_NONE &&
	    ukvm_ring_built(err))
		return -EOPNOTSUPP;
	return 0;
}
#undef BAD
