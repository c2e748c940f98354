# A fork-join on POSIX threads, for cutting one call's work into parts. No OpenMP: the wheels and the
# container image would then need its runtime.

# One part of the work: it must touch no Python object, and may not fail (it keeps its own status).
ctypedef void (*PartTask)(void *context, int part) noexcept nogil


cdef void run_parts(PartTask task, void *context, int parts) noexcept nogil
