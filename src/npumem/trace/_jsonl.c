/* Reading npumem's JSONL trace into columns, a chunk of lines at a time.
 *
 *     {"t_us": 12.5, "action": "alloc", "addr": 94205676378496, "size": 1048576, "stream": 0}
 *
 * Python's json makes a dict per line, about 4 s per million lines. This parser reads the lines
 * as npumem and most tools write them: one flat object of those five keys, the action a plain
 * string, the numbers plain JSON integers (and any JSON number for the time), in any order,
 * with any JSON whitespace. Every other line (another key, an escape, a duplicate key, a float
 * address, a damaged line, non-ASCII bytes) goes to the Python reader (`fallback`), which is
 * the rule of what a line may hold and says what is wrong with it: this parser only takes the
 * common form faster, and tests/test_jsonl_native.py holds it to that reader.
 *
 * Lines end as Python's text files end them with newline="": at "\n", "\r\n" or a lone "\r".
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "reader_common.h"

enum { C_ACTION, C_ADDR, C_SIZE, C_STREAM, C_TIME, N_COLUMNS };
static const char *COLUMN_NAMES[] = {"action", "addr", "size", "stream", "time"};
static const Py_ssize_t COLUMN_WIDTHS[] = {1, 8, 8, 8, 8};

typedef struct {
    double t_us;
    int alloc;
    uint64_t addr, size, stream;
} Event;

/* ---- one line in the common form ---- */

static const char *skip_space(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* A JSON integer in [0, 2**64): digits, no sign, no leading zero, no fraction or exponent. */
static const char *natural(const char *p, const char *end, uint64_t *out) {
    if (p >= end || *p < '0' || *p > '9' || (*p == '0' && p + 1 < end && p[1] >= '0' &&
                                              p[1] <= '9'))
        return NULL;
    uint64_t value = 0;
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        unsigned digit = (unsigned)(*p - '0');
        if (value > (UINT64_MAX - digit) / 10)
            return NULL;                       /* past 64 bits: the Python reader says so */
        value = value * 10 + digit;
    }
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E'))
        return NULL;
    *out = value;
    return p;
}

/* Any finite JSON number, as Python's float() of its text gives it. */
static const char *number(const char *p, const char *end, double *out) {
    const char *start = p;
    if (p < end && *p == '-')
        p++;
    if (p >= end || *p < '0' || *p > '9')
        return NULL;
    if (*p == '0')
        p++;
    else
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    if (p < end && *p == '.') {
        p++;
        if (p >= end || *p < '0' || *p > '9')
            return NULL;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p >= end || *p < '0' || *p > '9')
            return NULL;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    char text[64];
    if (p - start >= (Py_ssize_t)sizeof text)
        return NULL;
    memcpy(text, start, (size_t)(p - start));
    text[p - start] = '\0';
    char *stop;
    /* Python's own conversion: correctly rounded, whatever the C locale says a point is */
    double value = PyOS_string_to_double(text, &stop, NULL);
    if (value == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return NULL;
    }
    if (*stop != '\0' || !isfinite(value))
        return NULL;
    *out = value;
    return p;
}

enum { K_TIME, K_ACTION, K_ADDR, K_SIZE, K_STREAM };

static int key_of(const char *p, Py_ssize_t n) {
    if (n == 4 && memcmp(p, "t_us", 4) == 0) return K_TIME;
    if (n == 6 && memcmp(p, "action", 6) == 0) return K_ACTION;
    if (n == 4 && memcmp(p, "addr", 4) == 0) return K_ADDR;
    if (n == 4 && memcmp(p, "size", 4) == 0) return K_SIZE;
    if (n == 6 && memcmp(p, "stream", 6) == 0) return K_STREAM;
    return -1;
}

/* 1: an event in *e; 0: a blank line (spaces and tabs); -1: not the common form. */
static int parse_line(const char *p, const char *end, Event *e) {
    p = skip_space(p, end);
    if (p == end)
        return 0;
    if (*p++ != '{')
        return -1;
    unsigned seen = 0;
    e->t_us = 0.0;
    e->stream = 0;
    for (;;) {
        p = skip_space(p, end);
        if (p >= end || *p++ != '"')
            return -1;
        const char *name = p;
        while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20 &&
               (unsigned char)*p < 0x80)
            p++;
        if (p >= end || *p != '"')
            return -1;
        int key = key_of(name, p - name);
        p++;
        if (key < 0 || seen & (1u << key))
            return -1;
        seen |= 1u << key;
        p = skip_space(p, end);
        if (p >= end || *p++ != ':')
            return -1;
        p = skip_space(p, end);
        switch (key) {
        case K_TIME:
            p = number(p, end, &e->t_us);
            break;
        case K_ACTION:
            if (end - p >= 7 && memcmp(p, "\"alloc\"", 7) == 0) {
                e->alloc = 1;
                p += 7;
            } else if (end - p >= 6 && memcmp(p, "\"free\"", 6) == 0) {
                e->alloc = 0;
                p += 6;
            } else {
                p = NULL;
            }
            break;
        case K_ADDR:
            p = natural(p, end, &e->addr);
            break;
        case K_SIZE:
            p = natural(p, end, &e->size);
            break;
        default:
            p = natural(p, end, &e->stream);
        }
        if (!p)
            return -1;
        p = skip_space(p, end);
        if (p >= end)
            return -1;
        if (*p == '}')
            break;
        if (*p++ != ',')
            return -1;
    }
    p = skip_space(p + 1, end);
    unsigned needed = (1u << K_ACTION) | (1u << K_ADDR) | (1u << K_SIZE);
    return p == end && (seen & needed) == needed ? 1 : -1;
}

/* ---- the parser: a window over the file, lines out of it ---- */

typedef struct {
    PyObject_HEAD
    PyObject *file, *fallback;     /* file: read by readinto */
    unsigned char alloc_code, free_code;
    char *buffer;
    Py_ssize_t length, position, capacity, window;
    int at_end;
    Py_ssize_t line;                /* lines read so far */
} Parser;

/* Bytes after the unread ones, from readinto (a window's worth); at_end when it gives none. */
static int refill(Parser *s) {
    Py_ssize_t left = s->length - s->position;
    if (left)
        memmove(s->buffer, s->buffer + s->position, (size_t)left);
    s->length = left;
    s->position = 0;
    if (s->length + s->window > s->capacity) {       /* a line longer than a window */
        Py_ssize_t capacity = s->capacity ? s->capacity : s->window;
        while (capacity < s->length + s->window)
            capacity *= 2;
        char *more = PyMem_Realloc(s->buffer, (size_t)capacity);
        if (!more) {
            PyErr_NoMemory();
            return -1;
        }
        s->buffer = more;
        s->capacity = capacity;
    }
    Py_ssize_t n = read_into(s->file, s->buffer + s->length, s->window);
    if (n < 0)
        return -1;
    s->at_end = n == 0;
    s->length += n;
    return 0;
}

/* The next line [*start, *stop), its ending passed; 0 when the file is done, -1 on an error. */
static int next_line(Parser *s, const char **start, const char **stop) {
    for (;;) {
        const char *p = s->buffer + s->position, *end = s->buffer + s->length;
        const char *newline = p < end ? memchr(p, '\n', (size_t)(end - p)) : NULL;
        const char *limit = newline ? newline : end;
        const char *ret = p < limit ? memchr(p, '\r', (size_t)(limit - p)) : NULL;
        const char *cut = ret ? ret : newline;
        /* a "\r" last in the window may be the first half of "\r\n" */
        int whole = cut && (cut != ret || ret + 1 < end || s->at_end);
        if (whole || (s->at_end && p < end)) {
            const char *after = !cut ? end : cut + (cut == ret && ret + 1 < end &&
                                                    ret[1] == '\n' ? 2 : 1);
            *start = p;
            *stop = cut ? cut : end;
            s->position = after - s->buffer;
            s->line++;
            return 1;
        }
        if (s->at_end)
            return 0;
        if (refill(s) < 0)
            return -1;
    }
}

/* What the Python reader makes of a line the parser did not take: an event, or None (blank). */
static int from_fallback(Parser *s, const char *start, const char *stop, Event *e) {
    PyObject *event = PyObject_CallFunction(s->fallback, "ny#", s->line, start,
                                            (Py_ssize_t)(stop - start));
    if (!event)
        return -1;
    if (event == Py_None) {
        Py_DECREF(event);
        return 0;
    }
    PyObject *t = NULL, *action = NULL, *addr = NULL, *size = NULL, *stream = NULL;
    int ok = PyArg_ParseTuple(event, "OOOOO", &t, &action, &addr, &size, &stream);
    if (ok) {
        e->t_us = PyFloat_AsDouble(t);
        e->alloc = PyUnicode_Check(action) && PyUnicode_CompareWithASCIIString(action,
                                                                             "alloc") == 0;
        e->addr = PyLong_AsUnsignedLongLong(addr);
        e->size = PyLong_AsUnsignedLongLong(size);
        e->stream = PyLong_AsUnsignedLongLong(stream);
    }
    Py_DECREF(event);
    return ok && !PyErr_Occurred() ? 1 : -1;
}

static int put(Parser *s, Column *columns, const Event *e) {
    unsigned char action = e->alloc ? s->alloc_code : s->free_code;
    return column_put(&columns[C_ACTION], &action) < 0 ||
           column_put(&columns[C_ADDR], &e->addr) < 0 ||
           column_put(&columns[C_SIZE], &e->size) < 0 ||
           column_put(&columns[C_STREAM], &e->stream) < 0 ||
           column_put(&columns[C_TIME], &e->t_us) < 0 ? -1 : 0;
}

/* chunk(limit): the next `limit` events (or fewer, at the end) as {"rows": their number,
 * column name: bytearray, or None for all zeros}; None when the file is done. */
static PyObject *parser_chunk(Parser *s, PyObject *args) {
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "n", &limit))
        return NULL;
    Column columns[N_COLUMNS];
    int made = 0;
    PyObject *result = NULL;
    for (; made < N_COLUMNS; made++)
        if (column_init(&columns[made], COLUMN_WIDTHS[made]) < 0)
            goto done;
    Py_ssize_t rows = 0;
    while (rows < limit) {
        const char *start, *stop;
        int got = next_line(s, &start, &stop);
        if (got < 0)
            goto done;
        if (got == 0)
            break;
        Event e;
        int parsed = parse_line(start, stop, &e);
        if (parsed < 0)
            parsed = from_fallback(s, start, stop, &e);
        if (parsed < 0 || (parsed && put(s, columns, &e) < 0))
            goto done;
        rows += parsed;
    }
    if (rows == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = Py_BuildValue("{s:n}", "rows", rows);
    for (int c = 0; result && c < N_COLUMNS; c++) {
        PyObject *data = column_finish(&columns[c]);
        if (!data || PyDict_SetItemString(result, COLUMN_NAMES[c], data) < 0)
            Py_CLEAR(result);
    }
done:
    for (int c = 0; c < made; c++)
        Py_DECREF(columns[c].array);
    return result;
}

static PyObject *parser_lines(Parser *s, void *closure) {
    return PyLong_FromSsize_t(s->line);
}

static int parser_init(Parser *s, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"file", "fallback", "alloc_code", "free_code", "window", NULL};
    PyObject *file, *fallback;
    unsigned char alloc_code, free_code;
    Py_ssize_t window = 1 << 22;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OObb|n", names, &file, &fallback,
                                     &alloc_code, &free_code, &window))
        return -1;
    if (window < 1) {
        PyErr_SetString(PyExc_ValueError, "window must be positive");
        return -1;
    }
    Py_XSETREF(s->file, Py_NewRef(file));
    Py_XSETREF(s->fallback, Py_NewRef(fallback));
    s->alloc_code = alloc_code;
    s->free_code = free_code;
    s->window = window;
    s->length = s->position = s->line = 0;
    s->at_end = 0;
    return 0;
}

static void parser_dealloc(Parser *s) {
    Py_XDECREF(s->file);
    Py_XDECREF(s->fallback);
    PyMem_Free(s->buffer);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMethodDef parser_methods[] = {
    {"chunk", (PyCFunction)parser_chunk, METH_VARARGS,
     "chunk(limit) -> the next events as columns ({'rows': n, name: bytearray or None}), "
     "None at the end"},
    {NULL}};

static PyGetSetDef parser_getset[] = {
    {"lines", (getter)parser_lines, NULL, "lines read so far", NULL},
    {NULL}};

static PyTypeObject ParserType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npumem.trace._jsonl.Parser",
    .tp_basicsize = sizeof(Parser),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Parser(file, fallback, alloc_code, free_code, window=4 MiB): a JSONL trace's "
              "events as columns; file.readinto(buffer) gives the file's next bytes, "
              "fallback(line number, line bytes) the event (or None) of a line not in the "
              "common form",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)parser_init,
    .tp_dealloc = (destructor)parser_dealloc,
    .tp_methods = parser_methods,
    .tp_getset = parser_getset,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jsonl",
                                    "npumem's JSONL trace read into columns", -1, NULL};

PyMODINIT_FUNC PyInit__jsonl(void) {
    if (PyType_Ready(&ParserType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "Parser", (PyObject *)&ParserType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
