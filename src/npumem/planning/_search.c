/* The planner's depth-first search for a placement within a fixed capacity, native.
 *
 * The same search as search.SkylineSearch.solve (the oracle of tests/test_search_native.py):
 * canonical placements (each buffer at the top of the highest placed buffer it overlaps, in
 * non-decreasing order of offset), candidates taken in key order (offset * n + rank), the
 * same section floors and totals, the same cuts into independent parts, the same feasibility
 * test, the same end of a level after a hatless buffer, so it visits the same nodes in the
 * same order, at C's speed instead of numpy's per
 * node. It runs without the GIL; `cancel` (a byte the caller may set from another thread)
 * and the deadline (time.perf_counter's clock) are checked every 64 nodes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define CANDIDATES 32           /* next candidates a level keeps: search.CANDIDATES */
#define LEVEL_BYTES 1024        /* C stack a level of recursion may take (about 500 today) */
#define NEVER INT64_MAX

enum { FAILED = 0, PLACED = 1, ABORTED = -1, NO_MEMORY = -2 };

typedef struct {
    int64_t value, length;
} Run;

typedef struct {
    Py_ssize_t buffer, runs;    /* the placed buffer; where its old floor's runs begin */
} Placement;

typedef struct {
    Py_ssize_t n, sections;
    const int64_t *first, *last, *size, *lower, *upper, *by_first, *starting;
    int64_t *rank;              /* a copy: re-ranked within each independent part */
    /* the tie-break order's keys, larger first, a letter at a time: NULL for T (the busiest
     * section a buffer spans, taken again from the current totals when a part splits off);
     * no letters: ranks stay as given */
    const int64_t *order_keys[8];
    int order_letters;
    Py_ssize_t *scratch;        /* a part's buffers while it is ranked */
    int64_t *busiest;           /* their T */
    Py_ssize_t *merge;          /* room for the merge sort */
    int64_t *saved_ranks;       /* (buffer, rank) pairs to restore, a stack */
    Py_ssize_t saved_size, saved_capacity;
    int dense;                  /* the stronger floor test (search.DENSE_LIMIT) */
    int64_t capacity, node_limit, nodes;
    double deadline;
    const volatile unsigned char *cancel;
    int64_t *floor, *total, *min_offset, *offsets, *bottom;
    unsigned char *unplaced;
    Placement *log;
    Py_ssize_t log_size, log_capacity;
    Run *runs;
    Py_ssize_t runs_size, runs_capacity;
    Py_ssize_t *edges;          /* a stack of the parts' bounds, by level */
    Py_ssize_t edges_size, edges_capacity;
    /* each level's next candidates and their keys, CANDIDATES a level: on the heap, so that a
     * level of recursion costs the C stack about a hundred bytes */
    Py_ssize_t *candidates;
    int64_t *keys;
    Py_ssize_t levels;
    Py_ssize_t deepest;         /* the levels this thread's stack holds: deeper is aborted */
} Search;

static int reserve(void **items, Py_ssize_t *capacity, Py_ssize_t need, size_t width) {
    if (need <= *capacity)
        return 0;
    Py_ssize_t grown = *capacity ? *capacity : 256;
    while (grown < need)
        grown *= 2;
    void *more = realloc(*items, (size_t)grown * width);
    if (!more)
        return -1;
    *items = more;
    *capacity = grown;
    return 0;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int overlaps(const Search *s, Py_ssize_t i, Py_ssize_t j) {
    return s->lower[j] < s->upper[i] && s->lower[i] < s->upper[j];
}

/* Place buffer `i`: how many unplaced buffers live beside it, -1 out of memory. */
static Py_ssize_t place(Search *s, Py_ssize_t i, int64_t offset) {
    int64_t top = offset + s->size[i];
    Py_ssize_t a = s->first[i], b = s->last[i];
    s->unplaced[i] = 0;
    s->offsets[i] = offset;
    if (reserve((void **)&s->log, &s->log_capacity, s->log_size + 1, sizeof(Placement)) < 0)
        return -1;
    s->log[s->log_size++] = (Placement){i, s->runs_size};
    for (Py_ssize_t k = a; k < b; k++) {        /* the old floor, as runs */
        if (k > a && s->floor[k] == s->runs[s->runs_size - 1].value) {
            s->runs[s->runs_size - 1].length++;
            continue;
        }
        if (reserve((void **)&s->runs, &s->runs_capacity, s->runs_size + 1, sizeof(Run)) < 0)
            return -1;
        s->runs[s->runs_size++] = (Run){s->floor[k], 1};
    }
    Py_ssize_t neighbours = 0;
    for (Py_ssize_t j = 0; j < s->n; j++) {
        if (!s->unplaced[j] || !overlaps(s, i, j))
            continue;
        neighbours++;
        if (s->min_offset[j] < top)
            s->min_offset[j] = top;
    }
    for (Py_ssize_t k = a; k < b; k++) {
        s->floor[k] = top;
        s->total[k] -= s->size[i];
    }
    return neighbours;
}

/* Undo placements back to `mark`. A neighbour's lowest offset is always the highest floor
 * over its sections, so those the placement raised are found again from the floor. */
static void rollback(Search *s, Py_ssize_t mark) {
    while (s->log_size > mark) {
        Placement p = s->log[--s->log_size];
        Py_ssize_t i = p.buffer, k = s->first[i];
        for (Py_ssize_t r = p.runs; r < s->runs_size; r++)
            for (int64_t c = 0; c < s->runs[r].length; c++)
                s->floor[k++] = s->runs[r].value;
        s->runs_size = p.runs;
        for (k = s->first[i]; k < s->last[i]; k++)
            s->total[k] += s->size[i];
        int64_t top = s->offsets[i] + s->size[i];
        for (Py_ssize_t j = 0; j < s->n; j++) {
            if (!s->unplaced[j] || !overlaps(s, i, j) || s->min_offset[j] != top)
                continue;
            int64_t highest = s->floor[s->first[j]];
            for (k = s->first[j] + 1; k < s->last[j]; k++)
                highest = s->floor[k] > highest ? s->floor[k] : highest;
            s->min_offset[j] = highest;
        }
        s->unplaced[i] = 1;
    }
}

/* Whether the unplaced buffers of each section in [low, high) can still stack under the
 * capacity; everything placed from now on sits at `offset` or higher. The part's unplaced
 * buffers are the only unplaced ones living there. */
static int feasible(Search *s, int64_t offset, Py_ssize_t low, Py_ssize_t high,
                    Py_ssize_t from, Py_ssize_t to) {
    int64_t *bottom = s->bottom;
    for (Py_ssize_t k = low; k < high; k++)
        bottom[k] = NEVER;
    int rest = 0;
    if (s->dense) {
        for (Py_ssize_t g = from; g < to; g++) {
            Py_ssize_t j = s->by_first[g];
            if (!s->unplaced[j])
                continue;
            rest = 1;
            Py_ssize_t a = s->first[j] > low ? s->first[j] : low;
            Py_ssize_t b = s->last[j] < high ? s->last[j] : high;
            for (Py_ssize_t k = a; k < b; k++)
                if (s->min_offset[j] < bottom[k])
                    bottom[k] = s->min_offset[j];
        }
    }
    for (Py_ssize_t k = low; k < high; k++) {
        int64_t floor = s->floor[k] > offset ? s->floor[k] : offset;
        int64_t lowest = rest && s->total[k] > 0 ? bottom[k] : 0;
        int64_t base = floor > lowest ? floor : lowest;
        if (base > s->capacity - s->total[k])
            return 0;
    }
    return 1;
}

static int solve_part(Search *s, Py_ssize_t start, Py_ssize_t stop, int64_t last_key,
                      Py_ssize_t depth);

/* Whether buffer scratch[a] comes before scratch[b] in the tie-break order (busiest[] holds
 * each one's T): larger keys first, letter by letter, then the lower index. */
static int ranked_before(const Search *s, Py_ssize_t a, Py_ssize_t b) {
    Py_ssize_t i = s->scratch[a], j = s->scratch[b];
    for (int l = 0; l < s->order_letters; l++) {
        int64_t x = s->order_keys[l] ? s->order_keys[l][i] : s->busiest[a];
        int64_t y = s->order_keys[l] ? s->order_keys[l][j] : s->busiest[b];
        if (x != y)
            return x > y;
    }
    return i < j;
}

/* A stable merge sort of positions [0, m) of scratch (by ranked_before), into `order`. */
static void sort_part(Search *s, Py_ssize_t *order, Py_ssize_t m) {
    for (Py_ssize_t k = 0; k < m; k++)
        order[k] = k;
    for (Py_ssize_t width = 1; width < m; width *= 2) {
        for (Py_ssize_t lo = 0; lo < m; lo += 2 * width) {
            Py_ssize_t mid = lo + width < m ? lo + width : m;
            Py_ssize_t hi = lo + 2 * width < m ? lo + 2 * width : m;
            Py_ssize_t a = lo, b = mid, out = lo;
            while (a < mid || b < hi)
                s->merge[out++] = b >= hi || (a < mid && !ranked_before(s, order[b], order[a]))
                                  ? order[a++] : order[b++];
            memcpy(order + lo, s->merge + lo, (size_t)(hi - lo) * sizeof(Py_ssize_t));
        }
    }
}

/* MiniMalloc's order within a part that split off: its unplaced buffers ranked again, T from
 * the current totals. The old ranks go on a stack; restore_ranks(mark) puts them back. */
static int rank_part(Search *s, Py_ssize_t start, Py_ssize_t stop) {
    Py_ssize_t m = 0;
    for (Py_ssize_t g = s->starting[start]; g < s->starting[stop]; g++) {
        Py_ssize_t j = s->by_first[g];
        if (!s->unplaced[j])
            continue;
        int64_t busiest = 0;
        for (Py_ssize_t k = s->first[j]; k < s->last[j]; k++)
            busiest = s->total[k] > busiest ? s->total[k] : busiest;
        s->scratch[m] = j;
        s->busiest[m++] = busiest;
    }
    Py_ssize_t *order = s->merge + s->n;          /* the second half of the merge room */
    sort_part(s, order, m);
    if (reserve((void **)&s->saved_ranks, &s->saved_capacity, s->saved_size + 2 * m,
                sizeof(int64_t)) < 0)
        return -1;
    for (Py_ssize_t k = 0; k < m; k++) {
        Py_ssize_t j = s->scratch[order[k]];
        s->saved_ranks[s->saved_size++] = j;
        s->saved_ranks[s->saved_size++] = s->rank[j];
        s->rank[j] = k;
    }
    return 0;
}

static void restore_ranks(Search *s, Py_ssize_t mark) {
    while (s->saved_size > mark) {
        int64_t rank = s->saved_ranks[--s->saved_size];
        s->rank[s->saved_ranks[--s->saved_size]] = rank;
    }
}

/* After a placement: the part's unplaced buffers cut where none spans the boundary, as
 * independent pieces, each solved in turn (a failure in one never sends the search back into
 * another); one piece is the part itself, solved on from `key`. */
static int solve_rest(Search *s, Py_ssize_t start, Py_ssize_t stop, int64_t key,
                      Py_ssize_t depth) {
    Py_ssize_t from = s->starting[start], to = s->starting[stop];
    Py_ssize_t base = s->edges_size;
    int64_t reach = -1;
    for (Py_ssize_t g = from; g < to; g++) {
        Py_ssize_t j = s->by_first[g];
        if (!s->unplaced[j])
            continue;
        if (reach >= 0 && s->first[j] >= reach) {
            if (reserve((void **)&s->edges, &s->edges_capacity, s->edges_size + 1,
                        sizeof(Py_ssize_t)) < 0)
                return NO_MEMORY;
            s->edges[s->edges_size++] = s->first[j];
        }
        reach = s->last[j] > reach ? s->last[j] : reach;
    }
    Py_ssize_t bounds = s->edges_size - base;
    if (bounds == 0)
        return solve_part(s, start, stop, key, depth);
    int result = PLACED;
    for (Py_ssize_t e = 0; e <= bounds && result == PLACED; e++) {
        Py_ssize_t low = e == 0 ? start : s->edges[base + e - 1];
        Py_ssize_t high = e == bounds ? stop : s->edges[base + e];
        Py_ssize_t mark = s->saved_size;
        if (s->order_letters && rank_part(s, low, high) < 0)
            return NO_MEMORY;
        result = solve_part(s, low, high, -1, depth);
        restore_ranks(s, mark);
    }
    s->edges_size = base;
    return result;
}

/* Place every buffer whose first section is in [start, stop) (one independent part); on
 * failure undo what it did. */
static int solve_part(Search *s, Py_ssize_t start, Py_ssize_t stop, int64_t last_key,
                      Py_ssize_t depth) {
    Py_ssize_t mark = s->log_size, from = s->starting[start], to = s->starting[stop];
    int64_t tried = last_key - 1, n = s->n;
    if (depth >= s->deepest)
        return ABORTED;         /* (a search a million buffers deep, on a small stack) */
    if (depth >= s->levels) {
        Py_ssize_t levels = s->levels;
        if (reserve((void **)&s->candidates, &levels, depth + 1,
                    CANDIDATES * sizeof(Py_ssize_t)) < 0 ||
            reserve((void **)&s->keys, &s->levels, depth + 1, CANDIDATES * sizeof(int64_t)) < 0)
            return NO_MEMORY;
    }
    Py_ssize_t base = depth * CANDIDATES;
    for (;;) {
        int64_t lowest_top = NEVER;
        Py_ssize_t low = -1, high = 0;
        for (Py_ssize_t g = from; g < to; g++) {
            Py_ssize_t j = s->by_first[g];
            if (!s->unplaced[j])
                continue;
            if (low < 0)
                low = s->first[j];
            high = s->last[j] > high ? s->last[j] : high;
            int64_t top = s->min_offset[j] + s->size[j];
            if (s->size[j] > 0)         /* a buffer of no bytes sits below nothing */
                lowest_top = top < lowest_top ? top : lowest_top;
        }
        if (low < 0)
            return PLACED;
        /* the next candidates in key order; skipping a buffer that could sit below the lowest
         * top would leave a useless gap */
        Py_ssize_t *candidates = s->candidates + base;
        int64_t *keys = s->keys + base;
        int count = 0;
        for (Py_ssize_t g = from; g < to; g++) {
            Py_ssize_t j = s->by_first[g];
            if (!s->unplaced[j])
                continue;
            int64_t offset = s->min_offset[j], key = offset * n + s->rank[j];
            if (key <= tried || offset >= lowest_top || offset + s->size[j] > s->capacity)
                continue;
            if (count == CANDIDATES && key >= keys[CANDIDATES - 1])
                continue;
            int at = count < CANDIDATES ? count++ : CANDIDATES - 1;
            while (at > 0 && keys[at - 1] > key) {
                keys[at] = keys[at - 1];
                candidates[at] = candidates[at - 1];
                at--;
            }
            keys[at] = key;
            candidates[at] = j;
        }
        if (count == 0)
            return FAILED;
        for (int c = 0; c < count; c++) {
            s->nodes++;
            if (s->nodes > s->node_limit ||
                ((s->nodes & 63) == 0 && (*s->cancel || now() > s->deadline)))
                return ABORTED;
            Py_ssize_t i = s->candidates[base + c];
            int64_t offset = s->min_offset[i], key = s->keys[base + c];
            Py_ssize_t neighbours = place(s, i, offset);
            if (neighbours < 0)
                return NO_MEMORY;
            if (feasible(s, offset, low, high, from, to)) {
                int result = solve_rest(s, start, stop, key, depth + 1);
                if (result != FAILED)
                    return result;
            }
            rollback(s, mark);
            if (neighbours == 0)        /* hatless: no other candidate does better */
                return FAILED;
            tried = key;
        }
    }
}

/* How many levels of recursion the calling thread's stack has room for (from here down). */
static Py_ssize_t stack_levels(void) {
    pthread_attr_t attributes;
    void *low;
    size_t size;
    char here;
    if (pthread_getattr_np(pthread_self(), &attributes) != 0)
        return 10000;
    int failed = pthread_attr_getstack(&attributes, &low, &size);
    pthread_attr_destroy(&attributes);
    if (failed || (char *)&here <= (char *)low)
        return 10000;
    size_t room = (size_t)((char *)&here - (char *)low);
    return room > (256 << 10) ? (Py_ssize_t)((room - (256 << 10)) / LEVEL_BYTES) : 0;
}

static int column(PyObject *object, Py_buffer *view, Py_ssize_t length, const char *name) {
    if (PyObject_GetBuffer(object, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    if (view->itemsize != 8 || view->len != 8 * length || !view->format ||
        (strcmp(view->format, "l") != 0 && strcmp(view->format, "q") != 0)) {
        PyErr_Format(PyExc_ValueError, "%s: %zd int64 values expected", name, length);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* solve(first, last, size, lower, upper, rank, by_first, starting, dense, capacity,
 *       node_limit, deadline, cancel, order=None) -> (status, offsets, nodes): status 1
 * placed (offsets: int64 bytes), 0 none within the capacity (proven), -1 the node limit, the
 * deadline or `cancel` (a writable byte) stopped it. Arrays as SkylineSearch holds them,
 * int64. `order`: the tie-break order's key arrays (None for T), to rank each part that
 * splits off again; None: `rank` throughout. */
static PyObject *solve(PyObject *module, PyObject *args) {
    PyObject *objects[8], *cancel_object, *order = Py_None;
    int dense;
    Search s;
    memset(&s, 0, sizeof s);
    if (!PyArg_ParseTuple(args, "OOOOOOOOpLLdO|O", &objects[0], &objects[1], &objects[2],
                          &objects[3], &objects[4], &objects[5], &objects[6], &objects[7],
                          &dense, &s.capacity, &s.node_limit, &s.deadline, &cancel_object,
                          &order))
        return NULL;
    static const char *names[8] = {"first", "last", "size", "lower", "upper", "rank",
                                   "by_first", "starting"};
    Py_buffer views[9 + 8];
    int held = 0;
    PyObject *result = NULL;
    s.n = PyObject_Length(objects[0]);
    if (s.n < 0)
        return NULL;
    for (; held < 8; held++) {
        Py_ssize_t length = held == 7 ? PyObject_Length(objects[7]) : s.n;
        if (length < 1 && held == 7) {
            PyErr_SetString(PyExc_ValueError, "starting: at least one value expected");
            goto release;
        }
        if (column(objects[held], &views[held], length, names[held]) < 0)
            goto release;
    }
    if (PyObject_GetBuffer(cancel_object, &views[8], PyBUF_WRITABLE) < 0)
        goto release;
    held++;
    if (views[8].len < 1) {
        PyErr_SetString(PyExc_ValueError, "cancel: a writable byte expected");
        goto release;
    }
    if (order != Py_None) {                   /* a tuple of key arrays, None for T */
        if (!PyTuple_Check(order) || PyTuple_GET_SIZE(order) > 8) {
            PyErr_SetString(PyExc_ValueError, "order: a tuple of at most 8 key arrays");
            goto release;
        }
        s.order_letters = (int)PyTuple_GET_SIZE(order);
        for (int l = 0; l < s.order_letters; l++) {
            PyObject *keys = PyTuple_GET_ITEM(order, l);
            if (keys == Py_None)
                continue;
            if (column(keys, &views[held], s.n, "order") < 0)
                goto release;
            s.order_keys[l] = views[held++].buf;
        }
    }
    s.first = views[0].buf;
    s.last = views[1].buf;
    s.size = views[2].buf;
    s.lower = views[3].buf;
    s.upper = views[4].buf;
    const int64_t *given_rank = views[5].buf;
    s.by_first = views[6].buf;
    s.starting = views[7].buf;
    s.sections = views[7].len / 8 - 1;
    s.cancel = views[8].buf;
    s.dense = dense;
    s.deepest = stack_levels();
    for (Py_ssize_t i = 0; i < s.n; i++)
        if (s.first[i] < 0 || s.last[i] > s.sections || s.first[i] >= s.last[i] ||
            s.by_first[i] < 0 || s.by_first[i] >= s.n || given_rank[i] < 0 ||
            given_rank[i] >= s.n) {
            PyErr_Format(PyExc_ValueError, "buffer %zd: sections or order out of range", i);
            goto release;
        }
    for (Py_ssize_t k = 0; k <= s.sections; k++)
        if (s.starting[k] < 0 || s.starting[k] > s.n) {
            PyErr_SetString(PyExc_ValueError, "starting: out of range");
            goto release;
        }
    PyObject *offsets = PyBytes_FromStringAndSize(NULL, 8 * s.n);
    if (!offsets)
        goto release;
    s.offsets = (int64_t *)PyBytes_AS_STRING(offsets);
    s.floor = calloc((size_t)s.sections + 1, 8);
    s.total = calloc((size_t)s.sections + 1, 8);
    s.bottom = calloc((size_t)s.sections + 1, 8);
    s.min_offset = calloc((size_t)s.n + 1, 8);
    s.unplaced = malloc((size_t)s.n + 1);
    s.rank = malloc(8 * ((size_t)s.n + 1));
    s.scratch = malloc(sizeof(Py_ssize_t) * ((size_t)s.n + 1));
    s.busiest = malloc(8 * ((size_t)s.n + 1));
    s.merge = malloc(sizeof(Py_ssize_t) * (2 * (size_t)s.n + 1));
    int status = NO_MEMORY;
    if (s.floor && s.total && s.bottom && s.min_offset && s.unplaced && s.rank && s.scratch &&
        s.busiest && s.merge) {
        memcpy(s.rank, given_rank, 8 * (size_t)s.n);
        memset(s.offsets, 0, 8 * (size_t)s.n);
        memset(s.unplaced, 1, (size_t)s.n);
        for (Py_ssize_t i = 0; i < s.n; i++)
            for (Py_ssize_t k = s.first[i]; k < s.last[i]; k++)
                s.total[k] += s.size[i];
        Py_BEGIN_ALLOW_THREADS
        status = solve_rest(&s, 0, s.sections, -1, 0);
        Py_END_ALLOW_THREADS
    }
    free(s.floor);
    free(s.total);
    free(s.bottom);
    free(s.min_offset);
    free(s.unplaced);
    free(s.log);
    free(s.runs);
    free(s.edges);
    free(s.candidates);
    free(s.keys);
    free(s.rank);
    free(s.scratch);
    free(s.busiest);
    free(s.merge);
    free(s.saved_ranks);
    if (status == NO_MEMORY) {
        Py_DECREF(offsets);
        PyErr_NoMemory();
        goto release;
    }
    result = Py_BuildValue("(iNL)", status, offsets, (long long)s.nodes);
release:
    while (held > 0)
        PyBuffer_Release(&views[--held]);
    return result;
}

static PyMethodDef methods[] = {
    {"solve", solve, METH_VARARGS,
     "solve(first, last, size, lower, upper, rank, by_first, starting, dense, capacity, "
     "node_limit, deadline, cancel, order=None) -> (status, offsets, nodes); see _search.c"},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_search",
                                    "The planner's search for a placement, native", -1, methods};

PyMODINIT_FUNC PyInit__search(void) {
    return PyModule_Create(&module);
}
