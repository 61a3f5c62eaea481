/* The per-record loops of the record-batch path, in C (commitlog/speedups.py loads this module).

Each function here has a pure-Python twin that stays the reference: commitlog/batch.py
(check_batch, walk, encode_batch), commitlog/append.py (the stamping loop of append_encoded) and
commitlog/replication.py (the slave's record checks and its consume-queue runs). A function here
either returns exactly what its twin returns or returns None, and then the caller runs the twin,
which raises the typed error with its message: the C code never decides what an error says, so
the two paths cannot disagree on one. tests/commitlog/test_speedups.py checks every function
against its twin with Hypothesis, on valid and damaged input alike.

Records are the commit log's format (commitlog/FORMAT.md): a 64-byte big-endian header, then
topic, properties and body; the CRC32C covers every byte after the crc field. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HEADER_SIZE 64
#define BLANK_SIZE 8
#define MAGIC 0x7DE10601u
#define BLANK_MAGIC 0xB1A44B00u
#define MAX_PROPERTIES_BYTES (32 * 1024)

/* ---- CRC32C (Castagnoli), the function the crc32c package computes ---------------------- */

static uint32_t crc_table[8][256];
static int have_sse42 = 0;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t crc_soft(uint32_t crc, const unsigned char *p, size_t n) {
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^ crc_table[5][(lo >> 16) & 0xFF] ^
              crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]] ^
              crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p, size_t n) {
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}
#endif

/* CRC32C of p[0..n) continued from `value`, the CRC32C of what came before (0 for nothing). */
static uint32_t crc32c_from(uint32_t value, const unsigned char *p, size_t n) {
    uint32_t crc = ~value;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (have_sse42) return ~crc_hw(crc, p, n);
#endif
    return ~crc_soft(crc, p, n);
}

static uint32_t crc32c(const unsigned char *p, size_t n) { return crc32c_from(0, p, n); }

/* ---- big-endian fields ------------------------------------------------------------------ */

static inline uint32_t be16(const unsigned char *p) { return (uint32_t)p[0] << 8 | p[1]; }
static inline uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline uint64_t be64(const unsigned char *p) { return (uint64_t)be32(p) << 32 | be32(p + 4); }
static inline void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}
static inline void put64(unsigned char *p, uint64_t v) {
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

/* The tags hash of a properties block (record.tags_hash of its TAGS, the last one as a dict keeps
   it), or -1 when the block is malformed: cut short, or a name or value that is not UTF-8. */
static int64_t tag_of(const unsigned char *p, size_t plen) {
    const unsigned char *end = p + plen;
    const unsigned char *tags = NULL;
    size_t tags_len = 0;
    while (p < end) {
        if ((size_t)(end - p) < 2) return -1;
        size_t nlen = be16(p);
        p += 2;
        if ((size_t)(end - p) < nlen) return -1;
        const unsigned char *name = p;
        p += nlen;
        if ((size_t)(end - p) < 4) return -1;
        size_t vlen = be32(p);
        p += 4;
        if ((size_t)(end - p) < vlen) return -1;
        PyObject *s = PyUnicode_DecodeUTF8((const char *)name, (Py_ssize_t)nlen, "strict");
        if (s == NULL) {
            PyErr_Clear();
            return -1;
        }
        Py_DECREF(s);
        s = PyUnicode_DecodeUTF8((const char *)p, (Py_ssize_t)vlen, "strict");
        if (s == NULL) {
            PyErr_Clear();
            return -1;
        }
        Py_DECREF(s);
        if (nlen == 4 && memcmp(name, "TAGS", 4) == 0) {
            tags = p;
            tags_len = vlen;
        }
        p += vlen;
    }
    if (tags == NULL || tags_len == 0) return 0;
    uint32_t h = crc32c(tags, tags_len);
    return h ? (int64_t)h : 1;
}

static int append_new(PyObject *list, PyObject *item) {
    if (item == NULL) return -1;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

/* ---- check_batch ------------------------------------------------------------------------ */

static PyObject *check_batch(PyObject *self, PyObject *args) {
    Py_buffer data, topic;
    unsigned long queue_id;
    Py_ssize_t count;
    unsigned long long max_record;
    if (!PyArg_ParseTuple(args, "y*y*knK", &data, &topic, &queue_id, &count, &max_record)) return NULL;
    const unsigned char *d = data.buf;
    size_t n = (size_t)data.len, pos = 0, tlen_want = (size_t)topic.len;
    PyObject *out = PyList_New(0);
    if (out == NULL) goto done;
    while (pos < n) {
        if (n - pos < HEADER_SIZE) goto refuse;
        const unsigned char *r = d + pos;
        uint64_t size = be32(r), tlen = be16(r + 14), plen = be32(r + 56), blen = be32(r + 60);
        if (be32(r + 4) != MAGIC || be16(r + 12) != 0 || tlen != tlen_want || be32(r + 16) != queue_id) goto refuse;
        if (HEADER_SIZE + tlen + plen + blen != size || size > n - pos || size > max_record) goto refuse;
        if (memcmp(r + HEADER_SIZE, topic.buf, tlen) != 0) goto refuse;
        int64_t tag = 0;
        if (plen) {
            if (plen > MAX_PROPERTIES_BYTES) goto refuse;
            tag = tag_of(r + HEADER_SIZE + tlen, plen);
            if (tag < 0) goto refuse;
        }
        if (append_new(out, Py_BuildValue("(nKLK)", (Py_ssize_t)pos, (unsigned long long)size, (long long)tag,
                                          (unsigned long long)be64(r + 40))) < 0) {
            Py_CLEAR(out);
            goto done;
        }
        pos += size;
    }
    if (PyList_GET_SIZE(out) == count) goto done;
refuse:
    Py_DECREF(out);
    out = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&topic);
    return out;
}

/* ---- stamp_batch: the loop of append.append_encoded ------------------------------------- */

static PyObject *stamp_batch(PyObject *self, PyObject *args) {
    Py_buffer buf;
    PyObject *records;
    unsigned long queue_id, epoch;
    unsigned long long qoff, pos, seg_bytes, store_ts;
    if (!PyArg_ParseTuple(args, "w*OkkKKKK", &buf, &records, &queue_id, &epoch, &qoff, &pos, &seg_bytes,
                          &store_ts))
        return NULL;
    PyObject *fast = NULL, *phys = NULL, *sizes = NULL, *tags = NULL, *rolls = NULL, *result = NULL;
    if (seg_bytes <= BLANK_SIZE) {
        PyErr_SetString(PyExc_ValueError, "segment size too small");
        goto done;
    }
    fast = PySequence_Fast(records, "records must be a sequence");
    if (fast == NULL) goto done;
    phys = PyList_New(0);
    sizes = PyList_New(0);
    tags = PyList_New(0);
    rolls = PyList_New(0);
    if (!phys || !sizes || !tags || !rolls) goto done;
    unsigned char *b = buf.buf;
    uint64_t room = seg_bytes - BLANK_SIZE, seg_base = pos - pos % seg_bytes;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(fast);
    for (Py_ssize_t i = 0; i < m; i++) {
        Py_ssize_t at;
        unsigned long long size, tag, born;
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 4) {
            PyErr_SetString(PyExc_TypeError, "a checked record is (pos, size, tag, born)");
            goto done;
        }
        at = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 0));
        size = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 1));
        tag = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 2));
        born = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 3));
        if (PyErr_Occurred()) goto done;
        if (at < 0 || size < HEADER_SIZE || size > (unsigned long long)(buf.len - at)) {
            PyErr_SetString(PyExc_ValueError, "a checked record lies outside the batch");
            goto done;
        }
        if (pos - seg_base + size > room) {
            if (append_new(rolls, Py_BuildValue("(nKK)", at, seg_base, seg_bytes - (pos - seg_base))) < 0) goto done;
            pos = seg_base = seg_base + seg_bytes;
        }
        unsigned char *r = b + at;
        put32(r + 16, (uint32_t)queue_id);
        put32(r + 20, (uint32_t)epoch);
        put64(r + 24, qoff);
        put64(r + 32, pos);
        put64(r + 40, born ? born : store_ts);
        put64(r + 48, store_ts);
        put32(r, (uint32_t)size);
        put32(r + 4, MAGIC);
        put32(r + 8, crc32c(r + 12, size - 12));
        if (append_new(phys, PyLong_FromUnsignedLongLong(pos)) < 0 ||
            append_new(sizes, PyLong_FromUnsignedLongLong(size)) < 0 ||
            append_new(tags, PyLong_FromUnsignedLongLong(tag)) < 0)
            goto done;
        qoff += 1;
        pos += size;
    }
    result = Py_BuildValue("(OOOOK)", phys, sizes, tags, rolls, pos);
done:
    Py_XDECREF(fast);
    Py_XDECREF(phys);
    Py_XDECREF(sizes);
    Py_XDECREF(tags);
    Py_XDECREF(rolls);
    PyBuffer_Release(&buf);
    return result;
}

/* ---- split_raw: replication._split and the runs replication._index puts in queues -------- */

/* A run: records that continue one (topic, queue) at consecutive queue offsets. */
typedef struct {
    size_t topic_at, tlen;
    uint32_t qid;
    uint64_t first, next;
    PyObject *phys, *sizes, *tags;
} Run;

static PyObject *close_run(Run *run, const unsigned char *d) {
    PyObject *t = PyBytes_FromStringAndSize((const char *)d + run->topic_at, (Py_ssize_t)run->tlen);
    if (t == NULL) return NULL;
    PyObject *out = Py_BuildValue("(NkKOOO)", t, (unsigned long)run->qid, (unsigned long long)run->first,
                                  run->phys, run->sizes, run->tags);
    Py_CLEAR(run->phys);
    Py_CLEAR(run->sizes);
    Py_CLEAR(run->tags);
    return out;
}

static PyObject *split_raw(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned long long at, seg_bytes;
    if (!PyArg_ParseTuple(args, "y*KK", &data, &at, &seg_bytes)) return NULL;
    const unsigned char *d = data.buf;
    size_t n = (size_t)data.len, pos = 0, span_from = 0;
    uint64_t span_at = at;
    Run run = {0};
    int in_run = 0;
    PyObject *spans = PyList_New(0), *runs = PyList_New(0), *result = NULL;
    if (spans == NULL || runs == NULL || seg_bytes <= BLANK_SIZE) goto fail;
    while (pos < n) {
        uint64_t in_seg = at % seg_bytes;
        uint32_t size = 0, magic = 0;
        if (n - pos >= 8) {
            size = be32(d + pos);
            magic = be32(d + pos + 4);
        }
        if (magic == BLANK_MAGIC) {
            if (size != seg_bytes - in_seg) goto refuse;
            pos += BLANK_SIZE;
            if (append_new(spans, Py_BuildValue("(KKnnO)", at - in_seg, span_at, (Py_ssize_t)span_from,
                                                (Py_ssize_t)pos, Py_True)) < 0)
                goto fail;
            at = at - in_seg + seg_bytes;
            span_from = pos;
            span_at = at;
            continue;
        }
        if (magic != MAGIC || size < HEADER_SIZE || size > n - pos) goto refuse;
        const unsigned char *r = d + pos;
        uint64_t tlen = be16(r + 14), plen = be32(r + 56), blen = be32(r + 60);
        if (HEADER_SIZE + tlen + plen + blen != size || crc32c(r + 12, size - 12) != be32(r + 8)) goto refuse;
        if (be64(r + 32) != at || in_seg + size + BLANK_SIZE > seg_bytes) goto refuse;
        uint32_t qid = be32(r + 16);
        uint64_t qoff = be64(r + 24);
        int64_t tag = plen ? tag_of(r + HEADER_SIZE + tlen, plen) : 0;
        if (tag < 0) goto refuse;
        if (in_run && !(qid == run.qid && qoff == run.next && tlen == run.tlen &&
                        memcmp(d + run.topic_at, r + HEADER_SIZE, tlen) == 0)) {
            if (append_new(runs, close_run(&run, d)) < 0) goto fail;
            in_run = 0;
        }
        if (!in_run) {
            run.topic_at = pos + HEADER_SIZE;
            run.tlen = tlen;
            run.qid = qid;
            run.first = run.next = qoff;
            run.phys = PyList_New(0);
            run.sizes = PyList_New(0);
            run.tags = PyList_New(0);
            in_run = 1;
            if (!run.phys || !run.sizes || !run.tags) goto fail;
        }
        if (append_new(run.phys, PyLong_FromUnsignedLongLong(at)) < 0 ||
            append_new(run.sizes, PyLong_FromUnsignedLong(size)) < 0 ||
            append_new(run.tags, PyLong_FromLongLong(tag)) < 0)
            goto fail;
        run.next = qoff + 1;
        pos += size;
        at += size;
    }
    if (in_run) {
        if (append_new(runs, close_run(&run, d)) < 0) goto fail;
        in_run = 0;
    }
    if (span_from < n &&
        append_new(spans, Py_BuildValue("(KKnnO)", span_at - span_at % seg_bytes, span_at, (Py_ssize_t)span_from,
                                        (Py_ssize_t)n, Py_False)) < 0)
        goto fail;
    result = Py_BuildValue("(OOK)", spans, runs, at);
    goto fail; /* release what is held; result is set */
refuse:
    result = Py_NewRef(Py_None);
fail:
    Py_XDECREF(run.phys);
    Py_XDECREF(run.sizes);
    Py_XDECREF(run.tags);
    Py_XDECREF(spans);
    Py_XDECREF(runs);
    PyBuffer_Release(&data);
    return result;
}

/* ---- walk: batch.walk ------------------------------------------------------------------- */

static PyObject *walk(PyObject *self, PyObject *args) {
    Py_buffer data;
    int verify_crc;
    if (!PyArg_ParseTuple(args, "y*p", &data, &verify_crc)) return NULL;
    const unsigned char *d = data.buf;
    size_t n = (size_t)data.len, pos = 0;
    PyObject *starts = PyList_New(0);
    if (starts == NULL) goto done;
    while (pos < n) {
        if (n - pos < HEADER_SIZE) goto refuse;
        uint32_t size = be32(d + pos);
        if (be32(d + pos + 4) != MAGIC || size < HEADER_SIZE || size > n - pos) goto refuse;
        if (verify_crc && crc32c(d + pos + 12, size - 12) != be32(d + pos + 8)) goto refuse;
        if (append_new(starts, PyLong_FromSize_t(pos)) < 0) {
            Py_CLEAR(starts);
            goto done;
        }
        pos += size;
    }
    goto done;
refuse:
    Py_DECREF(starts);
    starts = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&data);
    return starts;
}

/* ---- encode_batch: batch.encode_batch --------------------------------------------------- */

/* body, key, tags, properties of one outgoing message (new references), from a 4-tuple such as
   the client's OutMessage or from attributes. */
static PyTypeObject *message_tuple_type = NULL; /* a named tuple known to be (body, key, tags, properties) */

/* Whether `m` is a named tuple whose fields are exactly (body, key, tags, properties), such as the
   client's OutMessage: its items are then its attributes. */
static int is_message_tuple(PyObject *m) {
    if (Py_TYPE(m) == message_tuple_type) return 1;
    if (!PyTuple_Check(m) || PyTuple_CheckExact(m) || PyTuple_GET_SIZE(m) != 4) return 0;
    PyObject *fields = PyObject_GetAttrString((PyObject *)Py_TYPE(m), "_fields");
    if (fields == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *want = Py_BuildValue("(ssss)", "body", "key", "tags", "properties");
    int same = want != NULL && PyObject_RichCompareBool(fields, want, Py_EQ) == 1;
    Py_XDECREF(want);
    Py_DECREF(fields);
    PyErr_Clear();
    if (same) Py_XSETREF(message_tuple_type, (PyTypeObject *)Py_NewRef((PyObject *)Py_TYPE(m)));
    return same;
}

static int message_fields(PyObject *m, PyObject **f) {
    static const char *names[4] = {"body", "key", "tags", "properties"};
    if (is_message_tuple(m)) {
        for (int i = 0; i < 4; i++) f[i] = Py_NewRef(PyTuple_GET_ITEM(m, i));
        return 0;
    }
    for (int i = 0; i < 4; i++) {
        f[i] = PyObject_GetAttrString(m, names[i]);
        if (f[i] == NULL) {
            for (int k = 0; k < i; k++) Py_CLEAR(f[k]);
            return -1;
        }
    }
    return 0;
}

/* One message's body and encoded properties (None without any), new references in `pair`;
   -1 where the Python encoder would decide (not bytes, bad properties, a size out of range). */
static int message_parts(PyObject *m, PyObject *encode_props, size_t fixed, PyObject **pair, size_t *size) {
    PyObject *f[4];
    if (message_fields(m, f) < 0) {
        PyErr_Clear();
        return -1;
    }
    PyObject *p = NULL;
    int has_props = !PyBytes_CheckExact(f[0]) ? -1 : f[3] != Py_None ? PyObject_IsTrue(f[3]) : 0;
    if (has_props == 0 && f[1] == Py_None && f[2] == Py_None) p = Py_NewRef(Py_None);
    else if (has_props >= 0) p = PyObject_CallFunctionObjArgs(encode_props, f[1], f[2], f[3], NULL);
    int ok = p != NULL && (p == Py_None || PyBytes_CheckExact(p));
    size_t blen = ok ? (size_t)PyBytes_GET_SIZE(f[0]) : 0;
    size_t plen = ok && p != Py_None ? (size_t)PyBytes_GET_SIZE(p) : 0;
    ok = ok && fixed + plen + blen <= 0xFFFFFFFFu;
    pair[0] = Py_NewRef(f[0]);
    pair[1] = p;
    for (int k = 0; k < 4; k++) Py_DECREF(f[k]);
    if (!ok) {
        Py_CLEAR(pair[0]);
        Py_CLEAR(pair[1]);
        PyErr_Clear();
        return -1;
    }
    *size = fixed + plen + blen;
    return 0;
}

static PyObject *encode_batch(PyObject *self, PyObject *args) {
    Py_buffer topic;
    unsigned long queue_id;
    PyObject *messages, *encode_props;
    long long born;
    if (!PyArg_ParseTuple(args, "y*kOLO", &topic, &queue_id, &messages, &born, &encode_props)) return NULL;
    PyObject *fast = NULL, *parts = NULL, *out = NULL;
    size_t total = 0, tlen = (size_t)topic.len;
    if (born < 0 || tlen > 0xFFFF || queue_id > 0xFFFFFFFFul) goto refuse;
    fast = PySequence_Fast(messages, "messages must be a sequence");
    if (fast == NULL) goto done;
    Py_ssize_t m_count = PySequence_Fast_GET_SIZE(fast);
    parts = PyList_New(2 * m_count); /* body, encoded properties (or None), per message */
    if (parts == NULL) goto done;
    for (Py_ssize_t i = 0; i < m_count; i++) {
        PyObject *pair[2];
        size_t size;
        if (message_parts(PySequence_Fast_GET_ITEM(fast, i), encode_props, HEADER_SIZE + tlen, pair, &size) < 0)
            goto refuse;
        PyList_SET_ITEM(parts, 2 * i, pair[0]);
        PyList_SET_ITEM(parts, 2 * i + 1, pair[1]);
        total += size;
    }
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out == NULL) goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < m_count; i++) {
        PyObject *body = PyList_GET_ITEM(parts, 2 * i), *p = PyList_GET_ITEM(parts, 2 * i + 1);
        size_t plen = p == Py_None ? 0 : (size_t)PyBytes_GET_SIZE(p), blen = (size_t)PyBytes_GET_SIZE(body);
        memset(w, 0, HEADER_SIZE);
        put32(w, (uint32_t)(HEADER_SIZE + tlen + plen + blen));
        put32(w + 4, MAGIC);
        w[14] = (unsigned char)(tlen >> 8);
        w[15] = (unsigned char)tlen;
        put32(w + 16, (uint32_t)queue_id);
        put64(w + 40, (uint64_t)born);
        put32(w + 56, (uint32_t)plen);
        put32(w + 60, (uint32_t)blen);
        w += HEADER_SIZE;
        memcpy(w, topic.buf, tlen);
        w += tlen;
        if (plen) memcpy(w, PyBytes_AS_STRING(p), plen);
        w += plen;
        memcpy(w, PyBytes_AS_STRING(body), blen);
        w += blen;
    }
    goto done;
refuse:
    Py_XSETREF(out, Py_NewRef(Py_None));
done:
    Py_XDECREF(fast);
    Py_XDECREF(parts);
    PyBuffer_Release(&topic);
    return out;
}

/* Buffers from this size up are checksummed with the interpreter lock released, so that other
   threads (the flusher, the event loop) go on meanwhile, as the crc32c package lets them. */
#define CRC_NOGIL_BYTES (32 * 1024)

static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    Py_buffer data;
    PyObject *start = NULL;
    unsigned long value = 0;
    if (!PyArg_ParseTuple(args, "y*|O!:crc32c", &data, &PyLong_Type, &start)) return NULL;
    if (start != NULL) {
        value = PyLong_AsUnsignedLong(start); /* OverflowError for a negative or too large value */
        if ((value == (unsigned long)-1 && PyErr_Occurred()) || value > 0xFFFFFFFFul) {
            PyBuffer_Release(&data);
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "crc32c: the running value must be a CRC32C, in [0, 2**32)");
            return NULL;
        }
    }
    uint32_t c;
    if (data.len >= CRC_NOGIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        c = crc32c_from((uint32_t)value, data.buf, (size_t)data.len);
        Py_END_ALLOW_THREADS
    } else {
        c = crc32c_from((uint32_t)value, data.buf, (size_t)data.len);
    }
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef methods[] = {
    {"check_batch", check_batch, METH_VARARGS, "batch.check_batch, or None where it would raise"},
    {"stamp_batch", stamp_batch, METH_VARARGS, "the stamping loop of append.append_encoded"},
    {"split_raw", split_raw, METH_VARARGS, "replication's record checks and queue runs, or None"},
    {"walk", walk, METH_VARARGS, "batch.walk's record starts, or None where it would raise"},
    {"encode_batch", encode_batch, METH_VARARGS, "batch.encode_batch, or None where it would raise"},
    {"crc32c", py_crc32c, METH_VARARGS, "crc32c(data, value=0): CRC32C of data, continued from value"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__speedups(void) {
    crc_init();
    return PyModule_Create(&module);
}
