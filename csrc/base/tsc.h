/* SPDX-License-Identifier: MIT */
/*
 * The host's TSC against CLOCK_MONOTONIC, and the guest's TSC against the
 * host's: what it takes to put the guest's own stamps (guest_timing) on the
 * clock the readers stamp with.
 *
 * Host side: CLOCK_MONOTONIC is a linear function of the TSC between NTP
 * adjustments. The controller samples (TSC, CLOCK_MONOTONIC) pairs while the
 * run goes on, each pair read between two rdtsc's so its error is known,
 * and a TSC value converts by linear interpolation between the pairs around
 * it.
 *
 * Guest side: KVM runs the guest's TSC at the host's rate plus a per-vCPU
 * offset (no scaling unless the VMM asks for another frequency, which uffdkvm
 * never does). KVM reports the offset (KVM_VCPU_TSC_CTRL / KVM_VCPU_TSC_OFFSET);
 * independently, the guest exits a few times with its TSC in hand, which
 * brackets the offset between the host's rdtsc before and after each
 * KVM_RUN. The reported offset is used when it lies in that bracket (then
 * the conversion is exact up to the pairs' error); otherwise the bracket's
 * middle is, and its half-width is the error.
 *
 * Both assume one offset for the whole run. KVM keeps the offset it chose
 * when it created the vCPU unless someone writes it (uffdkvm never does),
 * except where the host kernel has marked its TSC unstable: then KVM
 * rewrites it each time it loads the vCPU (its thread scheduled in, or an
 * ioctl of the vCPU), so that the guest's TSC stands still while the vCPU
 * is out, and moves it on again to catch up with the host's clock. A bracket
 * wider than those moves cannot see them; KVM's offset, read at several
 * points of the run, can.
 */
#ifndef UKVM_TSC_H
#define UKVM_TSC_H

#include <stdbool.h>
#include <stdint.h>

static inline uint64_t ukvm_tsc_read(void)
{
	uint32_t lo, hi;

	__asm__ __volatile__("lfence; rdtsc" : "=a"(lo), "=d"(hi) :: "memory");
	return (uint64_t)hi << 32 | lo;
}

/* One reading of both clocks: ns was read while the TSC went from tsc to tsc + window. */
struct ukvm_tsc_pair {
	uint64_t tsc;		/* the middle of the window */
	uint64_t ns;		/* CLOCK_MONOTONIC */
	uint64_t window;	/* TSC cycles between the rdtsc's around clock_gettime */
};

struct ukvm_tsc_clock {
	struct ukvm_tsc_pair *pairs;	/* in time order */
	uint32_t nr;
	uint32_t cap;
};

void ukvm_tsc_clock_init(struct ukvm_tsc_clock *c);
/* Takes one more pair (the best of a few tries); -ENOMEM or 0. */
int ukvm_tsc_clock_sample(struct ukvm_tsc_clock *c);
/* CLOCK_MONOTONIC ns of a host TSC value; needs two pairs, else 0. */
uint64_t ukvm_tsc_clock_ns(const struct ukvm_tsc_clock *c, uint64_t tsc);
/* Host TSC cycles per nanosecond over the pairs (0 with fewer than two). */
double ukvm_tsc_clock_cycles_per_ns(const struct ukvm_tsc_clock *c);
/* The conversion's error bound in ns: half the widest pair window. */
double ukvm_tsc_clock_error_ns(const struct ukvm_tsc_clock *c);
void ukvm_tsc_clock_destroy(struct ukvm_tsc_clock *c);

/* The guest's TSC offset, bracketed by sync exits: lo <= guest - host <= hi. */
struct ukvm_tsc_bracket {
	int64_t lo;
	int64_t hi;
	uint32_t rounds;
};

void ukvm_tsc_bracket_init(struct ukvm_tsc_bracket *b);
/* Both brackets at once (a constant offset lies in each), in *b: false if they do not meet. */
bool ukvm_tsc_bracket_meet(struct ukvm_tsc_bracket *b, const struct ukvm_tsc_bracket *other);
/* One sync exit: the guest read guest_tsc while the host's TSC went from before to after. */
void ukvm_tsc_bracket_add(struct ukvm_tsc_bracket *b, uint64_t guest_tsc, uint64_t before,
			  uint64_t after);

/* KVM's offset of one vCPU, read at several points of a run. */
struct ukvm_tsc_offsets {
	int64_t last;
	int64_t lo;
	int64_t hi;
	uint32_t reads;
	uint32_t changes;	/* readings that differed from the one before */
};

void ukvm_tsc_offsets_init(struct ukvm_tsc_offsets *o);
void ukvm_tsc_offsets_add(struct ukvm_tsc_offsets *o, int64_t offset);
/* Every reading the same value (so too with none: nothing says otherwise). */
bool ukvm_tsc_offsets_steady(const struct ukvm_tsc_offsets *o);

#endif
