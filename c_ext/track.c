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
#include <structmember.h>

/* set by configure() */
static PyObject *sched_dict;     /* SCHED.__dict__: fp_step and fp_watch live there */
static PyObject *registry;       /* twin type -> (adds, own, hasdict) */
static PyObject *mutable_types;  /* the types whose read is watched (slab._MUTABLE) */
static PyObject *unset;          /* slab._UNSET */
static PyObject *dict_get;       /* dict.get */
static PyObject *obj_getattr;    /* object.__getattribute__ */

static PyObject *s_fp_step, *s_fp_watch, *s_reads, *s_writes, *s_adds, *s_before;
/* none of int, str, bool and None's type is in mutable_types (configure) */
static int plain_unwatched;

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

/*
 * The running step's reads, writes or adds set (a new reference).  Step is an attrs
 * slots class, each of its fields a member descriptor: once the type's descriptors
 * are looked up, a field is read straight from its slot - what getattr finds, without
 * the lookup on every access (tens of thousands a schedule).  The offsets are the
 * type's as of its version tag; any other type, a changed type or an empty slot goes
 * through getattr.
 */
static PyTypeObject *step_tp;            /* the type the offsets are of (held) */
static unsigned int step_tag;            /* its tp_version_tag then */
static Py_ssize_t step_off[3];           /* reads, writes, adds; 0: not a plain slot */

static Py_ssize_t
member_offset(PyTypeObject *tp, PyObject *name)
{
    PyObject *d = _PyType_Lookup(tp, name);
    PyMemberDef *m;

    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type))
        return 0;
    m = ((PyMemberDescrObject *)d)->d_member;
    return m->type == T_OBJECT_EX && !(m->flags & READONLY) ? m->offset : 0;
}

static PyObject *
step_set(PyObject *st, PyObject *which)
{
    PyTypeObject *tp = Py_TYPE(st);
    int i = which == s_reads ? 0 : which == s_writes ? 1 : which == s_adds ? 2 : -1;

    if (i >= 0 && PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG)) {
        if (tp != step_tp || tp->tp_version_tag != step_tag) {
            Py_INCREF(tp);
            Py_XSETREF(step_tp, tp);
            step_tag = tp->tp_version_tag;
            step_off[0] = member_offset(tp, s_reads);
            step_off[1] = member_offset(tp, s_writes);
            step_off[2] = member_offset(tp, s_adds);
        }
        if (step_off[i] > 0) {
            PyObject *v = *(PyObject **)((char *)st + step_off[i]);

            if (v != NULL)
                return Py_NewRef(v);
        }
    }
    return PyObject_GetAttr(st, which);
}

/* step.<which>.add((id(self), name)); -1 on error */
static int
add_key(PyObject *st, PyObject *which, PyObject *key)
{
    PyObject *set = step_set(st, which);
    int r;

    if (set == NULL)
        return -1;
    r = PySet_Add(set, key);
    Py_DECREF(set);
    return r;
}

/*
 * The keys made while a run records: (object's address, field) -> the (id, field)
 * tuple made for it the first time.  A field read a hundred times in a run is one
 * tuple, not a hundred made, hashed against the step's copy, compared and freed.
 * Looked up by the two pointers; the tuple holds the field name (or table key), so
 * that pointer stays its own, and the address alone is the id whatever lives there
 * now - an entry is never wrong, only kept until clear_keys (each run's end).
 */
typedef struct {
    PyObject *self;          /* the address only: never dereferenced */
    PyObject *name;          /* borrowed: key holds it */
    PyObject *key;
} kc_entry;

static kc_entry *kc_table;
static size_t kc_cap, kc_used;

static inline size_t
kc_slot(PyObject *self, PyObject *name, size_t mask)
{
    size_t h = ((size_t)self >> 4) * 0x9E3779B97F4A7C15ull ^ ((size_t)name >> 3);

    return (h ^ (h >> 29)) & mask;
}

/* forget every key; the table keeps its size for the next run (a run makes about
 * as many as the last one: growing again from the start rehashed them four times) */
static void
kc_clear(void)
{
    size_t i;

    for (i = 0; i < kc_cap; i++)
        Py_CLEAR(kc_table[i].key);
    kc_used = 0;
}

static int
kc_grow(void)
{
    size_t cap = kc_cap ? kc_cap * 2 : 4096, i, j;
    kc_entry *t = PyMem_Calloc(cap, sizeof(kc_entry));

    if (t == NULL)
        return -1;
    for (i = 0; i < kc_cap; i++)
        if (kc_table[i].key != NULL) {
            j = kc_slot(kc_table[i].self, kc_table[i].name, cap - 1);
            while (t[j].key != NULL)
                j = (j + 1) & (cap - 1);
            t[j] = kc_table[i];
        }
    PyMem_Free(kc_table);
    kc_table = t;
    kc_cap = cap;
    return 0;
}

static PyObject *
make_key(PyObject *self, PyObject *name)
{
    PyObject *id, *key;
    size_t j;

    if (kc_used * 2 >= kc_cap && kc_grow() < 0) {
        PyErr_NoMemory();
        return NULL;
    }
    j = kc_slot(self, name, kc_cap - 1);
    for (; kc_table[j].key != NULL; j = (j + 1) & (kc_cap - 1))
        if (kc_table[j].self == self && kc_table[j].name == name) {
            Py_INCREF(kc_table[j].key);
            return kc_table[j].key;
        }
    id = PyLong_FromVoidPtr(self);
    if (id == NULL)
        return NULL;
    key = PyTuple_Pack(2, id, name);
    Py_DECREF(id);
    if (key == NULL)
        return NULL;
    kc_table[j].self = self;
    kc_table[j].name = name;
    kc_table[j].key = key;
    kc_used++;
    Py_INCREF(key);
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
        /* (most fields hold ints, strings or None: not containers, unless told) */
        r = plain_unwatched && (PyLong_CheckExact(v) || PyUnicode_CheckExact(v) ||
                                v == Py_None || PyBool_Check(v)) ? 0 :
            PySet_Contains(mutable_types, (PyObject *)Py_TYPE(v));
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
        writes = step_set(st, s_writes);
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

/*
 * races(cands, steps, shared): explore._races's analysis (its Python twin is
 * explore._py_races; tests/kernel_model/test_explore_dpor.py compares them).
 *
 * The Python keeps, for every object key, a dict of its last write and a dict of
 * task -> step for its readers and adders since; most of a run's analysis went on
 * hashing the same tuple keys into those dicts several times a step.  Here each key
 * is hashed once a step into one table that numbers it, and the rest is arrays.
 * A step's races come in the order of their earlier steps, as the twin's do (a
 * search keeps the first race per decision and task, so that order must not hang
 * on where the keys' objects happen to lie in memory); each race's initials are
 * the same Python set, built the same way.
 */
typedef struct {
    int tid, k;
} tk_t;

typedef struct {            /* task -> latest step, in first-insertion order */
    int n, cap;
    tk_t *heap;
    tk_t in[2];
} tkvec_t;

typedef struct {
    int last_write;         /* -1: none */
    char in_fields;         /* its struct's field set holds it already */
    tkvec_t readers, adders;
} keystate_t;

typedef struct {
    PyObject *index;        /* key -> its number */
    keystate_t *ks;
    Py_ssize_t nks, capks;
    PyObject *fields;       /* struct object -> set of its field keys touched */
    int width;
    int *vcs;               /* step k's vector clock: vcs[k * width ...] */
    int *tid, *local, *decision;
} races_t;

static PyObject *s_point, *s_wakes, *s_joins, *s_ends;

static inline tk_t *
tk_data(tkvec_t *v)
{
    return v->cap > 2 ? v->heap : v->in;
}

static int
tk_set(tkvec_t *v, int tid, int k)
{
    tk_t *d = tk_data(v);
    int i;

    for (i = 0; i < v->n; i++)
        if (d[i].tid == tid) {
            d[i].k = k;
            return 0;
        }
    if (v->n == (v->cap > 2 ? v->cap : 2)) {
        int cap = v->n * 2;
        tk_t *h = PyMem_Malloc(sizeof(tk_t) * cap);

        if (h == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(h, d, sizeof(tk_t) * v->n);
        if (v->cap > 2)
            PyMem_Free(v->heap);
        v->heap = h;
        v->cap = cap;
        d = h;
    }
    d[v->n].tid = tid;
    d[v->n].k = k;
    v->n++;
    return 0;
}

/* The number of `key` (-1: not seen, with no error), made when `make`. */
static Py_ssize_t
key_index(races_t *R, PyObject *key, int make)
{
    PyObject *n = PyDict_GetItemWithError(R->index, key);

    if (n != NULL)
        return PyLong_AsSsize_t(n);
    if (PyErr_Occurred() || !make)
        return -1;
    if (R->nks == R->capks) {
        Py_ssize_t cap = R->capks ? R->capks * 2 : 1024;
        keystate_t *ks = PyMem_Realloc(R->ks, sizeof(keystate_t) * cap);

        if (ks == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        R->ks = ks;
        R->capks = cap;
    }
    n = PyLong_FromSsize_t(R->nks);
    if (n == NULL || PyDict_SetItem(R->index, key, n) < 0) {
        Py_XDECREF(n);
        return -1;
    }
    Py_DECREF(n);
    memset(&R->ks[R->nks], 0, sizeof(keystate_t));
    R->ks[R->nks].last_write = -1;
    return R->nks++;
}

/* a step's dependences on other tasks' steps: each once (stamped with the step) */
typedef struct {
    int *j, n, cap;
    int *mark;              /* mark[j] == stamp: j is in */
    int stamp, tid;         /* the step's number + 1, its task */
    const int *tids;
} deps_t;

static int
add_step(deps_t *D, int j)
{
    if (D->tids[j] == D->tid || D->mark[j] == D->stamp)
        return 0;
    if (D->n == D->cap) {
        int cap = D->cap ? D->cap * 2 : 64, *a = PyMem_Realloc(D->j, sizeof(int) * cap);

        if (a == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        D->j = a;
        D->cap = cap;
    }
    D->mark[j] = D->stamp;
    D->j[D->n++] = j;
    return 0;
}

static int
cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;

    return (x > y) - (x < y);
}

/* deps gets key's last write, and (by: 1 readers, 2 adders, 3 both) its tasks' steps
 * (other tasks' only: see add_step) */
static int
deps_of_index(races_t *R, deps_t *deps, Py_ssize_t x, int by)
{
    keystate_t *s = &R->ks[x];
    int i;

    if (s->last_write >= 0 && add_step(deps, s->last_write) < 0)
        return -1;
    if (by & 1)
        for (i = 0; i < s->readers.n; i++)
            if (add_step(deps, tk_data(&s->readers)[i].k) < 0)
                return -1;
    if (by & 2)
        for (i = 0; i < s->adders.n; i++)
            if (add_step(deps, tk_data(&s->adders)[i].k) < 0)
                return -1;
    return 0;
}

static int
deps_of_key(races_t *R, deps_t *deps, PyObject *key, int by)
{
    Py_ssize_t x = key_index(R, key, 0);

    if (x < 0)
        return PyErr_Occurred() ? -1 : 0;
    return deps_of_index(R, deps, x, by);
}

/* a whole struct written: its own key's dependences, then each field touched so far */
static int
deps_of_struct(races_t *R, deps_t *deps, PyObject *key, Py_ssize_t kx)
{
    PyObject *f, *it, *fk;

    if (deps_of_index(R, deps, kx, 3) < 0)
        return -1;
    f = PyDict_GetItemWithError(R->fields, key);
    if (f == NULL)
        return PyErr_Occurred() ? -1 : 0;
    it = PyObject_GetIter(f);
    if (it == NULL)
        return -1;
    while ((fk = PyIter_Next(it)) != NULL) {
        int r = deps_of_key(R, deps, fk, 3);

        Py_DECREF(fk);
        if (r < 0) {
            Py_DECREF(it);
            return -1;
        }
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : 0;
}

static int
last_write_of(races_t *R, deps_t *deps, PyObject *key)
{
    Py_ssize_t x = key_index(R, key, 0);

    if (x < 0)
        return PyErr_Occurred() ? -1 : 0;
    return R->ks[x].last_write >= 0 ? add_step(deps, R->ks[x].last_write) : 0;
}

/* the kept keys (object in shared) of a step's part, in the set's order */
static PyObject *
kept(PyObject *st, PyObject *name, PyObject *shared)
{
    PyObject *part = step_set(st, name), *out;
    PyObject *args[2];

    if (part == NULL)
        return NULL;
    args[0] = part;
    args[1] = shared;
    out = keep(NULL, args, 2);
    Py_DECREF(part);
    return out;
}

/* a field key: its struct's set of fields touched holds it */
static int
note_field(races_t *R, PyObject *key, Py_ssize_t x)
{
    PyObject *f;

    if (!PyTuple_CheckExact(key) || PyTuple_GET_SIZE(key) == 0 || R->ks[x].in_fields)
        return 0;
    f = PyDict_GetItemWithError(R->fields, PyTuple_GET_ITEM(key, 0));
    if (f == NULL) {
        if (PyErr_Occurred() || (f = PySet_New(NULL)) == NULL)
            return -1;
        if (PyDict_SetItem(R->fields, PyTuple_GET_ITEM(key, 0), f) < 0) {
            Py_DECREF(f);
            return -1;
        }
        Py_DECREF(f);
    }
    R->ks[x].in_fields = 1;
    return PySet_Add(f, key);
}

static inline int
is_field(PyObject *key)
{
    return PyTuple_CheckExact(key) && PyTuple_GET_SIZE(key) > 0;
}

/* the tids as C ints; -1 for anything else */
static int
as_tid(PyObject *o)
{
    long v = PyLong_AsLong(o);

    if (v == -1 && PyErr_Occurred())
        return -2;
    return v < 0 || v > 1 << 20 ? -1 : (int)v;
}

/* the tasks (in [0, width): no step names another) in a step's set `name` -> out;
 * their number, or -1 on error */
static int
tids_of(PyObject *st, PyObject *name, int width, int *out)
{
    PyObject *o = PyObject_GetAttr(st, name), *it, *key;
    int n = 0;

    it = o ? PyObject_GetIter(o) : NULL;
    Py_XDECREF(o);
    if (it == NULL)
        return -1;
    while ((key = PyIter_Next(it)) != NULL) {
        int t = as_tid(key);

        Py_DECREF(key);
        if (t == -2) {
            Py_DECREF(it);
            return -1;
        }
        if (t >= 0 && t < width && n < width)
            out[n++] = t;
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : n;
}

/* vc := the pointwise max of vc and other (a clock learning another's past) */
static inline void
vc_join(int *vc, const int *other, int width)
{
    int t;

    for (t = 0; t < width; t++)
        if (other[t] > vc[t])
            vc[t] = other[t];
}

static void
races_free(races_t *R)
{
    Py_ssize_t i;

    for (i = 0; i < R->nks; i++) {
        if (R->ks[i].readers.cap > 2)
            PyMem_Free(R->ks[i].readers.heap);
        if (R->ks[i].adders.cap > 2)
            PyMem_Free(R->ks[i].adders.heap);
    }
    PyMem_Free(R->ks);
    PyMem_Free(R->vcs);
    PyMem_Free(R->tid);
    PyMem_Free(R->local);
    PyMem_Free(R->decision);
    Py_XDECREF(R->index);
    Py_XDECREF(R->fields);
}

/* one race (j, k): append (d, p, initials, every) to out */
static int
race_found(races_t *R, PyObject *out, PyObject *cands_of, int j, int k, const int *vc,
           const deps_t *D)
{
    const int *deps = D->j;
    int ndeps = D->n;
    int W = R->width, tj = R->tid[j], lj = R->local[j], d = R->decision[j], i, m, r;
    int tid = R->tid[k];
    PyObject *cands, *tido, *lead, *cset, *t, *res;

    cands = PyTuple_GET_ITEM(cands_of, d);
    tido = PyLong_FromLong(tid);
    if (tido == NULL)
        return -1;
    r = PySequence_Contains(cands, tido);
    if (r < 0) {
        Py_DECREF(tido);
        return -1;
    }
    if (r) {
        PyObject *one = PySet_New(NULL);

        if (one == NULL || PySet_Add(one, tido) < 0) {
            Py_XDECREF(one);
            Py_DECREF(tido);
            return -1;
        }
        t = Py_BuildValue("(iOOO)", d, tido, one, Py_False);
        Py_DECREF(one);
        Py_DECREF(tido);
        if (t == NULL)
            return -1;
        r = PyList_Append(out, t);
        Py_DECREF(t);
        return r;
    }
    Py_DECREF(tido);
    /* the tasks with a step after j, not after j itself, that happens-before k */
    lead = PySet_New(NULL);
    if (lead == NULL)
        return -1;
    for (i = j + 1; i < k; i++) {
        int ti = R->tid[i], li = R->local[i], hb;

        if (R->vcs[(Py_ssize_t)i * W + tj] >= lj)
            continue;
        hb = vc[ti] >= li || D->mark[i] == D->stamp;
        for (m = 0; !hb && m < ndeps; m++)
            hb = R->vcs[(Py_ssize_t)deps[m] * W + ti] >= li;
        if (hb) {
            PyObject *to = PyLong_FromLong(ti);

            r = to != NULL ? PySet_Add(lead, to) : -1;
            Py_XDECREF(to);
            if (r < 0)
                goto fail;
        }
    }
    cset = PySet_New(cands);
    if (cset == NULL)
        goto fail;
    res = PyNumber_InPlaceAnd(lead, cset);
    Py_DECREF(lead);
    if (res == NULL) {
        Py_DECREF(cset);
        return -1;
    }
    lead = res;
    if (PySet_GET_SIZE(lead) > 0)
        t = Py_BuildValue("(iiOO)", d, tid, lead, Py_False);
    else
        t = Py_BuildValue("(iiOO)", d, tid, cset, Py_True);
    Py_DECREF(cset);
    Py_DECREF(lead);
    if (t == NULL)
        return -1;
    r = PyList_Append(out, t);
    Py_DECREF(t);
    return r;
fail:
    Py_DECREF(lead);
    return -1;
}

static PyObject *
races(PyObject *Py_UNUSED(mod), PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *cands_of = NULL, *steps = NULL, *shared, *out = NULL, *parts[3] = {NULL, NULL, NULL};
    races_t R;
    deps_t D;
    Py_ssize_t nsteps, k;
    int width = 0, *last_of = NULL, *woken_by = NULL, *ended = NULL, *count = NULL;
    int *tids = NULL, d_now = -1;
    Py_ssize_t *xs = NULL, cap_xs = 0;

    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1]) ||
            !PyAnySet_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "races(cands, steps, shared): two lists and a set");
        return NULL;
    }
    shared = args[2];
    memset(&R, 0, sizeof(R));
    memset(&D, 0, sizeof(D));
    /* tuples of their items: nothing a key's __eq__ runs can shrink them under us */
    cands_of = PyList_AsTuple(args[0]);
    steps = cands_of ? PyList_AsTuple(args[1]) : NULL;
    out = steps ? PyList_New(0) : NULL;
    if (out == NULL)
        goto fail;
    nsteps = PyTuple_GET_SIZE(steps);
    if (nsteps == 0)
        goto done;
    R.tid = PyMem_Calloc(nsteps, sizeof(int));
    R.local = PyMem_Calloc(nsteps, sizeof(int));
    R.decision = PyMem_Calloc(nsteps, sizeof(int));
    D.mark = PyMem_Calloc(nsteps, sizeof(int));
    D.tids = R.tid;
    R.index = PyDict_New();
    R.fields = PyDict_New();
    if (!R.tid || !R.local || !R.decision || !D.mark || !R.index || !R.fields)
        goto nomem;
    for (k = 0; k < nsteps; k++) {
        PyObject *t = PyObject_GetAttr(PyTuple_GET_ITEM(steps, k), s_tid);
        int v;

        if (t == NULL)
            goto fail;
        v = as_tid(t);
        Py_DECREF(t);
        if (v < 0) {
            if (v == -1)
                PyErr_SetString(PyExc_ValueError, "races: a step's tid is not a task number");
            goto fail;
        }
        R.tid[k] = v;
        if (v + 1 > width)
            width = v + 1;
    }
    R.width = width;
    R.vcs = PyMem_Calloc((size_t)nsteps * width, sizeof(int));
    last_of = PyMem_Malloc(sizeof(int) * width);
    woken_by = PyMem_Malloc(sizeof(int) * width);
    ended = PyMem_Malloc(sizeof(int) * width);
    count = PyMem_Calloc(width, sizeof(int));
    tids = PyMem_Malloc(sizeof(int) * width);
    if (!R.vcs || !last_of || !woken_by || !ended || !count || !tids)
        goto nomem;
    for (k = 0; k < width; k++)
        last_of[k] = woken_by[k] = ended[k] = -1;

    for (k = 0; k < nsteps; k++) {
        PyObject *st = PyTuple_GET_ITEM(steps, k), *pt, *o, *key;
        int tid = R.tid[k], n, prev, w, i, m;
        int *vc = R.vcs + (Py_ssize_t)k * width;
        Py_ssize_t p, x, nx;

        pt = PyObject_GetAttr(st, s_point);
        if (pt == NULL)
            goto fail;
        if (pt != Py_None) {
            d_now = (int)PyLong_AsLong(pt);
            if (d_now < 0 || d_now >= PyTuple_GET_SIZE(cands_of)) {
                Py_DECREF(pt);
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "races: a step's point is not a "
                                    "decision of the run");
                goto fail;
            }
        }
        Py_DECREF(pt);
        R.decision[k] = d_now;
        n = ++count[tid];
        R.local[k] = n;
        prev = last_of[tid];
        if (prev >= 0)
            memcpy(vc, R.vcs + (Py_ssize_t)prev * width, sizeof(int) * width);
        w = woken_by[tid];
        if (w >= 0 && (prev < 0 || w > prev))   /* spawned or woken after its last step */
            vc_join(vc, R.vcs + (Py_ssize_t)w * width, width);
        m = tids_of(st, s_joins, width, tids);  /* a join of a task that has ended */
        if (m < 0)
            goto fail;
        for (i = 0; i < m; i++)
            if (ended[tids[i]] >= 0)
                vc_join(vc, R.vcs + (Py_ssize_t)ended[tids[i]] * width, width);

        /* the dependences on other tasks' steps */
        parts[0] = kept(st, s_reads, shared);
        parts[1] = parts[0] ? kept(st, s_adds, shared) : NULL;
        parts[2] = parts[1] ? kept(st, s_writes, shared) : NULL;
        if (parts[2] == NULL)
            goto fail;
        /* each kept key's number, made now if new (a new one has no last write, no
         * readers, no adders: the same as not there), used again below */
        x = PyList_GET_SIZE(parts[0]) + PyList_GET_SIZE(parts[1]) + PyList_GET_SIZE(parts[2]);
        if (x > cap_xs) {
            Py_ssize_t *a = PyMem_Realloc(xs, sizeof(Py_ssize_t) * x * 2);

            if (a == NULL)
                goto nomem;
            xs = a;
            cap_xs = x * 2;
        }
        x = 0;
        for (i = 0; i < 3; i++)
            for (p = 0; p < PyList_GET_SIZE(parts[i]); p++)
                if ((xs[x++] = key_index(&R, PyList_GET_ITEM(parts[i], p), 1)) < 0)
                    goto fail;
        D.n = 0;
        D.stamp = (int)k + 1;
        D.tid = tid;
        x = 0;
        for (i = 0; i < 2; i++)            /* reads: writes and adds; adds: writes and reads */
            for (p = 0; p < PyList_GET_SIZE(parts[i]); p++) {
                key = PyList_GET_ITEM(parts[i], p);
                if (deps_of_index(&R, &D, xs[x++], i == 0 ? 2 : 1) < 0)
                    goto fail;
                if (is_field(key) && last_write_of(&R, &D, PyTuple_GET_ITEM(key, 0)) < 0)
                    goto fail;
            }
        for (p = 0; p < PyList_GET_SIZE(parts[2]); p++) {
            Py_ssize_t kx = xs[x++];

            key = PyList_GET_ITEM(parts[2], p);
            if (is_field(key)) {
                if (last_write_of(&R, &D, PyTuple_GET_ITEM(key, 0)) < 0 ||
                        deps_of_index(&R, &D, kx, 3) < 0)
                    goto fail;
            } else if (deps_of_struct(&R, &D, key, kx) < 0) {
                goto fail;
            }
        }
        /* in step order: what the search meets first does not hang on the keys' ids */
        qsort(D.j, D.n, sizeof(int), cmp_int);
        for (i = 0; i < D.n; i++) {
            int j = D.j[i], tj = R.tid[j], lj = R.local[j], m, ordered = vc[tj] >= lj;

            for (m = 0; !ordered && m < D.n; m++)
                ordered = m != i && R.vcs[(Py_ssize_t)D.j[m] * width + tj] >= lj;
            if (ordered || R.decision[j] < 0)
                continue;
            if (race_found(&R, out, cands_of, j, (int)k, vc, &D) < 0)
                goto fail;
        }
        for (i = 0; i < D.n; i++)
            vc_join(vc, R.vcs + (Py_ssize_t)D.j[i] * width, width);
        vc[tid] = n;
        last_of[tid] = (int)k;
        m = tids_of(st, s_wakes, width, tids);
        if (m < 0)
            goto fail;
        for (i = 0; i < m; i++)
            woken_by[tids[i]] = (int)k;
        o = PyObject_GetAttr(st, s_ends);
        if (o == NULL)
            goto fail;
        i = PyObject_IsTrue(o);
        Py_DECREF(o);
        if (i < 0)
            goto fail;
        if (i)
            ended[tid] = (int)k;
        /* what later steps depend on */
        nx = 0;
        for (i = 0; i < 3; i++)
            for (p = 0; p < PyList_GET_SIZE(parts[i]); p++) {
                key = PyList_GET_ITEM(parts[i], p);
                x = xs[nx++];
                if (i == 0 ? tk_set(&R.ks[x].readers, tid, (int)k) :
                        i == 1 ? tk_set(&R.ks[x].adders, tid, (int)k) : 0)
                    goto fail;
                if (i == 2) {
                    R.ks[x].last_write = (int)k;
                    R.ks[x].readers.n = 0;
                    R.ks[x].adders.n = 0;
                }
                if (note_field(&R, key, x) < 0)
                    goto fail;
            }
        for (i = 0; i < 3; i++)
            Py_CLEAR(parts[i]);
    }
    goto done;
nomem:
    PyErr_NoMemory();
fail:
    Py_CLEAR(out);
done:
    for (k = 0; k < 3; k++)
        Py_XDECREF(parts[k]);
    PyMem_Free(last_of);
    PyMem_Free(woken_by);
    PyMem_Free(ended);
    PyMem_Free(count);
    PyMem_Free(tids);
    PyMem_Free(xs);
    PyMem_Free(D.j);
    PyMem_Free(D.mark);
    races_free(&R);
    Py_XDECREF(cands_of);
    Py_XDECREF(steps);
    return out;
}

/*
 * silent(before, writes, reads, mutable, states): explore._silent's loop (its Python
 * twin is explore._py_silent).  Each field or object the step wrote is read back
 * (before[key] = (how, its arguments, the value at the first write)); one that holds
 * its first value again was only read: it leaves writes for reads.  The same value
 * means the same object when it is not of a mutable type, or an equal value of the
 * same type when that type is one of states.  A read back that raises (a freed
 * struct) stays a write.
 */
static PyObject *
silent(PyObject *Py_UNUSED(mod), PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *before, *writes, *reads, *mutable, *states, *k, *entry;
    Py_ssize_t pos = 0;

    if (nargs != 5 || !PyDict_Check(args[0]) || !PySet_Check(args[1]) ||
            !PySet_Check(args[2]) || !PyAnySet_Check(args[3]) || !PyAnySet_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "silent(before, writes, reads, mutable, states): "
                        "a dict, two sets and two sets of types");
        return NULL;
    }
    before = args[0];
    writes = args[1];
    reads = args[2];
    mutable = args[3];
    states = args[4];
    while (PyDict_Next(before, &pos, &k, &entry)) {
        PyObject *v, *was;
        int same, r;

        if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3 ||
                !PyTuple_CheckExact(PyTuple_GET_ITEM(entry, 1))) {
            PyErr_SetString(PyExc_TypeError, "silent: before's entries are (how, args, was)");
            return NULL;
        }
        Py_INCREF(k);
        Py_INCREF(entry);
        v = PyObject_Call(PyTuple_GET_ITEM(entry, 0), PyTuple_GET_ITEM(entry, 1), NULL);
        if (v == NULL) {
            Py_DECREF(entry);
            Py_DECREF(k);
            if (!PyErr_ExceptionMatches(PyExc_Exception))
                return NULL;
            PyErr_Clear();              /* freed (KASAN's poison), gone: a write */
            continue;
        }
        was = PyTuple_GET_ITEM(entry, 2);
        if (v == was) {
            same = PySet_Contains(mutable, (PyObject *)Py_TYPE(v));
            same = same < 0 ? -1 : !same;
        } else if (Py_TYPE(v) != Py_TYPE(was)) {
            same = 0;
        } else {
            same = PySet_Contains(states, (PyObject *)Py_TYPE(v));
            if (same > 0) {                /* not (v != was), as the twin asks */
                same = PyObject_RichCompareBool(v, was, Py_NE);
                same = same < 0 ? -1 : !same;
            }
        }
        Py_DECREF(v);
        Py_DECREF(entry);
        r = same;
        if (same > 0) {
            r = PySet_Discard(writes, k);
            if (r >= 0)
                r = PySet_Add(reads, k);
        }
        Py_DECREF(k);
        if (r < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

/* clear_keys(): forget the keys made (Recording.remove, at each run's end) */
static PyObject *
clear_keys(PyObject *Py_UNUSED(mod), PyObject *Py_UNUSED(arg))
{
    kc_clear();
    Py_RETURN_NONE;
}

/* cached_keys() -> how many keys are kept (for tests) */
static PyObject *
cached_keys(PyObject *Py_UNUSED(mod), PyObject *Py_UNUSED(arg))
{
    return PyLong_FromSize_t(kc_used);
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

/*
 * The __new__ slab.track_structs gives every struct class once partial-order
 * reduction has recorded (CPython cannot take a __new__ back off a class: from then
 * on every object of it is made through one).  Off a recording it is object.__new__
 * (cls); while one records, slab._tracked_new - the Python twin and reference, which
 * makes the footprint-recording twin - is called with the same arguments.  The
 * Python one alone cost a frame per object made in every run after the first
 * recorded one (~1,100 a run of dma-vs-invalidate: 8% of the run).
 */
static PyObject *s_fp, *py_tracked_new, *object_new;   /* object.__new__ */

static PyObject *
tracked_new(PyObject *Py_UNUSED(mod), PyObject *args, PyObject *kwargs)
{
    PyObject *cls, *fp;

    if (PyTuple_GET_SIZE(args) < 1 || !PyType_Check(PyTuple_GET_ITEM(args, 0))) {
        PyErr_SetString(PyExc_TypeError, "tracked_new(cls, *args, **kwargs)");
        return NULL;
    }
    cls = PyTuple_GET_ITEM(args, 0);
    if (sched_dict == NULL || py_tracked_new == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_track: tracked_new before configure_new");
        return NULL;
    }
    fp = PyDict_GetItemWithError(sched_dict, s_fp);
    if (fp == NULL && PyErr_Occurred())
        return NULL;
    if (fp == NULL || fp == Py_None)          /* object.__new__ itself, with its checks */
        return PyObject_CallOneArg(object_new, cls);
    return PyObject_Call(py_tracked_new, args, kwargs);
}

static PyObject *
configure_new(PyObject *Py_UNUSED(mod), PyObject *fn)
{
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "configure_new: not callable");
        return NULL;
    }
    Py_INCREF(fn);
    Py_XSETREF(py_tracked_new, fn);
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
    plain_unwatched = 1;
    {
        PyObject *plain[4] = {(PyObject *)&PyLong_Type, (PyObject *)&PyUnicode_Type,
                              (PyObject *)&PyBool_Type, (PyObject *)Py_TYPE(Py_None)};

        for (int i = 0; i < 4; i++) {
            int r = PySet_Contains(mut, plain[i]);

            if (r < 0)
                return NULL;
            if (r)
                plain_unwatched = 0;
        }
    }
    Py_INCREF(un);
    Py_XSETREF(unset, un);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"objects_by_task", objects_by_task, METH_O,
     "objects_by_task(steps) -> {tid: objects its steps touch} (explore._shared's part)"},
    {"keep", (PyCFunction)(void (*)(void))keep, METH_FASTCALL,
     "keep(keys, shared) -> the keys whose object is in shared, in order (explore._keep)"},
    {"silent", (PyCFunction)(void (*)(void))silent, METH_FASTCALL,
     "silent(before, writes, reads, mutable, states): the step's writes that left their "
     "value as they found it become reads (explore._silent)"},
    {"races", (PyCFunction)(void (*)(void))races, METH_FASTCALL,
     "races(cands, steps, shared) -> explore._races's list: (decision, task, initials, "
     "every) for each race, in its order (cands[d]: the tasks runnable at decision d)"},
    {"clear_keys", clear_keys, METH_NOARGS,
     "clear_keys(): forget the (id, field) keys made while recording (each run's end)."},
    {"cached_keys", cached_keys, METH_NOARGS,
     "cached_keys() -> the number of (id, field) keys kept for reuse."},
    {"set_sched", set_sched, METH_O,
     "set_sched(sched_dict): where KeyedBase finds the running step."},
    {"tracked_new", (PyCFunction)(void (*)(void))tracked_new, METH_VARARGS | METH_KEYWORDS,
     "tracked_new(cls, *args, **kwargs): a struct class's __new__ once recorded - "
     "object.__new__(cls) off a recording, else slab._tracked_new (configure_new)."},
    {"configure_new", configure_new, METH_O,
     "configure_new(fn): what tracked_new calls while a recording runs."},
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
        intern(&s_tid, "tid") || intern(&s_point, "point") ||
        intern(&s_wakes, "wakes") || intern(&s_joins, "joins") || intern(&s_ends, "ends") ||
        intern(&s_fp, "fp"))
        return NULL;
    object_new = PyObject_GetAttrString((PyObject *)&PyBaseObject_Type, "__new__");
    if (object_new == NULL)
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
