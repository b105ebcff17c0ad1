// Counts heap allocations of the process it is preloaded into, for the benchmarks' "allocations
// per operation" figures: LD_PRELOAD=malloc-count.so MALLOC_COUNT_FILE=/path program ...
// On SIGUSR2 it writes "<allocations> <bytes>" (since start) to MALLOC_COUNT_FILE; the bench reads
// it before and after a run. malloc, calloc, realloc, posix_memalign, aligned_alloc and memalign
// are counted (the Swift runtime allocates through them); the real ones are found with dlsym.
// Built by the bench: cc -O2 -shared -fPIC -o malloc-count.so malloc-count.c -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static _Atomic unsigned long allocations;
static _Atomic unsigned long bytes;
static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static void *(*real_memalign)(size_t, size_t);

// dlsym may itself call calloc before real_calloc is known: served from a small static arena.
static char bootstrap[4096];
static size_t bootstrap_used;

static void count(size_t size) {
    atomic_fetch_add_explicit(&allocations, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&bytes, size, memory_order_relaxed);
}

static char *decimal(char *end, unsigned long value) {
    do { *--end = (char)('0' + value % 10); value /= 10; } while (value);
    return end;
}

static void report(int signal) {
    (void)signal;
    const char *path = getenv("MALLOC_COUNT_FILE");
    if (!path) return;
    char buffer[64];
    char *end = buffer + sizeof buffer;
    *--end = '\n';
    end = decimal(end, atomic_load(&bytes));
    *--end = ' ';
    end = decimal(end, atomic_load(&allocations));
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return;
    ssize_t ignored = write(fd, end, (size_t)(buffer + sizeof buffer - end));
    (void)ignored;
    close(fd);
}

__attribute__((constructor)) static void setup(void) {
    real_malloc = dlsym(RTLD_NEXT, "malloc");
    real_calloc = dlsym(RTLD_NEXT, "calloc");
    real_realloc = dlsym(RTLD_NEXT, "realloc");
    real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    real_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
    real_memalign = dlsym(RTLD_NEXT, "memalign");
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = report;
    action.sa_flags = SA_RESTART;
    sigaction(SIGUSR2, &action, NULL);
}

void *malloc(size_t size) {
    if (!real_malloc) setup();
    count(size);
    return real_malloc(size);
}

void *calloc(size_t n, size_t size) {
    if (!real_calloc) {
        size_t total = (n * size + 15) & ~(size_t)15;
        if (bootstrap_used + total > sizeof bootstrap) return NULL;
        void *p = bootstrap + bootstrap_used;
        bootstrap_used += total;
        return p;
    }
    count(n * size);
    return real_calloc(n, size);
}

void free(void *p);
void free(void *p) {
    static void (*real_free)(void *);
    if ((char *)p >= bootstrap && (char *)p < bootstrap + sizeof bootstrap) return;
    if (!real_free) real_free = dlsym(RTLD_NEXT, "free");
    real_free(p);
}

void *realloc(void *p, size_t size) {
    if (!real_realloc) setup();
    count(size);
    return real_realloc(p, size);
}

int posix_memalign(void **p, size_t alignment, size_t size) {
    if (!real_posix_memalign) setup();
    count(size);
    return real_posix_memalign(p, alignment, size);
}

void *aligned_alloc(size_t alignment, size_t size) {
    if (!real_aligned_alloc) setup();
    count(size);
    return real_aligned_alloc(alignment, size);
}

void *memalign(size_t alignment, size_t size) {
    if (!real_memalign) setup();
    count(size);
    return real_memalign(alignment, size);
}
