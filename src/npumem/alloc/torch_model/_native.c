/* The model of PyTorch's caching allocator, native: the default pools and private ones (CUDA
 * graphs, MemPools), of cudaMalloc'd or expandable segments, with garbage collection, the
 * driver under it, and a loop that plays a trace's allocs and frees through it.
 *
 * allocator.py states the rules, and this file follows it function for function (the names
 * match); a replay takes this model where it covers the recording and its settings
 * (whatif/replay_cores.py decides), and the Python model stays the oracle of the differential
 * tests (tests/test_native_model.py). Sizes and addresses are below 2**63 (the caller checks).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../live_table.h"

#define MiB ((uint64_t)1 << 20)
#define MIN_BLOCK 512u
#define SMALL_SIZE MiB
#define SMALL_BUFFER (2 * MiB)
#define MIN_LARGE_ALLOC (10 * MiB)
#define ROUND_LARGE (2 * MiB)
#define EXTRA_LARGE_BUFFER ((uint64_t)1 << 30)
#define INTERVALS 16
#define NONE (-1)

/* what `run` does with an entry's action code */
enum { SKIP = 0, ALLOC = 1, FREE = 2, IRREGULAR = 3 };
/* why `run` stopped */
enum { DONE = 0, AT_IRREGULAR = 1, EVENTS = 2, OUT_OF_MEMORY = 3 };
/* segment event actions, as SegmentEvent names them */
enum { EV_SEGMENT_ALLOC = 0, EV_SEGMENT_FREE = 1, EV_OOM = 2, EV_SEGMENT_MAP = 3, EV_SEGMENT_UNMAP = 4 };
static const char *EVENT_NAMES[] = {"segment_alloc", "segment_free", "oom", "segment_map",
                                    "segment_unmap"};

typedef struct {
    uint64_t addr, size, requested, stream;
    uint64_t gc_base;                         /* its pool's get_free_block calls when cached */
    int32_t prev, next;
    int32_t segment;                          /* its expandable segment, NONE: cudaMalloc'd */
    int32_t pool;                             /* its pool's slot (0: the default pools) */
    uint8_t small, allocated, dead, mapped;
} Block;

typedef struct { uint64_t stream, size, addr; int32_t id; } Key;
typedef struct { uint64_t stream, addr; int32_t id; } UnmappedKey;
typedef struct {
    Key *keys; Py_ssize_t n, cap;                    /* free mapped blocks */
    uint64_t free_block_calls;                       /* for garbage collection's ages */
    UnmappedKey *unmapped; Py_ssize_t nu, capu;      /* unmapped ranges of expandable segments */
} BlockPool;
/* a pool's small and large blocks: slot 0 the default pools, others c10's PrivatePool (the
 * Python face names them by MempoolId_t); a private slot is alive from its first use (a
 * restored segment, a request routed to it) until it is released and holds nothing */
typedef struct {
    BlockPool small, large;
    int64_t use_count;                               /* captures, graphs and MemPools using it */
    uint64_t reserved;                               /* its device bytes */
    int alive;
} Pool;
/* one stream's growing address range, mapped in pages. No state per page: the allocator maps
 * and unmaps only what it knows is unmapped and mapped, so the device's bytes in use are all
 * the pages need; a page array sized by the addresses a file names cost gigabytes (issue 64) */
typedef struct {
    uint64_t stream, page, max_pages, base;
    uint64_t marked_end;                             /* pages below it marked (restored) mapped */
    int alive;
} Expandable;
typedef struct { uint64_t start, end; } Range;
typedef struct { uint64_t addr, size, stream; int32_t pool; uint8_t action; } Event;

typedef struct {
    PyObject_HEAD
    /* settings */
    uint64_t pad, max_split, max_non_split, large_segment;
    int page_1g, expandable, npu;
    uint64_t large_page, align;                   /* expandable large pages; npu start alignment */
    uint64_t space;                               /* the addresses a new expandable segment takes */
    uint8_t divisions[INTERVALS];
    int64_t allowed, capacity;                /* -1: none */
    double gc_threshold;                      /* garbage_collection_threshold (0: off) */
    /* the driver */
    uint64_t used, fresh;
    Range *ranges; Py_ssize_t nranges, capranges;
    uint64_t *expected; Py_ssize_t nexpected, expected_head;    /* (addr, size) pairs */
    /* blocks */
    Block *blocks; int32_t nblocks, capblocks, free_slot;        /* free slots chain via next */
    Pool *pools; Py_ssize_t npools, cappools;
    int32_t *freeable; Py_ssize_t nfreeable, capfreeable;   /* released pools, in c10's order */
    int32_t route;                            /* the pool requests go to now (routed) */
    int capturing;                            /* a capture is under way (routed) */
    Expandable *segs; Py_ssize_t nsegs, capsegs;
    /* statistics (ModelStats) */
    uint64_t reserved, peak_reserved, allocated_bytes, requested_bytes;
    int64_t allocations, num_device_alloc, num_device_free, num_alloc_retries, num_ooms, cache_hits;
    Event *events; Py_ssize_t nevents, capevents;
    /* the replay's live blocks (trace address -> block) and its counts */
    LiveTable live;
    uint64_t replay_allocated, replay_peak;
    int64_t unmatched, misplaced, requests;
    /* the last out-of-memory: orig, size, alloc_size, stream, free (-1 none), usable, largest */
    uint64_t oom[7];
    int oom_has_free;
} Model;

static int grow(void **items, Py_ssize_t *cap, Py_ssize_t need, size_t item) {
    if (need <= *cap) return 0;
    Py_ssize_t wanted = *cap ? *cap : 16;
    while (wanted < need) wanted *= 2;
    void *bigger = PyMem_Realloc(*items, (size_t)wanted * item);
    if (!bigger) { PyErr_NoMemory(); return -1; }
    *items = bigger;
    *cap = wanted;
    return 0;
}

/* --- sizes ------------------------------------------------------------------------------ */
static int bit_length(uint64_t v) { return v ? 64 - __builtin_clzll(v) : 0; }

static uint64_t next_division(uint64_t size, uint64_t divisions) {
    if ((size & (size - 1)) == 0) return size;
    uint64_t floor = (uint64_t)1 << (bit_length(size) - 1);
    uint64_t step = floor >> (bit_length(divisions) - 1);
    if (step == 0) return floor << 1;
    uint64_t rounded = size & ~(step - 1);
    return rounded == size ? size : rounded + step;
}

static uint64_t round_size(Model *m, uint64_t size) {
    size += m->pad;
    if (size < MIN_BLOCK) return MIN_BLOCK;
    int index = bit_length(size) - 1 - 20;
    index = index < 0 ? 0 : index > INTERVALS - 1 ? INTERVALS - 1 : index;
    uint64_t divisions = m->divisions[index];
    if (divisions > 1 && size > MIN_BLOCK * divisions) return next_division(size, divisions);
    return (size + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
}

static uint64_t ceil_to(uint64_t size, uint64_t unit) { return (size + unit - 1) / unit * unit; }

static uint64_t allocation_size(Model *m, uint64_t size) {
    if (size <= SMALL_SIZE) return SMALL_BUFFER;
    if (m->page_1g) return ceil_to(size, EXTRA_LARGE_BUFFER);
    if (size < MIN_LARGE_ALLOC) return m->large_segment;
    return ceil_to(size, ROUND_LARGE);
}

/* --- block pools: free blocks sorted by (stream, size, addr) --------------------------- */
static int key_less(const Key *k, uint64_t stream, uint64_t size, uint64_t addr) {
    if (k->stream != stream) return k->stream < stream;
    if (k->size != size) return k->size < size;
    return k->addr < addr;
}

static Py_ssize_t lower_bound(BlockPool *p, uint64_t stream, uint64_t size, uint64_t addr) {
    Py_ssize_t lo = 0, hi = p->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (key_less(&p->keys[mid], stream, size, addr)) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static BlockPool *pool_of(Model *m, Block *b) {
    return b->small ? &m->pools[b->pool].small : &m->pools[b->pool].large;
}

/* requests go to a private pool, or a capture is under way: c10's captures_underway */
static int underway(Model *m) { return m->route != 0 || m->capturing; }

/* a private pool's first use (createOrIncrefPool of one not held, or a routed request) */
static void pool_live(Model *m, int32_t slot) {
    Pool *pool = &m->pools[slot];
    if (!pool->alive) {
        pool->alive = 1;
        pool->use_count = 1;
    }
}

static int pool_insert(Model *m, int32_t id) {
    Block *b = &m->blocks[id];
    BlockPool *p = pool_of(m, b);
    b->gc_base = p->free_block_calls;
    if (grow((void **)&p->keys, &p->cap, p->n + 1, sizeof(Key)) < 0) return -1;
    Py_ssize_t at = lower_bound(p, b->stream, b->size, b->addr);
    memmove(&p->keys[at + 1], &p->keys[at], (size_t)(p->n - at) * sizeof(Key));
    p->keys[at] = (Key){b->stream, b->size, b->addr, id};
    p->n++;
    return 0;
}

static void pool_remove_at(BlockPool *p, Py_ssize_t at) {
    memmove(&p->keys[at], &p->keys[at + 1], (size_t)(p->n - at - 1) * sizeof(Key));
    p->n--;
}

static int pool_remove(Model *m, int32_t id) {
    Block *b = &m->blocks[id];
    BlockPool *p = pool_of(m, b);
    Py_ssize_t at = lower_bound(p, b->stream, b->size, b->addr);
    if (at == p->n || p->keys[at].id != id) {
        PyErr_Format(PyExc_AssertionError, "block 0x%llx (%llu bytes) is not in its pool",
                     (unsigned long long)b->addr, (unsigned long long)b->size);
        return -1;
    }
    pool_remove_at(p, at);
    return 0;
}

/* unmapped ranges, sorted by (stream, addr) */
static Py_ssize_t unmapped_bound(BlockPool *p, uint64_t stream, uint64_t addr) {
    Py_ssize_t lo = 0, hi = p->nu;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        UnmappedKey *k = &p->unmapped[mid];
        if (k->stream < stream || (k->stream == stream && k->addr < addr)) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static int insert_unmapped(Model *m, int32_t id) {
    Block *b = &m->blocks[id];
    BlockPool *p = pool_of(m, b);
    if (grow((void **)&p->unmapped, &p->capu, p->nu + 1, sizeof(UnmappedKey)) < 0) return -1;
    Py_ssize_t at = unmapped_bound(p, b->stream, b->addr);
    memmove(&p->unmapped[at + 1], &p->unmapped[at], (size_t)(p->nu - at) * sizeof(UnmappedKey));
    p->unmapped[at] = (UnmappedKey){b->stream, b->addr, id};
    p->nu++;
    return 0;
}

static int remove_unmapped(Model *m, int32_t id) {
    Block *b = &m->blocks[id];
    BlockPool *p = pool_of(m, b);
    Py_ssize_t at = unmapped_bound(p, b->stream, b->addr);
    if (at == p->nu || p->unmapped[at].id != id) {
        PyErr_Format(PyExc_AssertionError, "unmapped block 0x%llx is not in its pool",
                     (unsigned long long)b->addr);
        return -1;
    }
    memmove(&p->unmapped[at], &p->unmapped[at + 1], (size_t)(p->nu - at - 1) * sizeof(UnmappedKey));
    p->nu--;
    return 0;
}

static int32_t new_block_in(Model *m, uint64_t addr, uint64_t size, uint64_t stream, int small,
                            int32_t pool, int32_t segment, int mapped) {
    int32_t id = m->free_slot;
    if (id != NONE) {
        m->free_slot = m->blocks[id].next;
    } else {
        Py_ssize_t cap = m->capblocks;
        if (m->nblocks == INT32_MAX) { PyErr_SetString(PyExc_MemoryError, "too many blocks"); return NONE; }
        if (grow((void **)&m->blocks, &cap, (Py_ssize_t)m->nblocks + 1, sizeof(Block)) < 0) return NONE;
        m->capblocks = (int32_t)(cap > INT32_MAX ? INT32_MAX : cap);
        id = m->nblocks++;
    }
    m->blocks[id] = (Block){addr, size, 0, stream, 0, NONE, NONE, segment, pool, (uint8_t)small,
                            0, 0, (uint8_t)mapped};
    return id;
}

static void drop_block(Model *m, int32_t id) {
    m->blocks[id].dead = 1;
    m->blocks[id].next = m->free_slot;
    m->free_slot = id;
}


/* --- the driver (DeviceMemory) -------------------------------------------------------- */
static Py_ssize_t ranges_after(Model *m, uint64_t start) {    /* bisect_right((start, inf)) */
    Py_ssize_t lo = 0, hi = m->nranges;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (m->ranges[mid].start <= start) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static int overlaps(Model *m, uint64_t start, uint64_t end) {
    Py_ssize_t at = ranges_after(m, start);
    if (at && m->ranges[at - 1].end > start) return 1;
    return at < m->nranges && m->ranges[at].start < end;
}

static int device_claim(Model *m, uint64_t start, uint64_t size) {
    if (grow((void **)&m->ranges, &m->capranges, m->nranges + 1, sizeof(Range)) < 0) return -1;
    /* insort((start, end)): after the ranges that sort before it */
    Py_ssize_t lo = 0, hi = m->nranges;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        Range *r = &m->ranges[mid];
        if (r->start < start || (r->start == start && r->end <= start + size)) lo = mid + 1; else hi = mid;
    }
    memmove(&m->ranges[lo + 1], &m->ranges[lo], (size_t)(m->nranges - lo) * sizeof(Range));
    m->ranges[lo] = (Range){start, start + size};
    m->nranges++;
    return 0;
}

static int fits(Model *m, uint64_t size) {
    return m->capacity < 0 || (size <= (uint64_t)m->capacity && m->used <= (uint64_t)m->capacity - size);
}

/* cudaMalloc: 1 with *addr set, 0 when the device is full, -1 on error */
static int device_malloc(Model *m, uint64_t size, uint64_t *addr) {
    if (!fits(m, size)) return 0;
    int found = 0;
    if (m->expected_head < m->nexpected && m->expected[2 * m->expected_head + 1] == size) {
        *addr = m->expected[2 * m->expected_head];
        m->expected_head++;
        found = !overlaps(m, *addr, *addr + size);
    }
    if (!found) {
        *addr = m->fresh;
        m->fresh += ceil_to(size, 2 * MiB) + 2 * MiB;
    }
    if (device_claim(m, *addr, size) < 0) return -1;
    m->used += size;
    return 1;
}

static void device_unclaim(Model *m, uint64_t addr) {
    Py_ssize_t at = ranges_after(m, addr) - 1;
    if (at >= 0) {
        memmove(&m->ranges[at], &m->ranges[at + 1], (size_t)(m->nranges - at - 1) * sizeof(Range));
        m->nranges--;
    }
}

static void device_free(Model *m, uint64_t addr, uint64_t size) {
    device_unclaim(m, addr);
    m->used -= size;
}

/* --- expandable segments (ExpandableSegment) ------------------------------------------ */
static uint64_t expandable_page(Model *m, int small) {
    if (small) return SMALL_BUFFER;
    return m->page_1g ? EXTRA_LARGE_BUFFER : m->large_page;
}

/* a new segment of `space` bytes of addresses at `base` (-1: a fresh range); its index */
static Py_ssize_t new_expandable(Model *m, uint64_t stream, uint64_t page, uint64_t space, int64_t base) {
    if (grow((void **)&m->segs, &m->capsegs, m->nsegs + 1, sizeof(Expandable)) < 0) return -1;
    Expandable *e = &m->segs[m->nsegs];
    *e = (Expandable){stream, page, space / page + (space % page != 0), 0, 0, 1};
    uint64_t size = e->max_pages * page;
    if (base < 0) {                                   /* DeviceMemory._address("reserve") */
        e->base = m->fresh;
        m->fresh += ceil_to(size, 2 * MiB) + 2 * MiB;
    } else {
        e->base = (uint64_t)base;
    }
    if (device_claim(m, e->base, size) < 0) return -1;
    return m->nsegs++;
}

/* pages [*begin, *end) under [ptr, ptr+size), rounded out; the caller keeps the range inside
 * the segment, so neither the sum nor the product can wrap */
static void pages_under(Expandable *e, uint64_t ptr, uint64_t size, uint64_t *begin, uint64_t *end) {
    uint64_t from = ptr - e->base, to = from + size;
    *begin = from / e->page;
    *end = to / e->page + (to % e->page != 0);
}

/* pages a recording shows mapped before it began; ranges come in address order, so the pages
 * any earlier range marked past this one's start are those below marked_end */
static int mark_mapped(Model *m, Expandable *e, uint64_t ptr, uint64_t size) {
    uint64_t begin, end;
    pages_under(e, ptr, size, &begin, &end);
    if (begin < e->marked_end) begin = e->marked_end;
    if (end > begin) {
        m->used += (end - begin) * e->page;
        e->marked_end = end;
    }
    return 0;
}

/* map the pages under [ptr, ptr+size): *mapped 0 when the device has no room */
static int seg_map(Model *m, Expandable *e, uint64_t ptr, uint64_t size, uint64_t *start, uint64_t *mapped) {
    uint64_t begin, end;
    pages_under(e, ptr, size, &begin, &end);
    *start = e->base + begin * e->page;
    *mapped = 0;
    if (begin == end) return 0;
    uint64_t bytes = (end - begin) * e->page;
    /* cuMemCreate page by page fails at the first page past the capacity, and the call undoes
     * what it mapped: all or nothing */
    if (!fits(m, bytes)) return 0;
    m->used += bytes;
    *mapped = bytes;
    return 0;
}

/* unmap the pages lying wholly inside [ptr, ptr+size) */
static int seg_unmap(Model *m, Expandable *e, uint64_t ptr, uint64_t size, uint64_t *start, uint64_t *unmapped) {
    uint64_t from = ptr - e->base, to = from + size;
    uint64_t begin = from / e->page + (from % e->page != 0), end = to / e->page;
    *start = ptr;
    *unmapped = 0;
    if (begin >= end) return 0;
    *start = e->base + begin * e->page;
    *unmapped = (end - begin) * e->page;
    m->used -= *unmapped;
    return 0;
}

/* --- segments and statistics ------------------------------------------------------------ */
static int reserve(Model *m, int32_t pool, uint64_t size, int sign, uint8_t action, uint64_t addr,
                   uint64_t stream) {
    m->pools[pool].reserved += sign > 0 ? size : -size;
    if (sign > 0) {
        m->reserved += size;
        if (m->reserved > m->peak_reserved) m->peak_reserved = m->reserved;
        m->num_device_alloc++;
    } else {
        m->reserved -= size;
        m->num_device_free++;
    }
    if (grow((void **)&m->events, &m->capevents, m->nevents + 1, sizeof(Event)) < 0) return -1;
    m->events[m->nevents++] = (Event){addr, size, stream, pool, action};
    return 0;
}

static int is_split(Block *b) { return b->prev != NONE || b->next != NONE; }

static int32_t try_merge(Model *m, int32_t dst, int32_t src) {
    if (src == NONE || m->blocks[src].allocated || m->blocks[src].mapped != m->blocks[dst].mapped)
        return 0;
    if ((m->blocks[src].mapped ? pool_remove(m, src) : remove_unmapped(m, src)) < 0) return -1;
    Block *d = &m->blocks[dst], *s = &m->blocks[src];
    if (d->prev == src) {
        d->addr = s->addr;
        d->prev = s->prev;
        if (d->prev != NONE) m->blocks[d->prev].next = dst;
    } else {
        d->next = s->next;
        if (d->next != NONE) m->blocks[d->next].prev = dst;
    }
    d->size += s->size;
    drop_block(m, src);
    return 0;
}

static int release_block(Model *m, int32_t id) {
    Block *b = &m->blocks[id];
    device_free(m, b->addr, b->size);
    if (pool_remove(m, id) < 0) return -1;
    b = &m->blocks[id];
    int error = reserve(m, b->pool, b->size, -1, EV_SEGMENT_FREE, b->addr, b->stream);
    if (is_split(b)) b->dead = 1;             /* its neighbours still name it, as in Python */
    else drop_block(m, id);
    return error;
}

/* splice a new block between prev and next */
static void splice(Model *m, int32_t id, int32_t prev, int32_t next) {
    if (prev != NONE) m->blocks[prev].next = id;
    m->blocks[id].prev = prev;
    if (next != NONE) m->blocks[next].prev = id;
    m->blocks[id].next = next;
}

static int unmap_block(Model *m, int32_t id) {
    Block *b = &m->blocks[id];
    uint64_t start, unmapped;
    if (seg_unmap(m, &m->segs[b->segment], b->addr, b->size, &start, &unmapped) < 0) return -1;
    if (unmapped == 0) return 0;
    if (pool_remove(m, id) < 0) return -1;
    b = &m->blocks[id];
    uint64_t before = start - b->addr, addr = b->addr, size = b->size, stream = b->stream;
    int small = b->small;
    int32_t segment = b->segment, pool = b->pool;
    if (before > 0) {
        int32_t head = new_block_in(m, addr, before, stream, small, pool, segment, 1);
        if (head == NONE) return -1;
        splice(m, head, m->blocks[id].prev, id);
        if (pool_insert(m, head) < 0) return -1;
    }
    uint64_t after = size - before - unmapped;
    if (after > 0) {
        int32_t tail = new_block_in(m, start + unmapped, after, stream, small, pool, segment, 1);
        if (tail == NONE) return -1;
        splice(m, tail, id, m->blocks[id].next);
        if (pool_insert(m, tail) < 0) return -1;
    }
    b = &m->blocks[id];
    b->addr = start;
    b->size = unmapped;
    b->mapped = 0;
    if (try_merge(m, id, m->blocks[id].prev) < 0 || try_merge(m, id, m->blocks[id].next) < 0) return -1;
    if (insert_unmapped(m, id) < 0) return -1;
    return reserve(m, pool, unmapped, -1, EV_SEGMENT_UNMAP, start, stream);
}

static int release_blocks(Model *m, BlockPool *p) {
    Py_ssize_t n = p->n;
    if (!n) return 0;
    int32_t *ids = PyMem_Malloc((size_t)n * sizeof(int32_t));
    if (!ids) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) ids[i] = p->keys[i].id;
    int error = 0;
    Py_ssize_t to_unmap = 0;                  /* kept at the front of ids */
    for (Py_ssize_t i = 0; i < n && !error; i++) {
        Block *b = &m->blocks[ids[i]];
        if (b->segment != NONE) ids[to_unmap++] = ids[i];
        else if (!is_split(b)) error = release_block(m, ids[i]);
    }
    for (Py_ssize_t i = 0; i < to_unmap && !error; i++) {
        int32_t id = ids[i];
        error = unmap_block(m, id);
        Block *b = &m->blocks[id];
        if (!error && !is_split(b) && !b->mapped) {
            error = remove_unmapped(m, id);
            Expandable *e = &m->segs[b->segment];
            device_unclaim(m, e->base);       /* the segment goes: its addresses too */
            e->alive = 0;
            drop_block(m, id);
        }
    }
    PyMem_Free(ids);
    return error;
}

/* release_cached_blocks: with slot 0 the default pools' (unless a capture is under way) and
 * every released private pool's, in the order they were released; with a private slot, that
 * pool's if it was released (emptyCache(id)). A released pool left with nothing is forgotten. */
static int release_cached(Model *m, int32_t slot) {
    if (slot == 0 && !underway(m)) {
        if (release_blocks(m, &m->pools[0].large) < 0 || release_blocks(m, &m->pools[0].small) < 0)
            return -1;
    }
    for (Py_ssize_t i = 0; i < m->nfreeable;) {
        int32_t released = m->freeable[i];
        Pool *pool = &m->pools[released];
        if (slot != 0 && slot != released) { i++; continue; }
        if (release_blocks(m, &pool->small) < 0 || release_blocks(m, &pool->large) < 0)
            return -1;
        if (pool->reserved == 0) {           /* forgotten, with the unmapped ranges it held (their
                                                segments keep their addresses, as in c10) */
            BlockPool *parts[2] = {&pool->small, &pool->large};
            for (int part = 0; part < 2; part++) {
                for (Py_ssize_t k = 0; k < parts[part]->nu; k++) drop_block(m, parts[part]->unmapped[k].id);
                parts[part]->nu = 0;
            }
            pool->alive = 0;
            memmove(&m->freeable[i], &m->freeable[i + 1], (size_t)(m->nfreeable - i - 1) * sizeof(int32_t));
            m->nfreeable--;
        } else {
            i++;
        }
    }
    return 0;
}

/* the oversize cached blocks to free for `size` (their ids in *chosen, at most p->n);
 * returns whether they add up to enough */
static int oversize_blocks(Model *m, BlockPool *p, uint64_t size, uint64_t stream,
                           int32_t *chosen, Py_ssize_t *count) {
    uint64_t limit = m->max_split;
    *count = 0;
    if (limit == UINT64_MAX) return 0;
    uint64_t wanted = size > limit ? size : limit;
    Py_ssize_t at = lower_bound(p, stream, wanted, 0);
    if (at < p->n && p->keys[at].stream == stream) {
        if (m->blocks[p->keys[at].id].segment != NONE) return 0;
        chosen[(*count)++] = p->keys[at].id;
        return 1;
    }
    uint64_t released = 0;
    for (at--; released < wanted && at >= 0 && p->keys[at].stream == stream; at--) {
        if (p->keys[at].size < limit || m->blocks[p->keys[at].id].segment != NONE) break;
        chosen[(*count)++] = p->keys[at].id;
        released += p->keys[at].size;
    }
    return released >= wanted;
}

static int release_available(Model *m, BlockPool *p, uint64_t size, uint64_t stream) {
    int32_t *chosen = PyMem_Malloc((size_t)(p->n + 1) * sizeof(int32_t));
    if (!chosen) { PyErr_NoMemory(); return -1; }
    Py_ssize_t count;
    int enough = oversize_blocks(m, p, size, stream, chosen, &count);
    for (Py_ssize_t i = 0; i < count; i++)
        if (release_block(m, chosen[i]) < 0) { enough = -1; break; }
    PyMem_Free(chosen);
    return enough;
}

/* --- finding and placing blocks -------------------------------------------------------- */
static uint64_t expandable_size(Model *m, int32_t id) {    /* the size it can grow to */
    Block *b = &m->blocks[id];
    return b->size + (b->next != NONE && !m->blocks[b->next].mapped ? m->blocks[b->next].size : 0);
}

static int collects(Model *m) { return m->allowed >= 0 && m->gc_threshold > 0; }

static int32_t get_free_block(Model *m, BlockPool *p, uint64_t size, uint64_t stream) {
    if (collects(m)) p->free_block_calls++;
    Py_ssize_t at = lower_bound(p, stream, size, 0);
    if (at == p->n || p->keys[at].stream != stream) return NONE;
    int32_t id = p->keys[at].id;
    if (m->blocks[id].segment != NONE) {
        if (m->expandable) {
            Py_ssize_t following = at + 1;
            while (m->blocks[id].segment != NONE && following < p->n && p->keys[following].stream == stream
                   && expandable_size(m, p->keys[following].id) < expandable_size(m, id)) {
                id = p->keys[following].id;
                at = following++;
            }
        } else {                         /* expandable blocks from before it was turned off */
            at++;
            while (at < p->n && p->keys[at].stream == stream && m->blocks[p->keys[at].id].segment != NONE)
                at++;
            if (at == p->n || p->keys[at].stream != stream) return NONE;
            id = p->keys[at].id;
        }
    }
    uint64_t found = m->blocks[id].size;
    if (size < m->max_split && m->max_split <= found) return NONE;
    if (size >= m->max_split && found - size >= m->max_non_split) return NONE;
    pool_remove_at(p, at);
    return id;
}

/* c10's map_block: 1 mapped, 0 the device had no room, -1 on error */
static int map_block(Model *m, int32_t id, uint64_t size) {
    Block *b = &m->blocks[id];
    uint64_t start, mapped;
    if (seg_map(m, &m->segs[b->segment], b->addr, size, &start, &mapped) < 0) return -1;
    if (mapped == 0) return 0;
    if (remove_unmapped(m, id) < 0) return -1;
    b = &m->blocks[id];
    b->mapped = 1;
    if (mapped < b->size) {
        int32_t rest = new_block_in(m, b->addr + mapped, b->size - mapped, b->stream, b->small,
                                    b->pool, b->segment, 0);
        if (rest == NONE) return -1;
        splice(m, rest, id, m->blocks[id].next);
        if (insert_unmapped(m, rest) < 0) return -1;
        m->blocks[id].size = mapped;
    }
    if (try_merge(m, id, m->blocks[id].prev) < 0 || try_merge(m, id, m->blocks[id].next) < 0) return -1;
    if (pool_insert(m, id) < 0) return -1;
    return reserve(m, m->blocks[id].pool, mapped, +1, EV_SEGMENT_MAP, start, m->blocks[id].stream) < 0
        ? -1 : 1;
}

static int32_t find_expandable_block(Model *m, BlockPool *p, int small, int32_t pool, uint64_t size,
                                     uint64_t stream) {
    for (Py_ssize_t at = unmapped_bound(p, stream, 0); at < p->nu && p->unmapped[at].stream == stream; at++) {
        int32_t candidate = p->unmapped[at].id;
        int32_t prev = m->blocks[candidate].prev;
        if (prev != NONE && !m->blocks[prev].allocated) candidate = prev;
        uint64_t room = 0;
        for (int32_t walker = candidate; room < size && walker != NONE && !m->blocks[walker].allocated;
             walker = m->blocks[walker].next)
            room += m->blocks[walker].size;
        if (room >= size) return candidate;
    }
    Py_ssize_t seg = new_expandable(m, stream, expandable_page(m, small), m->space, -1);
    if (seg < 0) return NONE;
    Expandable *e = &m->segs[seg];
    int32_t whole = new_block_in(m, e->base, e->max_pages * e->page, stream, small, pool, (int32_t)seg, 0);
    if (whole == NONE || insert_unmapped(m, whole) < 0) return NONE;
    return whole;
}

/* 1 with *id set, 0 when the device had no room, -1 on error */
static int allocate_expandable(Model *m, BlockPool *p, int small, int32_t pool, uint64_t size,
                               uint64_t stream, int32_t *id) {
    int32_t candidate = find_expandable_block(m, p, small, pool, size, stream);
    if (candidate == NONE) return -1;
    if (!m->blocks[candidate].mapped) {
        uint64_t want = m->blocks[candidate].size < size ? m->blocks[candidate].size : size;
        int got = map_block(m, candidate, want);
        if (got <= 0) return got;
    }
    while (m->blocks[candidate].size < size) {
        int32_t following = m->blocks[candidate].next;
        if (following == NONE) return 0;   /* larger than the address space: more than the device */
        uint64_t missing = size - m->blocks[candidate].size;
        int got = map_block(m, following, missing < m->blocks[following].size ? missing : m->blocks[following].size);
        if (got <= 0) return got;
        candidate = following;
    }
    if (pool_remove(m, candidate) < 0) return -1;
    *id = candidate;
    return 1;
}

/* 1 with *id set, 0 when refused, -1 on error */
static int alloc_block(Model *m, BlockPool *p, int small, int32_t pool, uint64_t size,
                       uint64_t alloc_size, uint64_t stream, int retry, int32_t *id) {
    if (retry) m->num_alloc_retries++;
    if (m->allowed >= 0 && m->reserved + alloc_size > (uint64_t)m->allowed) return 0;
    if (m->expandable) return allocate_expandable(m, p, small, pool, size, stream, id);
    uint64_t addr;
    int got = device_malloc(m, alloc_size, &addr);
    if (got <= 0) return got;
    *id = new_block_in(m, addr, alloc_size, stream, small, pool, NONE, 1);
    if (*id == NONE) return -1;
    return reserve(m, pool, alloc_size, +1, EV_SEGMENT_ALLOC, addr, stream) < 0 ? -1 : 1;
}

static int should_split(Model *m, Block *b, uint64_t size) {
    uint64_t remaining = b->size - size;
    if (b->small || m->expandable) return remaining >= MIN_BLOCK;
    return size < m->max_split && remaining > SMALL_SIZE;
}

/* torch_npu: in expandable segments, blocks of 2 MiB or more start on base_addr_aligned_kb; the
 * bytes skipped stay free in the pool */
static int32_t align_start(Model *m, int32_t id, uint64_t size) {
    Block *b = &m->blocks[id];
    uint64_t align = m->align;
    if (!(size >= ROUND_LARGE && m->expandable && align && b->addr % align)) return id;
    uint64_t offset = align - b->addr % align;
    if (offset + size > b->size) return id;
    int32_t aligned = new_block_in(m, b->addr + offset, b->size - offset, b->stream, b->small, b->pool,
                                   b->segment, 1);
    if (aligned == NONE) return NONE;
    splice(m, aligned, id, m->blocks[id].next);
    m->blocks[id].size = offset;
    if (pool_insert(m, id) < 0) return NONE;
    return aligned;
}

static int32_t alloc_found_block(Model *m, int32_t id, uint64_t size, uint64_t orig, uint64_t stream) {
    Block *remaining = &m->blocks[id];
    if (should_split(m, remaining, size)) {
        uint64_t addr = remaining->addr;
        int32_t split = new_block_in(m, addr, size, stream, remaining->small, remaining->pool,
                                     remaining->segment, 1);
        if (split == NONE) return NONE;
        remaining = &m->blocks[id];                  /* blocks may have moved */
        splice(m, split, remaining->prev, id);
        remaining = &m->blocks[id];
        remaining->addr += size;
        remaining->size -= size;
        if (pool_insert(m, id) < 0) return NONE;
        id = split;
    }
    Block *b = &m->blocks[id];
    b->allocated = 1;
    b->requested = orig;
    m->allocations++;
    m->allocated_bytes += b->size;
    m->requested_bytes += orig;
    return id;
}

static int model_free(Model *m, int32_t id) {
    Block *b = &m->blocks[id];
    b->allocated = 0;
    m->allocated_bytes -= b->size;
    m->requested_bytes -= b->requested;
    m->allocations--;
    if (try_merge(m, id, b->prev) < 0 || try_merge(m, id, m->blocks[id].next) < 0) return -1;
    return pool_insert(m, id);
}

static uint64_t largest_key(BlockPool *p, int any_stream, uint64_t stream) {
    uint64_t most = 0;
    for (Py_ssize_t i = 0; i < p->n; i++)
        if ((any_stream || p->keys[i].stream == stream) && p->keys[i].size > most) most = p->keys[i].size;
    return most;
}

static int out_of_memory(Model *m, uint64_t orig, uint64_t size, uint64_t alloc_size,
                         uint64_t stream, BlockPool *p) {
    m->num_ooms++;
    int has_free = m->capacity >= 0 || m->allowed >= 0;
    int64_t free = m->capacity < 0 ? -1 : (int64_t)((uint64_t)m->capacity - m->used);
    if (m->allowed >= 0) {
        int64_t room = m->reserved > (uint64_t)m->allowed ? 0 : (int64_t)((uint64_t)m->allowed - m->reserved);
        int64_t f = free >= 0 ? free : m->allowed;
        free = f < room ? f : room;
        if (free < 0) free = 0;
    }
    if (grow((void **)&m->events, &m->capevents, m->nevents + 1, sizeof(Event)) < 0) return -1;
    if (!has_free) free = 0;                       /* (`free or 0`) */
    m->events[m->nevents++] = (Event){(uint64_t)free, size, stream, m->route, EV_OOM};
    uint64_t largest = 0;
    for (Py_ssize_t slot = 0; slot < m->npools; slot++) {
        uint64_t small = largest_key(&m->pools[slot].small, 1, 0);
        uint64_t large = largest_key(&m->pools[slot].large, 1, 0);
        largest = small > largest ? small : largest;
        largest = large > largest ? large : largest;
    }
    m->oom[0] = orig; m->oom[1] = size; m->oom[2] = alloc_size; m->oom[3] = stream;
    m->oom[4] = (uint64_t)free;
    m->oom_has_free = has_free;
    m->oom[5] = largest_key(p, 0, stream);
    m->oom[6] = largest;
    return 0;
}

/* what garbage_collect_cached_blocks frees, in its order (ids in *chosen, at most large.n):
 * rounds over the large pool, each freeing every unsplit cudaMalloc'd block at least as old as
 * the average of those left (expandable ones count in the average, never go), until what is
 * freed covers the excess over the threshold or a round frees nothing */
static Py_ssize_t collectable(Model *m, int32_t *chosen) {
    uint64_t threshold = (uint64_t)(m->gc_threshold * (double)m->allowed);
    if (m->reserved <= threshold) return 0;
    uint64_t target = m->reserved - threshold;
    BlockPool *p = &m->pools[0].large;                /* (the default large pool only, as c10) */
    Py_ssize_t nunsplit = 0, count = 0, taken_count = 0;
    int32_t *unsplit = PyMem_Malloc((size_t)(p->n + 1) * sizeof(int32_t));
    uint8_t *taken = PyMem_Calloc((size_t)(p->n + 1), 1);
    if (!unsplit || !taken) { PyMem_Free(unsplit); PyMem_Free(taken); PyErr_NoMemory(); return -1; }
    uint64_t total_age = 0;
    for (Py_ssize_t i = 0; i < p->n; i++)
        if (!is_split(&m->blocks[p->keys[i].id])) {
            unsplit[nunsplit++] = p->keys[i].id;
            total_age += p->free_block_calls - m->blocks[p->keys[i].id].gc_base;
        }
    count = nunsplit;
    uint64_t reclaimed = 0;
    int freed = 1;
    while (reclaimed < target && freed && count > 0) {
        double average = (double)total_age / (double)count;
        freed = 0;
        for (Py_ssize_t i = 0; i < nunsplit; i++) {
            Block *b = &m->blocks[unsplit[i]];
            uint64_t age = p->free_block_calls - b->gc_base;
            if (taken[i] || b->segment != NONE || (double)age < average) continue;
            freed = 1;
            reclaimed += b->size;
            total_age -= age;
            count--;
            taken[i] = 1;
            chosen[taken_count++] = unsplit[i];
        }
    }
    PyMem_Free(unsplit);
    PyMem_Free(taken);
    return taken_count;
}

static int garbage_collect(Model *m) {
    int32_t *chosen = PyMem_Malloc((size_t)(m->pools[0].large.n + 1) * sizeof(int32_t));
    if (!chosen) { PyErr_NoMemory(); return -1; }
    Py_ssize_t count = collectable(m, chosen);
    int error = count < 0;
    for (Py_ssize_t i = 0; i < count && !error; i++) error = release_block(m, chosen[i]) < 0;
    PyMem_Free(chosen);
    return error ? -1 : 0;
}

/* the pool a request of `size` (rounded) bytes goes to (get_pool) */
static BlockPool *request_pool(Model *m, uint64_t size) {
    return size <= SMALL_SIZE ? &m->pools[m->route].small : &m->pools[m->route].large;
}

/* malloc: 1 with *id set, 0 when out of memory (m->oom says how), -1 on error */
static int model_malloc(Model *m, uint64_t orig, uint64_t stream, int32_t *id) {
    uint64_t size = round_size(m, orig);
    int small = size <= SMALL_SIZE;
    int32_t pool = m->route;
    BlockPool *p = request_pool(m, size);
    uint64_t alloc_size = allocation_size(m, size);
    int32_t found = get_free_block(m, p, size, stream);
    if (found != NONE) {
        m->cache_hits++;
    } else {
        if (collects(m) && garbage_collect(m) < 0) return -1;
        int got = alloc_block(m, p, small, pool, size, alloc_size, stream, 0, &found);
        if (got == 0) {
            got = release_available(m, p, size, stream);
            if (got == 1) got = alloc_block(m, p, small, pool, size, alloc_size, stream, 0, &found);
        }
        if (got == 0 && !underway(m)) {      /* (its own pools stay put; p is unchanged) */
            if (release_cached(m, 0) < 0) return -1;
            got = alloc_block(m, p, small, pool, size, alloc_size, stream, 1, &found);
        }
        if (got < 0) return -1;
        if (got == 0) return out_of_memory(m, orig, size, alloc_size, stream, p) < 0 ? -1 : 0;
    }
    if (m->npu) {
        found = align_start(m, found, size);
        if (found == NONE) return -1;
    }
    *id = alloc_found_block(m, found, size, orig, stream);
    return *id == NONE ? -1 : 1;
}

/* --- the replay ------------------------------------------------------------------------ */
static int replay_alloc(Model *m, uint64_t addr, uint64_t size, uint64_t stream) {
    int32_t id;
    m->requests++;
    int got = model_malloc(m, size, stream, &id);
    if (got <= 0) return got;
    if (m->blocks[id].addr != addr) m->misplaced++;
    int existed;
    if (live_put(&m->live, addr, id, &existed) < 0) return -1;
    if (existed) m->unmatched++;
    m->replay_allocated += size;
    if (m->replay_allocated > m->replay_peak) m->replay_peak = m->replay_allocated;
    return 1;
}

static int replay_free(Model *m, uint64_t addr) {
    int32_t id = live_pop(&m->live, addr);
    if (id == NONE || !m->blocks[id].allocated) {
        m->unmatched++;
        return 0;
    }
    m->replay_allocated -= m->blocks[id].requested;
    return model_free(m, id);
}

/* run(kinds, action, addr, size, stream, start, stop, stop_on_events[, routes]) -> (index, why):
 * play entries start..stop-1 (kinds[action] says what each is) until one the caller must
 * handle (an irregular entry: the index is its own), an alloc the model could not serve (its
 * index), or, with stop_on_events, an alloc that made segment events (the index after it).
 * routes: int32 per entry, an alloc's pool slot times 2, plus 1 during a capture (None: the
 * default pools, no capture) */
static PyObject *Model_run(Model *m, PyObject *args) {
    PyObject *objects[6] = {NULL, NULL, NULL, NULL, NULL, Py_None};
    Py_ssize_t start, stop;
    int stop_on_events;
    if (!PyArg_ParseTuple(args, "OOOOOnnp|O", &objects[0], &objects[1], &objects[2], &objects[3],
                          &objects[4], &start, &stop, &stop_on_events, &objects[5]))
        return NULL;
    static const char *names[6] = {"kinds", "action", "addr", "size", "stream", "routes"};
    int columns = objects[5] == Py_None ? 5 : 6;
    Py_buffer views[6];
    int held = 0;
    PyObject *result = NULL;
    Py_ssize_t n = 0;
    for (; held < columns; held++) {
        if (PyObject_GetBuffer(objects[held], &views[held], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            goto release;
        Py_ssize_t itemsize = held < 2 ? 1 : held == 5 ? 4 : 8;
        const char *format = views[held].format ? views[held].format : "B";
        if (held == 5 && (views[held].itemsize != 4 || !strchr("il", format[strspn(format, "@=<")]))) {
            PyErr_SetString(PyExc_ValueError, "column routes: int32 values expected");
            held++;
            goto release;
        }
        Py_ssize_t length = held == 0 ? 256 : held == 1 ? views[1].len : n;
        if (held == 1) n = views[1].len;
        if (views[held].len != itemsize * length) {
            PyErr_Format(PyExc_ValueError, "column %s holds %zd bytes, not %zd", names[held],
                         views[held].len, itemsize * length);
            held++;
            goto release;
        }
    }
    if (start < 0 || stop > n || start > stop) {
        PyErr_Format(PyExc_IndexError, "entries %zd:%zd of %zd", start, stop, n);
        goto release;
    }
    const uint8_t *k = views[0].buf, *a = views[1].buf;
    const uint64_t *ad = views[2].buf, *sz = views[3].buf, *st = views[4].buf;
    const int32_t *routes = columns == 6 ? views[5].buf : NULL;
    Py_ssize_t i = start;
    int why = DONE;
    for (; i < stop; i++) {
        int kind = k[a[i]];
        if (kind == ALLOC) {
            Py_ssize_t before = m->nevents;
            int32_t route = m->route;
            int capturing = m->capturing;
            if (routes && routes[i]) {
                int32_t slot = routes[i] >> 1;
                if (slot < 0 || slot >= m->npools) {
                    PyErr_Format(PyExc_ValueError, "entry %zd: a route to pool slot %d of %zd", i,
                                 (int)slot, m->npools);
                    goto release;
                }
                if (slot) pool_live(m, slot);
                m->route = slot;
                m->capturing = routes[i] & 1;
            }
            int got = replay_alloc(m, ad[i], sz[i], st[i]);
            m->route = route;
            m->capturing = capturing;
            if (got < 0) goto release;
            if (got == 0) { why = OUT_OF_MEMORY; break; }
            if (stop_on_events && m->nevents > before) { why = EVENTS; i++; break; }
        } else if (kind == FREE) {
            if (replay_free(m, ad[i]) < 0) goto release;
        } else if (kind == IRREGULAR) {
            why = AT_IRREGULAR;
            break;
        }
    }
    result = Py_BuildValue("ni", i, why);
release:
    while (held > 0) PyBuffer_Release(&views[--held]);
    return result;
}

/* --- the Python face -------------------------------------------------------------------- */
static PyObject *Model_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    Model *m = (Model *)type->tp_alloc(type, 0);
    if (!m) return NULL;
    m->free_slot = NONE;
    if (live_resize(&m->live, 1024) < 0 || grow((void **)&m->pools, &m->cappools, 1, sizeof(Pool)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    memset(&m->pools[0], 0, sizeof(Pool));
    m->pools[0] = (Pool){.use_count = 1, .alive = 1};
    m->npools = 1;
    return (PyObject *)m;
}

static void Model_dealloc(Model *m) {
    PyMem_Free(m->ranges);
    PyMem_Free(m->expected);
    PyMem_Free(m->blocks);
    for (Py_ssize_t i = 0; i < m->npools; i++) {
        PyMem_Free(m->pools[i].small.keys);
        PyMem_Free(m->pools[i].large.keys);
        PyMem_Free(m->pools[i].small.unmapped);
        PyMem_Free(m->pools[i].large.unmapped);
    }
    PyMem_Free(m->pools);
    PyMem_Free(m->freeable);
    PyMem_Free(m->segs);
    PyMem_Free(m->events);
    live_free(&m->live);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static int as_u64(PyObject *obj, uint64_t *out) {
    *out = PyLong_AsUnsignedLongLong(obj);
    return *out == (uint64_t)-1 && PyErr_Occurred() ? -1 : 0;
}

/* Model(pad, divisions, max_split, max_non_split, large_segment, page_1g, expandable,
 *       large_page, npu, align, gc_threshold, capacity, allowed, space, fresh, expected):
 *       capacity and allowed -1 for none; divisions 16 numbers; space the addresses a new
 *       expandable segment reserves (allocator.address_space); expected the recording's
 *       segment_alloc (addr, size) in order, as a flat sequence */
static int Model_init(Model *m, PyObject *args, PyObject *kw) {
    PyObject *divisions, *expected;
    long long capacity, allowed;
    if (!PyArg_ParseTuple(args, "KOKKKppKpKdLLKKO", &m->pad, &divisions, &m->max_split,
                          &m->max_non_split, &m->large_segment, &m->page_1g, &m->expandable,
                          &m->large_page, &m->npu, &m->align, &m->gc_threshold, &capacity,
                          &allowed, &m->space, &m->fresh, &expected))
        return -1;
    if (!m->large_page) {
        PyErr_SetString(PyExc_ValueError, "large_page: more than 0 bytes");
        return -1;
    }
    m->capacity = capacity;
    m->allowed = allowed;
    PyObject *seq = PySequence_Fast(divisions, "divisions: a sequence");
    if (!seq) return -1;
    if (PySequence_Fast_GET_SIZE(seq) != INTERVALS) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "divisions: 16 numbers");
        return -1;
    }
    for (int i = 0; i < INTERVALS; i++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v < 0 || v > 255) {
            Py_DECREF(seq);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "divisions: 0 to 255");
            return -1;
        }
        m->divisions[i] = (uint8_t)v;
    }
    Py_DECREF(seq);
    seq = PySequence_Fast(expected, "expected: a sequence");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyMem_Free(m->expected);
    m->expected = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
    m->nexpected = n / 2;
    m->expected_head = 0;
    if (!m->expected) { Py_DECREF(seq); PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < n; i++)
        if (as_u64(PySequence_Fast_GET_ITEM(seq, i), &m->expected[i]) < 0) { Py_DECREF(seq); return -1; }
    Py_DECREF(seq);
    return 0;
}

/* blocks (addr, size, requested, allocated) of one segment, in address order, after
 * `previous`: the allocated ones become live; the last one's id (`previous` for none), or -2 */
static int32_t restore_blocks(Model *m, PyObject *blocks, uint64_t stream, int small,
                              int32_t pool, int32_t segment, int32_t previous) {
    PyObject *items = PySequence_Fast(blocks, "blocks: a sequence");
    if (!items) return -2;
    for (Py_ssize_t b = 0; b < PySequence_Fast_GET_SIZE(items); b++) {
        uint64_t addr, size, requested;
        int allocated, existed;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(items, b), "KKKp", &addr, &size,
                              &requested, &allocated)) goto fail;
        int32_t id = new_block_in(m, addr, size, stream, small, pool, segment, 1);
        if (id == NONE) goto fail;
        m->blocks[id].prev = previous;
        if (previous != NONE) m->blocks[previous].next = id;
        if (allocated) {
            m->blocks[id].allocated = 1;
            m->blocks[id].requested = requested;
            if (live_put(&m->live, addr, id, &existed) < 0) goto fail;
            m->allocations++;
            m->allocated_bytes += size;
            m->requested_bytes += requested;
        } else if (pool_insert(m, id) < 0) {
            goto fail;
        }
        previous = id;
    }
    Py_DECREF(items);
    return previous;
fail:
    Py_DECREF(items);
    return -2;
}

static int pool_slot(Model *m, int slot) {
    if (slot < 0 || slot >= m->npools) {
        PyErr_Format(PyExc_ValueError, "pool slot %d of %zd", slot, m->npools);
        return -1;
    }
    return 0;
}

/* restore(segments): cudaMalloc'd segments (addr, size, stream, small, pool slot, blocks) live
 * at the start, blocks as restore_blocks takes them; a private pool met here is in use */
static PyObject *Model_restore(Model *m, PyObject *segments) {
    PyObject *seq = PySequence_Fast(segments, "segments: a sequence");
    if (!seq) return NULL;
    for (Py_ssize_t s = 0; s < PySequence_Fast_GET_SIZE(seq); s++) {
        uint64_t addr, size, stream;
        int small, slot;
        PyObject *blocks;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, s), "KKKpiO", &addr, &size, &stream,
                              &small, &slot, &blocks) || pool_slot(m, slot) < 0
            || device_claim(m, addr, size) < 0
            || restore_blocks(m, blocks, stream, small, slot, NONE, NONE) == -2) {
            Py_DECREF(seq);
            return NULL;
        }
        pool_live(m, slot);
        m->used += size;
        m->reserved += size;
        m->pools[slot].reserved += size;
    }
    Py_DECREF(seq);
    m->peak_reserved = m->reserved;
    Py_RETURN_NONE;
}

/* restore_expandable(stream, small, pool slot, base, space, ranges): one expandable segment of
 * `space` bytes of addresses from `base`, its mapped ranges (addr, size, blocks) in address
 * order */
static PyObject *Model_restore_expandable(Model *m, PyObject *args) {
    uint64_t stream, base, space;
    int small, slot;
    PyObject *ranges;
    if (!PyArg_ParseTuple(args, "KpiKKO", &stream, &small, &slot, &base, &space, &ranges)
        || pool_slot(m, slot) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(ranges, "ranges: a sequence");
    if (!seq) return NULL;
    pool_live(m, slot);
    Py_ssize_t seg = new_expandable(m, stream, expandable_page(m, small), space, (int64_t)base);
    if (seg < 0) goto fail;
    int32_t previous = NONE;
    uint64_t cursor = base;
    for (Py_ssize_t r = 0; r < PySequence_Fast_GET_SIZE(seq); r++) {
        uint64_t addr, size;
        PyObject *blocks;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, r), "KKO", &addr, &size, &blocks)) goto fail;
        if (addr > cursor) {
            int32_t gap = new_block_in(m, cursor, addr - cursor, stream, small, slot, (int32_t)seg, 0);
            if (gap == NONE) goto fail;
            m->blocks[gap].prev = previous;
            if (previous != NONE) m->blocks[previous].next = gap;
            if (insert_unmapped(m, gap) < 0) goto fail;
            previous = gap;
        }
        if (mark_mapped(m, &m->segs[seg], addr, size) < 0) goto fail;
        m->reserved += size;
        m->pools[slot].reserved += size;
        previous = restore_blocks(m, blocks, stream, small, slot, (int32_t)seg, previous);
        if (previous == -2) goto fail;
        cursor = addr + size;
    }
    uint64_t end = base + m->segs[seg].max_pages * m->segs[seg].page;
    if (cursor < end) {
        int32_t gap = new_block_in(m, cursor, end - cursor, stream, small, slot, (int32_t)seg, 0);
        if (gap == NONE) goto fail;
        m->blocks[gap].prev = previous;
        if (previous != NONE) m->blocks[previous].next = gap;
        if (insert_unmapped(m, gap) < 0) goto fail;
    }
    Py_DECREF(seq);
    m->peak_reserved = m->reserved;
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

/* start(allocated): the replay's live requested bytes at the start (its peak so far) */
static PyObject *Model_start(Model *m, PyObject *arg) {
    if (as_u64(arg, &m->replay_allocated) < 0) return NULL;
    m->replay_peak = m->replay_allocated;
    Py_RETURN_NONE;
}

/* oom_request(size, stream) -> whether a request the real allocator refused fits here (then
 * its bytes count as live) */
static PyObject *Model_oom_request(Model *m, PyObject *args) {
    uint64_t size, stream;
    int32_t id;
    if (!PyArg_ParseTuple(args, "KK", &size, &stream)) return NULL;
    int got = model_malloc(m, size, stream, &id);
    if (got < 0) return NULL;
    if (got) {
        m->replay_allocated += size;
        if (m->replay_allocated > m->replay_peak) m->replay_peak = m->replay_allocated;
    }
    return PyBool_FromLong(got);
}

/* empty_cache(slot=0): torch.cuda.empty_cache(), or with a private pool's slot what deleting its
 * MemPool does */
static PyObject *Model_empty_cache(Model *m, PyObject *args) {
    int slot = 0;
    if (!PyArg_ParseTuple(args, "|i", &slot) || pool_slot(m, slot) < 0) return NULL;
    if (release_cached(m, slot) < 0) return NULL;
    Py_RETURN_NONE;
}

/* add_pool() -> a new slot for a private pool, not yet in use */
static PyObject *Model_add_pool(Model *m, PyObject *unused) {
    if (m->npools >= INT32_MAX / 2) return PyErr_Format(PyExc_ValueError, "too many pools");
    if (grow((void **)&m->pools, &m->cappools, m->npools + 1, sizeof(Pool)) < 0) return NULL;
    memset(&m->pools[m->npools], 0, sizeof(Pool));
    return PyLong_FromSsize_t(m->npools++);
}

/* route(slot, capturing): requests go to this pool from now on (0: the default pools), with a
 * capture under way or not; a private pool not in use becomes one (TorchAllocatorModel.routed) */
static PyObject *Model_route(Model *m, PyObject *args) {
    int slot, capturing;
    if (!PyArg_ParseTuple(args, "ip", &slot, &capturing) || pool_slot(m, slot) < 0) return NULL;
    if (slot) pool_live(m, slot);
    m->route = slot;
    m->capturing = capturing;
    Py_RETURN_NONE;
}

/* release_fully(slot): every use of a private pool in use released, and it is the last of the
 * released pools (TorchAllocatorModel.release_fully) */
static PyObject *Model_release_fully(Model *m, PyObject *args) {
    int slot;
    if (!PyArg_ParseTuple(args, "i", &slot) || pool_slot(m, slot) < 0) return NULL;
    if (slot == 0 || !m->pools[slot].alive) Py_RETURN_NONE;
    m->pools[slot].use_count = 0;
    for (Py_ssize_t i = 0; i < m->nfreeable; i++)
        if (m->freeable[i] == slot) {
            memmove(&m->freeable[i], &m->freeable[i + 1], (size_t)(m->nfreeable - i - 1) * sizeof(int32_t));
            m->nfreeable--;
            break;
        }
    if (grow((void **)&m->freeable, &m->capfreeable, m->nfreeable + 1, sizeof(int32_t)) < 0) return NULL;
    m->freeable[m->nfreeable++] = slot;
    Py_RETURN_NONE;
}

/* pool(slot) -> (in use count, reserved bytes), or None for a pool not held */
static PyObject *Model_pool(Model *m, PyObject *args) {
    int slot;
    if (!PyArg_ParseTuple(args, "i", &slot) || pool_slot(m, slot) < 0) return NULL;
    if (!m->pools[slot].alive) Py_RETURN_NONE;
    return Py_BuildValue("LK", (long long)m->pools[slot].use_count, m->pools[slot].reserved);
}

/* whether malloc would serve this request from a cached block (changes nothing) */
static int would_reuse(Model *m, uint64_t orig, uint64_t stream) {
    uint64_t size = round_size(m, orig);
    BlockPool *p = request_pool(m, size);
    uint64_t calls = p->free_block_calls;
    int32_t id = get_free_block(m, p, size, stream);
    p->free_block_calls = calls;
    if (id == NONE) return 0;
    return pool_insert(m, id) < 0 ? -1 : 1;
}

static PyObject *Model_would_reuse(Model *m, PyObject *args) {
    uint64_t orig, stream;
    if (!PyArg_ParseTuple(args, "K|K", &orig, &stream)) return NULL;
    int reuse = would_reuse(m, orig, stream);
    if (reuse < 0) return NULL;
    return PyBool_FromLong(reuse);
}

static PyObject *Model_oversize_release(Model *m, PyObject *args, PyObject *kw) {
    static char *keywords[] = {"orig_size", "stream", "dry_run", NULL};
    uint64_t orig, stream = 0;
    int dry_run = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "K|Kp", keywords, &orig, &stream, &dry_run)) return NULL;
    uint64_t size = round_size(m, orig);
    BlockPool *p = request_pool(m, size);
    int32_t *chosen = PyMem_Malloc((size_t)(p->n + 1) * sizeof(int32_t));
    if (!chosen) return PyErr_NoMemory();
    Py_ssize_t count;
    oversize_blocks(m, p, size, stream, chosen, &count);
    PyObject *addrs = PyList_New(count);
    for (Py_ssize_t i = 0; addrs && i < count; i++) {
        PyObject *addr = PyLong_FromUnsignedLongLong(m->blocks[chosen[i]].addr);
        if (!addr) { Py_CLEAR(addrs); break; }
        PyList_SET_ITEM(addrs, i, addr);
    }
    for (Py_ssize_t i = 0; addrs && !dry_run && i < count; i++)
        if (release_block(m, chosen[i]) < 0) Py_CLEAR(addrs);
    PyMem_Free(chosen);
    return addrs;
}

/* collected(size, stream) -> addresses of the cached segments this request's garbage collection
 * frees, in order (none when a cached block serves it, or collection is off or not due) */
static PyObject *Model_collected(Model *m, PyObject *args) {
    uint64_t orig, stream = 0;
    if (!PyArg_ParseTuple(args, "K|K", &orig, &stream)) return NULL;
    if (!collects(m)) return PyList_New(0);
    int reuse = would_reuse(m, orig, stream);
    if (reuse < 0) return NULL;
    if (reuse) return PyList_New(0);
    int32_t *chosen = PyMem_Malloc((size_t)(m->pools[0].large.n + 1) * sizeof(int32_t));
    if (!chosen) return PyErr_NoMemory();
    Py_ssize_t count = collectable(m, chosen);
    PyObject *addrs = count < 0 ? NULL : PyList_New(count);
    for (Py_ssize_t i = 0; addrs && i < count; i++) {
        PyObject *addr = PyLong_FromUnsignedLongLong(m->blocks[chosen[i]].addr);
        if (!addr) { Py_CLEAR(addrs); break; }
        PyList_SET_ITEM(addrs, i, addr);
    }
    PyMem_Free(chosen);
    return addrs;
}

/* events(start) -> [(action, addr, size, stream, pool slot)] from the start-th on; an oom's
 * addr is the free bytes, which may be negative */
static PyObject *Model_events(Model *m, PyObject *arg) {
    Py_ssize_t start = PyLong_AsSsize_t(arg);
    if (start == -1 && PyErr_Occurred()) return NULL;
    if (start < 0) start = 0;
    PyObject *out = PyList_New(start < m->nevents ? m->nevents - start : 0);
    for (Py_ssize_t i = start; out && i < m->nevents; i++) {
        Event *e = &m->events[i];
        PyObject *item = e->action == EV_OOM
            ? Py_BuildValue("sLKKi", EVENT_NAMES[e->action], (long long)e->addr, e->size, e->stream,
                            (int)e->pool)
            : Py_BuildValue("sKKKi", EVENT_NAMES[e->action], e->addr, e->size, e->stream, (int)e->pool);
        if (!item) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, i - start, item);
    }
    return out;
}

static PyObject *Model_stats(Model *m, PyObject *unused) {
    return Py_BuildValue(
        "{sKsKsKsKsKsLsLsLsLsLsLsnsKsKsLsLsL}",
        "used", m->used, "reserved", m->reserved, "peak_reserved", m->peak_reserved,
        "allocated", m->allocated_bytes, "requested", m->requested_bytes,
        "allocations", (long long)m->allocations, "num_device_alloc", (long long)m->num_device_alloc,
        "num_device_free", (long long)m->num_device_free,
        "num_alloc_retries", (long long)m->num_alloc_retries, "num_ooms", (long long)m->num_ooms,
        "cache_hits", (long long)m->cache_hits, "events", m->nevents,
        "replay_allocated", m->replay_allocated, "replay_peak", m->replay_peak,
        "unmatched", (long long)m->unmatched, "misplaced", (long long)m->misplaced,
        "requests", (long long)m->requests);
}

/* last_oom() -> (orig, size, alloc_size, stream, free or None, usable, largest) */
static PyObject *Model_last_oom(Model *m, PyObject *unused) {
    PyObject *free = m->oom_has_free ? PyLong_FromLongLong((long long)m->oom[4]) : Py_NewRef(Py_None);
    if (!free) return NULL;
    return Py_BuildValue("KKKKNKK", m->oom[0], m->oom[1], m->oom[2], m->oom[3], free, m->oom[5], m->oom[6]);
}

/* blocks() -> [(addr, size, requested, allocated, stream, small, prev addr or None, mapped,
 * pool slot)] of every block the model holds (for the differential tests) */
static PyObject *Model_blocks(Model *m, PyObject *unused) {
    PyObject *out = PyList_New(0);
    for (int32_t i = 0; out && i < m->nblocks; i++) {
        Block *b = &m->blocks[i];
        if (b->dead) continue;
        PyObject *prev = b->prev == NONE ? Py_NewRef(Py_None) : PyLong_FromUnsignedLongLong(m->blocks[b->prev].addr);
        PyObject *item = prev ? Py_BuildValue("KKKOKONOi", b->addr, b->size, b->requested,
                                             b->allocated ? Py_True : Py_False, b->stream,
                                             b->small ? Py_True : Py_False, prev,
                                             b->mapped ? Py_True : Py_False, (int)b->pool) : NULL;
        if (!item || PyList_Append(out, item) < 0) Py_CLEAR(out);
        Py_XDECREF(item);
    }
    return out;
}

/* free_keys() -> [(pool, stream, size, addr)] and [(pool, stream, addr)] of the unmapped
 * ranges, in the pools' orders (pool 2 * slot for a small pool, 2 * slot + 1 a large one) */
static PyObject *Model_free_keys(Model *m, PyObject *unused) {
    PyObject *out = PyList_New(0), *unmapped = PyList_New(0);
    for (Py_ssize_t p = 0; out && unmapped && p < 2 * m->npools; p++) {
        BlockPool *pool = p % 2 ? &m->pools[p / 2].large : &m->pools[p / 2].small;
        for (Py_ssize_t i = 0; out && i < pool->n; i++) {
            Key *k = &pool->keys[i];
            PyObject *item = Py_BuildValue("nKKK", p, k->stream, k->size, k->addr);
            if (!item || PyList_Append(out, item) < 0) Py_CLEAR(out);
            Py_XDECREF(item);
        }
        for (Py_ssize_t i = 0; out && unmapped && i < pool->nu; i++) {
            UnmappedKey *k = &pool->unmapped[i];
            PyObject *item = Py_BuildValue("nKK", p, k->stream, k->addr);
            if (!item || PyList_Append(unmapped, item) < 0) Py_CLEAR(unmapped);
            Py_XDECREF(item);
        }
    }
    if (!out || !unmapped) { Py_XDECREF(out); Py_XDECREF(unmapped); return NULL; }
    return Py_BuildValue("NN", out, unmapped);
}

static PyMethodDef Model_methods[] = {
    {"run", (PyCFunction)Model_run, METH_VARARGS, "Play trace entries (see _native.c)."},
    {"restore", (PyCFunction)Model_restore, METH_O, "The segments live at the start."},
    {"restore_expandable", (PyCFunction)Model_restore_expandable, METH_VARARGS,
     "An expandable segment live at the start."},
    {"start", (PyCFunction)Model_start, METH_O, "The live requested bytes at the start."},
    {"oom_request", (PyCFunction)Model_oom_request, METH_VARARGS, "A refused request, again."},
    {"empty_cache", (PyCFunction)Model_empty_cache, METH_VARARGS,
     "torch.cuda.empty_cache(), or a MemPool's deletion with its slot."},
    {"add_pool", (PyCFunction)Model_add_pool, METH_NOARGS, "A slot for a private pool."},
    {"route", (PyCFunction)Model_route, METH_VARARGS, "Where requests go from now on."},
    {"release_fully", (PyCFunction)Model_release_fully, METH_VARARGS,
     "A private pool released, the last of the released."},
    {"pool", (PyCFunction)Model_pool, METH_VARARGS, "A pool's use count and reserved bytes."},
    {"would_reuse", (PyCFunction)Model_would_reuse, METH_VARARGS, "Whether a cached block serves it."},
    {"oversize_release", (PyCFunction)(void (*)(void))Model_oversize_release,
     METH_VARARGS | METH_KEYWORDS, "The oversize blocks the retry frees first."},
    {"collected", (PyCFunction)Model_collected, METH_VARARGS, "What garbage collection frees."},
    {"events", (PyCFunction)Model_events, METH_O, "Segment events from the start-th on."},
    {"stats", (PyCFunction)Model_stats, METH_NOARGS, "The model's and the replay's counts."},
    {"last_oom", (PyCFunction)Model_last_oom, METH_NOARGS, "The last refused request."},
    {"blocks", (PyCFunction)Model_blocks, METH_NOARGS, "Every block held."},
    {"free_keys", (PyCFunction)Model_free_keys, METH_NOARGS, "The pools' keys, in order."},
    {NULL}
};

static PyTypeObject ModelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npumem.alloc.torch_model._native.Model",
    .tp_basicsize = sizeof(Model),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "PyTorch's caching allocator's pools, with the replay's live blocks.",
    .tp_new = Model_new,
    .tp_init = (initproc)Model_init,
    .tp_dealloc = (destructor)Model_dealloc,
    .tp_methods = Model_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native",
    "The model of PyTorch's caching allocator, native (see allocator.py for its rules).", -1, NULL
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&ModelType) < 0) return NULL;
    PyObject *mod = PyModule_Create(&module);
    if (!mod) return NULL;
    if (PyModule_AddObjectRef(mod, "Model", (PyObject *)&ModelType) < 0 ||
        PyModule_AddIntConstant(mod, "SKIP", SKIP) < 0 || PyModule_AddIntConstant(mod, "ALLOC", ALLOC) < 0 ||
        PyModule_AddIntConstant(mod, "FREE", FREE) < 0 || PyModule_AddIntConstant(mod, "IRREGULAR", IRREGULAR) < 0 ||
        PyModule_AddIntConstant(mod, "DONE", DONE) < 0 || PyModule_AddIntConstant(mod, "AT_IRREGULAR", AT_IRREGULAR) < 0 ||
        PyModule_AddIntConstant(mod, "EVENTS", EVENTS) < 0 ||
        PyModule_AddIntConstant(mod, "OUT_OF_MEMORY", OUT_OF_MEMORY) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
