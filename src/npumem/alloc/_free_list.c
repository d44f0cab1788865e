/* The caching pool's index of free blocks (block.py's FreeList), in C.
 *
 * Free blocks ordered by (size, start): best fit is a lower bound, ties going to the lowest
 * address; first fit (the lowest address among the blocks large enough) is that lower bound and
 * a min over their starts. A block that grows by a merge or shrinks by a split is re-keyed where
 * it stands when the order allows, which is the common case, instead of being removed and
 * inserted again: this runs on every allocate and free.
 *
 * Why C: the take on allocate and the merge on free were 40% of the bytecodes of a cache-hit
 * allocate+free through the public API, the largest part of its cost over torch.empty. The
 * blocks stay block.py's Python objects (the pools, reports and the predictive arenas walk
 * them); this file reads and writes their __slots__ directly, at the offsets their member
 * descriptors give (checked when block.py binds the class: `bind(Block)`). The list holds a
 * strong reference to each of its blocks and to the spare one.
 *
 * tests/free_list_oracle.py keeps the former Python FreeList as the oracle of the differential
 * tests (tests/test_free_list.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

/* the Block class and where its slots lie */
static PyTypeObject *block_type = NULL;
static Py_ssize_t START, SIZE, PREV, NEXT, SEGMENT, ALLOCATED;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n, cap;
    uint64_t *sizes, *starts;       /* the keys, in (size, start) order */
    PyObject **blocks;              /* owned */
    /* A free block absorbed by a merge, kept for reuse as the rest of the next split: a
     * cache-hit pair cuts a rest from a free block and merges it back, and making and dropping
     * a Block object each time was a tenth of the pair. It keeps nothing of its old chain. A
 * take makes one first when there is none (see FreeList_take). */
    PyObject *spare;
    Py_ssize_t cut;                 /* the slot of the last split's rest: where its merge looks */
} FreeList;

/* --- a block's slots ------------------------------------------------------------------------ */

#define SLOT(b, off) (*(PyObject **)((char *)(b) + (off)))

static int is_block(PyObject *b) {
    if (!PyObject_TypeCheck(b, block_type)) {
        PyErr_Format(PyExc_TypeError, "FreeList: expected a Block, got %.80s", Py_TYPE(b)->tp_name);
        return 0;
    }
    return 1;
}

static int get_u64(PyObject *b, Py_ssize_t off, const char *name, uint64_t *out) {
    PyObject *v = SLOT(b, off);
    if (!v) {
        PyErr_Format(PyExc_AttributeError, "FreeList: a block without %s", name);
        return -1;
    }
    *out = PyLong_AsUnsignedLongLong(v);
    return *out == (uint64_t)-1 && PyErr_Occurred() ? -1 : 0;
}

static void set_obj(PyObject *b, Py_ssize_t off, PyObject *v) {     /* v: borrowed */
    PyObject *old = SLOT(b, off);
    Py_XINCREF(v);
    SLOT(b, off) = v;
    Py_XDECREF(old);
}

static int set_u64(PyObject *b, Py_ssize_t off, uint64_t x) {
    PyObject *v = PyLong_FromUnsignedLongLong(x);
    if (!v) return -1;
    PyObject *old = SLOT(b, off);
    SLOT(b, off) = v;
    Py_XDECREF(old);
    return 0;
}

/* a block's neighbour (NULL for None); borrowed */
static PyObject *neighbour(PyObject *b, Py_ssize_t off) {
    PyObject *v = SLOT(b, off);
    return v == NULL || v == Py_None ? NULL : v;
}

static int is_allocated(PyObject *b) {       /* a bool; anything else counts as allocated */
    PyObject *v = SLOT(b, ALLOCATED);
    return v != Py_False;
}

static int key(PyObject *b, uint64_t *size, uint64_t *start) {
    return get_u64(b, SIZE, "size", size) < 0 || get_u64(b, START, "start", start) < 0 ? -1 : 0;
}

/* --- the ordered arrays --------------------------------------------------------------------- */

static int less(uint64_t size_a, uint64_t start_a, uint64_t size_b, uint64_t start_b) {
    return size_a < size_b || (size_a == size_b && start_a < start_b);
}

/* the first slot whose key is not below (size, start) */
static Py_ssize_t lower_bound(const FreeList *f, uint64_t size, uint64_t start) {
    Py_ssize_t lo = 0, hi = f->n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (less(f->sizes[mid], f->starts[mid], size, start)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static int insert_at(FreeList *f, Py_ssize_t i, uint64_t size, uint64_t start, PyObject *block) {
    if (f->n == f->cap) {
        Py_ssize_t cap = f->cap ? f->cap * 2 : 8;
        uint64_t *sizes = PyMem_Realloc(f->sizes, (size_t)cap * sizeof(uint64_t));
        if (sizes) f->sizes = sizes;
        uint64_t *starts = sizes ? PyMem_Realloc(f->starts, (size_t)cap * sizeof(uint64_t)) : NULL;
        if (starts) f->starts = starts;
        PyObject **blocks = starts ? PyMem_Realloc(f->blocks, (size_t)cap * sizeof(PyObject *))
                                   : NULL;
        if (!blocks) { PyErr_NoMemory(); return -1; }
        f->blocks = blocks;
        f->cap = cap;
    }
    Py_ssize_t after = f->n - i;
    memmove(f->sizes + i + 1, f->sizes + i, (size_t)after * sizeof(uint64_t));
    memmove(f->starts + i + 1, f->starts + i, (size_t)after * sizeof(uint64_t));
    memmove(f->blocks + i + 1, f->blocks + i, (size_t)after * sizeof(PyObject *));
    f->sizes[i] = size;
    f->starts[i] = start;
    Py_INCREF(block);
    f->blocks[i] = block;
    f->n++;
    return 0;
}

static PyObject *pop_at(FreeList *f, Py_ssize_t i) {       /* the list's reference, handed over */
    PyObject *block = f->blocks[i];
    Py_ssize_t after = f->n - i - 1;
    memmove(f->sizes + i, f->sizes + i + 1, (size_t)after * sizeof(uint64_t));
    memmove(f->starts + i, f->starts + i + 1, (size_t)after * sizeof(uint64_t));
    memmove(f->blocks + i, f->blocks + i + 1, (size_t)after * sizeof(PyObject *));
    f->n--;
    return block;
}

static void set_at(FreeList *f, Py_ssize_t i, uint64_t size, uint64_t start, PyObject *block) {
    f->sizes[i] = size;
    f->starts[i] = start;
    if (f->blocks[i] != block) {
        PyObject *old = f->blocks[i];
        Py_INCREF(block);
        f->blocks[i] = block;
        Py_DECREF(old);
    }
}

static int add(FreeList *f, PyObject *block) {
    uint64_t size, start;
    if (key(block, &size, &start) < 0) return -1;
    return insert_at(f, lower_bound(f, size, start), size, start, block);
}

/* the slot of a listed block, by its key */
static Py_ssize_t index_of(FreeList *f, PyObject *block) {
    uint64_t size, start;
    if (key(block, &size, &start) < 0) return -1;
    Py_ssize_t i = lower_bound(f, size, start);
    if (i == f->n || f->blocks[i] != block) {
        PyErr_SetString(PyExc_KeyError, "FreeList: the block is not in the list");
        return -1;
    }
    return i;
}

/* Put `block` (its size just changed) in slot i, which held a key near its own. */
static int rekey(FreeList *f, Py_ssize_t i, PyObject *block) {
    uint64_t size, start;
    if (key(block, &size, &start) < 0) return -1;
    if ((i == 0 || less(f->sizes[i - 1], f->starts[i - 1], size, start)) &&
            (i + 1 == f->n || less(size, start, f->sizes[i + 1], f->starts[i + 1]))) {
        set_at(f, i, size, start, block);
        return 0;
    }
    PyObject *old = pop_at(f, i);
    int err = insert_at(f, lower_bound(f, size, start), size, start, block);
    Py_DECREF(old);
    return err;
}

/* Merge the following (free) block into `block` (Block.absorb_next). */
static int absorb_next(PyObject *block) {
    PyObject *following = neighbour(block, NEXT);
    uint64_t size, more;
    if (!following || get_u64(block, SIZE, "size", &size) < 0 ||
            get_u64(following, SIZE, "size", &more) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "FreeList: nothing to absorb");
        return -1;
    }
    if (set_u64(block, SIZE, size + more) < 0) return -1;
    Py_INCREF(following);                       /* while its links move */
    PyObject *after = neighbour(following, NEXT);
    set_obj(block, NEXT, after ? after : Py_None);
    if (after) set_obj(after, PREV, block);
    Py_DECREF(following);
    return 0;
}

/* --- the fits ------------------------------------------------------------------------------- */

/* The slot take would use, -1 for none, -2 on error. */
static Py_ssize_t fit_slot(FreeList *f, uint64_t size, PyObject *below, int first_fit) {
    Py_ssize_t i = lower_bound(f, size, 0);
    if (i == f->n) return -1;
    if (first_fit) {
        for (Py_ssize_t j = i + 1; j < f->n; j++)
            if (f->starts[j] < f->starts[i]) i = j;
    }
    if (below != Py_None) {
        uint64_t limit = PyLong_AsUnsignedLongLong(below);
        if (limit == (uint64_t)-1 && PyErr_Occurred()) return -2;
        if (f->sizes[i] >= limit) return -1;
    }
    return i;
}

/* A size past 64 bits (a hostile trace's) is one no block has: read as the largest, so that
 * nothing fits, as in the Python statement, rather than raising OverflowError. */
static int size_arg_u64(PyObject *size_arg, uint64_t *size) {
    *size = PyLong_AsUnsignedLongLong(size_arg);
    if (*size == (uint64_t)-1 && PyErr_Occurred()) {
        int overflow = 0;
        if (!PyErr_ExceptionMatches(PyExc_OverflowError) || !PyLong_Check(size_arg))
            return -1;
        PyErr_Clear();
        PyLong_AsLongLongAndOverflow(size_arg, &overflow);    /* its sign, without raising */
        if (overflow <= 0) {
            PyErr_SetString(PyExc_OverflowError, "a negative size");
            return -1;
        }
        *size = UINT64_MAX;
    }
    return 0;
}

static int fit_args(PyObject *size_arg, PyObject *first_arg, uint64_t *size, int *first_fit) {
    if (size_arg_u64(size_arg, size) < 0) return -1;
    *first_fit = PyObject_IsTrue(first_arg);
    return *first_fit < 0 ? -1 : 0;
}

/* Vectorcall arguments by position or name into values[] (borrowed; defaults preset), the
 * first `required` of them required: take runs on every allocate, and building an argument
 * tuple and parsing it by format cost more than the rest of the call. */
static int arguments(const char *fn, const char *const *names, int count, int required,
                     PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                     PyObject **values) {
    if (nargs > count) {
        PyErr_Format(PyExc_TypeError, "%s takes at most %d arguments", fn, count);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) values[i] = args[i];
    Py_ssize_t named = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < named; k++) {
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, k));
        if (!name) return -1;
        int j = 0;
        while (j < count && strcmp(name, names[j])) j++;
        if (j == count || j < nargs) {
            PyErr_Format(PyExc_TypeError, j == count ? "%s: no argument named %s"
                         : "%s: %s given twice", fn, name);
            return -1;
        }
        values[j] = args[nargs + k];
    }
    for (int j = 0; j < required; j++)
        if (values[j] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s: missing argument %s", fn, names[j]);
            return -1;
        }
    return 0;
}

/* take(size, split_min, below=None, first_fit=False): remove and return the best fit for
 * `size` bytes (or with first_fit the lowest-addressed block large enough), cut to `size`
 * when the rest is at least split_min bytes (the rest stays listed); None when none fits or
 * the fit is `below` bytes or more. */
static PyObject *FreeList_take(FreeList *f, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames) {
    static const char *names[] = {"size", "split_min", "below", "first_fit"};
    PyObject *values[4] = {NULL, NULL, Py_None, Py_False};
    uint64_t size, split_min;
    int first_fit;
    if (arguments("take", names, 4, 2, args, nargs, kwnames, values) < 0 ||
            fit_args(values[0], values[3], &size, &first_fit) < 0)
        return NULL;
    PyObject *below = values[2];
    split_min = PyLong_AsUnsignedLongLong(values[1]);
    if (split_min == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    if (f->spare == NULL) {
        /* the object a split's rest will be, made before the list is read: making an object
         * may run the garbage collector, and a finalizer it runs may free into this list */
        PyObject *made = PyObject_CallFunction((PyObject *)block_type, "iiO", 0, 0, Py_None);
        if (!made) return NULL;
        if (!is_block(made)) { Py_DECREF(made); return NULL; }
        if (f->spare == NULL) f->spare = made;
        else Py_DECREF(made);
    }
    Py_ssize_t i = fit_slot(f, size, below, first_fit);
    if (i == -2) return NULL;
    if (i == -1) Py_RETURN_NONE;
    PyObject *block = f->blocks[i];
    uint64_t whole = f->sizes[i], start = f->starts[i] + size, rest_size = whole - size;
    if (rest_size < split_min) return pop_at(f, i);
    PyObject *following = neighbour(block, NEXT), *segment = SLOT(block, SEGMENT);
    PyObject *rest = f->spare;     /* what the last merge let go, or the one made above */
    f->spare = NULL;
    if (set_u64(rest, START, start) < 0 || set_u64(rest, SIZE, rest_size) < 0) {
        Py_DECREF(rest);
        return NULL;
    }
    set_obj(rest, SEGMENT, segment ? segment : Py_None);
    set_obj(rest, PREV, block);
    set_obj(rest, NEXT, following ? following : Py_None);
    if (set_u64(block, SIZE, size) < 0) { Py_DECREF(rest); return NULL; }
    if (following) set_obj(following, PREV, rest);
    set_obj(block, NEXT, rest);
    /* the rest's key is below the block's, so it keeps slot i unless it falls below slot i-1 */
    if (i == 0 || less(f->sizes[i - 1], f->starts[i - 1], rest_size, start)) {
        f->sizes[i] = rest_size;
        f->starts[i] = start;
        f->blocks[i] = rest;                    /* the list's reference to block: the caller's */
        f->cut = i;
        return block;
    }
    pop_at(f, i);                               /* the list's reference to block: the caller's */
    int err = insert_at(f, lower_bound(f, rest_size, start), rest_size, start, rest);
    Py_DECREF(rest);
    if (err < 0) { Py_DECREF(block); return NULL; }
    return block;
}

static PyObject *FreeList_fit(FreeList *f, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames) {
    static const char *names[] = {"size", "below", "first_fit"};
    PyObject *values[3] = {NULL, Py_None, Py_False};
    uint64_t size;
    int first_fit;
    if (arguments("fit", names, 3, 1, args, nargs, kwnames, values) < 0 ||
            fit_args(values[0], values[2], &size, &first_fit) < 0)
        return NULL;
    PyObject *below = values[1];
    Py_ssize_t i = fit_slot(f, size, below, first_fit);
    if (i == -2) return NULL;
    if (i == -1) Py_RETURN_NONE;
    Py_INCREF(f->blocks[i]);
    return f->blocks[i];
}

/* merge_and_add(block): add a freed block, first absorbing free neighbours (which must be in
 * this list) */
static PyObject *FreeList_merge_and_add(FreeList *f, PyObject *block) {
    if (!is_block(block)) return NULL;
    PyObject *following = neighbour(block, NEXT), *previous = neighbour(block, PREV);
    int prev_free = previous != NULL && !is_allocated(previous);
    if (following != NULL && !is_allocated(following)) {
        uint64_t more, start, size;
        if (get_u64(following, SIZE, "size", &more) < 0 || key(block, &size, &start) < 0)
            return NULL;
        if (!prev_free) {
            /* the common case on a cache hit: the block rejoins the rest it was cut from (found
             * where the last split left it, else by its key), and takes the rest's slot when
             * its (larger) key stays below slot i+1's */
            Py_ssize_t i = f->cut;
            if (i >= f->n || f->blocks[i] != following) {
                i = index_of(f, following);
                if (i < 0) return NULL;
            }
            size += more;
            Py_INCREF(following);               /* the list's reference goes: ours until spare */
            if (set_u64(block, SIZE, size) < 0) { Py_DECREF(following); return NULL; }
            PyObject *after = neighbour(following, NEXT);
            set_obj(block, NEXT, after ? after : Py_None);
            if (after) set_obj(after, PREV, block);
            if (i + 1 == f->n || less(size, start, f->sizes[i + 1], f->starts[i + 1])) {
                set_at(f, i, size, start, block);
            } else {
                Py_DECREF(pop_at(f, i));
                if (insert_at(f, lower_bound(f, size, start), size, start, block) < 0) {
                    Py_DECREF(following);
                    return NULL;
                }
            }
            /* absorbed: the next split's rest, not a new Block; it keeps nothing of its old
             * chain meanwhile (a released segment must not stay alive through it) */
            set_obj(following, SEGMENT, Py_None);
            set_obj(following, PREV, Py_None);
            set_obj(following, NEXT, Py_None);
            PyObject *old = f->spare;
            f->spare = following;
            Py_XDECREF(old);
            Py_RETURN_NONE;
        }
        Py_ssize_t i = index_of(f, following);
        if (i < 0 || absorb_next(block) < 0) return NULL;
        Py_DECREF(pop_at(f, i));
        i = index_of(f, previous);
        if (i < 0 || absorb_next(previous) < 0 || rekey(f, i, previous) < 0) return NULL;
    } else if (prev_free) {
        Py_ssize_t i = index_of(f, previous);
        if (i < 0 || absorb_next(previous) < 0 || rekey(f, i, previous) < 0) return NULL;
    } else if (add(f, block) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *FreeList_add(FreeList *f, PyObject *block) {
    if (!is_block(block) || add(f, block) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *FreeList_remove(FreeList *f, PyObject *block) {
    if (!is_block(block)) return NULL;
    Py_ssize_t i = index_of(f, block);
    if (i < 0) return NULL;
    Py_DECREF(pop_at(f, i));
    Py_RETURN_NONE;
}

static PyObject *slice(FreeList *f, Py_ssize_t from, int reversed) {
    PyObject *out = PyList_New(f->n - from);
    if (!out) return NULL;
    for (Py_ssize_t i = from; i < f->n; i++) {
        PyObject *block = f->blocks[reversed ? f->n - 1 - (i - from) : i];
        Py_INCREF(block);
        PyList_SET_ITEM(out, i - from, block);
    }
    return out;
}

static PyObject *FreeList_at_least(FreeList *f, PyObject *size_arg) {
    uint64_t size;
    if (size_arg_u64(size_arg, &size) < 0) return NULL;
    return slice(f, lower_bound(f, size, 0), 0);
}

static PyObject *FreeList_largest_first(FreeList *f, PyObject *unused) {
    return slice(f, 0, 1);
}

static PyObject *FreeList_largest(FreeList *f, PyObject *unused) {
    return PyLong_FromUnsignedLongLong(f->n ? f->sizes[f->n - 1] : 0);
}

/* what tests look at: the blocks, their keys (size << 64 | start) and starts, the spare */
static PyObject *FreeList_get_blocks(FreeList *f, void *unused) { return slice(f, 0, 0); }

static PyObject *u64_list(FreeList *f, int keys) {
    PyObject *out = PyList_New(f->n), *shift = PyLong_FromLong(64);
    if (!out || !shift) { Py_XDECREF(out); Py_XDECREF(shift); return NULL; }
    for (Py_ssize_t i = 0; i < f->n; i++) {
        PyObject *start = PyLong_FromUnsignedLongLong(f->starts[i]), *item = start;
        if (start && keys) {
            PyObject *size = PyLong_FromUnsignedLongLong(f->sizes[i]);
            PyObject *high = size ? PyNumber_Lshift(size, shift) : NULL;
            item = high ? PyNumber_Or(high, start) : NULL;
            Py_XDECREF(size); Py_XDECREF(high); Py_DECREF(start);
        }
        if (!item) { Py_DECREF(out); Py_DECREF(shift); return NULL; }
        PyList_SET_ITEM(out, i, item);
    }
    Py_DECREF(shift);
    return out;
}

static PyObject *FreeList_get_keys(FreeList *f, void *unused) { return u64_list(f, 1); }
static PyObject *FreeList_get_starts(FreeList *f, void *unused) { return u64_list(f, 0); }

static PyObject *FreeList_get_spare(FreeList *f, void *unused) {
    PyObject *spare = f->spare ? f->spare : Py_None;
    Py_INCREF(spare);
    return spare;
}

static Py_ssize_t FreeList_len(FreeList *f) { return f->n; }

/* --- the type ------------------------------------------------------------------------------- */

static PyObject *FreeList_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    if (block_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "FreeList: bind(Block) first");
        return NULL;
    }
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "FreeList() takes no arguments");
        return NULL;
    }
    return type->tp_alloc(type, 0);
}

static int FreeList_traverse(FreeList *f, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; i < f->n; i++) Py_VISIT(f->blocks[i]);
    Py_VISIT(f->spare);
    return 0;
}

static int FreeList_clear(FreeList *f) {
    Py_ssize_t n = f->n;
    f->n = 0;
    for (Py_ssize_t i = 0; i < n; i++) Py_CLEAR(f->blocks[i]);
    Py_CLEAR(f->spare);
    return 0;
}

static void FreeList_dealloc(FreeList *f) {
    PyObject_GC_UnTrack(f);
    FreeList_clear(f);
    PyMem_Free(f->sizes);
    PyMem_Free(f->starts);
    PyMem_Free(f->blocks);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyMethodDef FreeList_methods[] = {
    {"take", (PyCFunction)(void (*)(void))FreeList_take, METH_FASTCALL | METH_KEYWORDS,
     "take(size, split_min, below=None, first_fit=False): the fit, removed and cut to size "
     "when the rest is at least split_min bytes; None if none"},
    {"fit", (PyCFunction)(void (*)(void))FreeList_fit, METH_FASTCALL | METH_KEYWORDS,
     "fit(size, below=None, first_fit=False): the block take would cut, left in the list"},
    {"merge_and_add", (PyCFunction)FreeList_merge_and_add, METH_O,
     "merge_and_add(block): add a freed block, absorbing its free neighbours"},
    {"add", (PyCFunction)FreeList_add, METH_O, "add(block)"},
    {"remove", (PyCFunction)FreeList_remove, METH_O, "remove(block)"},
    {"at_least", (PyCFunction)FreeList_at_least, METH_O,
     "at_least(size): the free blocks of at least size bytes, smallest first"},
    {"largest_first", (PyCFunction)FreeList_largest_first, METH_NOARGS,
     "the free blocks, largest first"},
    {"largest", (PyCFunction)FreeList_largest, METH_NOARGS,
     "the size of the largest free block (0 when there is none)"},
    {NULL}
};

static PyGetSetDef FreeList_getset[] = {
    {"_blocks", (getter)FreeList_get_blocks, NULL, "the blocks in (size, start) order", NULL},
    {"_keys", (getter)FreeList_get_keys, NULL, "their keys, size << 64 | start", NULL},
    {"_starts", (getter)FreeList_get_starts, NULL, "their starts", NULL},
    {"_spare", (getter)FreeList_get_spare, NULL, "the block kept for the next split", NULL},
    {NULL}
};

static PySequenceMethods FreeList_sequence = {.sq_length = (lenfunc)FreeList_len};

static PyTypeObject FreeListType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npumem.alloc._free_list.FreeList",
    .tp_basicsize = sizeof(FreeList),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Free blocks ordered by (size, start) for best-fit and first-fit lookups.",
    .tp_new = FreeList_new,
    .tp_traverse = (traverseproc)FreeList_traverse,
    .tp_clear = (inquiry)FreeList_clear,
    .tp_dealloc = (destructor)FreeList_dealloc,
    .tp_methods = FreeList_methods,
    .tp_getset = FreeList_getset,
    .tp_as_sequence = &FreeList_sequence,
};

/* bind(Block): the block class, whose slots must be plain object slots */
static PyObject *bind(PyObject *module, PyObject *cls) {
    static const char *names[] = {"start", "size", "prev", "next", "segment", "allocated"};
    Py_ssize_t *offsets[] = {&START, &SIZE, &PREV, &NEXT, &SEGMENT, &ALLOCATED};
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "bind: expected the Block class");
        return NULL;
    }
    for (int i = 0; i < 6; i++) {
        PyObject *descr = PyDict_GetItemString(((PyTypeObject *)cls)->tp_dict, names[i]);
        if (!descr || !Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
                ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "bind: %s is not a slot of the class", names[i]);
            return NULL;
        }
        *offsets[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
    }
    Py_INCREF(cls);
    Py_XSETREF(block_type, (PyTypeObject *)cls);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"bind", bind, METH_O, "bind(Block): the class of the blocks the lists hold"},
    {NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_free_list", "The caching pool's index of free blocks.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__free_list(void) {
    if (PyType_Ready(&FreeListType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&FreeListType);
    if (PyModule_AddObject(m, "FreeList", (PyObject *)&FreeListType) < 0) {
        Py_DECREF(&FreeListType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
