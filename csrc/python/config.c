/* SPDX-License-Identifier: MIT */
/* The config side of the binding (config.h). */
#include <stddef.h>
#include <string.h>

#include "python/config.h"

/*
 * The field table is the schema's (config_schema.h, generated from
 * uffdkvm/schema/fields.py): every key a core field by its struct member's name,
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

/*
 * A value that does not convert: the exception set (TypeError, OverflowError,
 * or whatever the value's own __iter__, __index__ or __float__ raised)
 * replaced by type with fmt's message, which names the field; the first is
 * kept as its __cause__. A KeyboardInterrupt, SystemExit or MemoryError
 * goes on as it is. -1, for the caller to return.
 */
static int config_refuse(PyObject *type, const char *fmt, const char *name)
{
	PyObject *t, *v, *tb, *t2, *v2, *tb2;

	if (!PyErr_Occurred()) {
		PyErr_Format(type, fmt, name);
		return -1;
	}
	if (!PyErr_ExceptionMatches(PyExc_Exception) || PyErr_ExceptionMatches(PyExc_MemoryError))
		return -1;
	PyErr_Fetch(&t, &v, &tb);
	PyErr_NormalizeException(&t, &v, &tb);
	if (tb)
		PyException_SetTraceback(v, tb);
	PyErr_Format(type, fmt, name);
	PyErr_Fetch(&t2, &v2, &tb2);
	PyErr_NormalizeException(&t2, &v2, &tb2);
	Py_INCREF(v);
	PyException_SetContext(v2, v);	/* each steals a reference */
	PyException_SetCause(v2, v);
	PyErr_Restore(t2, v2, tb2);
	Py_XDECREF(t);
	Py_XDECREF(tb);
	return -1;
}

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
	if (!seq)
		return config_refuse(PyExc_TypeError, "%s: expected a list of CPU numbers", key);
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
			Py_DECREF(seq);
			PyMem_Free(cpus);
			return config_refuse(PyExc_ValueError, "%s: expected CPU numbers", key);
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
		return config_refuse(PyExc_TypeError, "%s: expected a list of page indices", key);
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
			Py_DECREF(seq);
			PyMem_Free(pages);
			return config_refuse(PyExc_ValueError, "%s: expected page indices", key);
		}
		pages[i] = v;
	}
	Py_DECREF(seq);
	*nr = (uint64_t)n;
	*out = pages;
	return 0;
}

void pyconfig_free(struct ukvm_config *cfg)
{
	PyMem_Free((void *)cfg->pin_vcpus);
	PyMem_Free((void *)cfg->pin_readers);
	PyMem_Free((void *)cfg->replay);
	PyMem_Free((void *)cfg->preinstall);
	cfg->pin_vcpus = cfg->pin_readers = NULL;
	cfg->replay = NULL;
	cfg->preinstall = NULL;
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

		if (x == -1.0 && PyErr_Occurred())
			return config_refuse(PyExc_ValueError, "%s: expected a number", f->name);
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
	if (v == (unsigned long long)-1 && PyErr_Occurred())
		return config_refuse(PyExc_ValueError, "%s: expected a non-negative integer",
				     f->name);
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
int pyconfig_from_dict(PyObject *dict, const char *fn, struct ukvm_config *cfg)
{
	PyObject *key, *item;
	Py_ssize_t pos = 0;
	size_t i;
	int ret;

	ukvm_config_init(cfg);
	if (!PyDict_Check(dict)) {
		PyErr_Format(PyExc_TypeError, "%s() takes a dict of config fields", fn);
		return -1;
	}
	while (PyDict_Next(dict, &pos, &key, &item)) {
		Py_ssize_t len = 0;
		const char *name = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, &len) : NULL;

		if (!name) {
			PyErr_Clear();
			PyErr_SetString(PyExc_TypeError, "config keys must be field names (str)");
			return -1;
		}
		/* The names are C strings: "vcpus\0x" would pass for "vcpus". */
		if (strlen(name) != (size_t)len) {
			PyErr_Format(PyExc_KeyError, "%R: not a field of the core's config (a NUL "
				     "in the name)", key);
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
			     "uffdkvm/schema/fields.py)", name);
		return -1;
	}
	for (i = 0; i < NFIELDS(config_fields); i++) {
		const struct field *f = &config_fields[i];

		item = PyDict_GetItemString(dict, f->name);	/* borrowed */
		if (!item) {
			pyconfig_free(cfg);
			PyErr_Format(PyExc_KeyError, "%s: missing; the core takes every field of "
				     "its config (uffdkvm/schema/fields.py)", f->name);
			return -1;
		}
		/*
		 * Held while converted: the conversion may run the value's own code
		 * (__iter__, __float__), which may take it out of the dict.
		 */
		Py_INCREF(item);
		ret = config_field(f, item, cfg);
		Py_DECREF(item);
		if (ret) {
			pyconfig_free(cfg);
			return -1;
		}
	}
#ifdef UKVM_TEST_HOOKS
	for (i = 0; i < NFIELDS(test_fields); i++) {
		item = PyDict_GetItemString(dict, test_fields[i].name);
		if (!item)
			continue;
		Py_INCREF(item);
		ret = config_field(&test_fields[i], item, cfg);
		Py_DECREF(item);
		if (ret) {
			pyconfig_free(cfg);
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

PyObject *pyconfig_to_dict(const struct ukvm_config *cfg)
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

