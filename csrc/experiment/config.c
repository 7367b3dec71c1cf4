/* SPDX-License-Identifier: MIT */
/*
 * Config defaults, names and validation: the one validator. uffdkvm.Config
 * calls it (uffdkvm._core.validate) before any run, so Python and C cannot
 * disagree; every message starts with the field's name as Python spells it
 * ("readers: ...") and spells values as the Python user writes them.
 *
 * The fields, their defaults, ranges and the rules of which field applies
 * when come from config_schema.h (generated from uffdkvm/schema/fields.py): a
 * generic pass over that table first, then the rules between fields that a
 * table does not say. Validating is pure: what this host or build lacks is
 * the setup's and the probe's to say (experiment.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/util.h"
#include "experiment/config.h"
#include "uffd/backing.h"

void ukvm_config_init(struct ukvm_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
#define INIT_U32(m, d)		cfg->m = d;
#define INIT_U64(m, d)		cfg->m = d;
#define INIT_BOOL(m, d)		cfg->m = d;
#define INIT_ENUM(m, d)		cfg->m = d;
#define INIT_DOUBLE(m, d)	cfg->m = d;
#define INIT_STRING(m, d)
#define INIT_CPUS(m, d)
#define INIT_PAGES(m, d)
#define INIT(kind, m, name, d, lo, hi, pyd)	INIT_##kind(m, d)
	UKVM_CONFIG_FIELDS(INIT)
#undef INIT
}

/* ukvm_<type>_name(): the core's names; config_py_<type>(): Python's spellings. */
#define NAME_ENTRY(id, name, py)	[id] = name,
#define PY_ENTRY(id, name, py)		[id] = py,
#define NAME_FUNCTIONS(type, field, prefix)						\
	const char *ukvm_##type##_name(enum ukvm_##type v)				\
	{										\
		static const char *const names[] = { UKVM_##prefix##_NAMES(NAME_ENTRY) };	\
											\
		return (unsigned)v < ARRAY_SIZE(names) ? names[v] : "?";		\
	}										\
	static inline const char *config_py_##type(enum ukvm_##type v)			\
	{										\
		static const char *const names[] = { UKVM_##prefix##_NAMES(PY_ENTRY) };	\
											\
		return (unsigned)v < ARRAY_SIZE(names) ? names[v] : "?";		\
	}
UKVM_CONFIG_ENUMS(NAME_FUNCTIONS)
#undef NAME_FUNCTIONS
#undef PY_ENTRY
#undef NAME_ENTRY

#define BAD(...) return ukvm_err_set(err, UKVM_ERR_CONFIG, 0, __VA_ARGS__)

/* A number's range, lo..hi (lo and hi 0: none). */
static int config_range(const char *name, uint64_t v, uint64_t lo, uint64_t hi,
			struct ukvm_error *err)
{
	if (!lo && !hi)
		return 0;
	if (v < lo || v > hi)
		BAD("%s: must be between %llu and %llu, not %llu", name, (unsigned long long)lo,
		    (unsigned long long)hi, (unsigned long long)v);
	return 0;
}

/* An enum's value, one of its names. */
static int config_enum(const char *name, int v, int hi, struct ukvm_error *err)
{
	if (v < 0 || v > hi)
		BAD("%s: %d is not one of its %d values", name, v, hi + 1);
	return 0;
}

/* A double away from its default: above lo, at most hi. */
static int config_double(const char *name, double v, double d, double lo, double hi,
			 struct ukvm_error *err)
{
	if (v != d && !(v > lo && v <= hi))
		BAD("%s: must be above %g and at most %g, not %g", name, lo, hi, v);
	return 0;
}

/* A CPU list: the pointer with its count, each entry in lo..hi. */
static int config_cpus(const char *name, const int32_t *cpus, uint32_t n, int32_t lo, int32_t hi,
		       struct ukvm_error *err)
{
	uint32_t i;

	if (n && !cpus)
		BAD("%s: %u CPUs, but the list is NULL", name, n);
	for (i = 0; i < n; i++)
		if (cpus[i] < lo || cpus[i] > hi)
			BAD("%s: CPU %d is not a CPU number between %d and %d", name, cpus[i], lo,
			    hi);
	return 0;
}

/* A string member: NUL-terminated inside its buffer. */
static int config_string(const char *name, const char *s, size_t size, struct ukvm_error *err)
{
	if (!memchr(s, 0, size))
		BAD("%s: longer than %zu bytes", name, size - 1);
	return 0;
}

/*
 * The generic pass: each field's range (an enum's values), then each
 * applies rule: a field away from its default where it does not apply is
 * refused, not ignored.
 */
static int config_check_fields(const struct ukvm_config *c, struct ukvm_error *err)
{
	int ret = 0;

#define CHECK_U32(m, name, d, lo, hi)	config_range(name, c->m, lo, hi, err)
#define CHECK_U64(m, name, d, lo, hi)	config_range(name, c->m, lo, hi, err)
#define CHECK_BOOL(m, name, d, lo, hi)	0
#define CHECK_ENUM(m, name, d, lo, hi)	config_enum(name, (int)c->m, hi, err)
#define CHECK_DOUBLE(m, name, d, lo, hi) config_double(name, c->m, d, lo, hi, err)
#define CHECK_STRING(m, name, d, lo, hi) config_string(name, c->m, sizeof(c->m), err)
#define CHECK_CPUS(m, name, d, lo, hi)	config_cpus(name, c->m, c->nr_##m, lo, hi, err)
#define CHECK_PAGES(m, name, d, lo, hi)	(c->nr_##m && !c->m ?				\
	ukvm_err_set(err, UKVM_ERR_CONFIG, 0, "%s: %llu pages, but the list is NULL", name,	\
		     (unsigned long long)c->nr_##m) : 0)
#define CHECK(kind, m, name, d, lo, hi, pyd)				\
	ret = CHECK_##kind(m, name, d, lo, hi);				\
	if (ret)							\
		return ret;
	UKVM_CONFIG_FIELDS(CHECK)
#undef CHECK

#define DEFAULT_U32(m, d)	(c->m == (d))
#define DEFAULT_U64(m, d)	(c->m == (d))
#define DEFAULT_BOOL(m, d)	(c->m == (d))
#define DEFAULT_ENUM(m, d)	(c->m == (d))
#define DEFAULT_DOUBLE(m, d)	(c->m == (d))
#define DEFAULT_STRING(m, d)	(!c->m[0])
#define DEFAULT_CPUS(m, d)	(!c->nr_##m)
#define DEFAULT_PAGES(m, d)	(!c->nr_##m)
#define APPLIES(kind, m, name, d, on, on_type, applies, text, pyd)			\
	if (!(applies) && !DEFAULT_##kind(m, d))					\
		BAD("%s: applies to %s only, not %s=%s; set %s or leave %s at its "	\
		    "default (%s)", name, text, #on, config_py_##on_type(c->on), text,	\
		    name, pyd);
	UKVM_CONFIG_APPLIES(APPLIES)
#undef APPLIES
	return 0;
}

/* The guest's access model (experiment/access.c): touch_percent, access, zipf_theta, accesses. */
static int config_check_access(const struct ukvm_config *c, struct ukvm_error *err)
{
	if (c->access == UKVM_ACCESS_ZIPF && c->zipf_theta == 0)
		BAD("zipf_theta: access='zipf' needs a skew above 0 and at most %g (0.99 is the "
		    "usual one)", UKVM_MAX_ZIPF_THETA);
	if (c->access == UKVM_ACCESS_ZIPF && c->pattern != UKVM_PATTERN_SEQUENTIAL)
		BAD("pattern: %s has no meaning with access='zipf' (its accesses are random draws "
		    "from the Zipf distribution); leave pattern='sequential'",
		    config_py_pattern(c->pattern));
	/* A page's visits per pass, all vCPUs together, are counted in 32 bits. */
	if (c->overlap && c->accesses * c->vcpus > UINT32_MAX)
		BAD("accesses: with overlap, vcpus x accesses (%u x %llu) must stay below 2^32 "
		    "(a page's visits a pass are counted in 32 bits); use fewer accesses",
		    c->vcpus, (unsigned long long)c->accesses);
	/* The access lists hold 32-bit page indices. */
	if ((c->touch_percent < 100 || c->access != UKVM_ACCESS_UNIFORM) &&
	    c->mem_per_vcpu / UKVM_PAGE_SIZE > UKVM_MAX_ACCESSES)
		BAD("mem_per_vcpu: touch_percent and access='zipf' take at most %llu pages "
		    "(%llu GiB) per vCPU, not %llu bytes; use less memory per vCPU",
		    (unsigned long long)UKVM_MAX_ACCESSES,
		    (unsigned long long)(UKVM_MAX_ACCESSES >> 18),
		    (unsigned long long)c->mem_per_vcpu);
	return 0;
}

/*
 * Prefetch installs pages with data (UFFDIO_COPY) into missing pages, and
 * replay's pages must be pages of the region, each once. Called once the
 * region's size is known to be sound.
 */
static int config_check_prefetch(const struct ukvm_config *c, struct ukvm_error *err)
{
	uint64_t region = c->overlap ? c->mem_per_vcpu : c->mem_per_vcpu * c->vcpus;
	uint64_t pages = region / ukvm_backing_page_size(c->backing), i, *seen;

	if (c->prefetch == UKVM_PREFETCH_NONE)
		return 0;
	if (c->uffd_mode != UKVM_UFFD_MISSING || c->resolve != UKVM_RESOLVE_COPY)
		BAD("prefetch: %s installs pages with their data (UFFDIO_COPY) into missing "
		    "pages, so it needs uffd_mode='missing' and resolve='copy', not uffd_mode=%s "
		    "with resolve=%s", config_py_prefetch(c->prefetch),
		    config_py_uffd_mode(c->uffd_mode), config_py_resolve(c->resolve));
	if (c->prefault)
		BAD("prefetch: %s has nothing to install with prefault=True (every page is "
		    "there before the vCPUs start)", config_py_prefetch(c->prefetch));
	if (c->prefetch != UKVM_PREFETCH_REPLAY)
		return 0;
	if (!c->nr_replay)
		BAD("replay_from: prefetch='replay' needs the order to install pages in: a file "
		    "Result.save_touch_order wrote, or a sequence of page indices");
	if (c->nr_replay > pages)
		BAD("replay_from: %llu pages, more than the region's %llu",
		    (unsigned long long)c->nr_replay, (unsigned long long)pages);
	seen = calloc(pages / 64 + 1, sizeof(*seen));
	if (!seen)
		return ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating replay's page set");
	for (i = 0; i < c->nr_replay; i++) {
		uint64_t page = c->replay[i];

		if (page >= pages || (seen[page / 64] & (1ULL << (page % 64)))) {
			free(seen);
			if (page >= pages)
				BAD("replay_from: entry %llu is page %llu, beyond the region's %llu "
				    "pages (indices count pages of the backing's page size from the "
				    "region's start)", (unsigned long long)i,
				    (unsigned long long)page, (unsigned long long)pages);
			BAD("replay_from: entry %llu repeats page %llu; each page is installed once",
			    (unsigned long long)i, (unsigned long long)page);
		}
		seen[page / 64] |= 1ULL << (page % 64);
	}
	free(seen);
	return 0;
}

/*
 * preinstall: pages put in with their data (UFFDIO_COPY) before the vCPUs
 * start, from a local copy of the page source; each a page of the region, once.
 * What it needs of the mode and the source, checked before the
 * memory's rules (which refuse a file source under prefault or zeropage in
 * the source's name): a preinstall config is told what preinstall needs.
 */
static int config_check_preinstall_mode(const struct ukvm_config *c, struct ukvm_error *err)
{
	if (!c->nr_preinstall)
		return 0;
	if (c->uffd_mode != UKVM_UFFD_MISSING || c->resolve != UKVM_RESOLVE_COPY || c->prefault)
		BAD("preinstall: its pages go in with their data (UFFDIO_COPY) before the vCPUs "
		    "start, so it needs uffd_mode='missing' with resolve='copy' and no prefault, not "
		    "uffd_mode=%s with resolve=%s%s", config_py_uffd_mode(c->uffd_mode),
		    config_py_resolve(c->resolve), c->prefault ? " and prefault=True" : "");
	if (c->source == UKVM_SOURCE_SYNTHETIC || !c->source_path[0])
		BAD("preinstall: its pages come from a local copy of the page source, and "
		    "source=%s%s has none: use source='file' with source_path, or "
		    "source='remote' with source_path (the served file)",
		    config_py_source_kind(c->source),
		    c->source_path[0] || c->source == UKVM_SOURCE_SYNTHETIC ? "" : " without source_path");
	return 0;
}

/* preinstall's pages: each a page of the region, none twice. */
static int config_check_preinstall(const struct ukvm_config *c, struct ukvm_error *err)
{
	uint64_t region = c->overlap ? c->mem_per_vcpu : c->mem_per_vcpu * c->vcpus;
	uint64_t pages = region / ukvm_backing_page_size(c->backing), i, *seen;

	if (!c->nr_preinstall)
		return 0;
	if (c->nr_preinstall > pages)
		BAD("preinstall: %llu pages, more than the region's %llu",
		    (unsigned long long)c->nr_preinstall, (unsigned long long)pages);
	seen = calloc(pages / 64 + 1, sizeof(*seen));
	if (!seen)
		return ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating preinstall's page set");
	for (i = 0; i < c->nr_preinstall; i++) {
		uint64_t page = c->preinstall[i];

		if (page >= pages || (seen[page / 64] & (1ULL << (page % 64)))) {
			free(seen);
			if (page >= pages)
				BAD("preinstall: entry %llu is page %llu, beyond the region's %llu "
				    "pages (indices count pages of the backing's page size from the "
				    "region's start)", (unsigned long long)i,
				    (unsigned long long)page, (unsigned long long)pages);
			BAD("preinstall: entry %llu repeats page %llu (of the region's %llu pages); "
			    "each page is installed once", (unsigned long long)i,
			    (unsigned long long)page, (unsigned long long)pages);
		}
		seen[page / 64] |= 1ULL << (page % 64);
	}
	free(seen);
	return 0;
}

/* The memory: the guest's page size, the region's size, what each uffd mode runs on. */
static int config_check_memory(const struct ukvm_config *c, struct ukvm_error *err)
{
	uint64_t unit;

	/* The schema's guest page sizes (uffdkvm/schema/fields.py, GUEST_PAGE_SIZES). */
#define G(bytes, name) c->guest_page_size != (bytes) &&
	if (UKVM_GUEST_PAGE_SIZES(G) true)
		BAD("guest_page_size: must be " UKVM_GUEST_PAGE_SIZE_NAMES ", not %llu bytes",
		    (unsigned long long)c->guest_page_size);
#undef G
	unit = ukvm_backing_page_size(c->backing);
	if (c->guest_page_size > unit)
		unit = c->guest_page_size;
	if (c->mem_per_vcpu % unit)
		BAD("mem_per_vcpu: must be a positive multiple of %llu (%llu KiB: the page size "
		    "of backing=%s and of the guest's mappings), not %llu",
		    (unsigned long long)unit, (unsigned long long)(unit >> 10),
		    config_py_backing(c->backing), (unsigned long long)c->mem_per_vcpu);
	/*
	 * The region, not just its factors: vm.c sizes page tables and adds
	 * guest addresses from it. Divided, so nothing overflows.
	 */
	if (!c->overlap && c->mem_per_vcpu > UKVM_MAX_REGION_BYTES / c->vcpus)
		BAD("mem_per_vcpu: vcpus x mem_per_vcpu (%u x %llu bytes) is more guest memory "
		    "than a test region may have (%llu, 64 TiB); use less memory per vCPU or "
		    "fewer vCPUs", c->vcpus, (unsigned long long)c->mem_per_vcpu,
		    UKVM_MAX_REGION_BYTES);
	if (c->uffd_mode == UKVM_UFFD_MINOR && !ukvm_backing_is_shared(c->backing))
		BAD("uffd_mode: 'minor' needs a shared backing (" UKVM_BACKINGS_SHARED_NAMES "); "
		    "MINOR faults come from pages that are in the page cache but "
		    "not mapped, and %s memory has no page cache. Use backing='shmem' or "
		    "uffd_mode='missing'", config_py_backing(c->backing));
	/*
	 * The snapshot keeps one 4 KiB slot per page and verification checks it
	 * per 4 KiB page; a huge page's first write would save 2 MiB at once.
	 * guest_memfd: KVM writes it for the guest without the host's page
	 * tables, so no write-protect fault could come (gmem.c).
	 */
	if (c->uffd_mode == UKVM_UFFD_WP && !ukvm_backing_takes_wp(c->backing))
		BAD("uffd_mode: 'wp' runs on " UKVM_BACKINGS_WP_NAMES " memory, not %s: the snapshot "
		    "is saved and verified a 4 KiB page at a time (a huge page's first write "
		    "would save it whole), and the guest's writes to guest_memfd never reach "
		    "userfaultfd (KVM maps it for the guest itself). Use backing='anonymous' "
		    "or 'shmem'",
		    config_py_backing(c->backing));
	if (c->wp_async && c->resolver == UKVM_RESOLVER_VCPU)
		BAD("wp_async: delivers no faults (the kernel un-protects each written page "
		    "itself), so resolver='vcpu' would resolve nothing; use resolver='readers'");
	return 0;
}

/* How a missing fault is resolved, and where its bytes come from. */
static int config_check_resolve(const struct ukvm_config *c, struct ukvm_error *err)
{
	if (c->resolve == UKVM_RESOLVE_ZEROPAGE && c->uffd_mode != UKVM_UFFD_MISSING)
		BAD("resolve: 'zeropage' resolves missing faults only; use uffd_mode='missing' or "
		    "resolve='copy'");
	if (c->resolve == UKVM_RESOLVE_ZEROPAGE && ukvm_backing_is_hugetlb(c->backing))
		BAD("resolve: 'zeropage' does not work on hugetlb memory (%s has no "
		    "UFFDIO_ZEROPAGE); use resolve='copy'", config_py_backing(c->backing));
	/*
	 * UFFDIO_MOVE takes a private anonymous page out of one mapping and
	 * puts it in another (mm/userfaultfd.c validate_move_areas): both
	 * must be private anonymous memory; shared or hugetlb memory (and
	 * guest_memfd) is refused by the kernel with EINVAL.
	 */
	if (c->resolve == UKVM_RESOLVE_MOVE && c->uffd_mode != UKVM_UFFD_MISSING)
		BAD("resolve: 'move' resolves missing faults only (a MINOR fault's page is in "
		    "the page cache already); use uffd_mode='missing' or resolve='copy'");
	if (c->resolve == UKVM_RESOLVE_MOVE && !ukvm_backing_is_private_anonymous(c->backing))
		BAD("resolve: 'move' needs private anonymous memory (" UKVM_BACKINGS_PRIVATE_ANONYMOUS_NAMES
		    "): UFFDIO_MOVE cannot move pages of %s memory; use "
		    "resolve='copy' or backing='anonymous'", config_py_backing(c->backing));
	/* A source supplies the data of a fault resolved with data; nothing else fetches. */
	if (c->source != UKVM_SOURCE_SYNTHETIC &&
	    (c->uffd_mode != UKVM_UFFD_MISSING || c->prefault ||
	     (c->resolve != UKVM_RESOLVE_COPY && c->resolve != UKVM_RESOLVE_MOVE)))
		BAD("source: %s supplies the data of missing faults resolved with data "
		    "(uffd_mode='missing' with resolve='copy' or 'move', no prefault), not "
		    "uffd_mode=%s with resolve=%s%s", config_py_source_kind(c->source),
		    config_py_uffd_mode(c->uffd_mode), config_py_resolve(c->resolve),
		    c->prefault ? " and prefault=True" : "");
	if (c->source == UKVM_SOURCE_REMOTE && !c->source_address[0])
		BAD("source_address: source='remote' needs the page server's address "
		    "(uffdkvm.run starts a server and gives it, or give one already running)");
	/* remote: source_path is the local copy to verify against, if there is one. */
	if (c->source == UKVM_SOURCE_FILE && !c->source_path[0])
		BAD("source_path: source=%s needs the path of a snapshot file; write one with "
		    "uffdkvm.make_snapshot(path, config.region_bytes)",
		    config_py_source_kind(c->source));
	return 0;
}

/*
 * Dirty tracking (experiment/dirty.c): pass 1 populates, later passes are
 * tracked; each mechanism's own constraints.
 */
static int config_check_dirty(const struct ukvm_config *c, struct ukvm_error *err)
{
	if (c->dirty_tracking == UKVM_DIRTY_NONE)
		return 0;
	if (c->passes < 2)
		BAD("passes: dirty_tracking=%s needs passes >= 2 (pass 1 populates the memory, "
		    "then each later pass is tracked), not %u; dirty_log_perf_test's -i N is "
		    "passes=N+1", config_py_dirty_tracking(c->dirty_tracking), c->passes);
	if (c->uffd_mode == UKVM_UFFD_WP)
		BAD("dirty_tracking: uffd_mode='wp' write-protects the region for its own "
		    "snapshot; track dirty pages with uffd_mode None or 'missing' (or use "
		    "dirty_tracking='wp_async' with uffd_mode None)");
	if (c->backing == UKVM_BACKING_GUEST_MEMFD)
		BAD("dirty_tracking: KVM does not log writes to guest_memfd memory; use another "
		    "backing");
	if (c->dirty_tracking == UKVM_DIRTY_WP_ASYNC && c->uffd_mode != UKVM_UFFD_NONE)
		BAD("dirty_tracking: 'wp_async' registers the region with a userfaultfd of its own "
		    "(WP_ASYNC), and a region has one userfaultfd; use uffd_mode=None with it (the "
		    "kernel populates pass 1), or another tracker with uffd_mode=%s",
		    config_py_uffd_mode(c->uffd_mode));
	if (c->dirty_tracking == UKVM_DIRTY_WP_ASYNC && c->prefault)
		BAD("dirty_tracking: 'wp_async' with prefault=True: not supported; leave prefault "
		    "False (pass 1 populates)");
	if (c->dirty_clear_pages % 64)
		BAD("dirty_clear_pages: KVM_CLEAR_DIRTY_LOG clears whole 64-page words, so it "
		    "must be a multiple of 64 (or 0: the whole memslot), not %u",
		    c->dirty_clear_pages);
	if (c->dirty_ring_entries & (c->dirty_ring_entries - 1))
		BAD("dirty_ring_entries: a dirty ring's size is a power of two, not %u; use %u",
		    c->dirty_ring_entries, 1u << (31 - __builtin_clz(c->dirty_ring_entries)));
	return 0;
}

/*
 * auto_converge's throttle (experiment/migrate.c): its percentages mean
 * nothing without it, and it starts at or below where it stops.
 */
static int config_check_throttle(const struct ukvm_config *c, struct ukvm_error *err)
{
	struct ukvm_config dflt;	/* the schema's defaults: declared there once */

	if (!c->auto_converge) {
		ukvm_config_init(&dflt);
		if (c->throttle_initial_percent != dflt.throttle_initial_percent)
			BAD("throttle_initial_percent: set, but auto_converge is False: the "
			    "throttle is auto_converge's; set auto_converge=True");
		if (c->throttle_increment_percent != dflt.throttle_increment_percent)
			BAD("throttle_increment_percent: set, but auto_converge is False: the "
			    "throttle is auto_converge's; set auto_converge=True");
		if (c->throttle_max_percent != dflt.throttle_max_percent)
			BAD("throttle_max_percent: set, but auto_converge is False: the "
			    "throttle is auto_converge's; set auto_converge=True");
		return 0;
	}
	if (c->throttle_initial_percent > c->throttle_max_percent)
		BAD("throttle_initial_percent: %u, above throttle_max_percent=%u; the throttle "
		    "starts at or below its most", c->throttle_initial_percent,
		    c->throttle_max_percent);
	/* It throttles after a round that has one after it: a single round never would. */
	if (c->migration == UKVM_MIGRATION_PRECOPY && c->max_rounds < 2)
		BAD("auto_converge: it throttles the rounds after the first, and max_rounds=%u "
		    "has none; use max_rounds >= 2", c->max_rounds);
	if (c->migration == UKVM_MIGRATION_HYBRID && c->precopy_rounds < 2)
		BAD("auto_converge: it throttles the rounds after the first, and "
		    "precopy_rounds=%u has none; use precopy_rounds >= 2", c->precopy_rounds);
	return 0;
}

/* migration: the source's rules (experiment/migrate.c). */
static int config_check_migration(const struct ukvm_config *c, struct ukvm_error *err)
{
	if (c->migration == UKVM_MIGRATION_NONE)
		return 0;
	if (c->uffd_mode != UKVM_UFFD_NONE)
		BAD("migration: the source's memory is its own (pass 1 populates it): use "
		    "uffd_mode=None on the source; the destination's faults are migrate()'s");
	if (c->passes < 2)
		BAD("passes: migration needs passes >= 2 (pass 1 populates, then the guest walks "
		    "on while its pages are sent), not %u", c->passes);
	if (c->dirty_tracking == UKVM_DIRTY_NONE && c->migration != UKVM_MIGRATION_POSTCOPY)
		BAD("dirty_tracking: migration=%s sends what the guest writes during each round: "
		    "it needs a tracker ('bitmap', 'bitmap_manual', 'ring' or 'wp_async')",
		    config_py_migration(c->migration));
	if (!c->migration_dump_path[0])
		BAD("migration_dump_path: migration needs a file to write the source's memory at "
		    "the stop to (migrate() makes one)");
	if (c->backing == UKVM_BACKING_GUEST_MEMFD)
		BAD("migration: guest_memfd memory cannot be read by the host to send; use another "
		    "backing");
	return config_check_throttle(c, err);
}

int ukvm_config_validate(const struct ukvm_config *c, struct ukvm_error *err)
{
	int ret;

	ret = config_check_fields(c, err);
	ret = ret ?: config_check_preinstall_mode(c, err);
	ret = ret ?: config_check_memory(c, err);
	ret = ret ?: config_check_access(c, err);
	ret = ret ?: config_check_resolve(c, err);
	ret = ret ?: config_check_prefetch(c, err);
	ret = ret ?: config_check_preinstall(c, err);
	ret = ret ?: config_check_dirty(c, err);
	ret = ret ?: config_check_migration(c, err);
	if (ret)
		return ret;
#ifdef UKVM_TEST_HOOKS
	if ((unsigned)c->inject >= UKVM_INJECT__COUNT)
		BAD("inject: unknown value %d", c->inject);
#endif
	return 0;
}
#undef BAD
