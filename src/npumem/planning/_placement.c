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

/* The pages a placement touches so far (the held rows' and the placed buffers' bytes, pages
 * of `page` bytes): disjoint intervals of page numbers in order, and how many pages they hold.
 * Bytes [start, end) touch pages floor(start / page) to floor((end - 1) / page) (none when
 * that is empty), as step_plan._pages counts them. */
typedef struct {
    int64_t *low, *high;
    Py_ssize_t n, capacity;
    uint64_t count;
    int64_t page;
} Pages;

static int64_t floor_div(int64_t a, int64_t b) {            /* b > 0 */
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

static int pages_add(Pages *s, int64_t start, int64_t end) {
    if (end == INT64_MIN)
        return 0;
    int64_t first = floor_div(start, s->page), last = floor_div(end - 1, s->page);
    if (last < first)
        return 0;
    Py_ssize_t i = 0, j, n = s->n, high = n;       /* i: the first interval not below it */
    while (i < high) {
        Py_ssize_t middle = (i + high) / 2;
        if (s->high[middle] < first)
            i = middle + 1;
        else
            high = middle;
    }
    for (j = i; j < n && s->low[j] <= last; j++) {   /* the intervals it overlaps merge in */
        s->count -= (uint64_t)s->high[j] - (uint64_t)s->low[j] + 1;
        if (s->low[j] < first)
            first = s->low[j];
        if (s->high[j] > last)
            last = s->high[j];
    }
    s->count += (uint64_t)last - (uint64_t)first + 1;
    if (j == i) {                                   /* a new interval at i */
        if (n == s->capacity) {
            Py_ssize_t grown = s->capacity ? 2 * s->capacity : 16;
            int64_t *low = PyMem_RawRealloc(s->low, (size_t)grown * sizeof(int64_t));
            if (!low)
                return -1;
            s->low = low;
            int64_t *high = PyMem_RawRealloc(s->high, (size_t)grown * sizeof(int64_t));
            if (!high)
                return -1;
            s->high = high;
            s->capacity = grown;
        }
        memmove(s->low + i + 1, s->low + i, (size_t)(n - i) * sizeof(int64_t));
        memmove(s->high + i + 1, s->high + i, (size_t)(n - i) * sizeof(int64_t));
        s->n++;
    } else {                                        /* intervals i..j-1 become one */
        memmove(s->low + i + 1, s->low + j, (size_t)(n - j) * sizeof(int64_t));
        memmove(s->high + i + 1, s->high + j, (size_t)(n - j) * sizeof(int64_t));
        s->n -= j - i - 1;
    }
    s->low[i] = first;
    s->high[i] = last;
    return 0;
}

/* A placement to beat: one whose pages touched (when counted) and then height are, in that
 * order, lower. A placement stops as soon as what it has placed reaches them: pages and height
 * only grow, so it could no longer be lower. */
typedef struct {
    int on, by_pages;
    uint64_t pages;
    int64_t height;
} Beat;

static int beaten(const Beat *b, const Pages *s, int64_t height) {
    if (!b->on)
        return 0;
    if (b->by_pages && s->count != b->pages)
        return s->count > b->pages;
    return height >= b->height;
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

/* place(lo, hi, first, sizes, order, best_fit, held, seconds[, beat]): offsets (int64 bytes,
 * one per buffer), None once `seconds` have passed, or False once it cannot beat `beat`:
 * (pages or -1 for height alone, height, page bytes, height before: the top of buffers placed
 * outside the order). Buffer i's pieces are lo/hi[first[i]:first[i+1]]; held is
 * (start, end, from, until) rows, flat. */
static PyObject *place(PyObject *self, PyObject *args) {
    PyObject *lo_o, *hi_o, *first_o, *sizes_o, *order_o, *held_o, *beat_o = Py_None;
    int best_fit;
    double seconds;
    if (!PyArg_ParseTuple(args, "OOOOOpOd|O", &lo_o, &hi_o, &first_o, &sizes_o, &order_o,
                          &best_fit, &held_o, &seconds, &beat_o))
        return NULL;
    Beat beat = {0, 0, 0, 0};
    long long beat_pages = -1, beat_height = 0, page = 1, height = 0;
    if (beat_o != Py_None) {
        if (!PyArg_ParseTuple(beat_o, "LLLL;place: beat is (pages, height, page, height before)",
                              &beat_pages, &beat_height, &page, &height))
            return NULL;
        if (page < 1) {
            PyErr_Format(PyExc_ValueError, "place: a page of %lld bytes", page);
            return NULL;
        }
        beat = (Beat){1, beat_pages >= 0, (uint64_t)(beat_pages >= 0 ? beat_pages : 0),
                      beat_height};
    }
    Pages touched = {NULL, NULL, 0, 0, 0, page};
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
        PyErr_Format(PyExc_ValueError, "place: the order must name each of %zd buffers at most "
                     "once; it names %zd", n, order.n);
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
            PyErr_Format(PyExc_ValueError, "place: the order must name each of %zd buffers at "
                         "most once; it names buffer %lld %s", n, (long long)i,
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
        failed = add_row(&r, held_row) < 0 ||
                 (beat.by_pages && pages_add(&touched, held_row.start, held_row.end) < 0);
    }
    if (failed) {
        rows_clear(&r);
        PyMem_RawFree(touched.low);
        PyMem_RawFree(touched.high);
        PyErr_NoMemory();
        goto done;
    }
    double deadline = now() + seconds;
    int late = 0, interrupted = 0, worse = beaten(&beat, &touched, height);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t o = 0; o < order.n && !failed && !worse; o++) {
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
        if (beat.on && !failed) {
            if (offset + need > height)
                height = offset + need;
            failed = beat.by_pages && pages_add(&touched, offset, offset + need) < 0;
            worse = beaten(&beat, &touched, height);
        }
    }
    Py_END_ALLOW_THREADS
    rows_clear(&r);
    PyMem_RawFree(touched.low);
    PyMem_RawFree(touched.high);
    if (interrupted)                  /* (the signal handler's exception is set) */
        goto done;
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    result = late ? Py_NewRef(Py_None) : worse ? Py_NewRef(Py_False)
                  : PyBytes_FromStringAndSize((const char *)offsets, (Py_ssize_t)(n * 8));
done:
    for (int g = 0; g < got; g++)
        PyBuffer_Release(&all[g]->view);
    PyMem_Free(offsets);
    PyMem_Free(seen);
    return result;
}

static PyMethodDef methods[] = {
    {"place", place, METH_VARARGS, "place(lo, hi, first, sizes, order, best_fit, held, seconds[, beat]): "
     "offsets as int64 bytes, None past the time, False once it cannot beat `beat` (see "
     "_placement.c)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_placement",
                                    "Greedy placement in a given order.", -1, methods};

PyMODINIT_FUNC PyInit__placement(void) { return PyModule_Create(&module); }
