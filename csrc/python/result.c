/* SPDX-License-Identifier: MIT */
/* The result side of the binding (result.h). */
#include <stddef.h>

#include "python/result.h"

/*
 * The result side is tables too: one per result struct, each entry a
 * counter's name (the struct member's, which is the Python field's), how to
 * convert it, and where it is, walked to build the dicts (as KVM's
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
	R_DIRTY_PASSES,	/* ukvm_result.dirty_passes, nr_dirty_passes */
	R_MIGRATION_ROUNDS, /* ukvm_result.migration_rounds, nr_migration_rounds */
	R_MIGRATED_PAGES, /* ukvm_result.migrated_pages, nr_migrated_pages */
};

struct result_field {
	const char *name;
	enum result_type type;
	size_t offset;
	size_t len;		/* R_U64_ARRAY: its elements */
};

_Static_assert(sizeof(enum ukvm_clock_sync) == sizeof(int) &&
	       sizeof(enum ukvm_source_kind) == sizeof(int), "R_ENUM reads an int");

/*
 * The tables come from the result schema (uffdkvm/schema/results.py, through
 * result_schema.h): each UKVM_<STRUCT>_FIELDS(X) lists X(member, conversion)
 * for what the binding hands over. len is an array member's elements; for a
 * pointer member (kvm_stats, pass_end_ns) it is unused, and dividing by a
 * named constant rather than sizeof(uint64_t) keeps gcc's
 * -Wsizeof-pointer-div from taking sizeof(uint64_t *) / sizeof(uint64_t) for
 * a mistake.
 */
enum { U64_BYTES = sizeof(uint64_t) };
#define U64S(s, name)	(sizeof(((struct s *)0)->name) / U64_BYTES)
#define ENTRY(s, name, type) { #name, R_##type, offsetof(struct s, name), U64S(s, name) },
#define RES(name, type)		ENTRY(ukvm_result, name, type)
#define VCPU(name, type)	ENTRY(ukvm_vcpu_result, name, type)
#define READER(name, type)	ENTRY(ukvm_reader_result, name, type)
#define DIRTY(name, type)	ENTRY(ukvm_dirty_pass, name, type)
#define ROUND(name, type)	ENTRY(ukvm_migration_round, name, type)
#define TRACE(name, type)	ENTRY(ukvm_fault_record, name, type)

static const struct result_field result_fields[] = { UKVM_RESULT_FIELDS(RES) };
static const struct result_field vcpu_fields[] = { UKVM_VCPU_RESULT_FIELDS(VCPU) };
static const struct result_field reader_fields[] = { UKVM_READER_RESULT_FIELDS(READER) };
static const struct result_field dirty_pass_fields[] = { UKVM_DIRTY_PASS_FIELDS(DIRTY) };
static const struct result_field migration_round_fields[] = {
	UKVM_MIGRATION_ROUND_FIELDS(ROUND)
};
/* The fault trace's columns, one list each, in ukvm_fault_record's order. */
static const struct result_field trace_fields[] = { UKVM_FAULT_RECORD_FIELDS(TRACE) };

#define NR_TRACE_FIELDS	(sizeof(trace_fields) / sizeof(trace_fields[0]))

/* {name: value} for KVM's statistics, or an empty dict without them. */
static PyObject *stats_dict(char *const *names, const uint64_t *values, uint32_t n)
{
	PyObject *d = PyDict_New();
	uint32_t i;

	for (i = 0; d && values && i < n; i++) {
		if (py_set_u64(d, names[i], values[i])) {
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
	PyObject *buckets = py_u64_list(h->buckets, UKVM_HIST_BUCKETS);

	if (!d || !buckets || py_set_u64(d, "count", h->count) || py_set_u64(d, "sum", h->sum) ||
	    py_set_u64(d, "min", h->min) || py_set_u64(d, "max", h->max) ||
	    PyDict_SetItemString(d, "buckets", buckets)) {
		Py_XDECREF(d);
		d = NULL;
	}
	Py_XDECREF(buckets);
	return d;
}

/* Result.page_visits: a list of counts, or None. */
static PyObject *u32_to_list(const uint32_t *v, uint64_t n)
{
	PyObject *list = py_list_new(v ? n : 0), *item;
	uint64_t i;

	for (i = 0; list && v && i < n; i++) {
		item = PyLong_FromUnsignedLong(v[i]);
		if (!item || PyList_SetItem(list, (Py_ssize_t)i, item))	/* steals item */
			Py_CLEAR(list);
	}
	return list;
}

static PyObject *visits_to_list(const uint32_t *v, uint64_t n)
{
	PyObject *list, *item;
	uint64_t i;

	if (!v)
		return Py_NewRef(Py_None);
	list = py_list_new(n);
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
		return py_u64_list(AT(base, f, uint64_t), f->len);
	case R_VCPU_KVM_STATS:
		/* Every vCPU has the same statistics; their names are kept once, in res. */
		return stats_dict(res->vcpu_stat_names, *AT(base, f, uint64_t *),
				  res->nr_vcpu_stats);
	case R_PASS_END:
		return py_u64_list(*AT(base, f, uint64_t *), res->passes);
	case R_KVM_STATS:
		return stats_dict(res->kvm_stat_names, res->kvm_stats, res->nr_kvm_stats);
	case R_TOUCH_ORDER:
		return u32_to_list(res->touch_order, res->nr_touch_order);
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
	case R_DIRTY_PASSES:
		return table_list(res->dirty_passes, res->nr_dirty_passes,
				  sizeof(*res->dirty_passes), dirty_pass_fields,
				  sizeof(dirty_pass_fields) / sizeof(dirty_pass_fields[0]), res);
	case R_MIGRATION_ROUNDS:
		return table_list(res->migration_rounds, res->nr_migration_rounds,
				  sizeof(*res->migration_rounds), migration_round_fields,
				  sizeof(migration_round_fields) / sizeof(migration_round_fields[0]),
				  res);
	case R_MIGRATED_PAGES:
		return u32_to_list(res->migrated_pages, res->nr_migrated_pages);
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
	PyObject *list = py_list_new(n);
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
		PyObject *col = py_list_new(n);

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

PyObject *pyresult_to_dict(const struct ukvm_result *res)
{
	return table_dict(res, result_fields, sizeof(result_fields) / sizeof(result_fields[0]),
			  res);
}

