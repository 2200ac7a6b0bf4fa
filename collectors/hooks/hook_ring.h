/* The ring of call records shared by hook_fastcall.c (which writes it) and hook_ring.c (which implements it
 * and drains it into Python rows for the writer thread). See hook_fastcall.c for why this is C. */
#ifndef RANKSCOPE_HOOK_RING_H
#define RANKSCOPE_HOOK_RING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <time.h>

enum { ST_FREE = 0, ST_PENDING = 1, ST_COMPLETED = 2, ST_FAILED = 3 };

typedef struct {
    int64_t start, end, size, numel, out_size, peer, seq, step;
    int32_t op, group, dtype; /* indexes into the ring's registry */
    int8_t state, has_peer, has_out, pad;
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    uint64_t cap, max_cap, head, tail; /* head, tail: calls written and taken (or dropped) so far */
    long long step, dropped;
    int active, cuda; /* cuda: tensors may live on a GPU (their calls need CUDA events: the slow path) */
    unsigned long long generation; /* bumped when the session forgets its groups */
    unsigned long long id;         /* unique per ring in this process: caches compare ids, never addresses */
    PyObject *registry; /* op names, (group id, ranks) pairs and dtype names, by index */
} Ring;

extern PyTypeObject RingType;
extern Ring *current_ring; /* the recording session's ring; NULL: every call takes the slow path */

/* The slot for a new call, by absolute index; drops the oldest call when the ring is at its cap. */
Slot *ring_push(Ring *r, uint64_t *index);
/* Index of obj in the ring's registry (added if new); -1 with an error set. */
int32_t ring_register(Ring *r, PyObject *obj);
/* Interns the ring's strings; -1 with an error set. */
int ring_init(void);

static inline int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* time.time_ns() */
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#endif
