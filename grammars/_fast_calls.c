/* CPython entry points to maskd's C routines that run on the request path: a ctypes call costs
 * 2-2.5 us on these machines (each argument converted through its ctypes type) and numpy's
 * `.ctypes.data` ~3 us per array; a METH_FASTCALL call 0.2-0.3, reading numpy arrays through the
 * buffer protocol. Built beside the ctypes library where Python's headers are present
 * (grammars/native.py extension()); without them the ctypes routines serve. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

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

/* pick(logits address, n, ids address, k, allowed, best) -> int: pick_f32 (grammars/_mask_row.c). */
static PyObject *pick(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long v[6];
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "pick() takes 6 integers");
        return NULL;
    }
    for (int i = 0; i < 6; i++) {
        v[i] = PyLong_AsLongLong(args[i]);
        if (v[i] == -1 && PyErr_Occurred()) return NULL;
    }
    return PyLong_FromLongLong(pick_f32((float *)(intptr_t)v[0], v[1], (const int64_t *)(intptr_t)v[2],
                                        v[3], (int)v[4], v[5]));
}

/* merge(ids, on, off, allowed, out) -> int: merge_ids (grammars/_merge_ids.c) over int64 arrays; out
 * holds at least len(ids) + len(on) + len(off). */
static PyObject *merge(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer v[4];
    int taken = 0;
    int64_t n = -1;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "merge() takes ids, on, off, allowed, out");
        return NULL;
    }
    int allowed = PyObject_IsTrue(args[3]);
    PyObject *arrays[4] = {args[0], args[1], args[2], args[4]};
    for (; taken < 4 && allowed >= 0; taken++)
        if (take(arrays[taken], &v[taken], taken == 3, 8) < 0) break;
    if (taken == 4) {
        Py_ssize_t a = v[0].len / 8, b = v[1].len / 8, c = v[2].len / 8;
        if (v[3].len / 8 < a + b + c)
            PyErr_SetString(PyExc_ValueError, "merge(): out is shorter than its three inputs");
        else
            n = merge_ids(v[0].buf, a, v[1].buf, b, v[2].buf, c, allowed, v[3].buf);
    }
    for (int i = 0; i < taken; i++) PyBuffer_Release(&v[i]);
    return PyErr_Occurred() ? NULL : PyLong_FromLongLong(n);
}

/* bits(words, out) -> int: set_bits (grammars/_set_bits.c) of uint32 words into int64 out. */
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
    {"pick", (PyCFunction)(void (*)(void))pick, METH_FASTCALL, "pick_f32 (grammars/_mask_row.c)"},
    {"merge", (PyCFunction)(void (*)(void))merge, METH_FASTCALL, "merge_ids (grammars/_merge_ids.c)"},
    {"bits", (PyCFunction)(void (*)(void))bits, METH_FASTCALL, "set_bits (grammars/_set_bits.c)"},
    {"address", address, METH_O, "where a flat int64 array's items lie"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_maskd_fast_calls", NULL, -1, methods};

PyMODINIT_FUNC PyInit__maskd_fast_calls(void) { return PyModule_Create(&module); }
