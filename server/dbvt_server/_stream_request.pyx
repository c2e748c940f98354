# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""A batch stream's request read in place: its columns stay views of the bytes gRPC received.

upb's parse copies every bytes field of a `StreamBatchesRequest` into its arena, and reading a field
copies it again into a new bytes object: a W1 tick's 320 kB twice, on the event loop and then on the
world's thread, with the caches cold. `read` walks the message once and hands back the same fields
with each column a memoryview of the received bytes.

It reads what protobuf would read, in the same way, or nothing: each known field at most once and
with its own wire type. A message with a field given twice (which protobuf merges), an unknown
field, a varint of ten bytes or a string that is not UTF-8 gets None, and protobuf parses it.
"""
from libc.stdint cimport uint8_t, uint64_t

# Wire types.
cdef enum:
    VARINT = 0
    LENGTH = 2

# StreamBatchesRequest's fields and Batch's (tests/test_stream_request.py holds these to the .proto).
cdef enum:
    WORLD = 1
    SEQUENCE = 2
    BATCH = 3
    MORE_PARTS = 4
    NARROW_IDS = 5
    EXPECTED_TICK = 9

# Batch's bytes fields by number: all but expected_tick (9).
COLUMNS = {1: "create_ids", 2: "create_boxes", 3: "create_static", 4: "create_group", 5: "create_mask",
           6: "move_ids", 7: "move_boxes", 8: "destroy_ids", 10: "create_sensor"}

cdef class StreamedBatch:
    """A `Batch` read in place: what the stream's path reads of a `pb.Batch`, each column a
    memoryview of the received message (b"" when absent)."""

    cdef public object create_ids, create_boxes, create_static, create_group, create_mask
    cdef public object move_ids, move_boxes, destroy_ids, create_sensor
    cdef readonly uint64_t expected_tick
    cdef bint has_expected_tick
    cdef object raw

    def HasField(self, str name) -> bool:
        if name != "expected_tick":
            raise ValueError(f"Batch has no field {name!r} with presence")
        return self.has_expected_tick

    def ByteSize(self) -> int:
        return len(self.raw)

    def SerializeToString(self) -> bytes:
        """The batch's bytes as the client sent them, which protobuf parses to the same batch."""
        return bytes(self.raw)


cdef class StreamedRequest:
    """A `StreamBatchesRequest` read in place."""

    cdef readonly str world
    cdef readonly uint64_t sequence
    cdef readonly StreamedBatch batch
    cdef readonly bint more_parts
    cdef readonly bint narrow_ids


cdef bint read_varint(const uint8_t *data, Py_ssize_t end, Py_ssize_t *at, uint64_t *value) noexcept nogil:
    """The varint at `at[0]` into `value[0]`, `at[0]` past it; false past `end` or past nine bytes
    (where protobuf's own rules for the tenth byte would have to be kept)."""
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef uint8_t byte
    while at[0] < end and shift < 63:
        byte = data[at[0]]
        at[0] += 1
        result |= (<uint64_t>(byte & 0x7F)) << shift
        if byte < 0x80:
            value[0] = result
            return True
        shift += 7
    return False


cdef bint read_field(const uint8_t *data, Py_ssize_t end, Py_ssize_t *at, uint64_t *number, uint64_t *value,
                     Py_ssize_t *start) noexcept nogil:
    """The field at `at[0]`: its number, and its varint value, or its bytes' start and length (in
    `value`); false if it runs past `end` or has a wire type the protocol does not use."""
    cdef uint64_t key
    if not read_varint(data, end, at, &key):
        return False
    number[0] = key >> 3
    if key & 7 == VARINT:
        start[0] = -1
        return read_varint(data, end, at, value)
    if key & 7 == LENGTH:
        if not read_varint(data, end, at, value) or value[0] > <uint64_t>(end - at[0]):
            return False
        start[0] = at[0]
        at[0] += <Py_ssize_t>value[0]
        return True
    return False


cdef StreamedBatch read_batch(object view, const uint8_t *data, Py_ssize_t begin, Py_ssize_t end):
    cdef StreamedBatch batch = StreamedBatch.__new__(StreamedBatch)
    cdef Py_ssize_t at = begin, start
    cdef uint64_t number, value
    cdef set seen = set()
    batch.create_ids = batch.create_boxes = batch.create_static = batch.create_group = batch.create_mask = b""
    batch.move_ids = batch.move_boxes = batch.destroy_ids = batch.create_sensor = b""
    batch.raw = view[begin:end]
    while at < end:
        if not read_field(data, end, &at, &number, &value, &start) or number in seen:
            return None
        seen.add(number)
        if number == EXPECTED_TICK and start < 0:
            batch.expected_tick = value
            batch.has_expected_tick = True
        elif start >= 0 and number in COLUMNS:
            setattr(batch, COLUMNS[number], view[start:start + <Py_ssize_t>value])
        else:
            return None
    return batch


def read(bytes data):
    """`data` as a StreamedRequest, or None where protobuf must read it (see the module's note)."""
    cdef const uint8_t[::1] bytes_view = data
    cdef const uint8_t *raw = &bytes_view[0] if len(data) else NULL
    cdef Py_ssize_t end = len(data), at = 0, start
    cdef uint64_t number, value
    cdef set seen = set()
    cdef StreamedRequest request = StreamedRequest.__new__(StreamedRequest)
    view = memoryview(data)
    request.world = ""
    request.batch = None
    while at < end:
        if not read_field(raw, end, &at, &number, &value, &start) or number in seen:
            return None
        seen.add(number)
        if number == WORLD and start >= 0:
            try:
                request.world = str(data[start:start + <Py_ssize_t>value], "utf-8")
            except UnicodeDecodeError:
                return None
        elif number == SEQUENCE and start < 0:
            request.sequence = value
        elif number == BATCH and start >= 0:
            request.batch = read_batch(view, raw, start, start + <Py_ssize_t>value)
            if request.batch is None:
                return None
        elif number == MORE_PARTS and start < 0:
            request.more_parts = value != 0
        elif number == NARROW_IDS and start < 0:
            request.narrow_ids = value != 0
        else:
            return None
    if request.batch is None:
        request.batch = read_batch(view, raw, 0, 0)
    return request
