/* SPDX-License-Identifier: MIT */
/*
 * White-box cases of the SIGBUS guard (csrc/base/mapguard.c) and of
 * verify's read of a snapshot through it (csrc/uffd/verify.c): a copy from
 * a mapping of a file cut short is -EIO, in any thread, while a SIGBUS of
 * anyone else's still reaches the handler that was there before the first
 * hold, and one installed after that chains, without a loop between the
 * two. A run cannot time a truncation to
 * land inside verification; here the file is cut before verify reads it.
 */
#include "helpers.h"
#undef NSEC_PER_MSEC	/* base/util.h has its own, the same */
#undef NSEC_PER_SEC
#undef ARRAY_SIZE
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/mapguard.h"
#include "base/util.h"
#include "uffd/verify.h"

#define PAGES	4

struct file_map {
	int fd;
	uint8_t *map;
};

/* A file of PAGES pages, each byte its page's number + 1, mapped read-only. */
static bool file_map_make(struct file_map *f)
{
	char path[64];
	uint8_t page[PAGE];
	unsigned i;

	f->map = NULL;
	ukt_temp_template(path, sizeof(path), "/var/tmp", "ukvm-mapguard");
	f->fd = mkstemp(path);
	if (!CHECK(f->fd >= 0, "mkstemp: %s", strerror(errno)))
		return false;
	unlink(path);
	for (i = 0; i < PAGES; i++) {
		memset(page, (int)i + 1, sizeof(page));
		if (!CHECK(pwrite(f->fd, page, PAGE, (off_t)(i * PAGE)) == (ssize_t)PAGE))
			return false;
	}
	f->map = mmap(NULL, PAGES * PAGE, PROT_READ, MAP_SHARED, f->fd, 0);
	if (!CHECK(f->map != MAP_FAILED, "mmap: %s", strerror(errno))) {
		f->map = NULL;
		return false;
	}
	return true;
}

static void file_map_free(struct file_map *f)
{
	if (f->map)
		munmap(f->map, PAGES * PAGE);
	if (f->fd >= 0)
		close(f->fd);
}

static void (*current_handler(void))(int, siginfo_t *, void *)
{
	struct sigaction sa;

	sigaction(SIGBUS, NULL, &sa);
	return sa.sa_sigaction;
}

/* The handler "before the guard": records the fault and jumps back to the case. */
static sigjmp_buf prev_env;
static volatile uintptr_t prev_addr;
static volatile unsigned prev_calls;

static void prev_handler(int sig, siginfo_t *si, void *uc)
{
	prev_calls++;
	prev_addr = (uintptr_t)si->si_addr;
	siglongjmp(prev_env, 1);
}

static void install_prev(struct sigaction *old)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = prev_handler;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, old);
}

/*
 * X: a handler installed over the guard's after a run that chains to the
 * one it replaced, as faulthandler and crash reporters do. It counts its
 * calls, and gives up (exit 4) at a depth a loop would reach.
 */
static struct sigaction x_prev;
static volatile unsigned x_calls;

static void x_handler(int sig, siginfo_t *si, void *uc)
{
	if (++x_calls > 1000)
		_exit(4);
	if (x_prev.sa_flags & SA_SIGINFO)
		x_prev.sa_sigaction(sig, si, uc);
	else
		_exit(5);	/* it replaced no handler of ours */
}

static void install_x(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = x_handler;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, &x_prev);
}

/* In a child: the exit status of fn, which may die of a loop in the handlers. */
static int in_child(int (*fn)(struct file_map *), struct file_map *f)
{
	int status = 0;
	pid_t pid;

	pid = fork();
	if (pid == 0) {
		alarm(10);
		_exit(fn(f));
	}
	if (!CHECK(pid > 0 && waitpid(pid, &status, 0) == pid))
		return -1;
	CHECK(WIFEXITED(status), "the child died of signal %d", WTERMSIG(status));
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/*
 * Three runs, X put over the guard's after the first: each run a SIGBUS
 * sent and a fault outside any copy reach X once and then the handler
 * before the first hold; a copy past the file's end is still -EIO.
 * 0, or the number of the first check that failed.
 */
static int runs_with_x(struct file_map *f)
{
	uint8_t buf[PAGE];
	volatile unsigned run;	/* kept across the jumps back from prev_handler */

	for (run = 0; run < 3; run++) {
		if (ukvm_mapguard_hold())
			return 10;
		if (run == 1)
			install_x();
		x_calls = 0;
		prev_calls = 0;
		if (!sigsetjmp(prev_env, 1))
			kill(getpid(), SIGBUS);
		if (prev_calls != 1 || x_calls != (run > 0))
			return 11 + run;
		x_calls = 0;
		prev_addr = 0;
		if (!sigsetjmp(prev_env, 1))
			(void)*(volatile uint8_t *)(f->map + 2 * PAGE + 8);
		if (prev_addr != (uintptr_t)(f->map + 2 * PAGE + 8) || x_calls != (run > 0))
			return 21 + run;
		if (ukvm_mapguard_copy(buf, f->map + 3 * PAGE, PAGE) != -EIO)
			return 31 + run;
		ukvm_mapguard_release();
	}
	return 0;
}

struct copier {
	const uint8_t *src;
	int want;
	unsigned wrong;
};

static void *copier_thread(void *arg)
{
	struct copier *c = arg;
	uint8_t buf[PAGE];
	unsigned i;

	for (i = 0; i < 2000; i++)
		c->wrong += ukvm_mapguard_copy(buf, c->src, PAGE) != c->want;
	return NULL;
}

int main(void)
{
	struct sigaction old;
	struct file_map f;
	uint8_t buf[2 * PAGE];

	ukt_program = "mapguard";	/* no ukt_init: nothing here needs KVM */
	setvbuf(stderr, NULL, _IOLBF, 0);
	install_prev(&old);

	/* First: its child must make the first hold (the guard is installed once a process). */
	UKT_CASE("with the default action before, a SIGBUS not the guard's still kills") {
		struct sigaction dfl;
		int status = 0;
		pid_t pid;

		if (file_map_make(&f)) {
			CHECK_EQ(ftruncate(f.fd, PAGE), 0);
			pid = fork();
			if (pid == 0) {
				memset(&dfl, 0, sizeof(dfl));
				dfl.sa_handler = SIG_DFL;
				sigaction(SIGBUS, &dfl, NULL);
				if (ukvm_mapguard_hold())
					_exit(2);
				alarm(10);	/* a handler that retried forever: SIGALRM */
				(void)*(volatile uint8_t *)(f.map + 2 * PAGE);
				_exit(3);
			}
			CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
			CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS,
			      "the child ended with status 0x%x", status);
		}
		file_map_free(&f);
	}

	UKT_CASE("a copy from the file's pages is theirs; past its new end, -EIO") {
		if (file_map_make(&f)) {
			CHECK_EQ(ukvm_mapguard_hold(), 0);
			CHECK_EQ(ukvm_mapguard_copy(buf, f.map + 3 * PAGE, PAGE), 0);
			CHECK(buf[0] == 4 && buf[PAGE - 1] == 4);
			CHECK_EQ(ftruncate(f.fd, 2 * PAGE), 0);
			CHECK_EQ(ukvm_mapguard_copy(buf, f.map + 3 * PAGE, PAGE), -EIO);
			CHECK_EQ(ukvm_mapguard_copy(buf, f.map + PAGE, 2 * PAGE), -EIO);  /* straddles */
			CHECK_EQ(ukvm_mapguard_copy(buf, f.map + PAGE, PAGE), 0);
			CHECK(buf[0] == 2);
			/* Again after a caught one: the jump left SIGBUS unblocked. */
			CHECK_EQ(ukvm_mapguard_copy(buf, f.map + 2 * PAGE, PAGE), -EIO);
			ukvm_mapguard_release();
			CHECK(current_handler() != prev_handler, "the guard was uninstalled");
		}
		file_map_free(&f);
	}

	UKT_CASE("a SIGBUS outside a guarded copy goes to the handler before") {
		if (file_map_make(&f)) {
			CHECK_EQ(ukvm_mapguard_hold(), 0);
			CHECK(current_handler() != prev_handler, "the guard is not installed");
			CHECK_EQ(ftruncate(f.fd, PAGE), 0);
			prev_addr = 0;
			if (!sigsetjmp(prev_env, 1))
				(void)*(volatile uint8_t *)(f.map + 2 * PAGE + 8);
			CHECK(prev_addr == (uintptr_t)(f.map + 2 * PAGE + 8),
			      "the handler before saw 0x%lx", (unsigned long)prev_addr);
			ukvm_mapguard_release();
		}
		file_map_free(&f);
	}

	UKT_CASE("a handler put over the guard's that chains to it: no loop, over runs") {
		/* Red when a later hold installed the guard over X again: X, ours, X, ... */
		if (file_map_make(&f)) {
			CHECK_EQ(ftruncate(f.fd, PAGE), 0);
			CHECK_EQ(in_child(runs_with_x, &f), 0);
		}
		file_map_free(&f);
	}

	UKT_CASE("threads copy at once, each caught on its own") {
		struct copier cut = { .want = -EIO }, whole = { .want = 0 };
		pthread_t a, b;

		if (file_map_make(&f)) {
			CHECK_EQ(ukvm_mapguard_hold(), 0);
			CHECK_EQ(ftruncate(f.fd, 2 * PAGE), 0);
			cut.src = f.map + 3 * PAGE;
			whole.src = f.map;
			CHECK_EQ(pthread_create(&a, NULL, copier_thread, &cut), 0);
			CHECK_EQ(pthread_create(&b, NULL, copier_thread, &whole), 0);
			pthread_join(a, NULL);
			pthread_join(b, NULL);
			CHECK_EQ(cut.wrong, 0u);
			CHECK_EQ(whole.wrong, 0u);
			ukvm_mapguard_release();
		}
		file_map_free(&f);
	}

	UKT_CASE("verify stops at a page the file no longer has, and says so") {
		struct ukvm_verify_params p = {
			.filled = true, .walkers = 1, .passes = 1, .gpa = 1ULL << 32,
			.size = PAGES * PAGE,
		};
		uint8_t *mem = malloc(PAGES * PAGE);
		char msg[256] = "";
		uint64_t sum = 0;

		if (CHECK(mem != NULL) && file_map_make(&f)) {
			memcpy(mem, f.map, PAGES * PAGE);	/* every page as the file has it */
			p.hva = mem;
			p.expect = f.map;
			CHECK_EQ(ukvm_mapguard_hold(), 0);
			CHECK_EQ(ukvm_verify_region(&p, NULL, &sum, msg, sizeof(msg)), 0);
			CHECK_EQ(ftruncate(f.fd, 2 * PAGE), 0);
			CHECK_EQ(ukvm_verify_region(&p, NULL, &sum, msg, sizeof(msg)), 1);
			CHECK(strstr(msg, "page at gpa 0x100002000: the source file has no bytes at "
				      "its offset any more") != NULL, "%s", msg);
			ukvm_mapguard_release();
		}
		file_map_free(&f);
		free(mem);
	}

	sigaction(SIGBUS, &old, NULL);
	return ukt_exit();
}
