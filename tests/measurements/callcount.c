/*
 * A test-only LD_PRELOAD library: counts, per thread, the calls a process
 * makes to clock_gettime() and to malloc()/calloc()/realloc(), so that a
 * test can see what the core's threads do on their hot path (stats="basic"
 * promises no clock reads; neither mode allocates per fault). Built and preloaded by
 * tests/measurements/test_effects_stats.py into a child process; read back with
 * callcount_of(tid, what) through ctypes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SLOTS 4096	/* threads a test process makes, with room */

enum { CLOCK_READS, ALLOCATIONS };

static _Atomic int slot_tid[SLOTS];
static _Atomic long slot_count[SLOTS][2];

/* The calling thread's slot, claimed on its first call (open addressing). */
static int slot_of(int tid, int claim)
{
	unsigned i = (unsigned)tid * 2654435761u % SLOTS, n;

	for (n = 0; n < SLOTS; n++, i = (i + 1) % SLOTS) {
		int seen = atomic_load(&slot_tid[i]);

		if (seen == tid)
			return (int)i;
		if (seen == 0) {
			if (!claim)
				return -1;
			if (atomic_compare_exchange_strong(&slot_tid[i], &seen, tid) || seen == tid)
				return (int)i;
		}
	}
	return -1;
}

static void count(int what)
{
	int i = slot_of((int)syscall(SYS_gettid), 1);

	if (i >= 0)
		atomic_fetch_add(&slot_count[i][what], 1);
}

long callcount_of(int tid, int what)
{
	int i = slot_of(tid, 0);

	return i < 0 ? 0 : atomic_load(&slot_count[i][what]);
}

int clock_gettime(clockid_t clock, struct timespec *ts)
{
	static int (*real)(clockid_t, struct timespec *);

	if (!real)
		real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
	count(CLOCK_READS);
	return real(clock, ts);
}

/* glibc's own entry points: no dlsym (which may allocate) on this path. */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);

void *malloc(size_t n)
{
	count(ALLOCATIONS);
	return __libc_malloc(n);
}

void *calloc(size_t n, size_t size)
{
	count(ALLOCATIONS);
	return __libc_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
	count(ALLOCATIONS);
	return __libc_realloc(p, n);
}
