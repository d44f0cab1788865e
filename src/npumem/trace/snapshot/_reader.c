/* Reading a PyTorch memory snapshot pickle into columns.
 *
 * A snapshot of ten million trace entries unpickles, the usual way, into ten million dicts
 * (5 GiB and more). This reader runs the pickle's opcodes itself: everything but the trace
 * entries becomes the usual Python objects, and each entry of `device_traces` is checked and
 * stored as one row of fixed-size columns (about 50 bytes), its stack interned. An entry written
 * as pickle.dump writes one is never made a dict: its fields are collected as they are set
 * (see "entries read as rows"); one written otherwise is a dict until its list takes it.
 * Only plain data is admitted: an opcode that would call a class or function (how hostile
 * pickles run code) ends the read with UnsafePickle, as does a memo index no pickler would
 * write, so a few bytes cannot ask for gigabytes.
 *
 * The entry rule (types and ranges of each field) is stated here once; the Python side
 * (columns.py) turns the errors into messages naming the field.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_FRAMES 256          /* frames kept (and checked) per stack: schema.MAX_FRAMES */
#define MEMO_SLACK 1024         /* a PUT may run this far past the memo's end, no further */

static PyObject *UnsafePickle;  /* the pickle is not plain data, or is damaged */
static PyObject *EntryError;    /* (where, reason with {} for the value, value) */

/* action codes: the order of schema.ACTIONS */
static const char *ACTIONS[] = {"alloc", "free_requested", "free_completed", "segment_alloc",
                                "segment_free", "segment_map", "segment_unmap", "oom",
                                "snapshot", "annotate", "workspace_snapshot"};
#define N_ACTIONS 11
#define OOM 7

/* flags: which optional fields a row has */
enum { HAS_ADDR = 1, HAS_SIZE = 2, HAS_STREAM = 4, HAS_TIME = 8, TIME_FLOAT = 16,
       HAS_REQUESTED = 32, HAS_FRAMES = 64 };

static PyObject *interned_keys[8];
static PyObject *interned_actions[N_ACTIONS];
/* the names above as the reader's own objects (known_string); filled at import */
static PyObject *known[32];
static Py_ssize_t n_known;

/* a new reference to the reader's object for this text, if it is one of the names it looks
 * for (keys, actions, frame fields); NULL otherwise. Not interned as such: interned strings
 * live as long as the process on newer Pythons, and a snapshot's frames hold many */
static PyObject *known_string(const char *text, Py_ssize_t size) {
    for (Py_ssize_t k = 0; k < n_known; k++) {
        Py_ssize_t length;
        const char *name = PyUnicode_AsUTF8AndSize(known[k], &length);
        if (length == size && memcmp(name, text, (size_t)size) == 0)
            return Py_NewRef(known[k]);
    }
    return NULL;
}
enum { K_ACTION, K_ADDR, K_SIZE, K_STREAM, K_TIME, K_REQUESTED, K_FRAMES, K_DEVICE_FREE };
static const char *KEY_NAMES[] = {"action", "addr", "size", "stream", "time_us",
                                  "requested_size", "frames", "device_free"};
static PyObject *s_filename, *s_line, *s_name, *s_pool_id;

/* `items` (capacity *capacity, `width` bytes each) with room for `need`: doubled from `first`
 * as needed, the new room zeroed. NULL with MemoryError set, `items` and *capacity unchanged. */
static void *grow(void *items, Py_ssize_t *capacity, Py_ssize_t need, size_t width,
                  Py_ssize_t first) {
    if (need <= *capacity)
        return items;
    Py_ssize_t grown = *capacity ? *capacity : first;
    while (grown < need)
        grown *= 2;
    char *more = PyMem_Realloc(items, grown * width);
    if (!more)
        return PyErr_NoMemory();
    memset(more + *capacity * width, 0, (grown - *capacity) * width);
    *capacity = grown;
    return more;
}

#include "../reader_common.h"
#include "memo.h"

enum { C_ACTION, C_FLAGS, C_ADDR, C_SIZE, C_STREAM, C_TIME, C_REQUESTED, C_STACK, C_EXTRA, N_COLUMNS };
static const char *COLUMN_NAMES[] = {"action", "flags", "addr", "size", "stream", "time",
                                     "requested", "stack", "extra"};
static const Py_ssize_t COLUMN_WIDTHS[] = {1, 1, 8, 8, 8, 8, 8, 4, 4};

typedef struct {
    Column columns[N_COLUMNS];
    Py_ssize_t device;
    Py_ssize_t staged;          /* rows read without a dict, their markers not yet appended */
} Device;

/* ---- interned stacks and extras, shared by every device of one file ---- */

typedef struct {
    uint64_t hash;
    Py_ssize_t n;
    uint32_t stack;
    PyObject **frames;          /* a copy of the kept list's first items (it holds them alive) */
} IdentitySlot;

typedef struct {
    PyObject *stacks;           /* list: stack id -> the kept frames list */
    PyObject *by_content;       /* dict: tuple of frame keys -> stack id */
    IdentitySlot *slots;        /* open addressing, by the frames' addresses */
    Py_ssize_t slot_count, slot_used;
    Py_ssize_t cut;             /* stacks longer than MAX_FRAMES */
    PyObject *extras;           /* list: extra id -> tuple of (key, value) pairs */
    PyObject *extras_by_value;  /* dict: that tuple -> extra id */
    PyObject *last_extra_items; /* the last entry's extras (a tuple) and its id */
    uint32_t last_extra;
    int own_strings;            /* the keys are the reader's (a pickle it read): a known one
                                   is the reader's object (known_string), never a copy */
} Interned;

static int interned_init(Interned *t) {
    memset(t, 0, sizeof *t);
    t->stacks = PyList_New(0);
    t->by_content = PyDict_New();
    t->extras = PyList_New(0);
    t->extras_by_value = PyDict_New();
    t->slot_count = 1024;
    t->slots = PyMem_Calloc(t->slot_count, sizeof(IdentitySlot));
    if (!t->stacks || !t->by_content || !t->extras || !t->extras_by_value || !t->slots)
        return -1;
    /* extra id 0: no extra fields */
    PyObject *none = PyTuple_New(0);
    if (!none || PyList_Append(t->extras, none) < 0 || PyDict_SetItem(t->extras_by_value, none,
                                                                      PyLong_FromLong(0)) < 0) {
        Py_XDECREF(none);
        return -1;
    }
    Py_DECREF(none);
    return 0;
}

static void interned_clear(Interned *t) {
    Py_CLEAR(t->stacks);
    Py_CLEAR(t->by_content);
    Py_CLEAR(t->extras);
    Py_CLEAR(t->extras_by_value);
    Py_CLEAR(t->last_extra_items);
    for (Py_ssize_t i = 0; t->slots && i < t->slot_count; i++)
        PyMem_Free(t->slots[i].frames);
    PyMem_Free(t->slots);
    t->slots = NULL;
}

static uint64_t pointers_hash(PyObject **items, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        h ^= (uint64_t)(uintptr_t)items[i];
        h *= 1099511628211ULL;
        h ^= h >> 29;
    }
    return h ? h : 1;                                      /* 0 marks an empty slot */
}

static IdentitySlot *identity_find(Interned *t, uint64_t hash, PyObject **items, Py_ssize_t n) {
    Py_ssize_t mask = t->slot_count - 1;
    for (Py_ssize_t i = (Py_ssize_t)(hash & mask);; i = (i + 1) & mask) {
        IdentitySlot *slot = &t->slots[i];
        if (slot->hash == 0)
            return slot;                                   /* empty: not found */
        if (slot->hash == hash && slot->n == n &&
            (n == 0 || memcmp(slot->frames, items, n * sizeof(PyObject *)) == 0))
            return slot;
    }
}

static int identity_add(Interned *t, uint64_t hash, PyObject *kept, uint32_t stack) {
    if ((t->slot_used + 1) * 2 > t->slot_count) {          /* keep it at most half full */
        Py_ssize_t old_count = t->slot_count;
        IdentitySlot *old = t->slots;
        t->slot_count *= 2;
        t->slots = PyMem_Calloc(t->slot_count, sizeof(IdentitySlot));
        if (!t->slots) {
            t->slots = old;
            t->slot_count = old_count;
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < old_count; i++)
            if (old[i].hash) {
                IdentitySlot *slot = identity_find(t, old[i].hash, old[i].frames, old[i].n);
                *slot = old[i];
            }
        PyMem_Free(old);
    }
    Py_ssize_t n = PyList_GET_SIZE(kept);
    PyObject **items = ((PyListObject *)kept)->ob_item;
    IdentitySlot *slot = identity_find(t, hash, items, n);
    if (slot->hash)
        return 0;                                          /* already there */
    /* a copy: a hostile pickle may append to the kept list later, moving its items */
    PyObject **copy = PyMem_Malloc((n ? n : 1) * sizeof(PyObject *));
    if (!copy) {
        PyErr_NoMemory();
        return -1;
    }
    if (n)
        memcpy(copy, items, n * sizeof(PyObject *));
    slot->hash = hash;
    slot->n = n;
    slot->stack = stack;
    slot->frames = copy;
    t->slot_used++;
    return 0;
}

/* ---- errors ---- */

static int entry_error(Py_ssize_t device, Py_ssize_t index, const char *field,
                       const char *reason, PyObject *value) {
    PyObject *where = field
        ? PyUnicode_FromFormat("device_traces[%zd][%zd].%s", device, index, field)
        : PyUnicode_FromFormat("device_traces[%zd][%zd]", device, index);
    if (!where)
        return -1;
    PyObject *args = Py_BuildValue("(NsO)", where, reason, value ? value : Py_None);
    if (args) {
        PyErr_SetObject(EntryError, args);
        Py_DECREF(args);
    }
    return -1;
}

static int unsafe(const char *fmt, ...) {
    va_list va;
    va_start(va, fmt);
    PyObject *message = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    if (message) {
        PyErr_SetObject(UnsafePickle, message);
        Py_DECREF(message);
    }
    return -1;
}

/* ---- one entry -> one row ---- */

static int is_int(PyObject *v) { return PyLong_CheckExact(v) || (PyLong_Check(v) && !PyBool_Check(v)); }

/* An int in [0, 2**64) into *out: 1; not one: 0; -1 on a Python error. */
static int natural64(PyObject *v, uint64_t *out) {
    if (!v || !is_int(v))
        return 0;
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    *out = x;
    return 1;
}

static const char *INTEGER = "must be an integer in [0, 2**64), got {}";

/* an integer field `v` (NULL: absent): required (error if absent) or optional (absent: 0,
 * flag clear) */
static int integer_field(PyObject *v, int key, int required, uint64_t *out, int *present,
                         Py_ssize_t device, Py_ssize_t index) {
    *present = v != NULL;
    *out = 0;
    if (!v)
        return required ? entry_error(device, index, KEY_NAMES[key], INTEGER, Py_None) : 0;
    int ok = natural64(v, out);
    if (ok < 0)
        return -1;
    return ok ? 0 : entry_error(device, index, KEY_NAMES[key], INTEGER, v);
}

static int check_frame(PyObject *frame, Py_ssize_t device, Py_ssize_t index, Py_ssize_t at) {
    char field[64];
    if (!PyDict_Check(frame)) {
        snprintf(field, sizeof field, "frames[%zd]", at);
        return entry_error(device, index, field, "must be a dict, got {}", frame);
    }
    PyObject *keys[2] = {s_filename, s_name};
    const char *names[2] = {"filename", "name"};
    for (int k = 0; k < 2; k++) {
        PyObject *v = PyDict_GetItemWithError(frame, keys[k]);
        if (!v && PyErr_Occurred())
            return -1;
        if (v && v != Py_None && !PyUnicode_Check(v)) {
            snprintf(field, sizeof field, "frames[%zd].%s", at, names[k]);
            return entry_error(device, index, field, "must be a string, got {}", v);
        }
    }
    PyObject *line = PyDict_GetItemWithError(frame, s_line);
    if (!line && PyErr_Occurred())
        return -1;
    if (line && line != Py_None && !is_int(line)) {
        snprintf(field, sizeof field, "frames[%zd].line", at);
        return entry_error(device, index, field, "must be an integer, got {}", line);
    }
    return 0;
}

/* A value a frame's content is keyed by: a str, None, a bool or an int below 2**60. Not a
 * wider int, a float or a container: ints and floats hash to themselves modulo 2**61 - 1, so
 * lines i * (2**61 - 1) would make each lookup walk through all the stacks before it. */
static int keyed_value(PyObject *v) {
    if (PyUnicode_CheckExact(v) || v == Py_None || PyBool_Check(v))
        return 1;
    if (!PyLong_CheckExact(v))
        return 0;
    int overflow;
    long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
    return !overflow && n < ((long long)1 << 60) && n > -((long long)1 << 60);
}

/* The content of a frame, hashable: (filename, line, name) for the usual three fields, else
 * the dict's items; NULL with no error set when a value is not keyed_value (such a frame's
 * stack is kept apart, found again only by identity). */
static PyObject *frame_key(PyObject *frame) {
    Py_ssize_t at = 0;
    PyObject *key, *value;
    while (PyDict_Next(frame, &at, &key, &value))
        if (!keyed_value(value) || !PyUnicode_CheckExact(key))
            return NULL;
    if (PyDict_GET_SIZE(frame) == 3) {
        PyObject *f = PyDict_GetItemWithError(frame, s_filename);
        PyObject *l = f ? PyDict_GetItemWithError(frame, s_line) : NULL;
        PyObject *n = l ? PyDict_GetItemWithError(frame, s_name) : NULL;
        if (n)
            return PyTuple_Pack(3, f, l, n);
        if (PyErr_Occurred())
            return NULL;
    }
    PyObject *items = PyDict_Items(frame);
    if (!items)
        return NULL;
    PyObject *key_tuple = PyList_AsTuple(items);
    Py_DECREF(items);
    if (key_tuple && PyObject_Hash(key_tuple) == -1) {
        Py_DECREF(key_tuple);
        PyErr_Clear();
        return NULL;
    }
    return key_tuple;
}

/* The stack id of an entry's frames: interned by identity (frames shared by the pickle's memo),
 * else by content; the first MAX_FRAMES frames are checked and kept. */
static int intern_stack(Interned *t, PyObject *frames, uint32_t *out, Py_ssize_t device,
                        Py_ssize_t index) {
    if (!PyList_Check(frames))
        return entry_error(device, index, "frames", "must be a list, got {}", frames);
    Py_ssize_t length = PyList_GET_SIZE(frames);
    Py_ssize_t n = length < MAX_FRAMES ? length : MAX_FRAMES;
    PyObject **items = ((PyListObject *)frames)->ob_item;
    uint64_t hash = pointers_hash(items, n);
    IdentitySlot *slot = identity_find(t, hash, items, n);
    if (slot->hash) {
        *out = slot->stack;
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (check_frame(items[i], device, index, i) < 0)
            return -1;
    PyObject *key = PyTuple_New(n);
    if (!key)
        return -1;
    int hashable = 1;
    for (Py_ssize_t i = 0; i < n && hashable; i++) {
        PyObject *k = frame_key(items[i]);
        if (!k) {
            if (PyErr_Occurred()) {
                Py_DECREF(key);
                return -1;
            }
            hashable = 0;
            break;
        }
        PyTuple_SET_ITEM(key, i, k);
    }
    if (hashable) {
        PyObject *known = PyDict_GetItemWithError(t->by_content, key);
        if (known) {
            Py_DECREF(key);
            *out = (uint32_t)PyLong_AsUnsignedLong(known);
            return 0;
        }
        if (PyErr_Occurred()) {
            Py_DECREF(key);
            return -1;
        }
    }
    Py_ssize_t id = PyList_GET_SIZE(t->stacks);
    if (id >= UINT32_MAX) {
        Py_DECREF(key);
        return unsafe("more than 2**32 different stacks");
    }
    PyObject *kept = PyList_GetSlice(frames, 0, n);
    if (!kept) {
        Py_DECREF(key);
        return -1;
    }
    if (length > n)
        t->cut++;
    int failed = PyList_Append(t->stacks, kept) < 0;
    if (!failed && hashable) {
        PyObject *value = PyLong_FromSsize_t(id);
        failed = !value || PyDict_SetItem(t->by_content, key, value) < 0;
        Py_XDECREF(value);
    }
    Py_DECREF(key);
    if (!failed)
        failed = identity_add(t, pointers_hash(((PyListObject *)kept)->ob_item, n), kept,
                              (uint32_t)id) < 0;
    Py_DECREF(kept);
    if (failed)
        return -1;
    *out = (uint32_t)id;
    return 0;
}

/* The fields npumem does not keep in a column, interned: `seen` holds them as (key, value,
 * key, value, ...), `count` objects. The common case, the same objects as the last entry's
 * (memoized strings) or none, makes no tuple. */
static int intern_extras(Interned *t, PyObject **seen, Py_ssize_t count, uint32_t *out) {
    int same = count == 0;
    if (count && t->last_extra_items && PyTuple_GET_SIZE(t->last_extra_items) == count) {
        same = 1;
        for (Py_ssize_t i = 0; i < count && same; i++)
            same = seen[i] == PyTuple_GET_ITEM(t->last_extra_items, i);
    }
    PyObject *items = same ? NULL : PyTuple_New(count);
    for (Py_ssize_t i = 0; items && i < count; i++)
        PyTuple_SET_ITEM(items, i, Py_NewRef(seen[i]));
    if (same) {
        *out = count ? t->last_extra : 0;
        return 0;
    }
    if (!items)
        return -1;
    uint32_t id;
    PyObject *known = NULL;
    if (PyObject_Hash(items) == -1)
        PyErr_Clear();                                   /* unhashable: its own id */
    else {
        known = PyDict_GetItemWithError(t->extras_by_value, items);
        if (!known && PyErr_Occurred()) {
            Py_DECREF(items);
            return -1;
        }
    }
    if (known)
        id = (uint32_t)PyLong_AsUnsignedLong(known);
    else {
        Py_ssize_t n = PyList_GET_SIZE(t->extras);
        if (n >= UINT32_MAX) {
            Py_DECREF(items);
            return unsafe("more than 2**32 different sets of extra fields");
        }
        id = (uint32_t)n;
        if (PyList_Append(t->extras, items) < 0) {
            Py_DECREF(items);
            return -1;
        }
        if (PyObject_Hash(items) != -1) {
            PyObject *v = PyLong_FromUnsignedLong(id);
            if (!v || PyDict_SetItem(t->extras_by_value, items, v) < 0) {
                Py_XDECREF(v);
                Py_DECREF(items);
                return -1;
            }
            Py_DECREF(v);
        } else
            PyErr_Clear();
    }
    Py_XSETREF(t->last_extra_items, items);
    t->last_extra = id;
    *out = id;
    return 0;
}

static int check_pool_id(PyObject *v, Py_ssize_t device, Py_ssize_t index) {
    if (!v || v == Py_None)
        return 0;
    if ((PyTuple_Check(v) || PyList_Check(v)) && PySequence_Fast_GET_SIZE(v) == 2) {
        uint64_t part;
        int a = natural64(PySequence_Fast_ITEMS(v)[0], &part);
        int b = a > 0 ? natural64(PySequence_Fast_ITEMS(v)[1], &part) : a;
        if (a < 0 || b < 0)
            return -1;
        if (a && b)
            return 0;
    }
    return entry_error(device, index, "pool_id", "must be a pair of integers in [0, 2**64) (a "
                       "memory pool's id), got {}", v);
}

/* The keys a row reads: found by identity where the keys are the reader's own objects (a
 * pickle it read), else by equality (dicts from JSON). The first K_DEVICE_FREE become columns;
 * device_free and pool_id are checked and stay with the extras. */
enum { F_POOL_ID = K_DEVICE_FREE + 1, N_FIELD_KEYS };
static PyObject *field_keys[N_FIELD_KEYS];

static int field_key(PyObject *key, int own_strings) {
    for (int k = 0; k < N_FIELD_KEYS; k++)
        if (key == field_keys[k])
            return k;
    if (own_strings || !PyUnicode_Check(key))
        return -1;
    for (int k = 0; k < N_FIELD_KEYS; k++)
        if (PyUnicode_Compare(key, field_keys[k]) == 0)
            return k;
    return -1;
}

/* the entry as a dict, for an error message (`pairs` are the fields of one being read) */
static PyObject *shown_entry(PyObject *entry, PyObject **pairs, Py_ssize_t n) {
    if (entry)
        return Py_NewRef(entry);
    PyObject *dict = PyDict_New();
    for (Py_ssize_t i = 0; dict && i < n; i++)
        if (PyDict_SetItem(dict, pairs[2 * i], pairs[2 * i + 1]) < 0)
            Py_CLEAR(dict);
    return dict;
}

static int missing_action(Device *d, Py_ssize_t index, PyObject *entry, PyObject **pairs,
                          Py_ssize_t n) {
    PyObject *shown = shown_entry(entry, pairs, n);
    if (!shown)
        return -1;
    entry_error(d->device, index, NULL, "a trace entry must be a dict with an action, got {}",
                shown);
    Py_DECREF(shown);
    return -1;
}

/* One row from an entry's fields: `pairs` holds `n` (key, value) pairs with distinct keys,
 * borrowed; `entry` is the dict they came from, if any. *frames_out: the frames list the row
 * interned, borrowed (NULL for none). */
static int add_row(Device *d, Interned *t, PyObject **pairs, Py_ssize_t n, PyObject *entry,
                   PyObject **frames_out) {
    Py_ssize_t index = d->columns[C_ACTION].count;
    PyObject *found[N_FIELD_KEYS] = {NULL};
    PyObject *few[32], **seen = n <= 16 ? few : PyMem_Malloc((size_t)(2 * n) * sizeof(PyObject *));
    if (!seen) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = pairs[2 * i], *value = pairs[2 * i + 1];
        int k = field_key(key, t->own_strings);
        if (k >= 0)
            found[k] = value;
        if (k < 0 || k >= K_DEVICE_FREE) {
            seen[count++] = key;
            seen[count++] = value;
        }
    }
    int result = -1;
    PyObject *action = found[K_ACTION];
    *frames_out = NULL;
    if (!action || !PyUnicode_Check(action)) {
        missing_action(d, index, entry, pairs, n);
        goto done;
    }
    int code = -1;
    for (int a = 0; a < N_ACTIONS && code < 0; a++)     /* interned as the reader reads them */
        if (action == interned_actions[a])
            code = a;
    for (int a = 0; a < N_ACTIONS && code < 0; a++)
        if (PyUnicode_CompareWithASCIIString(action, ACTIONS[a]) == 0)
            code = a;
    if (code < 0) {
        entry_error(d->device, index, "action", "unknown action {}; PyTorch writes alloc, "
                    "free_requested, free_completed, segment_alloc, segment_free, "
                    "segment_map, segment_unmap, oom, snapshot, annotate, "
                    "workspace_snapshot", action);
        goto done;
    }
    uint8_t flags = 0;
    uint64_t addr, size, stream, requested, device_free;
    int present;
    /* PyTorch's oom entry carries the driver's free bytes in place of an address */
    int key = code == OOM && !found[K_ADDR] ? K_DEVICE_FREE : K_ADDR;
    if (integer_field(found[key], key, 1, key == K_ADDR ? &addr : &device_free, &present,
                      d->device, index) < 0)
        goto done;
    if (key == K_DEVICE_FREE)
        addr = 0;
    else
        flags |= HAS_ADDR;
    if (integer_field(found[K_SIZE], K_SIZE, 1, &size, &present, d->device, index) < 0)
        goto done;
    flags |= HAS_SIZE;
    if (integer_field(found[K_STREAM], K_STREAM, 0, &stream, &present, d->device, index) < 0)
        goto done;
    flags |= present ? HAS_STREAM : 0;
    if (key == K_ADDR && integer_field(found[K_DEVICE_FREE], K_DEVICE_FREE, 0, &device_free,
                                       &present, d->device, index) < 0)
        goto done;
    if (integer_field(found[K_REQUESTED], K_REQUESTED, 0, &requested, &present, d->device,
                      index) < 0)
        goto done;
    flags |= present ? HAS_REQUESTED : 0;
    if (check_pool_id(found[F_POOL_ID], d->device, index) < 0)
        goto done;
    /* time_us: a finite int or float; ints that fit 64 bits stay exact */
    union { int64_t i; double f; } when = {0};
    PyObject *time = found[K_TIME];
    if (time) {
        int ok = 0;
        if (PyFloat_CheckExact(time) || (PyFloat_Check(time))) {
            when.f = PyFloat_AS_DOUBLE(time);
            ok = isfinite(when.f);
            flags |= TIME_FLOAT;
        } else if (is_int(time)) {
            int overflow;
            long long x = PyLong_AsLongLongAndOverflow(time, &overflow);
            if (x == -1 && PyErr_Occurred())
                goto done;
            if (!overflow) {
                when.i = x;
                ok = 1;
            } else {
                when.f = PyLong_AsDouble(time);
                if (when.f == -1.0 && PyErr_Occurred())
                    PyErr_Clear();
                else
                    ok = isfinite(when.f);
                flags |= TIME_FLOAT;
            }
        }
        if (!ok) {
            entry_error(d->device, index, "time_us", "must be a finite number, got {}", time);
            goto done;
        }
        flags |= HAS_TIME;
    }
    uint32_t stack = 0, extra;
    PyObject *frames = found[K_FRAMES];
    if (frames && frames != Py_None) {
        if (intern_stack(t, frames, &stack, d->device, index) < 0)
            goto done;
        flags |= HAS_FRAMES;
        *frames_out = frames;
    }
    if (intern_extras(t, seen, count, &extra) < 0)
        goto done;
    uint8_t action_code = (uint8_t)code;
    const void *values[N_COLUMNS] = {&action_code, &flags, &addr, &size, &stream, &when,
                                     &requested, &stack, &extra};
    for (int c = 0; c < N_COLUMNS; c++)
        if (column_put(&d->columns[c], values[c]) < 0)
            goto done;
    result = 0;
done:
    if (seen != few)
        PyMem_Free(seen);
    return result;
}

/* One row from an entry dict (a pickle's own dict, or one read from JSON). */
static int add_entry(Device *d, Interned *t, PyObject *entry, PyObject **frames_out) {
    if (!PyDict_Check(entry))
        return missing_action(d, d->columns[C_ACTION].count, entry, NULL, 0);
    Py_ssize_t n = PyDict_GET_SIZE(entry), pos = 0, i = 0;
    PyObject *few[32], **pairs = n <= 16 ? few : PyMem_Malloc((size_t)(2 * n) * sizeof(PyObject *));
    if (!pairs) {
        PyErr_NoMemory();
        return -1;
    }
    while (i < n && PyDict_Next(entry, &pos, &pairs[2 * i], &pairs[2 * i + 1]))
        i++;
    int result = add_row(d, t, pairs, i, entry, frames_out);
    if (pairs != few)
        PyMem_Free(pairs);
    return result;
}

/* ---- the devices of one read ---- */

typedef struct {
    Device *devices;
    Py_ssize_t count, capacity;
    Interned interned;
} Reader;

static Device *reader_device(Reader *r) {
    Device *more = grow(r->devices, &r->capacity, r->count + 1, sizeof(Device), 4);
    if (!more)
        return NULL;
    r->devices = more;
    Device *d = &r->devices[r->count];
    memset(d, 0, sizeof *d);
    d->device = r->count;
    for (int c = 0; c < N_COLUMNS; c++)
        if (column_init(&d->columns[c], COLUMN_WIDTHS[c]) < 0)
            return NULL;
    r->count++;
    return d;
}

static void reader_clear(Reader *r) {
    for (Py_ssize_t i = 0; i < r->count; i++)
        for (int c = 0; c < N_COLUMNS; c++)
            Py_CLEAR(r->devices[i].columns[c].array);
    PyMem_Free(r->devices);
    r->devices = NULL;
    r->count = r->capacity = 0;
    interned_clear(&r->interned);
}

/* (devices, stacks, extras, cut): devices a list of dicts of column name -> bytearray */
static PyObject *reader_result(Reader *r) {
    PyObject *devices = PyList_New(r->count);
    if (!devices)
        return NULL;
    for (Py_ssize_t i = 0; i < r->count; i++) {
        PyObject *columns = PyDict_New();
        if (!columns) {
            Py_DECREF(devices);
            return NULL;
        }
        PyList_SET_ITEM(devices, i, columns);
        for (int c = 0; c < N_COLUMNS; c++) {
            PyObject *data = column_finish(&r->devices[i].columns[c]);
            if (!data || PyDict_SetItemString(columns, COLUMN_NAMES[c], data) < 0) {
                Py_DECREF(devices);
                return NULL;
            }
        }
    }
    return Py_BuildValue("(NOOn)", devices, r->interned.stacks, r->interned.extras,
                         r->interned.cut);
}

/* ---- the pickle machine ---- */

typedef struct {
    PyObject **items;
    Py_ssize_t size, capacity;
} Stack;

static int stack_push(Stack *s, PyObject *v) {             /* steals v */
    if (!v)
        return -1;
    PyObject **more = grow(s->items, &s->capacity, s->size + 1, sizeof(PyObject *), 64);
    if (!more) {
        Py_DECREF(v);
        return -1;
    }
    s->items = more;
    s->items[s->size++] = v;
    return 0;
}

typedef struct {
    Py_ssize_t *at;
    Py_ssize_t size, capacity;
} Marks;

typedef struct {
    const unsigned char *data;
    Py_ssize_t length, pos;
    Stack stack;
    Marks marks;
    Memo memo;
    /* the trace's lists: "device_traces"'s value, and each device's list in it */
    PyObject *traces;
    PyObject **device_lists;
    Py_ssize_t device_count, device_capacity;
    /* memo slots filled while a device list is open: entries and their frames lists are
     * replaced there once they are rows (the row's marker; the interned stack) */
    Py_ssize_t *pending;
    Py_ssize_t pending_size, pending_capacity;
    /* stands on the stack (and in the memo) for an entry read as a row, not a dict */
    PyObject *entry_marker;
    /* the entry being read without a dict: its (key, value) pairs, owned; where its marker
     * stands on the stack (-1: none); its device */
    PyObject **open_pairs;
    Py_ssize_t open_n, open_capacity, open_at;
    PyObject *open_index;       /* key -> its pair's number, once an entry has many fields */
    int open_device;
    /* objects the memo may hold that rows replaced since the last settle, and what stands for
     * them there: (object, replacement) pairs, owned */
    PyObject **settled;
    Py_ssize_t settled_size, settled_capacity;
    /* a file read a window at a time (else `data` is the whole pickle): the window holds the
     * bytes from `base` on; `data` is addressed by position in the file, `data + pos` */
    PyObject *source;
    unsigned char *window;
    Py_ssize_t base, capacity;
    int exhausted;
    Reader reader;
} Machine;

static void drop_from(Machine *m, Py_ssize_t from);

/* PUT, BINPUT, MEMOIZE: memo index `index` holds the top of the stack (a string or a pool
 * id: the first one of its value, which the stack then holds too; memo_by_value). */
static int memo_put(Machine *m, Py_ssize_t index) {
    if (index < 0 || index > m->memo.size + MEMO_SLACK)
        return unsafe("memo index %zd at byte %zd, with %zd memo entries: not a pickle a "
                      "pickler wrote", index, m->pos, m->memo.size);
    PyObject **top = &m->stack.items[m->stack.size - 1];
    PyObject *v = memo_canonical(&m->memo, *top);
    if (!v)
        return -1;
    if (v != *top)
        Py_SETREF(*top, Py_NewRef(v));
    if (memo_set(&m->memo, index, v) < 0)
        return -1;
    if (m->device_count && (PyDict_CheckExact(v) || PyList_CheckExact(v))) {
        Py_ssize_t *pending = grow(m->pending, &m->pending_capacity, m->pending_size + 1,
                                   sizeof(Py_ssize_t), 4096);
        if (!pending)
            return -1;
        m->pending = pending;
        m->pending[m->pending_size++] = index;
    }
    return 0;
}

static int device_of(Machine *m, PyObject *list) {
    for (Py_ssize_t i = m->device_count - 1; i >= 0; i--)
        if (m->device_lists[i] == list)
            return (int)i;
    return -1;
}

/* Keep (object, replacement) for the next settle: the memo slot that holds `object` will
 * hold `replacement` instead (both borrowed here). */
static int will_settle(Machine *m, PyObject *object, PyObject *replacement) {
    PyObject **more = grow(m->settled, &m->settled_capacity, m->settled_size + 2,
                           sizeof(PyObject *), 4096);
    if (!more)
        return -1;
    m->settled = more;
    m->settled[m->settled_size++] = Py_NewRef(object);
    m->settled[m->settled_size++] = Py_NewRef(replacement);
    return 0;
}

/* Whether two values are the same value: one object, or a str or int of one type and equal */
static int same_value(PyObject *a, PyObject *b) {
    if (a == b)
        return 1;
    if (Py_TYPE(a) != Py_TYPE(b) || !(PyUnicode_CheckExact(a) || PyLong_CheckExact(a)))
        return 0;
    int equal = PyObject_RichCompareBool(a, b, Py_EQ);        /* (str, int: cannot fail) */
    PyErr_Clear();
    return equal == 1;
}

/* Whether two frames are the same dict: one object, or the same keys in the same order with
 * the same values (content as a stack is interned by is looser: 1 and 1.0, keys reordered) */
static int same_frame(PyObject *a, PyObject *b) {
    if (a == b)
        return 1;
    if (!PyDict_CheckExact(a) || !PyDict_CheckExact(b) || PyDict_GET_SIZE(a) != PyDict_GET_SIZE(b))
        return 0;
    Py_ssize_t i = 0, j = 0;
    PyObject *key_a, *value_a, *key_b, *value_b;
    while (PyDict_Next(a, &i, &key_a, &value_a))
        if (!PyDict_Next(b, &j, &key_b, &value_b) || !same_value(key_a, key_b)
            || !same_value(value_a, value_b))
            return 0;
    return 1;
}

/* The row just added to `d` interned the list `frames` (borrowed; may be NULL). Where the
 * kept stack is the same list of the same frames, its memo slot will hold the kept one, so the
 * memo keeps no list per entry alive; each frame the same as the kept one's will be that one
 * (a writer that copies every frame memoizes each copy). A GET of either later gives what
 * pickle.loads gives, but for identity. */
static int settle_frames(Machine *m, Device *d, PyObject *frames) {
    if (!frames || !PyList_CheckExact(frames))
        return 0;
    uint32_t stack = column_last_u32(&d->columns[C_STACK]);
    PyObject *kept = PyList_GET_ITEM(m->reader.interned.stacks, stack);
    Py_ssize_t n = PyList_GET_SIZE(kept);
    int same = n == PyList_GET_SIZE(frames);          /* (not a stack cut at MAX_FRAMES) */
    for (Py_ssize_t i = 0; i < n && i < PyList_GET_SIZE(frames); i++) {
        PyObject *copy = PyList_GET_ITEM(frames, i), *frame = PyList_GET_ITEM(kept, i);
        if (copy == frame)
            continue;
        if (!same_frame(copy, frame))
            same = 0;
        else if (will_settle(m, copy, frame) < 0)
            return -1;
    }
    return same ? will_settle(m, frames, kept) : 0;
}

/* After rows were taken: memo slots filled since the last settle that hold an object a row
 * replaced (an entry dict, a frames list) now hold its replacement. The objects are found by
 * address in a small open-addressing table (`settled` keeps them alive until this returns). */
static int settle_pending(Machine *m) {
    Py_ssize_t count = m->settled_size / 2;
    if (m->pending_size && count) {
        Py_ssize_t size = 16;
        while (size < 4 * count)
            size *= 2;
        PyObject **table = PyMem_Calloc(size, 2 * sizeof(PyObject *));  /* key, value */
        if (!table) {
            PyErr_NoMemory();
            return -1;
        }
        Py_ssize_t mask = size - 1;
#define SLOT_OF(p) ((Py_ssize_t)(((uintptr_t)(p) >> 4) * 11400714819323198485ULL >> 20) & mask)
        for (Py_ssize_t e = 0; e < count; e++) {
            PyObject *key = m->settled[2 * e];
            Py_ssize_t i = SLOT_OF(key);
            while (table[2 * i] && table[2 * i] != key)
                i = (i + 1) & mask;
            table[2 * i] = key;
            table[2 * i + 1] = m->settled[2 * e + 1];
        }
        for (Py_ssize_t p = 0; p < m->pending_size; p++) {
            Py_ssize_t slot = m->pending[p];
            PyObject *v = memo_get(&m->memo, slot);
            if (!v || v == m->entry_marker)
                continue;
            Py_ssize_t i = SLOT_OF(v);
            while (table[2 * i] && table[2 * i] != v)
                i = (i + 1) & mask;
            if (table[2 * i] && memo_set(&m->memo, slot, table[2 * i + 1]) < 0) {
                PyMem_Free(table);
                return -1;
            }
        }
#undef SLOT_OF
        PyMem_Free(table);
    }
    m->pending_size = 0;
    while (m->settled_size)
        Py_DECREF(m->settled[--m->settled_size]);
    return 0;
}

/* Rows from entry dicts appended to device list `device`. */
static int take_entries(Machine *m, int device, PyObject **entries, Py_ssize_t count) {
    Device *d = &m->reader.devices[device];
    for (Py_ssize_t e = 0; e < count; e++) {
        PyObject *frames;
        if (add_entry(d, &m->reader.interned, entries[e], &frames) < 0 ||
            will_settle(m, entries[e], m->entry_marker) < 0 || settle_frames(m, d, frames) < 0)
            return -1;
    }
    return 0;
}

/* ---- entries read as rows, without a dict ----
 * An empty dict pushed where the next item of a device's list goes (what pickle.dump writes
 * for each entry) is not made: the marker stands for it, its fields are collected as the
 * pickle sets them, and it becomes a row when the next entry begins or the list takes it.
 * The marker is never copied (DUP and GET of it are refused), so each marker a device's list
 * takes is one row; a marker that never reaches its list leaves a row staged, and the read is
 * refused at its end. */

/* The device whose list the next pushed item goes to, or -1. */
static int entry_position(Machine *m) {
    Stack *s = &m->stack;
    Py_ssize_t floor = m->marks.size ? m->marks.at[m->marks.size - 1] : 0;
    int device = -1;
    if (!m->device_count)
        return -1;
    if (s->size > floor && PyList_CheckExact(s->items[s->size - 1]))       /* for APPEND */
        device = device_of(m, s->items[s->size - 1]);
    if (device < 0 && floor >= 1 && PyList_CheckExact(s->items[floor - 1]))  /* for APPENDS */
        device = device_of(m, s->items[floor - 1]);
    return device;
}

static void drop_open(Machine *m) {
    Py_CLEAR(m->open_index);
    for (Py_ssize_t i = 0; i < 2 * m->open_n; i++)
        Py_DECREF(m->open_pairs[i]);
    m->open_n = 0;
    m->open_at = -1;
}

/* The open entry becomes a row of its device (staged until its list takes its marker). */
static int close_open(Machine *m) {
    if (m->open_at < 0)
        return 0;
    Device *d = &m->reader.devices[m->open_device];
    PyObject *frames;
    int result = add_row(d, &m->reader.interned, m->open_pairs, m->open_n, NULL, &frames);
    if (result == 0) {
        d->staged++;
        result = settle_frames(m, d, frames);
    }
    drop_open(m);
    return result;
}

static int open_entry(Machine *m, int device) {
    if (close_open(m) < 0 || stack_push(&m->stack, Py_NewRef(m->entry_marker)) < 0)
        return -1;
    m->open_at = m->stack.size - 1;
    m->open_device = device;
    return 0;
}

/* Which pair of the open entry has `key` (open_n: none yet). A known name is always the
 * reader's object (known_string), so identity finds it; another key may equal one that is not
 * the same object, so it is compared with the other unknown ones, and past 16 fields found in
 * a dict, as a dict would find it (a hostile entry of many fields costs no n^2 compares). */
static Py_ssize_t open_slot(Machine *m, PyObject *key) {
    if (!m->open_index && m->open_n >= 16) {
        if (!(m->open_index = PyDict_New()))
            return -1;
        for (Py_ssize_t i = 0; i < m->open_n; i++) {
            PyObject *number = PyLong_FromSsize_t(i);
            int failed = !number || PyDict_SetItem(m->open_index, m->open_pairs[2 * i], number) < 0;
            Py_XDECREF(number);
            if (failed)
                return -1;
        }
    }
    if (m->open_index) {
        PyObject *number = PyDict_GetItemWithError(m->open_index, key);
        if (!number)
            return PyErr_Occurred() ? -1 : m->open_n;
        return PyLong_AsSsize_t(number);
    }
    int known = field_key(key, 1) >= 0;
    for (Py_ssize_t at = 0; at < m->open_n; at++) {
        PyObject *other = m->open_pairs[2 * at];
        if (other == key)
            return at;
        if (known || field_key(other, 1) >= 0)
            continue;
        int equal = PyObject_RichCompareBool(other, key, Py_EQ);    /* plain data only */
        if (equal < 0)
            return -1;
        if (equal)
            return at;
    }
    return m->open_n;
}

/* SETITEMS into the open entry: the pairs above `from`, a key set twice keeping its last value
 * as a dict would. */
static int fill_open(Machine *m, Py_ssize_t from) {
    if (from - 1 != m->open_at)
        return unsafe("a trace entry is filled after the next one began (byte %zd): not laid "
                      "out as pickle.dump writes a snapshot", m->pos);
    for (Py_ssize_t i = from; i < m->stack.size; i += 2) {
        PyObject *key = m->stack.items[i], *value = m->stack.items[i + 1];
        if (!PyUnicode_CheckExact(key) && PyObject_Hash(key) == -1) {
            PyErr_Clear();
            return unsafe("a damaged pickle: an unhashable dict key at byte %zd", m->pos);
        }
        Py_ssize_t at = open_slot(m, key);
        if (at < 0)
            return -1;
        if (at == m->open_n) {
            PyObject **more = grow(m->open_pairs, &m->open_capacity, 2 * (m->open_n + 1),
                                   sizeof(PyObject *), 32);
            if (!more)
                return -1;
            m->open_pairs = more;
            m->open_pairs[2 * at] = Py_NewRef(key);
            m->open_pairs[2 * at + 1] = Py_NewRef(value);
            m->open_n++;
            if (m->open_index) {
                PyObject *number = PyLong_FromSsize_t(at);
                int failed = !number || PyDict_SetItem(m->open_index, key, number) < 0;
                Py_XDECREF(number);
                if (failed)
                    return -1;
            }
        } else
            Py_SETREF(m->open_pairs[2 * at + 1], Py_NewRef(value));
    }
    drop_from(m, from);
    return 0;
}

/* A device's list takes `count` items: markers (rows staged, in order) or entry dicts. A
 * dict among markers would need its row between staged ones: refused, as no pickler writes
 * that (an item that is no dict at all is named as the entry error it is). */
static int device_takes(Machine *m, int device, PyObject **items, Py_ssize_t count) {
    if (close_open(m) < 0)
        return -1;
    Device *d = &m->reader.devices[device];
    for (Py_ssize_t i = 0; i < count; i++) {
        if (items[i] == m->entry_marker) {
            if (d->staged == 0)
                return unsafe("device_traces[%d] takes a trace entry twice (byte %zd)", device,
                              m->pos);
            d->staged--;
            continue;
        }
        if (d->staged && PyDict_Check(items[i]))
            return unsafe("device_traces[%d] mixes entries written two ways (byte %zd): not "
                          "laid out as pickle.dump writes a snapshot", device, m->pos);
        if (d->staged)
            return missing_action(d, d->columns[C_ACTION].count - d->staged, items[i], NULL, 0);
        if (take_entries(m, device, items + i, 1) < 0)
            return -1;
    }
    return settle_pending(m);
}

/* A new list was pushed: is it device_traces's value, or a device's list in it? */
static int note_new_list(Machine *m, PyObject *list) {
    Stack *s = &m->stack;
    Py_ssize_t top = s->size - 1;                             /* the list itself */
    if (!m->traces) {
        /* right after the key "device_traces" of the outermost dict */
        int key_place = m->marks.size == 0 ? top == 2
                        : m->marks.size == 1 && m->marks.at[0] == 1 && top >= 2 && top % 2 == 0;
        if (key_place && PyDict_CheckExact(s->items[0]) && PyUnicode_Check(s->items[top - 1]) &&
            PyUnicode_CompareWithASCIIString(s->items[top - 1], "device_traces") == 0)
            m->traces = list;
        return 0;
    }
    /* a list inside the traces list: under its mark, or right above it */
    Py_ssize_t mark = m->marks.size ? m->marks.at[m->marks.size - 1] : 0;
    int inside = top >= 1 && ((mark >= 1 && s->items[mark - 1] == m->traces) ||
                              s->items[top - 1] == m->traces);
    if (!inside)
        return 0;
    PyObject **more = grow(m->device_lists, &m->device_capacity, m->device_count + 1,
                           sizeof(PyObject *), 4);
    if (!more)
        return -1;
    m->device_lists = more;
    m->device_lists[m->device_count++] = list;
    return reader_device(&m->reader) ? 0 : -1;
}

#define WINDOW ((Py_ssize_t)16 << 20)

/* The window moved to the unread bytes and filled from the file: at least `n` bytes past
 * `pos` unless the file ends first. It grows only for an item larger than itself. */
static int refill(Machine *m, Py_ssize_t n) {
    Py_ssize_t unread = m->length - m->pos;
    memmove(m->window, m->data + m->pos, (size_t)unread);
    m->base = m->pos;
    while (!m->exhausted && (unread < n || unread < m->capacity)) {
        if (unread == m->capacity) {
            unsigned char *more = PyMem_Realloc(m->window, (size_t)(2 * m->capacity));
            if (!more) {
                PyErr_NoMemory();
                return -1;
            }
            m->window = more;
            m->capacity *= 2;
        }
        Py_ssize_t count = read_into(m->source, (char *)m->window + unread,
                                     m->capacity - unread);
        if (count < 0)
            return -1;
        m->exhausted = count == 0;
        unread += count;
    }
    /* positions stay the file's: data + pos is the window's byte for position pos */
    m->data = (const unsigned char *)((uintptr_t)m->window - (uintptr_t)m->base);
    m->length = m->base + unread;
    return 0;
}

static int need(Machine *m, Py_ssize_t n) {
    if (n >= 0 && m->length - m->pos < n && m->source && !m->exhausted && refill(m, n) < 0)
        return -1;
    if (n < 0)
        return unsafe("a damaged pickle: an item of a negative length at byte %zd", m->pos);
    if (m->pos >= m->length && m->length - m->pos < n)
        return unsafe("a truncated pickle: it ends at byte %zd, before its end (the STOP "
                      "opcode)", m->length);
    if (m->length - m->pos < n)
        return unsafe("a truncated pickle: it ends at byte %zd, inside an item of %zd bytes "
                      "that starts at byte %zd", m->length, n, m->pos);
    return 0;
}

static uint64_t read_le(const unsigned char *p, int n) {
    uint64_t x = 0;
    for (int i = n - 1; i >= 0; i--)
        x = (x << 8) | p[i];
    return x;
}

/* a newline-ended argument (protocol 0): its length, without the newline */
static Py_ssize_t line_length(Machine *m) {
    const unsigned char *end = memchr(m->data + m->pos, '\n', m->length - m->pos);
    while (!end && m->source && !m->exhausted) {
        if (refill(m, m->length - m->pos + 1) < 0)
            return -1;
        end = memchr(m->data + m->pos, '\n', m->length - m->pos);
    }
    const unsigned char *start = m->data + m->pos;
    if (!end) {
        unsafe("a truncated pickle: a line at byte %zd has no end", m->pos);
        return -1;
    }
    return end - start;
}

static Py_ssize_t pop_mark(Machine *m) {
    if (m->marks.size == 0) {
        unsafe("a damaged pickle: no mark to close at byte %zd", m->pos);
        return -1;
    }
    return m->marks.at[--m->marks.size];
}

static int check_stack(Machine *m, Py_ssize_t n) {
    Py_ssize_t floor = m->marks.size ? m->marks.at[m->marks.size - 1] : 0;
    if (m->stack.size - floor < n)
        return unsafe("a damaged pickle: its stack underflows at byte %zd", m->pos);
    return 0;
}

static void drop_from(Machine *m, Py_ssize_t from) {
    while (m->stack.size > from)
        Py_DECREF(m->stack.items[--m->stack.size]);
}

static int append_items(Machine *m, Py_ssize_t from) {
    if (from < 1)
        return unsafe("a damaged pickle: APPENDS with no list at byte %zd", m->pos);
    PyObject *target = m->stack.items[from - 1];
    Py_ssize_t count = m->stack.size - from;
    PyObject **items = m->stack.items + from;
    int device = PyList_CheckExact(target) ? device_of(m, target) : -1;
    int result = 0;
    if (device >= 0)
        result = device_takes(m, device, items, count);
    else if (PyList_Check(target)) {
        for (Py_ssize_t i = 0; i < count && result == 0; i++)
            result = PyList_Append(target, items[i]);
    } else if (PyAnySet_Check(target)) {
        for (Py_ssize_t i = 0; i < count && result == 0; i++)
            result = PySet_Add(target, items[i]);
    } else
        result = unsafe("it appends to a %s: not plain data", Py_TYPE(target)->tp_name);
    drop_from(m, from);
    if (result < 0 && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        return unsafe("a damaged pickle: an unhashable set item at byte %zd", m->pos);
    }
    return result;
}

static int set_items(Machine *m, Py_ssize_t from) {
    if (from < 1 || (m->stack.size - from) % 2)
        return unsafe("a damaged pickle: SETITEMS out of step at byte %zd", m->pos);
    PyObject *target = m->stack.items[from - 1];
    if (target == m->entry_marker)
        return fill_open(m, from);
    if (!PyDict_Check(target))
        return unsafe("it sets items of a %s: not plain data", Py_TYPE(target)->tp_name);
    int result = 0;
    for (Py_ssize_t i = from; i < m->stack.size && result == 0; i += 2)
        result = PyDict_SetItem(target, m->stack.items[i], m->stack.items[i + 1]);
    drop_from(m, from);
    if (result < 0 && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        return unsafe("a damaged pickle: an unhashable dict key at byte %zd", m->pos);
    }
    return result;
}

static PyObject *tuple_from(Machine *m, Py_ssize_t from) {
    Py_ssize_t n = m->stack.size - from;
    PyObject *t = PyTuple_New(n);
    if (!t)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(t, i, m->stack.items[from + i]);     /* moves the references */
    m->stack.size = from;
    return t;
}

static PyObject *refused(const char *what) {
    unsafe("%s; a memory snapshot holds only plain data, so npumem does not load it (it could "
           "run code)", what);
    return NULL;
}

/* A name taken from the file, fit for a message: a string with no UTF-8 form (a lone
 * surrogate) has its surrogates escaped, so that printing the message cannot fail; a
 * new reference, or NULL with an error set (memory only). */
static PyObject *printable(PyObject *text) {
    PyObject *bytes = PyUnicode_AsEncodedString(text, "utf-8", "backslashreplace");
    if (!bytes)
        return NULL;
    PyObject *shown = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes),
                                           "strict");
    Py_DECREF(bytes);
    return shown;
}

/* refused() of a message built from the file's names: the read ends with UnsafePickle, or
 * with MemoryError where even the message could not be made. Never formats NULL. */
static void refused_what(PyObject *what) {
    PyObject *shown = what ? printable(what) : NULL;
    if (!shown) {
        if (what && !PyErr_ExceptionMatches(PyExc_MemoryError)) {
            PyErr_Clear();
            refused("it asks for a class or function");
        }
        return;
    }
    unsafe("%U; a memory snapshot holds only plain data, so npumem does not load it (it could "
           "run code)", shown);
    Py_DECREF(shown);
}

#define d (m->data)                 /* (a window moves as it refills) */
static int run(Machine *m, PyObject **result) {
    for (;;) {
        if (need(m, 1) < 0)
            return -1;
        unsigned char op = d[m->pos++];
        PyObject *v = NULL;
        Py_ssize_t n, from;
        switch (op) {
        case 0x80:                                            /* PROTO */
            if (need(m, 1) < 0)
                return -1;
            if (d[m->pos] > 5)
                return unsafe("pickle protocol %d is newer than this reader knows", d[m->pos]);
            m->pos++;
            continue;
        case 0x95:                                            /* FRAME: a length; data follows */
            if (need(m, 8) < 0)
                return -1;
            m->pos += 8;
            continue;
        case '.':                                             /* STOP */
            if (close_open(m) < 0)
                return -1;
            for (Py_ssize_t i = 0; i < m->reader.count; i++)
                if (m->reader.devices[i].staged)
                    return unsafe("%zd trace entries of device_traces[%zd] never reach its "
                                  "list: not laid out as pickle.dump writes a snapshot",
                                  m->reader.devices[i].staged, i);
            if (m->stack.size != 1 || m->marks.size)
                return unsafe("a damaged pickle: it ends with %zd objects on its stack",
                              m->stack.size);
            *result = m->stack.items[--m->stack.size];
            return 0;
        case '(':                                             /* MARK */
            {
                Py_ssize_t *at = grow(m->marks.at, &m->marks.capacity, m->marks.size + 1,
                                      sizeof(Py_ssize_t), 64);
                if (!at)
                    return -1;
                m->marks.at = at;
            }
            m->marks.at[m->marks.size++] = m->stack.size;
            continue;
        case '0':                                             /* POP */
            if (m->marks.size && m->marks.at[m->marks.size - 1] == m->stack.size) {
                m->marks.size--;                              /* POP of a mark, as pickle does */
                continue;
            }
            if (check_stack(m, 1) < 0)
                return -1;
            drop_from(m, m->stack.size - 1);
            continue;
        case '1':                                             /* POP_MARK */
            if ((from = pop_mark(m)) < 0)
                return -1;
            drop_from(m, from);
            continue;
        case '2':                                             /* DUP */
            if (check_stack(m, 1) < 0)
                return -1;
            v = m->stack.items[m->stack.size - 1];
            if (v == m->entry_marker)
                return unsafe("it copies a trace entry (DUP at byte %zd): a snapshot pickle "
                              "has each entry once", m->pos);
            Py_INCREF(v);
            break;
        case 'N': v = Py_NewRef(Py_None); break;
        case 0x88: v = Py_NewRef(Py_True); break;
        case 0x89: v = Py_NewRef(Py_False); break;
        case 'K':                                             /* BININT1 */
            if (need(m, 1) < 0)
                return -1;
            v = PyLong_FromLong(d[m->pos]);
            m->pos += 1;
            break;
        case 'M':                                             /* BININT2 */
            if (need(m, 2) < 0)
                return -1;
            v = PyLong_FromLong((long)read_le(d + m->pos, 2));
            m->pos += 2;
            break;
        case 'J':                                             /* BININT */
            if (need(m, 4) < 0)
                return -1;
            v = PyLong_FromLong((long)(int32_t)read_le(d + m->pos, 4));
            m->pos += 4;
            break;
        case 0x8a:                                            /* LONG1 */
        case 0x8b:                                            /* LONG4 */
            n = op == 0x8a ? 1 : 4;
            if (need(m, n) < 0)
                return -1;
            {
                int64_t size = op == 0x8a ? d[m->pos] : (int32_t)read_le(d + m->pos, 4);
                m->pos += n;
                if (size < 0)
                    return unsafe("a damaged pickle: a negative length at byte %zd", m->pos);
                if (size > 4000)              /* past Python's 4,300-digit int limit anyway */
                    return unsafe("an integer of %lld bytes at byte %zd", (long long)size, m->pos);
                if (need(m, size) < 0)
                    return -1;
                v = size == 0 ? PyLong_FromLong(0)
                    : _PyLong_FromByteArray(d + m->pos, (size_t)size, 1, 1);
                m->pos += size;
            }
            break;
        case 'I':                                             /* INT (text) */
        case 'L':                                             /* LONG (text) */
            if ((n = line_length(m)) < 0)
                return -1;
            {
                PyObject *text = PyUnicode_DecodeASCII((const char *)d + m->pos, n, "strict");
                m->pos += n + 1;
                if (!text)
                    return unsafe("a damaged pickle: a number that is not ASCII");
                Py_ssize_t len = PyUnicode_GET_LENGTH(text);
                if (op == 'I' && len == 2 && PyUnicode_READ_CHAR(text, 0) == '0' &&
                    (PyUnicode_READ_CHAR(text, 1) == '0' || PyUnicode_READ_CHAR(text, 1) == '1')) {
                    v = Py_NewRef(PyUnicode_READ_CHAR(text, 1) == '1' ? Py_True : Py_False);
                } else {
                    if (op == 'L' && len && PyUnicode_READ_CHAR(text, len - 1) == 'L')
                        Py_SETREF(text, PyUnicode_Substring(text, 0, len - 1));
                    v = text ? PyLong_FromUnicodeObject(text, 10) : NULL;
                    if (!v && PyErr_ExceptionMatches(PyExc_ValueError)) {
                        PyErr_Clear();
                        Py_XDECREF(text);
                        return unsafe("a damaged pickle: a bad integer at byte %zd", m->pos);
                    }
                }
                Py_XDECREF(text);
            }
            break;
        case 'F':                                             /* FLOAT (text) */
            if ((n = line_length(m)) < 0)
                return -1;
            {
                char buffer[64];
                if (n >= (Py_ssize_t)sizeof buffer)
                    return unsafe("a damaged pickle: a float of %zd characters", n);
                memcpy(buffer, d + m->pos, n);
                buffer[n] = 0;
                m->pos += n + 1;
                double x = PyOS_string_to_double(buffer, NULL, NULL);
                if (x == -1.0 && PyErr_Occurred()) {
                    PyErr_Clear();
                    return unsafe("a damaged pickle: a bad float at byte %zd", m->pos);
                }
                v = PyFloat_FromDouble(x);
            }
            break;
        case 'G':                                             /* BINFLOAT */
            if (need(m, 8) < 0)
                return -1;
#if PY_VERSION_HEX >= 0x030B0000
            v = PyFloat_FromDouble(PyFloat_Unpack8((const char *)d + m->pos, 0));
#else
            v = PyFloat_FromDouble(_PyFloat_Unpack8(d + m->pos, 0));
#endif
            m->pos += 8;
            break;
        case 0x8c: case 'X': case 0x8d:                       /* str: 1, 4, 8-byte length */
        case 'U': case 'T':                                   /* py2 str: decoded as ASCII */
        case 'C': case 'B': case 0x8e: case 0x96:             /* bytes, bytearray */
            n = (op == 0x8c || op == 'U' || op == 'C') ? 1 : (op == 0x8d || op == 0x8e ||
                                                            op == 0x96) ? 8 : 4;
            if (need(m, n) < 0)
                return -1;
            {
                uint64_t size = read_le(d + m->pos, (int)n);
                m->pos += n;
                if (op == 'T' && (int32_t)size < 0)
                    return unsafe("a damaged pickle: a negative length at byte %zd", m->pos);
                if (size > (uint64_t)PY_SSIZE_T_MAX - 1)
                    return need(m, -1);
                if (need(m, (Py_ssize_t)size) < 0)
                    return -1;
                const char *p = (const char *)d + m->pos;
                m->pos += (Py_ssize_t)size;
                int text = op == 0x8c || op == 'X' || op == 0x8d || op == 'U' || op == 'T';
                /* an entry's keys and actions as the reader's own objects: its fields are then
                 * found by identity, where each lookup compared the text */
                v = text ? known_string(p, (Py_ssize_t)size) : NULL;
                if (v)
                    ;
                else if (op == 0x8c || op == 'X' || op == 0x8d)
                    v = PyUnicode_DecodeUTF8(p, (Py_ssize_t)size, "surrogatepass");
                else if (text)
                    v = PyUnicode_DecodeASCII(p, (Py_ssize_t)size, "strict");
                else if (op == 0x96)
                    v = PyByteArray_FromStringAndSize(p, (Py_ssize_t)size);
                else
                    v = PyBytes_FromStringAndSize(p, (Py_ssize_t)size);
                if (!v && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                    PyErr_Clear();
                    return unsafe("a damaged pickle: a string that does not decode at byte %zd",
                                  m->pos);
                }
            }
            break;
        case 'V':                                             /* UNICODE (text) */
            if ((n = line_length(m)) < 0)
                return -1;
            v = PyUnicode_DecodeRawUnicodeEscape((const char *)d + m->pos, n, "strict");
            m->pos += n + 1;
            if (!v) {
                PyErr_Clear();
                return unsafe("a damaged pickle: a string that does not decode at byte %zd",
                              m->pos);
            }
            {                            /* a known name as the reader's object, as above */
                Py_ssize_t size;
                const char *utf8 = PyUnicode_AsUTF8AndSize(v, &size);
                PyObject *own = utf8 ? known_string(utf8, size) : NULL;
                PyErr_Clear();           /* (surrogates: no UTF-8, and no known name) */
                if (own)
                    Py_SETREF(v, own);
            }
            break;
        case 'S':
            return unsafe("a protocol-0 byte string at byte %zd: a memory snapshot has none",
                          m->pos);
        case ']': v = PyList_New(0); break;
        case '}':                                             /* EMPTY_DICT */
            {
                int device = entry_position(m);
                if (device >= 0) {
                    if (open_entry(m, device) < 0)
                        return -1;
                    continue;
                }
            }
            v = PyDict_New();
            break;
        case ')': v = PyTuple_New(0); break;
        case 0x8f: v = PySet_New(NULL); break;
        case 'l':                                             /* LIST */
        case 't':                                             /* TUPLE */
        case 'd':                                             /* DICT */
        case 0x91:                                            /* FROZENSET */
            if ((from = pop_mark(m)) < 0)
                return -1;
            if (op == 'd') {
                if ((m->stack.size - from) % 2)
                    return unsafe("a damaged pickle: DICT with an odd count at byte %zd", m->pos);
                v = PyDict_New();
                int failed = !v;
                for (Py_ssize_t i = from; i < m->stack.size && !failed; i += 2)
                    failed = PyDict_SetItem(v, m->stack.items[i], m->stack.items[i + 1]) < 0;
                drop_from(m, from);
                if (failed) {
                    Py_XDECREF(v);
                    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
                        PyErr_Clear();
                        return unsafe("a damaged pickle: an unhashable dict key at byte %zd",
                                      m->pos);
                    }
                    return -1;
                }
                break;
            }
            v = tuple_from(m, from);
            if (v && op == 0x91) {
                Py_SETREF(v, PyFrozenSet_New(v));
                if (!v && PyErr_ExceptionMatches(PyExc_TypeError)) {
                    PyErr_Clear();
                    return unsafe("a damaged pickle: an unhashable set item at byte %zd", m->pos);
                }
            }
            else if (v && op == 'l') {
                /* a list built from a mark: pushed empty, then its items appended, so a
                 * device's list gets its entries as rows */
                PyObject *items = v;
                if (stack_push(&m->stack, PyList_New(0)) < 0 ||
                    note_new_list(m, m->stack.items[m->stack.size - 1]) < 0) {
                    Py_DECREF(items);
                    return -1;
                }
                Py_ssize_t count = PyTuple_GET_SIZE(items);
                for (Py_ssize_t i = 0; i < count; i++)
                    if (stack_push(&m->stack, Py_NewRef(PyTuple_GET_ITEM(items, i))) < 0) {
                        Py_DECREF(items);
                        return -1;
                    }
                Py_DECREF(items);
                if (append_items(m, m->stack.size - count) < 0)
                    return -1;
                continue;
            }
            break;
        case 0x85: case 0x86: case 0x87:                      /* TUPLE1..3 */
            n = op - 0x84;
            if (check_stack(m, n) < 0)
                return -1;
            v = tuple_from(m, m->stack.size - n);
            break;
        case 'a':                                             /* APPEND */
            if (check_stack(m, 1) < 0)
                return -1;
            if (append_items(m, m->stack.size - 1) < 0)
                return -1;
            continue;
        case 'e':                                             /* APPENDS */
        case 0x90:                                            /* ADDITEMS */
            if ((from = pop_mark(m)) < 0 || append_items(m, from) < 0)
                return -1;
            continue;
        case 's':                                             /* SETITEM */
            if (check_stack(m, 2) < 0 || set_items(m, m->stack.size - 2) < 0)
                return -1;
            continue;
        case 'u':                                             /* SETITEMS */
            if ((from = pop_mark(m)) < 0 || set_items(m, from) < 0)
                return -1;
            continue;
        case 'g': case 'h': case 'j':                         /* GET, BINGET, LONG_BINGET */
        case 'p': case 'q': case 'r': case 0x94:              /* PUT, BINPUT, LONG_BINPUT, MEMOIZE */
            {
                Py_ssize_t index;
                if (op == 'g' || op == 'p') {
                    if ((n = line_length(m)) < 0)
                        return -1;
                    char buffer[24];
                    if (n == 0 || n >= (Py_ssize_t)sizeof buffer)
                        return unsafe("a damaged pickle: a bad memo index at byte %zd", m->pos);
                    memcpy(buffer, d + m->pos, n);
                    buffer[n] = 0;
                    char *end;
                    long long x = strtoll(buffer, &end, 10);
                    if (*end || x < 0)
                        return unsafe("a damaged pickle: a bad memo index at byte %zd", m->pos);
                    index = (Py_ssize_t)x;
                    m->pos += n + 1;
                } else if (op == 0x94)
                    index = m->memo.size;
                else {
                    n = (op == 'h' || op == 'q') ? 1 : 4;
                    if (need(m, n) < 0)
                        return -1;
                    index = (Py_ssize_t)read_le(d + m->pos, (int)n);
                    m->pos += n;
                }
                if (op == 'g' || op == 'h' || op == 'j') {
                    PyObject *held = memo_get(&m->memo, index);
                    if (!held)
                        return unsafe("a damaged pickle: memo index %zd was never set (byte %zd)",
                                      index, m->pos);
                    if (held == m->entry_marker)
                        return unsafe("it refers back to a trace entry (memo index %zd): a "
                                      "snapshot pickle has each entry once", index);
                    v = Py_NewRef(held);
                    break;
                }
                if (check_stack(m, 1) < 0)
                    return -1;
                if (memo_put(m, index) < 0)
                    return -1;
                continue;
            }
        case 'c': case 0x93:
            {
                /* name what it asks for, as the message a user sees */
                PyObject *what = NULL;
                if (op == 'c') {
                    Py_ssize_t a = line_length(m);
                    PyObject *module = a >= 0 ? PyUnicode_DecodeLatin1(
                        (const char *)d + m->pos, a, NULL) : NULL;
                    if (module) {
                        m->pos += a + 1;
                        Py_ssize_t b = line_length(m);
                        PyObject *name = b >= 0 ? PyUnicode_DecodeLatin1(
                            (const char *)d + m->pos, b, NULL) : NULL;
                        if (name)
                            what = PyUnicode_FromFormat("it asks for %U.%U", module, name);
                        Py_XDECREF(name);
                    }
                    Py_XDECREF(module);
                    if (PyErr_Occurred() && !PyErr_ExceptionMatches(UnsafePickle))
                        return -1;            /* the file's own error (a limit, a damaged gzip) */
                    PyErr_Clear();
                } else if (m->stack.size >= 2 && PyUnicode_Check(m->stack.items[m->stack.size - 2])
                           && PyUnicode_Check(m->stack.items[m->stack.size - 1]))
                    what = PyUnicode_FromFormat("it asks for %U.%U",
                                                m->stack.items[m->stack.size - 2],
                                                m->stack.items[m->stack.size - 1]);
                if (!what) {
                    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_MemoryError))
                        PyErr_Clear();
                    if (PyErr_Occurred())
                        return -1;
                    refused("it asks for a class or function");
                    return -1;
                }
                refused_what(what);
                Py_DECREF(what);
                return -1;
            }
        case 'R': case 'b': case 'i': case 'o': case 0x81: case 0x92:
        case 0x82: case 0x83: case 0x84: case 'P': case 'Q': case 0x97: case 0x98:
            refused("it builds objects with code (an opcode past plain data)");
            return -1;
        default:
            return unsafe("a damaged pickle: opcode 0x%02x at byte %zd is not one", op, m->pos - 1);
        }
        if (!v)
            return -1;
        if (stack_push(&m->stack, v) < 0)
            return -1;
        if (PyList_CheckExact(v) && note_new_list(m, v) < 0)
            return -1;
    }
}

#undef d

static void machine_clear(Machine *m) {
    drop_from(m, 0);
    PyMem_Free(m->stack.items);
    PyMem_Free(m->marks.at);
    memo_clear(&m->memo);
    PyMem_Free(m->device_lists);
    PyMem_Free(m->pending);
    drop_open(m);
    PyMem_Free(m->open_pairs);
    while (m->settled_size)
        Py_DECREF(m->settled[--m->settled_size]);
    PyMem_Free(m->settled);
    Py_XDECREF(m->entry_marker);
    PyMem_Free(m->window);
    reader_clear(&m->reader);
}

/* load(data, window=16 MiB): bytes or another buffer holding the whole pickle; or a binary
 * file, read `window` bytes at a time with its readinto (its errors are passed on). */
static PyObject *load(PyObject *self, PyObject *args) {
    PyObject *arg;
    Py_ssize_t window = WINDOW;
    if (!PyArg_ParseTuple(args, "O|n", &arg, &window))
        return NULL;
    if (window < 1) {
        PyErr_SetString(PyExc_ValueError, "window: at least 1 byte");
        return NULL;
    }
    Py_buffer view = {0};
    Machine m;
    memset(&m, 0, sizeof m);
    m.open_at = -1;
    if (PyObject_CheckBuffer(arg)) {
        if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
            return NULL;
        m.data = view.buf;
        m.length = view.len;
    } else {
        m.source = arg;
        m.capacity = window;
        if (!(m.window = PyMem_Malloc((size_t)m.capacity)))
            return PyErr_NoMemory();
        m.data = m.window;
    }
    PyObject *root = NULL, *result = NULL;
    /* its own object, found by identity; a str, so that it reads well where an error shows
     * something it ended up in */
    m.entry_marker = PyUnicode_FromString("<a trace entry>");
    if (m.entry_marker && memo_init(&m.memo, m.entry_marker) == 0
        && interned_init(&m.reader.interned) == 0
        && (m.reader.interned.own_strings = 1) && run(&m, &root) == 0) {
        PyObject *tables = reader_result(&m.reader);
        if (tables) {
            result = Py_BuildValue("(NN)", root, tables);
            root = NULL;
        }
    }
    Py_XDECREF(root);
    machine_clear(&m);
    if (view.obj)
        PyBuffer_Release(&view);
    if (!result && PyErr_ExceptionMatches(PyExc_RecursionError)) {
        PyErr_Clear();
        unsafe("it nests too deeply");
    }
    return result;
}

/* Rows from lists of entry dicts (a snapshot read from JSON): one device per list. */
static PyObject *from_entries(PyObject *self, PyObject *traces) {
    if (!PyList_Check(traces)) {
        PyErr_SetString(PyExc_TypeError, "a list of device traces");
        return NULL;
    }
    Reader r;
    memset(&r, 0, sizeof r);
    PyObject *result = NULL;
    if (interned_init(&r.interned) == 0) {
        Py_ssize_t i, n = PyList_GET_SIZE(traces);
        for (i = 0; i < n; i++) {
            PyObject *trace = PyList_GET_ITEM(traces, i);
            Device *d = reader_device(&r);
            if (!d)
                break;
            if (!PyList_Check(trace)) {
                PyObject *args = Py_BuildValue("(NsO)", PyUnicode_FromFormat(
                    "device_traces[%zd]", i), "must be a list, got {}", trace);
                if (args) {
                    PyErr_SetObject(EntryError, args);
                    Py_DECREF(args);
                }
                break;
            }
            Py_ssize_t k, m = PyList_GET_SIZE(trace);
            PyObject *frames;
            for (k = 0; k < m; k++)
                if (add_entry(d, &r.interned, PyList_GET_ITEM(trace, k), &frames) < 0)
                    break;
            if (k < m)
                break;
        }
        if (i == n)
            result = reader_result(&r);
    }
    reader_clear(&r);
    return result;
}

/* As from_entries, of (device, entry dict) pairs an iterator gives: a JSONL snapshot's
 * entries, each dict dropped once its row is added (a list of them all was a gigabyte at a
 * million entries). */
static PyObject *from_entry_stream(PyObject *self, PyObject *pairs) {
    PyObject *it = PyObject_GetIter(pairs);
    if (!it)
        return NULL;
    Reader r;
    memset(&r, 0, sizeof r);
    PyObject *result = NULL, *item = NULL;
    if (interned_init(&r.interned) < 0)
        goto done;
    while ((item = PyIter_Next(it))) {
        Py_ssize_t device = -1;
        if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2)
            device = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 0));
        if (device < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "from_entry_stream: (device, entry) pairs");
            goto done;
        }
        while (r.count <= device)
            if (!reader_device(&r))
                goto done;
        PyObject *frames;
        if (add_entry(&r.devices[device], &r.interned, PyTuple_GET_ITEM(item, 1), &frames) < 0)
            goto done;
        Py_CLEAR(item);
    }
    if (!PyErr_Occurred())
        result = reader_result(&r);
done:
    Py_XDECREF(item);
    reader_clear(&r);
    Py_DECREF(it);
    return result;
}

/* ---- rows grouped by a key: what walks that follow each block read ---- */

typedef struct { uint64_t key; uint32_t id; } KeyId;

static int key_order(const void *a, const void *b) {
    uint64_t x = ((const KeyId *)a)->key, y = ((const KeyId *)b)->key;
    return x < y ? -1 : x > y;
}

/* a uint64 key's first slot in an open-addressing table of `mask` + 1 slots (a power of 2) */
static Py_ssize_t key_slot(uint64_t key, Py_ssize_t mask) {
    return (Py_ssize_t)((key * 11400714819323198485ULL) >> 20) & mask;
}

/* The positions of `keys` (uint64) sorted by key, ties in position order: what a stable
 * argsort gives, in one pass with a hash of the distinct keys and a counting sort, where a
 * trace reuses few addresses among millions of entries. None when more than a quarter of the
 * keys are distinct (a sort then costs about as much). The positions are int64 bytes.
 * With `rows` (int32 or int64 positions into `keys`, `width` bytes each), those rows sorted
 * by their keys instead, in their own width: no gathered copy of the keys is made. */
static PyObject *order_by_key(PyObject *self, PyObject *args) {
    PyObject *keys_o, *rows_o = NULL;
    int width = 8;
    if (!PyArg_ParseTuple(args, "O|Oi", &keys_o, &rows_o, &width))
        return NULL;
    Py_buffer view, rows_view;
    if (PyObject_GetBuffer(keys_o, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (rows_o && PyObject_GetBuffer(rows_o, &rows_view, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const uint64_t *keys = view.buf;
    Py_ssize_t count = view.len / 8;
    const int32_t *rows32 = rows_o && width == 4 ? rows_view.buf : NULL;
    const int64_t *rows64 = rows_o && width == 8 ? rows_view.buf : NULL;
    Py_ssize_t n = rows_o ? rows_view.len / width : count, limit = n / 4 + 16;
    Py_ssize_t slots = 64;
    KeyId *table = NULL;
    uint32_t *ids = NULL;
    PyObject *result = NULL;
    Py_ssize_t distinct = 0;
    KeyId *sorted = NULL;
    Py_ssize_t *start = NULL;
    if (rows_o && ((width != 4 && width != 8) || rows_view.len % width)) {
        PyErr_SetString(PyExc_ValueError, "order_by_key: rows of 4 or 8 bytes each");
        goto done;
    }
#define ROW(i) (rows32 ? (int64_t)rows32[i] : rows64 ? rows64[i] : (int64_t)(i))
    for (Py_ssize_t i = 0; i < n; i++)
        if (ROW(i) < 0 || ROW(i) >= count) {
            PyErr_SetString(PyExc_IndexError, "order_by_key: a row past the keys");
            goto done;
        }
    while (slots < 2 * limit && slots < 2 * n + 64)
        slots *= 2;
    table = PyMem_Calloc(slots, sizeof(KeyId));      /* id 0: an empty slot */
    ids = PyMem_Malloc((n ? n : 1) * sizeof(uint32_t));
    if (!table || !ids) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t mask = slots - 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t key = keys[ROW(i)];
        Py_ssize_t at = key_slot(key, mask);
        while (table[at].id && table[at].key != key)
            at = (at + 1) & mask;
        if (!table[at].id) {
            if (++distinct > limit) {
                result = Py_NewRef(Py_None);
                goto done;
            }
            table[at].key = key;
            table[at].id = (uint32_t)distinct;
        }
        ids[i] = table[at].id;
    }
    /* each id's rank among the sorted keys, then each rank's first position in the output */
    sorted = PyMem_Malloc((distinct + 1) * sizeof(KeyId));
    start = PyMem_Calloc(distinct + 2, sizeof(Py_ssize_t));
    if (!sorted || !start) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t at = 0; at < slots; at++)
        if (table[at].id)
            sorted[k++] = table[at];
    qsort(sorted, (size_t)distinct, sizeof(KeyId), key_order);
    uint32_t *rank = (uint32_t *)table;        /* the table is done with: id -> rank */
    for (Py_ssize_t r = 0; r < distinct; r++)
        rank[sorted[r].id] = (uint32_t)r;
    for (Py_ssize_t i = 0; i < n; i++)
        start[rank[ids[i]] + 1]++;
    for (Py_ssize_t r = 0; r < distinct; r++)
        start[r + 1] += start[r];
    result = PyBytes_FromStringAndSize(NULL, n * width);
    if (!result)
        goto done;
    if (width == 4) {
        int32_t *out = (int32_t *)PyBytes_AS_STRING(result);
        for (Py_ssize_t i = 0; i < n; i++)
            out[start[rank[ids[i]]]++] = (int32_t)ROW(i);
    } else {
        int64_t *out = (int64_t *)PyBytes_AS_STRING(result);
        for (Py_ssize_t i = 0; i < n; i++)
            out[start[rank[ids[i]]]++] = ROW(i);
    }
#undef ROW
done:
    PyMem_Free(table);
    PyMem_Free(ids);
    PyMem_Free(sorted);
    PyMem_Free(start);
    PyBuffer_Release(&view);
    if (rows_o)
        PyBuffer_Release(&rows_view);
    return result;
}

/* Where a trace of allocs and frees tells an address's story with a hole: the rule is
 * trace/mending.py's (which mends them), found here in one pass over the events with a hash
 * of the addresses seen, where a sort by address cost a second and 200 MB at ten million. */
typedef struct { int64_t *at; Py_ssize_t count, capacity; } Positions;

static int positions_add(Positions *p, int64_t value) {
    if (p->count == p->capacity) {
        Py_ssize_t grown = p->capacity ? 2 * p->capacity : 64;
        int64_t *more = PyMem_Realloc(p->at, (size_t)grown * sizeof(int64_t));
        if (!more) {
            PyErr_NoMemory();
            return -1;
        }
        p->at = more;
        p->capacity = grown;
    }
    p->at[p->count++] = value;
    return 0;
}

/* an address: `state` 0 for an empty slot, FREED once seen and freed, else LIVE + the position
 * of its live block's alloc, whose size is `size` (24 bytes a slot, zeros when made) */
typedef struct { uint64_t key; int64_t state; uint64_t size; } Story;
enum { FREED = 1, LIVE = 2 };

static Story *story_of(Story *table, Py_ssize_t mask, uint64_t key) {
    Py_ssize_t at = key_slot(key, mask);
    while (table[at].state && table[at].key != key)
        at = (at + 1) & mask;
    return &table[at];
}

/* what story_holes keeps between the parts of one trace (a capsule): the hash of the addresses
 * whose story is live or was freed lately, and `freed`, the sorted addresses of stories freed
 * earlier, moved out of the hash (8 bytes an address where a slot at half load takes 48). A
 * trace that never reuses an address (a generated one: 5M addresses in 10M events) kept them
 * all in the hash: 384 MB, and 576 MB while it grew. */
typedef struct { Story *table; Py_ssize_t slots, used; uint64_t *freed; Py_ssize_t nfreed; } Stories;

static const char *STORIES = "npumem.stories";

static void stories_free(PyObject *capsule) {
    Stories *stories = PyCapsule_GetPointer(capsule, STORIES);
    if (stories) {
        PyMem_Free(stories->table);
        PyMem_Free(stories->freed);
        PyMem_Free(stories);
    }
}

static int compare_keys(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* whether `key`'s story was freed and moved out of the hash */
static int freed_earlier(const Stories *stories, uint64_t key) {
    const uint64_t *freed = stories->freed;
    Py_ssize_t low = 0, high = stories->nfreed;
    if (!high || key < freed[0] || key > freed[high - 1])   /* (a new address past them all) */
        return 0;
    while (low < high) {
        Py_ssize_t middle = low + (high - low) / 2;
        if (freed[middle] < key)
            low = middle + 1;
        else
            high = middle;
    }
    return freed[low] == key;
}

/* Room in the hash for one more address: its freed stories move to `freed` when they are a
 * quarter of it and a sixteenth of `freed` or more (so each merge adds a good share: the merges
 * cost about 16 passes over `freed` in all), and the hash keeps its size; else it doubles. */
static int stories_make_room(Stories *stories) {
    Py_ssize_t slots = stories->slots, count = 0;
    for (Py_ssize_t k = 0; k < slots; k++)
        count += stories->table[k].state == FREED;
    if (count && 4 * count >= stories->used && 16 * count >= stories->nfreed) {
        uint64_t *keys = PyMem_Malloc((size_t)count * sizeof(uint64_t));
        uint64_t *merged = keys ? PyMem_Realloc(stories->freed, (size_t)(stories->nfreed + count)
                                                * sizeof(uint64_t)) : NULL;
        Story *fresh = merged ? PyMem_Calloc((size_t)slots, sizeof(Story)) : NULL;
        if (merged)
            stories->freed = merged;
        if (!fresh) {
            PyMem_Free(keys);
            PyErr_NoMemory();
            return -1;
        }
        Py_ssize_t n = 0, live = 0;
        for (Py_ssize_t k = 0; k < slots; k++) {
            Story *story = &stories->table[k];
            if (story->state == FREED)
                keys[n++] = story->key;
            else if (story->state) {
                *story_of(fresh, slots - 1, story->key) = *story;
                live++;
            }
        }
        qsort(keys, (size_t)count, sizeof(uint64_t), compare_keys);
        /* merge from the back, in place; an address freed, allocated and freed again is in
         * both and is kept once */
        Py_ssize_t i = stories->nfreed - 1, j = count - 1, out = stories->nfreed + count - 1;
        while (j >= 0) {
            if (i >= 0 && merged[i] > keys[j])
                merged[out--] = merged[i--];
            else
                merged[out--] = keys[j--];
        }
        Py_ssize_t unique = 0;
        for (Py_ssize_t k = 0; k < stories->nfreed + count; k++)
            if (!unique || merged[unique - 1] != merged[k])
                merged[unique++] = merged[k];
        stories->nfreed = unique;
        PyMem_Free(keys);
        PyMem_Free(stories->table);
        stories->table = fresh;
        stories->used = live;
        return 0;
    }
    Story *grown = PyMem_Calloc((size_t)slots * 2, sizeof(Story));
    if (!grown) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < slots; k++)
        if (stories->table[k].state)
            *story_of(grown, 2 * slots - 1, stories->table[k].key) = stories->table[k];
    PyMem_Free(stories->table);
    stories->table = grown;
    stories->slots = 2 * slots;
    return 0;
}

enum { BEFORE_TRACE, DOUBLE_FREE, MISSED_AT, MISSED_BLOCK, FREED_AT, FREED_BLOCK, N_HOLES };

static PyObject *story_holes(PyObject *self, PyObject *args) {
    Py_buffer action, addr, size;
    int alloc_code;
    PyObject *capsule = Py_None;
    long long offset = 0;
    if (!PyArg_ParseTuple(args, "y*y*y*i|OL", &action, &addr, &size, &alloc_code, &capsule,
                          &offset))
        return NULL;
    const uint8_t *codes = action.buf;
    const uint64_t *addrs = addr.buf, *sizes = size.buf;
    Py_ssize_t n = action.len;
    Positions found[N_HOLES] = {{0}};
    PyObject *result = NULL;
    Stories *stories = NULL;
    if (addr.len != 8 * n || size.len != 8 * n) {
        PyErr_SetString(PyExc_ValueError, "story_holes: columns of different lengths");
        goto done;
    }
    if (capsule == Py_None) {             /* a new trace: a table of its own */
        stories = PyMem_Calloc(1, sizeof(Stories));
        if (!stories || !(stories->table = PyMem_Calloc(1024, sizeof(Story)))) {
            PyMem_Free(stories);
            PyErr_NoMemory();
            goto done;
        }
        stories->slots = 1024;
        capsule = PyCapsule_New(stories, STORIES, stories_free);
        if (!capsule) {
            PyMem_Free(stories->table);
            PyMem_Free(stories);
            goto done;
        }
    } else if (!(stories = PyCapsule_GetPointer(capsule, STORIES))) {
        goto done;
    } else {
        Py_INCREF(capsule);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (2 * (stories->used + 1) > stories->slots && stories_make_room(stories) < 0)
            goto failed;                                   /* at most half full */
        Story *story = story_of(stories->table, stories->slots - 1, addrs[i]);
        if (!story->state) {
            story->key = addrs[i];
            stories->used++;
            if (freed_earlier(stories, addrs[i]))
                story->state = FREED;
        }
        int64_t at = offset + i, block = story->state - LIVE;   /* its live block, if >= 0 */
        int bad = 0;
        if (codes[i] == alloc_code) {
            if (block >= 0)
                bad = positions_add(&found[MISSED_AT], at) < 0
                      || positions_add(&found[MISSED_BLOCK], block) < 0;
            story->state = LIVE + at;
            story->size = sizes[i];
        } else {
            if (block >= 0 && sizes[i] != story->size)
                bad = positions_add(&found[FREED_AT], at) < 0
                      || positions_add(&found[FREED_BLOCK], block) < 0;
            else if (block < 0)
                bad = positions_add(&found[story->state ? DOUBLE_FREE : BEFORE_TRACE], at) < 0;
            story->state = FREED;
        }
        if (bad)
            goto failed;
    }
    result = PyTuple_New(N_HOLES + 1);
    for (int k = 0; result && k < N_HOLES; k++) {
        PyObject *bytes = PyBytes_FromStringAndSize((const char *)found[k].at,
                                                    found[k].count * 8);
        if (!bytes)
            Py_CLEAR(result);
        else
            PyTuple_SET_ITEM(result, k, bytes);
    }
    if (result) {
        PyTuple_SET_ITEM(result, N_HOLES, capsule);       /* (the reference is the tuple's) */
        capsule = NULL;
    }
failed:
    Py_XDECREF(capsule);
done:
    for (int k = 0; k < N_HOLES; k++)
        PyMem_Free(found[k].at);
    PyBuffer_Release(&action);
    PyBuffer_Release(&addr);
    PyBuffer_Release(&size);
    return result;
}

/* What walking a trace's allocs and frees back from the dump leaves of each address (the
 * start state's rule, trace/snapshot/start_state.py): an address first met by a free held that
 * block when the trace began; one first met by an alloc held none. And how many moves
 * contradict the state they undo: two allocs or two frees of an address in a row, and a last
 * move that disagrees with the dump (an alloc of a block not live there, a free of one that
 * is). One pass with a hash of the addresses, in memory that grows with them, not with the
 * trace (a sort by address took 13 bytes an entry). */
static int sorted_holds(const uint64_t *sorted, Py_ssize_t n, uint64_t key) {
    Py_ssize_t low = 0, high = n;
    while (low < high) {
        Py_ssize_t mid = low + (high - low) / 2;
        if (sorted[mid] < key)
            low = mid + 1;
        else
            high = mid;
    }
    return low < n && sorted[low] == key;
}

static PyObject *first_moves(PyObject *self, PyObject *args) {
    Py_buffer action, addr, dump;
    int alloc_code, free_code;
    if (!PyArg_ParseTuple(args, "y*y*iiy*", &action, &addr, &alloc_code, &free_code, &dump))
        return NULL;
    const uint8_t *codes = action.buf;
    const uint64_t *addrs = addr.buf, *at_dump = dump.buf;
    Py_ssize_t n = action.len, dumped = dump.len / 8;
    Positions freed = {0}, allocated = {0};
    LiveTable last = {0};                        /* address -> its last move: 1 alloc, 0 free */
    PyObject *result = NULL;
    long long inconsistent = 0;
    if (addr.len != 8 * n || dump.len % 8) {
        PyErr_SetString(PyExc_ValueError, "first_moves: columns of different lengths");
        goto done;
    }
    if (live_resize(&last, 1024) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        int allocating = codes[i] == alloc_code;
        if (!allocating && codes[i] != free_code)
            continue;
        uint64_t slot = live_find(&last, addrs[i]);
        int32_t before = last.slots[slot].value;
        if (before == LIVE_EMPTY) {
            if (positions_add(allocating ? &allocated : &freed,
                              allocating ? (int64_t)addrs[i] : (int64_t)i) < 0)
                goto done;
        } else
            inconsistent += before == allocating;
        int existed;
        if (live_put(&last, addrs[i], allocating, &existed) < 0)
            goto done;
    }
    for (uint64_t k = 0; k <= last.mask; k++)
        if (last.slots[k].value != LIVE_EMPTY)
            inconsistent += last.slots[k].value != sorted_holds(at_dump, dumped, last.slots[k].key);
    /* (y# makes None of a NULL pointer: an empty list is "") */
    result = Py_BuildValue("(y#y#L)", freed.at ? (const char *)freed.at : "", freed.count * 8,
                           allocated.at ? (const char *)allocated.at : "", allocated.count * 8,
                           inconsistent);
done:
    live_free(&last);
    PyMem_Free(freed.at);
    PyMem_Free(allocated.at);
    PyBuffer_Release(&action);
    PyBuffer_Release(&addr);
    PyBuffer_Release(&dump);
    return result;
}

static PyMethodDef methods[] = {
    {"load", load, METH_VARARGS, "load(data, window=16 MiB): (root object, (devices' columns, "
     "stacks, extras, stacks cut)) of a snapshot pickle: its bytes, or a binary file read a "
     "window at a time"},
    {"order_by_key", order_by_key, METH_VARARGS, "order_by_key(keys, rows=None, width=8): the "
     "positions of uint64 keys (or those rows of them, width bytes each) in a stable sort by "
     "key, as bytes, or None where most keys differ"},
    {"story_holes", story_holes, METH_VARARGS, "story_holes(action, addr, size, alloc_code, "
     "stories=None, offset=0): the positions (int64 bytes) of frees before the trace, double "
     "frees, allocs over a live block and that block, frees of another size and their block "
     "(trace/mending.py), and the stories to pass with the trace's next part, whose first row "
     "is at `offset`"},
    {"first_moves", first_moves, METH_VARARGS, "first_moves(action, addr, alloc_code, "
     "free_code, dump): the positions (int64 bytes) of the frees that first name an address, "
     "the addresses (uint64 bytes) an alloc names first, and how many moves contradict the "
     "state before them, the last of each address against `dump` (sorted uint64 addresses)"},
    {"from_entry_stream", from_entry_stream, METH_O, "as from_entries, of an iterator of "
     "(device, entry dict) pairs"},
    {"from_entries", from_entries, METH_O, "(devices' columns, stacks, extras, stacks cut) of "
     "lists of entry dicts"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_reader",
                                    "Snapshot pickles into columns.", -1, methods};

PyMODINIT_FUNC PyInit__reader(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    UnsafePickle = PyErr_NewException("npumem.trace.snapshot._reader.UnsafePickle",
                                      PyExc_ValueError, NULL);
    EntryError = PyErr_NewException("npumem.trace.snapshot._reader.EntryError",
                                    PyExc_ValueError, NULL);
    if (!UnsafePickle || !EntryError || PyModule_AddObjectRef(m, "UnsafePickle", UnsafePickle) < 0
        || PyModule_AddObjectRef(m, "EntryError", EntryError) < 0)
        return NULL;
    for (int k = 0; k < 8; k++)
        if (!(interned_keys[k] = PyUnicode_InternFromString(KEY_NAMES[k])))
            return NULL;
    for (int a = 0; a < N_ACTIONS; a++)
        if (!(interned_actions[a] = PyUnicode_InternFromString(ACTIONS[a])))
            return NULL;
    s_filename = PyUnicode_InternFromString("filename");
    s_line = PyUnicode_InternFromString("line");
    s_name = PyUnicode_InternFromString("name");
    s_pool_id = PyUnicode_InternFromString("pool_id");
    PyObject *names[] = {s_filename, s_line, s_name, s_pool_id};
    n_known = 0;
    for (int k = 0; k < 8; k++) known[n_known++] = interned_keys[k];
    for (int a = 0; a < N_ACTIONS; a++) known[n_known++] = interned_actions[a];
    for (int k = 0; k < 4; k++) known[n_known++] = names[k];
    if (!s_filename || !s_line || !s_name || !s_pool_id)
        return NULL;
    for (int k = 0; k < K_DEVICE_FREE + 1; k++)
        field_keys[k] = interned_keys[k];
    field_keys[F_POOL_ID] = s_pool_id;
    PyObject *actions = PyTuple_New(N_ACTIONS);
    if (!actions)
        return NULL;
    for (int a = 0; a < N_ACTIONS; a++)
        PyTuple_SET_ITEM(actions, a, PyUnicode_FromString(ACTIONS[a]));
    PyModule_AddObject(m, "ACTIONS", actions);
    PyModule_AddIntConstant(m, "MAX_FRAMES", MAX_FRAMES);
    PyModule_AddIntConstant(m, "HAS_ADDR", HAS_ADDR);
    PyModule_AddIntConstant(m, "HAS_SIZE", HAS_SIZE);
    PyModule_AddIntConstant(m, "HAS_STREAM", HAS_STREAM);
    PyModule_AddIntConstant(m, "HAS_TIME", HAS_TIME);
    PyModule_AddIntConstant(m, "TIME_FLOAT", TIME_FLOAT);
    PyModule_AddIntConstant(m, "HAS_REQUESTED", HAS_REQUESTED);
    PyModule_AddIntConstant(m, "HAS_FRAMES", HAS_FRAMES);
    return m;
}
