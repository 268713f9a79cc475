/*
 * c_ext._tracebuf: the tracer's event recorder in C.
 *
 * While a Tracer runs, every traced call records an entry and an exit event and
 * every tracepoint hit records one (kernel_model/trace.py).  Recording into a
 * Python list means a tuple per event - allocated, filled, appended, and kept,
 * so each one lands wherever the allocator has room.  A Recorder keeps the
 * events' fields in one flat array of references instead, and a second array
 * of event lengths; the tuples the Trace builder reads are made only when it
 * asks for them (events()), after the run.
 *
 * The layouts are those kernel_model.trace._build documents; the running task
 * is found as the trampolines found it: kernel_model.current's _current, or
 * else the scheduler's current.
 *
 * trace.PyRecorder is the reference twin: the same methods, the same events,
 * tuples in a list.  tests/kernel_model/test_trace_recorder.py runs both.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define MAX_FIELDS 0xFFFF        /* an event's length is kept in 16 bits */

typedef struct {
    PyObject_HEAD
    PyObject **refs;             /* every event's fields, one after the other */
    Py_ssize_t nrefs, caprefs;
    unsigned short *lens;        /* each event's number of fields */
    Py_ssize_t nevents, capevents;
    PyObject *cur_dict;          /* kernel_model.current.__dict__ */
    PyObject *sched;             /* the scheduler (its .current) */
    PyObject *clock;             /* perf_counter_ns for the wall clock, else NULL */
} Recorder;

static PyObject *s_current_attr, *s_current_global, *s_point, *s_point_method;

/* Room for one more event of n fields; -1 with MemoryError. */
static int
reserve(Recorder *r, Py_ssize_t n)
{
    if (n > MAX_FIELDS) {
        PyErr_Format(PyExc_ValueError, "Recorder: an event of %zd fields", n);
        return -1;
    }
    if (r->nrefs + n > r->caprefs) {
        Py_ssize_t cap = r->caprefs ? r->caprefs : 1024;
        PyObject **p;

        while (cap < r->nrefs + n)
            cap *= 2;
        p = PyMem_Realloc(r->refs, cap * sizeof(*p));
        if (p == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        r->refs = p;
        r->caprefs = cap;
    }
    if (r->nevents == r->capevents) {
        Py_ssize_t cap = r->capevents ? r->capevents * 2 : 256;
        unsigned short *p = PyMem_Realloc(r->lens, cap * sizeof(*p));

        if (p == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        r->lens = p;
        r->capevents = cap;
    }
    return 0;
}

/* Store a new reference (stolen) as the next field. */
static inline void
put(Recorder *r, PyObject *o)
{
    r->refs[r->nrefs++] = o;
}

/* The running task (new reference): current's _current if true, else SCHED.current. */
static PyObject *
running(Recorder *r)
{
    PyObject *k = PyDict_GetItemWithError(r->cur_dict, s_current_global);
    int t;

    if (k == NULL) {
        if (PyErr_Occurred())
            return NULL;
    } else {
        t = PyObject_IsTrue(k);
        if (t < 0)
            return NULL;
        if (t) {
            Py_INCREF(k);
            return k;
        }
    }
    return PyObject_GetAttr(r->sched, s_current_attr);
}

/* Record (head..., [t,] rest...): the head's nhead fields, the wall clock's
 * timestamp if it runs, then the rest.  Steals nothing; -1 on error. */
static int
record(Recorder *r, PyObject *const *head, Py_ssize_t nhead, PyObject *const *rest,
       Py_ssize_t nrest)
{
    PyObject *t = NULL;
    Py_ssize_t i, n = nhead + nrest;

    if (r->clock != NULL) {
        t = PyObject_CallNoArgs(r->clock);
        if (t == NULL)
            return -1;
        n++;
    }
    if (reserve(r, n) < 0) {
        Py_XDECREF(t);
        return -1;
    }
    for (i = 0; i < nhead; i++)
        put(r, Py_NewRef(head[i]));
    if (t != NULL)
        put(r, t);
    for (i = 0; i < nrest; i++)
        put(r, Py_NewRef(rest[i]));
    r->lens[r->nevents++] = (unsigned short)n;
    return 0;
}

/* Record (code, the running task, third, [t,] rest...): an entry or a tracepoint hit.
 * Returns the task (a new reference), or NULL on error with nothing recorded. */
static PyObject *
record_at_task(Recorder *r, PyObject *code, PyObject *third, PyObject *const *rest,
               Py_ssize_t nrest)
{
    PyObject *head[3], *k = running(r);

    if (k == NULL)
        return NULL;
    head[0] = code;
    head[1] = k;
    head[2] = third;
    if (record(r, head, 3, rest, nrest) < 0) {
        Py_DECREF(k);
        return NULL;
    }
    return k;
}

/* enter(fid, kw, *args) -> the running task: (fid, task, kw, [t,] *args) */
static PyObject *
rec_enter(Recorder *r, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2) {
        PyErr_SetString(PyExc_TypeError, "enter(fid, kw, *args)");
        return NULL;
    }
    return record_at_task(r, args[0], args[1], args + 2, nargs - 2);
}

/* call(fn, fid, xfid, kw, *args) -> fn(*args, **kw), recorded around the call: the
 * entry (fid, task, kw, [t,] *args), then the exit (xfid, task, return value or the
 * exception, [t]) - a trampoline's whole work in one call from Python.  xfid is
 * ~fid, a constant of the trampoline (computing it here would make an int a call). */
static PyObject *
rec_call(Recorder *r, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *k, *head[3], *res, *kw;

    if (nargs < 4) {
        PyErr_SetString(PyExc_TypeError, "call(fn, fid, xfid, kw, *args)");
        return NULL;
    }
    kw = args[3];
    k = record_at_task(r, args[1], kw, args + 4, nargs - 4);
    if (k == NULL)
        return NULL;
    head[1] = k;
    res = PyObject_VectorcallDict(args[0], args + 4, nargs - 4, kw == Py_None ? NULL : kw);
    head[0] = args[2];
    if (res != NULL) {
        head[2] = res;
        if (record(r, head, 3, NULL, 0) < 0)
            Py_CLEAR(res);
    } else {
        /* the exception, as `except BaseException as e` sees it */
        PyObject *type, *value, *tb;

        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL && value != NULL)
            PyException_SetTraceback(value, tb);
        head[2] = value ? value : Py_None;
        if (record(r, head, 3, NULL, 0) < 0) {
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        } else {
            PyErr_Restore(type, value, tb);
        }
    }
    Py_DECREF(k);
    return res;
}

/* exit(~fid, task, value): (~fid, task, value, [t]) */
static PyObject *
rec_exit(Recorder *r, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "exit(xfid, task, value)");
        return NULL;
    }
    if (record(r, args, 3, NULL, 0) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* ("P", task, tp, [t,] *values); -1 on error */
static int
record_point(Recorder *r, PyObject *tp, PyObject *const *values, Py_ssize_t n)
{
    PyObject *k = record_at_task(r, s_point, tp, values, n);

    if (k == NULL)
        return -1;
    Py_DECREF(k);
    return 0;
}

/* point(tp, *values): ("P", task, tp, [t,] *values) */
static PyObject *
rec_point(Recorder *r, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "point(tp, *values)");
        return NULL;
    }
    if (record_point(r, args[0], args + 1, nargs - 1) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* add(*fields): one event exactly as given (the scheduler's switch and clock hooks) */
static PyObject *
rec_add(Recorder *r, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t i;

    if (reserve(r, nargs) < 0)
        return NULL;
    for (i = 0; i < nargs; i++)
        put(r, Py_NewRef(args[i]));
    r->lens[r->nevents++] = (unsigned short)nargs;
    Py_RETURN_NONE;
}

/* events() -> [tuple, ...]: every event, in order, as the builder reads them */
static PyObject *
rec_events(Recorder *r, PyObject *unused)
{
    PyObject *out = PyList_New(r->nevents);
    Py_ssize_t e, i, at = 0;

    if (out == NULL)
        return NULL;
    for (e = 0; e < r->nevents; e++) {
        PyObject *ev = PyTuple_New(r->lens[e]);

        if (ev == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        for (i = 0; i < r->lens[e]; i++)
            PyTuple_SET_ITEM(ev, i, Py_NewRef(r->refs[at + i]));
        at += r->lens[e];
        PyList_SET_ITEM(out, e, ev);
    }
    return out;
}

static int
rec_traverse(Recorder *r, visitproc visit, void *arg)
{
    Py_ssize_t i;

    Py_VISIT(Py_TYPE(r));        /* a heap type's instances hold it */
    for (i = 0; i < r->nrefs; i++)
        Py_VISIT(r->refs[i]);
    Py_VISIT(r->cur_dict);
    Py_VISIT(r->sched);
    Py_VISIT(r->clock);
    return 0;
}

static int
rec_clear(Recorder *r)
{
    Py_ssize_t n = r->nrefs;

    r->nrefs = 0;
    r->nevents = 0;
    while (n > 0) {
        n--;                     /* not inside Py_CLEAR: it names its argument twice */
        Py_CLEAR(r->refs[n]);
    }
    Py_CLEAR(r->cur_dict);
    Py_CLEAR(r->sched);
    Py_CLEAR(r->clock);
    return 0;
}

static void
rec_dealloc(Recorder *r)
{
    PyTypeObject *tp = Py_TYPE(r);

    PyObject_GC_UnTrack(r);
    rec_clear(r);
    PyMem_Free(r->refs);
    PyMem_Free(r->lens);
    tp->tp_free((PyObject *)r);
    Py_DECREF(tp);                /* a heap type's instances hold a reference to it */
}

static Py_ssize_t
rec_len(Recorder *r)
{
    return r->nevents;
}

/* Recorder(current_dict, sched, clock=None) */
static PyObject *
rec_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"current_dict", "sched", "clock", NULL};
    PyObject *cd, *sched, *clock = Py_None;
    Recorder *r;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O|O:Recorder", kwlist, &PyDict_Type, &cd,
                                     &sched, &clock))
        return NULL;
    if (clock != Py_None && !PyCallable_Check(clock)) {
        PyErr_SetString(PyExc_TypeError, "Recorder: clock must be callable or None");
        return NULL;
    }
    r = (Recorder *)type->tp_alloc(type, 0);
    if (r == NULL)
        return NULL;
    r->cur_dict = Py_NewRef(cd);
    r->sched = Py_NewRef(sched);
    r->clock = clock == Py_None ? NULL : Py_NewRef(clock);
    return (PyObject *)r;
}

static PyMethodDef rec_methods[] = {
    {"enter", (PyCFunction)(void (*)(void))rec_enter, METH_FASTCALL,
     "enter(fid, kw, *args) -> task: a traced call's entry (fid, task, kw, [t,] *args)"},
    {"call", (PyCFunction)(void (*)(void))rec_call, METH_FASTCALL,
     "call(fn, fid, xfid, kw, *args) -> fn(*args, **kw), its entry and exit recorded"},
    {"exit", (PyCFunction)(void (*)(void))rec_exit, METH_FASTCALL,
     "exit(xfid, task, value): its exit (~fid, task, return value or exception, [t])"},
    {"point", (PyCFunction)(void (*)(void))rec_point, METH_FASTCALL,
     "point(tp, *values): a tracepoint hit (\"P\", task, tp, [t,] *values)"},
    {"add", (PyCFunction)(void (*)(void))rec_add, METH_FASTCALL,
     "add(*fields): an event as given"},
    {"events", (PyCFunction)rec_events, METH_NOARGS,
     "events() -> list of tuples: every event recorded, in order"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot rec_slots[] = {
    {Py_tp_new, rec_new},
    {Py_tp_dealloc, rec_dealloc},
    {Py_tp_traverse, rec_traverse},
    {Py_tp_clear, rec_clear},
    {Py_tp_methods, rec_methods},
    {Py_sq_length, rec_len},
    {Py_tp_doc, "Recorder(current_dict, sched, clock=None): a Tracer's events, "
                "kept flat (see tracebuf.c)."},
    {0, NULL},
};

static PyType_Spec rec_spec = {
    "c_ext._tracebuf.Recorder", sizeof(Recorder), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, rec_slots,
};

/*
 * A tracepoint (kernel_model.trace.tracepoint): called with its fields' values,
 * it records a point into its sink - a Recorder directly, any other object
 * through its point() method (trace.PyRecorder) - or does nothing while the sink
 * is None.  Being C, a hit costs no Python frame; the generated Python function
 * that trace.tracepoint makes on the Python backend is its twin.
 */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *tp;                /* the trace._Tracepoint: name, fields, layer */
    PyObject *name;              /* "trace_<name>", for messages */
    Py_ssize_t nfields;
    PyObject *sink;              /* NULL while no tracer runs */
} TracePoint;

static PyTypeObject *recorder_type;

static PyObject *
tp_vectorcall(TracePoint *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *sink = self->sink;

    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        PyErr_Format(PyExc_TypeError, "%U() takes its fields by position", self->name);
        return NULL;
    }
    if (nargs != self->nfields) {
        PyErr_Format(PyExc_TypeError, "%U() takes %zd positional arguments but %zd were given",
                     self->name, self->nfields, nargs);
        return NULL;
    }
    if (sink == NULL)
        Py_RETURN_NONE;
    if (Py_IS_TYPE(sink, recorder_type)) {
        if (record_point((Recorder *)sink, self->tp, args, nargs) < 0)
            return NULL;
        Py_RETURN_NONE;
    } else {
        /* sink.point(tp, *values) */
        PyObject *small[8], **call = small, *res;
        Py_ssize_t i;

        if (nargs + 2 > 8) {
            call = PyMem_Malloc((nargs + 2) * sizeof(PyObject *));
            if (call == NULL)
                return PyErr_NoMemory();
        }
        Py_INCREF(sink);
        call[0] = sink;
        call[1] = self->tp;
        for (i = 0; i < nargs; i++)
            call[i + 2] = args[i];
        res = PyObject_VectorcallMethod(s_point_method, call, nargs + 2, NULL);
        Py_DECREF(sink);
        if (call != small)
            PyMem_Free(call);
        return res;
    }
}

/* TracePoint(tp, name, nfields) */
static PyObject *
tp_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"tp", "name", "nfields", NULL};
    PyObject *tp, *name;
    Py_ssize_t n;
    TracePoint *self;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OUn:TracePoint", kwlist, &tp, &name, &n))
        return NULL;
    if (n < 0 || n > MAX_FIELDS - 4) {
        PyErr_Format(PyExc_ValueError, "TracePoint: %zd fields", n);
        return NULL;
    }
    self = (TracePoint *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = (vectorcallfunc)tp_vectorcall;
    self->tp = Py_NewRef(tp);
    self->name = Py_NewRef(name);
    self->nfields = n;
    return (PyObject *)self;
}

static PyObject *
tp_get_sink(TracePoint *self, void *unused)
{
    return Py_NewRef(self->sink ? self->sink : Py_None);
}

static int
tp_set_sink(TracePoint *self, PyObject *v, void *unused)
{
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "TracePoint: sink cannot be deleted");
        return -1;
    }
    Py_XSETREF(self->sink, v == Py_None ? NULL : Py_NewRef(v));
    return 0;
}

static PyObject *
tp_get_tp(TracePoint *self, void *unused)
{
    return Py_NewRef(self->tp);
}

static PyObject *
tp_get_name(TracePoint *self, void *unused)
{
    return Py_NewRef(self->name);
}

static PyObject *
tp_repr(TracePoint *self)
{
    return PyUnicode_FromFormat("<%U>", self->name);
}

static int
tp_traverse(TracePoint *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->tp);
    Py_VISIT(self->sink);
    return 0;
}

static int
tp_clear(TracePoint *self)
{
    Py_CLEAR(self->tp);
    Py_CLEAR(self->sink);
    return 0;
}

static void
tp_dealloc(TracePoint *self)
{
    PyTypeObject *tp = Py_TYPE(self);

    PyObject_GC_UnTrack(self);
    tp_clear(self);
    Py_CLEAR(self->name);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyGetSetDef tp_getset[] = {
    {"sink", (getter)tp_get_sink, (setter)tp_set_sink,
     "where a hit goes: a Recorder, an object with point(), or None (nowhere)", NULL},
    {"tp", (getter)tp_get_tp, NULL, "the tracepoint's name, fields and layer", NULL},
    {"__name__", (getter)tp_get_name, NULL, NULL, NULL},
    {NULL},
};

static PyMemberDef tp_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(TracePoint, vectorcall), READONLY},
    {NULL},
};

static PyType_Slot tp_slots[] = {
    {Py_tp_new, tp_new},
    {Py_tp_dealloc, tp_dealloc},
    {Py_tp_traverse, tp_traverse},
    {Py_tp_clear, tp_clear},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_getset, tp_getset},
    {Py_tp_members, tp_members},
    {Py_tp_repr, tp_repr},
    {Py_tp_doc, "TracePoint(tp, name, nfields): a tracepoint taking nfields values "
                "(see tracebuf.c)."},
    {0, NULL},
};

static PyType_Spec tp_spec = {
    "c_ext._tracebuf.TracePoint", sizeof(TracePoint), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL, tp_slots,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "c_ext._tracebuf",
    "The tracer's event recorder (see tracebuf.c).", -1, NULL,
};

PyMODINIT_FUNC
PyInit__tracebuf(void)
{
    PyObject *m, *t;

    s_current_attr = PyUnicode_InternFromString("current");
    s_current_global = PyUnicode_InternFromString("_current");
    s_point = PyUnicode_InternFromString("P");
    s_point_method = PyUnicode_InternFromString("point");
    if (s_current_attr == NULL || s_current_global == NULL || s_point == NULL ||
        s_point_method == NULL)
        return NULL;
    m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    t = PyType_FromSpec(&rec_spec);
    if (t == NULL)
        goto fail;
    recorder_type = (PyTypeObject *)t;          /* ours, for the tracepoints' fast path */
    if (PyModule_AddObject(m, "Recorder", Py_NewRef(t)) < 0) {
        Py_DECREF(t);
        goto fail;
    }
    t = PyType_FromSpec(&tp_spec);
    if (t == NULL)
        goto fail;
    if (PyModule_AddObject(m, "TracePoint", t) < 0) {
        Py_DECREF(t);
        goto fail;
    }
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
