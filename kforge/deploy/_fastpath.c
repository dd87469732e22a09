/* kforge's launch fast path: one deployed kernel's per-call work in C.
 *
 * A Launcher holds a kernel's kf_launch pointer and its kf_tensor descriptors filled once (shapes,
 * strides, dtypes: the variant is exact). A call takes the input tensors, allocates the outputs
 * through the callables it was given (torch.empty_strided with the variant's layout), fills the
 * data pointers into copies of the descriptors on the C stack (so concurrent calls never share
 * state), asks for the current stream, and calls kf_launch. The Python equivalent is
 * DeployedKernel._launch_py in _dispatch.py; both must behave identically.
 *
 * Built by kforge/deploy/_fast.py with the system C compiler against this Python's headers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "kforge.h"

#define KF_MAX_TENSORS 16

typedef int (*kf_launch_fn)(const kf_tensor*, int, const kf_tensor*, int, const double*, int, void*, void*);

typedef struct {
    PyObject_HEAD
    kf_launch_fn fn;
    int n_in, n_out, n_params;
    kf_tensor ins[KF_MAX_TENSORS];
    kf_tensor outs[KF_MAX_TENSORS];
    double* params;
    void* workspace;
    PyObject* allocs;      /* tuple of n_out callables, each returning a fresh output tensor */
    PyObject* stream_fn;   /* callable(stream_arg) -> raw stream handle, or NULL (CPU) */
    PyObject* stream_arg;
    PyObject* label;       /* the variant's signature, for error messages */
    PyObject* keepalive;   /* whatever owns fn, params and workspace on the Python side */
    int release_gil;
    long long calls;
} Launcher;

static PyObject* s_data_ptr;  /* interned "data_ptr" */

static int read_ptr(PyObject* tensor, void** out) {
    PyObject* r = PyObject_CallMethodNoArgs(tensor, s_data_ptr);
    if (r == NULL) return -1;
    *out = PyLong_AsVoidPtr(r);
    Py_DECREF(r);
    return (*out == NULL && PyErr_Occurred()) ? -1 : 0;
}

static PyObject* Launcher_call(Launcher* self, PyObject* args, PyObject* kwargs) {
    PyObject* seq;
    if (self->fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "this launcher was never initialised");
        return NULL;
    }
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "a launcher takes one argument: the input tensors");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O", &seq)) return NULL;
    PyObject* fast = PySequence_Fast(seq, "a launcher's argument must be a sequence of tensors");
    if (fast == NULL) return NULL;
    if (PySequence_Fast_GET_SIZE(fast) != self->n_in) {
        PyErr_Format(PyExc_TypeError, "expected %d inputs, got %zd", self->n_in, PySequence_Fast_GET_SIZE(fast));
        Py_DECREF(fast);
        return NULL;
    }
    kf_tensor ins[KF_MAX_TENSORS], outs[KF_MAX_TENSORS];
    memcpy(ins, self->ins, sizeof(kf_tensor) * (size_t)self->n_in);
    memcpy(outs, self->outs, sizeof(kf_tensor) * (size_t)self->n_out);
    PyObject** items = PySequence_Fast_ITEMS(fast);
    for (int i = 0; i < self->n_in; ++i) {
        ins[i].data = NULL;
        if (items[i] != Py_None && read_ptr(items[i], &ins[i].data) < 0) {
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);
    PyObject* result = PyList_New(self->n_out);
    if (result == NULL) return NULL;
    for (int i = 0; i < self->n_out; ++i) {
        PyObject* t = PyObject_CallNoArgs(PyTuple_GET_ITEM(self->allocs, i));
        if (t == NULL) goto fail;
        PyList_SET_ITEM(result, i, t);
        if (read_ptr(t, &outs[i].data) < 0) goto fail;
    }
    void* stream = NULL;
    if (self->stream_fn != NULL) {
        PyObject* s = PyObject_CallOneArg(self->stream_fn, self->stream_arg);
        if (s == NULL) goto fail;
        stream = PyLong_AsVoidPtr(s);
        Py_DECREF(s);
        if (stream == NULL && PyErr_Occurred()) goto fail;
    }
    int code;
    if (self->release_gil) {
        Py_BEGIN_ALLOW_THREADS
        code = self->fn(ins, self->n_in, outs, self->n_out, self->params, self->n_params, self->workspace, stream);
        Py_END_ALLOW_THREADS
    } else {
        code = self->fn(ins, self->n_in, outs, self->n_out, self->params, self->n_params, self->workspace, stream);
    }
    if (code != 0) {
        PyErr_Format(PyExc_RuntimeError, "kforge kernel for %U failed to launch (error %d)", self->label, code);
        goto fail;
    }
    self->calls++;
    return result;
fail:
    Py_DECREF(result);
    return NULL;
}

static int fill_tensors(PyObject* blob, int n, kf_tensor* dst, const char* what) {
    Py_buffer view;
    if (PyObject_GetBuffer(blob, &view, PyBUF_SIMPLE) < 0) return -1;
    if (n < 0 || n > KF_MAX_TENSORS || view.len != (Py_ssize_t)(sizeof(kf_tensor) * (size_t)n)) {
        PyErr_Format(PyExc_ValueError, "%s: %d descriptors of %zu bytes (at most %d) do not fit %zd bytes",
                     what, n, sizeof(kf_tensor), KF_MAX_TENSORS, view.len);
        PyBuffer_Release(&view);
        return -1;
    }
    memcpy(dst, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return 0;
}

static int Launcher_init(Launcher* self, PyObject* args, PyObject* kwargs) {
    static char* names[] = {"fn", "inputs", "n_inputs", "outputs", "n_outputs", "params", "workspace",
                            "allocs", "stream_fn", "stream_arg", "label", "keepalive", "release_gil", NULL};
    PyObject *fn, *ins, *outs, *params, *workspace, *allocs, *stream_fn, *stream_arg, *label, *keepalive;
    int n_in, n_out, release_gil;
    if (self->fn != NULL) {  /* a call may be running with the GIL released: never swap its state */
        PyErr_SetString(PyExc_TypeError, "a launcher is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOiOiOOO!OOUOp", names, &fn, &ins, &n_in, &outs, &n_out,
                                     &params, &workspace, &PyTuple_Type, &allocs, &stream_fn, &stream_arg,
                                     &label, &keepalive, &release_gil))
        return -1;
    kf_launch_fn entry = (kf_launch_fn)PyLong_AsVoidPtr(fn);
    if (entry == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "the kernel's entry point is NULL");
        return -1;
    }
    if (fill_tensors(ins, n_in, self->ins, "inputs") < 0 || fill_tensors(outs, n_out, self->outs, "outputs") < 0)
        return -1;
    if (PyTuple_GET_SIZE(allocs) != n_out) {
        PyErr_SetString(PyExc_ValueError, "one output allocator per output");
        return -1;
    }
    Py_buffer pv;
    if (PyObject_GetBuffer(params, &pv, PyBUF_SIMPLE) < 0) return -1;
    PyMem_Free(self->params);
    self->params = PyMem_Malloc(pv.len ? (size_t)pv.len : sizeof(double));
    if (self->params == NULL) {
        PyBuffer_Release(&pv);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(self->params, pv.buf, (size_t)pv.len);
    self->n_params = (int)(pv.len / (Py_ssize_t)sizeof(double));
    PyBuffer_Release(&pv);
    self->workspace = workspace == Py_None ? NULL : PyLong_AsVoidPtr(workspace);
    if (PyErr_Occurred()) return -1;
    self->n_in = n_in;
    self->n_out = n_out;
    self->release_gil = release_gil;
    Py_INCREF(allocs);
    Py_XSETREF(self->allocs, allocs);
    if (stream_fn == Py_None) {
        Py_CLEAR(self->stream_fn);
    } else {
        Py_INCREF(stream_fn);
        Py_XSETREF(self->stream_fn, stream_fn);
    }
    Py_INCREF(stream_arg);
    Py_XSETREF(self->stream_arg, stream_arg);
    Py_INCREF(label);
    Py_XSETREF(self->label, label);
    Py_INCREF(keepalive);
    Py_XSETREF(self->keepalive, keepalive);
    self->calls = 0;
    self->fn = entry;  /* last: a launcher is callable only once fully initialised */
    return 0;
}

static int Launcher_traverse(Launcher* self, visitproc visit, void* arg) {
    Py_VISIT(self->allocs);
    Py_VISIT(self->stream_fn);
    Py_VISIT(self->stream_arg);
    Py_VISIT(self->keepalive);
    return 0;
}

static int Launcher_clear(Launcher* self) {
    Py_CLEAR(self->allocs);
    Py_CLEAR(self->stream_fn);
    Py_CLEAR(self->stream_arg);
    Py_CLEAR(self->label);
    Py_CLEAR(self->keepalive);
    return 0;
}

static void Launcher_dealloc(Launcher* self) {
    PyObject_GC_UnTrack(self);
    Launcher_clear(self);
    PyMem_Free(self->params);
    Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyObject* Launcher_get_calls(Launcher* self, void* closure) { return PyLong_FromLongLong(self->calls); }

static PyGetSetDef Launcher_getset[] = {
    {"calls", (getter)Launcher_get_calls, NULL, "successful launches so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kforge._kforge_fast.Launcher",
    .tp_basicsize = sizeof(Launcher),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One deployed kernel's launch: inputs in, freshly allocated outputs back.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Launcher_init,
    .tp_call = (ternaryfunc)Launcher_call,
    .tp_traverse = (traverseproc)Launcher_traverse,
    .tp_clear = (inquiry)Launcher_clear,
    .tp_dealloc = (destructor)Launcher_dealloc,
    .tp_getset = Launcher_getset,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kforge_fast", "kforge's launch fast path", -1, NULL};

PyMODINIT_FUNC PyInit__kforge_fast(void) {
    if (PyType_Ready(&LauncherType) < 0) return NULL;
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    if (s_data_ptr == NULL) return NULL;
    PyObject* m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&LauncherType);
    if (PyModule_AddObject(m, "Launcher", (PyObject*)&LauncherType) < 0) {
        Py_DECREF(&LauncherType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
