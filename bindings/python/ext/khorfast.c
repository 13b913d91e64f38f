/*
 * khorfast.c -- khor._khorfast, the Python package's hot path in C: enqueue one allreduce
 * or a group of them, wait for a handle, test it, free it. Everything else stays in Python over ctypes.
 *
 * Why: a ctypes call converts each of its arguments through Python objects (from_param,
 * byref, a c_int64 array for the dims), which cost more than the engine's own work for a
 * small tensor: 1000 x 4 KiB through khor.torch spent about 10 us per tensor in the ctypes
 * call of khor_enqueue_allreduce alone (docs/PERFORMANCE.md, section 24).
 *
 * Built against Python's stable ABI (Py_LIMITED_API): one binary for every Python 3 from
 * 3.8 on, nothing compiled against torch or TensorFlow. It links no libkhor either: the
 * package hands it the addresses of the functions it calls (bind), from the libkhor that
 * ctypes loaded, so both paths always call the same library. Without this module (not
 * built, or KHOR_FAST=0) the package does the same through ctypes.
 */
#define Py_LIMITED_API 0x03080000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "khor.h"

#include <stdint.h>

/* The functions of libkhor called here, bound by bind() before anything else. */
static __typeof__(&khor_enqueue_allreduce) enqueue_allreduce;
static __typeof__(&khor_enqueue_grouped_allreduce) enqueue_grouped_allreduce;
static __typeof__(&khor_handle_wait) handle_wait;
static __typeof__(&khor_handle_test) handle_test;
static __typeof__(&khor_handle_free) handle_free;

#define MAX_DIMS 32

/* The address an int argument holds (0 for None). */
static int address_of(PyObject *o, void **out)
{
	if (o == Py_None) {
		*out = NULL;
		return 0;
	}
	*out = PyLong_AsVoidPtr(o);
	return *out == NULL && PyErr_Occurred() ? -1 : 0;
}

/* bind(enqueue_allreduce, enqueue_grouped_allreduce, handle_wait, handle_test, handle_free):
 * the functions' addresses. */
static PyObject *fast_bind(PyObject *self, PyObject *args)
{
	PyObject *a[5];
	void *p[5];

	(void)self;
	if (!PyArg_ParseTuple(args, "OOOOO:bind", &a[0], &a[1], &a[2], &a[3], &a[4]))
		return NULL;
	for (int i = 0; i < 5; i++) {
		if (address_of(a[i], &p[i]) < 0)
			return NULL;
		if (p[i] == NULL) {
			PyErr_SetString(PyExc_ValueError, "bind: a function address is NULL");
			return NULL;
		}
	}
	enqueue_allreduce = (__typeof__(enqueue_allreduce))p[0];
	enqueue_grouped_allreduce = (__typeof__(enqueue_grouped_allreduce))p[1];
	handle_wait = (__typeof__(handle_wait))p[2];
	handle_test = (__typeof__(handle_test))p[3];
	handle_free = (__typeof__(handle_free))p[4];
	Py_RETURN_NONE;
}

static int bound(void)
{
	if (enqueue_allreduce != NULL)
		return 1;
	PyErr_SetString(PyExc_RuntimeError, "khor._khorfast: bind() was not called");
	return 0;
}

/* The dims of a shape tuple into dims (room for MAX_DIMS): their count, or -1 with an error
 * set. */
static int shape_of(PyObject *shape, int64_t *dims)
{
	if (!PyTuple_Check(shape)) {
		PyErr_SetString(PyExc_TypeError, "a shape must be a tuple of ints");
		return -1;
	}
	Py_ssize_t nd = PyTuple_Size(shape);
	if (nd > MAX_DIMS) {
		PyErr_Format(PyExc_ValueError, "a shape of %zd dimensions (at most %d)", nd,
		             MAX_DIMS);
		return -1;
	}
	for (Py_ssize_t i = 0; i < nd; i++) {
		dims[i] = PyLong_AsLongLong(PyTuple_GetItem(shape, i));
		if (dims[i] == -1 && PyErr_Occurred())
			return -1;
	}
	return (int)nd;
}

/*
 * allreduce(engine, set, name, input, output, dtype, shape, op, prescale, postscale)
 *   -> the handle's address (an int > 0), or -status when the enqueue failed (the engine's
 *      text then says why: khor_engine_error).
 * name is bytes; input and output are addresses; shape a tuple of ints.
 */
static PyObject *fast_allreduce(PyObject *self, PyObject *args)
{
	PyObject *eng_o, *in_o, *out_o, *shape;
	const char *name;
	int set, dtype, op;
	double pre, post;
	void *eng, *in, *out;
	int64_t dims[MAX_DIMS];
	khor_handle *h = NULL;

	(void)self;
	if (!bound() || !PyArg_ParseTuple(args, "OiyOOiO!idd:allreduce", &eng_o, &set, &name,
	                                  &in_o, &out_o, &dtype, &PyTuple_Type, &shape, &op,
	                                  &pre, &post))
		return NULL;
	if (address_of(eng_o, &eng) < 0 || address_of(in_o, &in) < 0 ||
	    address_of(out_o, &out) < 0)
		return NULL;
	int nd = shape_of(shape, dims);
	if (nd < 0)
		return NULL;
	khor_status st = enqueue_allreduce((khor_engine *)eng, set, name, in, out,
	                                   (khor_dtype)dtype, nd, dims, (khor_op)op, pre,
	                                   post, &h);
	if (st != KHOR_SUCCESS)
		return PyLong_FromLong(-(long)st);
	return PyLong_FromVoidPtr(h);
}

/*
 * grouped_allreduce(engine, set, names, inputs, outputs, dtypes, shapes, op, prescale,
 *                   postscale) -> the handle's address, or -status.
 * names: a list of bytes; inputs, outputs, dtypes: lists of ints; shapes: a list of tuples;
 * all of one length, at least 1: the group's tensors, handed to the engine in one call.
 */
static PyObject *fast_grouped_allreduce(PyObject *self, PyObject *args)
{
	PyObject *eng_o, *names, *ins, *outs, *dts, *shapes, *ret = NULL;
	int set, op;
	double pre, post;
	void *eng;
	khor_handle *h = NULL;

	(void)self;
	if (!bound() || !PyArg_ParseTuple(args, "OiO!O!O!O!O!idd:grouped_allreduce", &eng_o,
	                                  &set, &PyList_Type, &names, &PyList_Type, &ins,
	                                  &PyList_Type, &outs, &PyList_Type, &dts, &PyList_Type,
	                                  &shapes, &op, &pre, &post))
		return NULL;
	if (address_of(eng_o, &eng) < 0)
		return NULL;
	Py_ssize_t n = PyList_Size(names);
	if (n < 1 || n > INT32_MAX / MAX_DIMS || PyList_Size(ins) != n ||
	    PyList_Size(outs) != n || PyList_Size(dts) != n || PyList_Size(shapes) != n) {
		PyErr_Format(PyExc_ValueError, "grouped_allreduce: %zd names, %zd inputs, %zd "
		             "outputs, %zd dtypes and %zd shapes (one of each per tensor, at least "
		             "one)", n, PyList_Size(ins), PyList_Size(outs), PyList_Size(dts),
		             PyList_Size(shapes));
		return NULL;
	}
	size_t un = (size_t)n;
	const char **nms = PyMem_Malloc(un * sizeof(*nms));
	const void **in = PyMem_Malloc(un * sizeof(*in));
	void **out = PyMem_Malloc(un * sizeof(*out));
	khor_dtype *dtype = PyMem_Malloc(un * sizeof(*dtype));
	int *ndims = PyMem_Malloc(un * sizeof(*ndims));
	int64_t *dims = PyMem_Malloc(un * MAX_DIMS * sizeof(*dims));
	if (!nms || !in || !out || !dtype || !ndims || !dims) {
		PyErr_NoMemory();
		goto out;
	}
	Py_ssize_t nd_all = 0;
	for (Py_ssize_t i = 0; i < n; i++) {
		void *p;
		PyObject *nm = PyList_GetItem(names, i);
		if (!PyBytes_Check(nm)) {
			PyErr_SetString(PyExc_TypeError, "grouped_allreduce: names must be bytes");
			goto out;
		}
		nms[i] = PyBytes_AsString(nm);
		if (address_of(PyList_GetItem(ins, i), &p) < 0)
			goto out;
		in[i] = p;
		if (address_of(PyList_GetItem(outs, i), &p) < 0)
			goto out;
		out[i] = p;
		long dt = PyLong_AsLong(PyList_GetItem(dts, i));
		if (dt == -1 && PyErr_Occurred())
			goto out;
		dtype[i] = (khor_dtype)dt;
		int nd = shape_of(PyList_GetItem(shapes, i), dims + nd_all);
		if (nd < 0)
			goto out;
		ndims[i] = nd;
		nd_all += nd;
	}
	khor_status st = enqueue_grouped_allreduce((khor_engine *)eng, set, (int)n, nms, in, out,
	                                           dtype, ndims, dims, (khor_op)op, pre, post,
	                                           &h);
	ret = st != KHOR_SUCCESS ? PyLong_FromLong(-(long)st) : PyLong_FromVoidPtr(h);
out:
	PyMem_Free(dims);
	PyMem_Free(ndims);
	PyMem_Free(dtype);
	PyMem_Free(out);
	PyMem_Free(in);
	PyMem_Free(nms);
	return ret;
}

static int handle_arg(PyObject *args, const char *fmt, khor_handle **h)
{
	PyObject *o;
	void *p;

	if (!bound() || !PyArg_ParseTuple(args, fmt, &o) || address_of(o, &p) < 0)
		return -1;
	if (p == NULL) {
		PyErr_SetString(PyExc_ValueError, "a NULL handle");
		return -1;
	}
	*h = p;
	return 0;
}

/* wait(handle) -> status: khor_handle_wait, with the GIL let go while it waits. */
static PyObject *fast_wait(PyObject *self, PyObject *args)
{
	khor_handle *h;
	khor_status st;

	(void)self;
	if (handle_arg(args, "O:wait", &h) < 0)
		return NULL;
	/* A completed handle returns at once: no need to let go of the GIL for it. */
	st = handle_test(h);
	if (st == KHOR_IN_PROGRESS) {
		Py_BEGIN_ALLOW_THREADS
		st = handle_wait(h);
		Py_END_ALLOW_THREADS
	}
	return PyLong_FromLong((long)st);
}

/* test(handle) -> status (KHOR_IN_PROGRESS while it runs). */
static PyObject *fast_test(PyObject *self, PyObject *args)
{
	khor_handle *h;

	(void)self;
	if (handle_arg(args, "O:test", &h) < 0)
		return NULL;
	return PyLong_FromLong((long)handle_test(h));
}

/* free(handle) */
static PyObject *fast_free(PyObject *self, PyObject *args)
{
	khor_handle *h;

	(void)self;
	if (handle_arg(args, "O:free", &h) < 0)
		return NULL;
	handle_free(h);
	Py_RETURN_NONE;
}

static PyMethodDef fast_methods[] = {
	{ "bind", fast_bind, METH_VARARGS, "bind(enqueue_allreduce, enqueue_grouped_allreduce, "
	  "handle_wait, handle_test, handle_free): the addresses of libkhor's functions" },
	{ "allreduce", fast_allreduce, METH_VARARGS, "allreduce(engine, set, name, input, "
	  "output, dtype, shape, op, prescale, postscale) -> handle, or -status" },
	{ "grouped_allreduce", fast_grouped_allreduce, METH_VARARGS, "grouped_allreduce(engine, "
	  "set, names, inputs, outputs, dtypes, shapes, op, prescale, postscale) -> handle, or "
	  "-status" },
	{ "wait", fast_wait, METH_VARARGS, "wait(handle) -> status" },
	{ "test", fast_test, METH_VARARGS, "test(handle) -> status" },
	{ "free", fast_free, METH_VARARGS, "free(handle)" },
	{ NULL, NULL, 0, NULL }
};

static struct PyModuleDef fast_module = {
	PyModuleDef_HEAD_INIT, "_khorfast", "khor's hot path in C (stable ABI)", -1, fast_methods,
	NULL, NULL, NULL, NULL
};

PyMODINIT_FUNC PyInit__khorfast(void);

PyMODINIT_FUNC PyInit__khorfast(void)
{
	return PyModule_Create(&fast_module);
}
