/* kforge's launch fast path: one deployed kernel's per-call work in C.
 *
 * A Launcher holds a kernel's kf_launch pointer and its kf_tensor descriptors filled once (shapes,
 * strides, dtypes: the variant is exact). A call takes the input tensors, allocates the outputs
 * through the callables it was given (torch.empty_strided with the variant's layout), fills the
 * data pointers into copies of the descriptors on the C stack (so concurrent calls share no
 * descriptors; on the CPU a kernel with a workspace runs one call at a time, on CUDA each call
 * gets its own workspace from the stream-ordered caching allocator), asks for the current stream,
 * and calls kf_launch. The Python equivalent is
 * DeployedKernel._launch_py in _dispatch.py; both must behave identically.
 *
 * Dispatch (below) is the front of a patched operator: it caches the guard's decision per
 * distinct raw call, so a repeated call skips binding and key building.
 *
 * Built by kforge/deploy/_fast.py with the system C compiler against this Python's headers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <string.h>

#include "kforge.h"   /* the kernel ABI: kf_tensor, kf_launch_fn */

#define KF_MAX_TENSORS 16

typedef struct {
    PyObject_HEAD
    kf_launch_fn fn;
    int n_in, n_out, n_params;
    kf_tensor ins[KF_MAX_TENSORS];
    kf_tensor outs[KF_MAX_TENSORS];
    double* params;
    void* workspace;       /* a fixed workspace (CPU), or NULL */
    PyObject* ws_alloc;    /* or a callable returning a fresh workspace tensor per call (CUDA), or NULL */
    PyObject* allocs;      /* tuple of n_out callables, each returning a fresh output tensor */
    PyObject* stream_fn;   /* callable(stream_arg) -> raw stream handle, or NULL (CPU) */
    PyObject* stream_arg;
    PyObject* label;       /* the variant's signature, for error messages */
    PyObject* keepalive;   /* whatever owns fn, params and workspace on the Python side */
    PyThread_type_lock ws_lock;  /* one kernel at a time on the shared workspace (GIL released) */
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
    /* A tuple of our own: the inputs stay alive, and in place, until the kernel has returned. */
    PyObject* fast = PyTuple_CheckExact(seq) ? (Py_INCREF(seq), seq) : PySequence_Tuple(seq);
    if (fast == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "a launcher's argument must be a sequence of tensors");
        }
        return NULL;
    }
    if (PyTuple_GET_SIZE(fast) != self->n_in) {
        PyErr_Format(PyExc_TypeError, "expected %d inputs, got %zd", self->n_in, PyTuple_GET_SIZE(fast));
        Py_DECREF(fast);
        return NULL;
    }
    kf_tensor ins[KF_MAX_TENSORS], outs[KF_MAX_TENSORS];
    memcpy(ins, self->ins, sizeof(kf_tensor) * (size_t)self->n_in);
    memcpy(outs, self->outs, sizeof(kf_tensor) * (size_t)self->n_out);
    for (int i = 0; i < self->n_in; ++i) {
        PyObject* item = PyTuple_GET_ITEM(fast, i);
        ins[i].data = NULL;
        if (item != Py_None && read_ptr(item, &ins[i].data) < 0) {
            Py_DECREF(fast);
            return NULL;
        }
    }
    PyObject* result = PyList_New(self->n_out);
    if (result == NULL) {
        Py_DECREF(fast);
        return NULL;
    }
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
    void* workspace = self->workspace;
    PyObject* ws = NULL;  /* a per-call workspace, alive until the kernel has been launched */
    if (self->ws_alloc != NULL) {
        ws = PyObject_CallNoArgs(self->ws_alloc);
        if (ws == NULL || read_ptr(ws, &workspace) < 0) {
            Py_XDECREF(ws);
            goto fail;
        }
    }
    int code;
    if (self->release_gil) {
        Py_BEGIN_ALLOW_THREADS
        if (self->workspace != NULL) PyThread_acquire_lock(self->ws_lock, WAIT_LOCK);
        code = self->fn(ins, self->n_in, outs, self->n_out, self->params, self->n_params, workspace, stream);
        if (self->workspace != NULL) PyThread_release_lock(self->ws_lock);
        Py_END_ALLOW_THREADS
    } else {
        code = self->fn(ins, self->n_in, outs, self->n_out, self->params, self->n_params, workspace, stream);
    }
    Py_XDECREF(ws);  /* CUDA: the caching allocator orders its reuse after this stream's launch */
    if (code != 0) {
        PyErr_Format(PyExc_RuntimeError, "kforge kernel for %U failed to launch (error %d)", self->label, code);
        goto fail;
    }
    self->calls++;
    Py_DECREF(fast);
    return result;
fail:
    Py_DECREF(fast);
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
    self->workspace = NULL;
    if (PyCallable_Check(workspace)) {
        Py_INCREF(workspace);
        Py_XSETREF(self->ws_alloc, workspace);
    } else if (workspace != Py_None) {
        self->workspace = PyLong_AsVoidPtr(workspace);
        if (PyErr_Occurred()) return -1;
    }
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
    if (self->ws_lock == NULL && (self->ws_lock = PyThread_allocate_lock()) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->calls = 0;
    self->fn = entry;  /* last: a launcher is callable only once fully initialised */
    return 0;
}

static int Launcher_traverse(Launcher* self, visitproc visit, void* arg) {
    Py_VISIT(self->ws_alloc);
    Py_VISIT(self->allocs);
    Py_VISIT(self->stream_fn);
    Py_VISIT(self->stream_arg);
    Py_VISIT(self->keepalive);
    return 0;
}

static int Launcher_clear(Launcher* self) {
    self->fn = NULL;  /* uncallable from here on */
    Py_CLEAR(self->ws_alloc);
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
    if (self->ws_lock != NULL) PyThread_free_lock(self->ws_lock);
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

/* ------------------------------------------------------------------------------------------
 * The dispatch front: a cache from the raw call (argument types and values, each tensor's shape,
 * dtype, strides and device) to what the Python guard decided for that call the first time:
 * MISS (run the original) or (launcher, input positions, deployment, inplace, scope). Binding and the
 * exact-signature key are then paid once per distinct call, not per call. Only what the raw call
 * determines is cached; what can change between two identical calls (grad mode, requires_grad,
 * whether the deployment is active) is checked on every call. The Python side clears the caches
 * whenever the installed kernels change.
 */

typedef struct {
    PyObject* tensor_types;  /* tuple of exact types treated as plain tensors */
    PyObject* value_types;   /* tuple of exact types whose values may enter a key (dtype, device, ...) */
} KeyTypes;

static PyObject* s_shape;
static PyObject* s_dtype;
static PyObject* s_stride;
static PyObject* s_device;
static PyObject* s_requires_grad;
static PyObject* s_installed;
static PyObject* s_depth;
static PyObject* s_current_level;
static PyObject* s_copy_;
static PyObject* s_is_neg;
static PyObject* s_is_conj;

static int in_types(PyObject* obj, PyObject* types) {
    PyTypeObject* t = Py_TYPE(obj);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(types); ++i)
        if ((PyObject*)t == PyTuple_GET_ITEM(types, i)) return 1;
    return 0;
}

static int plain_scalar(PyObject* v) {
    /* NaN is left out: it never equals itself, so every such call would be a new cache entry */
    return v == Py_None || PyBool_Check(v) || PyLong_CheckExact(v) ||
           (PyFloat_CheckExact(v) && !Py_IS_NAN(PyFloat_AS_DOUBLE(v)));
}

/* One argument's part of the key (new reference), or NULL without an error: not cacheable. */
static PyObject* key_part(PyObject* v, const KeyTypes* kt) {
    if (in_types(v, kt->tensor_types)) {
        /* a lazily negated or conjugated view reads differently from its memory: never cached */
        for (int b = 0; b < 2; ++b) {
            PyObject* bit = PyObject_CallMethodNoArgs(v, b ? s_is_conj : s_is_neg);
            if (bit == NULL) return NULL;
            int set = PyObject_IsTrue(bit);
            Py_DECREF(bit);
            if (set != 0) return NULL;
        }
        PyObject *shape = NULL, *dtype = NULL, *stride = NULL, *device = NULL, *part = NULL;
        if ((shape = PyObject_GetAttr(v, s_shape)) && (dtype = PyObject_GetAttr(v, s_dtype)) &&
            (stride = PyObject_CallMethodNoArgs(v, s_stride)) && (device = PyObject_GetAttr(v, s_device)))
            part = PyTuple_Pack(4, shape, dtype, stride, device);
        Py_XDECREF(shape);
        Py_XDECREF(dtype);
        Py_XDECREF(stride);
        Py_XDECREF(device);
        return part;
    }
    if (plain_scalar(v) || PyUnicode_CheckExact(v) || in_types(v, kt->value_types))
        return PyTuple_Pack(2, (PyObject*)Py_TYPE(v), v);  /* the type too: 1, 1.0 and True differ */
    if (PyTuple_CheckExact(v) || PyList_CheckExact(v)) {
        PyObject* fast = PySequence_Fast(v, "");
        if (fast == NULL) return NULL;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
        PyObject* items = PyTuple_New(n + 1);
        if (items == NULL) { Py_DECREF(fast); return NULL; }
        Py_INCREF((PyObject*)Py_TYPE(v));
        PyTuple_SET_ITEM(items, 0, (PyObject*)Py_TYPE(v));
        for (Py_ssize_t i = 0; i < n; ++i) {
            PyObject* item = PySequence_Fast_GET_ITEM(fast, i);
            if (!plain_scalar(item)) { Py_DECREF(items); Py_DECREF(fast); return NULL; }
            PyObject* typed = PyTuple_Pack(2, (PyObject*)Py_TYPE(item), item);
            if (typed == NULL) { Py_DECREF(items); Py_DECREF(fast); return NULL; }
            PyTuple_SET_ITEM(items, i + 1, typed);
        }
        Py_DECREF(fast);
        return items;
    }
    return NULL;  /* anything else (another object, a tensor subclass): not cacheable */
}

/* The key of a call (new reference), or NULL: with an error set on failure, without when the
 * call is not cacheable. */
static PyObject* call_key(PyObject* args, PyObject* kwargs, const KeyTypes* kt) {
    Py_ssize_t n = PyTuple_GET_SIZE(args), nk = kwargs ? PyDict_GET_SIZE(kwargs) : 0;
    PyObject* key = PyTuple_New(n + 2 * nk);
    if (key == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* part = key_part(PyTuple_GET_ITEM(args, i), kt);
        if (part == NULL) { Py_DECREF(key); return NULL; }
        PyTuple_SET_ITEM(key, i, part);
    }
    if (nk) {
        Py_ssize_t pos = 0, j = n;
        PyObject *name, *value;
        while (PyDict_Next(kwargs, &pos, &name, &value)) {
            if (j + 2 > n + 2 * nk) break;  /* the dict grew meanwhile: not ours to key */
            Py_INCREF(name);
            Py_INCREF(value);
            PyObject* part = key_part(value, kt);
            Py_DECREF(value);
            if (part == NULL) { Py_DECREF(name); Py_DECREF(key); return NULL; }
            PyTuple_SET_ITEM(key, j++, name);
            PyTuple_SET_ITEM(key, j++, part);
        }
        if (j != n + 2 * nk) { Py_DECREF(key); return NULL; }  /* it changed size: not cacheable */
    }
    return key;
}

typedef struct {
    PyObject_HEAD
    KeyTypes kt;
    PyObject* cache;      /* dict: call key -> MISS or (launcher, positions, deployment, inplace, scope) */
    PyObject* miss;       /* the MISS sentinel */
    PyObject* slow;       /* the Python guard: slow(*args, **kwargs) */
    PyObject* original;   /* the torch callable */
    PyObject* grad_enabled;  /* torch.is_grad_enabled */
    PyObject* checks;        /* tuple of callables, each truthy when every call must run eager */
    PyObject* forward_ad;    /* torch.autograd.forward_ad (its _current_level), or None */
} Dispatch;

/* The input tensors of a cached hit, picked from the call by position (int) or keyword (str). */
static PyObject* pick_inputs(PyObject* positions, PyObject* args, PyObject* kwargs) {
    Py_ssize_t n = PyTuple_GET_SIZE(positions);
    PyObject* inputs = PyTuple_New(n);
    if (inputs == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* where = PyTuple_GET_ITEM(positions, i);
        PyObject* t = Py_None;
        if (PyLong_CheckExact(where)) {
            Py_ssize_t k = PyLong_AsSsize_t(where);
            if (k < 0 || k >= PyTuple_GET_SIZE(args)) goto bad;
            t = PyTuple_GET_ITEM(args, k);
        } else if (PyUnicode_CheckExact(where)) {
            t = kwargs ? PyDict_GetItemWithError(kwargs, where) : NULL;
            if (t == NULL) goto bad;
        }
        Py_INCREF(t);
        PyTuple_SET_ITEM(inputs, i, t);
    }
    return inputs;
bad:
    Py_DECREF(inputs);
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "kforge: a cached input position is out of range");
    return NULL;
}

/* Deployment.active without a Python frame: installed, and, for a model-scoped deployment (scope
 * is its per-thread state), inside that model's forward in this thread. 1, 0, or -1 on error. */
static int deployment_active(PyObject* dep, PyObject* scope) {
    PyObject* installed = PyObject_GetAttr(dep, s_installed);
    if (installed == NULL) return -1;
    int on = PyObject_IsTrue(installed);
    Py_DECREF(installed);
    if (on <= 0 || scope == Py_None) return on;
    PyObject* depth = PyObject_GetAttr(scope, s_depth);
    if (depth == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();  /* never entered in this thread */
        return 0;
    }
    long d = PyLong_AsLong(depth);
    Py_DECREF(depth);
    if (d == -1 && PyErr_Occurred()) return -1;
    return d > 0;
}

/* Forward-mode AD is on when its module's level is 0 or more. 1, 0, or -1 on error. */
static int forward_ad_on(PyObject* module) {
    if (module == Py_None) return 0;
    PyObject* level = PyObject_GetAttr(module, s_current_level);
    if (level == NULL) return -1;
    long l = PyLong_AsLong(level);
    Py_DECREF(level);
    if (l == -1 && PyErr_Occurred()) return -1;
    return l >= 0;
}

static PyObject* Dispatch_run(Dispatch* self, PyObject* const* argv, Py_ssize_t argc) {
    if (argc != 2 || !PyTuple_CheckExact(argv[0]) || (argv[1] != Py_None && !PyDict_CheckExact(argv[1]))) {
        PyErr_SetString(PyExc_TypeError, "run(args: tuple, kwargs: dict | None)");
        return NULL;
    }
    PyObject* args = argv[0];
    PyObject* kwargs = argv[1] == Py_None ? NULL : argv[1];
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(self->checks); ++i) {
        PyObject* r = PyObject_CallNoArgs(PyTuple_GET_ITEM(self->checks, i));
        if (r == NULL) return NULL;
        int on = PyObject_IsTrue(r);
        Py_DECREF(r);
        if (on < 0) return NULL;
        if (on) return PyObject_Call(self->original, args, kwargs);  /* a transform, a mode, autocast */
    }
    int fwd = forward_ad_on(self->forward_ad);
    if (fwd < 0) return NULL;
    if (fwd) return PyObject_Call(self->original, args, kwargs);  /* dual tensors: eager keeps tangents */
    PyObject* key = call_key(args, kwargs, &self->kt);
    if (key == NULL) {
        if (PyErr_Occurred()) return NULL;
        return PyObject_Call(self->slow, args, kwargs);
    }
    PyObject* entry = PyDict_GetItemWithError(self->cache, key);  /* borrowed */
    Py_XINCREF(entry);  /* ours before anything can run: the cache may be cleared meanwhile */
    Py_DECREF(key);
    if (entry == NULL) {
        if (PyErr_Occurred()) return NULL;
        return PyObject_Call(self->slow, args, kwargs);  /* first time: the guard decides (and caches) */
    }
    if (entry == self->miss) {
        Py_DECREF(entry);
        return PyObject_Call(self->original, args, kwargs);
    }
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 5) {
        Py_DECREF(entry);
        PyErr_SetString(PyExc_RuntimeError, "kforge: malformed dispatch cache entry");
        return NULL;
    }
    PyObject *result = NULL, *inputs = NULL, *outs = NULL;
    int is_active = deployment_active(PyTuple_GET_ITEM(entry, 2), PyTuple_GET_ITEM(entry, 4));
    if (is_active < 0) goto done;
    if (!is_active) { result = PyObject_Call(self->original, args, kwargs); goto done; }
    inputs = pick_inputs(PyTuple_GET_ITEM(entry, 1), args, kwargs);
    if (inputs == NULL) goto done;
    PyObject* grad = PyObject_CallNoArgs(self->grad_enabled);
    if (grad == NULL) goto done;
    int grad_on = PyObject_IsTrue(grad);
    Py_DECREF(grad);
    if (grad_on < 0) goto done;
    if (grad_on) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(inputs); ++i) {
            PyObject* t = PyTuple_GET_ITEM(inputs, i);
            if (t == Py_None) continue;
            PyObject* rg = PyObject_GetAttr(t, s_requires_grad);
            if (rg == NULL) goto done;
            int needs = PyObject_IsTrue(rg);
            Py_DECREF(rg);
            if (needs < 0) goto done;
            if (needs) { result = PyObject_Call(self->original, args, kwargs); goto done; }  /* autograd: eager */
        }
    }
    outs = PyObject_CallOneArg(PyTuple_GET_ITEM(entry, 0), inputs);
    if (outs == NULL) goto done;
    if (!PyList_CheckExact(outs) || PyList_GET_SIZE(outs) < 1) {
        PyErr_SetString(PyExc_RuntimeError, "kforge: a launcher returned no outputs");
        goto done;
    }
    int inplace = PyObject_IsTrue(PyTuple_GET_ITEM(entry, 3));
    if (inplace < 0) goto done;
    if (inplace)
        result = PyObject_CallMethodOneArg(PyTuple_GET_ITEM(inputs, 0), s_copy_, PyList_GET_ITEM(outs, 0));
    else if (PyList_GET_SIZE(outs) == 1) {
        result = PyList_GET_ITEM(outs, 0);
        Py_INCREF(result);
    } else
        result = PyList_AsTuple(outs);
done:
    Py_XDECREF(outs);
    Py_XDECREF(inputs);
    Py_DECREF(entry);
    return result;
}

static PyObject* Dispatch_key(Dispatch* self, PyObject* const* argv, Py_ssize_t argc) {
    if (argc != 2 || !PyTuple_CheckExact(argv[0]) || (argv[1] != Py_None && !PyDict_CheckExact(argv[1]))) {
        PyErr_SetString(PyExc_TypeError, "key(args: tuple, kwargs: dict | None)");
        return NULL;
    }
    PyObject* key = call_key(argv[0], argv[1] == Py_None ? NULL : argv[1], &self->kt);
    if (key == NULL && !PyErr_Occurred()) Py_RETURN_NONE;
    return key;
}

static int Dispatch_init(Dispatch* self, PyObject* args, PyObject* kwargs) {
    static char* names[] = {"cache", "miss", "slow", "original", "grad_enabled", "tensor_types", "value_types",
                            "checks", "forward_ad", NULL};
    PyObject *cache, *miss, *slow, *original, *grad_enabled, *tensor_types, *value_types, *checks, *forward_ad;
    if (self->cache != NULL) {
        PyErr_SetString(PyExc_TypeError, "a dispatch front is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OOOOO!O!O!O", names, &PyDict_Type, &cache, &miss, &slow,
                                     &original, &grad_enabled, &PyTuple_Type, &tensor_types, &PyTuple_Type,
                                     &value_types, &PyTuple_Type, &checks, &forward_ad))
        return -1;
    PyObject* objs[] = {miss, slow, original, grad_enabled, tensor_types, value_types, checks, forward_ad};
    PyObject** slots[] = {&self->miss, &self->slow, &self->original, &self->grad_enabled, &self->kt.tensor_types,
                          &self->kt.value_types, &self->checks, &self->forward_ad};
    for (int i = 0; i < 8; ++i) {
        Py_INCREF(objs[i]);
        *slots[i] = objs[i];
    }
    Py_INCREF(cache);
    self->cache = cache;  /* last: set means initialised */
    return 0;
}

static int Dispatch_ready(Dispatch* self) {
    if (self->cache == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "this dispatch front was never initialised");
        return 0;
    }
    return 1;
}

static PyObject* Dispatch_run_checked(Dispatch* self, PyObject* const* argv, Py_ssize_t argc) {
    return Dispatch_ready(self) ? Dispatch_run(self, argv, argc) : NULL;
}

static PyObject* Dispatch_key_checked(Dispatch* self, PyObject* const* argv, Py_ssize_t argc) {
    return Dispatch_ready(self) ? Dispatch_key(self, argv, argc) : NULL;
}

static int Dispatch_traverse(Dispatch* self, visitproc visit, void* arg) {
    Py_VISIT(self->cache);
    Py_VISIT(self->miss);
    Py_VISIT(self->slow);
    Py_VISIT(self->original);
    Py_VISIT(self->grad_enabled);
    Py_VISIT(self->kt.tensor_types);
    Py_VISIT(self->kt.value_types);
    Py_VISIT(self->checks);
    Py_VISIT(self->forward_ad);
    return 0;
}

static int Dispatch_clear(Dispatch* self) {
    Py_CLEAR(self->cache);
    Py_CLEAR(self->miss);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->original);
    Py_CLEAR(self->grad_enabled);
    Py_CLEAR(self->kt.tensor_types);
    Py_CLEAR(self->kt.value_types);
    Py_CLEAR(self->checks);
    Py_CLEAR(self->forward_ad);
    return 0;
}

static void Dispatch_dealloc(Dispatch* self) {
    PyObject_GC_UnTrack(self);
    Dispatch_clear(self);
    Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyMethodDef Dispatch_methods[] = {
    {"run", (PyCFunction)(void (*)(void))Dispatch_run_checked, METH_FASTCALL,
     "run(args, kwargs): the call through the cache, or through the Python guard the first time"},
    {"key", (PyCFunction)(void (*)(void))Dispatch_key_checked, METH_FASTCALL,
     "key(args, kwargs): the cache key of a call, or None when it is not cacheable"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DispatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kforge._kforge_fast.Dispatch",
    .tp_basicsize = sizeof(Dispatch),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A patched operator's dispatch front: cached guard decisions per distinct call.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Dispatch_init,
    .tp_traverse = (traverseproc)Dispatch_traverse,
    .tp_clear = (inquiry)Dispatch_clear,
    .tp_dealloc = (destructor)Dispatch_dealloc,
    .tp_methods = Dispatch_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kforge_fast", "kforge's launch fast path", -1, NULL};

static int intern(PyObject** slot, const char* text) {
    *slot = PyUnicode_InternFromString(text);
    return *slot == NULL ? -1 : 0;
}

PyMODINIT_FUNC PyInit__kforge_fast(void) {
    if (PyType_Ready(&LauncherType) < 0 || PyType_Ready(&DispatchType) < 0) return NULL;
    if (intern(&s_data_ptr, "data_ptr") < 0 || intern(&s_shape, "shape") < 0 || intern(&s_dtype, "dtype") < 0 ||
        intern(&s_stride, "stride") < 0 || intern(&s_device, "device") < 0 ||
        intern(&s_requires_grad, "requires_grad") < 0 || intern(&s_installed, "installed") < 0 ||
        intern(&s_depth, "depth") < 0 || intern(&s_current_level, "_current_level") < 0 ||
        intern(&s_copy_, "copy_") < 0 || intern(&s_is_neg, "is_neg") < 0 || intern(&s_is_conj, "is_conj") < 0)
        return NULL;
    PyObject* m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&LauncherType);
    if (PyModule_AddObject(m, "Launcher", (PyObject*)&LauncherType) < 0) {
        Py_DECREF(&LauncherType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&DispatchType);
    if (PyModule_AddObject(m, "Dispatch", (PyObject*)&DispatchType) < 0) {
        Py_DECREF(&DispatchType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
