/*
 * c_ext._track: partial-order reduction's field recorder in C.
 *
 * While the race explorer records footprints, the objects of the kernel's structs
 * are "tracked twins" (kernel_model/slab.py, _tracked_class): every attribute read
 * and write goes into the running step's footprint as (id(obj), field).  That is
 * one hook per attribute access - tens of thousands per schedule - so it is the
 * explorer's largest cost when written in Python.  Here a twin made with TrackedBase
 * among its bases reads through its C tp_getattro slot and writes through its C
 * __setattr__ method (no Python frame per access).
 *
 * The Python recorder in slab.py (_py_tracked) is the reference: this
 * file does exactly what it does, and tests/kernel_model/test_track_twins.py
 * compares the two.  Only classes whose attribute access is object's own
 * (no __getattribute__, __getattr__, __setattr__ or __delattr__ of their own)
 * get this twin; the others keep the Python one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* set by configure() */
static PyObject *sched_dict;     /* SCHED.__dict__: fp_step and fp_watch live there */
static PyObject *registry;       /* twin type -> (adds, own, hasdict) */
static PyObject *mutable_types;  /* the types whose read is watched (slab._MUTABLE) */
static PyObject *unset;          /* slab._UNSET */
static PyObject *dict_get;       /* dict.get */
static PyObject *obj_getattr;    /* object.__getattribute__ */

static PyObject *s_fp_step, *s_fp_watch, *s_reads, *s_writes, *s_adds, *s_before;

/* The running step (borrowed), or NULL with no error when none records. */
static PyObject *
running_step(void)
{
    PyObject *st;

    if (sched_dict == NULL)
        return NULL;
    st = PyDict_GetItemWithError(sched_dict, s_fp_step);
    if (st == Py_None)
        return NULL;
    return st;
}

/* step.<which>.add((id(self), name)); -1 on error */
static int
add_key(PyObject *st, PyObject *which, PyObject *key)
{
    PyObject *set = PyObject_GetAttr(st, which);
    int r;

    if (set == NULL)
        return -1;
    r = PySet_Add(set, key);
    Py_DECREF(set);
    return r;
}

static PyObject *
make_key(PyObject *self, PyObject *name)
{
    PyObject *id = PyLong_FromVoidPtr(self);
    PyObject *key;

    if (id == NULL)
        return NULL;
    key = PyTuple_Pack(2, id, name);
    Py_DECREF(id);
    return key;
}

/* in(frozenset or None, name): 1, 0, or -1 on error */
static int
member(PyObject *set, PyObject *name)
{
    if (set == Py_None)
        return 0;
    return PySet_Contains(set, name);
}

/* The twin's (adds, own, hasdict) (borrowed): its own entry, or for a subclass made
 * from a twin the nearest registered class on its MRO.  NULL with TypeError if none. */
static PyObject *
config_of(PyTypeObject *tp)
{
    PyObject *cfg = PyDict_GetItemWithError(registry, (PyObject *)tp);
    PyObject *mro;
    Py_ssize_t i;

    if (cfg != NULL || PyErr_Occurred())
        return cfg;
    mro = tp->tp_mro;
    for (i = 1; mro != NULL && i < PyTuple_GET_SIZE(mro); i++) {
        cfg = PyDict_GetItemWithError(registry, PyTuple_GET_ITEM(mro, i));
        if (cfg != NULL || PyErr_Occurred())
            return cfg;
    }
    PyErr_Format(PyExc_TypeError, "_track: %s is not made from a registered twin",
                 tp->tp_name);
    return NULL;
}

/* A field the class lists in POR_ADDS: step.adds.add(key).  1 if it is one, 0 if not,
 * -1 on error. */
static int
record_add(PyObject *st, PyObject *cfg, PyObject *name, PyObject *key)
{
    int r = member(PyTuple_GET_ITEM(cfg, 0), name);

    if (r > 0)
        r = add_key(st, s_adds, key) < 0 ? -1 : 1;
    return r;
}

/* A container read: SCHED.fp_watch(v, key) follows it from now on.  1, or -1 on
 * error. */
static int
watch_read(PyObject *v, PyObject *key)
{
    PyObject *watch = PyDict_GetItemWithError(sched_dict, s_fp_watch), *res;

    if (watch == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "_track: no fp_watch");
        return -1;
    }
    res = PyObject_CallFunctionObjArgs(watch, v, key, NULL);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 1;
}

static PyObject *
tracked_getattro(PyObject *self, PyObject *name)
{
    PyObject *v = PyObject_GenericGetAttr(self, name);
    PyObject *st, *cfg, *key;
    int r;

    st = running_step();
    if (st == NULL) {
        if (PyErr_Occurred() && v != NULL) {
            Py_DECREF(v);
            return NULL;
        }
        return v;
    }
    if (v == NULL) {
        /* a field not set yet: a read all the same */
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyObject *t, *val, *tb;

            PyErr_Fetch(&t, &val, &tb);
            key = make_key(self, name);
            if (key != NULL && add_key(st, s_reads, key) == 0) {
                PyErr_Restore(t, val, tb);
            } else {
                Py_XDECREF(t);
                Py_XDECREF(val);
                Py_XDECREF(tb);
            }
            Py_XDECREF(key);
        }
        return NULL;
    }
    Py_INCREF(st);
    key = make_key(self, name);
    if (key == NULL)
        goto fail;
    cfg = config_of(Py_TYPE(self));
    r = cfg == NULL ? -1 : record_add(st, cfg, name, key);
    if (r == 0) {                  /* not an add: a watched read, or a plain one */
        r = PySet_Contains(mutable_types, (PyObject *)Py_TYPE(v));
        if (r > 0) {
            r = member(PyTuple_GET_ITEM(cfg, 1), name);     /* POR_REPORTED? */
            r = r == 0 ? watch_read(v, key) : r > 0 ? 0 : -1;
        }
        if (r == 0)
            r = add_key(st, s_reads, key);
    }
    Py_DECREF(key);
    Py_DECREF(st);
    if (r < 0) {
        Py_DECREF(v);
        return NULL;
    }
    return v;
fail:
    Py_DECREF(st);
    Py_DECREF(v);
    return NULL;
}

/* step.before[key] = (how to read the field back, its arguments, its value now) */
static int
keep_before(PyObject *st, PyObject *self, PyObject *name, PyObject *key, int hasdict)
{
    PyObject *before, *entry = NULL, *args, *was;
    int r = -1;

    if (hasdict) {
        PyObject *d = PyObject_GenericGetDict(self, NULL);

        if (d == NULL)
            return -1;
        was = PyDict_GetItemWithError(d, name);
        if (was == NULL && PyErr_Occurred()) {
            Py_DECREF(d);
            return -1;
        }
        args = PyTuple_Pack(3, d, name, unset);
        Py_DECREF(d);
        if (args == NULL)
            return -1;
        entry = PyTuple_Pack(3, dict_get, args, was != NULL ? was : unset);
    } else {
        was = PyObject_GenericGetAttr(self, name);
        if (was == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                return -1;
            PyErr_Clear();
        }
        args = PyTuple_Pack(2, self, name);
        if (args == NULL) {
            Py_XDECREF(was);
            return -1;
        }
        entry = PyTuple_Pack(3, obj_getattr, args, was != NULL ? was : unset);
        Py_XDECREF(was);
    }
    Py_DECREF(args);
    if (entry == NULL)
        return -1;
    before = PyObject_GetAttr(st, s_before);
    if (before != NULL) {
        r = PyDict_SetItem(before, key, entry);
        Py_DECREF(before);
    }
    Py_DECREF(entry);
    return r;
}

/* __setattr__(self, name, value).  A method, not the tp_setattro slot: a type whose
 * slot is C code of its own may not be given object.__setattr__ (CPython's check
 * against skipping a C-level override), and the emulator writes fields past the
 * recorder that way (counter_add, kfree's poisoning). */
static PyObject *
tracked_setattr(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *st, *cfg, *key, *writes, *name, *value;
    int r;

    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "__setattr__ takes 2 arguments, %zd given", nargs);
        return NULL;
    }
    name = args[0];
    value = args[1];
    if (!PyUnicode_Check(name)) {
        PyErr_Format(PyExc_TypeError, "attribute name must be string, not '%.200s'",
                     Py_TYPE(name)->tp_name);
        return NULL;
    }
    st = running_step();
    if (st == NULL) {
        if (PyErr_Occurred() || PyObject_GenericSetAttr(self, name, value) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    Py_INCREF(st);
    cfg = config_of(Py_TYPE(self));
    if (cfg == NULL) {
        Py_DECREF(st);
        return NULL;
    }
    key = make_key(self, name);
    if (key == NULL)
        goto fail;
    r = record_add(st, cfg, name, key);
    if (r < 0)
        goto fail_key;
    if (r == 0) {
        writes = PyObject_GetAttr(st, s_writes);
        if (writes == NULL)
            goto fail_key;
        r = PySet_Contains(writes, key);
        if (r == 0)                          /* the step's first write: keep the value */
            r = keep_before(st, self, name, key, PyObject_IsTrue(PyTuple_GET_ITEM(cfg, 2)));
        if (r >= 0)
            r = PySet_Add(writes, key);
        Py_DECREF(writes);
        if (r < 0)
            goto fail_key;
    }
    Py_DECREF(key);
    Py_DECREF(st);
    if (PyObject_GenericSetAttr(self, name, value) < 0)
        return NULL;
    Py_RETURN_NONE;
fail_key:
    Py_DECREF(key);
fail:
    Py_DECREF(st);
    return NULL;
}

static PyMethodDef base_methods[] = {
    {"__setattr__", (PyCFunction)(void (*)(void))tracked_setattr, METH_FASTCALL,
     "Record the write in the running step's footprint, then set the field."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot base_slots[] = {
    {Py_tp_doc, "Base of the C tracked twins: its attribute slots record footprints."},
    {Py_tp_getattro, tracked_getattro},
    {Py_tp_methods, base_methods},
    {0, NULL},
};

static PyType_Spec base_spec = {
    .name = "c_ext._track.TrackedBase",
    .basicsize = sizeof(PyObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = base_slots,
};

/*
 * KeyedBase: the hot methods of kernel_model.sched.KeyedDict, a dict that reports
 * its accesses to partial-order reduction key by key - the firmware's object tables
 * always, every ifc struct's fields while a search records.  A lookup reads
 * (id(self), key); a store writes it, and writes (id(self), "#keys") first when the
 * key is new; a delete is KeyedDict._forget's to record (a subclass hooks it).  Off
 * a recording, each costs one probe of the scheduler's dict more than dict's own.
 * The Python twin and reference is sched._PyKeyedBase.
 */
static PyObject *s_keys, *s_forget;

/* st.<which>.add((id(self), k)); -1 on error */
static int
keyed_add(PyObject *st, PyObject *which, PyObject *self, PyObject *k)
{
    PyObject *key = make_key(self, k);
    int r;

    if (key == NULL)
        return -1;
    r = add_key(st, which, key);
    Py_DECREF(key);
    return r;
}

/* A read of k, when a step records; -1 on error */
static int
keyed_read(PyObject *self, PyObject *k)
{
    PyObject *st = running_step();

    if (st == NULL)
        return PyErr_Occurred() ? -1 : 0;
    return keyed_add(st, s_reads, self, k);
}

static PyObject *
keyed_subscript(PyObject *self, PyObject *k)
{
    if (keyed_read(self, k) < 0)
        return NULL;
    return PyDict_Type.tp_as_mapping->mp_subscript(self, k);
}

static int
keyed_contains(PyObject *self, PyObject *k)
{
    if (keyed_read(self, k) < 0)
        return -1;
    return PyDict_Contains(self, k);
}

static int
keyed_ass_subscript(PyObject *self, PyObject *k, PyObject *v)
{
    PyObject *st, *r;

    if (v == NULL) {                     /* del self[k]: _forget records it */
        r = PyObject_CallMethodOneArg(self, s_forget, k);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
        return PyDict_DelItem(self, k);
    }
    st = running_step();
    if (st == NULL && PyErr_Occurred())
        return -1;
    if (st != NULL) {
        int has, rc = -1;

        Py_INCREF(st);                   /* held across the key's own __eq__ */
        has = PyDict_Contains(self, k);
        if (has >= 0 && (has || keyed_add(st, s_writes, self, s_keys) == 0))
            rc = keyed_add(st, s_writes, self, k);
        Py_DECREF(st);
        if (rc < 0)
            return -1;
    }
    return PyDict_SetItem(self, k, v);
}

/* get(k, default=None) */
static PyObject *
keyed_get(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *v;

    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "get expected 1 or 2 arguments, got %zd", nargs);
        return NULL;
    }
    if (keyed_read(self, args[0]) < 0)
        return NULL;
    v = PyDict_GetItemWithError(self, args[0]);
    if (v == NULL) {
        if (PyErr_Occurred())
            return NULL;
        v = nargs == 2 ? args[1] : Py_None;
    }
    return Py_NewRef(v);
}

static PyMethodDef keyed_methods[] = {
    {"get", (PyCFunction)(void (*)(void))keyed_get, METH_FASTCALL,
     "get(k, default=None): dict.get, the read of k recorded."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot keyed_slots[] = {
    {Py_tp_doc, "The C half of sched.KeyedDict: lookups and stores that record their key."},
    {Py_mp_subscript, keyed_subscript},
    {Py_mp_ass_subscript, keyed_ass_subscript},
    {Py_sq_contains, keyed_contains},
    {Py_tp_methods, keyed_methods},
    {0, NULL},
};

static PyType_Spec keyed_spec = {
    .name = "c_ext._track.KeyedBase",
    .basicsize = 0,                      /* dict's */
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = keyed_slots,
};

/*
 * The race analysis's filter (kernel_model/emu/explore.py, _shared and _keep; those
 * are the Python twins): which objects the steps of more than one task touch, and
 * each step's keys on those.  A key is (id(struct), field, ...) or an object itself;
 * its object is the first item of a tuple, else the key.
 */
static PyObject *s_tid;

static inline PyObject *
object_of(PyObject *key)
{
    return PyTuple_CheckExact(key) && PyTuple_GET_SIZE(key) > 0 ? PyTuple_GET_ITEM(key, 0) : key;
}

/* objects_by_task(steps) -> {tid: set of objects its steps touch}: the tasks in the
 * order of their first step, each set filled in the order of the steps' reads,
 * writes and adds (as _shared's Python builds them) */
static PyObject *
objects_by_task(PyObject *Py_UNUSED(mod), PyObject *steps)
{
    PyObject *by = PyDict_New(), *it, *st;
    PyObject *parts[3];

    if (by == NULL)
        return NULL;
    parts[0] = s_reads;
    parts[1] = s_writes;
    parts[2] = s_adds;
    it = PyObject_GetIter(steps);
    if (it == NULL)
        goto fail;
    while ((st = PyIter_Next(it)) != NULL) {
        PyObject *tid = PyObject_GetAttr(st, s_tid), *mine;
        int i;

        if (tid == NULL)
            goto fail_st;
        mine = PyDict_GetItemWithError(by, tid);
        if (mine == NULL) {
            if (PyErr_Occurred() || (mine = PySet_New(NULL)) == NULL) {
                Py_DECREF(tid);
                goto fail_st;
            }
            if (PyDict_SetItem(by, tid, mine) < 0) {
                Py_DECREF(mine);
                Py_DECREF(tid);
                goto fail_st;
            }
            Py_DECREF(mine);             /* the dict holds it */
        }
        Py_DECREF(tid);
        for (i = 0; i < 3; i++) {
            PyObject *part = PyObject_GetAttr(st, parts[i]), *pit, *key;

            if (part == NULL)
                goto fail_st;
            pit = PyObject_GetIter(part);
            Py_DECREF(part);
            if (pit == NULL)
                goto fail_st;
            while ((key = PyIter_Next(pit)) != NULL) {
                int r = PySet_Add(mine, object_of(key));

                Py_DECREF(key);
                if (r < 0) {
                    Py_DECREF(pit);
                    goto fail_st;
                }
            }
            Py_DECREF(pit);
            if (PyErr_Occurred())
                goto fail_st;
        }
        Py_DECREF(st);
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        Py_DECREF(by);
        return NULL;
    }
    return by;
fail_st:
    Py_DECREF(st);
    Py_DECREF(it);
fail:
    Py_DECREF(by);
    return NULL;
}

/* keep(keys, shared) -> [the keys whose object is in shared], in keys' order */
static PyObject *
keep(PyObject *Py_UNUSED(mod), PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *out, *it, *key;

    if (nargs != 2 || !PyAnySet_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "keep(keys, shared): shared is a set");
        return NULL;
    }
    out = PyList_New(0);
    it = out ? PyObject_GetIter(args[0]) : NULL;
    if (it == NULL) {
        Py_XDECREF(out);
        return NULL;
    }
    while ((key = PyIter_Next(it)) != NULL) {
        int r = PySet_Contains(args[1], object_of(key));

        if (r > 0)
            r = PyList_Append(out, key);
        Py_DECREF(key);
        if (r < 0) {
            Py_DECREF(it);
            Py_DECREF(out);
            return NULL;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* set_sched(sched_dict): where the running step is (sched.py, at import) */
static PyObject *
set_sched(PyObject *Py_UNUSED(mod), PyObject *sd)
{
    if (!PyDict_Check(sd)) {
        PyErr_SetString(PyExc_TypeError, "set_sched: a dict (vars(SCHED))");
        return NULL;
    }
    Py_INCREF(sd);
    Py_XSETREF(sched_dict, sd);
    Py_RETURN_NONE;
}

static PyObject *
configure(PyObject *Py_UNUSED(mod), PyObject *args)
{
    PyObject *sd, *reg, *mut, *un;

    if (!PyArg_ParseTuple(args, "O!O!O!O:configure", &PyDict_Type, &sd, &PyDict_Type, &reg,
                          &PyFrozenSet_Type, &mut, &un))
        return NULL;
    Py_INCREF(sd);
    Py_XSETREF(sched_dict, sd);
    Py_INCREF(reg);
    Py_XSETREF(registry, reg);
    Py_INCREF(mut);
    Py_XSETREF(mutable_types, mut);
    Py_INCREF(un);
    Py_XSETREF(unset, un);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"objects_by_task", objects_by_task, METH_O,
     "objects_by_task(steps) -> {tid: objects its steps touch} (explore._shared's part)"},
    {"keep", (PyCFunction)(void (*)(void))keep, METH_FASTCALL,
     "keep(keys, shared) -> the keys whose object is in shared, in order (explore._keep)"},
    {"set_sched", set_sched, METH_O,
     "set_sched(sched_dict): where KeyedBase finds the running step."},
    {"configure", configure, METH_VARARGS,
     "configure(sched_dict, registry, mutable_types, unset): where the recorder finds "
     "the running step, each twin's (adds, own, hasdict), the watched types and the "
     "marker of a field not set yet."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "c_ext._track",
    "Partial-order reduction's field recorder (see track.c).", -1, methods,
};

static int
intern(PyObject **p, const char *s)
{
    *p = PyUnicode_InternFromString(s);
    return *p == NULL ? -1 : 0;
}

PyMODINIT_FUNC
PyInit__track(void)
{
    PyObject *m, *base;

    if (intern(&s_fp_step, "fp_step") || intern(&s_fp_watch, "fp_watch") ||
        intern(&s_reads, "reads") || intern(&s_writes, "writes") ||
        intern(&s_adds, "adds") || intern(&s_before, "before") ||
        intern(&s_keys, "#keys") || intern(&s_forget, "_forget") ||
        intern(&s_tid, "tid"))
        return NULL;
    dict_get = PyObject_GetAttrString((PyObject *)&PyDict_Type, "get");
    if (dict_get == NULL)
        return NULL;
    obj_getattr = PyObject_GetAttrString((PyObject *)&PyBaseObject_Type, "__getattribute__");
    if (obj_getattr == NULL)
        return NULL;
    m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    base = PyType_FromSpec(&base_spec);
    if (base == NULL || PyModule_AddObject(m, "TrackedBase", base) < 0) {
        Py_XDECREF(base);
        Py_DECREF(m);
        return NULL;
    }
    {
        PyObject *bases = PyTuple_Pack(1, (PyObject *)&PyDict_Type);
        PyObject *keyed = bases ? PyType_FromSpecWithBases(&keyed_spec, bases) : NULL;

        Py_XDECREF(bases);
        if (keyed == NULL || PyModule_AddObject(m, "KeyedBase", keyed) < 0) {
            Py_XDECREF(keyed);
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
