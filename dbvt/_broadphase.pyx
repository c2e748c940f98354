# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""`dbvt.Broadphase`: a Tree that remembers which proxies overlap and reports what changed.

As in Box2D, each proxy keeps a sorted list of the proxies whose *fat* boxes overlap its own, each
marked with whether the *tight* boxes touch. Fat boxes only change when a tight box leaves its own,
so an update() queries the tree only for those proxies; every other moved proxy just re-tests its
few listed partners' tight boxes. A destroy touches only that proxy's list.

Sensors ride on the same lists: a sensor and a proxy that is not one are partners like any pair,
and the bit then means "inside", which turns on when the proxy touches the sensor's shape and off
only when it no longer touches the shape grown by `sensor_margin`. For that, a sensor's fat box
holds its shape grown by the sensor margin (its "reach"), so a proxy inside is always a partner.
A sensor's list is long (every proxy within its reach), and a moving sensor re-tests only the
partners whose budget, set at their last test, the two sides' drifts since may have used up.
"""
from libc.float cimport FLT_MAX
from libc.math cimport INFINITY
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy, memset

import math
import struct

import numpy as np

from dbvt import validation

from dbvt._batch cimport (
    cancel_common, pairs_extend, pairs_free, pairs_push, rows_push, self_pairs, sort_int32, sort_pairs,
)
from dbvt._check cimport ListCounts, fat_pairs_count, partners_check
from dbvt._core cimport (
    NEWLY_MOVED, PREDICTION_STEPS, PREFETCH_AHEAD, PROXY_LIVE, PROXY_MOVED, PROXY_REFAT, PROXY_SEEN, PROXY_SENSOR,
    PROXY_SENSOR_BOX, PROXY_SENSOR_SPHERE, PROXY_STATIC, Hits, IdPair, PairBuffer, Proxy, TreeCore, box_contains,
    core_move, core_move_split, core_place, core_remove, core_reserve, core_set_sensor, grow_array, load_box, prefetch,
    prefetch_move,
)
from dbvt._finding cimport (
    FAT_LIMIT, FIND_ON_THREADS_FROM, NOT_FOUND, PICK_ON_THREADS_FROM, UNCHANGED, Finder, Found, Packets, Picked,
    Refreshed, Retest, Retests, find_all, flip_all, found_free, next_packet, packet_order, packets_free, pick_moved,
    picked_free, reach_allows, refresh_all, retest_all, retests_free,
)
from dbvt._parallel cimport threads_free
from dbvt._partners cimport (
    INLINE_PARTNERS, TOUCHING, Partners, budgets_of, items_of, partners_erase, partners_find, partners_insert,
    partners_reserve, prefetch_partners, prefetch_sensor_list, tight_overlap,
)
from dbvt._sensors cimport (
    SPHERE_TWO, SensorIndex, Shape, ball_holds, budget, grow_outward, index_bytes, index_free, index_init, index_note,
    index_note_room, index_update, move_drift, next_up, reach_cube, shape_of, shape_touches, sphere_two,
)
from dbvt._tree cimport TreeBase, pair_array

# pair tracking on, moved count, pending ended count, partner total, pending sensor leaves, sensor margin
_STATE = struct.Struct("<qqqqqd")
# A sensor's kind as create() takes it per row, and the flag each kind sets.
cdef inline uint32_t sensor_flag(unsigned char kind) noexcept nogil:
    return PROXY_SENSOR_BOX if kind == 1 else PROXY_SENSOR_SPHERE if kind == 2 else 0


cdef enum:
    # A sensor's new fat box covers this many more moves like its last: more than a proxy's, since
    # refreshing a sensor's partners (a walk and a merge of hundreds) costs far more than carrying
    # the few more partners of a longer box, most of which its budgets pass over.
    SENSOR_PREDICTION_STEPS = 8
    # A batch of this many moves (and no sensors in the world) edits the tree's subtrees on the
    # threads (core_move_split); with one thread it takes the same steps, so the tree is the same.
    MOVES_SPLIT_FROM = 65536
    # A moved sensor's due partners whose boxes are fetched ahead of its tests: twice a batch's
    # usual, as the tests go two at a time. In W1's sensor benchmark the sensed step took about 0.97
    # of its time with 8 ahead (paired runs), and 32 ahead was no better.
    DUE_AHEAD = 2 * PREFETCH_AHEAD


# A change to a sensor's list left for later (Broadphase.sensor_edits) has this bit set once it is made.
cdef uint64_t EDIT_MADE = (<uint64_t>1) << 63


cdef object _pair_copy(const PairBuffer *buffer):
    """A buffer's pairs as a `(m, 2)` uint64 array; the buffer is left as it is."""
    pairs = np.empty((buffer.count, 2), np.uint64)
    cdef uint64_t[:, ::1] view = pairs
    if buffer.count:
        memcpy(&view[0, 0], buffer.pairs, buffer.count * sizeof(IdPair))
    return pairs


cdef int _room(PairBuffer *buffer, int64_t extra) except -1:
    """Room for `extra` more pairs, so that pushing them cannot fail."""
    cdef IdPair *grown
    if buffer.count + extra > buffer.capacity:
        grown = <IdPair *>realloc(buffer.pairs, (buffer.count + extra) * sizeof(IdPair))
        if grown == NULL:
            raise MemoryError()
        buffer.pairs = grown
        buffer.capacity = buffer.count + extra
    return 0


class FatPairLimit(Exception):
    """update(max_fat_pairs=...) stopped: the fat boxes' pairs passed the limit."""


cdef inline bint is_sensor(const TreeCore *t, int32_t proxy) noexcept nogil:
    return (t.proxies[proxy].flags & PROXY_SENSOR) != 0


cdef class Broadphase(TreeBase):
    """Proxies (static or dynamic, with collision group and mask) whose overlapping pairs are
    tracked: `update()` reports the pairs that began and ended since the previous call.

    A pair exists when the tight boxes overlap (closed intervals), `a.group & b.mask` and
    `b.group & a.mask` are both non-zero, and not both proxies are static.

    With `track_pairs=False` nothing is tracked: moves cost only the tree's work, `update()` reports
    no changes and `pairs()` is computed on demand. For worlds that are only ever queried.

    With `threads` > 1, a batch of queries of at least 64 rows a thread is cut over that many threads,
    with the same answer. It is a runtime setting: `to_bytes()` does not keep it, `from_bytes()` takes it.
    """
    cdef uint32_t *groups           # per proxy slot; all three arrays follow core.proxy_capacity
    cdef uint32_t *masks
    cdef Partners *partners
    cdef int32_t slot_capacity
    cdef int32_t *moved             # proxies flagged PROXY_MOVED since the last update()
    cdef int64_t moved_count
    cdef int64_t moved_capacity
    cdef PairBuffer ended           # pairs of destroyed proxies, reported by the next update()
    cdef readonly bint track_pairs
    cdef int64_t touching           # pairs whose tight boxes overlap now, kept as bits flip
    cdef int64_t listed             # entries of all partner lists: twice the pairs of fat boxes (within reach)
    cdef int64_t listed_limit       # during update(max_fat_pairs=...): past it the update stops
    cdef readonly double sensor_margin
    cdef int64_t inside             # sensor pairs inside now (each counted once)
    cdef int64_t sensor_count       # live sensors: without any, queries skip no flag
    cdef PairBuffer leaving         # [sensor, proxy] of destroyed proxies inside, left at the next update()
    cdef PairBuffer entered         # the sensor events of the last update()
    cdef PairBuffer left
    cdef double *drift              # per proxy slot, once there are sensors (NULL before): the sum of its
                                    # moves' drifts (move_drift), rounded up, which budgets are set against
    cdef int32_t *due               # scratch of _pass_sensors: two sensors' entries that they must test
    cdef int64_t due_capacity
    cdef int32_t *flips             # scratch of update(): [proxy, sensor] whose bit flips on the proxy's side
    cdef int64_t flip_count
    cdef int64_t flip_capacity
    cdef PairBuffer moved_sensors   # scratch of update(): [id, proxy] of the moved sensors, in proxy order
    cdef PairBuffer sensor_edits    # scratch of update(): changes to sensors' lists, left for later (see
                                    # _merge_partners): [sensor, proxy << 1 | 1 to add, 0 to drop]
    cdef int64_t edit_hint          # where the last search of sensor_edits ended (_edits_of)
    cdef int32_t *side_edits        # scratch of _merge_partners: a sensor's changes to its partners'
    cdef int64_t side_capacity      # lists, [proxy << 1 | 1 to insert, 0 to erase], made after its merge
    cdef SensorIndex sensor_index   # for proxies' partner refreshes, the sensors' fat boxes cut into cells
    cdef int step_threads           # the threads update()'s stages are cut over: `threads`, or fewer when
                                    # the thread budget has no room (threads_free)
    cdef bint sensors_stale         # sensors were created or destroyed since it was built

    def __cinit__(self, *args, **kwargs):
        self.groups = NULL
        self.masks = NULL
        self.partners = NULL
        self.slot_capacity = 0
        self.moved = NULL
        self.moved_count = self.moved_capacity = 0
        self.drift = NULL
        self.due = NULL
        self.due_capacity = 0
        self.flips = NULL
        self.flip_count = self.flip_capacity = 0
        index_init(&self.sensor_index)
        self.sensors_stale = True
        memset(&self.ended, 0, sizeof(PairBuffer))
        memset(&self.leaving, 0, sizeof(PairBuffer))
        memset(&self.entered, 0, sizeof(PairBuffer))
        memset(&self.left, 0, sizeof(PairBuffer))
        memset(&self.moved_sensors, 0, sizeof(PairBuffer))
        memset(&self.sensor_edits, 0, sizeof(PairBuffer))
        self.edit_hint = 0
        self.side_edits = NULL
        self.side_capacity = 0
        self.touching = self.listed = self.inside = self.sensor_count = 0
        self.listed_limit = -1
        self.sensor_margin = 0.0

    def __init__(self, int dims=3, margin=0.05, track_pairs=True, sensor_margin=0.0, *, threads=1):
        self.core.dims = validation.check_dims(dims)
        self.core.margin = validation.check_margin(margin)
        self.track_pairs = bool(track_pairs)
        self.sensor_margin = validation.check_sensor_margin(sensor_margin)
        self.threads = validation.check_threads(threads)

    def __dealloc__(self):
        cdef int32_t i
        if self.partners != NULL:
            for i in range(self.slot_capacity):
                if self.partners[i].capacity != INLINE_PARTNERS:
                    free(self.partners[i].entries.heap)
        free(self.partners)
        free(self.groups)
        free(self.masks)
        free(self.moved)
        free(self.drift)
        free(self.due)
        free(self.flips)
        free(self.side_edits)
        index_free(&self.sensor_index)
        pairs_free(&self.ended)
        pairs_free(&self.leaving)
        pairs_free(&self.entered)
        pairs_free(&self.left)
        pairs_free(&self.moved_sensors)
        pairs_free(&self.sensor_edits)

    def __repr__(self):
        tracking = "" if self.track_pairs else ", track_pairs=False"
        return (f"dbvt.Broadphase(dims={self.core.dims}, margin={self.core.margin!r}{tracking})"
                f" with {len(self)} proxies")

    def __reduce__(self):
        return (type(self).from_bytes, (self.to_bytes(),))

    cdef int _reserve(self, int64_t extra_proxies, int64_t extra_moved) except -1:
        """Grow every pool a batch may touch before it starts, so a batch never fails half done."""
        cdef int32_t capacity, i
        cdef int64_t need = self.moved_count + extra_moved
        cdef int32_t *moved
        cdef void *grown
        if core_reserve(&self.core, extra_proxies, self.threads) != 0:
            raise MemoryError()
        capacity = self.core.proxy_capacity
        if capacity > self.slot_capacity:
            grown = realloc(self.groups, capacity * sizeof(uint32_t))
            if grown == NULL:
                raise MemoryError()
            self.groups = <uint32_t *>grown
            grown = realloc(self.masks, capacity * sizeof(uint32_t))
            if grown == NULL:
                raise MemoryError()
            self.masks = <uint32_t *>grown
            grown = realloc(self.partners, capacity * sizeof(Partners))
            if grown == NULL:
                raise MemoryError()
            self.partners = <Partners *>grown      # inline entries moved with it
            if self.drift != NULL:
                grown = realloc(self.drift, capacity * sizeof(double))
                if grown == NULL:
                    raise MemoryError()
                self.drift = <double *>grown
            for i in range(self.slot_capacity, capacity):
                self.groups[i] = self.masks[i] = 0
                if self.drift != NULL:
                    self.drift[i] = 0.0
                self.partners[i].count = 0
                self.partners[i].capacity = INLINE_PARTNERS
            self.slot_capacity = capacity
        if need > self.moved_capacity:
            need = max(need, 2 * self.moved_capacity)
            moved = <int32_t *>realloc(self.moved, need * sizeof(int32_t))
            if moved == NULL:
                raise MemoryError()
            self.moved = moved
            self.moved_capacity = need
        return 0

    cdef int _track_drift(self) except -1:
        """Start keeping the proxies' drifts (for the first sensor): a world without sensors has no use
        for them, nor for their 8 bytes a proxy."""
        if self.drift == NULL:
            self.drift = <double *>calloc(max(self.slot_capacity, 1), sizeof(double))
            if self.drift == NULL:
                raise MemoryError()
        return 0

    cdef inline void _mark_moved(self, int32_t proxy, bint refat) noexcept nogil:
        if not self.track_pairs:
            return
        if refat:
            self.core.proxies[proxy].flags |= PROXY_REFAT
        if not (self.core.proxies[proxy].flags & PROXY_MOVED):
            self.core.proxies[proxy].flags |= PROXY_MOVED
            self.moved[self.moved_count] = proxy
            self.moved_count += 1

    def create(self, ids, boxes, static=False, group=1, mask=0xFFFFFFFF, sensor=None):
        """Add proxies; their pairs begin at the next update(). `static`, `group` and `mask` are
        scalars or per-row arrays; `sensor` is None, "box" or "sphere", or per-row kinds (0 none,
        1 box, 2 sphere). Sensors need track_pairs."""
        id_arr = validation.as_ids(ids)
        n = len(id_arr)
        box_arr = validation.as_boxes(boxes, self.core.dims, n, threads=self.threads)
        cdef const unsigned char[::1] statics = validation.as_flags(static, n, "static")
        cdef const uint32_t[::1] group_view = validation.as_uint32(group, n, "group")
        cdef const uint32_t[::1] mask_view = validation.as_uint32(mask, n, "mask")
        kind_arr = validation.as_sensor_kinds(sensor, n)
        cdef const unsigned char[::1] kinds = kind_arr
        if not self.track_pairs and kind_arr.any():
            raise ValueError("sensors need pair tracking: this broadphase has track_pairs=False")
        self._check_new(id_arr)
        self._reserve(n, n)
        if kind_arr.any():
            self._track_drift()
            self.sensors_stale = True
        cdef int32_t[::1] proxies = self._add(id_arr, box_arr)
        cdef Py_ssize_t i
        cdef int32_t proxy
        cdef float tight[6]
        with nogil:
            for i in range(n):
                proxy = proxies[i]
                self.groups[proxy] = group_view[i]
                self.masks[proxy] = mask_view[i]
                if statics[i]:
                    self.core.proxies[proxy].flags |= PROXY_STATIC
                if kinds[i]:
                    core_set_sensor(&self.core, proxy, sensor_flag(kinds[i]))
                    self.sensor_count += 1
                    # An empty list left on this slot by a proxy that was not a sensor has no room for
                    # budgets: start inline, and the list grows into a sensor's when it needs the heap.
                    if self.partners[proxy].capacity != INLINE_PARTNERS:
                        free(self.partners[proxy].entries.heap)
                        self.partners[proxy].capacity = INLINE_PARTNERS
                    # Inserted with the fat box of a plain proxy: grow it to hold the sensor's reach.
                    memcpy(tight, self.core.proxies[proxy].tight, sizeof(tight))
                    self._move_proxy(proxy, tight)
                self._mark_moved(proxy, True)
        self._after_change()

    cdef bint _move_proxy(self, int32_t proxy, const float *tight) noexcept nogil:
        """core_move(), but a sensor's fat box must hold its reach (its tight box grown by the sensor
        margin): the tree is given the reach, and the proxy keeps its tight box."""
        cdef Proxy *p = &self.core.proxies[proxy]
        cdef float reach[6]
        cdef float old_reach[6]
        cdef bint refat
        if self.sensor_count:
            # Without sensors there are no budgets to set against the drifts, and a new sensor's
            # partners start untested: it only matters how far proxies move from then on.
            self.drift[proxy] = next_up(self.drift[proxy] + move_drift(p.tight, tight, p.flags, self.core.dims))
        if not (p.flags & PROXY_SENSOR):
            return core_move(&self.core, proxy, tight, PREDICTION_STEPS)
        if p.flags & PROXY_SENSOR_SPHERE:
            return self._move_sphere(proxy, tight)
        if self.sensor_margin == 0.0:
            return core_move(&self.core, proxy, tight, SENSOR_PREDICTION_STEPS)
        grow_outward(tight, reach, self.sensor_margin, self.core.dims)
        if box_contains(p.fat, reach):
            memcpy(p.tight, tight, 6 * sizeof(float))
            return False
        # core_move predicts the next move from the last one: let it compare reach with reach.
        grow_outward(p.tight, old_reach, self.sensor_margin, self.core.dims)
        memcpy(p.tight, old_reach, 6 * sizeof(float))
        refat = core_move(&self.core, proxy, reach, SENSOR_PREDICTION_STEPS)
        memcpy(self.core.proxies[proxy].tight, tight, 6 * sizeof(float))
        return refat

    cdef bint _move_sphere(self, int32_t proxy, const float *tight) noexcept nogil:
        """_move_proxy() for a sphere sensor, whose reach is a ball (see _sensors.pxd)."""
        cdef Proxy *p = &self.core.proxies[proxy]
        cdef int32_t dims = self.core.dims
        cdef float reach[6]
        cdef float fat[6]
        cdef int holds = ball_holds(p.fat, tight, dims, self.sensor_margin)
        cdef int i
        if holds == -1:
            grow_outward(tight, reach, self.sensor_margin, dims)
        if (holds == 1 and box_contains(p.fat, tight)) or (holds == -1 and box_contains(p.fat, reach)):
            memcpy(p.tight, tight, 6 * sizeof(float))
            return False
        if (not reach_cube(tight, p.tight, dims, self.sensor_margin, self.core.margin, SENSOR_PREDICTION_STEPS, fat)
                or ball_holds(fat, tight, dims, self.sensor_margin) != 1):
            # At the limits of float32: the sensor reaches everywhere.
            memcpy(fat, tight, 6 * sizeof(float))
            for i in range(dims):
                fat[i] = -FLT_MAX
                fat[i + 3] = FLT_MAX
        core_place(&self.core, proxy, tight, fat)
        return True

    def move(self, ids, boxes, previous=None):
        """Give proxies new tight boxes; returns how many left their fat box (and got a new one).

        `previous`, a float32 array shaped as `boxes`, receives the tight boxes they had, for
        undoing the move (at no cost beyond the copy: the proxies are in hand anyway)."""
        id_arr = validation.as_ids(ids)
        cdef const float[:, ::1] rows = validation.as_boxes(boxes, self.core.dims, len(id_arr), threads=self.threads)
        proxy_arr, order_arr = self._in_edit_order(id_arr)
        cdef int32_t[::1] proxies = proxy_arr
        cdef int64_t[::1] order = order_arr
        cdef Py_ssize_t n = proxies.shape[0], i, row, k
        cdef int64_t refattened = 0
        cdef bint refat
        cdef float box[6]
        cdef int32_t dims = self.core.dims
        cdef float[:, ::1] before = None
        cdef bint keep = previous is not None
        cdef uint8_t[::1] refats
        cdef int split = -1
        if keep:
            before = previous
            if before.shape[0] != n or before.shape[1] != 2 * dims:
                raise ValueError(f"previous must be ({n}, {2 * dims}) float32, got {np.shape(previous)}")
        self._reserve(0, n)
        if self.sensor_count == 0 and n >= MOVES_SPLIT_FROM:
            refat_arr = np.empty(n, np.uint8)
            refats = refat_arr
            with nogil:
                split = core_move_split(&self.core, &proxies[0], &order[0], &rows[0, 0],
                                        &before[0, 0] if keep else NULL, &refats[0], self.track_pairs, n,
                                        PREDICTION_STEPS, self.threads)
                if split == 0:
                    # The proxies are marked already (see _mark_moved); what is left is the list.
                    for i in range(n):
                        row = order[i]
                        refattened += refats[row] & 1
                        if refats[row] & NEWLY_MOVED:
                            self.moved[self.moved_count] = proxies[row]
                            self.moved_count += 1
            if split == 0:
                self._after_change()
                return refattened
        if self.sensor_count and index_note_room(&self.sensor_index, n) != 0:
            raise MemoryError()
        with nogil:
            for i in range(n):
                prefetch_move(&self.core, &proxies[0], &order[0], i, n)
                row = order[i]
                if keep:
                    for k in range(dims):
                        before[row, k] = self.core.proxies[proxies[row]].tight[k]
                        before[row, dims + k] = self.core.proxies[proxies[row]].tight[3 + k]
                load_box(&rows[row, 0], self.core.dims, box)
                refat = self._move_proxy(proxies[row], box)
                if refat and is_sensor(&self.core, proxies[row]):
                    index_note(&self.sensor_index, proxies[row])
                refattened += refat
                self._mark_moved(proxies[row], refat)
        self._after_change()
        return refattened

    def destroy(self, ids):
        """Remove proxies; their pairs are reported ended by the next update()."""
        cdef int32_t[::1] proxies = self._existing(validation.as_ids(ids))
        cdef Py_ssize_t n = proxies.shape[0], i
        cdef int32_t proxy, other, k
        cdef int32_t *items
        cdef int64_t total = 0
        for i in range(n):
            total += self.partners[proxies[i]].count    # an upper bound on the touching ones
        # Both buffers hold the bound, so that the loop below cannot fail half way.
        _room(&self.ended, total)
        _room(&self.leaving, total)
        with nogil:
            for i in range(n):
                proxy = proxies[i]
                items = items_of(&self.partners[proxy])
                for k in range(self.partners[proxy].count):
                    other = items[k] >> 1
                    partners_erase(&self.partners[other], proxy, is_sensor(&self.core, other))
                    if items[k] & TOUCHING:
                        self._ended(proxy, other, &self.ended, &self.leaving)
                self.listed -= 2 * self.partners[proxy].count
                self.partners[proxy].count = 0
                self.groups[proxy] = self.masks[proxy] = 0
                if is_sensor(&self.core, proxy):
                    self.sensor_count -= 1
                    self.sensors_stale = True
                core_remove(&self.core, proxy)
        self._after_change()

    cdef int _ended(self, int32_t a, int32_t b, PairBuffer *ended, PairBuffer *left) noexcept nogil:
        """A touching pair is no more: a pair ended, or a proxy left a sensor."""
        if is_sensor(&self.core, a) or is_sensor(&self.core, b):
            if is_sensor(&self.core, b):
                a, b = b, a
            self.inside -= 1
            return rows_push(left, self.core.proxies[a].id, self.core.proxies[b].id)
        self.touching -= 1
        return pairs_push(ended, self.core.proxies[a].id, self.core.proxies[b].id)

    cdef void _count_touching(self) noexcept nogil:
        """The counts kept as bits flip, counted afresh from the lists (after loading)."""
        cdef TreeCore *t = &self.core
        cdef int32_t proxy, k
        cdef int32_t *items
        self.touching = self.inside = self.sensor_count = 0
        for proxy in range(self.slot_capacity):
            if not (t.proxies[proxy].flags & PROXY_LIVE):
                continue
            self.sensor_count += is_sensor(t, proxy)
            items = items_of(&self.partners[proxy])
            for k in range(self.partners[proxy].count):
                if not (items[k] & TOUCHING):
                    continue
                if is_sensor(t, proxy):
                    self.inside += 1
                elif not is_sensor(t, items[k] >> 1) and (items[k] >> 1) > proxy:
                    self.touching += 1

    def settings(self, ids):
        """`(static, group, mask, sensor)` of `ids`: uint8, uint32, uint32 and uint8 (0 none, 1 box,
        2 sphere) arrays, as create() takes them."""
        cdef int32_t[::1] proxies = self._existing(validation.as_ids(ids))
        cdef Py_ssize_t n = proxies.shape[0], i
        cdef uint32_t flags
        static = np.empty(n, np.uint8)
        group = np.empty(n, np.uint32)
        mask = np.empty(n, np.uint32)
        sensor = np.empty(n, np.uint8)
        for i in range(n):
            flags = self.core.proxies[proxies[i]].flags
            static[i] = (flags & PROXY_STATIC) != 0
            group[i] = self.groups[proxies[i]]
            mask[i] = self.masks[proxies[i]]
            sensor[i] = 1 if flags & PROXY_SENSOR_BOX else 2 if flags & PROXY_SENSOR_SPHERE else 0
        return static, group, mask, sensor

    @property
    def sensor_pair_count(self):
        """The [sensor, proxy] pairs inside after the last update()."""
        return self.inside

    @property
    def pair_count(self):
        """The pairs whose tight boxes overlap now (after the last update()); 0 without track_pairs."""
        return self.touching

    def update(self, max_fat_pairs=None):
        """`(begun, ended)`: `(m, 2)` uint64 pairs (rows a < b, sorted) that started and stopped
        overlapping since the previous update().

        With `max_fat_pairs`, the update stops as soon as the pairs of fat boxes (which the partner
        lists hold, and which bound the pairs that can begin) pass it, and raises FatPairLimit. A
        batch of boxes all on one spot would otherwise fill the memory before its first pair is
        counted. The broadphase is then part-way through the update, consistent but with changes
        still pending: undo the batch (move back, destroy the created, create the destroyed) and
        update() again to return to where it was.

        The sensors' events of the update (and, after FatPairLimit, the leaves it had found) are
        kept for sensor_events()."""
        cdef PairBuffer begun
        cdef PairBuffer ended = self.ended
        cdef PairBuffer spare = self.left
        cdef bint destroyed = self.ended.count != 0, destroyed_inside = self.leaving.count != 0
        cdef int status
        self.listed_limit = -1 if max_fat_pairs is None else 2 * int(max_fat_pairs)
        memset(&begun, 0, sizeof(PairBuffer))
        memset(&self.ended, 0, sizeof(PairBuffer))
        # The event buffers are kept from update to update: with sensors moving every tick they are
        # large, and a fresh allocation each time would take fresh pages from the system.
        self.entered.count = 0
        self.left = self.leaving
        self.leaving = spare
        self.leaving.count = 0
        with nogil:
            status = self._track(&begun, &ended)
            if status == 0:
                cancel_common(&begun, &ended, self.threads, destroyed)
                cancel_common(&self.entered, &self.left, self.threads, destroyed_inside)
        self.listed_limit = -1
        if status != 0:
            pairs_free(&begun)
            pairs_free(&ended)
            self.entered.count = 0
            if status == FAT_LIMIT:
                raise FatPairLimit(f"more than {max_fat_pairs} pairs of fat boxes")
            raise MemoryError()
        self._after_change()
        return pair_array(&begun), pair_array(&ended)

    def sensor_events(self):
        """`(entered, left)` of the last update(): `(m, 2)` uint64 rows `[sensor, proxy]`, sorted. A
        proxy enters a sensor when it touches the sensor's shape, and leaves it when it no longer
        touches the shape grown by sensor_margin, or when either is destroyed."""
        return _pair_copy(&self.entered), _pair_copy(&self.left)

    def sensor_pairs(self):
        """Every `[sensor, proxy]` inside as of the last update() (less destroyed proxies), sorted."""
        cdef PairBuffer buffer
        cdef TreeCore *t = &self.core
        cdef int32_t proxy, k
        cdef int32_t *items
        cdef int status = 0
        memset(&buffer, 0, sizeof(PairBuffer))
        with nogil:
            for proxy in range(t.proxy_capacity):
                if status == 0 and t.proxies[proxy].flags & PROXY_LIVE and is_sensor(t, proxy):
                    items = items_of(&self.partners[proxy])
                    for k in range(self.partners[proxy].count):
                        if items[k] & TOUCHING and rows_push(&buffer, t.proxies[proxy].id,
                                                              t.proxies[items[k] >> 1].id) != 0:
                            status = -1
                            break
            sort_pairs(buffer.pairs, buffer.count)
        if status != 0:
            pairs_free(&buffer)
            raise MemoryError()
        return pair_array(&buffer)

    def set_sensor_pairs(self, rows, inside):
        """Set whether each `[sensor, proxy]` of `rows` is inside, with no event: how a batch refused
        after its update() puts the sensors back as they were (their state depends on history, so
        moving the boxes back is not enough). A pair set inside must be one the lists hold: its
        proxy touches the sensor's reach."""
        pairs = np.ascontiguousarray(rows, np.uint64).reshape(-1, 2)
        flags = validation.as_flags(inside, len(pairs), "inside")
        cdef Py_ssize_t i
        cdef int32_t sensor, proxy
        cdef int32_t *entry
        cdef double *budgets
        found = []
        for i in range(len(pairs)):
            sensor = self._existing(pairs[i:i + 1, 0])[0]
            proxy = self._existing(pairs[i:i + 1, 1])[0]
            if not is_sensor(&self.core, sensor) or is_sensor(&self.core, proxy):
                raise ValueError(f"row {i}: {pairs[i, 0]} is not a sensor, or {pairs[i, 1]} is one")
            entry = partners_find(&self.partners[sensor], proxy)
            if entry == NULL and flags[i]:
                raise ValueError(f"row {i}: proxy {pairs[i, 1]} is not within reach of sensor {pairs[i, 0]}")
            found.append((sensor, proxy))
        for i, (sensor, proxy) in enumerate(found):
            entry = partners_find(&self.partners[sensor], proxy)
            if entry == NULL or ((entry[0] & TOUCHING) != 0) == (flags[i] != 0):
                continue
            entry[0] ^= TOUCHING
            partners_find(&self.partners[proxy], sensor)[0] ^= TOUCHING
            budgets = budgets_of(&self.partners[sensor])
            if budgets != NULL:     # a decision set, not tested: the next move re-tests it
                budgets[entry - items_of(&self.partners[sensor])] = -INFINITY
            self.inside += 1 if flags[i] else -1
        self._after_change()

    cdef int _track(self, PairBuffer *begun, PairBuffer *ended) noexcept nogil:
        """Stage 1 refreshes the fat partners of proxies with new fat boxes, stage 2 re-tests the tight
        boxes of every moved proxy against its partners; the flips are the events."""
        cdef int64_t m
        cdef int status = 0
        cdef Finder finder
        cdef Picked picked
        cdef bint on_threads
        # On a thread whose budget is spent, the one-thread stages: the threads' stages run on one
        # thread cost 4 % more (W2 2-D at 30k), and the answer is the same either way.
        self.step_threads = threads_free(self.threads)
        on_threads = self.step_threads > 1 and self.moved_count >= FIND_ON_THREADS_FROM
        memset(&picked, 0, sizeof(Picked))
        if self.sensor_count:
            if index_update(&self.sensor_index, &self.core, self.sensors_stale) != 0:
                self.sensors_stale = True
                return -1
            self.sensors_stale = False
        # Proxy numbers follow the tree's order after a build, so taking the moved proxies in
        # that order keeps consecutive queries on the same, cache-warm paths.
        sort_int32(self.moved, self.moved_count)
        finder.t = &self.core
        finder.groups = self.groups
        finder.masks = self.masks
        finder.sensor_index = &self.sensor_index
        finder.sensors = self.sensor_count != 0
        self.sensor_edits.count = 0
        self.moved_sensors.count = 0
        if pick_moved(&self.core, self.moved, self.moved_count,
                      self.step_threads if on_threads and self.moved_count >= PICK_ON_THREADS_FROM else 1,
                      on_threads, &picked) != 0:
            return -1
        status = self._refresh(&finder, &picked, ended)
        for m in range(picked.sensor_count):
            if status == 0:
                status = rows_push(&self.moved_sensors, self.core.proxies[picked.sensors[m]].id,
                                   <uint64_t>picked.sensors[m])
        # Stage 2: the moved sensors first (_pass_sensors), their flips on their partners' side
        # gathered, then made with the lists fetched ahead (even after a failure, so that both sides
        # agree); then the other moved proxies, which see the flipped bits.
        self.flip_count = 0
        if status == 0:
            status = self._pass_sensors()
        # Even after a failure or a stop at the limit: both sides of every pair must agree.
        if self._make_sensor_edits() != 0:
            status = -1
        self._flip_partner_sides()
        if on_threads:
            if status == 0:
                status = self._retest_on_threads(&picked, begun, ended)
        else:
            for m in range(self.moved_count):
                prefetch_partners(&self.core, self.partners, self.moved, m, self.moved_count)
                if status == 0:
                    status = self._retest(self.moved[m], begun, ended)
        picked_free(&picked)
        # Only the re-tests on one thread and the sensors' passes mark proxies seen: on threads, in a
        # world without sensors, there is nothing to clear, and the pass over the flags is spared.
        for m in range(self.moved_count if self.sensor_count or not on_threads else 0):
            self.core.proxies[self.moved[m]].flags &= ~PROXY_SEEN
        if status == 0:
            self.moved_count = 0
        return status

    cdef int _refresh(self, const Finder *finder, const Picked *picked, PairBuffer *ended) noexcept nogil:
        """Stage 1: the proxies with new fat boxes (`picked`, those that are no sensors first) get their
        partners, found a packet of neighbours at a time when many refresh (see packet_order in
        _finding.pyx), on threads from FIND_ON_THREADS_FROM of them. The proxies that are no sensors
        are merged first, then the sensors (see _merge_partners)."""
        if self.step_threads > 1 and picked.refat_count >= FIND_ON_THREADS_FROM:
            return self._refresh_on_threads(finder, picked.refat, picked.refat_plain, picked.refat_count, ended)
        return self._refresh_here(finder, picked.refat, picked.refat_plain, picked.refat_count, ended)

    cdef int _refresh_here(self, const Finder *finder, const int32_t *refat, int64_t plain, int64_t n,
                           PairBuffer *ended) noexcept nogil:
        """Stage 1 on one thread, for `refat` (`plain` proxies that are no sensors, then sensors):
        each proxy's partners merged as soon as they are found, while the partners its walk read are
        still in cache; the sensors one by one, in their order."""
        cdef const int32_t *first
        cdef int64_t *order = NULL
        cdef int64_t count, position
        cdef bint together = False
        cdef Packets packets
        cdef int status = 0, sensors, k
        memset(&packets, 0, sizeof(Packets))
        for sensors in range(2 if self.sensor_count else 1):
            first = refat + plain if sensors else refat
            count = n - plain if sensors else plain
            if sensors:
                sort_pairs(self.sensor_edits.pairs, self.sensor_edits.count)
            elif packet_order(&self.core, first, count, NULL, &order, &together) != 0:
                status = -1
            position = 0
            while status == 0 and position < count:
                if next_packet(finder, first, order, &position, count, together and not sensors, &packets) != 0:
                    status = -1
                    break
                for k in range(packets.count):
                    status = self._merge_partners(first[packets.at[k]], &packets.lanes[k], ended)
                    if status != 0:
                        break
            free(order)
            order = NULL
        packets_free(&packets)
        return status

    cdef int _refresh_on_threads(self, const Finder *finder, const int32_t *refat, int64_t plain, int64_t n,
                                 PairBuffer *ended) noexcept nogil:
        """Stage 1 on threads, for `refat` (`plain` proxies that are no sensors, then sensors, each
        kind ascending). Without sensors, the threads merge too (refresh_all). With them, the
        partners are found on the threads (find_all) and merged as _refresh_here merges them: finding
        reads only what merging leaves alone (the tree, the filters, the grid), so the lists come out
        the same."""
        cdef int64_t m, room = max(0, self.listed_limit - self.listed) if self.listed_limit >= 0 else -1
        cdef int status = 0, sensors
        cdef const Hits *source
        cdef Hits view
        cdef Found found
        cdef Refreshed refreshed
        memset(&found, 0, sizeof(Found))
        memset(&refreshed, 0, sizeof(Refreshed))
        if self.sensor_count == 0:
            status = refresh_all(&self.core, finder, self.partners, refat, n, self.step_threads, room, &refreshed)
            self.listed += refreshed.listed
            self.touching += refreshed.touching
            if status == 0:
                status = pairs_extend(ended, &refreshed.ended)
            pairs_free(&refreshed.ended)
            if status == 0 and 0 <= self.listed_limit < self.listed:
                return FAT_LIMIT
            return status
        status = find_all(finder, self.partners, refat, n, self.step_threads, room, &found)
        for sensors in range(2):
            if sensors:
                sort_pairs(self.sensor_edits.pairs, self.sensor_edits.count)
            for m in range(plain if sensors else 0, n if sensors else plain):
                if status != 0:
                    break
                if found.count[m] == NOT_FOUND:
                    status = FAT_LIMIT      # the threads stopped finding: the rest keep their flag
                    break
                if found.count[m] == UNCHANGED:
                    # What _merge_partners does with the list it holds already.
                    self.core.proxies[refat[m]].flags &= ~PROXY_REFAT
                    if 0 <= self.listed_limit < self.listed:
                        status = FAT_LIMIT
                    continue
                # The merge works in place in the partners it is given: a view of the thread's hits.
                source = &found.hits[found.worker[m]]
                view.proxies = source.proxies + found.first[m]
                view.fractions = source.fractions + found.first[m]
                view.count = view.capacity = found.count[m]
                status = self._merge_partners(refat[m], &view, ended)
        found_free(&found)
        return status

    cdef int _retest_on_threads(self, const Picked *picked, PairBuffer *begun, PairBuffer *ended) noexcept nogil:
        """Stage 2 for the moved proxies that are no sensors (`picked`), with the changes found on the
        threads (retest_all). Without sensors, the threads make them too (flip_all); with them, one
        thread makes them in the order it would take them (see _retest)."""
        cdef TreeCore *t = &self.core
        cdef const int32_t *plain = picked.retest
        cdef int64_t n = picked.retest_count, m, c, r
        cdef int32_t other, last
        cdef int32_t *entry
        cdef const Retest *change
        cdef bint now
        cdef int status = 0, w
        cdef Retests found
        memset(&found, 0, sizeof(Retests))
        status = retest_all(t, self.partners, plain, n, self.step_threads, self.sensor_count == 0, &found)
        if status == 0 and self.sensor_count == 0:
            flip_all(t, self.partners, &found, plain, n)
            for w in range(found.workers):
                self.touching += found.begun[w].count - found.ended[w].count
                if status == 0:
                    status = pairs_extend(begun, &found.begun[w])
                if status == 0:
                    status = pairs_extend(ended, &found.ended[w])
            retests_free(&found)
            return status
        # As _retest marks each proxy as it starts it: after a failure, those after it are left
        # moved, for the next update to re-test.
        last = -1
        for c in range(found.chunks if status == 0 else 0):
            for r in range(found.chunk_first[c], found.chunk_first[c] + found.chunk_count[c]):
                if status != 0:
                    break
                change = &found.found[found.chunk_worker[c]][r]
                entry = &items_of(&self.partners[change.proxy])[change.entry]
                other = change.other
                last = change.proxy
                if change.visit:
                    status = self._visit_sensor(other, change.proxy, entry)
                    continue
                now = (entry[0] & TOUCHING) == 0
                entry[0] ^= TOUCHING
                partners_find(&self.partners[other], change.proxy)[0] ^= TOUCHING
                self.touching += 1 if now else -1
                status = pairs_push(begun if now else ended, t.proxies[change.proxy].id, t.proxies[other].id)
        if status == 0 and n:
            last = plain[n - 1]
        for m in range(n):
            if plain[m] <= last:
                t.proxies[plain[m]].flags = (t.proxies[plain[m]].flags & ~PROXY_MOVED) | PROXY_SEEN
        retests_free(&found)
        return status

    cdef void _flip_partner_sides(self) noexcept nogil:
        """Flip the bits the sensors' passes gathered on the proxies' side of their pairs: each is a search in
        a list far from the last, so a list's header, then its entries, are fetched ahead."""
        cdef int64_t f
        cdef const Partners *ahead
        for f in range(self.flip_count):
            if f + 2 * PREFETCH_AHEAD < self.flip_count:
                prefetch(&self.partners[self.flips[2 * (f + 2 * PREFETCH_AHEAD)]])
            if f + PREFETCH_AHEAD < self.flip_count:
                ahead = &self.partners[self.flips[2 * (f + PREFETCH_AHEAD)]]
                prefetch(items_of(ahead) + ahead.count // 2)
            partners_find(&self.partners[self.flips[2 * f]], self.flips[2 * f + 1])[0] ^= TOUCHING
        self.flip_count = 0

    cdef int _merge_partners(self, int32_t proxy, Hits *hits, PairBuffer *ended) noexcept nogil:
        """Replace the partner list of a proxy with a new fat box by the partners found for it (`hits`,
        from find_partners), and both sides' lists with it.

        A sensor's list is long, and the lists of the sensors that proxies' refreshes come in or go
        out of are far apart: putting a proxy in, or taking it out, fetched half a list from memory
        to move it. Those changes are left in `sensor_edits` instead, and made when the list is at
        hand anyway: by the sensor's pass (_pass_sensors), by its own refresh, or at the end of the
        update (_make_sensor_edits). Stage 1 refreshes the proxies that are no sensors first, and
        sorts the changes before the sensors' refreshes look theirs up."""
        cdef TreeCore *t = &self.core
        cdef Partners *mine = &self.partners[proxy]
        cdef int32_t *items = items_of(mine)
        cdef bint sensor = is_sensor(t, proxy)
        cdef double *budgets = budgets_of(mine) if sensor else NULL
        cdef int64_t kept = hits.count, sides = 0
        cdef int32_t i = 0, j = 0, other, entry
        cdef int status = 0
        if sensor:
            # Its list may have changes pending: make them before reading it (and the list may move).
            if self._make_edits_of(proxy) != 0:
                return -1
            items = items_of(mine)
            budgets = budgets_of(mine)
            # Room to note a change for every partner, old and new (see _make_side_edits).
            if mine.count + kept > self.side_capacity:
                if grow_array(<void **>&self.side_edits, &self.side_capacity, mine.count + kept, sizeof(int32_t)) != 0:
                    return -1
        t.proxies[proxy].flags &= ~PROXY_REFAT
        # Merge old and new lists: the old entries keep their touching bit (and a sensor's, its
        # budgets, which the walk's unused fractions hold meanwhile); partners that left end their
        # pair if it was touching; new ones start untouched and untested (stage 2 decides).
        while status == 0 and (i < mine.count or j < kept):
            if j == kept or (i < mine.count and (items[i] >> 1) < hits.proxies[j]):
                entry = items[i]
                if self._sensor_partner(proxy, entry >> 1):
                    status = rows_push(&self.sensor_edits, <uint64_t>(entry >> 1), <uint64_t>proxy << 1)
                elif sensor:
                    self.side_edits[sides] = entry & ~TOUCHING
                    sides += 1
                else:
                    partners_erase(&self.partners[entry >> 1], proxy, False)
                self.listed -= 1
                if status == 0 and entry & TOUCHING:
                    status = self._ended(proxy, entry >> 1, ended, &self.left)
                i += 1
            elif i == mine.count or hits.proxies[j] < (items[i] >> 1):
                other = hits.proxies[j]
                if self._sensor_partner(proxy, other):
                    status = rows_push(&self.sensor_edits, <uint64_t>other, (<uint64_t>proxy << 1) | 1)
                elif sensor:
                    self.side_edits[sides] = (other << 1) | 1
                    sides += 1
                else:
                    status = partners_insert(&self.partners[other], proxy, False)
                self.listed += 1
                hits.proxies[j] = other << 1
                hits.fractions[j] = -INFINITY
                j += 1
            else:
                hits.proxies[j] = items[i]
                hits.fractions[j] = budgets[i] if budgets != NULL else -INFINITY
                i += 1
                j += 1
        if self._make_side_edits(proxy, sides) != 0:
            status = -1
        if status != 0 or partners_reserve(mine, <int32_t>kept, sensor) != 0:
            return -1
        if kept:
            memcpy(items_of(mine), hits.proxies, kept * sizeof(int32_t))
            budgets = budgets_of(mine) if sensor else NULL
            if budgets != NULL:
                memcpy(budgets, hits.fractions, kept * sizeof(double))
        self.listed += kept - mine.count
        mine.count = <int32_t>kept
        if 0 <= self.listed_limit < self.listed:
            return FAT_LIMIT
        return 0

    cdef int _make_side_edits(self, int32_t sensor, int64_t count) noexcept nogil:
        """A refreshed sensor's changes to its partners' lists (`side_edits`): some seventy, each list
        in a different place. Made one at a time in the merge, each waited for its partner's header
        and then its list; here both are fetched ahead, the headers further than the lists they
        point to."""
        cdef int64_t e
        cdef int32_t other
        for e in range(count):
            if e + 2 * PREFETCH_AHEAD < count:
                prefetch(&self.partners[self.side_edits[e + 2 * PREFETCH_AHEAD] >> 1])
            if e + PREFETCH_AHEAD < count:
                prefetch(items_of(&self.partners[self.side_edits[e + PREFETCH_AHEAD] >> 1]))
            other = self.side_edits[e] >> 1
            if self.side_edits[e] & 1:
                if partners_insert(&self.partners[other], sensor, False) != 0:
                    return -1
            else:
                partners_erase(&self.partners[other], sensor, False)
        return 0

    cdef int64_t _edits_of(self, int32_t sensor, int64_t *end) noexcept nogil:
        """Where the changes left for a sensor's list are in `sensor_edits`, once sorted: [first, end),
        empty when there are none or they are made. The search gallops on from where the last one
        ended: the passes and refreshes ask in the proxies' order, the order the changes are sorted in."""
        cdef const IdPair *edits = self.sensor_edits.pairs
        cdef int64_t count = self.sensor_edits.count, lo = 0, hi, mid, step = 1
        if self.edit_hint <= count and (self.edit_hint == 0 or edits[self.edit_hint - 1].a < <uint64_t>sensor):
            lo = self.edit_hint
        hi = lo
        while hi < count and edits[hi].a < <uint64_t>sensor:
            lo = hi + 1
            hi = min(lo + step, count)
            step *= 2
        while lo < hi:
            mid = (lo + hi) // 2
            if edits[mid].a < <uint64_t>sensor:
                lo = mid + 1
            else:
                hi = mid
        end[0] = lo
        if lo < count and not (edits[lo].b & EDIT_MADE):
            while end[0] < count and edits[end[0]].a == <uint64_t>sensor:
                end[0] += 1
        self.edit_hint = end[0]
        return lo

    cdef int _make_edits_of(self, int32_t sensor) noexcept nogil:
        """Make the changes left for a sensor's list (see _merge_partners), and mark them made."""
        cdef IdPair *edits = self.sensor_edits.pairs
        cdef int64_t end, e
        cdef int64_t first = self._edits_of(sensor, &end)
        cdef int32_t other
        for e in range(first, end):
            other = <int32_t>(edits[e].b >> 1)
            if edits[e].b & 1:
                if partners_insert(&self.partners[sensor], other, True) != 0:
                    return -1
            else:
                partners_erase(&self.partners[sensor], other, True)
        for e in range(first, end):
            edits[e].b |= EDIT_MADE     # each: a sort may put any of them first
        return 0

    cdef int _make_sensor_edits(self) noexcept nogil:
        """Make every change to sensors' lists still left (of sensors that neither moved nor refreshed)."""
        cdef int64_t e
        cdef int status = 0
        sort_pairs(self.sensor_edits.pairs, self.sensor_edits.count)
        for e in range(self.sensor_edits.count):
            if status == 0 and (e == 0 or self.sensor_edits.pairs[e].a != self.sensor_edits.pairs[e - 1].a):
                status = self._make_edits_of(<int32_t>self.sensor_edits.pairs[e].a)
        self.sensor_edits.count = 0
        return status

    cdef inline bint _sensor_partner(self, int32_t proxy, int32_t other) noexcept nogil:
        """Whether `other`, a partner of `proxy`, is a sensor: without reading its flags, a cache miss,
        when it cannot be (there are no sensors, or `proxy` is one)."""
        return self.sensor_count != 0 and not is_sensor(&self.core, proxy) and is_sensor(&self.core, other)

    cdef int _retest(self, int32_t proxy, PairBuffer *begun, PairBuffer *ended) noexcept nogil:
        """Compare a moved proxy's tight box with each partner's; flip the bit on both sides."""
        cdef TreeCore *t = &self.core
        cdef Partners *mine = &self.partners[proxy]
        cdef int32_t *items = items_of(mine)
        cdef int32_t k, other
        cdef int32_t *theirs
        cdef bint now
        if (t.proxies[proxy].flags & (PROXY_LIVE | PROXY_MOVED)) != (PROXY_LIVE | PROXY_MOVED):
            return 0        # destroyed since, or listed twice
        # PROXY_SEEN marks the proxies whose pairs this update has re-tested (_track clears it): a
        # pair of two moved proxies is tested once, by whichever comes first. The moved sensors have
        # made their passes before (_pass_sensors): each decides every pair of its list (its budgets
        # count both drifts), so its partners skip it.
        t.proxies[proxy].flags = (t.proxies[proxy].flags & ~PROXY_MOVED) | PROXY_SEEN
        for k in range(mine.count):
            # Within reach of many sensors, a list grows long: fetch partners ahead.
            if k + PREFETCH_AHEAD < mine.count:
                prefetch(&t.proxies[items[k + PREFETCH_AHEAD] >> 1])
            other = items[k] >> 1
            if t.proxies[other].flags & PROXY_SEEN:
                continue
            if is_sensor(t, other):
                if self._visit_sensor(other, proxy, &items[k]) != 0:
                    return -1
                continue
            now = tight_overlap(t, proxy, other)
            if now == (items[k] & TOUCHING):
                continue
            items[k] ^= TOUCHING
            theirs = partners_find(&self.partners[other], proxy)
            theirs[0] ^= TOUCHING
            self.touching += 1 if now else -1
            if pairs_push(begun if now else ended, t.proxies[proxy].id, t.proxies[other].id) != 0:
                return -1
        return 0

    cdef int _pass_sensors(self) noexcept nogil:
        """The moved sensors' passes (see _track). A moved sensor re-tests its partners, but only those
        that may have changed: a pair's budget, set at its last test, is the sum of the two drifts
        then and the slack the test found (how far the boxes had to move, in sum, to reach the next
        threshold); while the drifts' sum stays below it, the decision stands. Passing those over
        reads a budget and a drift per partner instead of its proxy, which a sensor's long list (every
        proxy within its reach) would miss in cache.

        The sensors go in the proxies' order, which follows the tree's after a build: one after the
        other, they are near each other and share many partners, whose boxes and drifts are then
        still in cache. Their events are put in id order after (_events_by_id).

        Each pass has two stages: which entries are due (_due_entries), then their exact tests
        (_test_due). The next sensor's entries are found before this one's tests, so that its first
        partners' boxes arrive while this one's are tested: the fetches ahead run on from sensor to
        sensor instead of starting cold at each. The changes stage 1 left for a list are made just
        before its first stage, which the list was fetched ahead for."""
        cdef const IdPair *order = self.moved_sensors.pairs
        cdef int64_t count = self.moved_sensors.count, m, half = self.due_capacity // 2
        cdef int64_t *runs = <int64_t *>malloc(2 * (count + 1) * sizeof(int64_t))
        cdef int32_t found[2]
        cdef int status = 0
        found[0] = found[1] = -1
        if runs == NULL or (count and self._next_due(<int32_t>order[0].b, 0, &half, found) != 0):
            free(runs)
            return -1
        for m in range(count):
            runs[2 * m] = self.entered.count
            runs[2 * m + 1] = self.left.count
            if m + 3 < count:
                prefetch(&self.partners[order[m + 3].b])
            if m + 2 < count:
                prefetch_sensor_list(&self.partners[order[m + 2].b])
            if m + 1 < count and self._next_due(<int32_t>order[m + 1].b, (m + 1) & 1, &half, found) != 0:
                self._still_moved(<int32_t>order[m].b, found[m & 1])
                free(runs)
                return -1
            status = self._test_due(<int32_t>order[m].b, self.due + (m & 1) * half, found[m & 1])
            if status != 0:
                if m + 1 < count:
                    self._still_moved(<int32_t>order[m + 1].b, found[(m + 1) & 1])
                free(runs)
                return status
        runs[2 * count] = self.entered.count
        runs[2 * count + 1] = self.left.count
        status = self._events_by_id(runs)
        free(runs)
        return status

    cdef int _events_by_id(self, const int64_t *runs) noexcept nogil:
        """The moved sensors' events, found sensor by sensor in the proxies' order (each sensor's run
        sorted), put in the order of their ids: one sorted run, which update() merges with the few
        other events instead of sorting them all. `runs` holds where each sensor's entered and left
        rows start in their buffers."""
        cdef int64_t count = self.moved_sensors.count, r, m, w, k
        cdef IdPair *ranks = <IdPair *>malloc(max(count, 1) * sizeof(IdPair))
        cdef IdPair *rows
        cdef PairBuffer *buffer
        cdef int side
        if ranks == NULL:
            return -1
        for m in range(count):
            ranks[m].a = self.moved_sensors.pairs[m].a
            ranks[m].b = <uint64_t>m
        sort_pairs(ranks, count)
        for side in range(2):
            buffer = &self.left if side else &self.entered
            rows = <IdPair *>malloc(max(runs[2 * count + side] - runs[side], 1) * sizeof(IdPair))
            if rows == NULL:
                free(ranks)
                return -1
            w = 0
            for r in range(count):
                m = <int64_t>ranks[r].b
                k = runs[2 * m + 2 + side] - runs[2 * m + side]
                memcpy(rows + w, buffer.pairs + runs[2 * m + side], k * sizeof(IdPair))
                w += k
            memcpy(buffer.pairs + runs[side], rows, w * sizeof(IdPair))
            free(rows)
        free(ranks)
        return 0

    cdef int _next_due(self, int32_t sensor, int slot, int64_t *half, int32_t *found) noexcept nogil:
        """Make the changes left for a sensor's list, then its pass's first stage, into half `slot` of
        `due` (grown as the list needs, keeping the other half's `found` entries)."""
        cdef int64_t length
        cdef int32_t *due
        found[slot] = -1
        if self._make_edits_of(sensor) != 0:
            return -1
        length = self.partners[sensor].count
        if length > half[0]:
            length = max(length, 2 * half[0])
            due = <int32_t *>malloc(2 * length * sizeof(int32_t))
            if due == NULL:
                return -1
            if found[1 - slot] > 0:
                memcpy(due + (1 - slot) * length, self.due + (1 - slot) * half[0], found[1 - slot] * sizeof(int32_t))
            free(self.due)
            self.due = due
            self.due_capacity = 2 * length
            half[0] = length
        found[slot] = self._due_entries(sensor, self.due + slot * half[0])
        return 0

    cdef void _still_moved(self, int32_t sensor, int32_t found) noexcept nogil:
        """After a failure: a sensor whose due entries were found but not tested stays moved, for the
        next update to re-test."""
        if found >= 0:
            self.core.proxies[sensor].flags = (self.core.proxies[sensor].flags & ~PROXY_SEEN) | PROXY_MOVED

    cdef int32_t _due_entries(self, int32_t sensor, int32_t *due) noexcept nogil:
        """Stage 1 of a moved sensor's pass: put in `due` the entries of its list whose budgets the
        drifts may have used up, and fetch the first few partners' boxes. -1 when the sensor has no
        pass to make (destroyed since, or listed twice); else marked as re-tested, like _retest does."""
        cdef TreeCore *t = &self.core
        cdef const Partners *mine = &self.partners[sensor]
        cdef const int32_t *items = items_of(mine)
        cdef const double *budgets = budgets_of(mine)
        cdef double own = self.drift[sensor]
        cdef int32_t n = 0, k
        if (t.proxies[sensor].flags & (PROXY_LIVE | PROXY_MOVED)) != (PROXY_LIVE | PROXY_MOVED):
            return -1
        t.proxies[sensor].flags = (t.proxies[sensor].flags & ~PROXY_MOVED) | PROXY_SEEN
        for k in range(mine.count):
            due[n] = k
            n += budgets == NULL or own + self.drift[items[k] >> 1] >= budgets[k]
        for k in range(min(n, DUE_AHEAD)):
            prefetch(t.proxies[items[due[k]] >> 1].tight)
        return n

    cdef int _test_due(self, int32_t sensor, const int32_t *due, int32_t n) noexcept nogil:
        """Stage 2 of a moved sensor's pass: test its `n` due entries exactly (the shape computed once
        for them all; a sphere's two entries at a time where sphere_two exists), set their budgets
        anew, and gather the flips for the partners' side."""
        cdef TreeCore *t = &self.core
        cdef const int32_t *items = items_of(&self.partners[sensor])
        cdef int64_t entered = self.entered.count, left = self.left.count
        cdef int32_t d = 0, k, ahead
        cdef int inside[2]
        cdef int now[2]
        cdef double slack[2]
        cdef Shape shape
        if n < 0:
            return 0
        shape_of(&shape, t.proxies[sensor].tight, t.proxies[sensor].flags, t.dims, self.sensor_margin)
        if SPHERE_TWO and shape.sphere:
            while d + 1 < n:
                for ahead in range(d + DUE_AHEAD, min(d + DUE_AHEAD + 2, n)):
                    prefetch(t.proxies[items[due[ahead]] >> 1].tight)
                inside[0] = (items[due[d]] & TOUCHING) != 0
                inside[1] = (items[due[d + 1]] & TOUCHING) != 0
                sphere_two(&shape, t.proxies[items[due[d]] >> 1].tight, t.proxies[items[due[d + 1]] >> 1].tight,
                           inside, now, slack)
                if (self._decided(sensor, due[d], now[0], slack[0]) != 0
                        or self._decided(sensor, due[d + 1], now[1], slack[1]) != 0):
                    return -1
                d += 2
        while d < n:
            if d + DUE_AHEAD < n:
                prefetch(t.proxies[items[due[d + DUE_AHEAD]] >> 1].tight)
            k = due[d]
            now[0] = shape_touches(&shape, t.proxies[items[k] >> 1].tight, (items[k] & TOUCHING) != 0, &slack[0])
            if self._decided(sensor, k, now[0], slack[0]) != 0:
                return -1
            d += 1
        # Found in proxy order: sorted here, a few rows each (see _events_by_id).
        sort_pairs(self.entered.pairs + entered, self.entered.count - entered)
        sort_pairs(self.left.pairs + left, self.left.count - left)
        return 0

    cdef inline int _decided(self, int32_t sensor, int32_t k, bint now, double slack) noexcept nogil:
        """Entry k of a moved sensor's list tested (`now`, with `slack`): its budget set anew, and when
        its bit flips, the flip gathered for the partner's side and the event recorded."""
        cdef TreeCore *t = &self.core
        cdef Partners *mine = &self.partners[sensor]
        cdef int32_t *items = items_of(mine)
        cdef double *budgets = budgets_of(mine)
        cdef int32_t other = items[k] >> 1
        cdef int64_t capacity
        cdef int32_t *flips
        if budgets != NULL:
            budgets[k] = budget(slack, self.drift[sensor], self.drift[other])
        if now == ((items[k] & TOUCHING) != 0):
            return 0
        if self.flip_count == self.flip_capacity:
            capacity = max(<int64_t>256, 2 * self.flip_capacity)
            flips = <int32_t *>realloc(self.flips, 2 * capacity * sizeof(int32_t))
            if flips == NULL:
                return -1
            self.flips = flips
            self.flip_capacity = capacity
        items[k] ^= TOUCHING
        self.flips[2 * self.flip_count] = other
        self.flips[2 * self.flip_count + 1] = sensor
        self.flip_count += 1
        self.inside += 1 if now else -1
        return rows_push(&self.entered if now else &self.left, t.proxies[sensor].id, t.proxies[other].id)

    cdef int _visit_sensor(self, int32_t sensor, int32_t visitor, int32_t *entry) noexcept nogil:
        """A moved proxy re-tests a sensor partner (on the proxy's side of the pair, `entry`): a proxy
        outside enters when it touches the shape; one inside leaves when it no longer touches the
        shape grown by the sensor margin. Between the two nothing changes."""
        cdef TreeCore *t = &self.core
        cdef Partners *sensor_list = &self.partners[sensor]
        cdef bint inside = (entry[0] & TOUCHING) != 0
        cdef bint now
        cdef int32_t *theirs
        cdef double *budgets
        cdef double slack
        cdef Shape shape
        shape_of(&shape, t.proxies[sensor].tight, t.proxies[sensor].flags, t.dims, self.sensor_margin)
        now = shape_touches(&shape, t.proxies[visitor].tight, inside, NULL)
        if now == inside:
            return 0    # the sensor's budget for the pair still holds: it counts this move's drift
        entry[0] ^= TOUCHING
        theirs = partners_find(sensor_list, visitor)
        theirs[0] ^= TOUCHING
        budgets = budgets_of(sensor_list)
        if budgets != NULL:
            shape_touches(&shape, t.proxies[visitor].tight, now, &slack)
            budgets[theirs - items_of(sensor_list)] = budget(slack, self.drift[sensor], self.drift[visitor])
        self.inside += 1 if now else -1
        return rows_push(&self.entered if now else &self.left, t.proxies[sensor].id, t.proxies[visitor].id)

    def pairs(self):
        """All current pairs, `(m, 2)` uint64 rows a < b, sorted. Exact even with moves pending."""
        cdef PairBuffer buffer
        cdef int status
        memset(&buffer, 0, sizeof(PairBuffer))
        with nogil:
            status = self._current_pairs(&buffer)
        if status != 0:
            pairs_free(&buffer)
            raise MemoryError()
        return pair_array(&buffer)

    cdef int _current_pairs(self, PairBuffer *out) noexcept nogil:
        cdef TreeCore *t = &self.core
        cdef int32_t proxy, other, k
        cdef int32_t *items
        if self.track_pairs and self.moved_count == 0 and self.ended.count == 0:
            # Nothing changed since update(): the touching partners are the answer.
            for proxy in range(t.proxy_capacity):
                if t.proxies[proxy].flags & PROXY_LIVE:
                    items = items_of(&self.partners[proxy])
                    for k in range(self.partners[proxy].count):
                        other = items[k] >> 1
                        if (items[k] & TOUCHING and other > proxy and not is_sensor(t, proxy) and not is_sensor(t, other)
                                and pairs_push(out, t.proxies[proxy].id, t.proxies[other].id) != 0):
                            return -1
            sort_pairs(out.pairs, out.count)
            return 0
        return self_pairs(t, out, self.groups, self.masks)

    cdef uint32_t _skip(self, bint include_sensors):
        return PROXY_SENSOR if self.sensor_count and not include_sensors else 0

    def query_aabb(self, boxes, mask=None, include_sensors=False):
        """CSR `(offsets, hits)` over static and dynamic proxies; `mask` keeps proxies whose group
        shares a bit with it. Sensors are skipped unless `include_sensors`, as in every query."""
        if mask is None:
            return self._query_aabb(boxes, 0xFFFFFFFF, NULL, self._skip(include_sensors))
        return self._query_aabb(boxes, validation.as_mask(mask), self.groups, self._skip(include_sensors))

    def query_sphere(self, centers, radii, mask=None, include_sensors=False):
        if mask is None:
            return self._query_sphere(centers, radii, 0xFFFFFFFF, NULL, self._skip(include_sensors))
        return self._query_sphere(centers, radii, validation.as_mask(mask), self.groups, self._skip(include_sensors))

    def raycast(self, segments, first_hit=False, mask=None, include_sensors=False):
        if mask is None:
            return self._raycast(segments, bool(first_hit), 0xFFFFFFFF, NULL, self._skip(include_sensors))
        return self._raycast(segments, bool(first_hit), validation.as_mask(mask), self.groups,
                             self._skip(include_sensors))

    def query_frustum(self, planes, mask=None, include_sensors=False):
        if mask is None:
            return self._query_frustum(planes, 0xFFFFFFFF, NULL, self._skip(include_sensors))
        return self._query_frustum(planes, validation.as_mask(mask), self.groups, self._skip(include_sensors))

    def query_nearest(self, points, k, max_distance=math.inf, mask=None, include_sensors=False):
        if mask is None:
            return self._query_nearest(points, k, max_distance, 0xFFFFFFFF, NULL, self._skip(include_sensors))
        return self._query_nearest(points, k, max_distance, validation.as_mask(mask), self.groups,
                                   self._skip(include_sensors))

    def cast_box(self, boxes, displacements, first_hit=False, mask=None, include_sensors=False):
        if mask is None:
            return self._cast_box(boxes, displacements, bool(first_hit), 0xFFFFFFFF, NULL, self._skip(include_sensors))
        return self._cast_box(boxes, displacements, bool(first_hit), validation.as_mask(mask), self.groups,
                              self._skip(include_sensors))

    def cast_sphere(self, centers, radii, displacements, first_hit=False, mask=None, include_sensors=False):
        if mask is None:
            return self._cast_sphere(centers, radii, displacements, bool(first_hit), 0xFFFFFFFF, NULL,
                                     self._skip(include_sensors))
        return self._cast_sphere(centers, radii, displacements, bool(first_hit), validation.as_mask(mask),
                                 self.groups, self._skip(include_sensors))

    cdef const uint32_t *_groups(self) noexcept:
        return self.groups

    def stats(self):
        info = TreeBase.stats(self)
        cdef int64_t listed = 0, partner_bytes = 0
        cdef int32_t i
        for i in range(self.slot_capacity):
            listed += self.partners[i].count
            if self.partners[i].capacity != INLINE_PARTNERS:
                partner_bytes += self.partners[i].capacity * (
                    sizeof(int32_t) + (sizeof(double) if is_sensor(&self.core, i) else 0))
        info["pairs"] = self.touching
        info["sensors"] = self.sensor_count
        info["sensor_pairs"] = self.inside
        info["fat_pairs"] = listed // 2
        info["pending_moves"] = self.moved_count
        info["track_pairs"] = self.track_pairs
        info["memory_bytes"] += (self.slot_capacity * (2 * sizeof(uint32_t) + sizeof(Partners)
                                                       + (sizeof(double) if self.drift != NULL else 0))
                                 + partner_bytes + (self.moved_capacity + self.due_capacity) * sizeof(int32_t)
                                 + self.flip_capacity * 2 * sizeof(int32_t) + index_bytes(&self.sensor_index)
                                 + (self.ended.capacity + self.entered.capacity + self.left.capacity
                                    + self.leaving.capacity + self.sensor_edits.capacity) * sizeof(IdPair))
        return info

    def validate(self):
        """Tree invariants, then the partner lists: sorted, symmetric with the same touching bit,
        between live proxies that may pair; with nothing pending, exactly the pairs of overlapping
        fat boxes within reach (a sphere sensor's: touching its ball), marked touching exactly where
        the tight boxes overlap; a sensor pair marked inside only where the proxy touches the grown
        shape, and outside only where it does not touch the shape; and, pending or not, each sensor
        pair that a re-test would pass over (its budget not yet reached) already decided as a test
        would decide it (partners_check in _check.pyx)."""
        TreeBase.validate(self)
        cdef ListCounts counts
        cdef int64_t fat_pairs
        cdef bint settled = (self.track_pairs and self.moved_count == 0 and self.ended.count == 0
                             and self.leaving.count == 0)
        cdef const char *problem = partners_check(&self.core, self.partners, self.slot_capacity, self.groups,
                                                  self.masks, self.drift, self.sensor_margin, settled, &counts)
        if problem != NULL:
            raise RuntimeError(f"dbvt invariant broken: {problem.decode()}")
        if settled:
            fat_pairs = fat_pairs_count(&self.core, self.groups, self.masks)
            if fat_pairs < 0:
                raise MemoryError()
            if counts.listed // 2 != fat_pairs:
                raise RuntimeError("dbvt invariant broken: pairs of fat boxes within reach are missing")
        if counts.listed != self.listed or counts.touching != 2 * self.touching or counts.inside != self.inside:
            raise RuntimeError("dbvt invariant broken: the counts of listed, touching and inside pairs drifted")
        if counts.sensor_entries % 2 or counts.sensors != self.sensor_count:
            raise RuntimeError("dbvt invariant broken: the sensors are miscounted")

    cdef int _reach_balls(self) except -1:
        """After loading: a sphere sensor saved before its reach was a ball (its fat box any box, its
        list every proxy that box overlaps) gets a cube if it needs one, and its partners are found
        again at the next update(). No event comes of it: a proxy inside stays within reach."""
        cdef TreeCore *t = &self.core
        cdef int32_t proxy, k
        cdef int32_t *items
        cdef bint stale
        cdef float tight[6]
        if self.sensor_count == 0:
            return 0
        self._reserve(0, self.sensor_count)
        for proxy in range(self.slot_capacity):
            if (t.proxies[proxy].flags & (PROXY_LIVE | PROXY_SENSOR_SPHERE)) != (PROXY_LIVE | PROXY_SENSOR_SPHERE):
                continue
            memcpy(tight, t.proxies[proxy].tight, sizeof(tight))
            stale = self._move_proxy(proxy, tight)
            items = items_of(&self.partners[proxy])
            for k in range(self.partners[proxy].count):
                stale = stale or not reach_allows(t, proxy, items[k] >> 1)
            if stale:
                self._mark_moved(proxy, True)
        return 0

    def to_bytes(self):
        """The tree, then per-proxy groups and masks, the partner lists, pending moves and ends.

        A world's snapshot is taken on its own thread while it waits, so the copying runs in C.
        """
        cdef int32_t i, k
        cdef int64_t total = 0, at = 0
        for i in range(self.slot_capacity):
            total += self.partners[i].count
        capacity = self.core.proxy_capacity
        groups = np.zeros(capacity, np.uint32)
        masks = np.zeros(capacity, np.uint32)
        counts = np.zeros(capacity, np.int32)
        items = np.empty(total, np.int32)
        moved = np.empty(self.moved_count, np.int32)
        ended = np.empty((self.ended.count, 2), np.uint64)
        cdef uint32_t[::1] group_view = groups, mask_view = masks
        cdef int32_t[::1] count_view = counts, item_view = items, moved_view = moved
        cdef uint64_t[:, ::1] ended_view = ended
        cdef const int32_t *entries
        with nogil:
            for i in range(self.slot_capacity):
                group_view[i] = self.groups[i]
                mask_view[i] = self.masks[i]
                count_view[i] = self.partners[i].count
                entries = items_of(&self.partners[i])
                for k in range(self.partners[i].count):
                    item_view[at] = entries[k]
                    at += 1
            for k in range(self.moved_count):
                moved_view[k] = self.moved[k]
            for k in range(self.ended.count):
                ended_view[k, 0] = self.ended.pairs[k].a
                ended_view[k, 1] = self.ended.pairs[k].b
        state = _STATE.pack(self.track_pairs, self.moved_count, self.ended.count, total, self.leaving.count,
                            self.sensor_margin)
        return b"".join([self._tree_bytes(), state, groups.data, masks.data, counts.data, items.data,
                         moved.data, ended.data, _pair_copy(&self.leaving).data])

    @classmethod
    def from_bytes(cls, data, *, threads=1):
        cdef Broadphase bp = cls(threads=threads)
        view = memoryview(data).cast("B")
        at = bp._load_tree(view)
        if len(view) < at + _STATE.size:
            raise ValueError("data is too short for a dbvt broadphase")
        (track_pairs, moved_count, ended_count, total, leaving_count,
         sensor_margin) = _STATE.unpack(bytes(view[at:at + _STATE.size]))
        bp.track_pairs = bool(track_pairs)
        bp.sensor_margin = validation.check_sensor_margin(sensor_margin)
        at += _STATE.size
        capacity = bp.core.proxy_capacity
        sizes = [4 * capacity, 4 * capacity, 4 * capacity, 4 * total, 4 * moved_count, 16 * ended_count,
                 16 * leaving_count]
        if min(sizes) < 0 or len(view) != at + sum(sizes):
            raise ValueError("corrupt dbvt broadphase data: wrong length")
        arrays = []
        for size, dtype in zip(sizes, [np.uint32, np.uint32, np.int32, np.int32, np.int32, np.uint64, np.uint64]):
            arrays.append(np.frombuffer(view[at:at + size], dtype))
            at += size
        groups, masks, counts, items, moved, ended, leaving = arrays
        if (counts < 0).any() or counts.sum() != total or ((items < 0) | ((items >> 1) >= capacity)).any():
            raise ValueError("corrupt dbvt broadphase data: partner lists out of range")
        if ((moved < 0) | (moved >= capacity)).any():
            raise ValueError("corrupt dbvt broadphase data: moved proxies out of range")
        bp._reserve(0, moved_count)
        cdef const uint32_t[::1] group_view = groups, mask_view = masks
        cdef const int32_t[::1] count_view = counts, item_view = items, moved_view = moved
        cdef const uint64_t[::1] ended_view = ended
        cdef const uint64_t[::1] leaving_view = leaving
        cdef int32_t i, k, slots = capacity
        cdef int64_t offset = 0, e, moves = moved_count, ends = ended_count, leaves = leaving_count
        cdef int failed = 0
        cdef int32_t *entries
        cdef double *budgets
        cdef bint sensor
        with nogil:
            for i in range(slots):
                bp.groups[i] = group_view[i]
                bp.masks[i] = mask_view[i]
                sensor = is_sensor(&bp.core, i)
                if count_view[i] and partners_reserve(&bp.partners[i], count_view[i], sensor) != 0:
                    failed = 1
                    break
                entries = items_of(&bp.partners[i])
                budgets = budgets_of(&bp.partners[i]) if sensor else NULL
                for k in range(count_view[i]):
                    entries[k] = item_view[offset + k]
                    if budgets != NULL:     # budgets are not saved: the sensors' next moves test all
                        budgets[k] = -INFINITY
                bp.partners[i].count = count_view[i]
                offset += count_view[i]
            for e in range(moves):
                bp.moved[e] = moved_view[e]
            for e in range(ends):
                if not failed and pairs_push(&bp.ended, ended_view[2 * e], ended_view[2 * e + 1]) != 0:
                    failed = 1
            for e in range(leaves):
                if not failed and rows_push(&bp.leaving, leaving_view[2 * e], leaving_view[2 * e + 1]) != 0:
                    failed = 1
            bp._count_touching()
        if failed:
            raise MemoryError()
        if bp.sensor_count:
            bp._track_drift()
        bp.moved_count = moved_count
        bp.listed = total
        bp._reach_balls()
        try:
            bp.validate()
        except RuntimeError as exc:
            raise ValueError(f"corrupt dbvt broadphase data: {exc}") from None
        return bp
