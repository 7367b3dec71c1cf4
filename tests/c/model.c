/* SPDX-License-Identifier: MIT */
/*
 * The page server's model (csrc/remote/model.c) without sockets or a real
 * clock: synthetic requests at chosen times, the clock handed in by hand,
 * and the order and times of the replies checked against what the model
 * promises (model.h): latency from taking a slot, one link of a bandwidth
 * on its own timeline, max_inflight slots, URGENT ahead of background for
 * slots and for the link, queue time, and a request whose connection
 * left. No KVM needed; one thread.
 */
#include "helpers.h"
#include "remote/model.h"

static struct ukvm_remote_stats st;
static struct ukvm_model m;

/* The replies one run of the model handed out: offsets and done times, in order. */
struct got {
	unsigned n;
	uint64_t off[16], at[16];
	bool orphan[16];	/* came out with no owner: its connection left */
};

static void start(uint64_t latency_ns, uint64_t mbps, uint32_t cap)
{
	memset(&st, 0, sizeof(st));
	ukvm_model_init(&m, latency_ns, mbps, cap, &st);
}

/* Hands the model the clock at now: what it says is done by then, into g. */
static void step(uint64_t now, struct got *g)
{
	struct ukvm_model_req *r;

	while (ukvm_model_step(&m, now, &r) > 0) {
		if (g->n < ARRAY_SIZE(g->off)) {
			g->off[g->n] = r->req.offset;
			g->at[g->n] = r->done_ns;
			g->orphan[g->n] = !r->owner;
			g->n++;
		}
		CHECK_LE(r->done_ns, now);
		free(r);
	}
}

/*
 * A request of len bytes at offset off, arriving at now (its owner: any
 * non-NULL pointer), and the model stepped at now, as the server's loop
 * does after reading requests.
 */
static struct ukvm_model_req *arrive(uint64_t off, uint32_t len, bool urgent, uint64_t now,
				     struct got *g)
{
	struct ukvm_remote_request req = { .offset = off, .length = len,
					   .flags = urgent ? UKVM_REMOTE_URGENT : 0 };
	struct ukvm_model_req *r = NULL;

	CHECK_EQ(ukvm_model_arrive(&m, &req, &m, now, &r), 0);
	step(now, g);
	return r;
}

/* As the server's loop with perfect wake-ups: the clock jumps to each next event. */
static void run_to_end(struct got *g)
{
	uint64_t next;

	while ((next = ukvm_model_next_ns(&m)) != UINT64_MAX)
		step(next, g);
}

static void expect(const struct got *g, unsigned n, const uint64_t *off, const uint64_t *at)
{
	CHECK_EQ(g->n, n);
	for (unsigned i = 0; i < n && i < g->n; i++) {
		CHECK(g->off[i] == off[i], "reply %u: offset %llu, expected %llu", i,
		      (unsigned long long)g->off[i], (unsigned long long)off[i]);
		CHECK(g->at[i] == at[i], "reply %u (offset %llu): done at %llu, expected %llu", i,
		      (unsigned long long)g->off[i], (unsigned long long)g->at[i],
		      (unsigned long long)at[i]);
	}
}

int main(void)
{
	ukt_program = "model";

	UKT_CASE("latency: each reply latency after its arrival, in arrival order") {
		struct got g = { 0 };

		start(100, 0, 0);
		arrive(0, 4096, false, 0, &g);
		arrive(4096, 4096, true, 10, &g);
		arrive(8192, 4096, false, 20, &g);
		step(20, &g);
		step(99, &g);
		CHECK_EQ(g.n, 0u);			/* none before its latency */
		CHECK_EQ(ukvm_model_next_ns(&m), 100u);	/* the server's timer */
		run_to_end(&g);
		expect(&g, 3, (uint64_t[]){ 0, 4096, 8192 }, (uint64_t[]){ 100, 110, 120 });
		CHECK_EQ(st.requests, 3u);
		CHECK_EQ(st.urgent, 1u);
		CHECK_EQ(st.background, 2u);
		CHECK_EQ(st.served, 3u);
		CHECK_EQ(st.bytes, 3 * 4096u);
		CHECK_EQ(st.queue_ns_total, 0u);	/* no cap, no link limit: nobody queued */
		CHECK_EQ(m.inflight, 0u);
		ukvm_model_free_all(&m);
	}

	UKT_CASE("bandwidth: replies share one link, each length / bandwidth long") {
		struct got g = { 0 };

		start(0, 8000, 0);		/* 8000 Mbit/s: one byte per ns */
		arrive(0, 1000, false, 0, &g);
		arrive(1000, 1000, false, 0, &g);
		arrive(2000, 1000, false, 0, &g);
		run_to_end(&g);
		expect(&g, 3, (uint64_t[]){ 0, 1000, 2000 }, (uint64_t[]){ 1000, 2000, 3000 });
		/* Queue time: the second waited 1000 ns for the link, the third 2000. */
		CHECK_EQ(st.queue_ns_total, 3000u);
		CHECK_EQ(st.queue_ns_max, 2000u);
		ukvm_model_free_all(&m);
	}

	UKT_CASE("a late wake-up does not slow the link: its own timeline") {
		struct got g = { 0 };

		start(0, 8000, 0);
		arrive(0, 1000, false, 0, &g);
		arrive(1000, 1000, false, 0, &g);
		arrive(2000, 1000, false, 0, &g);
		step(0, &g);
		step(10000, &g);	/* one wake-up, long after all three were due */
		expect(&g, 3, (uint64_t[]){ 0, 1000, 2000 }, (uint64_t[]){ 1000, 2000, 3000 });
		ukvm_model_free_all(&m);
	}

	UKT_CASE("max_inflight 1: one at a time, a free slot to URGENT first") {
		struct got g = { 0 };

		start(100, 0, 1);
		arrive(0, 4096, false, 0, &g);	/* b1 takes the slot */
		arrive(4096, 4096, false, 0, &g);	/* b2, b3 wait */
		arrive(8192, 4096, false, 0, &g);
		step(0, &g);
		arrive(1 << 20, 4096, true, 5, &g);	/* u: after them, served before b2 */
		run_to_end(&g);
		expect(&g, 4, (uint64_t[]){ 0, 1 << 20, 4096, 8192 },
		       (uint64_t[]){ 100, 200, 300, 400 });
		/* Waited for the slot: u 95 ns, b2 200, b3 300. */
		CHECK_EQ(st.queue_ns_total, 595u);
		CHECK_EQ(st.queue_ns_max, 300u);
		CHECK_EQ(m.inflight, 0u);
		ukvm_model_free_all(&m);
	}

	UKT_CASE("the link goes to the ready URGENT reply before a ready background one") {
		struct got g = { 0 };

		start(100, 8000, 0);
		arrive(0, 1000, false, 0, &g);	/* b1: ready 100, on the link 100..1100 */
		arrive(1000, 1000, false, 0, &g);	/* b2: ready 100, waits for the link */
		step(0, &g);
		arrive(2000, 1000, true, 50, &g);	/* u: ready 150, jumps b2 at 1100 */
		run_to_end(&g);
		expect(&g, 3, (uint64_t[]){ 0, 2000, 1000 }, (uint64_t[]){ 1100, 2100, 3100 });
		ukvm_model_free_all(&m);
	}

	UKT_CASE("a request whose connection left: out of the queue, or off the link unowned") {
		struct ukvm_model_req *r1, *r2, *r4;
		struct got g = { 0 };

		start(100, 0, 1);
		r1 = arrive(0, 4096, false, 0, &g);	/* takes the slot */
		r2 = arrive(4096, 4096, false, 0, &g);	/* waits */
		arrive(8192, 4096, false, 0, &g);	/* r3 waits */
		step(0, &g);
		CHECK_EQ(m.inflight, 1u);
		if (r1 && r2) {
			ukvm_model_drop(&m, r2);	/* a waiting one: gone */
			ukvm_model_drop(&m, r1);	/* a started one: its slot freed */
		}
		CHECK_EQ(m.inflight, 0u);
		step(50, &g);				/* r3 takes the slot at 50 */
		run_to_end(&g);
		expect(&g, 1, (uint64_t[]){ 8192 }, (uint64_t[]){ 150 });

		/* On the link when its connection leaves: the link time stays spent. */
		m.latency_ns = 0;
		m.bandwidth_mbps = 8000;
		r4 = arrive(1 << 20, 1000, false, 200, &g);
		step(200, &g);
		CHECK(m.on_link == r4, "on the link");
		if (r4)
			ukvm_model_drop(&m, r4);
		CHECK_EQ(m.inflight, 1u);		/* until its link time ends */
		step(1199, &g);
		CHECK_EQ(g.n, 1u);
		step(1200, &g);
		CHECK_EQ(g.n, 2u);
		CHECK(g.n == 2 && g.orphan[1] && g.off[1] == 1 << 20 && g.at[1] == 1200,
		      "the dropped reply came out unowned at 1200");
		CHECK_EQ(st.dropped, 3u);
		CHECK_EQ(st.served, 2u);		/* r3, and r4 which took its link time */
		CHECK_EQ(m.inflight, 0u);
		ukvm_model_free_all(&m);
	}

	UKT_CASE("free_all frees what is still waiting, started or on the link") {
		struct got g = { 0 };

		start(1000, 8, 1);
		arrive(0, 4096, true, 0, &g);
		arrive(4096, 4096, false, 0, &g);
		arrive(8192, 4096, false, 0, &g);
		step(1000, &g);				/* one on the link, two waiting */
		CHECK(m.on_link != NULL, "on the link");
		ukvm_model_free_all(&m);		/* LeakSanitizer checks the rest */
		CHECK_EQ(m.inflight, 0u);
		CHECK_EQ(ukvm_model_next_ns(&m), UINT64_MAX);
	}

	printf("%s: %u cases, %u checks failed, %u skipped\n", ukt_program, ukt_cases,
	       ukt_failures, ukt_skips);
	return ukt_failures ? T_EXIT_FAIL : T_EXIT_PASS;
}
