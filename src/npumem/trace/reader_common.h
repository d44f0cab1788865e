/* What the C readers (snapshot/_reader.c, _jsonl.c) share: growable columns, bytearrays the
 * Python side views with numpy (np.frombuffer), so a million rows are a few arrays, not
 * objects; and reading a file a window at a time. */
#ifndef NPUMEM_READER_COMMON_H
#define NPUMEM_READER_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define COLUMN_FIRST_ROWS 1024

typedef struct {
    PyObject *array;            /* bytearray */
    Py_ssize_t width, count, capacity;
    int zeros;                  /* every value so far is 0: the column holds no bytes yet */
} Column;

static int column_init(Column *c, Py_ssize_t width) {
    c->width = width;
    c->count = 0;
    c->zeros = 1;
    c->capacity = COLUMN_FIRST_ROWS;
    c->array = PyByteArray_FromStringAndSize(NULL, width * c->capacity);
    return c->array ? 0 : -1;
}

static void *column_slot(Column *c) {
    if (c->count == c->capacity) {
        Py_ssize_t grown = c->capacity * 2;
        if (PyByteArray_Resize(c->array, grown * c->width) < 0)
            return NULL;
        c->capacity = grown;
    }
    return PyByteArray_AS_STRING(c->array) + c->width * c->count++;
}

/* One more value. A column of zeros so far only counts them: most traces name one stream and
 * no requested_size, and ten million zeros are 80 MB. The first other value writes them. */
static int column_put(Column *c, const void *value) {
    if (c->zeros) {
        const unsigned char *bytes = value;
        int zero = 1;
        for (Py_ssize_t i = 0; i < c->width; i++)
            zero &= bytes[i] == 0;
        if (zero) {
            c->count++;
            return 0;
        }
        Py_ssize_t capacity = c->capacity;
        while (capacity < c->count + 1)
            capacity *= 2;
        if (PyByteArray_Resize(c->array, capacity * c->width) < 0)
            return -1;
        c->capacity = capacity;
        memset(PyByteArray_AS_STRING(c->array), 0, (size_t)(c->count * c->width));
        c->zeros = 0;
    }
    void *slot = column_slot(c);
    if (!slot)
        return -1;
    memcpy(slot, value, (size_t)c->width);
    return 0;
}

/* the last value of a 4-byte column */
static uint32_t column_last_u32(const Column *c) {
    uint32_t value = 0;
    if (!c->zeros && c->count)
        memcpy(&value, PyByteArray_AS_STRING(c->array) + 4 * (c->count - 1), 4);
    return value;
}

/* The column for Python, trimmed to its rows (borrowed): None for a column of zeros, which
 * the Python side makes as zeros that take no memory (an empty one is its empty bytearray).
 * NULL with MemoryError set. */
static PyObject *column_finish(Column *c) {
    int zeros = c->zeros && c->count;
    if (PyByteArray_Resize(c->array, zeros ? 0 : c->count * c->width) < 0)
        return NULL;
    return zeros ? Py_None : c->array;
}

/* Up to `room` bytes of `file` (a Python object with readinto) at `at`: how many, 0 at its
 * end, -1 with the file's own error set (a limit, a damaged gzip). */
static Py_ssize_t read_into(PyObject *file, char *at, Py_ssize_t room) {
    PyObject *view = PyMemoryView_FromMemory(at, room, PyBUF_WRITE);
    PyObject *got = view ? PyObject_CallMethod(file, "readinto", "O", view) : NULL;
    /* released, so that no view the file kept outlives the buffer (BufferError if one
     * still holds it); the file's own error, if any, is the one that stands */
    PyObject *type, *error, *trace;
    PyErr_Fetch(&type, &error, &trace);
    PyObject *released = view ? PyObject_CallMethod(view, "release", NULL) : NULL;
    Py_XDECREF(view);
    if (released || type) {
        Py_XDECREF(released);
        PyErr_Clear();
        PyErr_Restore(type, error, trace);
    } else
        Py_CLEAR(got);
    if (!got)
        return -1;
    Py_ssize_t count = PyLong_Check(got) ? PyLong_AsSsize_t(got) : -1;
    Py_DECREF(got);
    if (count < 0 || count > room) {
        PyErr_Clear();
        PyErr_SetString(PyExc_OSError, "the file gave no bytes to read");
        return -1;
    }
    return count;
}

#endif
