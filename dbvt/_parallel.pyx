# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""run_parts: task(context, i) for every i < parts, part 0 on the calling thread and each other part
on a worker thread, all finished before it returns.

The workers are kept in a pool between calls, not started for each. A step of a big world cuts its
work over the threads some eight times; on this project's virtual machine, starting and joining a
POSIX thread took 110-120 µs, waking a sleeping one and hearing back 58 µs, and handing a part to one
that is still spinning 0.2 µs. So a worker that finishes a part spins a while for the next one before
it sleeps, and a caller that finishes its own part spins a while before it sleeps on the others'.

A worker is taken from the pool for a call and given back after it, so calls on different threads
(different worlds) never share one; the pool grows to the most parts ever running at once. Its
threads sleep between bursts of calls and end with the process. A forked child starts with an empty
pool (the threads are not copied into it).

The thread budget shares the cores between calls on different threads: with one set
(`set_thread_budget`), a worker is taken only while fewer threads than the budget are working,
counting the workers running a part and the threads that said they work (`working`, as the server's
world threads do for each operation). A part that gets no worker runs on the caller, so a busy
process runs each call on its own thread, and an idle one gives a call every core it has, with the
same answer either way.
"""
from libc.stdlib cimport free, malloc
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_attr_t:
        pass
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    # An opaque handle: stored and passed back, never looked into.
    ctypedef unsigned long pthread_t
    int pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*start)(void *) noexcept nogil,
                       void *arg)
    int pthread_detach(pthread_t thread)
    int pthread_mutex_init(pthread_mutex_t *mutex, const void *attr)
    int pthread_mutex_destroy(pthread_mutex_t *mutex)
    int pthread_mutex_lock(pthread_mutex_t *mutex)
    int pthread_mutex_unlock(pthread_mutex_t *mutex)
    int pthread_cond_init(pthread_cond_t *cond, const void *attr)
    int pthread_cond_destroy(pthread_cond_t *cond)
    int pthread_cond_wait(pthread_cond_t *cond, pthread_mutex_t *mutex)
    int pthread_cond_signal(pthread_cond_t *cond)
    int pthread_atfork(void (*prepare)() noexcept nogil, void (*parent)() noexcept nogil,
                       void (*child)() noexcept nogil)

cdef extern from *:
    """
    /* A worker's state: written under its lock, read without it while spinning. */
    static inline int dbvt_state_get(int *state) { return __atomic_load_n(state, __ATOMIC_ACQUIRE); }
    static inline void dbvt_state_set(int *state, int value) { __atomic_store_n(state, value, __ATOMIC_RELEASE); }
    /* What a spinning core does between looks: lets its sibling hyperthread run. */
    static inline void dbvt_cpu_relax(void) {
    #if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
    #elif defined(__aarch64__)
        __asm__ __volatile__("yield");
    #endif
    }
    """
    int state_get "dbvt_state_get"(int *state) noexcept nogil
    void state_set "dbvt_state_set"(int *state, int value) noexcept nogil
    void cpu_relax "dbvt_cpu_relax"() noexcept nogil


cdef enum:
    PART_GIVEN = 1                  # a worker's state: it has a part to run...
    PART_DONE = 2                   # ...or it has run it (and is idle)
    # A worker that ran a part looks for the next this long before it sleeps, and a caller done with
    # its own part looks as long for the workers' end (W2 2-D at 3,553 on 2 threads: 0.84 of the
    # step against a thread a part with 50 µs, 0.85 with 200 µs or 1 ms, 0.92 with none).
    SPIN_NS = 50000
    LOOKS_PER_CLOCK = 64            # looks at a state between two readings of the clock


ctypedef struct Worker:             # one pooled thread, and the part it is given
    pthread_mutex_t lock            # guards state and the two sleeping flags
    pthread_cond_t wake             # the worker sleeps on it for a part...
    pthread_cond_t finished         # ...and a caller on it for the part's end
    PartTask task
    void *context
    int part
    int state                       # PART_GIVEN or PART_DONE
    bint worker_asleep
    bint caller_asleep
    Worker *next                    # the next idle worker, while in the pool


cdef pthread_mutex_t pool_lock      # guards idle
cdef Worker *idle = NULL            # the pool: a stack, so the worker that ran last, still spinning, goes first

# The budget and what counts against it, read and written by atomics only (load64, store64,
# add_fetch, compare_swap): plain loads where a count is only read, as on every update().
cdef int64_t thread_budget = 0      # at most this many threads working at once; 0, no budget
cdef int64_t threads_working = 0    # threads inside `working`, and workers given a part
cdef int64_t parts_on_workers = 0   # of the calls cut into parts, the parts run by a worker and those
cdef int64_t parts_on_callers = 0   # run by their caller, ever: what a test sees of the budget


cdef inline int64_t now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef bint spin_for(int *state, int value, int64_t budget_ns) noexcept nogil:
    """Whether `state` became `value` within about budget_ns of looking."""
    cdef int64_t deadline = now_ns() + budget_ns
    cdef int look
    while True:
        for look in range(LOOKS_PER_CLOCK):
            if state_get(state) == value:
                return True
            cpu_relax()
        if now_ns() > deadline:
            return False


cdef void await_state(Worker *w, int value, pthread_cond_t *bell, bint *asleep) noexcept nogil:
    """Until w's state is `value`: spinning a while, then asleep on `bell` (with `asleep` set, so that
    announce() rings it)."""
    if spin_for(&w.state, value, SPIN_NS):
        return
    pthread_mutex_lock(&w.lock)
    while w.state != value:
        asleep[0] = True
        pthread_cond_wait(bell, &w.lock)
        asleep[0] = False
    pthread_mutex_unlock(&w.lock)


cdef void announce(Worker *w, int value, pthread_cond_t *bell, const bint *asleep) noexcept nogil:
    """Set w's state to `value` (after every write before it), and wake the other side if it sleeps."""
    pthread_mutex_lock(&w.lock)
    state_set(&w.state, value)
    if asleep[0]:
        pthread_cond_signal(bell)
    pthread_mutex_unlock(&w.lock)


cdef void *work(void *arg) noexcept nogil:
    """A worker's life: wait for a part, run it, say so; forever."""
    cdef Worker *w = <Worker *>arg
    while True:
        await_state(w, PART_GIVEN, &w.wake, &w.worker_asleep)
        w.task(w.context, w.part)
        announce(w, PART_DONE, &w.finished, &w.caller_asleep)
    return NULL


cdef Worker *take_worker() noexcept nogil:
    """An idle worker from the pool, or a new one; NULL when no thread can be had."""
    global idle
    cdef Worker *w
    cdef pthread_t thread
    pthread_mutex_lock(&pool_lock)
    w = idle
    if w != NULL:
        idle = w.next
    pthread_mutex_unlock(&pool_lock)
    if w != NULL:
        return w
    w = <Worker *>malloc(sizeof(Worker))
    if w == NULL:
        return NULL
    pthread_mutex_init(&w.lock, NULL)
    pthread_cond_init(&w.wake, NULL)
    pthread_cond_init(&w.finished, NULL)
    w.state = PART_DONE
    w.worker_asleep = w.caller_asleep = False
    if pthread_create(&thread, NULL, work, w) != 0:
        pthread_cond_destroy(&w.finished)
        pthread_cond_destroy(&w.wake)
        pthread_mutex_destroy(&w.lock)
        free(w)
        return NULL
    pthread_detach(thread)
    return w


cdef void give(Worker *w, PartTask task, void *context, int part) noexcept nogil:
    w.task = task
    w.context = context
    w.part = part
    announce(w, PART_GIVEN, &w.wake, &w.worker_asleep)


cdef void wait_for(Worker *w) noexcept nogil:
    """Until w has run its part; then back to the pool."""
    global idle
    await_state(w, PART_DONE, &w.finished, &w.caller_asleep)
    pthread_mutex_lock(&pool_lock)
    w.next = idle
    idle = w
    pthread_mutex_unlock(&pool_lock)


cdef bint claim_thread() noexcept nogil:
    """One more working thread, counted, if the budget has room for it."""
    cdef int64_t budget = load64(&thread_budget)
    cdef int64_t working = load64(&threads_working)
    while budget <= 0 or working < budget:
        if compare_swap(&threads_working, &working, working + 1):
            return True
    return False


cdef int threads_free(int wanted) noexcept nogil:
    cdef int64_t budget = load64(&thread_budget)
    if budget <= 0:
        return wanted
    return <int>max(1, min(<int64_t>wanted, 1 + budget - load64(&threads_working)))


cdef Worker *budgeted_worker() noexcept nogil:
    """A worker within the budget, or NULL (none had: its part runs on the caller)."""
    cdef Worker *w
    if not claim_thread():
        return NULL
    w = take_worker()
    if w == NULL:
        add_fetch(&threads_working, -1)
    return w


cdef void run_parts(PartTask task, void *context, int parts) noexcept nogil:
    """Never fails: a part for which no worker can be had (the budget spent, no memory, a thread
    limit) runs on the caller, after part 0, so the answer is the same and only slower."""
    cdef Worker **workers
    cdef int i, given = 0
    if parts <= 1:
        if parts == 1:
            task(context, 0)
        return
    workers = <Worker **>malloc(parts * sizeof(Worker *))
    if workers == NULL:
        for i in range(parts):
            task(context, i)
        add_fetch(&parts_on_callers, parts)
        return
    for i in range(1, parts):
        workers[i] = budgeted_worker()
        if workers[i] != NULL:
            give(workers[i], task, context, i)
            given += 1
    task(context, 0)
    for i in range(1, parts):
        if workers[i] == NULL:
            task(context, i)
    for i in range(1, parts):
        if workers[i] != NULL:
            wait_for(workers[i])
            add_fetch(&threads_working, -1)
    add_fetch(&parts_on_workers, given)
    add_fetch(&parts_on_callers, parts - given)
    free(workers)


cdef void forget_pool() noexcept nogil:
    """In a forked child: the workers' threads were not copied, so the pool starts empty (their
    memory is left, a few hundred bytes each), and so were the threads counted as working, whose
    count would otherwise hold the child's budget spent for ever."""
    global idle, threads_working
    idle = NULL
    threads_working = 0
    pthread_mutex_init(&pool_lock, NULL)


pthread_mutex_init(&pool_lock, NULL)
pthread_atfork(NULL, NULL, forget_pool)


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


def set_thread_budget(threads):
    """At most `threads` threads of this process work at once; 0, no budget (the default). See the
    module's text."""
    if isinstance(threads, bool) or not isinstance(threads, int) or not 0 <= threads <= MAX_THREADS:
        raise ValueError(f"the thread budget must be an int from 0 (none) to {MAX_THREADS}, not {threads!r}")
    store64(&thread_budget, threads)


cdef class Working:
    """`with working():` counts this thread against the thread budget while it works."""

    def __enter__(self):
        add_fetch(&threads_working, 1)
        return self

    def __exit__(self, *exc):
        add_fetch(&threads_working, -1)
        return False


cdef Working WORKING = Working()


def working():
    """The context in which this thread counts against the thread budget (it may be entered by any
    number of threads at once)."""
    return WORKING


def thread_stats():
    """The budget (0: none), the threads working now, and the parts ever run on workers and on
    their callers."""
    return {"budget": load64(&thread_budget), "working": load64(&threads_working),
            "parts_on_workers": load64(&parts_on_workers), "parts_on_callers": load64(&parts_on_callers)}
