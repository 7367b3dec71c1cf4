/* SPDX-License-Identifier: MIT */
/* The page server's model of a remote source (model.h): no sockets, no clock of its own. */
#include <errno.h>
#include <stdlib.h>

#include "remote/model.h"

void ukvm_model_init(struct ukvm_model *m, uint64_t latency_ns, uint64_t bandwidth_mbps,
		     uint32_t max_inflight, struct ukvm_remote_stats *stats)
{
	int k;

	*m = (struct ukvm_model){ .latency_ns = latency_ns, .bandwidth_mbps = bandwidth_mbps,
				  .max_inflight = max_inflight, .stats = stats };
	for (k = 0; k < UKVM_MODEL_KINDS; k++) {
		list_init(&m->wait[k]);
		list_init(&m->started[k]);
	}
}

static struct ukvm_model_req *model_pop(struct list *q)
{
	struct ukvm_model_req *r = list_entry(q->next, struct ukvm_model_req, queue);

	list_del(&r->queue);
	return r;
}

void ukvm_model_free_all(struct ukvm_model *m)
{
	int k;

	free(m->on_link);
	m->on_link = NULL;
	for (k = 0; k < UKVM_MODEL_KINDS; k++) {
		while (!list_empty(&m->wait[k]))
			free(model_pop(&m->wait[k]));
		while (!list_empty(&m->started[k]))
			free(model_pop(&m->started[k]));
	}
	m->inflight = 0;
}

/* length bytes at bandwidth_mbps megabits per second, in ns (rounded up). */
static uint64_t model_link_ns(const struct ukvm_model *m, uint32_t length)
{
	if (!m->bandwidth_mbps)
		return 0;
	return ((uint64_t)length * 8000 + m->bandwidth_mbps - 1) / m->bandwidth_mbps;
}

int ukvm_model_arrive(struct ukvm_model *m, const struct ukvm_remote_request *req, void *owner,
		      uint64_t now, struct ukvm_model_req **out)
{
	struct ukvm_model_req *r = calloc(1, sizeof(*r));

	*out = NULL;
	if (!r)
		return -ENOMEM;
	r->owner = owner;
	r->req = *req;
	r->kind = (req->flags & UKVM_REMOTE_URGENT) ? UKVM_MODEL_URGENT : UKVM_MODEL_BACKGROUND;
	r->arrived_ns = now;
	list_init(&r->in_owner);
	list_add_tail(&m->wait[r->kind], &r->queue);
	m->stats->requests++;
	if (r->kind == UKVM_MODEL_URGENT)
		m->stats->urgent++;
	else
		m->stats->background++;
	*out = r;
	return 0;
}

void ukvm_model_drop(struct ukvm_model *m, struct ukvm_model_req *r)
{
	m->stats->dropped++;
	r->owner = NULL;
	if (r == m->on_link)
		return;	/* its link time stays spent; the reply is dropped when it ends */
	if (r->started)
		m->inflight--;
	list_del(&r->queue);
	free(r);
}

/* Free slots go to urgent requests first, each kind in the order it came. */
static void model_start(struct ukvm_model *m, uint64_t now)
{
	uint32_t cap = m->max_inflight;

	while (!cap || m->inflight < cap) {
		struct list *q = !list_empty(&m->wait[UKVM_MODEL_URGENT]) ?
				 &m->wait[UKVM_MODEL_URGENT] : &m->wait[UKVM_MODEL_BACKGROUND];
		struct ukvm_model_req *r;

		if (list_empty(q))
			return;
		r = model_pop(q);
		r->started = true;
		r->started_ns = now;
		r->ready_ns = now + m->latency_ns;
		list_add_tail(&m->started[r->kind], &r->queue);
		m->inflight++;
	}
}

/* The next ready request (urgent first) onto the free link; false if none is ready by now. */
static bool model_link(struct ukvm_model *m, uint64_t now)
{
	struct ukvm_model_req *r = NULL;
	uint64_t start, queue;
	int k;

	for (k = 0; k < UKVM_MODEL_KINDS && !r; k++)
		if (!list_empty(&m->started[k]) &&
		    list_entry(m->started[k].next, struct ukvm_model_req, queue)->ready_ns <= now)
			r = model_pop(&m->started[k]);
	if (!r)
		return false;
	/*
	 * The link's own timeline, not the caller's wake-ups: a reply starts
	 * when it was ready or when the link freed, whichever is later, so a
	 * late wake-up does not slow the link down.
	 */
	start = r->ready_ns > m->link_free_ns ? r->ready_ns : m->link_free_ns;
	queue = (r->started_ns - r->arrived_ns) + (start - r->ready_ns);
	m->stats->queue_ns_total += queue;
	if (queue > m->stats->queue_ns_max)
		m->stats->queue_ns_max = queue;
	m->stats->served++;
	m->stats->bytes += r->req.length;
	r->done_ns = m->link_free_ns = m->link_end_ns = start + model_link_ns(m, r->req.length);
	m->on_link = r;
	return true;
}

int ukvm_model_step(struct ukvm_model *m, uint64_t now, struct ukvm_model_req **done)
{
	*done = NULL;
	for (;;) {
		if (m->on_link && m->link_end_ns <= now) {
			*done = m->on_link;
			m->on_link = NULL;
			m->inflight--;
			return 1;
		}
		model_start(m, now);
		if (m->on_link || !model_link(m, now))
			return 0;
	}
}

uint64_t ukvm_model_next_ns(const struct ukvm_model *m)
{
	uint64_t next = UINT64_MAX;
	int k;

	if (m->on_link)
		return m->link_end_ns;
	for (k = 0; k < UKVM_MODEL_KINDS; k++)
		if (!list_empty(&m->started[k])) {
			uint64_t t = list_entry(m->started[k].next, struct ukvm_model_req,
						queue)->ready_ns;

			if (t < next)
				next = t;
		}
	return next;
}
