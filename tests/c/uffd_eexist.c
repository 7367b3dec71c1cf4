/* SPDX-License-Identifier: MIT */
/*
 * White-box cases of the resolving ioctls' EEXIST (csrc/uffd/uffd.c): it
 * means "there already", except for a huge page the kernel could not
 * allocate. Outside hugetlb memory a page mincore() calls absent may still
 * be there to the ioctl (an anonymous page swapped out and out of the swap
 * cache, a pte marker), and doubting the EEXIST there failed good runs with
 * ENOMEM after a second of retries. A poison marker (UFFDIO_POISON, Linux
 * 6.6) makes that page here: UFFDIO_ZEROPAGE refuses to overwrite it
 * (EEXIST), and mincore() reports it absent.
 */
#include "helpers.h"
#undef NSEC_PER_MSEC	/* base/util.h has its own, the same */
#undef NSEC_PER_SEC
#undef ARRAY_SIZE
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "uffd/uffd.h"

/* Linux 6.6's UAPI, newer than the headers the core is built against. */
#define T_UFFD_FEATURE_POISON	(1ULL << 14)
struct t_uffdio_poison {
	struct uffdio_range range;
	__u64 mode;
	__s64 updated;
};
#define T_UFFDIO_POISON		_IOWR(UFFDIO, 0x08, struct t_uffdio_poison)

int main(void)
{
	struct ukvm_error err = { 0 };
	int uffd;

	ukt_program = "uffd_eexist";	/* no ukt_init: nothing here needs KVM */
	setvbuf(stderr, NULL, _IOLBF, 0);

	UKT_CASE("anonymous memory: EEXIST for a page mincore() calls absent is EEXIST, at once") {
		uint8_t *mem = MAP_FAILED;
		unsigned char vec = 1;
		uint64_t start, ms;
		int ret;

		uffd = ukvm_uffd_open(false, T_UFFD_FEATURE_POISON, &err);
		if (uffd < 0) {
			ukt_skip_case(ukt_fmt("no UFFD_FEATURE_POISON (Linux 6.6): %s", err.message));
		} else {
			mem = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE,
				   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			CHECK(mem != MAP_FAILED);
		}
		if (uffd >= 0 && mem != MAP_FAILED &&
		    CHECK_EQ(ukvm_uffd_register(uffd, mem, 4 * PAGE, UKVM_UFFD_MISSING,
						UKVM_BACKING_ANONYMOUS, &err), 0)) {
			struct t_uffdio_poison poison = {
				.range = { .start = (uint64_t)(uintptr_t)mem, .len = PAGE },
			};

			CHECK_EQ(ioctl(uffd, T_UFFDIO_POISON, &poison), 0);
			/* The premise: absent to mincore(), there to the ioctl. */
			CHECK_EQ(mincore(mem, PAGE, &vec), 0);
			CHECK_EQ(vec & 1, 0);
			start = ukt_now_ns();
			ret = ukvm_uffd_zeropage(uffd, (uint64_t)(uintptr_t)mem, PAGE);
			ms = (ukt_now_ns() - start) / 1000000;
			CHECK_EQ(ret, -EEXIST);		/* was -ENOMEM, after 1 s */
			CHECK(ms < 500, "returned after %llu ms", (unsigned long long)ms);
			/* A page not there at all is still resolved. */
			CHECK_EQ(ukvm_uffd_zeropage(uffd, (uint64_t)(uintptr_t)mem + PAGE, PAGE), 0);
		}
		if (mem != MAP_FAILED)
			munmap(mem, 4 * PAGE);
		if (uffd >= 0)
			close(uffd);
	}

	UKT_CASE("an address registered over hugetlb, then over anonymous memory, is anonymous's") {
		const uint64_t huge = 2 * MiB;
		uint8_t *mem = MAP_FAILED, *anon = MAP_FAILED;
		uint64_t start, ms;
		int ret;

		uffd = ukvm_uffd_open(false, T_UFFD_FEATURE_POISON, &err);
		if (uffd < 0) {
			ukt_skip_case(ukt_fmt("no UFFD_FEATURE_POISON (Linux 6.6): %s", err.message));
		} else {
			mem = mmap(NULL, huge, PROT_READ | PROT_WRITE,
				   MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
			if (mem == MAP_FAILED)
				ukt_skip_case("no free 2 MiB huge page");
		}
		if (mem != MAP_FAILED &&
		    CHECK_EQ(ukvm_uffd_register(uffd, mem, huge, UKVM_UFFD_MISSING,
						UKVM_BACKING_ANONYMOUS_HUGETLB, &err), 0)) {
			/* The next run's memory at the same address (the range stays noted). */
			anon = mmap(mem, huge, PROT_READ | PROT_WRITE,
				    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
			mem = MAP_FAILED;
			if (CHECK(anon != MAP_FAILED) &&
			    CHECK_EQ(ukvm_uffd_register(uffd, anon, huge, UKVM_UFFD_MISSING,
							UKVM_BACKING_ANONYMOUS, &err), 0)) {
				struct t_uffdio_poison poison = {
					.range = { .start = (uint64_t)(uintptr_t)anon, .len = PAGE },
				};

				CHECK_EQ(ioctl(uffd, T_UFFDIO_POISON, &poison), 0);
				start = ukt_now_ns();
				ret = ukvm_uffd_zeropage(uffd, (uint64_t)(uintptr_t)anon, PAGE);
				ms = (ukt_now_ns() - start) / 1000000;
				CHECK_EQ(ret, -EEXIST);	/* -ENOMEM, after 1 s, had the range stayed */
				CHECK(ms < 500, "returned after %llu ms", (unsigned long long)ms);
			}
		}
		if (mem != MAP_FAILED)
			munmap(mem, huge);
		if (anon != MAP_FAILED)
			munmap(anon, huge);
		if (uffd >= 0)
			close(uffd);
	}

	return ukt_exit();
}
