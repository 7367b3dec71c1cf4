/* SPDX-License-Identifier: MIT */
/*
 * The online merge (csrc/uffd/online.c) with no KVM: producer threads play
 * resolvers, through the calls the real ones make (stamp, fault, sleep),
 * with random service times, batches, waits in between (the waiting flag
 * set) and a drain tried every few events; each keeps its own copy of what
 * it handled. After the threads are joined, what the drains swept must equal
 * what a sort of every event after the run sweeps (the post-run build's
 * way), to the nanosecond, with the counts and the page-once bitmaps right.
 * A clock of 16 us steps makes many events share an instant, so the
 * order at a tie (ends first) and the strict watermark matter: with the
 * watermark taken as inclusive (test hook) the check fails. Five
 * producers share three vCPUs; the sixth alone serves the fourth, so a
 * drain that leaves the last queue out loses that vCPU's blocked time.
 *
 * And a waiting resolver holds nobody back: while one sleeps for long, the
 * others' queues stay short; with the waiting flags ignored (test hook)
 * they grow with every event, which the same check catches.
 */
#include <pthread.h>
#include <sched.h>

#include "helpers.h"
#undef NSEC_PER_MSEC	/* base/util.h has its own, the same */
#undef NSEC_PER_SEC
#undef ARRAY_SIZE
#include "base/hist.h"
#include "base/util.h"
#include "uffd/online.h"

#define GPA		(4ULL << 30)
#define VCPUS		4
#define PRODUCERS	6
#define FAULTS		3000	/* per producer */
#define PAGES		(PRODUCERS * FAULTS)
#define NOT_A_VCPU	999	/* a thread id the map does not know */

static const int32_t tids[VCPUS] = { 101, 102, 103, 104 };

struct fault {
	uint64_t read, done;
	int32_t vcpu;		/* -1: not a vCPU's */
	bool eexist;
};

struct producer {
	struct ukvm_online *o;
	struct ukvm_online_queue *q;
	unsigned index;
	uint64_t rng;
	struct fault *faults;
	unsigned n;
	unsigned pages;		/* resolved so far: pages index * FAULTS on */
	int ret;
};

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void spin_ns(uint64_t ns)
{
	uint64_t end = ukvm_now_ns() + ns;

	while (ukvm_now_ns() < end)
		__builtin_ia32_pause();
}

static void *producer(void *arg)
{
	struct producer *p = arg;

	while (p->n < FAULTS && !p->ret) {
		uint64_t t = ukvm_online_stamp(p->o, p->q);
		unsigned batch = 1 + rnd(&p->rng) % 4, k;

		for (k = 0; k < batch && p->n < FAULTS && !p->ret; k++) {
			struct fault *f = &p->faults[p->n];
			uint64_t r = rnd(&p->rng);
			/* the last producer alone serves the last vCPU, the others share the rest */
			int32_t vcpu = p->index == PRODUCERS - 1 ? VCPUS - 1 :
				       (int32_t)(r % (VCPUS - 1));
			int32_t tid = r % 17 == 0 ? NOT_A_VCPU : tids[vcpu];
			uint64_t page;

			spin_ns(r % 5000);
			f->read = t;
			f->done = ukvm_online_now(p->o);
			f->vcpu = tid == NOT_A_VCPU ? -1 : vcpu;
			f->eexist = r % 11 == 0;	/* an echo of a page resolved already */
			if (p->pages == 0)
				f->eexist = false;	/* nothing to echo yet */
			page = (uint64_t)p->index * FAULTS + (f->eexist ? 0 : p->pages++);
			p->ret = ukvm_online_fault(p->o, p->q, f->read, f->done, GPA + page * PAGE,
						   tid, f->eexist);
			p->n++;
		}
		if (rnd(&p->rng) % 3 == 0) {	/* waits, as a reader in poll() */
			struct timespec ts = { 0, (long)(rnd(&p->rng) % 100000) };

			ukvm_online_sleep(p->o, p->q);
			nanosleep(&ts, NULL);
		} else if (rnd(&p->rng) % 2) {
			sched_yield();
		}
	}
	ukvm_online_sleep(p->o, p->q);	/* leaving */
	return NULL;
}

struct want {
	uint64_t blocked_ns[VCPUS];
	uint64_t blocktime_ns;
	uint64_t faults[VCPUS], eexist[VCPUS], service_sum[VCPUS];
};

/* What the post-run build would say: every event, sorted, swept. */
static void after_the_run(struct producer *ps, uint64_t t0, struct want *w)
{
	uint64_t *ev = malloc(2 * PAGES * sizeof(*ev)), n = 0, i;
	struct ukvm_sweep st;
	unsigned p, k;

	memset(w, 0, sizeof(*w));
	CHECK(ev, "malloc");
	for (p = 0; p < PRODUCERS; p++)
		for (k = 0; k < ps[p].n; k++) {
			const struct fault *f = &ps[p].faults[k];

			if (f->vcpu < 0)
				continue;
			ev[n++] = ukvm_ev_pack(f->read - t0, f->vcpu, +1);
			ev[n++] = ukvm_ev_pack(f->done - t0, f->vcpu, -1);
			w->faults[f->vcpu] += !f->eexist;
			w->eexist[f->vcpu] += f->eexist;
			w->service_sum[f->vcpu] += f->done - f->read;
		}
	ukvm_sort_u64(ev, n);
	CHECK_EQ(ukvm_sweep_begin(&st, VCPUS), 0);
	for (i = 0; i < n; i++)
		ukvm_sweep_packed(&st, ev[i], t0);
	memcpy(w->blocked_ns, st.blocked_ns, sizeof(w->blocked_ns));
	w->blocktime_ns = st.blocktime_ns;
	ukvm_sweep_end(&st);
	free(ev);
}

/*
 * One run of PRODUCERS threads: the differences between the online result
 * and the sort's (0: none), with the drains made mid-run in *drains.
 */
static unsigned run_producers(bool skip_last, bool nonstrict, uint64_t *drains)
{
	static struct ukvm_vcpu_result vr[VCPUS];
	struct producer ps[PRODUCERS];
	pthread_t th[PRODUCERS];
	struct ukvm_online o;
	struct ukvm_faultlog log;
	struct want w;
	unsigned i, v, diff = 0;
	uint64_t pages;

	ukvm_online_init(&o);
	CHECK_EQ(ukvm_online_create(&o, VCPUS, PRODUCERS, GPA, PAGES, PAGE), 0);
	o.test_clock_shift = 14;	/* 16 us steps: ties */
	o.t0 = ukvm_online_now(&o);
	o.drain_at = 16;
	o.test_skip_last = skip_last;
	o.test_nonstrict = nonstrict;
	for (v = 0; v < VCPUS; v++)
		ukvm_online_set_tid(&o, v, tids[v]);
	ukvm_online_tids_done(&o);
	for (i = 0; i < PRODUCERS; i++) {
		ps[i] = (struct producer){ .o = &o, .q = ukvm_online_attach(&o), .index = i,
					   .rng = 0x9e3779b97f4a7c15ULL * (i + 1),
					   .faults = calloc(FAULTS, sizeof(struct fault)) };
		CHECK(ps[i].q && ps[i].faults, "a queue and a trace for producer %u", i);
	}
	for (i = 0; i < PRODUCERS; i++)
		CHECK_EQ(pthread_create(&th[i], NULL, producer, &ps[i]), 0);
	for (i = 0; i < PRODUCERS; i++) {
		pthread_join(th[i], NULL);
		CHECK_EQ(ps[i].ret, 0);
	}
	*drains = o.drains;
	memset(vr, 0, sizeof(vr));
	log = (struct ukvm_faultlog){ .nr_vcpus = VCPUS, .region_gpa = GPA, .region_pages = PAGES,
				      .page_size = PAGE, .vcpus = vr };
	CHECK_EQ(ukvm_online_finish(&o, &log), 0);
	after_the_run(ps, o.t0, &w);
	for (v = 0; v < VCPUS; v++) {
		diff += vr[v].blocked_ns != w.blocked_ns[v];
		/* counts and histograms do not depend on the merge */
		CHECK_EQ(vr[v].faults, w.faults[v]);
		CHECK_EQ(vr[v].eexist, w.eexist[v]);
		CHECK_EQ(vr[v].service_latency.count, w.faults[v] + w.eexist[v]);
		CHECK_EQ(vr[v].service_latency.sum, w.service_sum[v]);
	}
	diff += log.blocktime_ns != w.blocktime_ns;
	/* every page resolved once, the echoes EEXIST; the pages no fault reached */
	pages = 0;
	for (i = 0; i < PRODUCERS; i++)
		pages += FAULTS - ps[i].pages;
	CHECK_EQ(log.pages_not_once, pages);
	for (i = 0; i < PRODUCERS; i++)
		free(ps[i].faults);
	ukvm_online_destroy(&o);
	return diff;
}

/* The sleeper: one fault, then asleep (waiting) until told. */
struct sleeper {
	struct ukvm_online *o;
	struct ukvm_online_queue *q;
	atomic_bool go_on;
};

static void *sleeper(void *arg)
{
	struct sleeper *s = arg;
	uint64_t t = ukvm_online_stamp(s->o, s->q);

	ukvm_online_fault(s->o, s->q, t, ukvm_online_now(s->o), GPA, tids[0], false);
	ukvm_online_sleep(s->o, s->q);
	while (!atomic_load(&s->go_on))
		spin_ns(100000);
	return NULL;
}

/* The most events the busy resolver had queued while the other slept. */
static uint64_t held_while_one_sleeps(bool no_waiting)
{
	struct ukvm_online o;
	struct sleeper s;
	struct ukvm_online_queue *q;
	pthread_t th;
	uint64_t most = 0, t;
	unsigned i;

	ukvm_online_init(&o);
	CHECK_EQ(ukvm_online_create(&o, VCPUS, 2, GPA, PAGES, PAGE), 0);
	o.drain_at = 16;
	o.test_no_waiting = no_waiting;
	for (i = 0; i < VCPUS; i++)
		ukvm_online_set_tid(&o, i, tids[i]);
	ukvm_online_tids_done(&o);
	s.o = &o;
	s.q = ukvm_online_attach(&o);
	q = ukvm_online_attach(&o);
	atomic_init(&s.go_on, false);
	CHECK_EQ(pthread_create(&th, NULL, sleeper, &s), 0);
	while (!atomic_load(&s.q->waiting) || !atomic_load(&s.q->pushed))
		sched_yield();	/* the sleeper has faulted and sleeps */
	for (i = 1; i <= 2000; i++) {
		uint64_t held;

		t = ukvm_online_stamp(&o, q);
		CHECK_EQ(ukvm_online_fault(&o, q, t, ukvm_online_now(&o), GPA + i * PAGE, tids[1],
					   false), 0);
		held = q->pushed_own - atomic_load(&q->taken);
		most = held > most ? held : most;
	}
	atomic_store(&s.go_on, true);
	pthread_join(th, NULL);
	ukvm_online_destroy(&o);
	return most;
}

int main(void)
{
	uint64_t drains;

	ukt_init("online_drain");

	UKT_CASE("drained while running, the same as sorted after: to the nanosecond") {
		unsigned run;

		for (run = 0; run < 3; run++) {
			CHECK_EQ(run_producers(false, false, &drains), 0);
			CHECK_GE(drains, 10);	/* the merge ran while the producers did */
		}
	}
	UKT_CASE("a drain that leaves a queue out is caught") {
		CHECK_GE(run_producers(true, false, &drains), 1);
	}
	UKT_CASE("a waiting resolver holds the others back not at all; without the flag, it does") {
		uint64_t with = held_while_one_sleeps(false), without = held_while_one_sleeps(true);

		/* a drain every 16 events, each taking all but the newest */
		CHECK_LE(with, 64);
		CHECK_GE(without, 2 * 2000 - 2);
	}
	return ukt_exit();
}
