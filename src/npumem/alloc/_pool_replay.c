/* npumem's caching pool, native, for replays of a trace: a loop that plays allocs and frees
 * through it and counts what the pool's statistics would say (peak reserved, device calls,
 * cache misses, retries).
 *
 * The pool itself (caching_allocator.py with expandable.py or segments.py, block.py) states the
 * rules and serves real programs; this file follows it for the case a replay has, where every
 * stream is idle and nothing waits on events, in either mode:
 * - expandable arenas (the default): a request takes the lowest-addressed free block large
 *   enough in its stream's arena (cut when the rest is at least split_min bytes); when its
 *   pages are not all mapped, the pages no live block touches are unmapped in every arena
 *   first, then the missing ones are mapped, within the budget;
 * - segments: a request takes the smallest cached block large enough of its (stream, small or
 *   large) cache, lowest address first; else, after garbage collection, a new segment from the
 *   simulated device (its page accounting and its addresses, which only grow); else every free
 *   segment goes back and the request is tried once more.
 * A freed block merges with free neighbours (of its segment). The Python pool stays the oracle
 * of the differential tests (tests/test_pool_replay.py).
 *
 * Free blocks are treaps: an arena's ordered by start, each node knowing the largest free block
 * below it, so first fit is one descent; a segment cache's ordered by (size, start), so best fit
 * is a lower bound. Sizes are the pool's own rules: a Python callable, asked once per distinct
 * request size for (block size, segment bytes, the block size from which a cached block may
 * not serve it or 0).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "live_table.h"

#define NONE (-1)
#define TOO_LARGE UINT64_MAX            /* a rounded size no arena can hold */
#define SMALL_SIZE ((uint64_t)1 << 20)  /* requests up to this go to the small caches */
#define NORMAL_PAGE ((uint64_t)4 << 10)
#define HUGE_PAGE ((uint64_t)2 << 20)
#define HUGE_FIRST_THRESHOLD ((uint64_t)1 << 20)   /* up to this, HUGE_FIRST takes normal pages */
#define ADDRESS_SPAN ((uint64_t)1 << 46)           /* a simulated device's addresses */

/* what `run` does with an entry's action code, and why it stopped */
enum { SKIP = 0, ALLOC = 1, FREE = 2 };
enum { DONE = 0, OUT_OF_MEMORY = 1, TOO_MANY_STREAMS = 2, ADDRESSES_USED = 3 };

typedef struct {
    uint64_t start, size;           /* expandable: bytes from the arena's base; else addresses */
    uint64_t largest;               /* the largest free block in this treap subtree */
    uint64_t requested;             /* the request's bytes, while allocated */
    int32_t prev, next;             /* neighbours in address order (the free chain: next) */
    int32_t left, right;            /* children in the treap of free blocks */
    uint32_t priority;
    int32_t home;                   /* its arena, or its segment */
    uint8_t allocated;
} Block;

typedef struct {                    /* expandable: one stream's address range */
    uint64_t stream;
    int32_t root;                   /* treap of free blocks, by start */
    int32_t first;                  /* the block at its start (never merged away) */
    uint8_t *mapped;                /* 1 per mapped page */
    uint64_t mapped_pages, mapped_end;     /* how many; no page at or above mapped_end is */
} Arena;

typedef struct {                    /* segments: the cached blocks of one (stream, pool) */
    uint64_t stream;
    int32_t root;                   /* treap of free blocks, by (size, start) */
    uint8_t small;
} Cache;

typedef struct {                    /* segments: one device allocation */
    uint64_t start, size, cost;     /* cost: the pages it took, in bytes */
    int32_t first, cache;
    int32_t older, newer;           /* live segments in the order they were made */
    uint8_t huge;
} Segment;

typedef struct { uint64_t size, segment, below; } Rounding;

typedef struct {
    PyObject_HEAD
    int segments;                   /* the mode: segments (1) or expandable arenas (0) */
    int shift;                      /* log2 of the page size (expandable) */
    uint64_t arena_size, arena_pages, split_min, split_min_large, limit;
    int64_t gc_below;               /* garbage_collection_threshold in bytes; -1: none */
    int max_streams;
    PyObject *rounding;
    Block *blocks; int32_t nblocks, capblocks, free_id;
    Arena *arenas; int narenas, last_arena;
    Cache *caches; int ncaches, last_cache;
    Segment *segs; int32_t nsegs, capsegs, free_seg, oldest, newest;
    Rounding *rounds; int64_t nrounds, caprounds;
    LiveTable live;                 /* trace address -> block id */
    LiveTable rounded;              /* request size -> its Rounding's index */
    /* the simulated device (segments): page accounting and the next address */
    uint64_t device_total, huge_limit, used_huge, used_normal, next_address;
    uint32_t seed;
    int spent;                      /* a run stopped short: the state is not the pool's */
    /* what the pool's statistics and the replay count */
    uint64_t allocated, peak_allocated, reserved, peak_reserved;
    int64_t events, requests, misses, device_allocs, device_frees, retries, unmatched;
    int64_t holes;                  /* events trace/mending.py mends in a way a pool sees: a
                                       free of no live block, an alloc over a live one, a free
                                       naming another size (not 0 B, which says nothing) */
} Core;

/* --- blocks and the treaps of free blocks ------------------------------------------------- */

static int32_t new_block(Core *c, uint64_t start, uint64_t size, int32_t home) {
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
    b->priority = c->seed; b->home = home; b->allocated = 0;
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

/* Whether block b's key is below (size, start): arenas order by start, caches by (size, start). */
static int below_key(const Core *c, const Block *b, uint64_t size, uint64_t start) {
    if (c->segments && b->size != size) return b->size < size;
    return b->start < start;
}

/* t's nodes below the key (size, start) to *low, the others to *high */
static void split_at(Core *c, int32_t t, uint64_t size, uint64_t start, int32_t *low,
                     int32_t *high) {
    if (t == NONE) { *low = *high = NONE; return; }
    Block *b = &c->blocks[t];
    if (below_key(c, b, size, start)) {
        int32_t right = b->right;
        split_at(c, right, size, start, &b->right, high);
        *low = t;
    } else {
        int32_t left = b->left;
        split_at(c, left, size, start, low, &b->left);
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

/* the child of node t on the side of b's key (the treap ops never move the blocks array) */
static int32_t *toward(Core *c, int32_t t, const Block *b) {
    Block *node = &c->blocks[t];
    return below_key(c, node, b->size, b->start) ? &node->right : &node->left;
}

static int32_t treap_insert(Core *c, int32_t t, int32_t id) {
    Block *b = &c->blocks[id];
    if (t == NONE) { b->left = b->right = NONE; b->largest = b->size; return id; }
    Block *node = &c->blocks[t];
    if (b->priority > node->priority) {
        split_at(c, t, b->size, b->start, &b->left, &b->right);
        pull(c, id);
        return id;
    }
    int32_t *child = toward(c, t, b);
    *child = treap_insert(c, *child, id);
    pull(c, t);
    return t;
}

/* t without block id (which is in it, with the key it was inserted with) */
static int32_t treap_remove(Core *c, int32_t t, int32_t id) {
    if (t == id) return join(c, c->blocks[t].left, c->blocks[t].right);
    int32_t *child = toward(c, t, &c->blocks[id]);
    *child = treap_remove(c, *child, id);
    pull(c, t);
    return t;
}

/* arenas: the lowest-addressed free block of at least `size` bytes, or NONE */
static int32_t first_fit(const Core *c, int32_t t, uint64_t size) {
    if (largest(c, t) < size) return NONE;
    for (;;) {
        const Block *b = &c->blocks[t];
        if (largest(c, b->left) >= size) t = b->left;
        else if (b->size >= size) return t;
        else t = b->right;           /* the subtree's largest is here: it fits */
    }
}

/* caches: the smallest free block of at least `size` bytes, lowest address first, or NONE */
static int32_t best_fit(const Core *c, int32_t t, uint64_t size) {
    int32_t best = NONE;
    while (t != NONE) {
        if (c->blocks[t].size >= size) { best = t; t = c->blocks[t].left; }
        else t = c->blocks[t].right;
    }
    return best;
}

static int32_t *free_set(Core *c, int32_t home) {      /* the treap a block of `home` joins */
    return c->segments ? &c->caches[c->segs[home].cache].root : &c->arenas[home].root;
}

/* Cut `size` bytes from free block `id` (out of its treap) when the rest is at least
 * `split_min`: the rest joins the treap. 0, or -1 with an exception. */
static int cut(Core *c, int32_t id, uint64_t size, uint64_t split_min) {
    if (c->blocks[id].size - size < split_min) return 0;
    Block *b = &c->blocks[id];
    int32_t rest = new_block(c, b->start + size, b->size - size, b->home);
    if (rest == NONE) return -1;
    b = &c->blocks[id];                                    /* (the array may have moved) */
    Block *r = &c->blocks[rest];
    r->prev = id; r->next = b->next;
    if (b->next != NONE) c->blocks[b->next].prev = rest;
    b->next = rest; b->size = size;
    int32_t *root = free_set(c, b->home);
    *root = treap_insert(c, *root, rest);
    return 0;
}

/* --- expandable arenas: pages -------------------------------------------------------------- */

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
 * limit or the device's huge pages do not allow it (nothing changed but the unmapping, as in
 * the pool). */
static int map_pages(Core *c, Arena *a, uint64_t first, uint64_t end) {
    unmap_idle(c);
    uint64_t need = 0, runs = 0;
    for (uint64_t p = first; p < end; p++)
        if (!a->mapped[p]) { need++; runs += p == first || a->mapped[p - 1]; }
    uint64_t budget = c->limit < c->huge_limit ? c->limit : c->huge_limit;
    if (c->reserved + (need << c->shift) > budget) return 0;
    memset(a->mapped + first, 1, end - first);
    a->mapped_pages += need;
    if (end > a->mapped_end) a->mapped_end = end;
    c->reserved += need << c->shift;
    if (c->reserved > c->peak_reserved) c->peak_reserved = c->reserved;
    c->device_allocs += (int64_t)runs;
    return 1;
}

static int arena_of(Core *c, uint64_t stream) {   /* its index; -1 with too many, -2 error */
    if (c->last_arena >= 0 && c->arenas[c->last_arena].stream == stream) return c->last_arena;
    for (int i = 0; i < c->narenas; i++)
        if (c->arenas[i].stream == stream) return c->last_arena = i;
    if (c->narenas == c->max_streams) return -1;
    Arena *a = &c->arenas[c->narenas];
    a->mapped = PyMem_Calloc(c->arena_pages, 1);
    if (!a->mapped) { PyErr_NoMemory(); return -2; }
    int32_t whole = new_block(c, 0, c->arena_size, c->narenas);
    if (whole == NONE) { PyMem_Free(a->mapped); a->mapped = NULL; return -2; }
    a->stream = stream; a->root = a->first = whole; a->mapped_pages = a->mapped_end = 0;
    return c->last_arena = c->narenas++;
}

/* expandable take: a block id, NONE (out of memory), or -2 with too many streams, -3 error */
static int32_t take_from_arena(Core *c, const Rounding *r, uint64_t stream) {
    int index = arena_of(c, stream);
    if (index == -2) return -3;
    if (index < 0) return -2;
    Arena *a = &c->arenas[index];
    int32_t id = r->size == TOO_LARGE ? NONE : first_fit(c, a->root, r->size);
    if (id == NONE) return NONE;
    a->root = treap_remove(c, a->root, id);
    if (cut(c, id, r->size, c->split_min) < 0) return -3;
    const Block *b = &c->blocks[id];
    uint64_t first = b->start >> c->shift, end = ((b->start + b->size - 1) >> c->shift) + 1;
    if (memchr(a->mapped + first, 0, end - first)) {          /* a cache miss */
        if (!map_pages(c, a, first, end))
            return NONE;                  /* (the block stays out of its treap: the run stops) */
        c->misses++;
    }
    return id;
}

/* --- segments ------------------------------------------------------------------------------ */

static int cache_of(Core *c, uint64_t stream, int small) {   /* as arena_of */
    if (c->last_cache >= 0 && c->caches[c->last_cache].stream == stream &&
            c->caches[c->last_cache].small == small)
        return c->last_cache;
    for (int i = 0; i < c->ncaches; i++)
        if (c->caches[i].stream == stream && c->caches[i].small == small) return c->last_cache = i;
    if (c->ncaches == 2 * c->max_streams) return -1;
    Cache *k = &c->caches[c->ncaches];
    k->stream = stream; k->small = (uint8_t)small; k->root = NONE;
    return c->last_cache = c->ncaches++;
}

static uint64_t align_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

/* The simulated device's HUGE_FIRST allocation of `nbytes`: pages (huge above 1 MiB when it
 * has them, else normal) and the next address; 0 when it has no room, -1 when its addresses
 * are used up (the simulator would go round them, which this does not model). */
static int device_allocate(Core *c, uint64_t nbytes, Segment *s) {
    uint64_t used = c->used_huge + c->used_normal, free = c->device_total - used;
    int huge = 0;
    if (nbytes > HUGE_FIRST_THRESHOLD) {
        uint64_t room = c->huge_limit - c->used_huge;
        if (free < room) room = free;
        huge = room / HUGE_PAGE * HUGE_PAGE >= align_up(nbytes, HUGE_PAGE);
    }
    uint64_t page = huge ? HUGE_PAGE : NORMAL_PAGE, cost = align_up(nbytes, page);
    if (!huge && free < cost) return 0;
    uint64_t start = align_up(c->next_address, page);
    if (start + cost > ADDRESS_SPAN) return -1;
    c->next_address = start + cost;
    if (huge) c->used_huge += cost; else c->used_normal += cost;
    s->start = start; s->size = nbytes; s->cost = cost; s->huge = (uint8_t)huge;
    return 1;
}

/* A new segment of `nbytes` for the cache `cache`: its id, NONE (no room), -4 (addresses used
 * up), -3 error. */
static int32_t new_segment(Core *c, uint64_t nbytes, int cache) {
    if (c->reserved + nbytes > c->limit) return NONE;
    int32_t id = c->free_seg;
    if (id == NONE) {
        if (c->nsegs == c->capsegs) {
            if (c->capsegs >= INT32_MAX / 2) { PyErr_NoMemory(); return -3; }
            int32_t cap = c->capsegs ? c->capsegs * 2 : 64;
            Segment *grown = PyMem_Realloc(c->segs, (size_t)cap * sizeof(Segment));
            if (!grown) { PyErr_NoMemory(); return -3; }
            c->segs = grown; c->capsegs = cap;
        }
        id = c->nsegs++;
    } else {
        c->free_seg = c->segs[id].newer;
    }
    Segment *s = &c->segs[id];
    int made = device_allocate(c, nbytes, s);
    if (made <= 0) {
        s->newer = c->free_seg; c->free_seg = id;
        return made < 0 ? -4 : NONE;
    }
    int32_t first = new_block(c, s->start, nbytes, id);
    if (first == NONE) return -3;
    s = &c->segs[id];
    s->first = first; s->cache = cache;
    s->older = c->newest; s->newer = NONE;
    if (c->newest != NONE) c->segs[c->newest].newer = id; else c->oldest = id;
    c->newest = id;
    c->reserved += nbytes;
    if (c->reserved > c->peak_reserved) c->peak_reserved = c->reserved;
    c->device_allocs++;
    return id;
}

static int by_size_then_age(const void *x, const void *y) {
    const int64_t *a = x, *b = y;      /* (size, age) pairs: larger first, then older */
    if (a[0] != b[0]) return a[0] > b[0] ? -1 : 1;
    return (a[1] > b[1]) - (a[1] < b[1]);
}

/* Give back the entirely free segments, largest first (then oldest), stopping once reserved
 * memory is at most `below` (-1: all). -1 with an exception. */
static int release_cached(Core *c, int64_t below) {
    int64_t count = 0;
    for (int32_t id = c->oldest; id != NONE; id = c->segs[id].newer) count++;
    int64_t *order = PyMem_Malloc((size_t)(count ? count : 1) * 3 * sizeof(int64_t));
    if (!order) { PyErr_NoMemory(); return -1; }
    int64_t n = 0;
    for (int32_t id = c->oldest; id != NONE; id = c->segs[id].newer, n++) {
        order[3 * n] = (int64_t)c->segs[id].size; order[3 * n + 1] = n; order[3 * n + 2] = id;
    }
    qsort(order, (size_t)count, 3 * sizeof(int64_t), by_size_then_age);
    for (int64_t i = 0; i < count; i++) {
        if (below >= 0 && c->reserved <= (uint64_t)below) break;
        int32_t id = (int32_t)order[3 * i + 2];
        Segment *s = &c->segs[id];
        const Block *whole = &c->blocks[s->first];
        if (whole->allocated || whole->next != NONE || whole->size != s->size) continue;
        int32_t *root = &c->caches[s->cache].root;
        *root = treap_remove(c, *root, s->first);
        drop_block(c, s->first);
        if (s->older != NONE) c->segs[s->older].newer = s->newer; else c->oldest = s->newer;
        if (s->newer != NONE) c->segs[s->newer].older = s->older; else c->newest = s->older;
        if (s->huge) c->used_huge -= s->cost; else c->used_normal -= s->cost;
        c->reserved -= s->size;
        c->device_frees++;
        s->newer = c->free_seg; c->free_seg = id;
    }
    PyMem_Free(order);
    return 0;
}

/* segment take: a block id, NONE (no room), -2 (too many streams), -4 (addresses used up),
 * -3 error */
static int32_t take_from_segments(Core *c, const Rounding *r, uint64_t stream) {
    if (r->size == TOO_LARGE) return NONE;
    int small = r->size <= SMALL_SIZE;
    int cache = cache_of(c, stream, small);
    if (cache < 0) return -2;
    uint64_t split_min = small ? c->split_min : c->split_min_large;
    int32_t *root = &c->caches[cache].root;
    int32_t id = best_fit(c, *root, r->size);
    if (id != NONE && (r->below == 0 || c->blocks[id].size < r->below)) {
        *root = treap_remove(c, *root, id);
        return cut(c, id, r->size, split_min) < 0 ? -3 : id;
    }
    if (c->gc_below >= 0 && c->reserved > (uint64_t)c->gc_below &&
            release_cached(c, c->gc_below) < 0)
        return -3;
    int32_t seg = new_segment(c, r->segment, cache);
    if (seg < 0) return seg;
    id = c->segs[seg].first;
    if (cut(c, id, r->size, split_min) < 0) return -3;
    c->misses++;
    return id;
}

/* --- the pool ------------------------------------------------------------------------------ */

static const Rounding *rounding_of(Core *c, uint64_t nbytes) {   /* NULL with an exception */
    uint64_t slot = live_find(&c->rounded, nbytes);
    if (c->rounded.slots[slot].value != LIVE_EMPTY) return &c->rounds[c->rounded.slots[slot].value];
    PyObject *result = PyObject_CallFunction(c->rounding, "K", (unsigned long long)nbytes);
    if (!result) return NULL;
    unsigned long long values[3];
    int bad = !PyTuple_Check(result) || PyTuple_GET_SIZE(result) != 3;
    for (int k = 0; !bad && k < 3; k++) {
        int overflow = 0;
        long long value = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(result, k), &overflow);
        if (value == -1 && PyErr_Occurred()) { Py_DECREF(result); return NULL; }
        values[k] = overflow > 0 ? TOO_LARGE : value < 0 ? (bad = 1, 0) : (uint64_t)value;
    }
    Py_DECREF(result);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "rounding(nbytes) must give three whole numbers >= 0: "
                        "(block size, segment bytes, the size from which a block may not serve "
                        "it or 0)");
        return NULL;
    }
    if (c->nrounds == c->caprounds) {
        if (c->caprounds >= INT32_MAX / 2) { PyErr_NoMemory(); return NULL; }
        int64_t cap = c->caprounds ? c->caprounds * 2 : 64;
        Rounding *grown = PyMem_Realloc(c->rounds, (size_t)cap * sizeof(Rounding));
        if (!grown) { PyErr_NoMemory(); return NULL; }
        c->rounds = grown; c->caprounds = cap;
    }
    Rounding *r = &c->rounds[c->nrounds];
    r->size = values[0] == 0 || values[0] > c->arena_size ? TOO_LARGE : values[0];
    r->segment = values[1] >> 62 ? TOO_LARGE : values[1];
    r->below = values[2];
    if (c->segments && r->segment == TOO_LARGE) r->size = TOO_LARGE;
    int existed;
    if (live_put(&c->rounded, nbytes, (int32_t)c->nrounds, &existed) < 0) return NULL;
    return &c->rounds[c->nrounds++];
}

/* the pool's allocate: DONE, OUT_OF_MEMORY, TOO_MANY_STREAMS or ADDRESSES_USED, -1 with an
 * exception */
static int allocate(Core *c, uint64_t addr, uint64_t nbytes, uint64_t stream) {
    const Rounding *r = rounding_of(c, nbytes);
    if (!r) return -1;
    int32_t id = c->segments ? take_from_segments(c, r, stream) : take_from_arena(c, r, stream);
    if (id == NONE && !c->segments)
        return OUT_OF_MEMORY;  /* its retry cannot help: with the block back and idle pages
                                  unmapped, reserved plus the pages it needs stay the same */
    if (id == NONE) {          /* the pool's retry: every cached segment back, then once more */
        c->retries++;
        if (release_cached(c, -1) < 0) return -1;
        id = take_from_segments(c, r, stream);
        if (id == NONE) return OUT_OF_MEMORY;
    }
    if (id == -3) return -1;
    if (id == -2) return TOO_MANY_STREAMS;
    if (id == -4) return ADDRESSES_USED;
    Block *b = &c->blocks[id];
    b->allocated = 1;
    b->requested = nbytes;
    c->requests++;
    c->allocated += nbytes;
    if (c->allocated > c->peak_allocated) c->peak_allocated = c->allocated;
    int existed;
    return live_put(&c->live, addr, id, &existed) < 0 ? -1 : DONE;
}

/* the pool's deallocate of the live block `id`: merged with free neighbours */
static void deallocate(Core *c, int32_t id) {
    Block *b = &c->blocks[id];
    int32_t *root = free_set(c, b->home);
    c->allocated -= b->requested;
    b->allocated = 0;
    int32_t next = b->next;
    if (next != NONE && !c->blocks[next].allocated) {
        *root = treap_remove(c, *root, next);
        b->size += c->blocks[next].size;
        b->next = c->blocks[next].next;
        if (b->next != NONE) c->blocks[b->next].prev = id;
        drop_block(c, next);
    }
    int32_t prev = b->prev;
    if (prev != NONE && !c->blocks[prev].allocated) {
        Block *p = &c->blocks[prev];
        *root = treap_remove(c, *root, prev);
        p->size += b->size;
        p->next = b->next;
        if (p->next != NONE) c->blocks[p->next].prev = prev;
        drop_block(c, id);
        id = prev;
    }
    *root = treap_insert(c, *root, id);
}

/* --- the Python face ----------------------------------------------------------------------- */

static PyObject *Core_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"segments", "page_shift", "arena_size", "split_min",
                            "split_min_large", "limit", "device_total", "huge_limit",
                            "gc_below", "rounding", "max_streams", NULL};
    int segments, shift, max_streams;
    unsigned long long arena_size, split_min, split_min_large, limit, total, huge_limit;
    long long gc_below;
    PyObject *rounding;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "piKKKKKKLOi", names, &segments, &shift,
                                     &arena_size, &split_min, &split_min_large, &limit, &total,
                                     &huge_limit, &gc_below, &rounding, &max_streams))
        return NULL;
    if (shift < 12 || shift > 40 || arena_size == 0 || arena_size >> 62 ||
            arena_size & (((uint64_t)1 << shift) - 1) || split_min == 0 || split_min_large == 0 ||
            max_streams < 1 || max_streams > 4096 || limit >> 62 || total >> 62 ||
            huge_limit > total || gc_below < -1 || !PyCallable_Check(rounding)) {
        PyErr_SetString(PyExc_ValueError, "Core: page_shift 12..40, arena_size a positive "
                        "multiple of the page below 2**62, split sizes > 0, limit and "
                        "device_total below 2**62, huge_limit <= device_total, gc_below >= -1, "
                        "max_streams 1..4096 and a callable rounding");
        return NULL;
    }
    Core *c = (Core *)type->tp_alloc(type, 0);
    if (!c) return NULL;
    c->segments = segments; c->shift = shift;
    c->arena_size = arena_size; c->arena_pages = arena_size >> shift;
    c->split_min = split_min; c->split_min_large = split_min_large; c->limit = limit;
    c->device_total = total; c->huge_limit = huge_limit; c->gc_below = gc_below;
    c->max_streams = max_streams;
    Py_INCREF(rounding); c->rounding = rounding;
    c->free_id = c->free_seg = c->oldest = c->newest = NONE;
    c->last_arena = c->last_cache = -1; c->seed = 0x9e3779b9u;
    c->arenas = PyMem_Calloc((size_t)max_streams, sizeof(Arena));
    c->caches = PyMem_Calloc((size_t)max_streams * 2, sizeof(Cache));
    if (!c->arenas || !c->caches || live_resize(&c->live, 1024) < 0 ||
            live_resize(&c->rounded, 64) < 0) {
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
    PyMem_Free(c->caches);
    PyMem_Free(c->segs);
    PyMem_Free(c->rounds);
    PyMem_Free(c->blocks);
    live_free(&c->live);
    live_free(&c->rounded);
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
    for (Py_ssize_t k = 0; k < kinds.len; k++)
        if (((const uint8_t *)kinds.buf)[k] > FREE) {
            PyErr_SetString(PyExc_ValueError, "run: kinds are 0 (skip), 1 (alloc) or 2 (free)");
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
        int32_t live = live_pop(&c->live, addrs[i]);
        if (what == FREE) {
            if (live == LIVE_EMPTY) {     /* allocated before the recording started */
                c->unmatched++; c->holes++;
                continue;
            }
            uint64_t said = sizes[i];     /* (0: a format that does not say) */
            if (said && said != c->blocks[live].requested) c->holes++;
            deallocate(c, live);
            continue;
        }
        if (live != LIVE_EMPTY) {         /* its free was not recorded */
            c->holes++;
            deallocate(c, live);
        }
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
    return Py_BuildValue("{sLsKsKsKsKsLsLsLsLsLsLsL}",
                         "events", (long long)c->events,
                         "allocated", (unsigned long long)c->allocated,
                         "peak_allocated", (unsigned long long)c->peak_allocated,
                         "reserved", (unsigned long long)c->reserved,
                         "peak_reserved", (unsigned long long)c->peak_reserved,
                         "requests", (long long)c->requests,
                         "cache_misses", (long long)c->misses,
                         "device_allocs", (long long)c->device_allocs,
                         "device_frees", (long long)c->device_frees,
                         "alloc_retries", (long long)c->retries,
                         "unmatched", (long long)c->unmatched,
                         "holes", (long long)c->holes);
}

static PyObject *block_rows(Core *c, int32_t id, uint64_t base) {
    PyObject *rows = PyList_New(0);
    for (; rows && id != NONE; id = c->blocks[id].next) {
        const Block *b = &c->blocks[id];
        PyObject *row = Py_BuildValue("KKO", (unsigned long long)(b->start - base),
                                      (unsigned long long)b->size,
                                      b->allocated ? Py_True : Py_False);
        if (!row || PyList_Append(rows, row) < 0) { Py_XDECREF(row); Py_CLEAR(rows); }
        else Py_DECREF(row);
    }
    return rows;
}

/* (stream, small, bytes, [(offset, size, allocated), ...]) of every arena or live segment, in
 * the order they were made */
static PyObject *Core_layout(Core *c, PyObject *unused) {
    PyObject *out = PyList_New(0);
    int count = c->segments ? 0 : c->narenas;
    for (int i = 0; out && i < count; i++) {
        PyObject *rows = block_rows(c, c->arenas[i].first, 0);
        PyObject *item = rows ? Py_BuildValue("KOKN", (unsigned long long)c->arenas[i].stream,
                                              Py_False, (unsigned long long)c->arena_size, rows)
                              : NULL;
        if (!item || PyList_Append(out, item) < 0) Py_CLEAR(out);
        Py_XDECREF(item);
    }
    for (int32_t id = c->segments ? c->oldest : NONE; out && id != NONE; id = c->segs[id].newer) {
        const Segment *s = &c->segs[id];
        const Cache *k = &c->caches[s->cache];
        PyObject *rows = block_rows(c, s->first, s->start);
        PyObject *item = rows ? Py_BuildValue("KOKN", (unsigned long long)k->stream,
                                              k->small ? Py_True : Py_False,
                                              (unsigned long long)s->size, rows) : NULL;
        if (!item || PyList_Append(out, item) < 0) Py_CLEAR(out);
        Py_XDECREF(item);
    }
    return out;
}

static PyMethodDef Core_methods[] = {
    {"run", (PyCFunction)Core_run, METH_VARARGS,
     "run(kinds, action, addr, size, stream): play the entries (kinds[action]: 0 skip, 1 "
     "alloc, 2 free); (why it stopped: 0 done, 1 out of memory, 2 too many streams, 3 the "
     "device's addresses used up; index)"},
    {"counts", (PyCFunction)Core_counts, METH_NOARGS, "what the replay counted"},
    {"layout", (PyCFunction)Core_layout, METH_NOARGS,
     "(stream, small, bytes, [(offset, size, allocated), ...]) of each arena or segment, "
     "oldest first"},
    {NULL}
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npumem.alloc._pool_replay.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "npumem's caching pool with every stream idle, for replays.",
    .tp_new = Core_new,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_methods = Core_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pool_replay",
    "npumem's caching pool, native, for trace replays.", -1, NULL, NULL, NULL, NULL, NULL,
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
    if (PyModule_AddIntConstant(m, "DONE", DONE) < 0 ||
            PyModule_AddIntConstant(m, "OUT_OF_MEMORY", OUT_OF_MEMORY) < 0 ||
            PyModule_AddIntConstant(m, "TOO_MANY_STREAMS", TOO_MANY_STREAMS) < 0 ||
            PyModule_AddIntConstant(m, "ADDRESSES_USED", ADDRESSES_USED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
