/* npumem's caching pool in its default mode (expandable arenas, alloc/expandable.py), native,
 * for replays of a trace: a loop that plays allocs and frees through it and counts what the
 * pool's statistics would say (peak reserved, device calls, cache misses).
 *
 * The pool itself (caching_allocator.py, expandable.py, block.py) states the rules and serves
 * real programs; this file follows it for the one case a replay needs, where every stream is
 * idle and nothing waits on events: a request takes the lowest-addressed free block large
 * enough in its stream's arena (cut when the rest is at least split_min bytes); when its pages
 * are not all mapped, the pages no live block touches are unmapped in every arena first, then
 * the missing ones are mapped, within the budget. A freed block merges with free neighbours.
 * The Python pool stays the oracle of the differential tests (tests/test_pool_replay.py).
 *
 * Free blocks of an arena are a treap ordered by start, each node knowing the largest free
 * block below it, so first fit is one descent. Sizes are rounded by the pool's own rule: a
 * Python callable, asked once per distinct size.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define NONE (-1)
#define TOO_LARGE UINT64_MAX            /* a rounded size no arena can hold */

/* what `run` does with an entry's action code, and why it stopped */
enum { SKIP = 0, ALLOC = 1, FREE = 2 };
enum { DONE = 0, OUT_OF_MEMORY = 1, TOO_MANY_STREAMS = 2 };

typedef struct {
    uint64_t start, size;           /* bytes from the arena's base */
    uint64_t largest;               /* the largest free block in this treap subtree */
    uint64_t requested;             /* the request's bytes, while allocated */
    int32_t prev, next;             /* neighbours in address order (the free chain: next) */
    int32_t left, right;            /* children in the arena's treap of free blocks */
    uint32_t priority;
    int32_t arena;
    uint8_t allocated;
} Block;

typedef struct {
    uint64_t stream;
    int32_t root;                   /* treap of free blocks */
    int32_t first;                  /* the block at its start (never merged away) */
    uint8_t *mapped;                /* 1 per mapped page */
    uint64_t mapped_pages, mapped_end;     /* how many; no page at or above mapped_end is */
} Arena;

typedef struct { uint64_t key; int64_t value; } Slot;
typedef struct { Slot *slots; uint8_t *used; uint64_t mask, count; } Table;

typedef struct {
    PyObject_HEAD
    int shift;                      /* log2 of the page size */
    uint64_t arena_size, arena_pages, split_min, budget;
    int max_arenas;
    PyObject *rounding;             /* size -> the block size that serves it */
    Block *blocks; int32_t nblocks, capblocks, free_id;
    Arena *arenas; int narenas, last_arena;
    Table live;                     /* trace address -> block id */
    Table rounded;                  /* request size -> block size */
    uint32_t seed;
    int spent;                      /* a run stopped short: the state is not the pool's */
    /* what the pool's statistics and the replay count */
    uint64_t allocated, peak_allocated, reserved, peak_reserved;
    int64_t events, requests, misses, device_allocs, device_frees, unmatched;
} Core;

/* --- a hash of uint64 keys: linear probing, deletion by shifting back --------------------- */

static uint64_t mix(uint64_t key) {
    key ^= key >> 33; key *= 0xff51afd7ed558ccdULL; key ^= key >> 33;
    return key;
}

static int table_init(Table *t, uint64_t slots) {
    t->slots = PyMem_Calloc(slots, sizeof(Slot));
    t->used = PyMem_Calloc(slots, 1);
    t->mask = slots - 1; t->count = 0;
    if (!t->slots || !t->used) { PyErr_NoMemory(); return -1; }
    return 0;
}

static void table_free(Table *t) { PyMem_Free(t->slots); PyMem_Free(t->used); }

static uint64_t table_find(const Table *t, uint64_t key) {   /* its slot, or an empty one */
    uint64_t i = mix(key) & t->mask;
    while (t->used[i] && t->slots[i].key != key) i = (i + 1) & t->mask;
    return i;
}

static int table_put(Table *t, uint64_t key, int64_t value) {
    if ((t->count + 1) * 2 > t->mask + 1) {            /* keep it at most half full */
        Table bigger;
        if (table_init(&bigger, (t->mask + 1) * 2) < 0) return -1;
        for (uint64_t i = 0; i <= t->mask; i++)
            if (t->used[i]) {
                uint64_t j = table_find(&bigger, t->slots[i].key);
                bigger.used[j] = 1; bigger.slots[j] = t->slots[i]; bigger.count++;
            }
        table_free(t);
        *t = bigger;
    }
    uint64_t i = table_find(t, key);
    if (!t->used[i]) { t->used[i] = 1; t->count++; }
    t->slots[i].key = key; t->slots[i].value = value;
    return 0;
}

static void table_remove(Table *t, uint64_t i) {      /* i: a used slot */
    t->used[i] = 0; t->count--;
    uint64_t j = i;
    for (;;) {          /* move back each following entry whose home is not between i and j */
        j = (j + 1) & t->mask;
        if (!t->used[j]) return;
        uint64_t home = mix(t->slots[j].key) & t->mask;
        if (((j - home) & t->mask) >= ((j - i) & t->mask)) {
            t->slots[i] = t->slots[j]; t->used[i] = 1; t->used[j] = 0;
            i = j;
        }
    }
}

/* --- blocks and the treap of an arena's free blocks --------------------------------------- */

static int32_t new_block(Core *c, uint64_t start, uint64_t size, int32_t arena) {
    int32_t id = c->free_id;
    if (id != NONE) {
        c->free_id = c->blocks[id].next;
    } else {
        if (c->nblocks == c->capblocks) {
            if (c->capblocks >= INT32_MAX / 2) { PyErr_NoMemory(); return NONE; }
            int32_t cap = c->capblocks ? c->capblocks * 2 : 1024;
            Block *grown = PyMem_Realloc(c->blocks, (size_t)cap * sizeof(Block));
            if (!grown) { PyErr_NoMemory(); return NONE; }
            c->blocks = grown; c->capblocks = cap;
        }
        id = c->nblocks++;
    }
    c->seed = c->seed * 1664525u + 1013904223u;
    Block *b = &c->blocks[id];
    b->start = start; b->size = b->largest = size; b->requested = 0;
    b->prev = b->next = b->left = b->right = NONE;
    b->priority = c->seed; b->arena = arena; b->allocated = 0;
    return id;
}

static void drop_block(Core *c, int32_t id) {
    c->blocks[id].next = c->free_id;
    c->free_id = id;
}

static uint64_t largest(const Core *c, int32_t t) { return t == NONE ? 0 : c->blocks[t].largest; }

static void pull(Core *c, int32_t t) {
    Block *b = &c->blocks[t];
    uint64_t most = b->size, left = largest(c, b->left), right = largest(c, b->right);
    if (left > most) most = left;
    if (right > most) most = right;
    b->largest = most;
}

/* t's nodes before `start` to *low, the others to *high */
static void split_at(Core *c, int32_t t, uint64_t start, int32_t *low, int32_t *high) {
    if (t == NONE) { *low = *high = NONE; return; }
    Block *b = &c->blocks[t];
    if (b->start < start) {
        int32_t right = b->right;
        split_at(c, right, start, &b->right, high);
        *low = t;
    } else {
        int32_t left = b->left;
        split_at(c, left, start, low, &b->left);
        *high = t;
    }
    pull(c, t);
}

static int32_t join(Core *c, int32_t low, int32_t high) {
    if (low == NONE) return high;
    if (high == NONE) return low;
    if (c->blocks[low].priority > c->blocks[high].priority) {
        int32_t joined = join(c, c->blocks[low].right, high);
        c->blocks[low].right = joined;
        pull(c, low);
        return low;
    }
    int32_t joined = join(c, low, c->blocks[high].left);
    c->blocks[high].left = joined;
    pull(c, high);
    return high;
}

static int32_t treap_insert(Core *c, int32_t t, int32_t id) {
    Block *b = &c->blocks[id];
    if (t == NONE) { b->left = b->right = NONE; b->largest = b->size; return id; }
    Block *node = &c->blocks[t];
    if (b->priority > node->priority) {
        split_at(c, t, b->start, &b->left, &b->right);
        pull(c, id);
        return id;
    }
    if (b->start < node->start) {
        int32_t left = treap_insert(c, node->left, id);
        c->blocks[t].left = left;
    } else {
        int32_t right = treap_insert(c, node->right, id);
        c->blocks[t].right = right;
    }
    pull(c, t);
    return t;
}

static int32_t treap_remove(Core *c, int32_t t, uint64_t start) {
    Block *node = &c->blocks[t];
    if (node->start == start) return join(c, node->left, node->right);
    if (start < node->start) {
        int32_t left = treap_remove(c, node->left, start);
        c->blocks[t].left = left;
    } else {
        int32_t right = treap_remove(c, node->right, start);
        c->blocks[t].right = right;
    }
    pull(c, t);
    return t;
}

/* the lowest-addressed free block of at least `size` bytes, or NONE */
static int32_t first_fit(const Core *c, int32_t t, uint64_t size) {
    if (largest(c, t) < size) return NONE;
    for (;;) {
        const Block *b = &c->blocks[t];
        if (largest(c, b->left) >= size) t = b->left;
        else if (b->size >= size) return t;
        else t = b->right;           /* the subtree's largest is here: it fits */
    }
}

/* --- pages -------------------------------------------------------------------------------- */

/* Unmap the mapped pages wholly inside free blocks of the treap under t. */
static void unmap_idle_under(Core *c, Arena *a, int32_t t) {
    uint64_t page = (uint64_t)1 << c->shift;
    while (t != NONE && largest(c, t) >= page) {
        const Block *b = &c->blocks[t];
        unmap_idle_under(c, a, b->left);
        if (b->size >= page) {
            uint64_t first = (b->start + page - 1) >> c->shift;
            uint64_t end = (b->start + b->size) >> c->shift;
            if (end > a->mapped_end) end = a->mapped_end;
            while (first < end) {               /* each run of mapped pages: one unmap call */
                uint8_t *on = memchr(a->mapped + first, 1, end - first);
                if (!on) break;
                uint64_t from = (uint64_t)(on - a->mapped);
                uint8_t *off = memchr(on, 0, end - from);
                uint64_t to = off ? (uint64_t)(off - a->mapped) : end;
                memset(on, 0, to - from);
                a->mapped_pages -= to - from;
                c->reserved -= (to - from) << c->shift;
                c->device_frees++;
                first = to;
            }
        }
        t = b->right;
    }
}

static void unmap_idle(Core *c) {
    for (int i = 0; i < c->narenas; i++) {
        Arena *a = &c->arenas[i];
        if (a->mapped_pages) unmap_idle_under(c, a, a->root);
        if (!a->mapped_pages) a->mapped_end = 0;
    }
}

/* Map what is unmapped of pages [first, end) of `a`, after unmapping idle pages; 0 when the
 * budget does not allow it (nothing changed but the unmapping, as in the pool). */
static int map_pages(Core *c, Arena *a, uint64_t first, uint64_t end) {
    unmap_idle(c);
    uint64_t need = 0, runs = 0;
    for (uint64_t p = first; p < end; p++)
        if (!a->mapped[p]) { need++; runs += p == first || a->mapped[p - 1]; }
    if (c->reserved + (need << c->shift) > c->budget) return 0;
    memset(a->mapped + first, 1, end - first);
    a->mapped_pages += need;
    if (end > a->mapped_end) a->mapped_end = end;
    c->reserved += need << c->shift;
    if (c->reserved > c->peak_reserved) c->peak_reserved = c->reserved;
    c->device_allocs += (int64_t)runs;
    return 1;
}

/* --- the pool ----------------------------------------------------------------------------- */

static int arena_of(Core *c, uint64_t stream) {       /* its index; -1 with too many */
    if (c->last_arena >= 0 && c->arenas[c->last_arena].stream == stream) return c->last_arena;
    for (int i = 0; i < c->narenas; i++)
        if (c->arenas[i].stream == stream) return c->last_arena = i;
    if (c->narenas == c->max_arenas) return -1;
    Arena *a = &c->arenas[c->narenas];
    a->mapped = PyMem_Calloc(c->arena_pages, 1);
    if (!a->mapped) { PyErr_NoMemory(); return -2; }
    int32_t whole = new_block(c, 0, c->arena_size, c->narenas);
    if (whole == NONE) { PyMem_Free(a->mapped); return -2; }
    a->stream = stream; a->root = a->first = whole; a->mapped_pages = a->mapped_end = 0;
    return c->last_arena = c->narenas++;
}

static int rounded_size(Core *c, uint64_t nbytes, uint64_t *out) {
    uint64_t slot = table_find(&c->rounded, nbytes);
    if (c->rounded.used[slot]) { *out = (uint64_t)c->rounded.slots[slot].value; return 0; }
    PyObject *result = PyObject_CallFunction(c->rounding, "K", (unsigned long long)nbytes);
    if (!result) return -1;
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(result, &overflow);
    Py_DECREF(result);
    if (value == -1 && PyErr_Occurred()) return -1;
    *out = overflow || value <= 0 || (uint64_t)value > c->arena_size ? TOO_LARGE : (uint64_t)value;
    return table_put(&c->rounded, nbytes, (int64_t)*out);
}

/* the pool's allocate: 0 done, OUT_OF_MEMORY or TOO_MANY_STREAMS, -1 with an exception */
static int allocate(Core *c, uint64_t addr, uint64_t nbytes, uint64_t stream) {
    uint64_t size;
    if (rounded_size(c, nbytes, &size) < 0) return -1;
    int index = arena_of(c, stream);
    if (index == -2) return -1;
    if (index < 0) return TOO_MANY_STREAMS;
    if (size == TOO_LARGE) return OUT_OF_MEMORY;
    Arena *a = &c->arenas[index];
    int32_t id = first_fit(c, a->root, size);
    if (id == NONE) return OUT_OF_MEMORY;
    a->root = treap_remove(c, a->root, c->blocks[id].start);
    if (c->blocks[id].size - size >= c->split_min) {          /* the rest stays cached */
        Block *b = &c->blocks[id];
        int32_t rest = new_block(c, b->start + size, b->size - size, index);
        if (rest == NONE) return -1;
        b = &c->blocks[id];                                    /* (the array may have moved) */
        Block *r = &c->blocks[rest];
        r->prev = id; r->next = b->next;
        if (b->next != NONE) c->blocks[b->next].prev = rest;
        b->next = rest; b->size = size;
        a->root = treap_insert(c, a->root, rest);
    }
    Block *b = &c->blocks[id];
    uint64_t first = b->start >> c->shift, end = ((b->start + b->size - 1) >> c->shift) + 1;
    if (memchr(a->mapped + first, 0, end - first)) {          /* a cache miss */
        if (!map_pages(c, a, first, end)) return OUT_OF_MEMORY;
        c->misses++;
    }
    b->allocated = 1;
    b->requested = nbytes;
    c->requests++;
    c->allocated += nbytes;
    if (c->allocated > c->peak_allocated) c->peak_allocated = c->allocated;
    return table_put(&c->live, addr, id) < 0 ? -1 : 0;
}

/* the pool's deallocate of the block at live slot `slot`: merged with free neighbours */
static void deallocate(Core *c, uint64_t slot) {
    int32_t id = (int32_t)c->live.slots[slot].value;
    table_remove(&c->live, slot);
    Block *b = &c->blocks[id];
    Arena *a = &c->arenas[b->arena];
    c->allocated -= b->requested;
    b->allocated = 0;
    int32_t next = b->next;
    if (next != NONE && !c->blocks[next].allocated) {
        a->root = treap_remove(c, a->root, c->blocks[next].start);
        b->size += c->blocks[next].size;
        b->next = c->blocks[next].next;
        if (b->next != NONE) c->blocks[b->next].prev = id;
        drop_block(c, next);
    }
    int32_t prev = b->prev;
    if (prev != NONE && !c->blocks[prev].allocated) {
        Block *p = &c->blocks[prev];
        a->root = treap_remove(c, a->root, p->start);
        p->size += b->size;
        p->next = b->next;
        if (p->next != NONE) c->blocks[p->next].prev = prev;
        drop_block(c, id);
        id = prev;
    }
    a->root = treap_insert(c, a->root, id);
}

/* --- the Python face ---------------------------------------------------------------------- */

static PyObject *Core_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"page_shift", "arena_size", "split_min", "budget", "rounding",
                            "max_streams", NULL};
    int shift, max_arenas;
    unsigned long long arena_size, split_min, budget;
    PyObject *rounding;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iKKKOi", names, &shift, &arena_size, &split_min,
                                     &budget, &rounding, &max_arenas))
        return NULL;
    if (shift < 12 || shift > 40 || arena_size == 0 || arena_size >> 62 ||
            arena_size & (((uint64_t)1 << shift) - 1) || split_min == 0 || max_arenas < 1 ||
            max_arenas > 4096 || !PyCallable_Check(rounding)) {
        PyErr_SetString(PyExc_ValueError, "Core: page_shift 12..40, arena_size a positive "
                        "multiple of the page below 2**62, split_min > 0, max_streams 1..4096 "
                        "and a callable rounding");
        return NULL;
    }
    Core *c = (Core *)type->tp_alloc(type, 0);
    if (!c) return NULL;
    c->shift = shift; c->arena_size = arena_size; c->arena_pages = arena_size >> shift;
    c->split_min = split_min; c->budget = budget; c->max_arenas = max_arenas;
    Py_INCREF(rounding); c->rounding = rounding;
    c->free_id = NONE; c->last_arena = -1; c->seed = 0x9e3779b9u;
    c->arenas = PyMem_Calloc((size_t)max_arenas, sizeof(Arena));
    if (!c->arenas || table_init(&c->live, 1024) < 0 || table_init(&c->rounded, 64) < 0) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        Py_DECREF(c);
        return NULL;
    }
    return (PyObject *)c;
}

static void Core_dealloc(Core *c) {
    if (c->arenas)
        for (int i = 0; i < c->narenas; i++) PyMem_Free(c->arenas[i].mapped);
    PyMem_Free(c->arenas);
    PyMem_Free(c->blocks);
    table_free(&c->live);
    table_free(&c->rounded);
    Py_XDECREF(c->rounding);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static int column(Py_buffer *view, Py_ssize_t width, Py_ssize_t rows, const char *name) {
    if (view->len != width * rows) {
        PyErr_Format(PyExc_ValueError, "run: %s holds %zd bytes, not %zd", name, view->len,
                     width * rows);
        return -1;
    }
    return 0;
}

/* run(kinds, action, addr, size, stream) -> (why it stopped, the index it stopped at) */
static PyObject *Core_run(Core *c, PyObject *args) {
    Py_buffer kinds, action, addr, size, stream;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*", &kinds, &action, &addr, &size, &stream)) return NULL;
    Py_ssize_t rows = action.len, i = 0;
    int why = DONE;
    PyObject *out = NULL;
    if (c->spent) {
        PyErr_SetString(PyExc_RuntimeError, "run: an earlier run stopped short; replay from the "
                        "start with a new Core");
        goto done;
    }
    if (kinds.len != 256 || column(&addr, 8, rows, "addr") < 0 ||
            column(&size, 8, rows, "size") < 0 || column(&stream, 8, rows, "stream") < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "run: kinds has 256 entries");
        goto done;
    }
    const uint8_t *kind = kinds.buf, *act = action.buf;
    const uint64_t *addrs = addr.buf, *sizes = size.buf, *streams = stream.buf;
    for (; i < rows; i++) {
        if ((i & 0xffff) == 0 && PyErr_CheckSignals() < 0) { c->spent = 1; goto done; }
        uint8_t what = kind[act[i]];
        if (what == SKIP) continue;
        c->events++;
        uint64_t slot = table_find(&c->live, addrs[i]);
        if (what == FREE) {
            if (c->live.used[slot]) deallocate(c, slot);
            else c->unmatched++;          /* allocated before the recording started */
            continue;
        }
        if (c->live.used[slot]) deallocate(c, slot);   /* its free was not recorded */
        int status = allocate(c, addrs[i], sizes[i], streams[i]);
        if (status != DONE) {
            c->spent = 1;
            if (status < 0) goto done;
            why = status;
            break;
        }
    }
    out = Py_BuildValue("in", why, i);
done:
    PyBuffer_Release(&kinds); PyBuffer_Release(&action); PyBuffer_Release(&addr);
    PyBuffer_Release(&size); PyBuffer_Release(&stream);
    return out;
}

static PyObject *Core_counts(Core *c, PyObject *unused) {
    return Py_BuildValue("{sLsKsKsKsKsLsLsLsLsLsi}",
                         "events", (long long)c->events,
                         "allocated", (unsigned long long)c->allocated,
                         "peak_allocated", (unsigned long long)c->peak_allocated,
                         "reserved", (unsigned long long)c->reserved,
                         "peak_reserved", (unsigned long long)c->peak_reserved,
                         "requests", (long long)c->requests,
                         "cache_misses", (long long)c->misses,
                         "device_allocs", (long long)c->device_allocs,
                         "device_frees", (long long)c->device_frees,
                         "unmatched", (long long)c->unmatched,
                         "streams", c->narenas);
}

/* (start, size, allocated) of every block of the arena of `stream`, in address order */
static PyObject *Core_blocks(Core *c, PyObject *arg) {
    unsigned long long stream = PyLong_AsUnsignedLongLong(arg);
    if (stream == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    PyObject *out = PyList_New(0);
    for (int i = 0; out && i < c->narenas; i++) {
        if (c->arenas[i].stream != stream) continue;
        int32_t id = c->arenas[i].first;
        for (; id != NONE; id = c->blocks[id].next) {
            const Block *b = &c->blocks[id];
            PyObject *row = Py_BuildValue("KKO", (unsigned long long)b->start,
                                          (unsigned long long)b->size,
                                          b->allocated ? Py_True : Py_False);
            if (!row || PyList_Append(out, row) < 0) { Py_XDECREF(row); Py_CLEAR(out); break; }
            Py_DECREF(row);
        }
    }
    return out;
}

static PyMethodDef Core_methods[] = {
    {"run", (PyCFunction)Core_run, METH_VARARGS,
     "run(kinds, action, addr, size, stream): play the entries (kinds[action]: 0 skip, 1 "
     "alloc, 2 free); (why it stopped: 0 done, 1 out of memory, 2 too many streams, index)"},
    {"counts", (PyCFunction)Core_counts, METH_NOARGS, "what the replay counted"},
    {"blocks", (PyCFunction)Core_blocks, METH_O,
     "blocks(stream): (start, size, allocated) of its arena's blocks in address order"},
    {NULL}
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npumem.alloc._pool_replay.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The default pool (expandable arenas, every stream idle), for replays.",
    .tp_new = Core_new,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_methods = Core_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pool_replay",
    "npumem's default caching pool, native, for trace replays.", -1, NULL,
};

PyMODINIT_FUNC PyInit__pool_replay(void) {
    if (PyType_Ready(&CoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0) {
        Py_DECREF(&CoreType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "DONE", DONE);
    PyModule_AddIntConstant(m, "OUT_OF_MEMORY", OUT_OF_MEMORY);
    PyModule_AddIntConstant(m, "TOO_MANY_STREAMS", TOO_MANY_STREAMS);
    return m;
}
