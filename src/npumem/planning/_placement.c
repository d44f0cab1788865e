/* Placing buffers in a given order, each in the lowest (or the tightest) gap that the placed
 * buffers live at the same time leave: the greedy placement of npumem.planning and of the
 * predictive pool's step layouts (placement.place is its statement in Python, and the oracle of
 * tests/test_placement_native.py).
 *
 * A buffer's lifetime is one or more pieces [lo, hi) (a step layout cuts a block that crosses
 * the step's end in two). Placed pieces and the rows held beforehand are rows (start, end,
 * from, until): bytes [start, end) taken from `from` until `until`. A buffer meets a row when
 * one of its pieces overlaps the row's time; among the rows it meets, sorted by start (ties in
 * row order), the gaps below each start over the highest end before it are the candidates.
 *
 * Plain C with Python's headers only: arrays come in and go out as bytes of int64.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* a row: bytes [start, end) taken from `from` until `until` */
typedef struct {
    int64_t start, end, from, until;
} Row;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Whether the row is live during one of the pieces lo/hi[p0:p1]. */
static int meets(const Row *row, const int64_t *lo, const int64_t *hi, Py_ssize_t p0,
                 Py_ssize_t p1) {
    for (Py_ssize_t p = p0; p < p1; p++)
        if (row->from < hi[p] && lo[p] < row->until)
            return 1;
    return 0;
}

/* The offset for `need` bytes among the rows (sorted by start, ties in row order) that meet
 * the pieces: the lowest gap below a start over the highest end before it, or the tightest. */
static int64_t lowest_gap(const Row *rows, Py_ssize_t k, const int64_t *lo, const int64_t *hi,
                          Py_ssize_t p0, Py_ssize_t p1, int64_t need, int best_fit) {
    int64_t floor = 0, best = 0, best_gap = 0;
    int found = 0;
    for (Py_ssize_t r = 0; r < k; r++) {
        const Row *row = rows + r;
        if (!meets(row, lo, hi, p0, p1))
            continue;
        int64_t gap = row->start - floor;
        if (gap >= need) {
            if (!best_fit)
                return floor;
            if (!found || gap < best_gap) {
                best_gap = gap;
                best = floor;
                found = 1;
            }
        }
        if (row->end > floor)                     /* (ends are never negative) */
            floor = row->end;
    }
    return found ? best : floor;                  /* none fits: on top (0 for no rows) */
}

/* Put `row` among the k sorted rows, after those that start at or below it. */
static void insert(Row *rows, Py_ssize_t k, Row row) {
    Py_ssize_t low = 0, high = k;
    while (low < high) {
        Py_ssize_t middle = (low + high) / 2;
        if (rows[middle].start <= row.start)
            low = middle + 1;
        else
            high = middle;
    }
    memmove(rows + low + 1, rows + low, (size_t)(k - low) * sizeof(Row));
    rows[low] = row;
}

typedef struct {
    Py_buffer view;
    const int64_t *items;
    Py_ssize_t n;
} Int64s;

static int int64s(PyObject *object, Int64s *out, const char *what) {
    if (PyObject_GetBuffer(object, &out->view, PyBUF_SIMPLE) < 0)
        return -1;
    if (out->view.len % 8) {
        PyBuffer_Release(&out->view);
        PyErr_Format(PyExc_ValueError, "%s: int64 values expected", what);
        return -1;
    }
    out->items = out->view.buf;
    out->n = out->view.len / 8;
    return 0;
}

/* place(lo, hi, first, sizes, order, best_fit, held, seconds): offsets (int64 bytes, one per
 * buffer) or None once `seconds` have passed. Buffer i's pieces are lo/hi[first[i]:first[i+1]];
 * held is (start, end, from, until) rows, flat. */
static PyObject *place(PyObject *self, PyObject *args) {
    PyObject *lo_o, *hi_o, *first_o, *sizes_o, *order_o, *held_o;
    int best_fit;
    double seconds;
    if (!PyArg_ParseTuple(args, "OOOOOpOd", &lo_o, &hi_o, &first_o, &sizes_o, &order_o,
                          &best_fit, &held_o, &seconds))
        return NULL;
    Int64s lo, hi, first, sizes, order, held;
    Int64s *all[] = {&lo, &hi, &first, &sizes, &order, &held};
    PyObject *objects[] = {lo_o, hi_o, first_o, sizes_o, order_o, held_o};
    const char *names[] = {"lo", "hi", "first", "sizes", "order", "held"};
    int got = 0;
    for (; got < 6; got++)
        if (int64s(objects[got], all[got], names[got]) < 0)
            break;
    PyObject *result = NULL;
    Row *rows = NULL;
    int64_t *offsets = NULL;
    if (got < 6)
        goto done;
    Py_ssize_t n = sizes.n, pieces = lo.n, k = held.n / 4;
    if (first.n != n + 1 || hi.n != pieces || held.n % 4 || first.items[n] != pieces) {
        PyErr_SetString(PyExc_ValueError, "place: arrays of inconsistent lengths");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (first.items[i] < 0 || first.items[i] > first.items[i + 1]) {
            PyErr_SetString(PyExc_ValueError, "place: pieces out of order");
            goto done;
        }
    for (Py_ssize_t o = 0; o < order.n; o++)
        if (order.items[o] < 0 || order.items[o] >= n) {
            PyErr_Format(PyExc_ValueError, "place: order names buffer %lld of %zd",
                         (long long)order.items[o], n);
            goto done;
        }
    Py_ssize_t capacity = k + pieces;
    rows = PyMem_Malloc((size_t)(capacity ? capacity : 1) * sizeof(Row));
    offsets = PyMem_Calloc((size_t)(n ? n : 1), sizeof(int64_t));
    if (!rows || !offsets) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t count = 0;
    for (Py_ssize_t r = 0; r < k; r++) {
        Row row = {held.items[4 * r], held.items[4 * r + 1], held.items[4 * r + 2],
                   held.items[4 * r + 3]};
        insert(rows, count++, row);
    }
    double deadline = now() + seconds;
    int late = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t o = 0; o < order.n; o++) {
        if ((o & 63) == 0 && now() > deadline) {
            late = 1;
            break;
        }
        Py_ssize_t i = (Py_ssize_t)order.items[o];
        Py_ssize_t p0 = (Py_ssize_t)first.items[i], p1 = (Py_ssize_t)first.items[i + 1];
        int64_t need = sizes.items[i];
        int64_t offset = lowest_gap(rows, count, lo.items, hi.items, p0, p1, need, best_fit);
        offsets[i] = offset;
        for (Py_ssize_t p = p0; p < p1; p++) {
            Row row = {offset, offset + need, lo.items[p], hi.items[p]};
            insert(rows, count++, row);
        }
    }
    Py_END_ALLOW_THREADS
    result = late ? Py_NewRef(Py_None)
                  : PyBytes_FromStringAndSize((const char *)offsets, (Py_ssize_t)(n * 8));
done:
    for (int g = 0; g < got; g++)
        PyBuffer_Release(&all[g]->view);
    PyMem_Free(rows);
    PyMem_Free(offsets);
    return result;
}

static PyMethodDef methods[] = {
    {"place", place, METH_VARARGS, "place(lo, hi, first, sizes, order, best_fit, held, seconds): "
     "offsets as int64 bytes, or None past the time (see _placement.c)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_placement",
                                    "Greedy placement in a given order.", -1, methods};

PyMODINIT_FUNC PyInit__placement(void) { return PyModule_Create(&module); }
