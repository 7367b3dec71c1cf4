/* SPDX-License-Identifier: MIT */
/*
 * The page server's model of a remote source (model.c), without sockets:
 * the server (server.c, conn.c) feeds it the requests it reads and the clock, and
 * writes each reply when the model says it has gone over the link.
 *
 * All times are CLOCK_MONOTONIC nanoseconds, given by the caller:
 * - a request takes an inflight slot when one is free (max_inflight, 0 = no
 *   cap); the rest wait in a queue, URGENT ones ahead of background ones,
 *   each kind first come first served;
 * - from taking its slot, a request is ready latency_ns later;
 * - ready replies go out over one modelled link: each occupies it
 *   length / bandwidth (bandwidth_mbps megabits per second, 0 = no limit),
 *   URGENT ones first among those ready; a reply is done when its link time
 *   ends, and its slot is freed then;
 * - queue time is what a request waited beyond its latency: for a slot,
 *   then for the link.
 * So a reply is never done earlier than latency after its request arrived,
 * and n replies of b bytes take at least n * b / bandwidth.
 *
 * A request lives in exactly one of: a wait queue (no slot yet), a started
 * queue (slot taken, latency running), or the link. Since every started
 * request gets the same latency, each started queue is ordered by ready
 * time, and its head is the next ready.
 */
#ifndef UKVM_REMOTE_MODEL_H
#define UKVM_REMOTE_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "remote/list.h"
#include "remote/protocol.h"

enum { UKVM_MODEL_URGENT, UKVM_MODEL_BACKGROUND, UKVM_MODEL_KINDS };

struct ukvm_model_req {
	struct list queue;		/* the model's: wait[kind] or started[kind]; alone on the link */
	struct list in_owner;		/* the caller's, for its own list of its requests */
	void *owner;			/* the caller's (a connection); NULL once dropped */
	struct ukvm_remote_request req;
	int kind;
	bool started;			/* holds a slot */
	uint64_t arrived_ns;
	uint64_t started_ns;		/* took its slot */
	uint64_t ready_ns;		/* started + latency */
	uint64_t done_ns;		/* its link time ended: the reply goes out */
};

struct ukvm_model {
	uint64_t latency_ns;
	uint64_t bandwidth_mbps;	/* 0: no limit */
	uint32_t max_inflight;		/* 0: no cap */
	struct list wait[UKVM_MODEL_KINDS], started[UKVM_MODEL_KINDS];
	uint32_t inflight;
	struct ukvm_model_req *on_link;
	uint64_t link_end_ns;		/* when the link's current reply has gone */
	uint64_t link_free_ns;		/* end of the last reply on the link */
	/* requests, urgent, background, served, bytes, queue_ns_*, dropped: counted here */
	struct ukvm_remote_stats *stats;
};

void ukvm_model_init(struct ukvm_model *m, uint64_t latency_ns, uint64_t bandwidth_mbps,
		     uint32_t max_inflight, struct ukvm_remote_stats *stats);
/* Frees every request still in the model (the server's teardown). */
void ukvm_model_free_all(struct ukvm_model *m);

/* A request that arrived at now, for owner: into the wait queue of its kind. 0 or -ENOMEM. */
int ukvm_model_arrive(struct ukvm_model *m, const struct ukvm_remote_request *req, void *owner,
		      uint64_t now, struct ukvm_model_req **out);
/*
 * r's owner went away: r leaves the model and is freed, counted dropped;
 * on the link it stays there, its link time spent, and comes out of
 * ukvm_model_step with owner NULL.
 */
void ukvm_model_drop(struct ukvm_model *m, struct ukvm_model_req *r);
/*
 * Moves the model forward to now: starts and links what it can, and hands
 * out the next request whose link time ended by now. 1 and *done (the
 * caller's now: it writes the reply if owner is set, and frees it with
 * free()), or 0 when nothing more is done by now; call again until 0.
 */
int ukvm_model_step(struct ukvm_model *m, uint64_t now, struct ukvm_model_req **done);
/* When the model next has something to do (UINT64_MAX: nothing until a request). */
uint64_t ukvm_model_next_ns(const struct ukvm_model *m);

#endif
