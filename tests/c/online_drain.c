/* SPDX-License-Identifier: MIT */
/*
 * The online merge (csrc/uffd/online.c) with no KVM: producer threads play
 * resolvers, through the calls the real ones make (stamp, fault, sleep),
 * with random service times, batches, waits in between (the waiting flag
 * set) and a drain tried every few events; each keeps its own copy of what
 * it handled. After the threads are joined, what the drains swept must equal
 * what a sort of every event after the run sweeps (the post-run build's
 * way), to the nanosecond, with the counts and the page-once bitmaps right.
 * A clock of 16 us steps makes many events share an instant; every span
 * lasts at least one step, so each vCPU's blocked time is more than 0 and
 * the comparison says something. Five producers share three vCPUs; the
 * sixth alone serves the fourth, so a drain that leaves the last queue out
 * loses that vCPU's blocked time. A bound one clock step late (test hook)
 * takes events that a slower queue then undercuts: the sweep sees events
 * out of order and the finish fails. A watermark taken as inclusive (test
 * hook) is shown to give the same numbers: every held-back end is later
 * than its queue's watermark and a span of no time has no events, so what
 * a later drain brings at the bound's instant are starts, which ties leave
 * where they are (see "an inclusive watermark" below).
 *
 * And a waiting resolver holds nobody back: while one sleeps for long, the
 * others' queues stay short; with the waiting flags ignored (test hook)
 * they grow with every event, which the same check catches.
 *
 * Then single-threaded cases with times made by hand (a clock of 1 ns,
 * t0 a second back so every time is in the past): a drain that fills the
 * scratch exactly, a flush that fails (test hook: a full chunk gets no
 * next), a stamp or a sleep that fails, more faults than a read returns,
 * spans of no time, and events lost, doubled or out of order, which the
 * finish refuses.
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

/* The clock past t: a span that lasts at least a clock step (it ticks on). */
static uint64_t done_after(const struct ukvm_online *o, uint64_t t)
{
	uint64_t now;

	while ((now = ukvm_online_now(o)) <= t)
		__builtin_ia32_pause();
	return now;
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
			f->done = done_after(p->o, f->read);	/* every span blocks */
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
			if (f->done != f->read) {	/* a span of no time has no events */
				ev[n++] = ukvm_ev_pack(f->read - t0, f->vcpu, +1);
				ev[n++] = ukvm_ev_pack(f->done - t0, f->vcpu, -1);
			}
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

/* How the merge is run: right, or broken by a test hook (online.h). */
enum merge { MERGE_RIGHT, MERGE_SKIP_LAST, MERGE_INCLUSIVE, MERGE_LATE };

/*
 * One run of PRODUCERS threads: the differences between the online result
 * and the sort's (0: none; a finish that fails counts one), with the drains
 * made mid-run in *drains.
 */
static unsigned run_producers(enum merge merge, uint64_t *drains)
{
	static struct ukvm_vcpu_result vr[VCPUS];
	struct producer ps[PRODUCERS];
	pthread_t th[PRODUCERS];
	struct ukvm_online o;
	struct ukvm_faultlog log;
	struct want w;
	struct ukvm_error err = { 0 };
	unsigned i, v, diff = 0;
	uint64_t pages;
	int ret;

	ukvm_online_init(&o);
	CHECK_EQ(ukvm_online_create(&o, VCPUS, PRODUCERS, GPA, PAGES, PAGE), 0);
	o.test_clock_shift = 14;	/* 16 us steps: ties */
	o.t0 = ukvm_online_now(&o);
	o.drain_at = 16;
	o.test_skip_last = merge == MERGE_SKIP_LAST;
	o.test_nonstrict = merge == MERGE_INCLUSIVE;
	o.test_late_bound = merge == MERGE_LATE;
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
	ret = ukvm_online_finish(&o, &log, &err);
	if (ret) {
		printf("# the finish: %s\n", err.message);
		CHECK_EQ(ret, -EPROTO);	/* a broken merge, never a lack of memory */
		diff++;
		goto out;
	}
	after_the_run(ps, o.t0, &w);
	for (v = 0; v < VCPUS; v++) {
		CHECK(w.blocked_ns[v] > 0, "vCPU %u was blocked for some time", v);
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
out:
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

	ukvm_online_fault(s->o, s->q, t, done_after(s->o, t), GPA, tids[0], false);
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
		CHECK_EQ(ukvm_online_fault(&o, q, t, done_after(&o, t), GPA + i * PAGE, tids[1],
					   false), 0);
		held = q->pushed_own - atomic_load(&q->taken);
		most = held > most ? held : most;
	}
	atomic_store(&s.go_on, true);
	pthread_join(th, NULL);
	ukvm_online_destroy(&o);
	return most;
}

/*
 * For the cases by hand: queues resolvers of their own, no drain but the
 * ones a case makes, a clock of 1 ns and t0 a second back, so that every
 * time a case gives (from t0) is in the past.
 */
static void solo_create(struct ukvm_online *o, unsigned queues)
{
	unsigned v;

	ukvm_online_init(o);
	CHECK_EQ(ukvm_online_create(o, VCPUS, queues, GPA, PAGES, PAGE), 0);
	o->drain_at = UINT64_MAX;
	o->t0 = ukvm_online_now(o) - NSEC_PER_SEC;
	for (v = 0; v < VCPUS; v++)
		ukvm_online_set_tid(o, v, tids[v]);
	ukvm_online_tids_done(o);
}

/* A fault of vCPU vcpu on page, read at read and resolved at done (from t0). */
static int fault_at(struct ukvm_online *o, struct ukvm_online_queue *q, uint64_t read,
		    uint64_t done, unsigned vcpu, uint64_t page)
{
	return ukvm_online_fault(o, q, o->t0 + read, o->t0 + done, GPA + page * PAGE, tids[vcpu],
				 false);
}

/* The finish into vr: its return, the message in err. */
static int solo_finish(struct ukvm_online *o, struct ukvm_vcpu_result *vr, struct ukvm_error *err)
{
	struct ukvm_faultlog log = { .nr_vcpus = VCPUS, .vcpus = vr };

	memset(vr, 0, VCPUS * sizeof(*vr));
	memset(err, 0, sizeof(*err));
	return ukvm_online_finish(o, &log, err);
}

/*
 * Three queues whose first drain takes exactly o->scratch_cap events, the
 * last queue's newest start left at the bound: the finish's return, each
 * vCPU's blocked time checked.
 */
static int scratch_exactly_full(void)
{
	struct ukvm_online o;
	struct ukvm_online_queue *q[3];
	struct ukvm_vcpu_result vr[VCPUS];
	struct ukvm_error err;
	uint64_t cap, rest, far, k, taken = 0, n0;
	unsigned i;
	int ret;

	solo_create(&o, 3);
	for (i = 0; i < 3; i++) {
		q[i] = ukvm_online_attach(&o);
		CHECK(q[i], "queue %u", i);
		ukvm_online_stamp(&o, q[i]);	/* awake */
	}
	cap = o.scratch_cap;
	/* q[2] sets the bound at its third start: the drain takes its first 4 events */
	rest = cap - 4;
	/* q[1], one fault: its end past the bound when rest is odd (1 taken), else 2 */
	far = rest % 2 ? 3000000 : 15;
	CHECK_EQ(fault_at(&o, q[1], 10, far, 1, 1), 0);
	rest -= rest % 2 ? 1 : 2;
	/* q[0]: the rest, two events a fault, all before the bound */
	n0 = rest / 2;
	for (k = 0; k < n0; k++)
		CHECK_EQ(fault_at(&o, q[0], 100 + 10 * k, 105 + 10 * k, 0, 2 + k), 0);
	for (k = 0; k < 3; k++)
		CHECK_EQ(fault_at(&o, q[2], 2000000 + 10 * k, 2000005 + 10 * k, 2, 2 + n0 + k), 0);
	ukvm_online_stamp(&o, q[0]);	/* the held-back ends queued, watermarks now */
	ukvm_online_stamp(&o, q[1]);
	CHECK(ukvm_online_try_drain(&o), "the lock was free");
	for (i = 0; i < 3; i++)
		taken += atomic_load(&q[i]->taken);
	CHECK_EQ(taken, cap);			/* the scratch exactly full... */
	CHECK_EQ(o.scratch_cap, cap);		/* ...without growing */
	CHECK_EQ(atomic_load(&o.error), 0);
	ret = solo_finish(&o, vr, &err);
	if (!ret) {
		CHECK_EQ(vr[0].blocked_ns, 5 * n0);
		CHECK_EQ(vr[1].blocked_ns, far - 10);
		CHECK_EQ(vr[2].blocked_ns, 3 * 5);
	}
	ukvm_online_destroy(&o);
	return ret;
}

/*
 * 253 faults one after another, then a batch of 4 read at one time: the
 * chunk then has one slot left and 4 ends are held back. 0, a fault's
 * -errno, or -EBADE for another shape. No CHECK: a thread may call it
 * (CHECK formats into one static buffer).
 */
static int batch_at_chunk_end(struct ukvm_online *o, struct ukvm_online_queue *q)
{
	uint64_t k;
	int ret = 0;

	ukvm_online_stamp(o, q);
	for (k = 0; k < 253 && !ret; k++)
		ret = fault_at(o, q, 100 + 10 * k, 105 + 10 * k, 0, k);
	for (k = 0; k < 4 && !ret; k++)
		ret = fault_at(o, q, 10000, 10001 + k, 1, 300 + k);
	if (!ret && (q->tail_used != UKVM_ONLINE_CHUNK - 1 || q->npend != 4))
		ret = -EBADE;
	return ret;
}

#define BATCH_EVENTS	(2 * (253 + 4))

/* A resolver whose flush fails as it goes to sleep, while the main thread drains. */
struct failer {
	struct ukvm_online *o;
	struct ukvm_online_queue *q;
	int ret;		/* batch_at_chunk_end's */
	atomic_bool done;
};

static void *failer(void *arg)
{
	struct failer *f = arg;

	f->ret = batch_at_chunk_end(f->o, f->q);
	f->q->test_no_chunk = true;
	ukvm_online_sleep(f->o, f->q);
	atomic_store(&f->done, true);
	return NULL;
}

int main(void)
{
	uint64_t drains;

	ukt_init("online_drain");

	UKT_CASE("drained while running, the same as sorted after: to the nanosecond") {
		unsigned run;

		for (run = 0; run < 3; run++) {
			CHECK_EQ(run_producers(MERGE_RIGHT, &drains), 0);
			CHECK_GE(drains, 10);	/* the merge ran while the producers did */
		}
	}
	UKT_CASE("a drain that leaves a queue out is caught") {
		CHECK_GE(run_producers(MERGE_SKIP_LAST, &drains), 1);
	}
	UKT_CASE("a bound a clock step late is caught") {
		CHECK_GE(run_producers(MERGE_LATE, &drains), 1);
	}
	/*
	 * What a drain at bound t leaves for later at t itself: a start (an
	 * end held back is later than its queue's watermark, and a span of
	 * no time has none), which the sort would put after every end at t
	 * anyway. So taking t as well changes nothing: the strict bound is
	 * kept for safety, not because this run could tell.
	 */
	UKT_CASE("an inclusive watermark: the same numbers") {
		CHECK_EQ(run_producers(MERGE_INCLUSIVE, &drains), 0);
	}
	UKT_CASE("a waiting resolver holds the others back not at all; without the flag, it does") {
		uint64_t with = held_while_one_sleeps(false), without = held_while_one_sleeps(true);

		/* a drain every 16 events, each taking all but the newest */
		CHECK_LE(with, 64);
		CHECK_GE(without, 2 * 2000 - 2);
	}
	UKT_CASE("a drain that fills the scratch exactly, at a bound, is no lack of memory") {
		CHECK_EQ(scratch_exactly_full(), 0);
	}
	UKT_CASE("a sleep whose flush fails keeps every end it did not queue, and the error") {
		struct ukvm_online o;
		struct ukvm_online_queue *q;
		struct ukvm_vcpu_result vr[VCPUS];
		struct ukvm_error err;

		solo_create(&o, 1);
		q = ukvm_online_attach(&o);
		CHECK_EQ(batch_at_chunk_end(&o, q), 0);
		q->test_no_chunk = true;
		ukvm_online_sleep(&o, q);	/* one end fills the chunk, the next gets none */
		CHECK_EQ(atomic_load(&o.error), -ENOMEM);
		CHECK_EQ(atomic_load(&q->waiting), 0);	/* the queue holds the bound at its mark */
		CHECK_EQ(q->npend, 3);			/* the one that failed among them */
		CHECK_EQ(q->pushed_own + q->npend, BATCH_EVENTS);
		q->test_no_chunk = false;
		ukvm_online_stamp(&o, q);	/* a flush that works: every event is there */
		CHECK_EQ(q->pushed_own, BATCH_EVENTS);
		CHECK_EQ(q->npend, 0);
		CHECK_EQ(solo_finish(&o, vr, &err), -ENOMEM);	/* the first error stays */
		CHECK(strstr(err.message, "online statistics"), "%s", err.message);
		ukvm_online_destroy(&o);
	}
	UKT_CASE("a stamp whose flush fails fails the run") {
		struct ukvm_online o;
		struct ukvm_online_queue *q;
		struct ukvm_vcpu_result vr[VCPUS];
		struct ukvm_error err;

		solo_create(&o, 1);
		q = ukvm_online_attach(&o);
		CHECK_EQ(batch_at_chunk_end(&o, q), 0);
		q->test_no_chunk = true;
		ukvm_online_stamp(&o, q);
		CHECK_EQ(atomic_load(&o.error), -ENOMEM);
		q->test_no_chunk = false;
		CHECK_EQ(solo_finish(&o, vr, &err), -ENOMEM);
		ukvm_online_destroy(&o);
	}
	UKT_CASE("a resolver's error while another drains: set once, kept (TSan: no race)") {
		struct ukvm_online o;
		struct ukvm_vcpu_result vr[VCPUS];
		struct ukvm_error err;
		struct failer f;
		pthread_t th;
		unsigned tries = 0;

		solo_create(&o, 2);
		f.o = &o;
		f.q = ukvm_online_attach(&o);
		CHECK(ukvm_online_attach(&o), "a second queue, asleep");
		atomic_init(&f.done, false);
		CHECK_EQ(pthread_create(&th, NULL, failer, &f), 0);
		while (!atomic_load(&f.done) || tries < 100) {
			tries += ukvm_online_try_drain(&o);
			sched_yield();
		}
		pthread_join(th, NULL);
		CHECK_EQ(f.ret, 0);
		CHECK_EQ(atomic_load(&o.error), -ENOMEM);
		CHECK_EQ(solo_finish(&o, vr, &err), -ENOMEM);
		ukvm_online_destroy(&o);
	}
	UKT_CASE("more faults since a stamp than a read returns: -EPROTO, not a reordering") {
		struct ukvm_online o;
		struct ukvm_online_queue *q;
		uint64_t k;

		solo_create(&o, 1);
		q = ukvm_online_attach(&o);
		ukvm_online_stamp(&o, q);
		for (k = 0; k < UKVM_MAX_READ_BATCH; k++)
			CHECK_EQ(fault_at(&o, q, 100, 101 + k, 0, k), 0);
		CHECK_EQ(fault_at(&o, q, 100, 200, 0, k), -EPROTO);
		ukvm_online_destroy(&o);
	}
	UKT_CASE("spans of no time block for none and leave no vCPU blocked") {
		struct ukvm_online o;
		struct ukvm_online_queue *q;
		struct ukvm_vcpu_result vr[VCPUS];
		struct ukvm_error err;

		solo_create(&o, 1);
		q = ukvm_online_attach(&o);
		ukvm_online_stamp(&o, q);
		CHECK_EQ(fault_at(&o, q, 100, 100, 0, 0), 0);
		CHECK_EQ(fault_at(&o, q, 200, 300, 0, 1), 0);
		CHECK_EQ(fault_at(&o, q, 300, 300, 0, 2), 0);	/* at the end of the one before */
		CHECK_EQ(fault_at(&o, q, 300, 300, 1, 3), 0);
		ukvm_online_sleep(&o, q);
		CHECK_EQ(solo_finish(&o, vr, &err), 0);
		CHECK_EQ(vr[0].blocked_ns, 100);
		CHECK_EQ(vr[1].blocked_ns, 0);
		CHECK_EQ(vr[0].faults, 3);	/* counted all the same */
		CHECK_EQ(vr[1].service_latency.count, 1);
		ukvm_online_destroy(&o);
	}
	UKT_CASE("an event lost, doubled or out of order: the finish refuses (-EPROTO)") {
		struct ukvm_vcpu_result vr[VCPUS];
		struct ukvm_error err;
		unsigned how;
		int ret;

		for (how = 0; how < 3; how++) {
			struct ukvm_online o;
			struct ukvm_online_queue *q;

			solo_create(&o, 1);
			q = ukvm_online_attach(&o);
			ukvm_online_stamp(&o, q);
			CHECK_EQ(fault_at(&o, q, 1000, 1005, 0, 0), 0);
			if (how == 0) {
				q->npend--;	/* the end lost */
			} else if (how == 1) {
				q->pend[q->npend] = q->pend[q->npend - 1];	/* the end twice */
				q->npend++;
			} else {
				ukvm_online_stamp(&o, q);
				CHECK(ukvm_online_try_drain(&o), "the lock was free");
				CHECK_EQ(atomic_load(&q->taken), 2);
				/* then a fault earlier than what was swept */
				CHECK_EQ(fault_at(&o, q, 500, 505, 0, 1), 0);
			}
			ukvm_online_sleep(&o, q);
			ret = solo_finish(&o, vr, &err);
			CHECK(ret == -EPROTO, "case %u: %d", how, ret);
			CHECK(strstr(err.message, "online statistics"), "%s", err.message);
			ukvm_online_destroy(&o);
		}
	}
	UKT_CASE("the sweep takes an event out of order at the time before it, and counts it") {
		struct ukvm_sweep st;

		CHECK_EQ(ukvm_sweep_begin(&st, 1), 0);
		ukvm_sweep_step(&st, 100, 0, +1);
		ukvm_sweep_step(&st, 50, 0, -1);	/* earlier than the start */
		CHECK_EQ(st.out_of_order, 1);
		CHECK_EQ(st.blocked_ns[0], 0);	/* not 50 - 100, wrapped */
		CHECK_EQ(st.blocktime_ns, 0);
		CHECK_EQ(st.depth[0], 0);
		ukvm_sweep_step(&st, 60, 0, -1);	/* an end with nothing open */
		CHECK_EQ(st.unmatched, 1);
		ukvm_sweep_end(&st);
	}
	return ukt_exit();
}
