/* The hook's hot path in C: a synchronous collective or point-to-point call, timed into a ring of C
 * structs.
 *
 * Why C: measured on a 1-rank gloo all_reduce (benchmarks/bench_hooks.py), the Python wrapper added
 * 7-11 us per call, and a C port that still built a Python row per call added 5-7 us. The call's
 * syscalls leave the caches cold, so the cost follows the number of distinct cache lines the hook
 * touches, not the instructions it runs: every Python object read, allocated or reference-counted is
 * a likely miss. Here a call touches its FastHook, the tensor (dtype, numel), one sequence counter and
 * one 80-byte slot; no Python object is made until the writer thread drains the ring.
 *
 * Scope: a FastHook handles only the common case: a session that records, a group and dtype seen
 * before, one tensor in and at most one out, synchronous, on the CPU clock, and for point-to-point
 * a named peer. Everything else (async ops, CUDA tensors, tensor lists, first sight of a group or
 * dtype, nested calls, a disabled session) goes to the Python wrapper `slow`, which is the reference
 * implementation; Ring.take() yields the very tuples the Python wrapper queues, and tests compare the
 * two paths row for row.
 *
 * Everything runs under the GIL: the writer thread drains with take() while holding it, so the ring
 * needs no atomics. Nothing may escape into the job: a failure of our own bookkeeping before the call
 * sends it down the slow path, and after the call it is cleared and counted.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#include "hook_ring.h"

static PyObject *s_is_cuda, *s_session, *s_groups, *s_dtypes, *s_seqs, *s_dtype, *s_numel, *s_nbytes;

/* -------------------------------------------------------------------------------------- FastHook */

#define N_GROUPS 16
#define N_DTYPES 8

typedef struct {
    PyObject *group;   /* strong: keeps its address from being reused while cached */
    PyObject *counter; /* the session's itertools.count for this group (and op, peer) */
    unsigned long long ring; /* id of the ring the entry was made for */
    unsigned long long generation;
    int64_t peer;
    int32_t gidx;
} GroupEntry;

typedef struct {
    PyObject *dtype; /* strong */
    unsigned long long ring;
    int64_t itemsize;
    int32_t didx;
} DtypeEntry;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *orig, *slow, *hub, *busy, *op;
    PyObject *gname, *tname, *aname, *pname, *oname;
    Py_ssize_t gpos, tpos, apos, ppos, opos; /* -1: no such position */
    int p2p, nests, n_groups, n_dtypes, next_group, next_dtype;
    unsigned long long op_ring;
    int32_t opidx;
    GroupEntry groups[N_GROUPS];
    DtypeEntry dtypes[N_DTYPES];
} FastHook;

/* Borrowed reference to an argument by position or keyword; NULL when not given. */
static inline PyObject *arg(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, Py_ssize_t pos,
                            PyObject *name)
{
    if (pos >= 0 && pos < nargs)
        return args[pos];
    if (kwnames != NULL && name != NULL) {
        Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < nkw; i++) {
            PyObject *k = PyTuple_GET_ITEM(kwnames, i);
            if (k == name || PyUnicode_Compare(k, name) == 0)
                return args[nargs + i];
        }
    }
    return NULL;
}

static void entry_clear(GroupEntry *e)
{
    Py_CLEAR(e->group);
    Py_CLEAR(e->counter);
    e->ring = 0;
}

/* A dict the recording session keeps (groups, seqs, dtypes), as a new reference; NULL (no error set) when
 * there is no session or no such dict. */
static PyObject *session_dict(FastHook *self, PyObject *name)
{
    PyObject *session = PyObject_GetAttr(self->hub, s_session), *d = NULL;
    if (session != NULL && session != Py_None)
        d = PyObject_GetAttr(session, name);
    Py_XDECREF(session);
    if (d != NULL && !PyDict_Check(d))
        Py_CLEAR(d);
    PyErr_Clear();
    return d;
}

/* First sight of a group (and peer) on this ring: take its id, ranks and counter from the session.
 * Returns the entry, or NULL (no error set) when the session has not seen the group yet. */
static GroupEntry *register_group(FastHook *self, Ring *ring, PyObject *group, int64_t peer)
{
    PyObject *groups = NULL, *key = NULL, *seqs = NULL, *seq_key = NULL, *counter = NULL, *pair = NULL, *info;
    GroupEntry *e = NULL;
    if ((groups = session_dict(self, s_groups)) == NULL)
        goto out;
    key = group == Py_None ? Py_NewRef(Py_None) : PyLong_FromVoidPtr(group);
    if (key == NULL)
        goto out;
    info = PyDict_GetItemWithError(groups, key);
    if (info == NULL || !PyTuple_CheckExact(info) || PyTuple_GET_SIZE(info) < 2 || PyTuple_GET_ITEM(info, 1) == Py_None)
        goto out;
    if ((seqs = session_dict(self, s_seqs)) == NULL)
        goto out;
    if (self->p2p) {
        PyObject *p = PyLong_FromLongLong(peer);
        seq_key = p == NULL ? NULL : PyTuple_Pack(3, PyTuple_GET_ITEM(info, 0), self->op, p);
        Py_XDECREF(p);
    }
    else
        seq_key = Py_NewRef(PyTuple_GET_ITEM(info, 0));
    if (seq_key == NULL || (counter = PyObject_GetItem(seqs, seq_key)) == NULL)
        goto out;
    pair = PyTuple_Pack(2, PyTuple_GET_ITEM(info, 0), PyTuple_GET_ITEM(info, 1));
    if (pair == NULL)
        goto out;
    int32_t gidx = ring_register(ring, pair);
    if (gidx < 0)
        goto out;
    int slot = self->n_groups < N_GROUPS ? self->n_groups++ : (self->next_group++ % N_GROUPS);
    e = &self->groups[slot];
    entry_clear(e);
    e->group = Py_NewRef(group);
    e->counter = Py_NewRef(counter);
    e->ring = ring->id;
    e->generation = ring->generation;
    e->peer = peer;
    e->gidx = gidx;
out:
    PyErr_Clear();
    Py_XDECREF(groups);
    Py_XDECREF(key);
    Py_XDECREF(seqs);
    Py_XDECREF(seq_key);
    Py_XDECREF(counter);
    Py_XDECREF(pair);
    return e;
}

/* The session's (name, itemsize) for a dtype, cached; NULL (no error set) when the session has none yet. */
static DtypeEntry *register_dtype(FastHook *self, Ring *ring, PyObject *dtype)
{
    PyObject *dtypes, *info;
    DtypeEntry *e = NULL;
    if ((dtypes = session_dict(self, s_dtypes)) == NULL)
        goto out;
    info = PyDict_GetItemWithError(dtypes, dtype);
    if (info == NULL || !PyTuple_CheckExact(info) || PyTuple_GET_SIZE(info) != 2)
        goto out;
    long long itemsize = PyLong_AsLongLong(PyTuple_GET_ITEM(info, 1));
    int32_t didx = ring_register(ring, PyTuple_GET_ITEM(info, 0));
    if ((itemsize == -1 && PyErr_Occurred()) || didx < 0)
        goto out;
    int slot = self->n_dtypes < N_DTYPES ? self->n_dtypes++ : (self->next_dtype++ % N_DTYPES);
    e = &self->dtypes[slot];
    Py_XSETREF(e->dtype, Py_NewRef(dtype));
    e->ring = ring->id;
    e->itemsize = itemsize;
    e->didx = didx;
out:
    PyErr_Clear();
    Py_XDECREF(dtypes);
    return e;
}

static inline int64_t as_i64(PyObject *v, int *ok)
{
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if ((x == -1 && PyErr_Occurred()) || overflow)
        *ok = 0;
    return x;
}

static PyObject *fasthook_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    FastHook *self = (FastHook *)callable;
    Ring *ring = current_ring;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *tensor, *group, *asyncv, *peer_obj, *dtype = NULL, *numel_obj = NULL, *out_obj = NULL, *seq_obj = NULL;
    int64_t peer = 0, out_size = 0;
    int ok = 1;

    if (ring == NULL || !ring->active || PySet_GET_SIZE(self->busy) > 0)
        goto slow;
    asyncv = arg(args, nargs, kwnames, self->apos, self->aname);
    if (asyncv != NULL && asyncv != Py_False && asyncv != Py_None)
        goto slow;
    tensor = arg(args, nargs, kwnames, self->tpos, self->tname);
    if (tensor == NULL || tensor == Py_None)
        goto slow;
    if (ring->cuda) {
        PyObject *on_gpu = PyObject_GetAttr(tensor, s_is_cuda);
        Py_XDECREF(on_gpu); /* only its identity is compared */
        if (on_gpu != Py_False)
            goto slow;
    }
    group = arg(args, nargs, kwnames, self->gpos, self->gname);
    if (group == NULL)
        group = Py_None;
    if (self->p2p) {
        peer_obj = arg(args, nargs, kwnames, self->ppos, self->pname);
        if (peer_obj == NULL || !PyLong_CheckExact(peer_obj))
            goto slow; /* any-source receive, or a group-relative peer */
        peer = as_i64(peer_obj, &ok);
        if (!ok)
            goto slow;
    }
    GroupEntry *g = NULL;
    for (int i = 0; i < self->n_groups; i++) {
        GroupEntry *e = &self->groups[i];
        if (e->group == group && e->ring == ring->id && e->generation == ring->generation && e->peer == peer) {
            g = e;
            break;
        }
    }
    if (g == NULL && (g = register_group(self, ring, group, peer)) == NULL)
        goto slow;
    dtype = PyObject_GetAttr(tensor, s_dtype);
    if (dtype == NULL)
        goto slow;
    DtypeEntry *d = NULL;
    for (int i = 0; i < self->n_dtypes; i++) {
        if (self->dtypes[i].dtype == dtype && self->dtypes[i].ring == ring->id) {
            d = &self->dtypes[i];
            break;
        }
    }
    if (d == NULL && (d = register_dtype(self, ring, dtype)) == NULL)
        goto slow;
    if (self->op_ring != ring->id) {
        int32_t opidx = ring_register(ring, self->op);
        if (opidx < 0)
            goto slow;
        self->op_ring = ring->id;
        self->opidx = opidx;
    }
    if (self->opos >= 0 || self->oname != NULL) {
        PyObject *o = arg(args, nargs, kwnames, self->opos, self->oname);
        if (o == NULL || o == Py_None || (out_obj = PyObject_GetAttr(o, s_nbytes)) == NULL)
            goto slow;
        out_size = as_i64(out_obj, &ok);
    }
    numel_obj = PyObject_CallMethodNoArgs(tensor, s_numel);
    if (numel_obj == NULL)
        goto slow;
    int64_t numel = as_i64(numel_obj, &ok);
    if (!ok)
        goto slow;
    /* From here on the call is recorded here: no more detours to the slow path. */
    seq_obj = PyIter_Next(g->counter);
    int64_t seq = seq_obj == NULL ? -1 : as_i64(seq_obj, &ok);
    if (seq_obj == NULL || !ok) {
        PyErr_Clear();
        goto slow;
    }
    uint64_t index;
    Slot *s = ring_push(ring, &index);
    s->op = self->opidx;
    s->group = g->gidx;
    s->dtype = d->didx;
    s->size = numel * d->itemsize;
    s->numel = numel;
    s->has_out = out_obj != NULL;
    s->out_size = out_size;
    s->has_peer = (int8_t)self->p2p;
    s->peer = peer;
    s->seq = seq;
    s->step = ring->step;
    s->end = 0;
    s->state = ST_PENDING;
    s->start = now_ns();

    PyObject *tid = NULL;
    if (self->nests) {
        tid = PyLong_FromUnsignedLong(PyThread_get_thread_ident()); /* threading.get_ident() */
        if (tid == NULL || PySet_Add(self->busy, tid) < 0) {
            PyErr_Clear();
            Py_CLEAR(tid);
        }
    }
    Py_INCREF(ring); /* the session may close and drop its ring while the call runs */
    PyObject *result = PyObject_Vectorcall(self->orig, args, nargsf, kwnames);
    int64_t end = now_ns();
    if (tid != NULL) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        if (PySet_Discard(self->busy, tid) < 0)
            PyErr_Clear();
        PyErr_Restore(et, ev, tb);
        Py_DECREF(tid);
    }
    if (index >= ring->tail) { /* else pushed out while running: already counted as dropped */
        s = &ring->slots[index & (ring->cap - 1)]; /* the ring may have grown meanwhile */
        s->end = end;
        s->state = result == NULL ? ST_FAILED : ST_COMPLETED;
    }
    Py_DECREF(ring);
    Py_XDECREF(dtype);
    Py_XDECREF(numel_obj);
    Py_XDECREF(out_obj);
    Py_XDECREF(seq_obj);
    return result; /* the job's own exception, if any, passes unchanged */

slow:
    PyErr_Clear();
    Py_XDECREF(dtype);
    Py_XDECREF(numel_obj);
    Py_XDECREF(out_obj);
    Py_XDECREF(seq_obj);
    return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
}

static Py_ssize_t opt_pos(PyObject *v)
{
    return v == Py_None ? -1 : PyLong_AsSsize_t(v);
}

static PyObject *opt_name(PyObject *v)
{
    return v == Py_None ? NULL : Py_NewRef(v);
}

static PyObject *fasthook_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"orig", "slow", "hub", "busy", "op", "group", "tensor", "async_arg", "peer", "out",
                         "p2p", "nests", NULL};
    PyObject *orig, *slow, *hub, *busy, *op, *group, *tensor, *async_arg, *peer, *out;
    int p2p, nests;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO!UOOOOOpp", kw, &orig, &slow, &hub, &PySet_Type, &busy,
                                     &op, &group, &tensor, &async_arg, &peer, &out, &p2p, &nests))
        return NULL;
    PyObject *pairs[5] = {group, tensor, async_arg, peer, out};
    for (int i = 0; i < 5; i++) {
        if (!PyTuple_Check(pairs[i]) || PyTuple_GET_SIZE(pairs[i]) != 2) {
            PyErr_SetString(PyExc_TypeError, "FastHook: each argument place is a (position, name) pair");
            return NULL;
        }
    }
    FastHook *self = (FastHook *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = fasthook_call;
    self->orig = Py_NewRef(orig);
    self->slow = Py_NewRef(slow);
    self->hub = Py_NewRef(hub);
    self->busy = Py_NewRef(busy);
    self->op = Py_NewRef(op);
    self->gpos = opt_pos(PyTuple_GET_ITEM(group, 0));
    self->gname = opt_name(PyTuple_GET_ITEM(group, 1));
    self->tpos = opt_pos(PyTuple_GET_ITEM(tensor, 0));
    self->tname = opt_name(PyTuple_GET_ITEM(tensor, 1));
    self->apos = opt_pos(PyTuple_GET_ITEM(async_arg, 0));
    self->aname = opt_name(PyTuple_GET_ITEM(async_arg, 1));
    self->ppos = opt_pos(PyTuple_GET_ITEM(peer, 0));
    self->pname = opt_name(PyTuple_GET_ITEM(peer, 1));
    self->opos = opt_pos(PyTuple_GET_ITEM(out, 0));
    self->oname = opt_name(PyTuple_GET_ITEM(out, 1));
    self->p2p = p2p;
    self->nests = nests;
    if (PyErr_Occurred()) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int fasthook_traverse(FastHook *self, visitproc visit, void *arg)
{
    Py_VISIT(self->dict);
    Py_VISIT(self->orig);
    Py_VISIT(self->slow);
    Py_VISIT(self->hub);
    Py_VISIT(self->busy);
    for (int i = 0; i < self->n_groups; i++) {
        Py_VISIT(self->groups[i].group);
        Py_VISIT(self->groups[i].counter);
    }
    for (int i = 0; i < self->n_dtypes; i++)
        Py_VISIT(self->dtypes[i].dtype);
    return 0;
}

static int fasthook_clear(FastHook *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->orig);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->hub);
    Py_CLEAR(self->busy);
    for (int i = 0; i < self->n_groups; i++)
        entry_clear(&self->groups[i]);
    for (int i = 0; i < self->n_dtypes; i++)
        Py_CLEAR(self->dtypes[i].dtype);
    self->n_groups = self->n_dtypes = 0;
    self->op_ring = 0;
    return 0;
}

static void fasthook_dealloc(FastHook *self)
{
    PyObject_GC_UnTrack(self);
    fasthook_clear(self);
    Py_XDECREF(self->op);
    Py_XDECREF(self->gname);
    Py_XDECREF(self->tname);
    Py_XDECREF(self->aname);
    Py_XDECREF(self->pname);
    Py_XDECREF(self->oname);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *fasthook_forget(FastHook *self, PyObject *unused)
{
    for (int i = 0; i < self->n_groups; i++)
        entry_clear(&self->groups[i]);
    for (int i = 0; i < self->n_dtypes; i++)
        Py_CLEAR(self->dtypes[i].dtype);
    self->n_groups = self->n_dtypes = 0;
    self->op_ring = 0;
    Py_RETURN_NONE;
}

static PyObject *fasthook_get_slow(FastHook *self, void *closure)
{
    return Py_NewRef(self->slow);
}

static PyMethodDef fasthook_methods[] = {
    {"forget", (PyCFunction)fasthook_forget, METH_NOARGS, "Drop the cached groups and dtypes."},
    {NULL}};

static PyGetSetDef fasthook_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {"slow", (getter)fasthook_get_slow, NULL, "the Python wrapper this one defers to", NULL},
    {NULL}};

static PyTypeObject FastHookType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rankscope.collectors.hooks.hook_fastcall.FastHook",
    .tp_basicsize = sizeof(FastHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A torch.distributed call with the hook's hot path in C (see hook_fastcall.c).",
    .tp_new = fasthook_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FastHook, vectorcall),
    .tp_dictoffset = offsetof(FastHook, dict),
    .tp_traverse = (traverseproc)fasthook_traverse,
    .tp_clear = (inquiry)fasthook_clear,
    .tp_dealloc = (destructor)fasthook_dealloc,
    .tp_methods = fasthook_methods,
    .tp_getset = fasthook_getset,
};

/* ---------------------------------------------------------------------------------------- module */

static PyObject *set_current(PyObject *mod, PyObject *ring)
{
    if (ring == Py_None) {
        current_ring = NULL;
        Py_RETURN_NONE;
    }
    if (!PyObject_TypeCheck(ring, &RingType)) {
        PyErr_SetString(PyExc_TypeError, "set_current: expected a Ring or None");
        return NULL;
    }
    /* Borrowed: the session that owns the ring clears it (set_current(None)) before dropping it, and
       a ring that is freed clears it too. */
    current_ring = (Ring *)ring;
    Py_RETURN_NONE;
}

static PyObject *get_current(PyObject *mod, PyObject *unused)
{
    return Py_NewRef(current_ring == NULL ? Py_None : (PyObject *)current_ring);
}

static PyMethodDef module_methods[] = {
    {"set_current", set_current, METH_O, "Make a Ring the one FastHooks record into (None: none)."},
    {"get_current", get_current, METH_NOARGS, "The Ring FastHooks record into, or None."},
    {NULL}};

static struct PyModuleDef fastcall_module = {PyModuleDef_HEAD_INIT, "hook_fastcall", "The hook's hot path in C.", -1,
                                             module_methods};

#define INTERN(var, text)                                                                                    \
    if ((var = PyUnicode_InternFromString(text)) == NULL)                                                    \
        return NULL;

PyMODINIT_FUNC PyInit_hook_fastcall(void)
{
    INTERN(s_is_cuda, "is_cuda");
    INTERN(s_session, "session");
    INTERN(s_groups, "groups");
    INTERN(s_dtypes, "dtypes");
    INTERN(s_seqs, "seqs");
    INTERN(s_dtype, "dtype");
    INTERN(s_numel, "numel");
    INTERN(s_nbytes, "nbytes");
    if (ring_init() < 0 || PyType_Ready(&FastHookType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&fastcall_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Ring", (PyObject *)&RingType) < 0
        || PyModule_AddObjectRef(m, "FastHook", (PyObject *)&FastHookType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
