/* SPDX-License-Identifier: MIT */
/* The page server's side of the binding (remote.h). */
#include <stdbool.h>
#include <string.h>

#include "python/remote.h"

/* The counters as {name: value}, the names from ukvm.h's one list. */
static PyObject *remote_stats_to_dict(const struct ukvm_remote_stats *st)
{
	PyObject *d = PyDict_New();

#define REMOTE_STATS_SET(name, meaning) \
	if (d && py_set_u64(d, #name, st->name)) \
		Py_CLEAR(d);
	UKVM_REMOTE_STATS_FIELDS(REMOTE_STATS_SET)
#undef REMOTE_STATS_SET
	return d;
}

/*
 * An int as a limit for ukvm_pageserver_check(): one below 0 or past
 * uint64_t becomes UINT64_MAX, which the check refuses naming the field
 * (an "K" format would wrap it into range instead).
 */
static int limit_converter(PyObject *o, void *out)
{
	int overflow;
	long long v;

	if (!PyLong_Check(o) || PyBool_Check(o)) {
		PyErr_SetString(PyExc_TypeError, "page server limits: expected an int");
		return 0;
	}
	v = PyLong_AsLongLongAndOverflow(o, &overflow);
	if (v == -1 && PyErr_Occurred())
		return 0;
	if (overflow > 0) {
		*(uint64_t *)out = PyLong_AsUnsignedLongLong(o);
		if (PyErr_Occurred()) {
			PyErr_Clear();
			*(uint64_t *)out = UINT64_MAX;
		}
	} else {
		*(uint64_t *)out = overflow < 0 || v < 0 ? UINT64_MAX : (uint64_t)v;
	}
	return 1;
}

/* The three limits into cfg. */
static void set_limits(struct ukvm_pageserver_config *cfg, uint64_t latency_ns,
			uint64_t bandwidth_mbps, uint64_t max_inflight)
{
	cfg->latency_ns = latency_ns;
	cfg->bandwidth_mbps = bandwidth_mbps;
	/* Saturated, so that a value past uint32_t is refused rather than truncated. */
	cfg->max_inflight = max_inflight > UINT32_MAX ? UINT32_MAX : (uint32_t)max_inflight;
}

static PyObject *core_pageserver_check(PyObject *self, PyObject *args)
{
	struct ukvm_pageserver_config cfg = { 0 };
	uint64_t latency_ns, bandwidth_mbps, max_inflight;
	struct ukvm_error err;

	(void)self;
	if (!PyArg_ParseTuple(args, "O&O&O&:pageserver_check", limit_converter, &latency_ns,
			      limit_converter, &bandwidth_mbps, limit_converter, &max_inflight))
		return NULL;
	set_limits(&cfg, latency_ns, bandwidth_mbps, max_inflight);
	if (ukvm_pageserver_check(&cfg, &err)) {
		py_raise_core_error(&err);
		return NULL;
	}
	Py_RETURN_NONE;
}

static PyObject *core_pageserver_serve(PyObject *self, PyObject *args)
{
	struct ukvm_pageserver_config cfg = { 0 };
	uint64_t latency_ns, bandwidth_mbps, max_inflight;
	struct ukvm_remote_stats st;
	struct ukvm_error err;
	double handshake_s = 0;
	int ready_fd, stop_fd, ret;

	(void)self;
	if (!PyArg_ParseTuple(args, "ssO&O&O&ii|zd:pageserver_serve", &cfg.snapshot_path,
			      &cfg.listen, limit_converter, &latency_ns, limit_converter,
			      &bandwidth_mbps, limit_converter, &max_inflight, &ready_fd, &stop_fd,
			      &cfg.key_file, &handshake_s))
		return NULL;
	if (!(handshake_s >= 0 && handshake_s < 1e6)) {
		PyErr_SetString(PyExc_ValueError, "page server: handshake_timeout_s must be in "
				"[0, 1e6) seconds (0: the default, 5 s)");
		return NULL;
	}
	cfg.handshake_timeout_ns = (uint64_t)(handshake_s * 1e9);
	set_limits(&cfg, latency_ns, bandwidth_mbps, max_inflight);
	Py_BEGIN_ALLOW_THREADS
	ret = ukvm_pageserver_serve(&cfg, ready_fd, stop_fd, &st, &err);
	Py_END_ALLOW_THREADS
	if (ret) {
		py_raise_core_error(&err);
		return NULL;
	}
	return remote_stats_to_dict(&st);
}

/*
 * A client connection (uffdkvm/pages/server.py's PageClient) is a capsule
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
	struct ukvm_remote_key key = { 0 };
	const char *address, *key_file = NULL;
	struct remote_client *rc;
	struct ukvm_error err;
	PyObject *capsule;
	int ret;

	(void)self;
	if (!PyArg_ParseTuple(args, "s|z:remote_connect", &address, &key_file))
		return NULL;
	/* Allocated before the key is read: no path out between them leaves it on the stack. */
	rc = PyMem_Calloc(1, sizeof(*rc));
	if (!rc)
		return PyErr_NoMemory();
	if (key_file && ukvm_remote_key_load(key_file, "key_file", &key, &err)) {
		explicit_bzero(&key, sizeof(key));	/* whatever a failed load left in it */
		PyMem_Free(rc);
		py_raise_core_error(&err);
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS
	ret = ukvm_remote_connect(address, key_file ? &key : NULL, &conn, &err);
	Py_END_ALLOW_THREADS
	explicit_bzero(&key, sizeof(key));
	if (ret) {
		PyMem_Free(rc);
		py_raise_core_error(&err);
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
		py_raise_core_error(&err);
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
		py_raise_core_error(&err);
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
		py_raise_core_error(&err);
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
		py_raise_core_error(&err);
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
		if (py_set_obj(doc, names[i], PyUnicode_FromString(meanings[i])))
			goto out;
	}
	if (fields && doc && !PyModule_AddObjectRef(m, "REMOTE_STATS_FIELDS", fields))
		ret = PyModule_AddObjectRef(m, "REMOTE_STATS_MEANINGS", doc);
out:
	Py_XDECREF(fields);
	Py_XDECREF(doc);
	return ret;
}


static PyMethodDef remote_methods[] = {
	{ "pageserver_serve", core_pageserver_serve, METH_VARARGS,
	  "pageserver_serve(snapshot_path, listen, latency_ns, bandwidth_mbps, max_inflight, "
	  "ready_fd, stop_fd, key_file=None, handshake_timeout_s=0) -> dict\n\nServe the "
	  "snapshot (the page server process's body: uffdkvm/pages/server.py), the GIL "
	  "released, until SIGTERM or SIGINT or stop_fd (if >= 0) polls readable; writes "
	  "\"ready ADDRESS\" to ready_fd once listening; every client proves it holds "
	  "key_file's key (required for TCP). "
	  "Returns the final counters. Raises CoreError on failure." },
	{ "pageserver_check", core_pageserver_check, METH_VARARGS,
	  "pageserver_check(latency_ns, bandwidth_mbps, max_inflight) -> None\n\nThe core's "
	  "one check of a page server's limits (pageserver_serve makes it too). Raises "
	  "CoreError (ERR_CONFIG, the message starting with the field's name) for a value "
	  "outside them." },
	{ "remote_connect", core_remote_connect, METH_VARARGS,
	  "remote_connect(address, key_file=None) -> connection\n\nA page server client "
	  "connection (csrc/remote/client.c), the handshake made with key_file's key, "
	  "closed by remote_close() or when collected." },
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

int pyremote_init(PyObject *m)
{
	if (PyModule_AddFunctions(m, remote_methods))
		return -1;
	/* Keys (HMAC-SHA256) and so TCP: whether setup.py found libcrypto. */
	if (PyModule_AddObjectRef(m, "HAVE_LIBCRYPTO",
				  ukvm_remote_auth_available() ? Py_True : Py_False))
		return -1;
	return add_remote_stats_fields(m);
}
