# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""An update's stages (see _finding.pxd). Every proxy's answer depends on the world and the proxy alone,
and comes out in its place, so the answers found on several threads, or in packets, are those found
one by one; the changes made on threads leave every list as one thread leaves it."""
from libc.stdlib cimport calloc, free, malloc
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcpy, memmove, memset

from dbvt._batch cimport pairs_extend, pairs_free, pairs_push
from dbvt._build cimport radix_sort
from dbvt._core cimport (
    PACKET_LANES, PREFETCH_AHEAD, PROXY_LIVE, PROXY_MOVED, PROXY_REFAT, PROXY_SEEN, PROXY_SENSOR, QUERY_FAT_PACKET,
    Packet, grow_array, hits_free, prefetch, ref_box, spread_by_one, spread_by_two, stack_free,
)
from dbvt._parallel cimport (
    add_fetch, byte_get, byte_set, counter_get, counter_set, dbvt_counter, run_parts, runs_init, runs_take,
)
from dbvt._partners cimport (
    TOUCHING, items_of, partners_erase, partners_find, partners_insert, partners_reserve, tight_overlap,
)


cdef enum:
    # Under a limit, a thread adds what its lists would gain to the shared count once it is this many
    # entries (or its chunk ends): a pile of boxes on one spot stops within a few lists of the limit.
    PUBLISH_EVERY = 4096


ctypedef struct Limit:              # update(max_fat_pairs=...) on threads: what the lists may still gain
    int64_t room                    # entries; -1: no limit
    int64_t gained                  # what the threads have added of their gains (add_fetch)
    dbvt_counter stopped            # set once `gained` passed `room`: every thread stops


cdef inline bint past_limit(Limit *limit, int64_t *tally, int64_t gain, bint chunk_end) noexcept nogil:
    """Add a proxy's gain to a thread's own tally, and the tally to the shared count every
    PUBLISH_EVERY entries and at the end of a chunk; whether the threads must stop."""
    tally[0] += gain
    if tally[0] >= PUBLISH_EVERY or chunk_end:
        if add_fetch(&limit.gained, tally[0]) > limit.room:
            counter_set(&limit.stopped, 1)
        tally[0] = 0
    return counter_get(&limit.stopped)


cdef inline int side_gain(const TreeCore *t, int32_t proxy, int32_t other) noexcept nogil:
    """The entries a new pair adds to the lists: both sides, but a pair of two refreshed proxies is
    counted once, at the lower of the two."""
    if not (t.proxies[other].flags & PROXY_REFAT) or proxy < other:
        return 2
    return 0


cdef inline int merged_gain(const TreeCore *t, unsigned char *merged, int32_t other) noexcept nogil:
    """side_gain of a new pair when the refreshed proxies merge out of order (refresh_all): counted by
    whichever merges first, so a stop before the other merges (whose side the pending edits then
    make) has counted it. Two merging at once may both count it: the count errs high, never low."""
    if not (t.proxies[other].flags & PROXY_REFAT):
        return 2
    return 0 if byte_get(&merged[other]) else 2


cdef int64_t list_gain(const TreeCore *t, const Partners *p, int32_t proxy, const int32_t *found,
                       int64_t count, unsigned char *merged) noexcept nogil:
    """What merging the partners found for `proxy` (sorted) would add to all lists' entries, with
    side_gain's count (merged_gain's for new pairs, given `merged`, per proxy slot): summed over the refreshed
    proxies, the lists' gain once all are merged. A pair dropped is counted at the lower proxy in
    either case: if the higher drops it first and the threads stop, the count errs high."""
    cdef const int32_t *items = items_of(p)
    cdef int64_t i = 0, j = 0, gain = 0
    while i < p.count or j < count:
        if j == count or (i < p.count and (items[i] >> 1) < found[j]):
            gain -= side_gain(t, proxy, items[i] >> 1)
            i += 1
        elif i == p.count or found[j] < (items[i] >> 1):
            gain += merged_gain(t, merged, found[j]) if merged != NULL else side_gain(t, proxy, found[j])
            j += 1
        else:
            i += 1
            j += 1
    return gain


ctypedef struct Chunks:             # a job's chunks of FIND_CHUNK proxies, taken a run a thread first
    Runs runs
    int64_t n                       # proxies


cdef void chunks_init(Chunks *c, int64_t n, int threads) noexcept nogil:
    c.n = n
    runs_init(&c.runs, (n + FIND_CHUNK - 1) // FIND_CHUNK, threads)


cdef inline bint take_chunk(Chunks *c, int worker, int64_t *chunk, int64_t *start, int64_t *end) noexcept nogil:
    """The next chunk `worker` takes (see Runs: the edits and flips that follow are cut by slot range,
    as the runs are); False when none is left."""
    if not runs_take(&c.runs, worker, chunk):
        return False
    start[0] = chunk[0] * FIND_CHUNK
    end[0] = min(start[0] + FIND_CHUNK, c.n)
    return True


cdef enum:
    ORDER_BITS = 10                 # per axis in 3-D (15 in 2-D): packet_order's Morton cells


ctypedef struct Ordering:           # packet_order's work, cut by the threads' runs
    const TreeCore *t
    const int32_t *proxies
    int64_t n
    const Runs *runs                # NULL: one run
    uint64_t *keys
    uint64_t *scratch
    int64_t *order
    double low[3]                   # the Morton cells: the root's box...
    double scale[3]                 # ...cut into (1 << ORDER_BITS) a side in 3-D


cdef void order_part(void *context, int part) noexcept nogil:
    """The Morton order of one run of the proxies, by their fat boxes' centres."""
    cdef Ordering *o = <Ordering *>context
    cdef const TreeCore *t = o.t
    cdef int64_t lo = o.runs.first[part] * FIND_CHUNK if o.runs != NULL else 0
    cdef int64_t hi = min(o.n, o.runs.first[part + 1] * FIND_CHUNK) if o.runs != NULL else o.n
    cdef const uint64_t *ordered
    cdef const float *fat
    cdef uint64_t code, cell
    cdef int64_t i
    cdef int axis
    for i in range(lo, hi):
        fat = t.proxies[o.proxies[i]].fat
        code = 0
        for axis in range(t.dims):
            cell = <uint64_t>((0.5 * (<double>fat[axis] + fat[axis + 3]) - o.low[axis]) * o.scale[axis])
            code |= (spread_by_two(cell) if t.dims == 3 else spread_by_one(cell)) << axis
        o.keys[i] = code << 32 | <uint64_t>i
    ordered = radix_sort(o.keys + lo, o.scratch + lo, hi - lo, 32, 3, ORDER_BITS, 1)
    for i in range(hi - lo):
        o.order[lo + i] = <int64_t><uint32_t>ordered[i]


cdef int packet_order(const TreeCore *t, const int32_t *proxies, int64_t n, const Runs *runs, int64_t **order,
                      bint *together) noexcept nogil:
    """The order in which next_packet takes `proxies` (`order`: positions in it, NULL for their own),
    and whether it takes them in packets (`together`). When at least one proxy in PACK_FROM_SHARE
    refreshes: along a Morton curve of their fat boxes' centres, so that a packet's proxies are
    neighbours in space. (The proxies' own order follows the tree's only until its leaves have moved
    about: in a dense scene, packets of four in that order saved an eighth of the visits, in the
    tree's order half.) With the threads' `runs` of chunks, within each run, on as many threads: a
    thread then still takes the proxies of its own range of slots, whose lists it edits after, and
    reading their fat boxes, scattered over the pool, is no serial stage. Fewer, spread over a large
    tree, share only its top levels, which stay in cache anyway: they go one by one, in their order,
    as does a run of fewer than FIND_CHUNK. -1 when memory ran out."""
    cdef Ordering o
    cdef const float *world
    cdef double top = (1 << ORDER_BITS) - 1 if t.dims == 3 else (1 << (3 * ORDER_BITS // 2)) - 1
    cdef int axis
    order[0] = NULL
    together[0] = n * PACK_FROM_SHARE >= t.proxy_count
    if n < FIND_CHUNK or not together[0]:
        return 0
    o.order = <int64_t *>malloc(n * sizeof(int64_t))
    o.keys = <uint64_t *>malloc(n * sizeof(uint64_t))
    o.scratch = <uint64_t *>malloc(n * sizeof(uint64_t))
    if o.order == NULL or o.keys == NULL or o.scratch == NULL:
        free(o.order)
        free(o.keys)
        free(o.scratch)
        return -1
    # Every fat box lies within the root's box.
    world = ref_box(t, t.root)
    for axis in range(t.dims):
        o.low[axis] = world[axis]
        o.scale[axis] = top / (<double>world[axis + 3] - world[axis]) if world[axis + 3] > world[axis] else 0.0
    o.t, o.proxies, o.n, o.runs = t, proxies, n, runs
    run_parts(order_part, &o, runs.runs if runs != NULL else 1)
    free(o.keys)
    free(o.scratch)
    order[0] = o.order
    return 0


cdef inline int64_t place(const int64_t *order, int64_t position) noexcept nogil:
    return order[position] if order != NULL else position


cdef int next_packet(const Finder *f, const int32_t *proxies, const int64_t *order, int64_t *position,
                     int64_t end, bint together, Packets *p) noexcept nogil:
    """The partners of the next proxies from proxies[order[position]] on (before proxies[order[end]];
    without an `order`, from proxies[position] on), what find_partners finds for each: `together`, up
    to PACKET_LANES proxies that are no sensors in one walk (QUERY_FAT_PACKET); else, or for a sensor, one
    alone. `p.count` lanes hold them; `position` moves past them."""
    cdef const TreeCore *t = f.t
    cdef Packet packet
    cdef Query q
    cdef int32_t proxy
    cdef int k, axis
    p.count = 0
    for k in range(PACKET_LANES):
        p.lanes[k].count = 0
    if not together or t.proxies[proxies[place(order, position[0])]].flags & PROXY_SENSOR:
        p.at[0] = place(order, position[0])
        p.count = 1
        position[0] += 1
        return find_partners(f, proxies[p.at[0]], &p.stack, &p.lanes[0])
    while (position[0] < end and p.count < PACKET_LANES
           and not (t.proxies[proxies[place(order, position[0])]].flags & PROXY_SENSOR)):
        p.at[p.count] = place(order, position[0])
        p.count += 1
        position[0] += 1
    memset(&packet, 0, sizeof(Packet))
    for k in range(p.count):
        for axis in range(3):
            packet.lo[axis][k] = t.proxies[proxies[p.at[k]]].fat[axis]
            packet.hi[axis][k] = t.proxies[proxies[p.at[k]]].fat[axis + 3]
    q.kind = QUERY_FAT_PACKET
    q.packet = &packet
    q.lanes = (1u << p.count) - 1
    q.groups = NULL
    q.skip_flags = PROXY_SENSOR if f.sensors else 0
    if walk(t, &q, &p.stack, p.lanes) != 0:
        return -1
    for k in range(p.count):
        proxy = proxies[p.at[k]]
        fat_query(f, proxy, &q)
        if settle_partners(f, proxy, &q, &p.stack, &p.lanes[k], 0) != 0:
            return -1
    return 0


cdef void packets_free(Packets *p) noexcept nogil:
    cdef int k
    for k in range(PACKET_LANES):
        hits_free(&p.lanes[k])
    stack_free(&p.stack)


cdef int hits_append(Hits *hits, const Hits *more) noexcept nogil:
    """Append `more`'s proxies (and their fractions, where a merge keeps budgets meanwhile)."""
    cdef int64_t need = hits.count + more.count, capacity = hits.capacity
    # The two arrays grow alike, from one capacity.
    if (grow_array(<void **>&hits.proxies, &capacity, need, sizeof(int32_t)) != 0
            or grow_array(<void **>&hits.fractions, &hits.capacity, need, sizeof(double)) != 0):
        return -1
    memcpy(hits.proxies + hits.count, more.proxies, more.count * sizeof(int32_t))
    memcpy(hits.fractions + hits.count, more.fractions, more.count * sizeof(double))
    hits.count += more.count
    return 0


ctypedef struct FindJob:
    const Finder *f
    const Partners *partners        # the lists, to tell which found the partners they hold
    const int32_t *proxies
    int64_t *order                  # packet_order(proxies): the chunks are runs of it...
    bint together                   # ...and whether they go in packets
    int64_t n
    Found *out
    Limit limit
    Chunks chunks
    dbvt_counter failed


cdef inline bint same_partners(const Partners *p, const int32_t *found, int64_t count) noexcept nogil:
    cdef const int32_t *items = items_of(p)
    cdef int64_t k
    if count != p.count:
        return False
    for k in range(count):
        if (items[k] >> 1) != found[k]:
            return False
    return True


cdef void find_worker(void *context, int worker) noexcept nogil:
    """Take chunks until none is left. The thread's packets and hits are its own locals while it
    works, and the hits go to `out` at the end: side by side in one array, the two threads' counters
    would share a cache line that both write at every hit (measured: twice the CPU time of one
    thread)."""
    cdef FindJob *job = <FindJob *>context
    cdef Packets packets
    cdef Hits hits
    cdef int64_t chunk, start, end, position, i, tally = 0
    cdef int k
    cdef bint stop = False
    cdef const Partners *mine
    cdef const Hits *found
    memset(&packets, 0, sizeof(Packets))
    memset(&hits, 0, sizeof(Hits))
    while (not stop and not counter_get(&job.failed) and not counter_get(&job.limit.stopped)
           and take_chunk(&job.chunks, worker, &chunk, &start, &end)):
        position = start
        while not stop and position < end:
            if next_packet(job.f, job.proxies, job.order, &position, end, job.together, &packets) != 0:
                counter_set(&job.failed, 1)
                stop = True
                break
            for k in range(packets.count):
                i = packets.at[k]
                found = &packets.lanes[k]
                job.out.first[i] = hits.count
                job.out.worker[i] = worker
                mine = &job.partners[job.proxies[i]]
                # Past the limit, this proxy's partners are the last found.
                stop = job.limit.room >= 0 and past_limit(&job.limit, &tally, list_gain(
                    job.f.t, mine, job.proxies[i], found.proxies, found.count, NULL),
                    position == end and k + 1 == packets.count)
                # In a dense scene most refreshed lists come out as they were: the merge can skip them.
                if not stop and same_partners(mine, found.proxies, found.count):
                    job.out.count[i] = UNCHANGED
                    continue
                job.out.count[i] = <int32_t>found.count
                if hits_append(&hits, found) != 0:
                    counter_set(&job.failed, 1)
                    stop = True
                if stop:
                    break
    packets_free(&packets)
    job.out.hits[worker] = hits


cdef int find_all(const Finder *f, const Partners *partners, const int32_t *proxies, int64_t n, int threads,
                  int64_t room, Found *out) noexcept nogil:
    """The partners of each of `proxies` into `out` (empty), on up to `threads` threads, in chunks of
    FIND_CHUNK proxies that the threads take in turn (a thread slowed by other work takes fewer); a
    proxy whose list holds them already gets the count UNCHANGED, and no partners. With `room` (not
    -1), the threads stop once merging what they found would add more entries than that to the
    lists: the proxies left get the count NOT_FOUND."""
    cdef FindJob job
    cdef int64_t i
    out.workers = <int>max(1, min(<int64_t>threads, n // FIND_CHUNK))
    out.hits = <Hits *>calloc(out.workers, sizeof(Hits))
    out.first = <int64_t *>malloc(max(n, 1) * sizeof(int64_t))
    out.count = <int32_t *>malloc(max(n, 1) * sizeof(int32_t))
    out.worker = <int32_t *>malloc(max(n, 1) * sizeof(int32_t))
    if out.hits == NULL or out.first == NULL or out.count == NULL or out.worker == NULL:
        return -1
    for i in range(n):
        out.count[i] = NOT_FOUND
    job.f = f
    job.partners = partners
    job.proxies = proxies
    job.n = n
    job.out = out
    job.limit.room = room
    job.limit.gained = 0
    counter_set(&job.limit.stopped, 0)
    chunks_init(&job.chunks, n, out.workers)
    if packet_order(f.t, proxies, n, &job.chunks.runs, &job.order, &job.together) != 0:
        return -1
    counter_set(&job.failed, 0)
    run_parts(find_worker, &job, out.workers)
    free(job.order)
    return -1 if counter_get(&job.failed) else 0


cdef void found_free(Found *found) noexcept nogil:
    cdef int i
    if found.hits != NULL:
        for i in range(found.workers):
            hits_free(&found.hits[i])
    free(found.hits)
    free(found.first)
    free(found.count)
    free(found.worker)
    memset(found, 0, sizeof(Found))


ctypedef struct PickJob:
    const TreeCore *t
    const int32_t *moved
    int64_t n
    int parts
    bint retests
    Picked *out
    int32_t *sensors                # each part's stage 1 sensors, from its first row on
    int64_t *counts                 # per part: its stage 1 proxies, sensors, stage 2 proxies, moved sensors


cdef inline int64_t run_start(const int32_t *moved, int64_t n, int part, int parts) noexcept nogil:
    """Where a part's rows of `moved` start: an equal share, moved on past a run of one proxy's rows,
    which its first part takes whole."""
    cdef int64_t i = n * part // parts
    while 0 < i < n and moved[i - 1] == moved[i]:
        i += 1
    return i


cdef void pick_part(void *context, int part) noexcept nogil:
    """A part's picks, written from its first row on, in its place of each list."""
    cdef PickJob *job = <PickJob *>context
    cdef const TreeCore *t = job.t
    cdef int64_t first = run_start(job.moved, job.n, part, job.parts)
    cdef int64_t last = run_start(job.moved, job.n, part + 1, job.parts), i
    cdef int64_t refat = first, sensors = first, retest = first, moving = first
    cdef int32_t proxy
    cdef uint32_t flags
    cdef bint fresh, sensor
    for i in range(first, last):
        proxy = job.moved[i]
        if i and job.moved[i - 1] == proxy:
            continue
        flags = t.proxies[proxy].flags
        fresh = (flags & (PROXY_LIVE | PROXY_REFAT)) == (PROXY_LIVE | PROXY_REFAT)
        sensor = (flags & PROXY_SENSOR) != 0
        job.out.refat[refat] = proxy
        refat += fresh and not sensor
        job.sensors[sensors] = proxy
        sensors += fresh and sensor
        job.out.sensors[moving] = proxy
        moving += sensor
        if job.retests:
            job.out.retest[retest] = proxy
            retest += (flags & (PROXY_LIVE | PROXY_MOVED)) == (PROXY_LIVE | PROXY_MOVED) and not sensor
    job.counts[4 * part] = refat - first
    job.counts[4 * part + 1] = sensors - first
    job.counts[4 * part + 2] = retest - first
    job.counts[4 * part + 3] = moving - first


cdef int pick_moved(const TreeCore *t, const int32_t *moved, int64_t n, int parts, bint retests,
                    Picked *out) noexcept nogil:
    """The proxies each stage of an update takes from `moved` (ascending), each once and ascending by
    kind: stage 1's, the live ones with new fat boxes, those that are no sensors first; with
    `retests`, stage 2's for the threads, the live ones still moved that are no sensors; and the
    moved sensors, whose passes stage 2 makes first. One pass
    over their flags, cut into `parts` runs of the moved (one a thread): a pass over the flags of
    100,000 moved proxies, a cache line each, took some 0.7 ms, and each stage made its own alone on
    the calling thread. Stage 1 leaves the flags stage 2 reads as they were."""
    cdef PickJob job
    cdef int part
    cdef int64_t refat = 0, sensors = 0, retest = 0, moving = 0, first
    out.refat = <int32_t *>malloc(max(n, 1) * sizeof(int32_t))
    out.retest = <int32_t *>malloc(max(n, 1) * sizeof(int32_t)) if retests else NULL
    out.sensors = <int32_t *>malloc(max(n, 1) * sizeof(int32_t))
    job.sensors = <int32_t *>malloc(max(n, 1) * sizeof(int32_t))
    job.counts = <int64_t *>malloc(4 * parts * sizeof(int64_t))
    if (out.refat == NULL or (retests and out.retest == NULL) or out.sensors == NULL or job.sensors == NULL
            or job.counts == NULL):
        free(job.sensors)
        free(job.counts)
        picked_free(out)
        return -1
    job.t, job.moved, job.n, job.parts, job.retests, job.out = t, moved, n, parts, retests, out
    run_parts(pick_part, &job, parts)
    for part in range(parts):
        first = run_start(moved, n, part, parts)
        memmove(out.refat + refat, out.refat + first, job.counts[4 * part] * sizeof(int32_t))
        refat += job.counts[4 * part]
        if retests:
            memmove(out.retest + retest, out.retest + first, job.counts[4 * part + 2] * sizeof(int32_t))
            retest += job.counts[4 * part + 2]
        memmove(out.sensors + moving, out.sensors + first, job.counts[4 * part + 3] * sizeof(int32_t))
        moving += job.counts[4 * part + 3]
    out.refat_plain = refat
    for part in range(parts):
        first = run_start(moved, n, part, parts)
        memcpy(out.refat + refat + sensors, job.sensors + first, job.counts[4 * part + 1] * sizeof(int32_t))
        sensors += job.counts[4 * part + 1]
    out.refat_count = refat + sensors
    out.retest_count = retest
    out.sensor_count = moving
    free(job.sensors)
    free(job.counts)
    return 0


cdef void picked_free(Picked *picked) noexcept nogil:
    free(picked.refat)
    free(picked.retest)
    free(picked.sensors)
    memset(picked, 0, sizeof(Picked))


cdef enum EditKind:
    EDIT_DROP                       # take the partner out of the list
    EDIT_ADD                        # put it in, not touching
    EDIT_FLIP                       # flip its pair's touching bit


ctypedef struct Edit:               # a change to one partner list, for the thread that holds it: 12 bytes
    int32_t owner                   # 4: whose list
    int32_t value                   # 4: the partner it concerns
    int32_t kind                    # 4: an EditKind


ctypedef struct Edits:              # a growing array of edits, one thread's
    Edit *items
    int64_t count
    int64_t capacity


ctypedef struct RefreshJob:
    TreeCore *t
    const Finder *f
    Partners *partners
    const int32_t *refat            # ascending, each once, all flagged PROXY_REFAT
    int64_t *order                  # packet_order(refat): the chunks are runs of it...
    bint together                   # ...and whether they go in packets
    int64_t n
    Limit limit
    unsigned char *merged           # per proxy slot: 1 once its list holds its partners (read by the
                                    # other threads under a limit, see merged_gain)
    Edits *mirrors                  # one a thread: changes to lists of proxies that kept their fat boxes...
    Edits *pending                  # ...and, under a limit, to those of refreshed ones, for after a stop
    Refreshed *done                 # one a thread, kept in its locals while it works (see find_worker)
    Refreshed *fixes                # one a part: the counts of the pending changes it made
    int workers
    Chunks chunks
    dbvt_counter failed


cdef int edit_push(Edits *edits, int32_t owner, int32_t value, int32_t kind) noexcept nogil:
    if grow_array(<void **>&edits.items, &edits.capacity, edits.count + 1, sizeof(Edit)) != 0:
        return -1
    edits.items[edits.count].owner = owner
    edits.items[edits.count].value = value
    edits.items[edits.count].kind = kind
    edits.count += 1
    return 0


cdef int make_edits(Partners *partners, const Edits *edits) noexcept nogil:
    """Make each edit in turn (no sensor's list among them): the lists are far apart and mostly out of
    cache, so a list's header, then its entries, are fetched ahead."""
    cdef const Partners *ahead
    cdef Partners *p
    cdef const Edit *edit
    cdef int64_t k
    for k in range(edits.count):
        if k + 2 * PREFETCH_AHEAD < edits.count:
            prefetch(&partners[edits.items[k + 2 * PREFETCH_AHEAD].owner])
        if k + PREFETCH_AHEAD < edits.count:
            ahead = &partners[edits.items[k + PREFETCH_AHEAD].owner]
            prefetch(items_of(ahead) + ahead.count // 2)
        edit = &edits.items[k]
        p = &partners[edit.owner]
        if edit.kind == EDIT_DROP:
            partners_erase(p, edit.value, False)
        elif edit.kind == EDIT_ADD:
            if partners_insert(p, edit.value, False) != 0:
                return -1
        else:
            partners_find(p, edit.value)[0] ^= TOUCHING
    return 0


cdef int merge_own(const TreeCore *t, Partners *partners, int32_t proxy, Hits *hits, Edits *mirrors,
                   Edits *pending, Refreshed *done) noexcept nogil:
    """_broadphase's _merge_partners for a world without sensors, writing `proxy`'s list alone.
    Partners are symmetric (both fat boxes overlap, both filters pass), so a refreshed partner merges
    its own list to agree with this one, and a pair of two refreshed proxies that parted while
    touching ends once, by the lower (as one thread, which takes them in order, ends it). The changes
    to the lists of partners that kept their fat boxes are noted for their owners (mirror_part), and
    with `pending`, those to refreshed partners' lists too, in case the refresh stops before them."""
    cdef Partners *mine = &partners[proxy]
    cdef const int32_t *items = items_of(mine)
    cdef int64_t kept = hits.count
    cdef int32_t i = 0, j = 0, other
    cdef bint refreshed
    while i < mine.count or j < kept:
        if j == kept or (i < mine.count and (items[i] >> 1) < hits.proxies[j]):
            other = items[i] >> 1
            refreshed = (t.proxies[other].flags & PROXY_REFAT) != 0
            if not refreshed:
                if edit_push(mirrors, other, proxy, EDIT_DROP) != 0:
                    return -1
                done.listed -= 1
            elif pending != NULL and edit_push(pending, other, proxy, EDIT_DROP) != 0:
                return -1
            if (items[i] & TOUCHING) and (proxy < other or not refreshed):
                if pairs_push(&done.ended, t.proxies[proxy].id, t.proxies[other].id) != 0:
                    return -1
                done.touching -= 1
            i += 1
        elif i == mine.count or hits.proxies[j] < (items[i] >> 1):
            other = hits.proxies[j]
            if not (t.proxies[other].flags & PROXY_REFAT):
                if edit_push(mirrors, other, proxy, EDIT_ADD) != 0:
                    return -1
                done.listed += 1
            elif pending != NULL and edit_push(pending, other, proxy, EDIT_ADD) != 0:
                return -1
            hits.proxies[j] = other << 1
            j += 1
        else:
            hits.proxies[j] = items[i]
            i += 1
            j += 1
    if partners_reserve(mine, <int32_t>kept, False) != 0:
        return -1
    if kept:
        memcpy(items_of(mine), hits.proxies, kept * sizeof(int32_t))
    done.listed += kept - mine.count
    mine.count = <int32_t>kept
    return 0


cdef void refresh_worker(void *context, int worker) noexcept nogil:
    """Stage 1's first half: take chunks of the refreshed proxies, find their partners (a packet at a
    time) and merge each proxy's into its list when they differ. Every list a thread writes here is
    its own proxies'. Under a limit, the lists' gains are counted across threads, and past it every
    thread stops."""
    cdef RefreshJob *job = <RefreshJob *>context
    cdef Packets packets
    cdef Edits mirrors
    cdef Edits pending
    cdef Refreshed done
    cdef int64_t chunk, start, end, position, tally = 0, gain = 0
    cdef int32_t proxy
    cdef Hits *found
    cdef int k
    cdef bint stop = False
    memset(&packets, 0, sizeof(Packets))
    memset(&mirrors, 0, sizeof(Edits))
    memset(&pending, 0, sizeof(Edits))
    memset(&done, 0, sizeof(Refreshed))
    while (not stop and not counter_get(&job.failed) and not counter_get(&job.limit.stopped)
           and take_chunk(&job.chunks, worker, &chunk, &start, &end)):
        position = start
        while not stop and position < end:
            if next_packet(job.f, job.refat, job.order, &position, end, job.together, &packets) != 0:
                counter_set(&job.failed, 1)
                break
            for k in range(packets.count):
                proxy = job.refat[packets.at[k]]
                found = &packets.lanes[k]
                if job.limit.room >= 0:
                    gain = list_gain(job.t, &job.partners[proxy], proxy, found.proxies, found.count, job.merged)
                if (not same_partners(&job.partners[proxy], found.proxies, found.count)
                        and merge_own(job.t, job.partners, proxy, found, &mirrors,
                                      &pending if job.limit.room >= 0 else NULL, &done) != 0):
                    counter_set(&job.failed, 1)
                    stop = True
                    break
                byte_set(&job.merged[proxy], 1)
                if job.limit.room >= 0 and past_limit(&job.limit, &tally, gain,
                                                      position == end and k + 1 == packets.count):
                    stop = True
                    break
    packets_free(&packets)
    job.mirrors[worker] = mirrors
    job.pending[worker] = pending
    job.done[worker] = done


cdef inline int64_t first_at_least(const int32_t *ascending, int64_t n, int32_t value) noexcept nogil:
    cdef int64_t lo = 0, hi = n, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if ascending[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef inline int32_t part_start(const TreeCore *t, int part, int parts) noexcept nogil:
    """The first proxy slot of a part, when the slots are cut into `parts` equal ranges."""
    return <int32_t>(<int64_t>t.proxy_capacity * part // parts)


cdef int gather(Edits *into, const Edits *edits, int32_t lo, int32_t hi) noexcept nogil:
    """Append the edits to lists in [lo, hi)."""
    cdef int64_t k
    for k in range(edits.count):
        if lo <= edits.items[k].owner < hi and edit_push(into, edits.items[k].owner, edits.items[k].value,
                                                         edits.items[k].kind) != 0:
            return -1
    return 0


cdef int make_pending(RefreshJob *job, const Edits *pending, int32_t lo, int32_t hi, Refreshed *fix) noexcept nogil:
    """After a stop: the changes merged proxies made to pairs with refreshed proxies whose turn never
    came, on the latter's side. A touching pair that a merged proxy parted and left to the lower one
    to end is counted here (the update fails, so no pair is reported)."""
    cdef const Edit *edit
    cdef int64_t k
    for k in range(pending.count):
        edit = &pending.items[k]
        if edit.owner < lo or edit.owner >= hi or job.merged[edit.owner]:
            continue
        if edit.kind == EDIT_ADD:
            if partners_insert(&job.partners[edit.owner], edit.value, False) != 0:
                return -1
            fix.listed += 1
            continue
        if (partners_find(&job.partners[edit.owner], edit.value)[0] & TOUCHING) and edit.value > edit.owner:
            fix.touching -= 1
        partners_erase(&job.partners[edit.owner], edit.value, False)
        fix.listed -= 1
    return 0


cdef void mirror_part(void *context, int part) noexcept nogil:
    """Stage 1's second half, for the proxies of one range of slots: the changes the merged proxies
    noted for their lists, and the end of their own refresh (PROXY_REFAT cleared)."""
    cdef RefreshJob *job = <RefreshJob *>context
    cdef int32_t lo = part_start(job.t, part, job.workers), hi = part_start(job.t, part + 1, job.workers)
    cdef Edits mine
    cdef int64_t i
    cdef int w, status = 0
    memset(&mine, 0, sizeof(Edits))
    for w in range(job.workers):
        if status == 0:
            status = gather(&mine, &job.mirrors[w], lo, hi)
    if status == 0:
        status = make_edits(job.partners, &mine)
    free(mine.items)
    for w in range(job.workers if counter_get(&job.limit.stopped) else 0):
        if status == 0:
            status = make_pending(job, &job.pending[w], lo, hi, &job.fixes[part])
    if status != 0:
        counter_set(&job.failed, 1)
        return
    for i in range(first_at_least(job.refat, job.n, lo), job.n):
        if job.refat[i] >= hi:
            break
        if job.merged[job.refat[i]]:
            job.t.proxies[job.refat[i]].flags &= ~PROXY_REFAT


cdef int refresh_all(TreeCore *t, const Finder *f, Partners *partners, const int32_t *refat, int64_t n,
                     int threads, int64_t room, Refreshed *out) noexcept nogil:
    """Stage 1 on threads, for a world without sensors: each of `refat` (ascending, each once, all
    flagged PROXY_REFAT; `f` reads `t`) gets the partners found for it as its list, the lists of the
    proxies that kept their fat boxes gain or lose it, and the flags are cleared. Every list comes out
    as one thread's merges, in order, leave it. `out` (empty) gets the touching pairs that parted and
    the changes in the counts.

    With `room` (not -1), FAT_LIMIT once the lists have gained more entries than that: the proxies
    not merged by then keep their flag, for the next update, and every list agrees with its
    partners'. After a failure (-1) the lists may disagree, as after a failed merge on one thread."""
    cdef RefreshJob job
    cdef int status = 0, w
    cdef bint ordered
    memset(&job, 0, sizeof(RefreshJob))
    job.t = t
    job.f = f
    job.partners = partners
    job.refat = refat
    job.n = n
    job.limit.room = room
    job.workers = <int>max(1, min(<int64_t>threads, n // FIND_CHUNK))
    job.merged = <unsigned char *>calloc(max(t.proxy_capacity, 1), sizeof(unsigned char))
    job.mirrors = <Edits *>calloc(job.workers, sizeof(Edits))
    job.pending = <Edits *>calloc(job.workers, sizeof(Edits))
    job.done = <Refreshed *>calloc(job.workers, sizeof(Refreshed))
    job.fixes = <Refreshed *>calloc(job.workers, sizeof(Refreshed))
    chunks_init(&job.chunks, n, job.workers)
    ordered = packet_order(t, refat, n, &job.chunks.runs, &job.order, &job.together) == 0
    counter_set(&job.failed, 0)
    counter_set(&job.limit.stopped, 0)
    if (not ordered or job.merged == NULL or job.mirrors == NULL or job.pending == NULL or job.done == NULL
            or job.fixes == NULL):
        status = -1
    else:
        run_parts(refresh_worker, &job, job.workers)
        if not counter_get(&job.failed):
            run_parts(mirror_part, &job, job.workers)
        status = -1 if counter_get(&job.failed) else FAT_LIMIT if counter_get(&job.limit.stopped) else 0
        for w in range(job.workers):
            out.listed += job.done[w].listed + job.fixes[w].listed
            out.touching += job.done[w].touching + job.fixes[w].touching
            if status != -1 and pairs_extend(&out.ended, &job.done[w].ended) != 0:
                status = -1
            pairs_free(&job.done[w].ended)
            free(job.mirrors[w].items)
            free(job.pending[w].items)
    free(job.order)
    free(job.merged)
    free(job.mirrors)
    free(job.pending)
    free(job.done)
    free(job.fixes)
    return status


ctypedef struct RetestJob:
    const TreeCore *t
    Partners *partners
    const int32_t *moved
    int64_t n
    bint flip                       # make each flip's own side, and push its pair
    Retests *out
    Chunks chunks
    dbvt_counter failed


ctypedef struct Changes:            # a thread's changes while it works: its own, not in a shared array
    Retest *items
    int64_t count
    int64_t capacity
    PairBuffer begun                # with the job's `flip`: its flips' pairs
    PairBuffer ended


cdef int change_push(Changes *changes, int32_t proxy, int32_t entry, int32_t other, int32_t visit) noexcept nogil:
    if grow_array(<void **>&changes.items, &changes.capacity, changes.count + 1, sizeof(Retest)) != 0:
        return -1
    changes.items[changes.count].proxy = proxy
    changes.items[changes.count].entry = entry
    changes.items[changes.count].other = other
    changes.items[changes.count].visit = visit
    changes.count += 1
    return 0


cdef int retest_one(const RetestJob *job, Changes *changes, int32_t proxy) noexcept nogil:
    """A moved proxy's partners, as _broadphase's _retest takes them on one thread: a pair of two moved
    proxies is tested by the lower-numbered (the one that thread takes first), and a moved sensor has
    decided its own pairs already (PROXY_SEEN)."""
    cdef const TreeCore *t = job.t
    cdef const Partners *mine = &job.partners[proxy]
    cdef int32_t *items = items_of(mine)
    cdef int32_t k, other
    cdef uint32_t flags
    cdef bint now
    for k in range(mine.count):
        if k + PREFETCH_AHEAD < mine.count:
            prefetch(&t.proxies[items[k + PREFETCH_AHEAD] >> 1])
        other = items[k] >> 1
        flags = t.proxies[other].flags
        if flags & PROXY_SENSOR:
            if not (flags & PROXY_SEEN) and change_push(changes, proxy, k, other, 1) != 0:
                return -1
            continue
        if flags & PROXY_MOVED and other < proxy:
            continue
        now = tight_overlap(t, proxy, other)
        if now == (items[k] & TOUCHING):
            continue
        if change_push(changes, proxy, k, other, 0) != 0:
            return -1
        if job.flip:
            # No other thread reads this list meanwhile: its proxy is this thread's alone.
            items[k] ^= TOUCHING
            if pairs_push(&changes.begun if now else &changes.ended, t.proxies[proxy].id, t.proxies[other].id) != 0:
                return -1
    return 0


cdef void retest_worker(void *context, int worker) noexcept nogil:
    """Take chunks until none is left, the changes in a buffer of the thread's own (see find_worker)."""
    cdef RetestJob *job = <RetestJob *>context
    cdef Retests *out = job.out
    cdef Changes changes
    cdef int64_t chunk, start, end, i
    memset(&changes, 0, sizeof(Changes))
    while not counter_get(&job.failed) and take_chunk(&job.chunks, worker, &chunk, &start, &end):
        out.chunk_worker[chunk] = worker
        out.chunk_first[chunk] = changes.count
        for i in range(start, end):
            if i + PREFETCH_AHEAD < job.n:
                prefetch(&job.partners[job.moved[i + PREFETCH_AHEAD]])
            if retest_one(job, &changes, job.moved[i]) != 0:
                counter_set(&job.failed, 1)
                break
        out.chunk_count[chunk] = changes.count - out.chunk_first[chunk]
    out.found[worker] = changes.items
    out.found_count[worker] = changes.count
    out.begun[worker] = changes.begun
    out.ended[worker] = changes.ended


cdef int retest_all(const TreeCore *t, Partners *partners, const int32_t *moved, int64_t n, int threads,
                    bint flip, Retests *out) noexcept nogil:
    """Stage 2's changes for `moved` (live proxies that are no sensors, ascending, each once) into `out`
    (empty), chunk by chunk: flips and sensors' pairs to re-test, in the order one thread meets them.
    With `flip` (a world without sensors), each flip is made at once on the moved proxy's side, and
    its pair pushed to the thread's begun or ended; flip_all makes the partners' sides."""
    cdef RetestJob job
    out.chunks = (n + FIND_CHUNK - 1) // FIND_CHUNK
    out.workers = <int>max(1, min(<int64_t>threads, out.chunks))
    out.found = <Retest **>calloc(out.workers, sizeof(Retest *))
    out.found_count = <int64_t *>calloc(out.workers, sizeof(int64_t))
    out.chunk_first = <int64_t *>malloc(max(out.chunks, 1) * sizeof(int64_t))
    out.chunk_count = <int64_t *>malloc(max(out.chunks, 1) * sizeof(int64_t))
    out.chunk_worker = <int32_t *>malloc(max(out.chunks, 1) * sizeof(int32_t))
    out.begun = <PairBuffer *>calloc(out.workers, sizeof(PairBuffer))
    out.ended = <PairBuffer *>calloc(out.workers, sizeof(PairBuffer))
    if (out.found == NULL or out.found_count == NULL or out.chunk_first == NULL or out.chunk_count == NULL
            or out.chunk_worker == NULL or out.begun == NULL or out.ended == NULL):
        return -1
    job.t = t
    job.partners = partners
    job.moved = moved
    job.n = n
    job.flip = flip
    job.out = out
    chunks_init(&job.chunks, n, out.workers)
    counter_set(&job.failed, 0)
    run_parts(retest_worker, &job, out.workers)
    return -1 if counter_get(&job.failed) else 0


ctypedef struct FlipJob:
    TreeCore *t
    Partners *partners
    const Retests *found
    const int32_t *moved
    int64_t n
    int parts


cdef void flip_soon(Edits *edits, Partners *partners, int32_t owner, int32_t partner) noexcept nogil:
    """Note a flip for make_edits in the room set aside for it, or, when there was no memory for that
    room, make it now."""
    cdef Edit edit
    cdef Edits one
    if edits.count < edits.capacity:
        edit_push(edits, owner, partner, EDIT_FLIP)     # within its capacity: cannot fail
        return
    edit.owner = owner
    edit.value = partner
    edit.kind = EDIT_FLIP
    one.items = &edit
    one.count = one.capacity = 1
    make_edits(partners, &one)


cdef void flip_part(void *context, int part) noexcept nogil:
    """The partners' sides of the flips retest_all made, on the lists of one range of proxy slots, by
    the thread that holds them. Then the part's moved proxies are re-tested (PROXY_MOVED cleared).
    Nothing here can fail: flips need no memory."""
    cdef FlipJob *job = <FlipJob *>context
    cdef int32_t lo = part_start(job.t, part, job.parts), hi = part_start(job.t, part + 1, job.parts)
    cdef const Retest *change
    cdef Edits mine
    cdef int64_t r, i, count = 0
    cdef int w
    for w in range(job.found.workers):
        for r in range(job.found.found_count[w]):
            change = &job.found.found[w][r]
            count += lo <= change.other < hi
    mine.items = <Edit *>malloc(max(count, 1) * sizeof(Edit))
    mine.count = 0
    mine.capacity = count if mine.items != NULL else 0
    for w in range(job.found.workers):
        for r in range(job.found.found_count[w]):
            change = &job.found.found[w][r]
            if lo <= change.other < hi:
                flip_soon(&mine, job.partners, change.other, change.proxy)
    make_edits(job.partners, &mine)
    free(mine.items)
    for i in range(first_at_least(job.moved, job.n, lo), job.n):
        if job.moved[i] >= hi:
            break
        job.t.proxies[job.moved[i]].flags &= ~PROXY_MOVED


cdef void flip_all(TreeCore *t, Partners *partners, const Retests *found, const int32_t *moved,
                   int64_t n) noexcept nogil:
    """Make the partners' sides of the flips of a retest_all with `flip` for `moved`, on as many threads
    as found them."""
    cdef FlipJob job
    job.t = t
    job.partners = partners
    job.found = found
    job.moved = moved
    job.n = n
    job.parts = found.workers
    run_parts(flip_part, &job, job.parts)


cdef void retests_free(Retests *retests) noexcept nogil:
    cdef int i
    for i in range(retests.workers):
        if retests.found != NULL:
            free(retests.found[i])
        if retests.begun != NULL:
            pairs_free(&retests.begun[i])
        if retests.ended != NULL:
            pairs_free(&retests.ended[i])
    free(retests.found)
    free(retests.found_count)
    free(retests.chunk_first)
    free(retests.chunk_count)
    free(retests.chunk_worker)
    free(retests.begun)
    free(retests.ended)
    memset(retests, 0, sizeof(Retests))
