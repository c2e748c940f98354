# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""A batch's answer, serialized in one pass over its pairs, and the stream's message around it.

A streamed tick's answer is a `BatchResult`: the tick, the pairs that began and ended, the sensor
events and the seconds the broadphase took, each column narrowed to 32-bit ids when the request allows it and every id of the four fits
(the rule of `dbvt_server.worlds.id_columns`). Made with numpy and `dbvt_client.serialized`, that is
four reductions, four casts and a join: about 200 us a tick once the caches have gone cold between
ticks, against the core's few ms. Here it is one call: the ids are scanned once for their width and
copied once, straight into the bytes that go on the wire.

The bytes are exactly what `pb.BatchResult(...).SerializeToString()` writes (fields in number
order, proto3 defaults left out); tests/test_result_bytes.py holds it to that.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

# BatchResult's fields: number << 3 | wire type (0 varint, 1 fixed 64 bits, 2 length-delimited).
cdef enum:
    TICK_KEY = 1 << 3
    BEGUN_KEY = 2 << 3 | 2
    ENDED_KEY = 3 << 3 | 2
    INCARNATION_KEY = 4 << 3
    ENTERED_KEY = 5 << 3 | 2
    LEFT_KEY = 6 << 3 | 2
    NARROW_IDS_KEY = 7 << 3
    WORLD_SECONDS_KEY = 8 << 3 | 1

# The largest id a narrowed column holds.
cdef uint64_t NARROW_MAX = 0xFFFFFFFF


cdef inline Py_ssize_t varint_size(uint64_t value) noexcept nogil:
    cdef Py_ssize_t size = 1
    while value > 0x7F:
        value >>= 7
        size += 1
    return size


cdef inline uint8_t *put_varint(uint8_t *out, uint64_t value) noexcept nogil:
    while value > 0x7F:
        out[0] = <uint8_t>((value & 0x7F) | 0x80)
        out += 1
        value >>= 7
    out[0] = <uint8_t>value
    return out + 1


cdef bint fits_narrow(const uint64_t[:, ::1] rows) noexcept nogil:
    cdef Py_ssize_t i, n = rows.shape[0] * rows.shape[1]
    cdef const uint64_t *ids = &rows[0, 0] if n else NULL
    cdef uint64_t widest = 0
    for i in range(n):
        widest |= ids[i]
    return widest <= NARROW_MAX


cdef inline Py_ssize_t column_size(Py_ssize_t count, bint narrow) noexcept nogil:
    """The bytes of a column field of `count` ids: its key, its length and the ids (none when empty)."""
    cdef Py_ssize_t data = count * (4 if narrow else 8)
    return 1 + varint_size(data) + data if count else 0


cdef uint8_t *put_column(uint8_t *out, uint8_t key, const uint64_t[:, ::1] rows, bint narrow) noexcept nogil:
    cdef Py_ssize_t i, n = rows.shape[0] * rows.shape[1]
    cdef const uint64_t *ids
    cdef uint32_t narrowed
    cdef uint64_t wide
    cdef Py_ssize_t width = 4 if narrow else 8
    if n == 0:
        return out
    ids = &rows[0, 0]
    out[0] = key
    out = put_varint(out + 1, n * width)
    # Byte by byte, least significant first: the wire's little-endian whatever this machine's order.
    for i in range(n):
        if narrow:
            narrowed = <uint32_t>ids[i]
            out[0] = narrowed & 0xFF
            out[1] = (narrowed >> 8) & 0xFF
            out[2] = (narrowed >> 16) & 0xFF
            out[3] = narrowed >> 24
        else:
            wide = ids[i]
            out[0] = wide & 0xFF
            out[1] = (wide >> 8) & 0xFF
            out[2] = (wide >> 16) & 0xFF
            out[3] = (wide >> 24) & 0xFF
            out[4] = (wide >> 32) & 0xFF
            out[5] = (wide >> 40) & 0xFF
            out[6] = (wide >> 48) & 0xFF
            out[7] = wide >> 56
        out += width
    return out


cdef inline void put_double(uint8_t *out, double value) noexcept nogil:
    """`value`'s IEEE 754 bits, least significant byte first (the wire's order, whatever this machine's)."""
    cdef uint64_t bits
    cdef int i
    memcpy(&bits, &value, 8)
    for i in range(8):
        out[i] = (bits >> (8 * i)) & 0xFF


def batch_result(uint64_t tick, uint64_t incarnation, const uint64_t[:, ::1] begun, const uint64_t[:, ::1] ended,
                 const uint64_t[:, ::1] entered, const uint64_t[:, ::1] left, bint narrow_allowed,
                 double world_seconds=0.0) -> bytes:
    """The serialized BatchResult of a tick: its pair changes and sensor events as `(m, 2)` uint64
    rows, in 32 bits when `narrow_allowed` and every id of the four fits, and the seconds its
    broadphase took."""
    # All of it holding the GIL: a tick's answer is tens of microseconds of work, and letting the GIL
    # go would only let the event loop take it first, and the world's thread wait to get it back.
    cdef bint narrow = narrow_allowed and fits_narrow(begun) and fits_narrow(ended) and fits_narrow(entered) \
        and fits_narrow(left)
    cdef Py_ssize_t total = ((1 + varint_size(tick) if tick else 0)
                             + column_size(begun.shape[0] * 2, narrow) + column_size(ended.shape[0] * 2, narrow)
                             + (1 + varint_size(incarnation) if incarnation else 0)
                             + column_size(entered.shape[0] * 2, narrow) + column_size(left.shape[0] * 2, narrow)
                             + (2 if narrow else 0) + (9 if world_seconds != 0 else 0))
    cdef bytes result = PyBytes_FromStringAndSize(NULL, total)
    cdef uint8_t *out = <uint8_t *>PyBytes_AS_STRING(result)
    if tick:
        out[0] = TICK_KEY
        out = put_varint(out + 1, tick)
    out = put_column(out, BEGUN_KEY, begun, narrow)
    out = put_column(out, ENDED_KEY, ended, narrow)
    if incarnation:
        out[0] = INCARNATION_KEY
        out = put_varint(out + 1, incarnation)
    out = put_column(out, ENTERED_KEY, entered, narrow)
    out = put_column(out, LEFT_KEY, left, narrow)
    if narrow:
        out[0] = NARROW_IDS_KEY
        out[1] = 1
        out += 2
    if world_seconds != 0:
        out[0] = WORLD_SECONDS_KEY
        put_double(out + 1, world_seconds)
    return result



# StreamBatchesResponse's fields that carry a batch's answer.
cdef enum:
    SEQUENCE_KEY = 1 << 3
    RESULT_KEY = 2 << 3 | 2


def stream_answer(uint64_t sequence, const uint8_t[::1] result) -> bytes:
    """The StreamBatchesResponse that answers batch `sequence` of a stream with `result` (a serialized
    BatchResult): what `serialized(pb.StreamBatchesResponse, sequence=..., result=...)` writes, made on
    the world's thread, so that the event loop only sends it."""
    cdef Py_ssize_t size = result.shape[0]
    cdef Py_ssize_t total = (1 + varint_size(sequence) if sequence else 0) + 1 + varint_size(size) + size
    cdef bytes answer = PyBytes_FromStringAndSize(NULL, total)
    cdef uint8_t *out = <uint8_t *>PyBytes_AS_STRING(answer)
    if sequence:
        out[0] = SEQUENCE_KEY
        out = put_varint(out + 1, sequence)
    out[0] = RESULT_KEY
    out = put_varint(out + 1, size)
    if size:
        memcpy(out, &result[0], size)
    return answer
