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

/* ---- config: dict -> struct ---- */

enum field_type { F_U32, F_U64, F_BOOL, F_ENUM, F_DOUBLE };

struct field {
	const char *name;
	enum field_type type;
	size_t offset;
};

#define FIELD(name, type) { #name, type, offsetof(struct ukvm_config, name) }
static const struct field config_fields[] = {
	FIELD(vcpus, F_U32),
	FIELD(mem_per_vcpu, F_U64),
	FIELD(backing, F_ENUM),
	FIELD(uffd_mode, F_ENUM),
	FIELD(wp_async, F_BOOL),
	FIELD(single_uffd, F_BOOL),
	FIELD(readers, F_U32),
	FIELD(resolver, F_ENUM),
	FIELD(wait, F_ENUM),
	FIELD(read_batch, F_U32),
	FIELD(delay_us, F_U32),
	FIELD(overlap, F_BOOL),
	FIELD(guest_work, F_U32),
	FIELD(guest_page_size, F_U64),
	FIELD(pattern, F_ENUM),
	FIELD(seed, F_U64),
	FIELD(write_percent, F_U32),
	FIELD(passes, F_U32),
	FIELD(touch_percent, F_U32),
	FIELD(access, F_ENUM),
	FIELD(zipf_theta, F_DOUBLE),
	FIELD(accesses, F_U64),
	FIELD(resolve, F_ENUM),
	FIELD(delay_dist, F_ENUM),
	FIELD(prefault, F_BOOL),
	FIELD(stats, F_ENUM),
	FIELD(guest_timing, F_BOOL),
	FIELD(trace_faults, F_BOOL),
	FIELD(timeout_ns, F_U64),
	FIELD(source, F_ENUM),
	FIELD(source_read, F_ENUM),
	FIELD(source_cache, F_ENUM),
	FIELD(prefetch, F_ENUM),
	FIELD(prefetch_pages, F_U32),
	FIELD(prefetch_bandwidth_mbps, F_U64),
#ifdef UKVM_TEST_HOOKS
	FIELD(inject, F_ENUM),
	FIELD(inject_after, F_U64),
#endif
};
#undef FIELD

#ifndef UKVM_TEST_HOOKS
/* Config keys only a build with test hooks reads: here they are refused, so
 * that a test asking for a failure cannot pass because none was made. */
static const char *const test_hook_fields[] = { "inject", "inject_after" };
#endif

/* A list of CPU numbers, into an int32 array the caller frees. */
static int cpu_list(PyObject *dict, const char *key, uint32_t *nr, int32_t **out)
{
	PyObject *item = PyDict_GetItemString(dict, key), *seq;
	Py_ssize_t i, n;

	*nr = 0;
	*out = NULL;
	if (!item || item == Py_None)
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
	*out = PyMem_Calloc(n ? (size_t)n : 1, sizeof(int32_t));
	if (!*out) {
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
			PyMem_Free(*out);
			*out = NULL;
			return -1;
		}
		(*out)[i] = (int32_t)v;
	}
	Py_DECREF(seq);
	*nr = (uint32_t)n;
	return 0;
}

/* prefetch replay: the page indices of key, into a uint64 array the caller frees. */
static int page_list(PyObject *dict, const char *key, uint64_t *nr, uint64_t **out)
{
	PyObject *item = PyDict_GetItemString(dict, key), *seq;
	Py_ssize_t i, n;

	*nr = 0;
	*out = NULL;
	if (!item || item == Py_None)
		return 0;
	seq = PySequence_List(item);
	if (!seq)
		return -1;
	n = PyList_Size(seq);
	*out = PyMem_Calloc(n ? (size_t)n : 1, sizeof(uint64_t));
	if (!*out) {
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
			PyMem_Free(*out);
			*out = NULL;
			return -1;
		}
		(*out)[i] = v;
	}
	Py_DECREF(seq);
	*nr = (uint64_t)n;
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
 * A string field (source_path, source_address): a str or bytes, in the
 * filesystem's encoding, into buf of size bytes, NUL-terminated.
 */
static int config_string(PyObject *dict, const char *name, char *buf, size_t size)
{
	PyObject *item = PyDict_GetItemString(dict, name), *bytes;
	Py_ssize_t len;
	char *p;

	if (!item || item == Py_None)
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

static int config_from_dict(PyObject *dict, struct ukvm_config *cfg)
{
	uint64_t *replay;
	int32_t *pins;
	size_t i;

	ukvm_config_init(cfg);
#ifndef UKVM_TEST_HOOKS
	for (i = 0; i < sizeof(test_hook_fields) / sizeof(test_hook_fields[0]); i++) {
		if (PyDict_GetItemString(dict, test_hook_fields[i])) {
			PyErr_Format(PyExc_ValueError,
				     "%s: this uffdkvm._core was built without test hooks (fault "
				     "injection); build it with UFFDKVM_TEST_HOOKS=1 in the "
				     "environment", test_hook_fields[i]);
			return -1;
		}
	}
#endif
	for (i = 0; i < sizeof(config_fields) / sizeof(config_fields[0]); i++) {
		const struct field *f = &config_fields[i];
		char *dst = (char *)cfg + f->offset;
		unsigned long long v;
		PyObject *item = PyDict_GetItemString(dict, f->name);

		if (!item)
			continue;	/* the core's default */
		if (f->type == F_DOUBLE) {
			double x = PyFloat_AsDouble(item);

			if (x == -1.0 && PyErr_Occurred()) {
				PyErr_Format(PyExc_ValueError, "%s: expected a number", f->name);
				return -1;
			}
			*(double *)dst = x;
			continue;
		}
		v = PyLong_AsUnsignedLongLong(item);
		if (v == (unsigned long long)-1 && PyErr_Occurred()) {
			PyErr_Format(PyExc_ValueError, "%s: expected a non-negative integer",
				     f->name);
			return -1;
		}
		switch (f->type) {
		case F_U32:
		case F_ENUM:
			if (v > UINT32_MAX) {
				PyErr_Format(PyExc_ValueError, "%s: %llu is too large", f->name, v);
				return -1;
			}
			if (f->type == F_U32)
				*(uint32_t *)dst = (uint32_t)v;
			else
				*(int *)dst = (int)v;
			break;
		case F_U64:
			*(uint64_t *)dst = v;
			break;
		case F_BOOL:
			*(bool *)dst = v != 0;
			break;
		case F_DOUBLE:
			break;	/* above */
		}
	}
	if (config_string(dict, "source_path", cfg->source_path, sizeof(cfg->source_path)) ||
	    config_string(dict, "source_address", cfg->source_address,
			  sizeof(cfg->source_address)))
		return -1;
	if (cpu_list(dict, "pin_vcpus", &cfg->nr_pin_vcpus, &pins))
		return -1;
	cfg->pin_vcpus = pins;
	if (cpu_list(dict, "pin_readers", &cfg->nr_pin_readers, &pins)) {
		config_free(cfg);
		return -1;
	}
	cfg->pin_readers = pins;
	if (page_list(dict, "replay", &cfg->nr_replay, &replay)) {
		config_free(cfg);
		return -1;
	}
	cfg->replay = replay;
	return 0;
}

/* ---- result: struct -> dict ---- */

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

static int set_obj(PyObject *d, const char *key, PyObject *o)
{
	int ret;

	if (!o)
		return -1;
	ret = PyDict_SetItemString(d, key, o);
	Py_DECREF(o);
	return ret;
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
static PyObject *cpus_list(const uint64_t affinity[16])
{
	PyObject *list = PyList_New(0);
	int cpu;

	for (cpu = 0; list && cpu < 1024; cpu++) {
		if (affinity[cpu / 64] & (1ULL << (cpu % 64))) {
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

static PyObject *u64_list(const uint64_t *values, uint32_t n)
{
	PyObject *list = PyList_New(values ? n : 0);
	uint32_t i;

	for (i = 0; list && values && i < n; i++) {
		PyObject *o = PyLong_FromUnsignedLongLong(values[i]);

		if (!o || PyList_SetItem(list, i, o)) {	/* steals o, even on failure */
			Py_CLEAR(list);
			break;
		}
	}
	return list;
}

static PyObject *hist_to_dict(const struct ukvm_hist *h)
{
	PyObject *d = PyDict_New();

	if (!d)
		return NULL;
	if (set_u64(d, "count", h->count) || set_u64(d, "sum", h->sum) ||
	    set_u64(d, "min", h->min) || set_u64(d, "max", h->max) ||
	    set_obj(d, "buckets", u64_list(h->buckets, UKVM_HIST_BUCKETS))) {
		Py_DECREF(d);
		return NULL;
	}
	return d;
}

/* A guest-stamped time: 0 means the guest's stamp is unknown. */
static PyObject *stamp_or_none(uint64_t ns)
{
	return ns ? PyLong_FromUnsignedLongLong(ns) : Py_NewRef(Py_None);
}

/* Result.page_visits: a list of counts, or None. */
static PyObject *visits_to_list(const uint32_t *v, uint64_t n)
{
	PyObject *list, *item;
	uint64_t i;

	if (!v)
		return Py_NewRef(Py_None);
	list = PyList_New((Py_ssize_t)n);
	for (i = 0; list && i < n; i++) {
		item = PyLong_FromUnsignedLong(v[i]);
		if (!item || PyList_SetItem(list, (Py_ssize_t)i, item))	/* steals item */
			Py_CLEAR(list);
	}
	return list;
}

#define TRACE_COLUMNS 10

/* The fault records as columns: one list per field. */
static PyObject *trace_to_dict(const struct ukvm_fault_record *t, uint64_t n)
{
	static const char *const names[TRACE_COLUMNS] = {
		"raised_ns", "read_ns", "resolved_ns", "resumed_ns", "gpa", "vcpu", "uffd",
		"reader", "eexist", "write",
	};
	PyObject *d = PyDict_New(), *cols[TRACE_COLUMNS] = { NULL };
	uint64_t i;
	int c;

	if (!d)
		return NULL;
	for (c = 0; c < TRACE_COLUMNS; c++) {
		cols[c] = PyList_New((Py_ssize_t)n);
		if (!cols[c] || PyDict_SetItemString(d, names[c], cols[c]))
			goto error;
		Py_DECREF(cols[c]);	/* d holds it */
	}
	for (i = 0; i < n; i++) {
		PyObject *v[TRACE_COLUMNS] = {
			stamp_or_none(t[i].raised_ns),
			PyLong_FromUnsignedLongLong(t[i].read_ns),
			PyLong_FromUnsignedLongLong(t[i].resolved_ns),
			stamp_or_none(t[i].resumed_ns),
			PyLong_FromUnsignedLongLong(t[i].gpa),
			PyLong_FromLong(t[i].vcpu),
			PyLong_FromLong(t[i].uffd),
			PyLong_FromLong(t[i].reader),
			PyBool_FromLong(t[i].eexist),
			PyBool_FromLong(t[i].write),
		};
		for (c = 0; c < TRACE_COLUMNS; c++) {
			if (!v[c]) {
				for (c = 0; c < TRACE_COLUMNS; c++)
					Py_XDECREF(v[c]);
				goto error_cols_owned;
			}
		}
		for (c = 0; c < TRACE_COLUMNS; c++) {
			/* Steals v[c], even on failure; the ones after it are still ours. */
			if (PyList_SetItem(cols[c], (Py_ssize_t)i, v[c])) {
				while (++c < TRACE_COLUMNS)
					Py_DECREF(v[c]);
				goto error_cols_owned;
			}
		}
	}
	return d;
error:
	Py_XDECREF(cols[c]);
error_cols_owned:
	Py_DECREF(d);
	return NULL;
}

static PyObject *vcpu_to_dict(const struct ukvm_vcpu_result *v, const struct ukvm_result *res)
{
	PyObject *d = PyDict_New();

	if (!d)
		return NULL;
	/* Every vCPU has the same statistics; their names are kept once, in res. */
	if (set_obj(d, "kvm_stats", stats_dict(res->vcpu_stat_names, v->kvm_stats,
						res->nr_vcpu_stats))) {
		Py_DECREF(d);
		return NULL;
	}
	if (set_u64(d, "index", v->index) || set_u64(d, "tid", (uint64_t)v->tid) ||
	    set_u64(d, "start_ns", v->start_ns) || set_u64(d, "end_ns", v->end_ns) ||
	    set_u64(d, "pages", v->pages) ||
	    set_obj(d, "exits", v->exits == UINT64_MAX ? Py_NewRef(Py_None)
						      : PyLong_FromUnsignedLongLong(v->exits)) ||
	    set_u64(d, "userspace_exits", v->userspace_exits) ||
	    set_u64(d, "fault_exits", v->fault_exits) ||
	    set_u64(d, "regs_fault_exits", v->regs_fault_exits) ||
	    set_u64(d, "cpu_ns", v->cpu_ns) ||
	    set_obj(d, "cpus", cpus_list(v->affinity)) ||
	    set_obj(d, "pass_end_ns", u64_list(v->pass_end_ns, res->passes)) ||
	    set_u64(d, "faults", v->faults) || set_u64(d, "eexist", v->eexist) ||
	    set_u64(d, "blocked_ns", v->blocked_ns) ||
	    set_obj(d, "service_latency", hist_to_dict(&v->service_latency)) ||
	    set_obj(d, "queue_latency", hist_to_dict(&v->queue_latency)) ||
	    set_obj(d, "resume_latency", hist_to_dict(&v->resume_latency)) ||
	    set_obj(d, "fault_latency", hist_to_dict(&v->fault_latency)) ||
	    set_u64(d, "access_cycles", v->access_cycles) ||
	    set_obj(d, "access_hist", u64_list(v->access_hist, 64))) {
		Py_DECREF(d);
		return NULL;
	}
	return d;
}

static PyObject *reader_to_dict(const struct ukvm_reader_result *r)
{
	PyObject *d = PyDict_New();

	if (!d)
		return NULL;
	if (set_u64(d, "uffd", r->uffd) || set_u64(d, "index", r->index) ||
	    set_u64(d, "faults", r->faults) || set_u64(d, "wakeups", r->wakeups) ||
	    set_u64(d, "spurious_wakeups", r->spurious_wakeups) ||
	    set_u64(d, "eexist", r->eexist) || set_u64(d, "busy_ns", r->busy_ns) ||
	    set_u64(d, "tid", (uint64_t)r->tid) || set_u64(d, "copies", r->copies) ||
	    set_u64(d, "zeropages", r->zeropages) || set_u64(d, "continues", r->continues) ||
	    set_u64(d, "moves", r->moves) ||
	    set_u64(d, "unprotects", r->unprotects) ||
	    set_u64(d, "context_switches", r->context_switches) ||
	    set_u64(d, "voluntary_context_switches", r->voluntary_context_switches) ||
	    set_u64(d, "cpu_ns", r->cpu_ns) || set_u64(d, "reads", r->reads) ||
	    set_u64(d, "ring_completions", r->ring_completions) ||
	    set_u64(d, "prefetched", r->prefetched) ||
	    set_u64(d, "prefetch_eexist", r->prefetch_eexist) || set_u64(d, "wakes", r->wakes) ||
	    set_obj(d, "read_sizes", u64_list(r->read_sizes, UKVM_MAX_READ_BATCH + 1)) ||
	    set_obj(d, "cpus", cpus_list(r->affinity)) ||
	    set_obj(d, "service_latency", hist_to_dict(&r->service_latency)) ||
	    set_obj(d, "queue_latency", hist_to_dict(&r->queue_latency)) ||
	    set_u64(d, "source_bytes", r->source_bytes) ||
	    set_u64(d, "source_ns", r->source_ns)) {
		Py_DECREF(d);
		return NULL;
	}
	return d;
}

static PyObject *list_of(const void *items, uint32_t n, size_t size,
			 PyObject *(*convert)(const void *, const struct ukvm_result *),
			 const struct ukvm_result *res)
{
	PyObject *list = PyList_New(n);
	uint32_t i;

	if (!list)
		return NULL;
	for (i = 0; i < n; i++) {
		PyObject *o = convert((const char *)items + i * size, res);

		if (!o || PyList_SetItem(list, i, o)) {	/* steals o */
			Py_DECREF(list);
			return NULL;
		}
	}
	return list;
}

static PyObject *vcpu_item(const void *p, const struct ukvm_result *res)
{
	return vcpu_to_dict(p, res);
}

static PyObject *reader_item(const void *p, const struct ukvm_result *res)
{
	(void)res;
	return reader_to_dict(p);
}

static PyObject *result_to_dict(const struct ukvm_result *res)
{
	PyObject *d = PyDict_New();

	if (!d)
		return NULL;
	if (set_obj(d, "kvm_stats", stats_dict(res->vm_stat_names, res->vm_stats,
						res->nr_vm_stats)) ||
	    set_u64(d, "start_ns", res->start_ns) || set_u64(d, "end_ns", res->end_ns) ||
	    set_u64(d, "threads_start_ns", res->threads_start_ns) ||
	    set_u64(d, "threads_joined_ns", res->threads_joined_ns) ||
	    set_u64(d, "pages_per_vcpu", res->pages_per_vcpu) ||
	    set_u64(d, "region_bytes", res->region_bytes) ||
	    set_u64(d, "page_size", res->page_size) || set_u64(d, "uffds", res->nr_uffds) ||
	    set_u64(d, "region_gpa", res->region_gpa) || set_u64(d, "passes", res->passes) ||
	    set_obj(d, "stats_full", PyBool_FromLong(res->stats_full)) ||
	    set_u64(d, "blocktime_ns", res->blocktime_ns) || set_u64(d, "tsc_khz", res->tsc_khz) ||
	    set_u64(d, "clock_sync", res->clock_sync) ||
	    set_u64(d, "clock_error_ns", res->clock_error_ns) ||
	    set_u64(d, "misordered", res->misordered) ||
	    set_obj(d, "trace", res->trace ? trace_to_dict(res->trace, res->nr_trace)
					   : Py_NewRef(Py_None)) ||
	    set_obj(d, "verified", PyBool_FromLong(res->verified)) ||
	    set_u64(d, "bad_pages", res->bad_pages) ||
	    set_u64(d, "dirty_pages", res->dirty_pages) ||
	    set_u64(d, "source", res->source) ||
	    set_u64(d, "source_cached_pages_at_start", res->source_cached_pages_at_start) ||
	    set_u64(d, "touched_pages", res->touched_pages) ||
	    set_u64(d, "guest_accesses", res->accesses) ||
	    set_obj(d, "page_visits", visits_to_list(res->page_visits, res->nr_page_visits)) ||
	    set_obj(d, "resident_tracked", PyBool_FromLong(res->resident_tracked)) ||
	    set_u64(d, "prefetched_pages", res->prefetched_pages) ||
	    set_u64(d, "wasted_prefetch_pages", res->wasted_prefetch_pages) ||
	    set_u64(d, "touched_units", res->touched_units) ||
	    set_u64(d, "faulted_pages", res->waited_units) ||
	    set_u64(d, "resident_ns", res->resident_ns) ||
	    set_u64(d, "pusher_pages", res->pusher_pages) ||
	    set_u64(d, "pusher_eexist", res->pusher_eexist) ||
	    set_u64(d, "pusher_source_bytes", res->pusher_source_bytes) ||
	    set_obj(d, "touch_order", u64_list(res->touch_order, (uint32_t)res->nr_touch_order)) ||
	    set_obj(d, "verify_message", PyUnicode_FromString(res->verify_message)) ||
	    set_obj(d, "vcpus", list_of(res->vcpus, res->nr_vcpus, sizeof(*res->vcpus),
					 vcpu_item, res)) ||
	    set_obj(d, "readers", list_of(res->readers, res->nr_readers,
					   sizeof(*res->readers), reader_item, res))) {
		Py_DECREF(d);
		return NULL;
	}
	return d;
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
	PyObject *arg, *progress = Py_None;
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

	for (;;) {
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
		return NULL;	/* the signal handler's exception is still set */
	}
	if (ret) {
		raise_core_error(&err);
		return NULL;
	}
	out = result_to_dict(&res);
	ukvm_result_free(&res);
	return out;
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

/* ---- the page server (csrc/remote/): run by uffdkvm/pageserver.py's child ---- */

static PyObject *remote_stats_to_dict(const struct ukvm_remote_stats *st)
{
	PyObject *d = PyDict_New();

	if (d && (set_u64(d, "requests", st->requests) || set_u64(d, "urgent", st->urgent) ||
		  set_u64(d, "background", st->background) || set_u64(d, "served", st->served) ||
		  set_u64(d, "errors", st->errors) || set_u64(d, "bytes", st->bytes) ||
		  set_u64(d, "queue_ns_total", st->queue_ns_total) ||
		  set_u64(d, "queue_ns_max", st->queue_ns_max) ||
		  set_u64(d, "connections", st->connections) ||
		  set_u64(d, "dropped", st->dropped) ||
		  set_u64(d, "stats_requests", st->stats_requests)))
		Py_CLEAR(d);
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

#ifdef UKVM_TEST_HOOKS
static PyObject *core_remote_fetch(PyObject *self, PyObject *args)
{
	unsigned long long offset, length;
	double timeout_s;
	struct ukvm_error err;
	const char *address;
	PyObject *out;
	void *buf;
	int urgent, ret;

	(void)self;
	if (!PyArg_ParseTuple(args, "sKKpd:remote_fetch", &address, &offset, &length, &urgent,
			      &timeout_s))
		return NULL;
	if (!(timeout_s >= 0 && timeout_s < 1e6) || length > (1ULL << 30)) {
		PyErr_SetString(PyExc_ValueError, "remote_fetch: timeout_s must be in [0, 1e6) "
				"and length at most 1 GiB");
		return NULL;
	}
	buf = PyMem_Malloc(length ? length : 1);
	if (!buf)
		return PyErr_NoMemory();
	Py_BEGIN_ALLOW_THREADS
	ret = ukvm_remote_fetch_once(address, offset, length, urgent, buf,
				     (uint64_t)(timeout_s * 1e9), &err);
	Py_END_ALLOW_THREADS
	if (ret) {
		PyMem_Free(buf);
		raise_core_error(&err);
		return NULL;
	}
	out = PyBytes_FromStringAndSize(buf, (Py_ssize_t)length);
	PyMem_Free(buf);
	return out;
}
#endif

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
#ifdef UKVM_TEST_HOOKS
	{ "remote_fetch", core_remote_fetch, METH_VARARGS,
	  "remote_fetch(address, offset, length, urgent, timeout_s) -> bytes\n\nTest hook: "
	  "the C client (csrc/remote/client.c) fetches one range from a page server." },
#endif
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
	static const struct { const char *name; long value; } constants[] = {
		{ "BACKING_ANONYMOUS", UKVM_BACKING_ANONYMOUS },
		{ "BACKING_SHMEM", UKVM_BACKING_SHMEM },
		{ "BACKING_ANONYMOUS_THP", UKVM_BACKING_ANONYMOUS_THP },
		{ "BACKING_ANONYMOUS_HUGETLB", UKVM_BACKING_ANONYMOUS_HUGETLB },
		{ "BACKING_ANONYMOUS_HUGETLB_1GB", UKVM_BACKING_ANONYMOUS_HUGETLB_1GB },
		{ "BACKING_SHARED_HUGETLB", UKVM_BACKING_SHARED_HUGETLB },
		{ "BACKING_GUEST_MEMFD", UKVM_BACKING_GUEST_MEMFD },
		{ "PATTERN_SEQUENTIAL", UKVM_PATTERN_SEQUENTIAL },
		{ "PATTERN_REVERSE", UKVM_PATTERN_REVERSE },
		{ "PATTERN_RANDOM", UKVM_PATTERN_RANDOM },
		{ "ACCESS_UNIFORM", UKVM_ACCESS_UNIFORM },
		{ "ACCESS_ZIPF", UKVM_ACCESS_ZIPF },
		{ "RESOLVE_COPY", UKVM_RESOLVE_COPY },
		{ "RESOLVE_ZEROPAGE", UKVM_RESOLVE_ZEROPAGE },
		{ "RESOLVE_MOVE", UKVM_RESOLVE_MOVE },
		{ "PREFETCH_NONE", UKVM_PREFETCH_NONE },
		{ "PREFETCH_READAHEAD", UKVM_PREFETCH_READAHEAD },
		{ "PREFETCH_BACKGROUND", UKVM_PREFETCH_BACKGROUND },
		{ "PREFETCH_REPLAY", UKVM_PREFETCH_REPLAY },
		{ "DELAY_FIXED", UKVM_DELAY_FIXED },
		{ "DELAY_UNIFORM", UKVM_DELAY_UNIFORM },
		{ "DELAY_EXPONENTIAL", UKVM_DELAY_EXPONENTIAL },
		{ "STATS_FULL", UKVM_STATS_FULL },
		{ "CLOCK_SYNC_NONE", UKVM_CLOCK_SYNC_NONE },
		{ "CLOCK_SYNC_KVM_OFFSET", UKVM_CLOCK_SYNC_KVM_OFFSET },
		{ "CLOCK_SYNC_EXITS", UKVM_CLOCK_SYNC_EXITS },
		{ "STATS_BASIC", UKVM_STATS_BASIC },
		{ "UFFD_NONE", UKVM_UFFD_NONE },
		{ "UFFD_MISSING", UKVM_UFFD_MISSING },
		{ "UFFD_MINOR", UKVM_UFFD_MINOR },
		{ "UFFD_WP", UKVM_UFFD_WP },
		{ "WAIT_POLL", UKVM_WAIT_POLL },
		{ "WAIT_EPOLL", UKVM_WAIT_EPOLL },
		{ "WAIT_EPOLL_EXCLUSIVE", UKVM_WAIT_EPOLL_EXCLUSIVE },
		{ "WAIT_READ", UKVM_WAIT_READ },
		{ "WAIT_SPIN", UKVM_WAIT_SPIN },
		{ "WAIT_IO_URING", UKVM_WAIT_IO_URING },
		{ "RESOLVER_READERS", UKVM_RESOLVER_READERS },
		{ "RESOLVER_VCPU", UKVM_RESOLVER_VCPU },
		{ "SOURCE_SYNTHETIC", UKVM_SOURCE_SYNTHETIC },
		{ "SOURCE_FILE", UKVM_SOURCE_FILE },
		{ "SOURCE_REMOTE", UKVM_SOURCE_REMOTE },
		{ "SOURCE_READ_PREAD", UKVM_SOURCE_READ_PREAD },
		{ "SOURCE_READ_MMAP", UKVM_SOURCE_READ_MMAP },
		{ "SOURCE_CACHE_WARM", UKVM_SOURCE_CACHE_WARM },
		{ "SOURCE_CACHE_COLD", UKVM_SOURCE_CACHE_COLD },
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

	for (i = 0; i < sizeof(constants) / sizeof(constants[0]); i++)
		if (PyModule_AddIntConstant(m, constants[i].name, constants[i].value))
			return -1;
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
	    add_constants(m) || add_hist_bounds(m)) {
		Py_XDECREF(CoreError);
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
