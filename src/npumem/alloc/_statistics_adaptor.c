/* The statistics adaptor's counts and hot path (adaptors.py's StatisticsAdaptor derives from
 * this type and adds only the pass-through parts of Adaptor).
 *
 * Why C: in Python the adaptor's allocate+free pair cost about 1 us (two timer calls, log
 * appends and their periodic fold), over half of a cache-hit pair of the pool once the pool's
 * own counts and free list moved to C. Here the upstream is called through the vectorcall
 * protocol, timed with clock_gettime(CLOCK_MONOTONIC) (what perf_counter_ns reads on Linux),
 * and counted in place.
 *
 * Thread safety: every count changes while this thread holds the GIL, and no Python code runs
 * between reading a count and writing it back (the size table's keys are the upstream's int
 * pointers), so no lock is taken. The GIL is given up only inside the upstream's calls.
 *
 * Peaks are exact: an allocation's bytes count once the upstream has returned the pointer, and
 * a free's bytes leave the count (and the size table) before the upstream frees them, so a
 * thread handed the same memory back cannot be counted on top of them. A failed free puts them
 * back. The counting rule is tests/test_adaptor_statistics_native.py's oracle, the former
 * Python adaptor, driven with the same calls.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <time.h>

typedef struct {
    PyObject_HEAD
    PyObject *upstream;         /* Adaptor.__init__ sets it through the `_upstream` member */
    PyObject *sizes;            /* dict: live pointer -> requested bytes */
    long long allocations, frees, failures;
    long long current_bytes, peak_bytes, total_bytes;
    long long alloc_ns, free_ns, max_alloc_ns;
} Counts;

static PyObject *str_allocate, *str_deallocate;

static inline long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Python's rule in the former adaptor: only an Exception is a counted failure (a
 * KeyboardInterrupt or SystemExit passes through uncounted). */
static inline int is_exception(void) {
    return PyErr_ExceptionMatches(PyExc_Exception);
}

/* Fills out[0..count) from a vectorcall's arguments by position or by name; the ones past
 * `required` default to None. Returns -1 with a TypeError set on a bad call. */
static int parse_args(const char *function, const char *const *names, Py_ssize_t count,
                      Py_ssize_t required, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *kwnames, PyObject **out) {
    if (nargs > count) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %zd arguments (%zd given)",
                     function, count, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        out[i] = i < nargs ? args[i] : NULL;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        Py_ssize_t i = 0;
        while (i < count && PyUnicode_CompareWithASCIIString(name, names[i]) != 0)
            i++;
        if (i == count) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'",
                         function, name);
            return -1;
        }
        if (out[i] != NULL) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'",
                         function, names[i]);
            return -1;
        }
        out[i] = args[nargs + k];
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (out[i] != NULL)
            continue;
        if (i < required) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'",
                         function, names[i]);
            return -1;
        }
        out[i] = Py_None;
    }
    return 0;
}

static PyObject *upstream_or_error(Counts *self) {
    if (self->upstream == NULL)
        PyErr_SetString(PyExc_AttributeError, "the statistics adaptor has no upstream");
    return self->upstream;
}

static PyObject *Counts_allocate(Counts *self, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames) {
    static const char *const names[] = {"nbytes", "stream"};
    PyObject *given[2];
    if (parse_args("allocate", names, 2, 1, args, nargs, kwnames, given) < 0)
        return NULL;
    PyObject *upstream = upstream_or_error(self);
    if (upstream == NULL)
        return NULL;
    /* A size the counts cannot hold is a failed request, as the pool's own TypeError is. */
    long long nbytes = PyLong_AsLongLong(given[0]);
    if (nbytes == -1 && PyErr_Occurred()) {
        if (is_exception())
            self->failures++;
        return NULL;
    }
    /* The slot before the arguments is free for the callee (PY_VECTORCALL_ARGUMENTS_OFFSET). */
    PyObject *call[4] = {NULL, upstream, given[0], given[1]};
    Py_INCREF(upstream);        /* the upstream may be replaced while it runs */
    long long start = now_ns();
    PyObject *pointer = PyObject_VectorcallMethod(
        str_allocate, call + 1, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    long long took = now_ns() - start;
    Py_DECREF(upstream);
    if (pointer == NULL) {
        if (is_exception())
            self->failures++;
        return NULL;
    }
    PyObject *size = PyLong_CheckExact(given[0]) ? Py_NewRef(given[0])
                                                 : PyLong_FromLongLong(nbytes);
    if (size == NULL || PyDict_SetItem(self->sizes, pointer, size) < 0) {
        /* Out of memory: the block stays allocated and uncounted, as it did in Python. */
        Py_XDECREF(size);
        Py_DECREF(pointer);
        return NULL;
    }
    Py_DECREF(size);
    self->allocations++;
    self->alloc_ns += took;
    if (took > self->max_alloc_ns)
        self->max_alloc_ns = took;
    self->current_bytes += nbytes;
    if (nbytes > 0)
        self->total_bytes += nbytes;
    if (self->current_bytes > self->peak_bytes)
        self->peak_bytes = self->current_bytes;
    return pointer;
}

static PyObject *Counts_deallocate(Counts *self, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames) {
    static const char *const names[] = {"pointer", "nbytes", "stream"};
    PyObject *given[3];
    if (parse_args("deallocate", names, 3, 1, args, nargs, kwnames, given) < 0)
        return NULL;
    PyObject *upstream = upstream_or_error(self);
    if (upstream == NULL)
        return NULL;
    PyObject *pointer = given[0];
    /* The entry leaves the table (and its bytes the count) before the upstream frees the
     * pointer: once freed, another thread may be handed it and record its own entry. */
    PyObject *entry = PyDict_GetItemWithError(self->sizes, pointer);     /* borrowed */
    long long size = 0;
    if (entry != NULL) {
        size = PyLong_AsLongLong(entry);       /* an exact int the allocate stored */
        if (size == -1 && PyErr_Occurred())
            return NULL;
        Py_INCREF(entry);
        if (PyDict_DelItem(self->sizes, pointer) < 0) {
            Py_DECREF(entry);
            return NULL;
        }
    } else if (PyErr_Occurred()) {             /* an unhashable pointer */
        return NULL;
    }
    self->current_bytes -= size;
    PyObject *call[5] = {NULL, upstream, pointer, given[1], given[2]};
    Py_INCREF(upstream);
    long long start = now_ns();
    PyObject *result = PyObject_VectorcallMethod(
        str_deallocate, call + 1, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    long long took = now_ns() - start;
    Py_DECREF(upstream);
    if (result == NULL) {
        if (is_exception()) {
            /* Not freed: the bytes and the entry come back, the upstream's error stands. */
            self->current_bytes += size;
            if (entry != NULL) {
                PyObject *type, *value, *traceback;
                PyErr_Fetch(&type, &value, &traceback);
                if (PyDict_SetItem(self->sizes, pointer, entry) < 0)
                    PyErr_Clear();             /* out of memory; the upstream's error wins */
                PyErr_Restore(type, value, traceback);
            }
        }
        Py_XDECREF(entry);
        return NULL;
    }
    Py_DECREF(result);
    self->frees++;
    self->free_ns += took;
    Py_XDECREF(entry);
    Py_RETURN_NONE;
}

/* One counts-at-a-moment snapshot: under the GIL nothing changes while it is built. */
static PyObject *Counts_stats(Counts *self, PyObject *unused) {
    double mean_alloc = self->allocations ? (double)self->alloc_ns / self->allocations / 1e3 : 0.0;
    double mean_free = self->frees ? (double)self->free_ns / self->frees / 1e3 : 0.0;
    return Py_BuildValue(
        "{s:L,s:L,s:L,s:L,s:L,s:L,s:n,s:d,s:d,s:d}",
        "allocations", self->allocations, "frees", self->frees, "failures", self->failures,
        "current_bytes", self->current_bytes, "peak_bytes", self->peak_bytes,
        "total_bytes", self->total_bytes, "live", PyDict_GET_SIZE(self->sizes),
        "mean_alloc_us", mean_alloc, "max_alloc_us", (double)self->max_alloc_ns / 1e3,
        "mean_free_us", mean_free);
}

static PyObject *Counts_reset_peak(Counts *self, PyObject *unused) {
    self->peak_bytes = self->current_bytes;
    Py_RETURN_NONE;
}

static PyObject *Counts_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    /* The arguments are the subclass's __init__'s (Adaptor's: the upstream). */
    Counts *self = (Counts *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->sizes = PyDict_New();
    if (self->sizes == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int Counts_traverse(Counts *self, visitproc visit, void *arg) {
    Py_VISIT(self->upstream);
    Py_VISIT(self->sizes);
    return 0;
}

static int Counts_clear(Counts *self) {
    Py_CLEAR(self->upstream);
    Py_CLEAR(self->sizes);
    return 0;
}

static void Counts_dealloc(Counts *self) {
    PyObject_GC_UnTrack(self);
    Counts_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Counts_methods[] = {
    {"allocate", (PyCFunction)(void (*)(void))Counts_allocate, METH_FASTCALL | METH_KEYWORDS,
     "allocate(nbytes, stream=None) -> pointer: the upstream's, counted and timed."},
    {"deallocate", (PyCFunction)(void (*)(void))Counts_deallocate,
     METH_FASTCALL | METH_KEYWORDS,
     "deallocate(pointer, nbytes=None, stream=None): the upstream's, counted and timed."},
    {"stats", (PyCFunction)Counts_stats, METH_NOARGS,
     "stats() -> dict of the counts, bytes, live allocations and latencies."},
    {"reset_peak", (PyCFunction)Counts_reset_peak, METH_NOARGS,
     "reset_peak(): the peak starts again from the current bytes."},
    {NULL},
};

#define COUNT(name) {#name, T_LONGLONG, offsetof(Counts, name), READONLY, NULL}
static PyMemberDef Counts_members[] = {
    {"_upstream", T_OBJECT_EX, offsetof(Counts, upstream), 0, "the wrapped resource"},
    {"_sizes", T_OBJECT_EX, offsetof(Counts, sizes), READONLY,
     "live pointer -> requested bytes"},
    COUNT(allocations), COUNT(frees), COUNT(failures),
    COUNT(current_bytes), COUNT(peak_bytes), COUNT(total_bytes),
    COUNT(alloc_ns), COUNT(free_ns), COUNT(max_alloc_ns),
    {NULL},
};

static PyTypeObject CountsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npumem.alloc._statistics_adaptor.StatisticsCounts",
    .tp_doc = "The statistics adaptor's counts and its counted allocate and deallocate.",
    .tp_basicsize = sizeof(Counts),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = Counts_new,
    .tp_traverse = (traverseproc)Counts_traverse,
    .tp_clear = (inquiry)Counts_clear,
    .tp_dealloc = (destructor)Counts_dealloc,
    .tp_methods = Counts_methods,
    .tp_members = Counts_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_statistics_adaptor",
    "The statistics adaptor's counts and hot path in C.", -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__statistics_adaptor(void) {
    if (PyType_Ready(&CountsType) < 0)
        return NULL;
    str_allocate = PyUnicode_InternFromString("allocate");
    if (str_allocate == NULL)
        return NULL;
    str_deallocate = PyUnicode_InternFromString("deallocate");
    if (str_deallocate == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&CountsType);
    if (PyModule_AddObject(m, "StatisticsCounts", (PyObject *)&CountsType) < 0) {
        Py_DECREF(&CountsType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
