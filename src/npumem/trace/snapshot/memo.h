/* The pickle memo of the snapshot reader (_reader.c), in memory that grows with what the file
 * holds that differs, not with its length.
 *
 * pickle.dump memoizes every dict, list and string it writes: a snapshot of ten million trace
 * entries makes twenty million memo indices (each entry and its frames list), nearly all of
 * which come to name an entry (read as a row, see the reader) or one of a few interned stacks.
 * So an index costs 4 bytes, a code in pages of MEMO_PAGE: 0, never set; 1, a trace entry;
 * k + 2, object k. Each object is kept once, found by its address, with the count of indices
 * that name it, and let go when none does (a frames list the reader replaced by its interned
 * stack). Strings (and pool ids) are kept once per value, so a writer that copies each frame's
 * strings costs one of each. */
#ifndef NPUMEM_SNAPSHOT_MEMO_H
#define NPUMEM_SNAPSHOT_MEMO_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "../../alloc/live_table.h"

#define MEMO_PAGE_BITS 12
#define MEMO_PAGE ((Py_ssize_t)1 << MEMO_PAGE_BITS)
#define MEMO_UNSET 0
#define MEMO_ENTRY 1
#define MEMO_MAX_OBJECTS ((Py_ssize_t)INT32_MAX)

typedef struct {
    uint32_t **pages;               /* the codes; a page made when first written */
    Py_ssize_t page_count;
    Py_ssize_t size;                /* every index set so far is below this */
    PyObject *entry;                /* what stands for a trace entry (borrowed) */
    PyObject **objects;             /* object k (owned); NULL while k is free */
    Py_ssize_t *uses;               /* indices naming object k; for a free k, the next free */
    Py_ssize_t object_count, object_capacity, free_id;
    LiveTable ids;                  /* an object's address -> k */
    PyObject *values;               /* dict: a value kept once (memo_by_value) -> that one */
} Memo;

static int memo_init(Memo *memo, PyObject *entry) {
    memset(memo, 0, sizeof *memo);
    memo->entry = entry;
    memo->free_id = -1;
    memo->values = PyDict_New();
    return memo->values && live_resize(&memo->ids, 1024) == 0 ? 0 : -1;
}

static void memo_clear(Memo *memo) {
    for (Py_ssize_t k = 0; k < memo->object_count; k++)
        Py_XDECREF(memo->objects[k]);
    for (Py_ssize_t page = 0; page < memo->page_count; page++)
        PyMem_Free(memo->pages[page]);
    PyMem_Free(memo->pages);
    PyMem_Free(memo->objects);
    PyMem_Free(memo->uses);
    live_free(&memo->ids);
    Py_CLEAR(memo->values);
    memset(memo, 0, sizeof *memo);
}

/* The code of `index` (0 <= index): NULL where its page was never made and `make` is 0, or
 * with MemoryError set. */
static uint32_t *memo_code(Memo *memo, Py_ssize_t index, int make) {
    Py_ssize_t page = index >> MEMO_PAGE_BITS;
    if (page >= memo->page_count || !memo->pages[page]) {
        if (!make)
            return NULL;
        if (page >= memo->page_count) {
            Py_ssize_t count = memo->page_count ? memo->page_count : 64;
            while (count <= page)
                count *= 2;
            uint32_t **pages = PyMem_Realloc(memo->pages, count * sizeof *pages);
            if (!pages)
                return (uint32_t *)PyErr_NoMemory();
            memset(pages + memo->page_count, 0, (count - memo->page_count) * sizeof *pages);
            memo->pages = pages;
            memo->page_count = count;
        }
        if (!(memo->pages[page] = PyMem_Calloc(MEMO_PAGE, sizeof(uint32_t))))
            return (uint32_t *)PyErr_NoMemory();
    }
    return &memo->pages[page][index & (MEMO_PAGE - 1)];
}

/* What `index` holds (borrowed): NULL where it was never set. */
static PyObject *memo_get(Memo *memo, Py_ssize_t index) {
    uint32_t *code = index >= 0 && index < memo->size ? memo_code(memo, index, 0) : NULL;
    if (!code || *code == MEMO_UNSET)
        return NULL;
    return *code == MEMO_ENTRY ? memo->entry : memo->objects[*code - 2];
}

/* The number k of `v`, made if new, its uses not yet counted; -1 with an error set. */
static Py_ssize_t memo_object(Memo *memo, PyObject *v) {
    uint64_t at = live_find(&memo->ids, (uint64_t)(uintptr_t)v);
    if (memo->ids.slots[at].value != LIVE_EMPTY)
        return memo->ids.slots[at].value;
    Py_ssize_t k = memo->free_id;
    if (k >= 0)
        memo->free_id = memo->uses[k];
    else {
        if (memo->object_count == memo->object_capacity) {
            if (memo->object_count >= MEMO_MAX_OBJECTS) {
                PyErr_SetString(PyExc_MemoryError, "more than 2**31 objects in a pickle's memo");
                return -1;
            }
            Py_ssize_t capacity = memo->object_capacity ? 2 * memo->object_capacity : 1024;
            PyObject **objects = PyMem_Realloc(memo->objects, capacity * sizeof *objects);
            if (objects)
                memo->objects = objects;
            Py_ssize_t *uses = objects ? PyMem_Realloc(memo->uses, capacity * sizeof *uses)
                                       : NULL;
            if (!uses) {
                PyErr_NoMemory();
                return -1;
            }
            memo->uses = uses;
            memo->object_capacity = capacity;
        }
        k = memo->object_count++;
    }
    int existed;
    if (live_put(&memo->ids, (uint64_t)(uintptr_t)v, (int32_t)k, &existed) < 0) {
        memo->objects[k] = NULL;                       /* k free again */
        memo->uses[k] = memo->free_id;
        memo->free_id = k;
        return -1;
    }
    memo->objects[k] = Py_NewRef(v);
    memo->uses[k] = 0;
    return k;
}

static int memo_by_value(PyObject *v);

/* One index fewer names what `code` names: an object no index names is let go (and, kept by
 * value, no longer the one of its value, so the values kept do not outgrow the memo). */
static void memo_release(Memo *memo, uint32_t code) {
    if (code < 2)
        return;
    Py_ssize_t k = code - 2;
    if (--memo->uses[k])
        return;
    PyObject *object = memo->objects[k];
    live_pop(&memo->ids, (uint64_t)(uintptr_t)object);
    memo->objects[k] = NULL;
    memo->uses[k] = memo->free_id;
    memo->free_id = k;
    if (memo_by_value(object) && PyDict_GetItemWithError(memo->values, object) == object)
        PyDict_DelItem(memo->values, object);    /* (of a str or an int pair: cannot fail) */
    Py_DECREF(object);
}

/* `index` holds `v` (borrowed; memo->entry for a trace entry) from now on. */
static int memo_set(Memo *memo, Py_ssize_t index, PyObject *v) {
    uint32_t *code = memo_code(memo, index, 1);
    if (!code)
        return -1;
    uint32_t now = MEMO_ENTRY;
    if (v != memo->entry) {
        Py_ssize_t k = memo_object(memo, v);
        if (k < 0)
            return -1;
        memo->uses[k]++;
        now = (uint32_t)(k + 2);
    }
    memo_release(memo, *code);
    *code = now;
    if (index >= memo->size)
        memo->size = index + 1;
    return 0;
}

/* Kept by value: a string, or a pair of small ints (a pool id, which PyTorch may write once
 * per trace entry). Not other tuples: ints hash to themselves, so a file could give thousands
 * of tuples one hash and make each lookup a walk through all of them; strings' hashes are
 * keyed per process, and a pair below 2**16 has too few values to collide. Not floats or
 * bools: 0.0 equals -0.0 and True equals 1, which are not the same value. */
static int memo_by_value(PyObject *v) {
    if (PyUnicode_CheckExact(v))
        return 1;
    if (!PyTuple_CheckExact(v) || PyTuple_GET_SIZE(v) != 2)
        return 0;
    for (Py_ssize_t i = 0; i < 2; i++) {
        PyObject *item = PyTuple_GET_ITEM(v, i);
        int overflow;
        long n = PyLong_CheckExact(item) ? PyLong_AsLongAndOverflow(item, &overflow) : -1;
        if (!PyLong_CheckExact(item) || overflow || n < 0 || n >= (1 << 16))
            return 0;
    }
    return 1;
}

/* The object to memoize for `v` (borrowed): the first one of its value where it is kept by
 * value, else `v`; NULL with an error set. */
static PyObject *memo_canonical(Memo *memo, PyObject *v) {
    return v != memo->entry && memo_by_value(v) ? PyDict_SetDefault(memo->values, v, v) : v;
}

#endif
