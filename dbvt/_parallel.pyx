# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""run_parts: task(context, i) for every i < parts, part 0 on the calling thread and each other part
on a thread of its own, all joined before it returns.

A thread per part and per call, rather than a pool: the calls worth splitting take milliseconds, a
thread costs tens of microseconds to start, and nothing is left running between calls (a forked
worker process, or an interpreter shutting down, finds no idle threads to reason about).
"""
from libc.stdlib cimport free, malloc

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_attr_t:
        pass
    # An opaque handle: stored and passed back, never looked into.
    ctypedef unsigned long pthread_t
    int pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*start)(void *) noexcept nogil,
                       void *arg)
    int pthread_join(pthread_t thread, void **result)


ctypedef struct Call:               # what one thread needs, and whether it was started
    PartTask task
    void *context
    int part
    bint started
    pthread_t thread


cdef void *call_part(void *arg) noexcept nogil:
    cdef Call *call = <Call *>arg
    call.task(call.context, call.part)
    return NULL


cdef void run_parts(PartTask task, void *context, int parts) noexcept nogil:
    """Never fails: a part whose thread cannot be had (no memory, a thread limit) runs on the caller,
    after part 0, so the answer is the same and only slower."""
    cdef Call *calls
    cdef int i
    if parts <= 1:
        if parts == 1:
            task(context, 0)
        return
    calls = <Call *>malloc(parts * sizeof(Call))
    if calls == NULL:
        for i in range(parts):
            task(context, i)
        return
    for i in range(1, parts):
        calls[i].task = task
        calls[i].context = context
        calls[i].part = i
        calls[i].started = pthread_create(&calls[i].thread, NULL, call_part, &calls[i]) == 0
    task(context, 0)
    for i in range(1, parts):
        if not calls[i].started:
            task(context, i)
    for i in range(1, parts):
        if calls[i].started:
            pthread_join(calls[i].thread, NULL)
    free(calls)


cdef void runs_init(Runs *r, int64_t items, int threads) noexcept nogil:
    cdef int k
    r.runs = max(1, min(threads, MAX_RUNS))
    for k in range(r.runs + 1):
        r.first[k] = items * k // r.runs
    for k in range(r.runs):
        counter_set(&r.taken[COUNTER_STRIDE * k], 0)


cdef bint runs_take(Runs *r, int worker, int64_t *item) noexcept nogil:
    """The next item `worker` takes: its run's next, else another run's; False when none is left."""
    cdef int k, run
    cdef int64_t i, size
    for k in range(r.runs):
        run = (worker + k) % r.runs
        size = r.first[run + 1] - r.first[run]
        if counter_get(&r.taken[COUNTER_STRIDE * run]) >= size:
            continue
        i = counter_take(&r.taken[COUNTER_STRIDE * run])
        if i < size:
            item[0] = r.first[run] + i
            return True
    return False
