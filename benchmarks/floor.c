/*
 * The parts a userfault cannot avoid, each timed alone (benchmarks/floor.py
 * compiles and runs this; issue 21 part 2).
 *
 *   floor PART REPS ITERS [CPU_A [CPU_B]]
 *
 * PART is one of
 *   exit      a vCPU exit round trip to user space: a real-mode guest runs
 *             "inc al; out 0x10, al; jmp" forever, and each KVM_RUN returns
 *             KVM_EXIT_IO; per exit
 *   copy      UFFDIO_COPY of 4 KiB into a fresh page of a MISSING-registered
 *             anonymous region, no KVM; per page
 *   continue  UFFDIO_CONTINUE of 4 KiB into a MINOR-registered shmem mapping
 *             whose page cache a second mapping filled; per page
 *   switch    two threads on CPU_A ping-ponging through two eventfds; per
 *             half round trip (one switch, a write and a read)
 *   wakeup    the same with the second thread on CPU_B; per half round trip
 *   fault     a first write to each page of anonymous memory, no uffd; per
 *             page
 *
 * Each of REPS repetitions does ITERS operations and prints "ns X", the mean
 * nanoseconds per operation of that repetition (CLOCK_MONOTONIC around the
 * timed loop only: the MADV_DONTNEED that frees a range for the next
 * repetition is outside it). Last comes "count GOT ASKED": operations that
 * did what they should (for exit: KVM_EXIT_IO exits on port 0x10 carrying
 * the byte the guest's counter should hold; for copy/continue: ioctls that
 * mapped 4096 bytes, checked by reading the page back) against REPS*ITERS.
 * Exit status 0 when GOT == ASKED, 1 on a failure (said on stderr), 77 when
 * the host lacks what the part needs.
 *
 *   cc -O2 -o /tmp/floor benchmarks/floor.c -pthread
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/kvm.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL
#define PORT 0x10
#define SKIP 77

static long reps, iters;
static unsigned long long got;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static int pin(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set)) {
		fprintf(stderr, "sched_setaffinity(CPU %d): %s\n", cpu, strerror(errno));
		return -1;
	}
	return 0;
}

static void report(uint64_t ns, long ops)
{
	printf("ns %.3f\n", (double)ns / (double)ops);
	fflush(stdout);
}

/* exit: a real-mode guest that never stops writing its counter to a port. */
static int part_exit(void)
{
	static const uint8_t code[] = { 0xfe, 0xc0,	/* inc al */
					0xe6, PORT,	/* out PORT, al */
					0xeb, 0xfa };	/* jmp back to inc */
	struct kvm_userspace_memory_region region;
	struct kvm_sregs sregs;
	struct kvm_regs regs;
	struct kvm_run *run = MAP_FAILED;
	int kvm, vm = -1, vcpu = -1, rc = 1;
	long run_size;
	uint8_t *mem = MAP_FAILED, want = 0;

	kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (kvm < 0) {
		fprintf(stderr, "open /dev/kvm: %s\n", strerror(errno));
		return SKIP;
	}
	vm = ioctl(kvm, KVM_CREATE_VM, 0);
	if (vm < 0) {
		fprintf(stderr, "KVM_CREATE_VM: %s\n", strerror(errno));
		goto error;
	}
	mem = mmap(NULL, 0x10000, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED) {
		fprintf(stderr, "mmap guest memory: %s\n", strerror(errno));
		goto error;
	}
	memcpy(mem + 0x1000, code, sizeof(code));
	region = (struct kvm_userspace_memory_region){ .slot = 0, .guest_phys_addr = 0,
		.memory_size = 0x10000, .userspace_addr = (uint64_t)(uintptr_t)mem };
	if (ioctl(vm, KVM_SET_USER_MEMORY_REGION, &region)) {
		fprintf(stderr, "KVM_SET_USER_MEMORY_REGION: %s\n", strerror(errno));
		goto error;
	}
	vcpu = ioctl(vm, KVM_CREATE_VCPU, 0);
	if (vcpu < 0) {
		fprintf(stderr, "KVM_CREATE_VCPU: %s\n", strerror(errno));
		goto error;
	}
	run_size = ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0);
	if (run_size < (long)sizeof(*run)) {
		fprintf(stderr, "KVM_GET_VCPU_MMAP_SIZE: %s\n", strerror(errno));
		goto error;
	}
	run = mmap(NULL, (size_t)run_size, PROT_READ | PROT_WRITE, MAP_SHARED, vcpu, 0);
	if (run == MAP_FAILED) {
		fprintf(stderr, "mmap kvm_run: %s\n", strerror(errno));
		goto error;
	}
	if (ioctl(vcpu, KVM_GET_SREGS, &sregs)) {
		fprintf(stderr, "KVM_GET_SREGS: %s\n", strerror(errno));
		goto error;
	}
	sregs.cs.base = 0;
	sregs.cs.selector = 0;
	if (ioctl(vcpu, KVM_SET_SREGS, &sregs)) {
		fprintf(stderr, "KVM_SET_SREGS: %s\n", strerror(errno));
		goto error;
	}
	memset(&regs, 0, sizeof(regs));
	regs.rip = 0x1000;
	regs.rflags = 0x2;
	if (ioctl(vcpu, KVM_SET_REGS, &regs)) {
		fprintf(stderr, "KVM_SET_REGS: %s\n", strerror(errno));
		goto error;
	}
	for (long r = 0; r < reps; r++) {
		uint64_t t0 = now_ns();

		for (long i = 0; i < iters; i++) {
			if (ioctl(vcpu, KVM_RUN, 0)) {
				fprintf(stderr, "KVM_RUN: %s\n", strerror(errno));
				goto error;
			}
			want++;
			if (run->exit_reason == KVM_EXIT_IO && run->io.port == PORT &&
			    run->io.direction == KVM_EXIT_IO_OUT && run->io.size == 1 &&
			    run->io.count == 1 &&
			    ((uint8_t *)run)[run->io.data_offset] == want)
				got++;
		}
		report(now_ns() - t0, iters);
	}
	rc = 0;
error:
	if (run != MAP_FAILED)
		munmap(run, (size_t)run_size);
	if (vcpu >= 0)
		close(vcpu);
	if (mem != MAP_FAILED)
		munmap(mem, 0x10000);
	if (vm >= 0)
		close(vm);
	close(kvm);
	return rc;
}

static int uffd_open(uint64_t features)
{
	struct uffdio_api api = { .api = UFFD_API, .features = features };
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);

	if (fd < 0) {
		fprintf(stderr, "userfaultfd: %s\n", strerror(errno));
		return -1;
	}
	if (ioctl(fd, UFFDIO_API, &api)) {
		fprintf(stderr, "UFFDIO_API (features 0x%llx): %s\n",
			(unsigned long long)features, strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

static int uffd_register(int fd, void *addr, size_t len, uint64_t mode)
{
	struct uffdio_register reg = { .range = { .start = (uint64_t)(uintptr_t)addr,
						  .len = len }, .mode = mode };

	if (ioctl(fd, UFFDIO_REGISTER, &reg)) {
		fprintf(stderr, "UFFDIO_REGISTER: %s\n", strerror(errno));
		return -1;
	}
	return 0;
}

/* copy: fresh pages each repetition, the range zapped outside the clock. */
static int part_copy(void)
{
	size_t len = (size_t)iters * PAGE;
	uint8_t *dst = MAP_FAILED, *src = MAP_FAILED;
	int fd, rc = 1;

	fd = uffd_open(0);
	if (fd < 0)
		return SKIP;
	src = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	dst = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (src == MAP_FAILED || dst == MAP_FAILED) {
		fprintf(stderr, "mmap: %s\n", strerror(errno));
		goto error;
	}
	memset(src, 0x5a, PAGE);
	if (uffd_register(fd, dst, len, UFFDIO_REGISTER_MODE_MISSING))
		goto error;
	for (long r = 0; r < reps; r++) {
		uint64_t t0 = now_ns();

		for (long i = 0; i < iters; i++) {
			struct uffdio_copy c = { .dst = (uint64_t)(uintptr_t)(dst + i * PAGE),
				.src = (uint64_t)(uintptr_t)src, .len = PAGE };

			if (ioctl(fd, UFFDIO_COPY, &c)) {
				fprintf(stderr, "UFFDIO_COPY page %ld: %s\n", i, strerror(errno));
				goto error;
			}
			if (c.copy != (int64_t)PAGE) {
				fprintf(stderr, "UFFDIO_COPY page %ld: copied %lld of %ld bytes\n",
					i, (long long)c.copy, (long)PAGE);
				goto error;
			}
		}
		report(now_ns() - t0, iters);
		for (long i = 0; i < iters; i++)
			got += dst[i * PAGE] == 0x5a && dst[i * PAGE + PAGE - 1] == 0x5a;
		if (madvise(dst, len, MADV_DONTNEED)) {
			fprintf(stderr, "madvise(MADV_DONTNEED): %s\n", strerror(errno));
			goto error;
		}
	}
	rc = 0;
error:
	if (dst != MAP_FAILED)
		munmap(dst, len);
	if (src != MAP_FAILED)
		munmap(src, PAGE);
	close(fd);
	return rc;
}

/* continue: the page cache filled once through a second mapping; only the
 * registered mapping's page table entries are zapped between repetitions. */
static int part_continue(void)
{
	size_t len = (size_t)iters * PAGE;
	uint8_t *fill = MAP_FAILED, *dst = MAP_FAILED;
	int fd, mfd = -1, rc = 1;

	fd = uffd_open(UFFD_FEATURE_MINOR_SHMEM);
	if (fd < 0)
		return SKIP;
	mfd = memfd_create("floor-continue", MFD_CLOEXEC);
	if (mfd < 0 || ftruncate(mfd, (off_t)len)) {
		fprintf(stderr, "memfd_create/ftruncate: %s\n", strerror(errno));
		goto error;
	}
	fill = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	dst = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	if (fill == MAP_FAILED || dst == MAP_FAILED) {
		fprintf(stderr, "mmap memfd: %s\n", strerror(errno));
		goto error;
	}
	for (long i = 0; i < iters; i++)
		memset(fill + i * PAGE, (int)(i & 0xff) | 1, PAGE);
	if (uffd_register(fd, dst, len, UFFDIO_REGISTER_MODE_MINOR))
		goto error;
	for (long r = 0; r < reps; r++) {
		uint64_t t0 = now_ns();

		for (long i = 0; i < iters; i++) {
			struct uffdio_continue c = { .range = {
				.start = (uint64_t)(uintptr_t)(dst + i * PAGE), .len = PAGE } };

			if (ioctl(fd, UFFDIO_CONTINUE, &c)) {
				fprintf(stderr, "UFFDIO_CONTINUE page %ld: %s\n", i, strerror(errno));
				goto error;
			}
			if (c.mapped != (int64_t)PAGE) {
				fprintf(stderr, "UFFDIO_CONTINUE page %ld: mapped %lld of %ld bytes\n",
					i, (long long)c.mapped, (long)PAGE);
				goto error;
			}
		}
		report(now_ns() - t0, iters);
		for (long i = 0; i < iters; i++)
			got += dst[i * PAGE] == ((i & 0xff) | 1);
		if (madvise(dst, len, MADV_DONTNEED)) {
			fprintf(stderr, "madvise(MADV_DONTNEED): %s\n", strerror(errno));
			goto error;
		}
	}
	rc = 0;
error:
	if (dst != MAP_FAILED)
		munmap(dst, len);
	if (fill != MAP_FAILED)
		munmap(fill, len);
	if (mfd >= 0)
		close(mfd);
	close(fd);
	return rc;
}

/* switch / wakeup: eventfd ping-pong. */
struct pong {
	int ping, pongfd, cpu, err;
	long rounds;
};

/* How long the main thread waits for one pong before it gives up. */
#define PONG_TIMEOUT_MS 10000

/* One eventfd value moved: 0, or an error said on stderr (errno taken at
 * the failing call; a short count printed as the count). */
static int move8(int fd, int writing, uint64_t *v, const char *who, long round)
{
	ssize_t n = writing ? write(fd, v, sizeof(*v)) : read(fd, v, sizeof(*v));
	int e = errno;

	if (n == (ssize_t)sizeof(*v))
		return 0;
	if (n < 0)
		fprintf(stderr, "%s round %ld: %s: %s\n", who, round,
			writing ? "write" : "read", strerror(e));
	else
		fprintf(stderr, "%s round %ld: %s moved %zd of %zu bytes\n", who, round,
			writing ? "write" : "read", n, sizeof(*v));
	return 1;
}

static void *pong_thread(void *arg)
{
	struct pong *p = arg;
	uint64_t v;

	for (long i = 0; i < p->rounds; i++) {
		if (move8(p->ping, 0, &v, "pong thread", i) ||
		    move8(p->pongfd, 1, &v, "pong thread", i)) {
			p->err = 1;  /* said on stderr; the main thread's poll times out */
			return NULL;
		}
	}
	return NULL;
}

static int part_pingpong(int cpu_a, int cpu_b)
{
	struct pong p = { .ping = eventfd(0, EFD_CLOEXEC), .pongfd = eventfd(0, EFD_CLOEXEC),
			  .cpu = cpu_b, .rounds = reps * iters };
	pthread_attr_t attr;
	cpu_set_t set;
	pthread_t th;
	uint64_t one = 1, v;
	int rc = 1, started = 0, e;

	if (p.ping < 0 || p.pongfd < 0) {
		fprintf(stderr, "eventfd: %s\n", strerror(errno));
		goto error;
	}
	if (pin(cpu_a))
		goto error;
	/* pinned before it starts, so it never runs, or fails, elsewhere */
	CPU_ZERO(&set);
	CPU_SET(cpu_b, &set);
	e = pthread_attr_init(&attr);
	if (e) {
		fprintf(stderr, "pthread_attr_init: %s\n", strerror(e));
		goto error;
	}
	e = pthread_attr_setaffinity_np(&attr, sizeof(set), &set);
	if (e) {
		fprintf(stderr, "pthread_attr_setaffinity_np(CPU %d): %s\n", cpu_b, strerror(e));
		pthread_attr_destroy(&attr);
		goto error;
	}
	e = pthread_create(&th, &attr, pong_thread, &p);
	pthread_attr_destroy(&attr);
	if (e) {
		fprintf(stderr, "pthread_create: %s\n", strerror(e));
		goto error;
	}
	started = 1;
	for (long r = 0; r < reps; r++) {
		uint64_t t0 = now_ns();

		for (long i = 0; i < iters; i++) {
			struct pollfd pfd = { .fd = p.pongfd, .events = POLLIN };
			int n;

			if (move8(p.ping, 1, &one, "ping", i))
				goto error;
			/* bounded: a pong thread that failed never answers */
			n = poll(&pfd, 1, PONG_TIMEOUT_MS);
			if (n < 0) {
				fprintf(stderr, "ping round %ld: poll: %s\n", i, strerror(errno));
				goto error;
			}
			if (n == 0) {
				fprintf(stderr, "ping round %ld: no pong in %d ms\n", i,
					PONG_TIMEOUT_MS);
				goto error;
			}
			if (move8(p.pongfd, 0, &v, "ping", i))
				goto error;
			got += v == 1;
		}
		report(now_ns() - t0, 2 * iters);
	}
	rc = 0;
error:
	if (started) {
		if (rc)  /* it may be blocked in read(ping): a cancellation point */
			pthread_cancel(th);
		pthread_join(th, NULL);
		if (p.err)
			rc = 1;
	}
	if (p.ping >= 0)
		close(p.ping);
	if (p.pongfd >= 0)
		close(p.pongfd);
	return rc;
}

/* fault: a first write to each page of anonymous memory, no userfaultfd. */
static int part_fault(void)
{
	size_t len = (size_t)iters * PAGE;
	volatile uint8_t *m;
	int rc = 1;

	m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) {
		fprintf(stderr, "mmap: %s\n", strerror(errno));
		return 1;
	}
	for (long r = 0; r < reps; r++) {
		uint64_t t0 = now_ns();

		for (long i = 0; i < iters; i++)
			m[i * PAGE] = 1;
		report(now_ns() - t0, iters);
		for (long i = 0; i < iters; i++)
			got += m[i * PAGE] == 1;
		if (madvise((void *)m, len, MADV_DONTNEED)) {
			fprintf(stderr, "madvise(MADV_DONTNEED): %s\n", strerror(errno));
			goto error;
		}
	}
	rc = 0;
error:
	munmap((void *)m, len);
	return rc;
}

/* A whole decimal number in [lo, hi] from text, or 1 with the field named. */
static int number(const char *text, const char *field, long lo, long hi, long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(text, &end, 10);
	if (errno || end == text || *end || v < lo || v > hi) {
		fprintf(stderr, "%s: %s is not a whole number from %ld to %ld\n", field, text,
			lo, hi);
		return 1;
	}
	*out = v;
	return 0;
}

int main(int argc, char **argv)
{
	int cpu_a, cpu_b, rc;
	long l;
	const char *part;

	if (argc < 4 || argc > 6) {
		fprintf(stderr, "usage: %s exit|copy|continue|switch|wakeup|fault REPS ITERS "
			"[CPU_A [CPU_B]]\n", argv[0]);
		return 1;
	}
	part = argv[1];
	if (number(argv[2], "REPS", 1, 1L << 30, &reps) ||
	    number(argv[3], "ITERS", 1, 1L << 30, &iters))
		return 1;
	if (number(argc > 4 ? argv[4] : "0", "CPU_A", 0, CPU_SETSIZE - 1, &l))
		return 1;
	cpu_a = (int)l;
	if (number(argc > 5 ? argv[5] : "1", "CPU_B", 0, CPU_SETSIZE - 1, &l))
		return 1;
	cpu_b = (int)l;
	if (!strcmp(part, "switch"))
		rc = part_pingpong(cpu_a, cpu_a);
	else if (!strcmp(part, "wakeup"))
		rc = part_pingpong(cpu_a, cpu_b);
	else if (pin(cpu_a))
		rc = 1;
	else if (!strcmp(part, "exit"))
		rc = part_exit();
	else if (!strcmp(part, "copy"))
		rc = part_copy();
	else if (!strcmp(part, "continue"))
		rc = part_continue();
	else if (!strcmp(part, "fault"))
		rc = part_fault();
	else {
		fprintf(stderr, "unknown part %s\n", part);
		return 1;
	}
	printf("count %llu %lld\n", got, (long long)reps * iters);
	if (rc == 0 && got != (unsigned long long)(reps * iters)) {
		fprintf(stderr, "%s: %llu of %lld operations did what they should\n", part, got,
			(long long)reps * iters);
		rc = 1;
	}
	return rc;
}
