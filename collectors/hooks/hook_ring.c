/* The ring of call records: a bounded array of C structs that FastHooks write (hook_fastcall.c) and the
 * hook's writer thread drains into the same row tuples the Python wrapper queues. Under the GIL only. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <structmember.h>

#include "hook_ring.h"

Ring *current_ring = NULL;
static unsigned long long ring_ids = 0;
static PyObject *s_c, *s_pending, *s_completed, *s_failed;

/* ------------------------------------------------------------------------------------------ Ring */

static int ring_grow(Ring *r)
{
    uint64_t ncap = r->cap * 2;
    Slot *ns = PyMem_Calloc(ncap, sizeof(Slot));
    if (ns == NULL)
        return -1;
    for (uint64_t i = r->tail; i < r->head; i++)
        ns[i & (ncap - 1)] = r->slots[i & (r->cap - 1)];
    PyMem_Free(r->slots);
    r->slots = ns;
    r->cap = ncap;
    return 0;
}

Slot *ring_push(Ring *r, uint64_t *index)
{
    if (r->head - r->tail >= r->cap) {
        if (r->cap < r->max_cap && ring_grow(r) == 0) {
        }
        else {
            r->tail++;
            r->dropped++;
        }
    }
    *index = r->head;
    return &r->slots[r->head++ & (r->cap - 1)];
}

int32_t ring_register(Ring *r, PyObject *obj)
{
    Py_ssize_t n = PyList_GET_SIZE(r->registry);
    for (Py_ssize_t i = 0; i < n; i++) {
        int eq = PyObject_RichCompareBool(PyList_GET_ITEM(r->registry, i), obj, Py_EQ);
        if (eq < 0)
            return -1;
        if (eq)
            return (int32_t)i;
    }
    if (PyList_Append(r->registry, obj) < 0)
        return -1;
    return (int32_t)n;
}

static PyObject *ring_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"max_rows", "initial_rows", NULL};
    Py_ssize_t max_rows, initial = 4096;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n|n", kw, &max_rows, &initial))
        return NULL;
    if (max_rows < 1 || initial < 1) {
        PyErr_SetString(PyExc_ValueError, "Ring: max_rows and initial_rows must be >= 1");
        return NULL;
    }
    uint64_t cap = 1, max_cap = 1;
    while (max_cap < (uint64_t)max_rows)
        max_cap <<= 1;
    while (cap < (uint64_t)initial && cap < max_cap)
        cap <<= 1;
    Ring *self = (Ring *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->slots = PyMem_Calloc(cap, sizeof(Slot));
    self->registry = PyList_New(0);
    if (self->slots == NULL || self->registry == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->cap = cap;
    self->max_cap = max_cap;
    self->active = 1;
    self->id = ++ring_ids;
    return (PyObject *)self;
}

static void ring_dealloc(Ring *self)
{
    PyObject_GC_UnTrack(self);
    if (current_ring == self)
        current_ring = NULL;
    PyMem_Free(self->slots);
    Py_CLEAR(self->registry);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int ring_traverse(Ring *self, visitproc visit, void *arg)
{
    Py_VISIT(self->registry);
    return 0;
}

static int ring_clear(Ring *self)
{
    Py_CLEAR(self->registry);
    return 0;
}

static inline PyObject *int_or_none(int has, int64_t v)
{
    return has ? PyLong_FromLongLong(v) : Py_NewRef(Py_None);
}

/* A slot as the 16-field row the Python wrapper builds (a tuple, or a list for pending rows). */
static PyObject *slot_row(Ring *r, Slot *s, int as_list)
{
    PyObject *op = PyList_GET_ITEM(r->registry, s->op);
    PyObject *grp = PyList_GET_ITEM(r->registry, s->group); /* (group id, ranks) */
    PyObject *dt = PyList_GET_ITEM(r->registry, s->dtype);
    PyObject *state = s->state == ST_PENDING ? s_pending : s->state == ST_FAILED ? s_failed : s_completed;
    PyObject *v[16] = {Py_NewRef(s_c), Py_NewRef(op), Py_NewRef(PyTuple_GET_ITEM(grp, 0)),
                       Py_NewRef(PyTuple_GET_ITEM(grp, 1)), int_or_none(s->has_peer, s->peer),
                       PyLong_FromLongLong(s->size), Py_NewRef(dt), PyLong_FromLongLong(s->start),
                       int_or_none(s->state != ST_PENDING, s->end), Py_NewRef(state), PyLong_FromLongLong(s->seq),
                       PyLong_FromLongLong(s->step), PyLong_FromLongLong(s->numel),
                       int_or_none(s->has_out, s->out_size), Py_NewRef(Py_None), Py_NewRef(Py_None)};
    PyObject *row = as_list ? PyList_New(16) : PyTuple_New(16);
    int ok = row != NULL;
    for (int i = 0; i < 16; i++)
        ok = ok && v[i] != NULL;
    if (!ok) {
        for (int i = 0; i < 16; i++)
            Py_XDECREF(v[i]);
        Py_XDECREF(row);
        return NULL;
    }
    for (int i = 0; i < 16; i++) {
        if (as_list)
            PyList_SET_ITEM(row, i, v[i]);
        else
            PyTuple_SET_ITEM(row, i, v[i]);
    }
    return row;
}

/* Appends a slot's row to out; -1 (an error set) when it cannot be built. */
static int append_row(PyObject *out, Ring *r, Slot *s, int as_list)
{
    PyObject *row = slot_row(r, s, as_list);
    int rc = row == NULL ? -1 : PyList_Append(out, row);
    Py_XDECREF(row);
    return rc;
}

static PyObject *ring_take(Ring *self, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"limit", "final", NULL};
    PyObject *limit_obj = Py_None;
    int final = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|Op", kw, &limit_obj, &final))
        return NULL;
    uint64_t limit = UINT64_MAX;
    if (limit_obj != Py_None) {
        Py_ssize_t l = PyLong_AsSsize_t(limit_obj);
        if (l < 0 && PyErr_Occurred())
            return NULL;
        limit = l < 0 ? 0 : (uint64_t)l;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    uint64_t n = 0;
    while (self->tail < self->head && n < limit) {
        Slot *s = &self->slots[self->tail & (self->cap - 1)];
        if (s->state == ST_PENDING) {
            /* A call still running blocks the rows after it until it ends; at the end they are lost
               (Session.close counts the open ones). */
            if (!final)
                break;
            s->state = ST_FREE;
            self->tail++;
            continue;
        }
        if (append_row(out, self, s, 0) < 0) {
            PyErr_Clear(); /* out of memory: return what is built; this slot waits for the next take */
            break;
        }
        s->state = ST_FREE;
        self->tail++;
        n++;
    }
    return out;
}

static PyObject *ring_pending(Ring *self, PyObject *unused)
{
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (uint64_t i = self->tail; i < self->head; i++) {
        Slot *s = &self->slots[i & (self->cap - 1)];
        if (s->state != ST_PENDING)
            continue;
        if (append_row(out, self, s, 1) < 0) {
            PyErr_Clear(); /* out of memory: a partial dump is better than none */
            break;
        }
    }
    return out;
}

static PyObject *ring_forget(Ring *self, PyObject *unused)
{
    self->generation++;
    Py_RETURN_NONE;
}

static PyObject *ring_register_py(Ring *self, PyObject *obj)
{
    int32_t i = ring_register(self, obj);
    return i < 0 ? NULL : PyLong_FromLong(i);
}

static PyObject *ring_get_appended(Ring *self, void *c)
{
    return PyLong_FromUnsignedLongLong(self->head);
}

static PyObject *ring_get_capacity(Ring *self, void *c)
{
    return PyLong_FromUnsignedLongLong(self->cap);
}

static Py_ssize_t ring_len(Ring *self)
{
    return (Py_ssize_t)(self->head - self->tail);
}

static PyMethodDef ring_methods[] = {
    {"take", (PyCFunction)(void (*)(void))ring_take, METH_VARARGS | METH_KEYWORDS,
     "take(limit=None, final=False): the oldest finished rows, as tuples; stops at a call still running "
     "(final: drops those instead)."},
    {"pending", (PyCFunction)ring_pending, METH_NOARGS, "Rows of the calls still running, as lists."},
    {"forget", (PyCFunction)ring_forget, METH_NOARGS, "Invalidate every FastHook's cached groups."},
    {"register", (PyCFunction)ring_register_py, METH_O, "Index of an object in the registry (added if new)."},
    {NULL}};

static PyMemberDef ring_members[] = {
    {"step", T_LONGLONG, offsetof(Ring, step), 0, "step number stamped on new calls"},
    {"active", T_INT, offsetof(Ring, active), 0, "0: every call takes the slow path"},
    {"cuda", T_INT, offsetof(Ring, cuda), 0, "1: a CUDA tensor's call takes the slow path (CUDA events)"},
    {"dropped", T_LONGLONG, offsetof(Ring, dropped), READONLY, "oldest calls pushed out at the cap"},
    {"generation", T_ULONGLONG, offsetof(Ring, generation), READONLY, NULL},
    {"registry", T_OBJECT, offsetof(Ring, registry), READONLY, NULL},
    {NULL}};

static PyGetSetDef ring_getset[] = {
    {"appended", (getter)ring_get_appended, NULL, "calls written so far", NULL},
    {"capacity", (getter)ring_get_capacity, NULL, "slots allocated now (grows up to max_rows)", NULL},
    {NULL}};

static PySequenceMethods ring_as_sequence = {.sq_length = (lenfunc)ring_len};

PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rankscope.collectors.hooks.hook_fastcall.Ring",
    .tp_basicsize = sizeof(Ring),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Bounded ring of call records written by FastHooks, drained by the writer thread.",
    .tp_new = ring_new,
    .tp_dealloc = (destructor)ring_dealloc,
    .tp_traverse = (traverseproc)ring_traverse,
    .tp_clear = (inquiry)ring_clear,
    .tp_methods = ring_methods,
    .tp_members = ring_members,
    .tp_getset = ring_getset,
    .tp_as_sequence = &ring_as_sequence,
};

int ring_init(void)
{
    if ((s_c = PyUnicode_InternFromString("c")) == NULL || (s_pending = PyUnicode_InternFromString("pending")) == NULL
        || (s_completed = PyUnicode_InternFromString("completed")) == NULL
        || (s_failed = PyUnicode_InternFromString("failed")) == NULL)
        return -1;
    return PyType_Ready(&RingType);
}
