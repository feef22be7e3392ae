/* CPython entry points to maskd's C routines that run on the request path: a ctypes call costs
 * 2-2.5 us on these machines (each argument converted through its ctypes type) and numpy's
 * `.ctypes.data` ~3 us per array; a METH_FASTCALL call 0.2-0.3, reading numpy arrays through the
 * buffer protocol. Built beside the ctypes library where Python's headers are present, with numpy's
 * (grammars/index/native.py extension()); without them the ctypes routines serve. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int64_t pick_f32(float *logits, int64_t n, const int64_t *ids, int64_t k, int allowed, int64_t best);
int64_t merge_ids(const int64_t *ids, int64_t n, const int64_t *on, int64_t k, const int64_t *off, int64_t m,
                  int allowed, int64_t *out);
int64_t set_bits(const uint32_t *words, int64_t n, int64_t *out, int64_t cap);

/* A one-dimensional C-contiguous buffer of items of ``itemsize`` bytes (a numpy array); 0, or -1
 * with an error set (and nothing held). */
static int take(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t itemsize) {
    if (PyObject_GetBuffer(obj, view, PyBUF_ND | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (view->ndim > 1 || view->itemsize != itemsize) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "expected a flat array of %zd-byte items", itemsize);
        return -1;
    }
    return 0;
}

/* The ints of ``obj`` as int64: a flat C-contiguous buffer of 8-byte ints read in place (*owned 0),
 * else (4-byte ints, or any sequence of ints) copied into memory the caller frees (*owned 1). 0, or -1
 * with an error set (nothing held). */
static int int64s(PyObject *obj, int64_t **items, Py_ssize_t *n, Py_buffer *view, int *owned) {
    *owned = 0;
    view->obj = NULL;
    if (PyObject_GetBuffer(obj, view, PyBUF_ND | PyBUF_FORMAT) == 0) {
        const char *format = view->format && view->format[0] ? view->format : "B";
        char kind = format[strlen(format) - 1];  /* after any byte-order mark */
        int integer = strchr("bBhHiIlLqQnN", kind) != NULL;
        if (view->ndim <= 1 && integer && view->itemsize == 8 && strchr("lqn", kind)) {
            *items = view->buf, *n = view->len / 8;
            return 0;
        }
        if (view->ndim <= 1 && integer && view->itemsize == 4 && kind == 'i') {
            const int32_t *from = view->buf;
            *n = view->len / 4;
            *items = malloc((size_t)(*n + 1) * sizeof(int64_t));
            for (Py_ssize_t i = 0; *items && i < *n; i++) (*items)[i] = from[i];
            PyBuffer_Release(view);
            view->obj = NULL;
            *owned = 1;
            return *items ? 0 : (PyErr_NoMemory(), -1);
        }
        PyBuffer_Release(view);
        view->obj = NULL;
    }
    PyErr_Clear();
    PyObject *seq = PySequence_Fast(obj, "expected a flat array or a sequence of ints");
    if (!seq) return -1;
    *n = PySequence_Fast_GET_SIZE(seq);
    *items = malloc((size_t)(*n + 1) * sizeof(int64_t));
    if (!*items) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) {
            free(*items);
            Py_DECREF(seq);
            return -1;
        }
        (*items)[i] = v;
    }
    Py_DECREF(seq);
    *owned = 1;
    return 0;
}

/* pick_rows(base, step, shape, narrowed, tokens) -> None: engine/sampling.py settle()'s loop in one
 * call. base: the address of float32 logits [B, V] (shape, a pair) whose row r starts at base + 4 *
 * step * r, its floats contiguous; narrowed: {row: SparseMask}; tokens: the list of B ids, each
 * narrowed row's replaced by its pick: pick_f32 over the mask's ids (its ``address``, ``size`` and
 * ``allowed``) and the row's own argmax, or the mask's ``single`` where it is >= 0. After a forward
 * pass each Python-level step of that loop (an item, a slot, the address property) cost 1-4 us with
 * the caches cold; here the masks' slots are read in C. */
enum { SINGLE, ALLOWED, SIZE, ADDRESS, ADDRESS_OF, NAMES };
static PyObject *names[NAMES];  /* "single", "allowed", "size", "_address", "address": interned at import */

static long long slot(PyObject *mask, int name) {
    PyObject *got = PyObject_GetAttr(mask, names[name]);
    if (got == Py_None && name == ADDRESS) {  /* not read yet: the property reads it (once per mask) */
        Py_DECREF(got);
        got = PyObject_GetAttr(mask, names[ADDRESS_OF]);
    }
    long long value = -1;
    if (got) value = name == ALLOWED ? PyObject_IsTrue(got) : PyLong_AsLongLong(got);
    Py_XDECREF(got);
    return value;
}

static PyObject *pick_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long base, step, rows, vocab;
    if (nargs != 5 || !PyDict_Check(args[3]) || !PyList_Check(args[4]) || !PyTuple_Check(args[2]) ||
            PyTuple_GET_SIZE(args[2]) != 2) {
        PyErr_SetString(PyExc_TypeError, "pick_rows() takes base, step, (rows, vocab), {row: mask}, tokens");
        return NULL;
    }
    base = PyLong_AsLongLong(args[0]);
    step = PyLong_AsLongLong(args[1]);
    rows = PyLong_AsLongLong(PyTuple_GET_ITEM(args[2], 0));
    vocab = PyLong_AsLongLong(PyTuple_GET_ITEM(args[2], 1));
    if (PyErr_Occurred()) return NULL;
    Py_ssize_t pos = 0;
    PyObject *key, *mask;
    while (PyDict_Next(args[3], &pos, &key, &mask)) {
        Py_ssize_t row = PyLong_AsSsize_t(key);
        if (row == -1 && PyErr_Occurred()) return NULL;
        if (row < 0 || row >= rows || row >= PyList_GET_SIZE(args[4])) {
            PyErr_Format(PyExc_IndexError, "row %zd is not a row of the logits and the tokens", row);
            return NULL;
        }
        long long found = slot(mask, SINGLE), v[4];
        if (found == -1 && PyErr_Occurred()) return NULL;
        if (found < 0) {
            for (int i = 0; i < 4; i++) {  /* allowed, size, address, then the row's own argmax */
                v[i] = i < 3 ? slot(mask, (int[]){ALLOWED, SIZE, ADDRESS}[i])
                             : PyLong_AsLongLong(PyList_GET_ITEM(args[4], row));
                if (v[i] == -1 && PyErr_Occurred()) return NULL;
            }
            found = pick_f32((float *)(intptr_t)(base + 4 * step * row), vocab, (const int64_t *)(intptr_t)v[2],
                             v[1], (int)v[0], v[3]);
        }
        PyObject *token = PyLong_FromLongLong(found);
        if (!token) return NULL;
        PyList_SetItem(args[4], row, token);  /* steals token, drops the old item */
    }
    Py_RETURN_NONE;
}

/* take_ahead(seqs, kind, picker) -> kind() or None: engine/constraint_hook.py ConstraintMasker's call
 * where every constrained row's mask was looked up ahead and the pick may take it as it is. For each
 * constrained seq (its ``constraint`` not None), its ``mask_ahead`` must be (constraint, outputs,
 * tokens_left, SparseMask, a true pick) with that constraint, len(output_ids) and tokens_left as they
 * stand. Where all rows pass: a new ``kind`` (engine/sampling.py Narrowed, a dict) of {row: SparseMask},
 * its ``picker`` set to ``picker`` where it holds a row (else None), and each taken row's mask_ahead
 * set to None. Else None, every mask_ahead left as it was (the Python loop decides each row then).
 * In Python the call took 12-13 us at p50 after a forward pass, its caches cold; 10.6-10.9 with this. */
enum { CONSTRAINT, MASK_AHEAD, OUTPUT_IDS, TOKENS_LEFT, PICKER, SEQ_NAMES };
static PyObject *seq_names[SEQ_NAMES];  /* "constraint", "mask_ahead", "output_ids", "tokens_left", "picker" */

/* 1 where seq's ahead holds for the row (narrowed[row] set), 0 where it is unconstrained, 2 where the
 * ahead does not hold, -1 with an error set. */
static int took(PyObject *seq, Py_ssize_t row, PyObject *narrowed) {
    PyObject *constraint = PyObject_GetAttr(seq, seq_names[CONSTRAINT]), *ahead = NULL, *got = NULL, *key;
    int result = 2;
    if (!constraint) return -1;
    if (constraint == Py_None) {
        Py_DECREF(constraint);
        return 0;
    }
    if (!(ahead = PyObject_GetAttr(seq, seq_names[MASK_AHEAD]))) {
        result = PyErr_ExceptionMatches(PyExc_AttributeError) ? 2 : -1;  /* none: as getattr(seq, "mask_ahead", None) */
    } else if (PyTuple_Check(ahead) && PyTuple_GET_SIZE(ahead) == 5 && PyTuple_GET_ITEM(ahead, 0) == constraint &&
               PyTuple_GET_ITEM(ahead, 3) != Py_None && PyObject_IsTrue(PyTuple_GET_ITEM(ahead, 4)) == 1) {
        Py_ssize_t outputs = (got = PyObject_GetAttr(seq, seq_names[OUTPUT_IDS])) ? PyObject_Length(got) : -1;
        Py_XDECREF(got);
        if (outputs < 0) {
            result = -1;
        } else if (outputs == PyLong_AsSsize_t(PyTuple_GET_ITEM(ahead, 1))) {
            int same = (got = PyObject_GetAttr(seq, seq_names[TOKENS_LEFT]))
                       ? PyObject_RichCompareBool(got, PyTuple_GET_ITEM(ahead, 2), Py_EQ) : -1;
            Py_XDECREF(got);
            if (same == 1) {
                result = (key = PyLong_FromSsize_t(row)) && PyDict_SetItem(narrowed, key, PyTuple_GET_ITEM(ahead, 3)) == 0
                         ? 1 : -1;
                Py_XDECREF(key);
            } else if (same < 0) {
                result = -1;
            }
        }
    }
    if (result == 2) PyErr_Clear();  /* e.g. an outputs count that is not an int: the Python loop decides */
    Py_XDECREF(ahead);
    Py_DECREF(constraint);
    return result;
}

static PyObject *take_ahead(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_Check(args[0]) || !PyType_Check(args[1]) ||
            !PyType_IsSubtype((PyTypeObject *)args[1], &PyDict_Type)) {
        PyErr_SetString(PyExc_TypeError, "take_ahead() takes a list of seqs, a dict type and a picker");
        return NULL;
    }
    PyObject *seqs = args[0], *narrowed = PyObject_CallNoArgs(args[1]);
    if (!narrowed) return NULL;
    for (Py_ssize_t row = 0; row < PyList_GET_SIZE(seqs); row++) {
        PyObject *seq = PyList_GET_ITEM(seqs, row);
        Py_INCREF(seq);  /* held while its attributes are read */
        int result = took(seq, row, narrowed);
        Py_DECREF(seq);
        if (result < 0 || result == 2) {
            Py_DECREF(narrowed);
            if (result < 0) return NULL;
            Py_RETURN_NONE;
        }
    }
    Py_ssize_t pos = 0;
    PyObject *key, *mask;
    while (PyDict_Next(narrowed, &pos, &key, &mask))
        if (PyObject_SetAttr(PyList_GET_ITEM(seqs, PyLong_AsSsize_t(key)), seq_names[MASK_AHEAD], Py_None) < 0) {
            Py_DECREF(narrowed);
            return NULL;
        }
    if (PyObject_SetAttr(narrowed, seq_names[PICKER], PyDict_GET_SIZE(narrowed) ? args[2] : Py_None) < 0) {
        Py_DECREF(narrowed);
        return NULL;
    }
    return narrowed;
}

static void release(int64_t *items, Py_buffer *view, int owned) {
    if (owned) free(items);
    else if (view->obj) PyBuffer_Release(view);
}

/* A flat int64 ndarray over a bytearray's items (whose reference it takes): its base a memoryview that
 * holds the bytearray's buffer, so the bytearray cannot be resized under it. */
static PyObject *as_array(PyObject *bytes) {
    PyObject *view = PyMemoryView_FromObject(bytes);
    Py_DECREF(bytes);  /* the view holds it */
    if (!view) return NULL;
    Py_buffer *buffer = PyMemoryView_GET_BUFFER(view);
    npy_intp n = buffer->len / 8;
    PyObject *array = PyArray_SimpleNewFromData(1, &n, NPY_INT64, buffer->buf);
    if (!array || PyArray_SetBaseObject((PyArrayObject *)array, view) < 0) {  /* steals view, even on failure */
        Py_XDECREF(array);
        if (!array) Py_DECREF(view);
        return NULL;
    }
    return array;
}

/* merged(ids, allowed, on, off) -> int64 ndarray: merge_ids's result in one call, its inputs read as
 * they come (int64 or int32 arrays, or sequences of ints; on and off in any order). A state's first
 * narrowed visit merged through ~8 numpy calls around merge (conversions, a sort, the output and its
 * slice), each several us with the caches cold after a forward pass; the result is made an array
 * here too (``as_array``): np.frombuffer over it took ~10 us there. */
static PyObject *merged(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t *items[3] = {NULL, NULL, NULL};
    Py_ssize_t n[3];
    Py_buffer views[3];
    int owned[3], taken = 0, allowed;
    PyObject *out = NULL;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "merged() takes ids, allowed, on, off");
        return NULL;
    }
    allowed = PyObject_IsTrue(args[1]);
    PyObject *inputs[3] = {args[0], args[2], args[3]};
    for (; taken < 3 && allowed >= 0; taken++)
        if (int64s(inputs[taken], &items[taken], &n[taken], &views[taken], &owned[taken]) < 0) break;
    if (taken == 3) {
        out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)((n[0] + n[1] + n[2]) * 8));
        int64_t count = out ? merge_ids(items[0], n[0], items[1], n[1], items[2], n[2], allowed,
                                        (int64_t *)PyByteArray_AS_STRING(out)) : -1;
        if (out && count < 0) {
            Py_CLEAR(out);
            PyErr_NoMemory();
        } else if (out && PyByteArray_Resize(out, (Py_ssize_t)(count * 8)) < 0) {
            Py_CLEAR(out);
        }
    }
    for (int i = 0; i < taken; i++) release(items[i], &views[i], owned[i]);
    return out ? as_array(out) : NULL;
}

/* bits(words, out) -> int: set_bits (grammars/index/_set_bits.c) of uint32 words into int64 out. */
static PyObject *bits(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer words, out;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "bits() takes words, out");
        return NULL;
    }
    if (take(args[0], &words, 0, 4) < 0) return NULL;
    if (take(args[1], &out, 1, 8) < 0) {
        PyBuffer_Release(&words);
        return NULL;
    }
    int64_t n = set_bits(words.buf, words.len / 4, out.buf, out.len / 8);
    PyBuffer_Release(&words);
    PyBuffer_Release(&out);
    return PyLong_FromLongLong(n);
}

/* address(array) -> int: where a flat int64 array's items lie (the array must outlive its use). */
static PyObject *address(PyObject *self, PyObject *array) {
    Py_buffer view;
    if (take(array, &view, 0, 8) < 0) return NULL;
    PyObject *at = PyLong_FromVoidPtr(view.buf);
    PyBuffer_Release(&view);
    return at;
}

static PyMethodDef methods[] = {
    {"pick_rows", (PyCFunction)(void (*)(void))pick_rows, METH_FASTCALL, "settle()'s picks of narrowed rows"},
    {"take_ahead", (PyCFunction)(void (*)(void))take_ahead, METH_FASTCALL, "the masker's rows looked up ahead"},
    {"merged", (PyCFunction)(void (*)(void))merged, METH_FASTCALL, "merge_ids (grammars/index/_merge_ids.c) into a new int64 array"},
    {"bits", (PyCFunction)(void (*)(void))bits, METH_FASTCALL, "set_bits (grammars/index/_set_bits.c)"},
    {"address", address, METH_O, "where a flat int64 array's items lie"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_maskd_fast_calls", NULL, -1, methods};

PyMODINIT_FUNC PyInit__maskd_fast_calls(void) {
    import_array();  /* numpy's C API (as_array); returns NULL with ImportError where numpy is missing */
    const char *text[NAMES] = {"single", "allowed", "size", "_address", "address"};
    for (int i = 0; i < NAMES; i++)
        if (!(names[i] = PyUnicode_InternFromString(text[i]))) return NULL;
    const char *seq_text[SEQ_NAMES] = {"constraint", "mask_ahead", "output_ids", "tokens_left", "picker"};
    for (int i = 0; i < SEQ_NAMES; i++)
        if (!(seq_names[i] = PyUnicode_InternFromString(seq_text[i]))) return NULL;
    return PyModule_Create(&module);
}
