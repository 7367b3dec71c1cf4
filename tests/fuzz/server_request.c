/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the page server's request parser, as conn.c runs it on
 * what a connection sends: each 16-byte record checked
 * (ukvm_wire_request_check, csrc/remote/wire.c), refused or fed to the
 * model (csrc/remote/model.c) on a clock, and each reply the model hands
 * out read from the snapshot's bytes.
 *
 * The input:
 *	bytes 0-1	the snapshot's size in bytes, little-endian (0..65535)
 *	byte 2		the model: bits 0-1 latency (LATENCY_NS[]), 2-3
 *			bandwidth (MBPS[]), 4-5 max_inflight (INFLIGHT[])
 *	then records of 17 bytes: a control byte, then the request as it
 *	comes off the wire (protocol.h). Control: bits 0-4, the clock moves
 *	on by that many times 10 us first; bit 5, the request comes from the
 *	second of two connections; bit 6, that connection closes first (its
 *	requests leave the model, as conn_close() takes them out). A record
 *	cut short at the end is left unread, as the server leaves it.
 *
 * Checked beyond the sanitizers (the snapshot is a buffer of exactly its
 * size, so a range the check lets past its end is a read out of bounds):
 * - the check against an independent one in 128-bit arithmetic: what it
 *   serves is within the snapshot, with a length of 1..UKVM_REMOTE_MAX_LENGTH
 *   and known flags; what it refuses, it refuses with the status
 *   protocol.h gives for the reason;
 * - the server's reply to every request the client could have sent is one
 *   the client's checks (ukvm_wire_reply_check, ukvm_wire_reply_answers)
 *   take as the answer to it;
 * - the model, stepped as server.c's loop does (on each turn, after every
 *   read or close, then at each next event it names): each request it takes comes out once (or
 *   is dropped with its connection), never before its latency is over, in
 *   the order of its link, within max_inflight, and its counters add up.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remote/list.h"
#include "remote/model.h"
#include "remote/wire.h"

static const uint64_t LATENCY_NS[4] = { 0, 1000, 100000, 1000000 };
static const uint64_t MBPS[4] = { 0, 1, 1000, 100000 };
static const uint32_t INFLIGHT[4] = { 0, 1, 2, 8 };

#define REQUIRE(cond, ...)							\
	do {									\
		if (!(cond)) {							\
			fprintf(stderr, "server_request: %s: ", #cond);		\
			fprintf(stderr, __VA_ARGS__);				\
			fputc('\n', stderr);					\
			abort();						\
		}								\
	} while (0)

/* One of the two connections: its requests still in the model, as conn.c keeps them. */
struct conn {
	struct list requests;
};

struct run {
	struct ukvm_model model;
	struct ukvm_remote_stats stats;
	struct conn conns[2];
	const uint8_t *snap;
	uint64_t size;
	uint64_t taken, out, dropped, bytes, last_done;
	uint64_t sum;		/* of the bytes read: keeps the reads */
};

/* What the check must say, worked out another way. */
static int expected(const struct ukvm_remote_request *req, uint64_t size)
{
	if (req->flags & UKVM_REMOTE_STATS)
		return UKVM_WIRE_STATS;
	if (req->flags & ~UKVM_REMOTE_FLAGS || req->length == 0 ||
	    req->length > UKVM_REMOTE_MAX_LENGTH)
		return -EINVAL;
	if ((unsigned __int128)req->offset + req->length > size)
		return -ERANGE;
	return 0;
}

/* A request our client may send (client.c): one range or STATS, known flags. */
static bool client_could_send(const struct ukvm_remote_request *req)
{
	if (req->flags == UKVM_REMOTE_STATS)
		return true;
	return (req->flags == 0 || req->flags == UKVM_REMOTE_URGENT) && req->length &&
	       req->length <= UKVM_REMOTE_MAX_LENGTH;
}

/* The reply header conn.c writes for req (conn_reply; STATS with offset 0). */
static void reply_for(const struct ukvm_remote_request *req, int status,
		      struct ukvm_remote_reply *hdr)
{
	memset(hdr, 0, sizeof(*hdr));
	hdr->offset = status == UKVM_WIRE_STATS ? 0 : req->offset;
	hdr->flags = req->flags;
	if (status == UKVM_WIRE_STATS)
		hdr->length = sizeof(struct ukvm_remote_stats);
	else if (status == 0)
		hdr->length = req->length;
	else
		hdr->status = status;
}

static void check_reply(const struct ukvm_remote_request *req, int status)
{
	struct ukvm_remote_reply hdr;

	if (!client_could_send(req))
		return;
	reply_for(req, status, &hdr);
	REQUIRE(!ukvm_wire_reply_check(&hdr) && !ukvm_wire_reply_answers(&hdr, req),
		"the client refuses the server's reply to offset %llu length %u flags 0x%x "
		"(status %d)", (unsigned long long)req->offset, req->length, req->flags, status);
}

/* Everything the model hands out by now, read from the snapshot as server_advance() does. */
static void advance(struct run *r, uint64_t now)
{
	struct ukvm_model_req *done;

	while (ukvm_model_step(&r->model, now, &done) > 0) {
		const struct ukvm_remote_request *req = &done->req;

		REQUIRE(done->done_ns <= now, "done at %llu, handed out at %llu",
			(unsigned long long)done->done_ns, (unsigned long long)now);
		REQUIRE(done->done_ns >= done->arrived_ns + r->model.latency_ns,
			"done %llu ns after it came, before its latency of %llu",
			(unsigned long long)(done->done_ns - done->arrived_ns),
			(unsigned long long)r->model.latency_ns);
		REQUIRE(done->done_ns >= r->last_done, "done out of the link's order");
		r->last_done = done->done_ns;
		if (done->owner) {
			list_del(&done->in_owner);
			/* Its first and last byte: ASan sees either outside the snapshot. */
			r->sum += r->snap[req->offset] + r->snap[req->offset + req->length - 1];
			r->bytes += req->length;
			r->out++;
		}
		free(done);
	}
	if (r->model.max_inflight)
		REQUIRE(r->model.inflight <= r->model.max_inflight, "%u in flight, at most %u",
			r->model.inflight, r->model.max_inflight);
}

/* A connection closes: its requests leave the model (conn_close()). */
static void close_conn(struct run *r, struct conn *c)
{
	struct list *p, *n;

	for (p = c->requests.next; p != &c->requests; p = n) {
		struct ukvm_model_req *q = list_entry(p, struct ukvm_model_req, in_owner);

		n = p->next;
		list_del(&q->in_owner);
		ukvm_model_drop(&r->model, q);
		r->dropped++;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const size_t rec = 1 + sizeof(struct ukvm_remote_request);
	struct run r = { 0 };
	uint64_t now = 1000000000;	/* a monotonic clock's ns, not 0 */
	uint8_t *snap;
	size_t i;

	if (size < 3)
		return 0;
	r.size = data[0] | (uint64_t)data[1] << 8;
	snap = malloc(r.size ? r.size : 1);
	for (i = 0; i < r.size; i++)
		snap[i] = (uint8_t)(i * 131);
	r.snap = snap;
	ukvm_model_init(&r.model, LATENCY_NS[data[2] & 3], MBPS[(data[2] >> 2) & 3],
			INFLIGHT[(data[2] >> 4) & 3], &r.stats);
	list_init(&r.conns[0].requests);
	list_init(&r.conns[1].requests);

	for (i = 3; i + rec <= size; i += rec) {
		uint8_t ctl = data[i];
		struct conn *c = &r.conns[(ctl >> 5) & 1];
		struct ukvm_remote_request req;
		struct ukvm_model_req *q;
		int status, want;

		memcpy(&req, data + i + 1, sizeof(req));
		now += (uint64_t)(ctl & 31) * 10000;
		advance(&r, now);
		if (ctl & 64)
			close_conn(&r, c);
		status = ukvm_wire_request_check(&req, r.size);
		want = expected(&req, r.size);
		REQUIRE(status == want, "offset %llu length %u flags 0x%x of %llu bytes: %d, not %d",
			(unsigned long long)req.offset, req.length, req.flags,
			(unsigned long long)r.size, status, want);
		check_reply(&req, status);
		if (!status) {		/* else answered at once: a refusal, or the counters */
			REQUIRE(!ukvm_model_arrive(&r.model, &req, c, now, &q), "model_arrive");
			list_add_tail(&c->requests, &q->in_owner);
			r.taken++;
		}
		advance(&r, now);	/* the server's loop steps the model on every turn */
	}
	/* Then it sleeps until the model's next event (server_arm), until none is left. */
	for (uint64_t turns = 0, next; (next = ukvm_model_next_ns(&r.model)) != UINT64_MAX;
	     turns++) {
		REQUIRE(turns <= 2 * r.taken, "the model still has events after %llu turns",
			(unsigned long long)turns);
		now = next > now ? next : now;
		advance(&r, now);
	}
	REQUIRE(list_empty(&r.conns[0].requests) && list_empty(&r.conns[1].requests),
		"requests left in the model after every deadline passed");
	REQUIRE(r.out + r.dropped == r.taken, "%llu out and %llu dropped of %llu taken",
		(unsigned long long)r.out, (unsigned long long)r.dropped,
		(unsigned long long)r.taken);
	REQUIRE(r.stats.requests == r.taken && r.stats.dropped == r.dropped &&
		r.stats.urgent + r.stats.background == r.stats.requests &&
		r.stats.served >= r.out && r.stats.served <= r.taken && r.stats.bytes >= r.bytes,
		"counters: requests %llu dropped %llu urgent %llu background %llu served %llu",
		(unsigned long long)r.stats.requests, (unsigned long long)r.stats.dropped,
		(unsigned long long)r.stats.urgent, (unsigned long long)r.stats.background,
		(unsigned long long)r.stats.served);
	REQUIRE(r.model.inflight == 0 && !r.model.on_link, "the model still holds requests");
	ukvm_model_free_all(&r.model);
	free(snap);
	return 0;
}
