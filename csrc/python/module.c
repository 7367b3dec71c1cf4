/* SPDX-License-Identifier: MIT */
/*
 * uffdkvm._core: the module (its functions, constants and init) and run().
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
 * constants, uffdkvm.testing._faults) exists only in builds for the tests: setup.py
 * defines UKVM_TEST_HOOKS when UFFDKVM_TEST_HOOKS=1 at build time, and
 * TEST_HOOKS says which build this is.
 */
#include <stdbool.h>

#include "python/common.h"
#include "python/config.h"
#include "python/remote.h"
#include "python/result.h"

#define WAIT_SLICE_NS	(50ULL * 1000 * 1000)


/* ---- run ---- */


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
	done_list = py_u64_list(done, vcpus);
	total_list = py_u64_list(total, vcpus);
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
	if (pyconfig_from_dict(arg, "run", &cfg))
		return NULL;
	vcpus = cfg.vcpus;
	if (progress != Py_None) {
		done = PyMem_Calloc(vcpus ? vcpus : 1, sizeof(*done));
		total = PyMem_Calloc(vcpus ? vcpus : 1, sizeof(*total));
		if (!done || !total) {
			PyMem_Free(done);
			PyMem_Free(total);
			pyconfig_free(&cfg);
			return PyErr_NoMemory();
		}
	}

	Py_BEGIN_ALLOW_THREADS
	ret = ukvm_experiment_start(&cfg, &exp, &err);
	Py_END_ALLOW_THREADS
	pyconfig_free(&cfg);	/* the experiment keeps its own copies */
	if (ret) {
		PyMem_Free(done);
		PyMem_Free(total);
		py_raise_core_error(&err);
		return NULL;
	}
	/* The config the core runs, from its own copy: raw["config"]. */
	ran = pyconfig_to_dict(ukvm_experiment_config(exp));
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
		py_raise_core_error(&err);
		return NULL;
	}
	out = pyresult_to_dict(&res);
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
	if (pyconfig_from_dict(arg, "validate", &cfg))
		return NULL;
	memset(&err, 0, sizeof(err));
	ret = ukvm_config_validate(&cfg, &err);	/* pure, quick: the GIL is kept */
	pyconfig_free(&cfg);
	if (ret) {
		py_raise_core_error(&err);
		return NULL;
	}
	Py_RETURN_NONE;
}

static PyObject *core_threads_needed(PyObject *self, PyObject *arg)
{
	struct ukvm_config cfg;
	char why[256];
	uint64_t n;

	(void)self;
	if (pyconfig_from_dict(arg, "threads_needed", &cfg))
		return NULL;
	n = ukvm_threads_needed(&cfg, why, sizeof(why));	/* a count: the GIL is kept */
	pyconfig_free(&cfg);
	return Py_BuildValue("(Ks)", (unsigned long long)n, why);
}

static PyObject *core_probe(PyObject *self, PyObject *arg)
{
	struct ukvm_config cfg;
	struct ukvm_error err;
	int ret;

	(void)self;
	if (pyconfig_from_dict(arg, "probe", &cfg))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	ret = ukvm_probe(&cfg, &err);
	Py_END_ALLOW_THREADS
	pyconfig_free(&cfg);
	if (ret) {
		py_raise_core_error(&err);
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
		py_raise_core_error(&err);
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
		py_raise_core_error(&err);
		return NULL;
	}
	Py_RETURN_NONE;
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
	{ "threads_needed", core_threads_needed, METH_O,
	  "threads_needed(config: dict) -> tuple[int, str]\n\nThe threads a run of the "
	  "config starts (the controller, the vCPUs, the readers, the pusher), counted from "
	  "the shapes the run builds, and what they are." },
	{ "probe", core_probe, METH_O,
	  "probe(config: dict) -> None\n\nBuild what the config needs and register it, "
	  "run nothing. Raises CoreError(kind, errno, message) if the host cannot." },
	{ "run", core_run, METH_VARARGS,
	  "run(config: dict, progress=None) -> dict\n\nRun one experiment; the GIL is "
	  "released while it runs. progress(phase, pages_done, pages_total), if given, is "
	  "called every 50 ms with a list per vCPU; if it raises, the run is cancelled and "
	  "the exception propagates. Raises CoreError(kind, errno, message) on failure." },
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
		/* The fault injections (testhooks.h, from uffdkvm/schema/faults.py). */
#define INJECT(id)	{ #id + 5, id },
		UKVM_INJECTS(INJECT)
#undef INJECT
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
	if (py_core_error_add(m) || add_constants(m) || add_hist_bounds(m) || pyremote_init(m)) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
