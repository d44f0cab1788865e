/* A hash of uint64 keys (a trace's addresses) to int32 values (block ids, LIVE_EMPTY for an
 * empty slot): open addressing, linear probing, deletion by shifting back, at most half full.
 * What the native replays keep of their live blocks: the model of PyTorch's allocator
 * (torch_model/_native.c) and npumem's pool (_pool_replay.c); the snapshot reader's memo
 * (objects by address) and its start state (addresses' last moves) too. */
#ifndef NPUMEM_LIVE_TABLE_H
#define NPUMEM_LIVE_TABLE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define LIVE_EMPTY (-1)

typedef struct { uint64_t key; int32_t value; } LiveSlot;
typedef struct { LiveSlot *slots; uint64_t mask; Py_ssize_t count; } LiveTable;

static uint64_t live_mix(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33;
    return x;
}

/* `slots` (a power of two) slots, the entries moved over; -1 with MemoryError */
static int live_resize(LiveTable *t, uint64_t slots) {
    LiveSlot *old = t->slots;
    uint64_t oldmask = t->mask;
    LiveSlot *fresh = PyMem_Malloc(slots * sizeof(LiveSlot));
    if (!fresh) { PyErr_NoMemory(); return -1; }
    for (uint64_t i = 0; i < slots; i++) fresh[i].value = LIVE_EMPTY;
    t->slots = fresh;
    t->mask = slots - 1;
    if (old) {
        for (uint64_t i = 0; i <= oldmask; i++) {
            if (old[i].value == LIVE_EMPTY) continue;
            uint64_t at = live_mix(old[i].key) & t->mask;
            while (fresh[at].value != LIVE_EMPTY) at = (at + 1) & t->mask;
            fresh[at] = old[i];
        }
        PyMem_Free(old);
    }
    return 0;
}

static void live_free(LiveTable *t) { PyMem_Free(t->slots); t->slots = NULL; }

/* the slot of key, or of the hole where it would go */
static uint64_t live_find(const LiveTable *t, uint64_t key) {
    uint64_t at = live_mix(key) & t->mask;
    while (t->slots[at].value != LIVE_EMPTY && t->slots[at].key != key) at = (at + 1) & t->mask;
    return at;
}

/* key -> value; *existed says whether key had one (now replaced); -1 with MemoryError */
static int live_put(LiveTable *t, uint64_t key, int32_t value, int *existed) {
    if ((uint64_t)(t->count + 1) * 2 > t->mask + 1 && live_resize(t, (t->mask + 1) * 2) < 0)
        return -1;
    uint64_t at = live_find(t, key);
    *existed = t->slots[at].value != LIVE_EMPTY;
    if (!*existed) t->count++;
    t->slots[at] = (LiveSlot){key, value};
    return 0;
}

/* key's value, taken out (LIVE_EMPTY if it had none) */
static int32_t live_pop(LiveTable *t, uint64_t key) {
    uint64_t hole = live_find(t, key);
    int32_t value = t->slots[hole].value;
    if (value == LIVE_EMPTY) return LIVE_EMPTY;
    t->count--;
    uint64_t at = hole;
    for (;;) {                      /* shift back the entries whose probe passed the hole */
        t->slots[hole].value = LIVE_EMPTY;
        for (;;) {
            at = (at + 1) & t->mask;
            if (t->slots[at].value == LIVE_EMPTY) return value;
            uint64_t home = live_mix(t->slots[at].key) & t->mask;
            if (hole <= at ? (home <= hole || home > at) : (home <= hole && home > at)) break;
        }
        t->slots[hole] = t->slots[at];
        hole = at;
    }
}

#endif
