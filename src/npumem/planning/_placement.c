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

/* a row a buffer meets: where it is, and its number (ties in start keep row order) */
typedef struct {
    int64_t start, end;
    Py_ssize_t row;
} Taken;

static int by_start(const void *a, const void *b) {
    const Taken *x = a, *y = b;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    return (x->row > y->row) - (x->row < y->row);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The rows, in the order they were added (held, then each placed buffer's pieces), and an
 * index by time: the time they span is cut in BUCKETS, and a row is listed in each bucket its
 * [from, until] touches, unless it touches more than SPAN (then it is one of `longs`, which
 * every buffer meets the check of). A buffer's candidates are the rows of the buckets its
 * pieces touch: a short-lived buffer looks at the rows live near it, not at all of them. */
#define BUCKETS 256
#define SPAN 8

typedef struct {
    Py_ssize_t *items;
    Py_ssize_t size, capacity;
} List;

typedef struct {
    Row *rows;
    Py_ssize_t count;
    Py_ssize_t *sorted;              /* the rows' numbers by start (ties in row order) */
    int64_t t0, width;
    List lists[BUCKETS], longs;
    Py_ssize_t *stamp, visit;        /* the last buffer that looked at each row */
    Taken *taken;
} Rows;

static int list_add(List *list, Py_ssize_t item) {
    if (list->size == list->capacity) {
        Py_ssize_t grown = list->capacity ? 2 * list->capacity : 16;
        Py_ssize_t *more = PyMem_RawRealloc(list->items, (size_t)grown * sizeof(Py_ssize_t));
        if (!more)
            return -1;
        list->items = more;
        list->capacity = grown;
    }
    list->items[list->size++] = item;
    return 0;
}

static Py_ssize_t bucket_of(const Rows *r, int64_t t) {
    if (t <= r->t0)
        return 0;
    uint64_t b = ((uint64_t)t - (uint64_t)r->t0) / (uint64_t)r->width;
    return b >= BUCKETS ? BUCKETS - 1 : (Py_ssize_t)b;
}

static int add_row(Rows *r, Row row) {
    Py_ssize_t id = r->count;
    r->rows[r->count++] = row;
    Py_ssize_t low = 0, high = id;              /* after the rows that start at or below it */
    while (low < high) {
        Py_ssize_t middle = (low + high) / 2;
        if (r->rows[r->sorted[middle]].start <= row.start)
            low = middle + 1;
        else
            high = middle;
    }
    memmove(r->sorted + low + 1, r->sorted + low, (size_t)(id - low) * sizeof(Py_ssize_t));
    r->sorted[low] = id;
    Py_ssize_t b0 = bucket_of(r, row.from), b1 = bucket_of(r, row.until);
    if (b1 - b0 >= SPAN || row.until < row.from)   /* (one ending before it starts: checked
                                                       by every buffer, as the oracle does) */
        return list_add(&r->longs, id);
    for (Py_ssize_t b = b0; b <= b1; b++)
        if (list_add(&r->lists[b], id) < 0)
            return -1;
    return 0;
}

/* Whether the row is live during one of the pieces lo/hi[p0:p1] (the Python statement's
 * test: from < hi and lo < until). */
static int meets(const Row *row, const int64_t *lo, const int64_t *hi, Py_ssize_t p0,
                 Py_ssize_t p1) {
    for (Py_ssize_t p = p0; p < p1; p++)
        if (row->from < hi[p] && lo[p] < row->until)
            return 1;
    return 0;
}

/* The gap rule, one row met at a time in order of start: a gap is the row's start over the
 * highest end before it; the lowest that holds `need`, or with best fit the tightest; none
 * fits: on top (0 for no rows). */
typedef struct {
    int64_t need, floor, best, best_gap;
    int best_fit, found;
} Gap;

static int gap_step(Gap *g, int64_t start, int64_t end) {     /* 1: a first fit, done */
    int64_t gap = start - g->floor;
    if (gap >= g->need) {
        if (!g->best_fit)
            return 1;
        if (!g->found || gap < g->best_gap) {
            g->best_gap = gap;
            g->best = g->floor;
            g->found = 1;
        }
    }
    if (end > g->floor)                           /* (ends are never negative) */
        g->floor = end;
    return 0;
}

static int64_t gap_offset(const Gap *g, int first_fit) {
    return first_fit ? g->floor : g->found ? g->best : g->floor;
}

/* The offset for `need` bytes among the rows the pieces lo/hi[p0:p1] meet. Where the buckets
 * its pieces touch list few of the rows, a buffer takes theirs (a row live during a piece
 * shares a bucket with it: both touch the later of the two starts) and sorts them; else it
 * walks every row in order of start. */
static int64_t lowest_gap(Rows *r, const int64_t *lo, const int64_t *hi, Py_ssize_t p0,
                          Py_ssize_t p1, int64_t need, int best_fit) {
    Gap g = {need, 0, 0, 0, best_fit, 0};
    /* the rows the buckets would give, against all rows (sorting them costs more per row) */
    Py_ssize_t listed = r->longs.size;
    for (Py_ssize_t p = p0; p < p1 && listed < r->count; p++) {
        if (hi[p] < lo[p])                     /* a piece ending before it starts: all rows */
            listed = r->count;
        for (Py_ssize_t b = bucket_of(r, lo[p]); b <= bucket_of(r, hi[p]) && listed < r->count;
             b++)
            listed += r->lists[b].size;
    }
    if (listed * 16 >= r->count) {
        for (Py_ssize_t j = 0; j < r->count; j++) {
            const Row *row = r->rows + r->sorted[j];
            if (meets(row, lo, hi, p0, p1) && gap_step(&g, row->start, row->end))
                return gap_offset(&g, 1);
        }
        return gap_offset(&g, 0);
    }
    Py_ssize_t m = 0;
    r->visit++;
    for (Py_ssize_t p = p0; p < p1; p++)
        for (Py_ssize_t b = bucket_of(r, lo[p]); b <= bucket_of(r, hi[p]); b++)
            for (Py_ssize_t j = 0; j < r->lists[b].size; j++) {
                Py_ssize_t id = r->lists[b].items[j];
                if (r->stamp[id] != r->visit) {
                    r->stamp[id] = r->visit;
                    if (meets(r->rows + id, lo, hi, p0, p1))
                        r->taken[m++] = (Taken){r->rows[id].start, r->rows[id].end, id};
                }
            }
    for (Py_ssize_t j = 0; j < r->longs.size; j++) {
        Py_ssize_t id = r->longs.items[j];
        if (meets(r->rows + id, lo, hi, p0, p1))
            r->taken[m++] = (Taken){r->rows[id].start, r->rows[id].end, id};
    }
    qsort(r->taken, (size_t)m, sizeof(Taken), by_start);
    for (Py_ssize_t j = 0; j < m; j++)
        if (gap_step(&g, r->taken[j].start, r->taken[j].end))
            return gap_offset(&g, 1);
    return gap_offset(&g, 0);
}

static void rows_clear(Rows *r) {
    for (int b = 0; b < BUCKETS; b++)
        PyMem_RawFree(r->lists[b].items);
    PyMem_RawFree(r->longs.items);
    PyMem_RawFree(r->rows);
    PyMem_RawFree(r->sorted);
    PyMem_RawFree(r->stamp);
    PyMem_RawFree(r->taken);
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
    int64_t *offsets = NULL;
    char *seen = NULL;
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
    if (order.n > n) {
        PyErr_Format(PyExc_ValueError, "place: an order of %zd for %zd buffers", order.n, n);
        goto done;
    }
    /* each buffer at most once: the rows are counted for that */
    seen = PyMem_Calloc((size_t)(n ? n : 1), 1);
    if (!seen) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t o = 0; o < order.n; o++) {
        int64_t i = order.items[o];
        if (i < 0 || i >= n || seen[i]) {
            PyErr_Format(PyExc_ValueError, "place: order names buffer %lld %s", (long long)i,
                         i < 0 || i >= n ? "that is not one" : "twice");
            goto done;
        }
        seen[i] = 1;
    }
    Py_ssize_t capacity = (k + pieces) ? k + pieces : 1;
    Rows r;
    memset(&r, 0, sizeof r);
    r.rows = PyMem_RawMalloc((size_t)capacity * sizeof(Row));
    r.sorted = PyMem_RawMalloc((size_t)capacity * sizeof(Py_ssize_t));
    r.stamp = PyMem_RawCalloc((size_t)capacity, sizeof(Py_ssize_t));
    r.taken = PyMem_RawMalloc((size_t)capacity * sizeof(Taken));
    offsets = PyMem_Calloc((size_t)(n ? n : 1), sizeof(int64_t));
    int failed = !r.rows || !r.sorted || !r.stamp || !r.taken || !offsets;
    /* the time the rows span, cut in BUCKETS */
    int64_t t0 = INT64_MAX, t1 = INT64_MIN;
    for (Py_ssize_t p = 0; p < pieces; p++) {
        t0 = lo.items[p] < t0 ? lo.items[p] : t0;
        t1 = hi.items[p] > t1 ? hi.items[p] : t1;
    }
    for (Py_ssize_t row = 0; row < k; row++) {
        t0 = held.items[4 * row + 2] < t0 ? held.items[4 * row + 2] : t0;
        t1 = held.items[4 * row + 3] > t1 ? held.items[4 * row + 3] : t1;
    }
    r.t0 = t0;
    r.width = t1 > t0 ? (int64_t)(((uint64_t)t1 - (uint64_t)t0) / BUCKETS + 1) : 1;
    for (Py_ssize_t row = 0; row < k && !failed; row++) {
        Row held_row = {held.items[4 * row], held.items[4 * row + 1], held.items[4 * row + 2],
                        held.items[4 * row + 3]};
        failed = add_row(&r, held_row) < 0;
    }
    if (failed) {
        rows_clear(&r);
        PyErr_NoMemory();
        goto done;
    }
    double deadline = now() + seconds;
    int late = 0, interrupted = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t o = 0; o < order.n && !failed; o++) {
        if ((o & 63) == 0 && now() > deadline) {
            late = 1;
            break;
        }
        if ((o & 4095) == 4095) {     /* Ctrl-C ends a long pass now, not when it is done */
            Py_BLOCK_THREADS
            interrupted = PyErr_CheckSignals() < 0;
            Py_UNBLOCK_THREADS
            if (interrupted)
                break;
        }
        Py_ssize_t i = (Py_ssize_t)order.items[o];
        Py_ssize_t p0 = (Py_ssize_t)first.items[i], p1 = (Py_ssize_t)first.items[i + 1];
        int64_t need = sizes.items[i];
        int64_t offset = lowest_gap(&r, lo.items, hi.items, p0, p1, need, best_fit);
        offsets[i] = offset;
        for (Py_ssize_t p = p0; p < p1 && !failed; p++) {
            Row row = {offset, offset + need, lo.items[p], hi.items[p]};
            failed = add_row(&r, row) < 0;
        }
    }
    Py_END_ALLOW_THREADS
    rows_clear(&r);
    if (interrupted)                  /* (the signal handler's exception is set) */
        goto done;
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    result = late ? Py_NewRef(Py_None)
                  : PyBytes_FromStringAndSize((const char *)offsets, (Py_ssize_t)(n * 8));
done:
    for (int g = 0; g < got; g++)
        PyBuffer_Release(&all[g]->view);
    PyMem_Free(offsets);
    PyMem_Free(seen);
    return result;
}

static PyMethodDef methods[] = {
    {"place", place, METH_VARARGS, "place(lo, hi, first, sizes, order, best_fit, held, seconds): "
     "offsets as int64 bytes, or None past the time (see _placement.c)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_placement",
                                    "Greedy placement in a given order.", -1, methods};

PyMODINIT_FUNC PyInit__placement(void) { return PyModule_Create(&module); }
