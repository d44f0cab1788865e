/* The caching pool's statistics counts (stats.py's PoolStats keeps them here).
 *
 * Each tracked stat has current, peak and grown (the sum of its increases) for every pool:
 * slot 3 * stat + pool, pool 0 all, 1 small, 2 large. A change counts in "all" and in the
 * small or the large pool.
 *
 * Why C: the pool changes three stats (allocation, allocated_bytes, requested_bytes) on every
 * allocate and every free. Counted in Python that was more than the rest of a cache-hit pair;
 * logged and folded later with numpy, the conversion of the logged ints alone was ~0.25 us a
 * pair. Here an event is one call and the peaks are exact at every moment. The counting rule is
 * stated once, in `count`; tests/test_pool.py recounts events in Python as its oracle.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define LIMIT ((int64_t)1 << 56)      /* the largest change: far above any device's bytes */

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;                   /* slots: 3 per stat */
    int64_t *now, *peak, *grown;
} Counts;

/* The one counting rule: `amount` changes slot k + pool for pool "all" and the event's pool.
 * Totals saturate at INT64_MAX (9.2 EB of increases) rather than wrap. */
static inline void count(Counts *c, Py_ssize_t k, int small, int64_t amount) {
    Py_ssize_t slots[2] = {k, k + (small ? 1 : 2)};
    for (int j = 0; j < 2; j++) {
        Py_ssize_t i = slots[j];
        int64_t value = c->now[i] + amount;
        c->now[i] = value;
        if (amount > 0) {
            if (__builtin_add_overflow(c->grown[i], amount, &c->grown[i]))
                c->grown[i] = INT64_MAX;
            if (value > c->peak[i]) c->peak[i] = value;
        }
    }
}

/* The sizes an event carries: at most a device's bytes, so no sum of them overflows. */
static int event_args(PyObject *const *args, Py_ssize_t nargs, const char *name, int64_t *size,
                      int64_t *requested, int *small) {
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "%s(size, requested, small) takes 3 arguments", name);
        return -1;
    }
    *size = PyLong_AsLongLong(args[0]);
    *requested = PyLong_AsLongLong(args[1]);
    *small = PyObject_IsTrue(args[2]);
    if (PyErr_Occurred() || *small < 0) return -1;
    if (*size < 0 || *requested < 0 || *size > LIMIT || *requested > LIMIT) {
        PyErr_Format(PyExc_ValueError, "%s: sizes must be 0..2**56, got %lld and %lld", name,
                     (long long)*size, (long long)*requested);
        return -1;
    }
    return 0;
}

/* allocation, allocated_bytes and requested_bytes are stats 0, 1 and 2: slots 0, 3 and 6 */
static void event(Counts *c, int sign, int64_t size, int64_t requested, int small) {
    count(c, 0, small, sign);
    count(c, 3, small, sign * size);
    count(c, 6, small, sign * requested);
}

static PyObject *Counts_alloc(Counts *c, PyObject *const *args, Py_ssize_t nargs) {
    int64_t size, requested;
    int small;
    if (event_args(args, nargs, "alloc", &size, &requested, &small) < 0) return NULL;
    event(c, +1, size, requested, small);
    Py_RETURN_NONE;
}

static PyObject *Counts_free(Counts *c, PyObject *const *args, Py_ssize_t nargs) {
    int64_t size, requested;
    int small;
    if (event_args(args, nargs, "free", &size, &requested, &small) < 0) return NULL;
    event(c, -1, size, requested, small);
    Py_RETURN_NONE;
}

static PyObject *Counts_add(Counts *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "add(slot, small, amount) takes 3 arguments");
        return NULL;
    }
    Py_ssize_t k = PyLong_AsSsize_t(args[0]);
    int small = PyObject_IsTrue(args[1]);
    int64_t amount = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred() || small < 0) return NULL;
    if (k < 0 || k % 3 || k + 2 >= c->n || amount > LIMIT || amount < -LIMIT) {
        PyErr_Format(PyExc_ValueError, "add: slot %zd is no stat's, or the amount %lld is "
                     "beyond 2**56", k, (long long)amount);
        return NULL;
    }
    count(c, k, small, amount);
    Py_RETURN_NONE;
}

static PyObject *as_list(Counts *c, const int64_t *values) {
    PyObject *out = PyList_New(c->n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < c->n; i++) {
        PyObject *v = PyLong_FromLongLong(values[i]);
        if (!v) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

/* one slot's (current, peak, grown) */
static PyObject *Counts_get(Counts *c, PyObject *arg) {
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0 || i >= c->n) {
        PyErr_Format(PyExc_IndexError, "get: slot %zd of %zd", i, c->n);
        return NULL;
    }
    return Py_BuildValue("(LLL)", (long long)c->now[i], (long long)c->peak[i],
                         (long long)c->grown[i]);
}

static PyObject *Counts_lists(Counts *c, PyObject *unused) {
    PyObject *now = as_list(c, c->now), *peak = as_list(c, c->peak), *grown = as_list(c, c->grown);
    PyObject *out = now && peak && grown ? PyTuple_Pack(3, now, peak, grown) : NULL;
    Py_XDECREF(now); Py_XDECREF(peak); Py_XDECREF(grown);
    return out;
}

static PyObject *Counts_reset_peaks(Counts *c, PyObject *unused) {
    memcpy(c->peak, c->now, (size_t)c->n * sizeof(int64_t));
    Py_RETURN_NONE;
}

static PyObject *Counts_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"slots", NULL};
    Py_ssize_t n;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "n", names, &n)) return NULL;
    if (n < 3 || n % 3 || n > 3000) {
        PyErr_SetString(PyExc_ValueError, "Counts: slots must be 3..3000, three per stat");
        return NULL;
    }
    Counts *c = (Counts *)type->tp_alloc(type, 0);
    if (!c) return NULL;
    c->n = n;
    c->now = PyMem_Calloc((size_t)n * 3, sizeof(int64_t));       /* the three arrays in one */
    if (!c->now) { Py_DECREF(c); return PyErr_NoMemory(); }
    c->peak = c->now + n;
    c->grown = c->now + 2 * n;
    return (PyObject *)c;
}

static void Counts_dealloc(Counts *c) {
    PyMem_Free(c->now);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyMethodDef Counts_methods[] = {
    {"alloc", (PyCFunction)(void (*)(void))Counts_alloc, METH_FASTCALL,
     "alloc(size, requested, small): an allocation of a block of `size` bytes"},
    {"free", (PyCFunction)(void (*)(void))Counts_free, METH_FASTCALL,
     "free(size, requested, small): the free of such a block"},
    {"add", (PyCFunction)(void (*)(void))Counts_add, METH_FASTCALL,
     "add(slot, small, amount): change the stat at slot (3 * stat) by amount"},
    {"get", (PyCFunction)Counts_get, METH_O, "get(slot): (current, peak, grown)"},
    {"lists", (PyCFunction)Counts_lists, METH_NOARGS, "([current], [peak], [grown]) by slot"},
    {"reset_peaks", (PyCFunction)Counts_reset_peaks, METH_NOARGS, "peaks := currents"},
    {NULL}
};

static PyTypeObject CountsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npumem.alloc._pool_stats.Counts",
    .tp_basicsize = sizeof(Counts),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Counts(slots): current, peak and total increases of the pool's stats.",
    .tp_new = Counts_new,
    .tp_dealloc = (destructor)Counts_dealloc,
    .tp_methods = Counts_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pool_stats", "The caching pool's statistics counts.", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__pool_stats(void) {
    if (PyType_Ready(&CountsType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&CountsType);
    if (PyModule_AddObject(m, "Counts", (PyObject *)&CountsType) < 0) {
        Py_DECREF(&CountsType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
