/* SPDX-License-Identifier: MIT */
/* What every file of the binding shares (common.h). */
#include "python/common.h"

/* uffdkvm._core.CoreError: made once, by py_core_error_add() from PyInit__core. */
static PyObject *core_error;

int py_core_error_add(PyObject *m)
{
	if (!core_error)
		core_error = PyErr_NewExceptionWithDoc(
			"uffdkvm._core.CoreError",
			"A failure reported by the C core: args are (kind, errno, message).",
			PyExc_RuntimeError, NULL);
	if (!core_error)
		return -1;
	return PyModule_AddObjectRef(m, "CoreError", core_error);
}

void py_raise_core_error(const struct ukvm_error *err)
{
	PyObject *args = Py_BuildValue("(iis)", (int)err->kind, err->errnum, err->message);

	if (args) {
		PyErr_SetObject(core_error, args);
		Py_DECREF(args);
	}
}

int py_set_obj(PyObject *d, const char *key, PyObject *o)
{
	int ret;

	if (!o)
		return -1;
	ret = PyDict_SetItemString(d, key, o);
	Py_DECREF(o);
	return ret;
}

int py_set_u64(PyObject *d, const char *key, uint64_t v)
{
	return py_set_obj(d, key, PyLong_FromUnsignedLongLong(v));
}

PyObject *py_list_new(uint64_t n)
{
	if (n > (uint64_t)PY_SSIZE_T_MAX)
		return PyErr_NoMemory();
	return PyList_New((Py_ssize_t)n);
}

PyObject *py_u64_list(const uint64_t *values, uint64_t n)
{
	PyObject *list = py_list_new(values ? n : 0);
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

