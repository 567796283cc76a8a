// glibc's malloc tuning (malloc.h is not in Swift's Glibc module). Part of libc: nothing to link.
#include <malloc.h>

/// Caps the number of malloc arenas (mallopt M_ARENA_MAX); returns 1 on success.
static inline int cmalloc_set_arena_max(int arenas) { return mallopt(M_ARENA_MAX, arenas); }

/// Bytes the process has allocated and not freed (all arenas, and chunks mapped on their own).
static inline size_t cmalloc_in_use(void) {
    struct mallinfo2 info = mallinfo2();
    return info.uordblks + info.hblkhd;
}
