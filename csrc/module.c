/* SPDX-License-Identifier: MIT */
/*
 * uffdkvm._core: the only file that knows about Python.
 *
 * run(config: dict, progress=None) -> dict converts a dict of plain integers into a
 * struct ukvm_config, runs the experiment with the GIL released, and
 * converts the struct ukvm_result back into dicts and lists of integers.
 * The Python package (uffdkvm/) validates, names and shapes; this file only
 * converts, waits and raises.
 *
 * While the experiment runs, this thread waits in short slices without the
 * GIL and calls PyErr_CheckSignals() between them (as CPython's
 * select.epoll.poll does), so Ctrl-C cancels the run and raises
 * KeyboardInterrupt once the core has cleaned up.
 *
 * It uses only the limited API of Python 3.10 (setup.py defines
 * Py_LIMITED_API), so one abi3 build serves every later Python.
 *
 * Fault injection (the config's "inject" and "inject_after", the INJECT_*
 * constants, uffdkvm._testing) exists only in builds for the tests: setup.py
 * defines UKVM_TEST_HOOKS when UFFDKVM_TEST_HOOKS=1 at build time, and
 * TEST_HOOKS says which build this is.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

#include "ukvm.h"

#define WAIT_SLICE_NS	(50ULL * 1000 * 1000)

static PyObject *CoreError;

/* ---- config: dict -> struct, and back ---- */

/*
 * The field table is the schema's (config_schema.h, generated from
 * uffdkvm/schema.py): every key a core field by its struct member's name,
 * each required, none unknown. Each kind converts one way in and one way out.
 */
enum field_type { F_U32, F_U64, F_BOOL, F_ENUM, F_DOUBLE, F_STRING, F_CPUS, F_PAGES };

struct field {
	const char *name;
	enum field_type type;
	size_t offset;		/* of the member; CPUS, PAGES: of the pointer */
	size_t count;		/* CPUS, PAGES: of the count; STRING: the buffer's size */
};

#define COUNT_U32(m)	0
#define COUNT_U64(m)	0
#define COUNT_BOOL(m)	0
#define COUNT_ENUM(m)	0
#define COUNT_DOUBLE(m)	0
#define COUNT_STRING(m)	sizeof(((struct ukvm_config *)0)->m)
#define COUNT_CPUS(m)	offsetof(struct ukvm_config, nr_##m)
#define COUNT_PAGES(m)	offsetof(struct ukvm_config, nr_##m)
#define FIELD(kind, m, name, d, lo, hi, pyd) \
	{ #m, F_##kind, offsetof(struct ukvm_config, m), COUNT_##kind(m) },
static const struct field config_fields[] = {
	UKVM_CONFIG_FIELDS(FIELD)
};
#undef FIELD

#ifdef UKVM_TEST_HOOKS
/* testhooks.h's fields: optional keys, for the tests' fault injection only. */
static const struct field test_fields[] = {
	{ "inject", F_ENUM, offsetof(struct ukvm_config, inject), 0 },
	{ "inject_after", F_U64, offsetof(struct ukvm_config, inject_after), 0 },
};
#else
/* Config keys only a build with test hooks reads: here they are refused, so
 * that a test asking for a failure cannot pass because none was made. */
static const char *const test_hook_fields[] = { "inject", "inject_after" };
#endif

#define NFIELDS(t) (sizeof(t) / sizeof((t)[0]))

/* A list of CPU numbers, into an int32 array the caller frees. */
static int cpu_list(PyObject *item, const char *key, uint32_t *nr, const int32_t **out)
{
	PyObject *seq;
	int32_t *cpus;
	Py_ssize_t i, n;

	*nr = 0;
	*out = NULL;
	if (item == Py_None)
		return 0;
	seq = PySequence_List(item);	/* any iterable, copied into a list */
	if (!seq) {
		if (PyErr_ExceptionMatches(PyExc_TypeError)) {
			PyErr_Clear();
			PyErr_Format(PyExc_TypeError, "%s: expected a list of CPU numbers", key);
		}
		return -1;
	}
	n = PyList_Size(seq);
	cpus = PyMem_Calloc(n ? (size_t)n : 1, sizeof(int32_t));
	if (!cpus) {
		Py_DECREF(seq);
		PyErr_NoMemory();
		return -1;
	}
	for (i = 0; i < n; i++) {
		long v = PyLong_AsLong(PyList_GetItem(seq, i));	/* borrowed */

		if ((v == -1 && PyErr_Occurred()) || v < 0 || v > INT32_MAX) {
			PyErr_Clear();
			PyErr_Format(PyExc_ValueError, "%s: expected CPU numbers", key);
			Py_DECREF(seq);
			PyMem_Free(cpus);
			return -1;
		}
		cpus[i] = (int32_t)v;
	}
	Py_DECREF(seq);
	*nr = (uint32_t)n;
	*out = cpus;
	return 0;
}

/* Page indices (prefetch replay), into a uint64 array the caller frees. */
static int page_list(PyObject *item, const char *key, uint64_t *nr, const uint64_t **out)
{
	PyObject *seq;
	uint64_t *pages;
	Py_ssize_t i, n;

	*nr = 0;
	*out = NULL;
	if (item == Py_None)
		return 0;
	seq = PySequence_List(item);
	if (!seq)
		return -1;
	n = PyList_Size(seq);
	pages = PyMem_Calloc(n ? (size_t)n : 1, sizeof(uint64_t));
	if (!pages) {
		Py_DECREF(seq);
		PyErr_NoMemory();
		return -1;
	}
	for (i = 0; i < n; i++) {
		unsigned long long v = PyLong_AsUnsignedLongLong(PyList_GetItem(seq, i));

		if (v == (unsigned long long)-1 && PyErr_Occurred()) {
			PyErr_Clear();
			PyErr_Format(PyExc_ValueError, "%s: expected page indices", key);
			Py_DECREF(seq);
			PyMem_Free(pages);
			return -1;
		}
		pages[i] = v;
	}
	Py_DECREF(seq);
	*nr = (uint64_t)n;
	*out = pages;
	return 0;
}

static void config_free(struct ukvm_config *cfg)
{
	PyMem_Free((void *)cfg->pin_vcpus);
	PyMem_Free((void *)cfg->pin_readers);
	PyMem_Free((void *)cfg->replay);
	cfg->pin_vcpus = cfg->pin_readers = NULL;
	cfg->replay = NULL;
}

/*
 * A string field (source_path, source_address): None (""), or a str or
 * bytes in the filesystem's encoding, into buf of size bytes, NUL-terminated.
 */
static int config_string(PyObject *item, const char *name, char *buf, size_t size)
{
	PyObject *bytes;
	Py_ssize_t len;
	char *p;

	buf[0] = 0;
	if (item == Py_None)
		return 0;
	if (PyUnicode_Check(item)) {
		bytes = PyUnicode_EncodeFSDefault(item);
	} else if (PyBytes_Check(item)) {
		bytes = Py_NewRef(item);
	} else {
		PyErr_Format(PyExc_TypeError, "%s: expected a str or bytes", name);
		return -1;
	}
	if (!bytes || PyBytes_AsStringAndSize(bytes, &p, &len)) {
		Py_XDECREF(bytes);
		return -1;
	}
	if ((size_t)len >= size || strlen(p) != (size_t)len) {
		Py_DECREF(bytes);
		PyErr_Format(PyExc_ValueError, "%s: at most %zu bytes without NUL characters",
			     name, size - 1);
		return -1;
	}
	memcpy(buf, p, (size_t)len + 1);
	Py_DECREF(bytes);
	return 0;
}

/* One field's value from item into cfg: 0, or -1 with an exception set. */
static int config_field(const struct field *f, PyObject *item, struct ukvm_config *cfg)
{
	char *dst = (char *)cfg + f->offset;
	unsigned long long v;

	switch (f->type) {
	case F_DOUBLE: {
		double x = PyFloat_AsDouble(item);

		if (x == -1.0 && PyErr_Occurred()) {
			PyErr_Format(PyExc_ValueError, "%s: expected a number", f->name);
			return -1;
		}
		*(double *)dst = x;
		return 0;
	}
	case F_STRING:
		return config_string(item, f->name, dst, f->count);
	case F_CPUS:
		return cpu_list(item, f->name, (uint32_t *)((char *)cfg + f->count),
				(const int32_t **)dst);
	case F_PAGES:
		return page_list(item, f->name, (uint64_t *)((char *)cfg + f->count),
				 (const uint64_t **)dst);
	default:
		break;
	}
	v = PyLong_AsUnsignedLongLong(item);
	if (v == (unsigned long long)-1 && PyErr_Occurred()) {
		PyErr_Format(PyExc_ValueError, "%s: expected a non-negative integer", f->name);
		return -1;
	}
	if ((f->type == F_U32 || f->type == F_ENUM) && v > UINT32_MAX) {
		PyErr_Format(PyExc_ValueError, "%s: %llu is too large", f->name, v);
		return -1;
	}
	if (f->type == F_U32)
		*(uint32_t *)dst = (uint32_t)v;
	else if (f->type == F_ENUM)
		*(int *)dst = (int)v;
	else if (f->type == F_U64)
		*(uint64_t *)dst = v;
	else
		*(bool *)dst = v != 0;
	return 0;
}

static const struct field *field_named(const struct field *t, size_t n, const char *name)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (!strcmp(t[i].name, name))
			return &t[i];
	return NULL;
}

/*
 * The dict, which must hold every core field and nothing else (a test
 * build's inject keys may be there too), into cfg: 0, or -1 with an
 * exception set and nothing left to free.
 */
static int config_from_dict(PyObject *dict, struct ukvm_config *cfg)
{
	PyObject *key, *item;
	Py_ssize_t pos = 0;
	size_t i;

	ukvm_config_init(cfg);
	while (PyDict_Next(dict, &pos, &key, &item)) {
		const char *name = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, NULL) : NULL;

		if (!name) {
			PyErr_Clear();
			PyErr_SetString(PyExc_TypeError, "config keys must be field names (str)");
			return -1;
		}
		if (field_named(config_fields, NFIELDS(config_fields), name))
			continue;
#ifdef UKVM_TEST_HOOKS
		if (field_named(test_fields, NFIELDS(test_fields), name))
			continue;
#else
		for (i = 0; i < NFIELDS(test_hook_fields); i++) {
			if (!strcmp(name, test_hook_fields[i])) {
				PyErr_Format(PyExc_ValueError,
					     "%s: this uffdkvm._core was built without test hooks "
					     "(fault injection); build it with UFFDKVM_TEST_HOOKS=1 in "
					     "the environment", name);
				return -1;
			}
		}
#endif
		PyErr_Format(PyExc_KeyError, "%s: not a field of the core's config (fields: "
			     "uffdkvm/schema.py)", name);
		return -1;
	}
	for (i = 0; i < NFIELDS(config_fields); i++) {
		const struct field *f = &config_fields[i];

		item = PyDict_GetItemString(dict, f->name);	/* borrowed */
		if (!item) {
			config_free(cfg);
			PyErr_Format(PyExc_KeyError, "%s: missing; the core takes every field of "
				     "its config (uffdkvm/schema.py)", f->name);
			return -1;
		}
		if (config_field(f, item, cfg)) {
			config_free(cfg);
			return -1;
		}
	}
#ifdef UKVM_TEST_HOOKS
	for (i = 0; i < NFIELDS(test_fields); i++) {
		item = PyDict_GetItemString(dict, test_fields[i].name);
		if (item && config_field(&test_fields[i], item, cfg)) {
			config_free(cfg);
			return -1;
		}
	}
#endif
	return 0;
}

/* A field's value as the core's struct holds it, as a Python object. */
static PyObject *config_value(const struct field *f, const struct ukvm_config *cfg)
{
	const char *src = (const char *)cfg + f->offset;
	PyObject *list, *o;
	uint64_t i, n;

	switch (f->type) {
	case F_U32:
		return PyLong_FromUnsignedLong(*(const uint32_t *)src);
	case F_ENUM:
		return PyLong_FromLong(*(const int *)src);
	case F_U64:
		return PyLong_FromUnsignedLongLong(*(const uint64_t *)src);
	case F_BOOL:
		return PyBool_FromLong(*(const bool *)src);
	case F_DOUBLE:
		return PyFloat_FromDouble(*(const double *)src);
	case F_STRING:
		return PyUnicode_DecodeFSDefault(src);
	case F_CPUS:
	case F_PAGES:
		break;
	}
	n = f->type == F_CPUS ? *(const uint32_t *)((const char *)cfg + f->count) :
		*(const uint64_t *)((const char *)cfg + f->count);
	list = PyList_New((Py_ssize_t)n);
	for (i = 0; list && i < n; i++) {
		o = f->type == F_CPUS ? PyLong_FromLong((*(const int32_t *const *)src)[i]) :
			PyLong_FromUnsignedLongLong((*(const uint64_t *const *)src)[i]);
		if (!o || PyList_SetItem(list, (Py_ssize_t)i, o))	/* steals o */
			Py_CLEAR(list);
	}
	return list;
}

/* Every core field of cfg, by the struct member's name: run()'s raw["config"]. */
static PyObject *config_to_dict(const struct ukvm_config *cfg)
{
	PyObject *d = PyDict_New(), *o;
	size_t i;

	for (i = 0; d && i < NFIELDS(config_fields); i++) {
		o = config_value(&config_fields[i], cfg);
		if (!o || PyDict_SetItemString(d, config_fields[i].name, o))
			Py_CLEAR(d);
		Py_XDECREF(o);
	}
	return d;
}

/* ---- result: struct -> dict ---- */

/*
 * The result side is tables too: one per result struct, each entry a
 * counter's name (the struct member's, which is the Python field's: ukvm.h),
 * how to convert it, and where it is, walked to build the dicts (as KVM's
 * KVM_STATS_DESC tables describe its binary stats). The fault trace's
 * columns are the entries of trace_fields.
 */
enum result_type {
	R_U64,		/* uint64_t; UKVM_RESULT_NONE: None */
	R_U32,
	R_I32,
	R_U16,
	R_ENUM,		/* an enum of ukvm.h, as its int */
	R_BOOL,		/* bool */
	R_FLAG,		/* uint32_t 0 or 1, as a bool */
	R_STAMP,	/* uint64_t CLOCK_MONOTONIC ns; 0 (the guest's stamp unknown): None */
	R_STRING,	/* char[], NUL-terminated */
	R_HIST,		/* struct ukvm_hist: {count, sum, min, max, buckets} */
	R_CPUS,		/* uint64_t[16] bitmap: the list of CPUs set in it */
	R_U64_ARRAY,	/* uint64_t[len] */
	/* Pointers, with their counts elsewhere (each type says where) */
	R_VCPU_KVM_STATS, /* uint64_t *, ukvm_result.nr_vcpu_stats named vcpu_stat_names */
	R_PASS_END,	/* uint64_t *, ukvm_result.passes of them */
	R_KVM_STATS,	/* ukvm_result.kvm_stats, nr_kvm_stats named kvm_stat_names */
	R_TOUCH_ORDER,	/* ukvm_result.touch_order, nr_touch_order */
	R_PAGE_VISITS,	/* ukvm_result.page_visits (NULL: None), nr_page_visits */
	R_FAULT_TRACE,	/* ukvm_result.fault_trace (NULL: None), nr_fault_trace: columns */
	R_VCPUS,	/* ukvm_result.vcpus, nr_vcpus */
	R_READERS,	/* ukvm_result.readers, nr_readers */
};

struct result_field {
	const char *name;
	enum result_type type;
	size_t offset;
	size_t len;		/* R_U64_ARRAY: its elements */
};

_Static_assert(sizeof(enum ukvm_clock_sync) == sizeof(int) &&
	       sizeof(enum ukvm_source_kind) == sizeof(int), "R_ENUM reads an int");

#define RES(name, type)	  { #name, type, offsetof(struct ukvm_result, name), 0 }
#define VCPU(name, type)  { #name, type, offsetof(struct ukvm_vcpu_result, name), 0 }
#define READER(name, type) { #name, type, offsetof(struct ukvm_reader_result, name), 0 }
#define TRACE(name, type) { #name, type, offsetof(struct ukvm_fault_record, name), 0 }
#define ARRAY(s, name)	  { #name, R_U64_ARRAY, offsetof(struct s, name), \
			    sizeof(((struct s *)0)->name) / sizeof(uint64_t) }

static const struct result_field result_fields[] = {
	RES(threads_start_ns, R_U64),
	RES(threads_joined_ns, R_U64),
	RES(start_ns, R_U64),
	RES(end_ns, R_U64),
	RES(pages_per_vcpu, R_U64),
	RES(region_bytes, R_U64),
	RES(page_size, R_U64),
	RES(region_gpa, R_U64),
	RES(passes, R_U32),
	RES(stats_full, R_BOOL),
	RES(blocktime_ns, R_U64),
	RES(tsc_khz, R_U64),
	RES(clock_sync, R_ENUM),
	RES(clock_error_ns, R_U64),
	RES(misordered_faults, R_U64),
	RES(fault_trace, R_FAULT_TRACE),
	RES(uffds, R_U32),
	RES(faults, R_U64),
	RES(eexist, R_U64),
	RES(spurious_wakeups, R_U64),
	RES(wakes, R_U64),
	RES(source_bytes, R_U64),
	RES(source_ns, R_U64),
	RES(vcpus, R_VCPUS),
	RES(readers, R_READERS),
	RES(kvm_stats, R_KVM_STATS),
	RES(dirty_pages, R_U64),
	RES(source, R_ENUM),
	RES(source_cached_pages_at_start, R_U64),
	RES(touched_pages, R_U64),
	RES(guest_accesses, R_U64),
	RES(page_visits, R_PAGE_VISITS),
	RES(resident_tracked, R_BOOL),
	RES(prefetched_pages, R_U64),
	RES(wasted_prefetch_pages, R_U64),
	RES(touched_units, R_U64),
	RES(faulted_pages, R_U64),
	RES(faults_avoided, R_U64),
	RES(resident_ns, R_U64),
	RES(pushed_pages, R_U64),
	RES(pusher_eexist, R_U64),
	RES(prefetch_eexist, R_U64),
	RES(pusher_source_bytes, R_U64),
	RES(touch_order, R_TOUCH_ORDER),
	RES(verified, R_BOOL),
	RES(bad_pages, R_U64),
	RES(verify_message, R_STRING),
};

static const struct result_field vcpu_fields[] = {
	VCPU(index, R_U32),
	VCPU(tid, R_I32),
	VCPU(start_ns, R_U64),
	VCPU(end_ns, R_U64),
	VCPU(pages, R_U64),
	VCPU(exits, R_U64),
	VCPU(userspace_exits, R_U64),
	VCPU(fault_exits, R_U64),
	VCPU(regs_fault_exits, R_U64),
	VCPU(kvm_stats, R_VCPU_KVM_STATS),
	VCPU(pass_end_ns, R_PASS_END),
	VCPU(cpu_ns, R_U64),
	VCPU(cpus, R_CPUS),
	VCPU(faults, R_U64),
	VCPU(eexist, R_U64),
	VCPU(blocked_ns, R_U64),
	VCPU(service_latency, R_HIST),
	VCPU(queue_latency, R_HIST),
	VCPU(resume_latency, R_HIST),
	VCPU(fault_latency, R_HIST),
	VCPU(access_cycles, R_U64),
	ARRAY(ukvm_vcpu_result, access_hist),
};

static const struct result_field reader_fields[] = {
	READER(uffd, R_U32),
	READER(index, R_U32),
	READER(faults, R_U64),
	READER(wakeups, R_U64),
	READER(spurious_wakeups, R_U64),
	READER(eexist, R_U64),
	READER(tid, R_I32),
	READER(busy_ns, R_U64),
	READER(copies, R_U64),
	READER(zeropages, R_U64),
	READER(continues, R_U64),
	READER(moves, R_U64),
	READER(unprotects, R_U64),
	READER(reads, R_U64),
	ARRAY(ukvm_reader_result, read_sizes),
	READER(ring_completions, R_U64),
	READER(prefetched, R_U64),
	READER(prefetch_eexist, R_U64),
	READER(wakes, R_U64),
	READER(context_switches, R_U64),
	READER(voluntary_context_switches, R_U64),
	READER(cpu_ns, R_U64),
	READER(cpus, R_CPUS),
	READER(service_latency, R_HIST),
	READER(queue_latency, R_HIST),
	READER(source_bytes, R_U64),
	READER(source_ns, R_U64),
};

/* The fault trace's columns, one list each, in ukvm_fault_record's order. */
static const struct result_field trace_fields[] = {
	TRACE(raised_ns, R_STAMP),
	TRACE(read_ns, R_U64),
	TRACE(resolved_ns, R_U64),
	TRACE(resumed_ns, R_STAMP),
	TRACE(gpa, R_U64),
	TRACE(vcpu, R_I32),
	TRACE(uffd, R_U16),
	TRACE(reader, R_U16),
	TRACE(eexist, R_FLAG),
	TRACE(write, R_FLAG),
};

#define NR_TRACE_FIELDS	(sizeof(trace_fields) / sizeof(trace_fields[0]))

static int set_u64(PyObject *d, const char *key, uint64_t v)
{
	PyObject *o = PyLong_FromUnsignedLongLong(v);
	int ret;

	if (!o)
		return -1;
	ret = PyDict_SetItemString(d, key, o);
	Py_DECREF(o);
	return ret;
}

/* d[key] = o, o's reference taken (NULL: the error already set). */
static int set_obj(PyObject *d, const char *key, PyObject *o)
{
	int ret;

	if (!o)
		return -1;
	ret = PyDict_SetItemString(d, key, o);
	Py_DECREF(o);
	return ret;
}

/* A new list of n items, or NULL with MemoryError where n cannot be one. */
static PyObject *list_new(uint64_t n)
{
	if (n > (uint64_t)PY_SSIZE_T_MAX)
		return PyErr_NoMemory();
	return PyList_New((Py_ssize_t)n);
}

static PyObject *u64_list(const uint64_t *values, uint64_t n)
{
	PyObject *list = list_new(values ? n : 0);
	uint64_t i;

	for (i = 0; list && values && i < n; i++) {
		PyObject *o = PyLong_FromUnsignedLongLong(values[i]);

		if (!o || PyList_SetItem(list, (Py_ssize_t)i, o)) {	/* steals o, even on failure */
			Py_CLEAR(list);
			break;
		}
	}
	return list;
}

/* {name: value} for KVM's statistics, or an empty dict without them. */
static PyObject *stats_dict(char *const *names, const uint64_t *values, uint32_t n)
{
	PyObject *d = PyDict_New();
	uint32_t i;

	for (i = 0; d && values && i < n; i++) {
		if (set_u64(d, names[i], values[i])) {
			Py_CLEAR(d);
		}
	}
	return d;
}

/* The CPUs a thread could run on, from its affinity bitmap. */
static PyObject *cpus_list(const uint64_t cpus[16])
{
	PyObject *list = PyList_New(0);
	int cpu;

	for (cpu = 0; list && cpu < 1024; cpu++) {
		if (cpus[cpu / 64] & (1ULL << (cpu % 64))) {
			PyObject *o = PyLong_FromLong(cpu);

			if (!o || PyList_Append(list, o)) {
				Py_XDECREF(o);
				Py_CLEAR(list);
				break;
			}
			Py_DECREF(o);
		}
	}
	return list;
}

static PyObject *hist_to_dict(const struct ukvm_hist *h)
{
	PyObject *d = PyDict_New();
	PyObject *buckets = u64_list(h->buckets, UKVM_HIST_BUCKETS);

	if (!d || !buckets || set_u64(d, "count", h->count) || set_u64(d, "sum", h->sum) ||
	    set_u64(d, "min", h->min) || set_u64(d, "max", h->max) ||
	    PyDict_SetItemString(d, "buckets", buckets)) {
		Py_XDECREF(d);
		d = NULL;
	}
	Py_XDECREF(buckets);
	return d;
}

/* Result.page_visits: a list of counts, or None. */
static PyObject *visits_to_list(const uint32_t *v, uint64_t n)
{
	PyObject *list, *item;
	uint64_t i;

	if (!v)
		return Py_NewRef(Py_None);
	list = list_new(n);
	for (i = 0; list && i < n; i++) {
		item = PyLong_FromUnsignedLong(v[i]);
		if (!item || PyList_SetItem(list, (Py_ssize_t)i, item))	/* steals item */
			Py_CLEAR(list);
	}
	return list;
}

static PyObject *trace_to_dict(const struct ukvm_fault_record *t, uint64_t n);
static PyObject *table_list(const void *items, uint64_t n, size_t size,
			    const struct result_field *fields, size_t nr_fields,
			    const struct ukvm_result *res);

#define AT(base, f, type)	((const type *)((const char *)(base) + (f)->offset))

/* One field of the struct at base as a new reference (res: where its counts are). */
static PyObject *field_value(const void *base, const struct result_field *f,
			     const struct ukvm_result *res)
{
	uint64_t u;

	switch (f->type) {
	case R_U64:
		u = *AT(base, f, uint64_t);
		return u == UKVM_RESULT_NONE ? Py_NewRef(Py_None) : PyLong_FromUnsignedLongLong(u);
	case R_U32:
		return PyLong_FromUnsignedLong(*AT(base, f, uint32_t));
	case R_I32:
		return PyLong_FromLong(*AT(base, f, int32_t));
	case R_U16:
		return PyLong_FromLong(*AT(base, f, uint16_t));
	case R_ENUM:
		return PyLong_FromLong(*AT(base, f, int));
	case R_BOOL:
		return PyBool_FromLong(*AT(base, f, bool));
	case R_FLAG:
		return PyBool_FromLong(*AT(base, f, uint32_t) != 0);
	case R_STAMP:
		u = *AT(base, f, uint64_t);
		return u ? PyLong_FromUnsignedLongLong(u) : Py_NewRef(Py_None);
	case R_STRING:
		return PyUnicode_FromString(AT(base, f, char));
	case R_HIST:
		return hist_to_dict(AT(base, f, struct ukvm_hist));
	case R_CPUS:
		return cpus_list(AT(base, f, uint64_t));
	case R_U64_ARRAY:
		return u64_list(AT(base, f, uint64_t), f->len);
	case R_VCPU_KVM_STATS:
		/* Every vCPU has the same statistics; their names are kept once, in res. */
		return stats_dict(res->vcpu_stat_names, *AT(base, f, uint64_t *),
				  res->nr_vcpu_stats);
	case R_PASS_END:
		return u64_list(*AT(base, f, uint64_t *), res->passes);
	case R_KVM_STATS:
		return stats_dict(res->kvm_stat_names, res->kvm_stats, res->nr_kvm_stats);
	case R_TOUCH_ORDER:
		return u64_list(res->touch_order, res->nr_touch_order);
	case R_PAGE_VISITS:
		return visits_to_list(res->page_visits, res->nr_page_visits);
	case R_FAULT_TRACE:
		return res->fault_trace ? trace_to_dict(res->fault_trace, res->nr_fault_trace)
					: Py_NewRef(Py_None);
	case R_VCPUS:
		return table_list(res->vcpus, res->nr_vcpus, sizeof(*res->vcpus), vcpu_fields,
				  sizeof(vcpu_fields) / sizeof(vcpu_fields[0]), res);
	case R_READERS:
		return table_list(res->readers, res->nr_readers, sizeof(*res->readers),
				  reader_fields, sizeof(reader_fields) / sizeof(reader_fields[0]),
				  res);
	}
	PyErr_Format(PyExc_SystemError, "result field %s: no conversion", f->name);
	return NULL;
}

/* {name: value} for every entry of fields, read from the struct at base. */
static PyObject *table_dict(const void *base, const struct result_field *fields,
			    size_t nr_fields, const struct ukvm_result *res)
{
	PyObject *d = PyDict_New();
	size_t i;

	for (i = 0; d && i < nr_fields; i++) {
		PyObject *o = field_value(base, &fields[i], res);

		if (!o || PyDict_SetItemString(d, fields[i].name, o))
			Py_CLEAR(d);
		Py_XDECREF(o);
	}
	return d;
}

/* A dict per item of an array of structs. */
static PyObject *table_list(const void *items, uint64_t n, size_t size,
			    const struct result_field *fields, size_t nr_fields,
			    const struct ukvm_result *res)
{
	PyObject *list = list_new(n);
	uint64_t i;

	for (i = 0; list && i < n; i++) {
		PyObject *o = table_dict((const char *)items + i * size, fields, nr_fields, res);

		if (!o || PyList_SetItem(list, (Py_ssize_t)i, o))	/* steals o */
			Py_CLEAR(list);
	}
	return list;
}

/* The fault records as columns: one list per entry of trace_fields. */
static PyObject *trace_to_dict(const struct ukvm_fault_record *t, uint64_t n)
{
	PyObject *d = PyDict_New();
	size_t c;
	uint64_t i;

	for (c = 0; d && c < NR_TRACE_FIELDS; c++) {
		PyObject *col = list_new(n);

		for (i = 0; col && i < n; i++) {
			PyObject *v = field_value(&t[i], &trace_fields[c], NULL);

			if (!v || PyList_SetItem(col, (Py_ssize_t)i, v))	/* steals v */
				Py_CLEAR(col);
		}
		if (!col || PyDict_SetItemString(d, trace_fields[c].name, col))
			Py_CLEAR(d);
		Py_XDECREF(col);
	}
	return d;
}

static PyObject *result_to_dict(const struct ukvm_result *res)
{
	return table_dict(res, result_fields, sizeof(result_fields) / sizeof(result_fields[0]),
			  res);
}

/* ---- run ---- */

static void raise_core_error(const struct ukvm_error *err)
{
	PyObject *args = Py_BuildValue("(iis)", (int)err->kind, err->errnum, err->message);

	if (args) {
		PyErr_SetObject(CoreError, args);
		Py_DECREF(args);
	}
}

/*
 * Calls progress(phase, pages_done, pages_total) with a list per vCPU: 0, or
 * -1 with the callback's exception set.
 */
static int report_progress(struct ukvm_experiment *exp, PyObject *progress, uint32_t vcpus,
			   uint64_t *done, uint64_t *total)
{
	PyObject *done_list, *total_list, *ret;
	const char *phase;

	ukvm_experiment_progress(exp, &phase, done, total, vcpus);
	done_list = u64_list(done, vcpus);
	total_list = u64_list(total, vcpus);
	ret = done_list && total_list ?
		PyObject_CallFunction(progress, "sOO", phase, done_list, total_list) : NULL;
	Py_XDECREF(done_list);
	Py_XDECREF(total_list);
	if (!ret)
		return -1;
	Py_DECREF(ret);
	return 0;
}

static PyObject *core_run(PyObject *self, PyObject *args)
{
	struct ukvm_experiment *exp;
	struct ukvm_config cfg;
	struct ukvm_result res;
	struct ukvm_error err;
	PyObject *arg, *progress = Py_None, *ran;
	uint64_t *done = NULL, *total = NULL;
	bool interrupted = false;
	uint32_t vcpus;
	PyObject *out;
	int ret;

	(void)self;
	if (!PyArg_ParseTuple(args, "O|O:run", &arg, &progress))
		return NULL;
	if (progress != Py_None && !PyCallable_Check(progress)) {
		PyErr_SetString(PyExc_TypeError, "run(): progress must be callable or None");
		return NULL;
	}
	if (!PyDict_Check(arg)) {
		PyErr_SetString(PyExc_TypeError, "run() takes a dict of config fields");
		return NULL;
	}
	if (config_from_dict(arg, &cfg))
		return NULL;
	vcpus = cfg.vcpus;
	if (progress != Py_None) {
		done = PyMem_Calloc(vcpus ? vcpus : 1, sizeof(*done));
		total = PyMem_Calloc(vcpus ? vcpus : 1, sizeof(*total));
		if (!done || !total) {
			PyMem_Free(done);
			PyMem_Free(total);
			config_free(&cfg);
			return PyErr_NoMemory();
		}
	}

	Py_BEGIN_ALLOW_THREADS
	ret = ukvm_experiment_start(&cfg, &exp, &err);
	Py_END_ALLOW_THREADS
	config_free(&cfg);	/* the experiment keeps its own copies */
	if (ret) {
		PyMem_Free(done);
		PyMem_Free(total);
		raise_core_error(&err);
		return NULL;
	}
	/* The config the core runs, from its own copy: raw["config"]. */
	ran = config_to_dict(ukvm_experiment_config(exp));
	if (!ran)
		interrupted = true;	/* out of memory: cancel, clean up, raise */

	if (interrupted)
		ukvm_experiment_cancel(exp);
	while (!interrupted) {
		Py_BEGIN_ALLOW_THREADS
		ret = ukvm_experiment_wait(exp, WAIT_SLICE_NS);
		Py_END_ALLOW_THREADS
		if (ret == 0)
			break;
		/*
		 * A signal handler or the progress callback raised (Ctrl-C, or
		 * the caller's own exception): stop, clean up, re-raise.
		 */
		if (PyErr_CheckSignals() < 0 ||
		    (done && report_progress(exp, progress, vcpus, done, total) < 0)) {
			interrupted = true;
			ukvm_experiment_cancel(exp);
			break;
		}
	}
	PyMem_Free(done);
	PyMem_Free(total);

	Py_BEGIN_ALLOW_THREADS
	ret = ukvm_experiment_finish(exp, &res, &err);
	Py_END_ALLOW_THREADS
	if (interrupted) {
		if (!ret)
			ukvm_result_free(&res);
		Py_XDECREF(ran);
		return NULL;	/* the signal handler's exception is still set */
	}
	if (ret) {
		Py_DECREF(ran);
		raise_core_error(&err);
		return NULL;
	}
	out = result_to_dict(&res);
	ukvm_result_free(&res);
	if (out && PyDict_SetItemString(out, "config", ran))
		Py_CLEAR(out);
	Py_DECREF(ran);
	return out;
}

static PyObject *core_validate(PyObject *self, PyObject *arg)
{
	struct ukvm_config cfg;
	struct ukvm_error err;
	int ret;

	(void)self;
	if (!PyDict_Check(arg)) {
		PyErr_SetString(PyExc_TypeError, "validate() takes a dict of config fields");
		return NULL;
	}
	if (config_from_dict(arg, &cfg))
		return NULL;
	memset(&err, 0, sizeof(err));
	ret = ukvm_config_validate(&cfg, &err);	/* pure, quick: the GIL is kept */
	config_free(&cfg);
	if (ret) {
		raise_core_error(&err);
		return NULL;
	}
	Py_RETURN_NONE;
}

static PyObject *core_probe(PyObject *self, PyObject *arg)
{
	struct ukvm_config cfg;
	struct ukvm_error err;
	int ret;

	(void)self;
	if (!PyDict_Check(arg)) {
		PyErr_SetString(PyExc_TypeError, "probe() takes a dict of config fields");
		return NULL;
	}
	if (config_from_dict(arg, &cfg))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	ret = ukvm_probe(&cfg, &err);
	Py_END_ALLOW_THREADS
	config_free(&cfg);
	if (ret) {
		raise_core_error(&err);
		return NULL;
	}
	Py_RETURN_NONE;
}

static PyObject *core_wait_idle(PyObject *self, PyObject *args)
{
	double timeout_s = 10.0;
	struct ukvm_error err;
	int ret;

	(void)self;
	if (!PyArg_ParseTuple(args, "|d:wait_idle", &timeout_s))
		return NULL;
	if (!(timeout_s >= 0 && timeout_s < 1e9)) {
		PyErr_SetString(PyExc_ValueError, "wait_idle: timeout_s must be between 0 and 1e9");
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS
	ret = ukvm_wait_idle_for((uint64_t)(timeout_s * 1e9), &err);
	Py_END_ALLOW_THREADS
	if (ret) {
		raise_core_error(&err);
		return NULL;
	}
	Py_RETURN_NONE;
}

static PyObject *core_make_snapshot(PyObject *self, PyObject *args)
{
	unsigned long long size, seed;
	struct ukvm_error err;
	PyObject *path_obj;
	char *path;
	int ret;

	(void)self;
	if (!PyArg_ParseTuple(args, "O&KK:make_snapshot", PyUnicode_FSConverter, &path_obj,
			      &size, &seed))
		return NULL;
	path = PyBytes_AsString(path_obj);
	if (!path) {
		Py_DECREF(path_obj);
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS
	ret = ukvm_snapshot_write(path, size, seed, &err);
	Py_END_ALLOW_THREADS
	Py_DECREF(path_obj);
	if (ret) {
		raise_core_error(&err);
		return NULL;
	}
	Py_RETURN_NONE;
}

/* ---- the page server (csrc/remote/): its process and its client ---- */

/* The counters as {name: value}, the names from ukvm.h's one list. */
static PyObject *remote_stats_to_dict(const struct ukvm_remote_stats *st)
{
	PyObject *d = PyDict_New();

#define REMOTE_STATS_SET(name, meaning) \
	if (d && set_u64(d, #name, st->name)) \
		Py_CLEAR(d);
	UKVM_REMOTE_STATS_FIELDS(REMOTE_STATS_SET)
#undef REMOTE_STATS_SET
	return d;
}

static PyObject *core_pageserver_serve(PyObject *self, PyObject *args)
{
	struct ukvm_pageserver_config cfg = { 0 };
	unsigned long long latency_ns, bandwidth_mbps;
	unsigned int max_inflight;
	struct ukvm_remote_stats st;
	struct ukvm_error err;
	int ready_fd, stop_fd, ret;

	(void)self;
	if (!PyArg_ParseTuple(args, "ssKKIii:pageserver_serve", &cfg.snapshot_path, &cfg.listen,
			      &latency_ns, &bandwidth_mbps, &max_inflight, &ready_fd, &stop_fd))
		return NULL;
	cfg.latency_ns = latency_ns;
	cfg.bandwidth_mbps = bandwidth_mbps;
	cfg.max_inflight = max_inflight;
	Py_BEGIN_ALLOW_THREADS
	ret = ukvm_pageserver_serve(&cfg, ready_fd, stop_fd, &st, &err);
	Py_END_ALLOW_THREADS
	if (ret) {
		raise_core_error(&err);
		return NULL;
	}
	return remote_stats_to_dict(&st);
}

/*
 * A client connection (uffdkvm/pageserver.py's PageClient) is a capsule
 * around one of these; the capsule's destructor closes it. busy is set
 * (under the GIL) while a call runs without the GIL, so that a second
 * thread's call or close() is refused instead of racing the first.
 */
#define REMOTE_CONN_CAPSULE	"uffdkvm._core.remote_conn"

struct remote_client {
	struct ukvm_remote_conn *conn;	/* NULL once closed */
	bool busy;
	uint64_t longest;		/* the longest length asked among outstanding requests */
};

static void remote_client_destroy(PyObject *capsule)
{
	struct remote_client *rc = PyCapsule_GetPointer(capsule, REMOTE_CONN_CAPSULE);

	if (!rc)
		return;
	ukvm_remote_close(rc->conn);
	PyMem_Free(rc);
}

/* The open, idle client behind capsule, marked busy; NULL with an exception set. */
static struct remote_client *remote_client_take(PyObject *capsule)
{
	struct remote_client *rc = PyCapsule_GetPointer(capsule, REMOTE_CONN_CAPSULE);

	if (!rc)
		return NULL;
	if (!rc->conn) {
		PyErr_SetString(PyExc_ValueError, "page server client: the connection is closed");
		return NULL;
	}
	if (rc->busy) {
		PyErr_SetString(PyExc_RuntimeError, "page server client: the connection is in use "
				"by another thread (one thread at a time)");
		return NULL;
	}
	rc->busy = true;
	return rc;
}

/* timeout_s in [0, 1e6) seconds as ns; -1 with ValueError otherwise. */
static int remote_timeout_ns(double timeout_s, uint64_t *out)
{
	if (!(timeout_s >= 0 && timeout_s < 1e6)) {
		PyErr_SetString(PyExc_ValueError, "page server client: timeout_s must be in "
				"[0, 1e6) seconds");
		return -1;
	}
	*out = (uint64_t)(timeout_s * 1e9);
	return 0;
}

static PyObject *core_remote_connect(PyObject *self, PyObject *args)
{
	struct ukvm_remote_conn *conn = NULL;
	struct remote_client *rc;
	struct ukvm_error err;
	const char *address;
	PyObject *capsule;
	int ret;

	(void)self;
	if (!PyArg_ParseTuple(args, "s:remote_connect", &address))
		return NULL;
	rc = PyMem_Calloc(1, sizeof(*rc));
	if (!rc)
		return PyErr_NoMemory();
	Py_BEGIN_ALLOW_THREADS
	ret = ukvm_remote_connect(address, &conn, &err);
	Py_END_ALLOW_THREADS
	if (ret) {
		PyMem_Free(rc);
		raise_core_error(&err);
		return NULL;
	}
	rc->conn = conn;
	capsule = PyCapsule_New(rc, REMOTE_CONN_CAPSULE, remote_client_destroy);
	if (!capsule) {
		ukvm_remote_close(conn);
		PyMem_Free(rc);
	}
	return capsule;
}

static PyObject *core_remote_close(PyObject *self, PyObject *capsule)
{
	struct remote_client *rc = PyCapsule_GetPointer(capsule, REMOTE_CONN_CAPSULE);

	(void)self;
	if (!rc)
		return NULL;
	if (rc->busy) {
		PyErr_SetString(PyExc_RuntimeError, "page server client: close() while another "
				"thread's call is on the connection");
		return NULL;
	}
	ukvm_remote_close(rc->conn);
	rc->conn = NULL;
	Py_RETURN_NONE;
}

static PyObject *core_remote_outstanding(PyObject *self, PyObject *capsule)
{
	struct remote_client *rc = PyCapsule_GetPointer(capsule, REMOTE_CONN_CAPSULE);

	(void)self;
	if (!rc)
		return NULL;
	return PyLong_FromUnsignedLong(rc->conn ? ukvm_remote_outstanding(rc->conn) : 0);
}

static PyObject *core_remote_fetch(PyObject *self, PyObject *args)
{
	unsigned long long offset, length;
	struct remote_client *rc;
	struct ukvm_error err;
	PyObject *capsule, *out = NULL;
	uint64_t timeout_ns;
	double timeout_s;
	void *buf;
	int urgent, ret;

	(void)self;
	if (!PyArg_ParseTuple(args, "OKKpd:remote_fetch", &capsule, &offset, &length, &urgent,
			      &timeout_s) || remote_timeout_ns(timeout_s, &timeout_ns))
		return NULL;
	if (length > UKVM_REMOTE_MAX_LENGTH) {
		PyErr_SetString(PyExc_ValueError, "page server client: a length above the "
				"protocol's maximum (UKVM_REMOTE_MAX_LENGTH, 1 GiB)");
		return NULL;
	}
	rc = remote_client_take(capsule);
	if (!rc)
		return NULL;
	buf = PyMem_Malloc(length ? length : 1);
	if (!buf) {
		rc->busy = false;
		return PyErr_NoMemory();
	}
	Py_BEGIN_ALLOW_THREADS
	ret = ukvm_remote_fetch_for(rc->conn, offset, length, urgent, buf, timeout_ns, &err);
	Py_END_ALLOW_THREADS
	rc->busy = false;
	if (ret)
		raise_core_error(&err);
	else
		out = PyBytes_FromStringAndSize(buf, (Py_ssize_t)length);
	PyMem_Free(buf);
	return out;
}

/* The most ranges one remote_send() takes: 16 bytes each on the wire, 256 MiB in all. */
#define REMOTE_SEND_MAX		(1 << 24)

static PyObject *core_remote_send(PyObject *self, PyObject *args)
{
	struct ukvm_remote_range *ranges = NULL;
	struct remote_client *rc = NULL;
	uint64_t timeout_ns, longest = 0;
	PyObject *capsule, *seq;
	struct ukvm_error err;
	Py_ssize_t n, i;
	double timeout_s;
	int urgent, ret;

	(void)self;
	if (!PyArg_ParseTuple(args, "OOpd:remote_send", &capsule, &seq, &urgent, &timeout_s) ||
	    remote_timeout_ns(timeout_s, &timeout_ns))
		return NULL;
	n = PySequence_Size(seq);
	if (n < 0)
		return NULL;
	if (n < 1 || n > REMOTE_SEND_MAX) {
		PyErr_SetString(PyExc_ValueError, "remote_send: from 1 to 2**24 ranges");
		return NULL;
	}
	ranges = PyMem_Calloc((size_t)n, sizeof(*ranges));
	if (!ranges)
		return PyErr_NoMemory();
	for (i = 0; i < n; i++) {
		PyObject *item = PySequence_GetItem(seq, i);
		unsigned long long offset, length;
		int ok = item && PyArg_ParseTuple(item, "KK:remote_send range", &offset, &length);

		Py_XDECREF(item);
		if (!ok)
			goto error;
		ranges[i] = (struct ukvm_remote_range){ .offset = offset, .length = length };
		if (length > longest)
			longest = length;
	}
	rc = remote_client_take(capsule);
	if (!rc)
		goto error;
	Py_BEGIN_ALLOW_THREADS
	ret = ukvm_remote_send_for(rc->conn, ranges, (uint32_t)n, urgent, timeout_ns, &err);
	Py_END_ALLOW_THREADS
	rc->busy = false;
	if (ret) {
		raise_core_error(&err);
		goto error;
	}
	if (longest > rc->longest)
		rc->longest = longest;
	PyMem_Free(ranges);
	Py_RETURN_NONE;
error:
	PyMem_Free(ranges);
	return NULL;
}

static PyObject *core_remote_recv(PyObject *self, PyObject *args)
{
	struct ukvm_remote_answer answer = { 0 };
	struct remote_client *rc;
	struct ukvm_error err;
	PyObject *capsule, *data, *out = NULL;
	uint64_t timeout_ns, size;
	double timeout_s;
	void *buf;
	int ret;

	(void)self;
	if (!PyArg_ParseTuple(args, "Od:remote_recv", &capsule, &timeout_s) ||
	    remote_timeout_ns(timeout_s, &timeout_ns))
		return NULL;
	rc = remote_client_take(capsule);
	if (!rc)
		return NULL;
	/* A reply longer than every outstanding request asked for is refused (-EPROTO). */
	size = rc->longest;
	buf = PyMem_Malloc(size ? size : 1);
	if (!buf) {
		rc->busy = false;
		return PyErr_NoMemory();
	}
	Py_BEGIN_ALLOW_THREADS
	ret = ukvm_remote_recv_for(rc->conn, &answer, buf, size, timeout_ns, &err);
	Py_END_ALLOW_THREADS
	rc->busy = false;
	if (!ukvm_remote_outstanding(rc->conn))
		rc->longest = 0;
	if (ret) {
		raise_core_error(&err);
	} else {
		data = PyBytes_FromStringAndSize(buf, (Py_ssize_t)answer.length);
		if (data)
			out = Py_BuildValue("(KOiN)", (unsigned long long)answer.offset,
					    answer.urgent ? Py_True : Py_False, (int)answer.status,
					    data);
	}
	PyMem_Free(buf);
	return out;
}

static PyObject *core_remote_stats(PyObject *self, PyObject *args)
{
	struct ukvm_remote_stats st;
	struct remote_client *rc;
	struct ukvm_error err;
	PyObject *capsule;
	uint64_t timeout_ns;
	double timeout_s;
	int ret;

	(void)self;
	if (!PyArg_ParseTuple(args, "Od:remote_stats", &capsule, &timeout_s) ||
	    remote_timeout_ns(timeout_s, &timeout_ns))
		return NULL;
	rc = remote_client_take(capsule);
	if (!rc)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	ret = ukvm_remote_stats_for(rc->conn, &st, timeout_ns, &err);
	Py_END_ALLOW_THREADS
	rc->busy = false;
	if (ret) {
		raise_core_error(&err);
		return NULL;
	}
	return remote_stats_to_dict(&st);
}

/* REMOTE_STATS_FIELDS: the counters' names, in the wire's order (ukvm.h's one list). */
static int add_remote_stats_fields(PyObject *m)
{
	static const char *const names[] = {
#define REMOTE_STATS_NAME(name, meaning) #name,
		UKVM_REMOTE_STATS_FIELDS(REMOTE_STATS_NAME)
#undef REMOTE_STATS_NAME
	};
	static const char *const meanings[] = {
#define REMOTE_STATS_MEANING(name, meaning) meaning,
		UKVM_REMOTE_STATS_FIELDS(REMOTE_STATS_MEANING)
#undef REMOTE_STATS_MEANING
	};
	PyObject *fields = PyTuple_New(sizeof(names) / sizeof(names[0])), *doc = PyDict_New();
	size_t i;
	int ret = -1;

	for (i = 0; fields && doc && i < sizeof(names) / sizeof(names[0]); i++) {
		PyObject *name = PyUnicode_FromString(names[i]);

		if (!name || PyTuple_SetItem(fields, (Py_ssize_t)i, name))	/* steals name */
			goto out;
		if (set_obj(doc, names[i], PyUnicode_FromString(meanings[i])))
			goto out;
	}
	if (fields && doc && !PyModule_AddObjectRef(m, "REMOTE_STATS_FIELDS", fields))
		ret = PyModule_AddObjectRef(m, "REMOTE_STATS_MEANINGS", doc);
out:
	Py_XDECREF(fields);
	Py_XDECREF(doc);
	return ret;
}

static PyMethodDef core_methods[] = {
	{ "make_snapshot", core_make_snapshot, METH_VARARGS,
	  "make_snapshot(path, size: int, seed: int) -> None\n\nWrite a snapshot file of size "
	  "bytes whose every 8-byte word is a seeded function of (seed, offset); the GIL is "
	  "released while it writes. Raises CoreError(kind, errno, message) on failure." },
	{ "wait_idle", core_wait_idle, METH_VARARGS,
	  "wait_idle(timeout_s=10.0) -> None\n\nWait until failed runs have released their "
	  "threads, fds and memory (a failed or interrupted run returns first and frees its "
	  "memory after; one with a thread that would not stop keeps everything until it "
	  "leaves). Raises CoreError naming what still holds on after timeout_s." },
	{ "validate", core_validate, METH_O,
	  "validate(config: dict) -> None\n\nRun the core's validator alone (the one "
	  "validator: uffdkvm.Config calls it). Raises CoreError(ERR_CONFIG, 0, message), the "
	  "message starting with the field's name, for a config the core refuses." },
	{ "probe", core_probe, METH_O,
	  "probe(config: dict) -> None\n\nBuild what the config needs and register it, "
	  "run nothing. Raises CoreError(kind, errno, message) if the host cannot." },
	{ "run", core_run, METH_VARARGS,
	  "run(config: dict, progress=None) -> dict\n\nRun one experiment; the GIL is "
	  "released while it runs. progress(phase, pages_done, pages_total), if given, is "
	  "called every 50 ms with a list per vCPU; if it raises, the run is cancelled and "
	  "the exception propagates. Raises CoreError(kind, errno, message) on failure." },
	{ "pageserver_serve", core_pageserver_serve, METH_VARARGS,
	  "pageserver_serve(snapshot_path, listen, latency_ns, bandwidth_mbps, max_inflight, "
	  "ready_fd, stop_fd) -> dict\n\nServe the snapshot (the page server process's "
	  "body: uffdkvm/pageserver.py), the GIL released, until SIGTERM or SIGINT or "
	  "stop_fd polls readable; writes \"ready ADDRESS\" to ready_fd once listening. "
	  "Returns the final counters. Raises CoreError on failure." },
	{ "remote_connect", core_remote_connect, METH_VARARGS,
	  "remote_connect(address) -> connection\n\nA page server client connection "
	  "(csrc/remote/client.c), closed by remote_close() or when collected." },
	{ "remote_close", core_remote_close, METH_O,
	  "remote_close(connection) -> None\n\nClose the connection (idempotent)." },
	{ "remote_outstanding", core_remote_outstanding, METH_O,
	  "remote_outstanding(connection) -> int\n\nRequests sent whose replies are not "
	  "yet taken." },
	{ "remote_fetch", core_remote_fetch, METH_VARARGS,
	  "remote_fetch(connection, offset, length, urgent, timeout_s) -> bytes\n\nOne "
	  "range of the snapshot: a request and its reply, the GIL released. Raises "
	  "CoreError(kind, errno, message): the server's refusal, or the client's." },
	{ "remote_send", core_remote_send, METH_VARARGS,
	  "remote_send(connection, ranges, urgent, timeout_s) -> None\n\nA request for "
	  "each (offset, length), in one write; their replies left for remote_recv()." },
	{ "remote_recv", core_remote_recv, METH_VARARGS,
	  "remote_recv(connection, timeout_s) -> (offset, urgent, status, data)\n\nThe "
	  "next reply, whole; status is 0 or the server's -errno refusal." },
	{ "remote_stats", core_remote_stats, METH_VARARGS,
	  "remote_stats(connection, timeout_s) -> dict\n\nThe server's counters "
	  "(REMOTE_STATS_FIELDS), by a STATS request." },
	{ NULL, NULL, 0, NULL },
};

static struct PyModuleDef core_module = {
	PyModuleDef_HEAD_INIT, "uffdkvm._core",
	"The uffdkvm C core: KVM vCPUs and userfaultfd reader pools.", -1, core_methods,
	NULL, NULL, NULL, NULL,
};

static int add_hist_bounds(PyObject *m)
{
	PyObject *bounds = PyList_New(UKVM_HIST_BUCKETS + 1);
	unsigned b;

	for (b = 0; bounds && b <= UKVM_HIST_BUCKETS; b++) {
		PyObject *o = PyLong_FromUnsignedLongLong(ukvm_hist_bucket_lower(b));

		if (!o || PyList_SetItem(bounds, b, o)) {	/* steals o */
			Py_CLEAR(bounds);
			break;
		}
	}
	if (!bounds)
		return -1;
	/* Bucket b holds [HIST_BOUNDS[b], HIST_BOUNDS[b + 1]) nanoseconds. */
	if (PyModule_AddObjectRef(m, "HIST_BOUNDS", bounds)) {
		Py_DECREF(bounds);
		return -1;
	}
	Py_DECREF(bounds);
	return 0;
}

static int add_constants(PyObject *m)
{
	/* The config's enums and limits come from the schema (config_schema.h). */
#define ENUM_CONSTANT(id, name, py)	{ #id + 5, id },
#define ENUM_CONSTANTS(type, field, prefix)	UKVM_##prefix##_NAMES(ENUM_CONSTANT)
	static const struct { const char *name; long long value; } constants[] = {
		UKVM_CONFIG_ENUMS(ENUM_CONSTANTS)
#define LIMIT(name, value)	{ #name, (long long)(UKVM_##name) },
		UKVM_CONFIG_CONSTANTS(LIMIT)
#undef LIMIT
		{ "CLOCK_SYNC_NONE", UKVM_CLOCK_SYNC_NONE },
		{ "CLOCK_SYNC_KVM_OFFSET", UKVM_CLOCK_SYNC_KVM_OFFSET },
		{ "CLOCK_SYNC_EXITS", UKVM_CLOCK_SYNC_EXITS },
		{ "ERR_CONFIG", UKVM_ERR_CONFIG },
		{ "ERR_HOST", UKVM_ERR_HOST },
		{ "ERR_RUN", UKVM_ERR_RUN },
		{ "ERR_TIMEOUT", UKVM_ERR_TIMEOUT },
		{ "ERR_CANCELLED", UKVM_ERR_CANCELLED },
#ifdef UKVM_TEST_HOOKS
		{ "INJECT_RESOLVE_EIO", UKVM_INJECT_RESOLVE_EIO },
		{ "INJECT_READER_EXIT", UKVM_INJECT_READER_EXIT },
		{ "INJECT_GUEST_FAULT", UKVM_INJECT_GUEST_FAULT },
		{ "INJECT_GUEST_MMIO", UKVM_INJECT_GUEST_MMIO },
		{ "INJECT_THREAD_CREATE", UKVM_INJECT_THREAD_CREATE },
		{ "INJECT_CORRUPT_PAGE", UKVM_INJECT_CORRUPT_PAGE },
		{ "INJECT_READER_STALL", UKVM_INJECT_READER_STALL },
		{ "INJECT_VCPU_STALL", UKVM_INJECT_VCPU_STALL },
		{ "INJECT_RESOLVE_EAGAIN", UKVM_INJECT_RESOLVE_EAGAIN },
		{ "INJECT_READER_CRASH", UKVM_INJECT_READER_CRASH },
		{ "INJECT_TSC_OFFSET", UKVM_INJECT_TSC_OFFSET },
		{ "INJECT_NO_KVM_TSC_OFFSET", UKVM_INJECT_NO_KVM_TSC_OFFSET },
		{ "INJECT_UNFAULTED_PAGE", UKVM_INJECT_UNFAULTED_PAGE },
		{ "INJECT_TSC_JUMP", UKVM_INJECT_TSC_JUMP },
		{ "INJECT_NO_EXACT_ADDRESS", UKVM_INJECT_NO_EXACT_ADDRESS },
		{ "INJECT_NO_MOVE", UKVM_INJECT_NO_MOVE },
		{ "INJECT_WP_NO_SAVE", UKVM_INJECT_WP_NO_SAVE },
		{ "INJECT_NO_WP_FEATURES", UKVM_INJECT_NO_WP_FEATURES },
		{ "INJECT_SOURCE_WRONG_OFFSET", UKVM_INJECT_SOURCE_WRONG_OFFSET },
		{ "INJECT_UNTOUCHED_PAGE", UKVM_INJECT_UNTOUCHED_PAGE },
		{ "INJECT_RING_NOWAIT", UKVM_INJECT_RING_NOWAIT },
		{ "INJECT_NO_VM_GUEST_MEMFD", UKVM_INJECT_NO_VM_GUEST_MEMFD },
		{ "INJECT_MINCORE_FAIL", UKVM_INJECT_MINCORE_FAIL },
		{ "INJECT_RELEASE_DUP3", UKVM_INJECT_RELEASE_DUP3 },
#endif
	};
	size_t i;

#undef ENUM_CONSTANTS
#undef ENUM_CONSTANT
	PyObject *theta;

	for (i = 0; i < sizeof(constants) / sizeof(constants[0]); i++) {
		PyObject *o = PyLong_FromLongLong(constants[i].value);

		if (!o || PyModule_AddObjectRef(m, constants[i].name, o)) {
			Py_XDECREF(o);
			return -1;
		}
		Py_DECREF(o);
	}
	theta = PyFloat_FromDouble(UKVM_MAX_ZIPF_THETA);
	if (!theta || PyModule_AddObjectRef(m, "MAX_ZIPF_THETA", theta)) {
		Py_XDECREF(theta);
		return -1;
	}
	Py_DECREF(theta);
	/* wait io_uring: whether setup.py found liburing (it defines UKVM_HAVE_LIBURING). */
#ifdef UKVM_HAVE_LIBURING
	if (PyModule_AddObjectRef(m, "HAVE_IO_URING", Py_True))
		return -1;
#else
	if (PyModule_AddObjectRef(m, "HAVE_IO_URING", Py_False))
		return -1;
#endif
#ifdef UKVM_TEST_HOOKS
	return PyModule_AddObjectRef(m, "TEST_HOOKS", Py_True);
#else
	return PyModule_AddObjectRef(m, "TEST_HOOKS", Py_False);
#endif
}

PyMODINIT_FUNC PyInit__core(void)
{
	PyObject *m = PyModule_Create(&core_module);

	if (!m)
		return NULL;
	CoreError = PyErr_NewExceptionWithDoc(
		"uffdkvm._core.CoreError",
		"A failure reported by the C core: args are (kind, errno, message).",
		PyExc_RuntimeError, NULL);
	if (!CoreError || PyModule_AddObjectRef(m, "CoreError", CoreError) ||
	    add_constants(m) || add_hist_bounds(m) || add_remote_stats_fields(m)) {
		Py_XDECREF(CoreError);
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
