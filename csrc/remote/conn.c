/* SPDX-License-Identifier: MIT */
/*
 * A connection of the page server (server.c runs the loop that calls in
 * here): its handshake (auth.c's records, the peer's uid for a Unix
 * socket), then its requests read off the wire into the model (model.c),
 * and its replies written as the model hands them out. A connection the
 * client broke, or that failed its handshake, is closed here and freed by
 * the loop at the end of its turn; the server goes on with the others.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/util.h"
#include "remote/address.h"
#include "remote/auth.h"
#include "remote/conn.h"
#include "remote/list.h"
#include "remote/model.h"
#include "remote/protocol.h"
#include "remote/server_state.h"
#include "remote/wire.h"

/* A connection with this many requests unanswered is not read until it drains. */
#define SERVER_PENDING_MAX	4096

/* ---- writing replies ---- */

static int conn_events(struct server *s, struct conn *c)
{
	struct epoll_event ev = {
		.events = (c->paused ? 0 : EPOLLIN) | (c->want_out ? EPOLLOUT : 0) | EPOLLRDHUP,
		.data.ptr = c,
	};

	return epoll_ctl(s->epfd, EPOLL_CTL_MOD, c->fd, &ev) ? -errno : 0;
}

void ukvm_conn_close(struct server *s, struct conn *c)
{
	struct list *p, *n;

	if (c->dead)
		return;
	c->dead = true;
	if (!c->ready)
		s->handshakes--;
	for (p = c->requests.next; p != &c->requests; p = n) {
		struct ukvm_model_req *r = list_entry(p, struct ukvm_model_req, in_owner);

		n = p->next;
		list_del(&r->in_owner);
		ukvm_model_drop(&s->model, r);
	}
	for (p = c->outs.next; p != &c->outs; p = n) {
		n = p->next;
		free(list_entry(p, struct out, node));
	}
	list_init(&c->outs);
	epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	c->fd = -1;
}

/* Writes what c's queue holds until the socket is full; 0, or -errno. */
static int conn_write(struct server *s, struct conn *c)
{
	bool paused;

	while (!list_empty(&c->outs)) {
		struct out *o = list_entry(c->outs.next, struct out, node);
		size_t hlen = sizeof(o->hdr), total = hlen + o->hdr.length;
		struct iovec iov[2];
		struct msghdr msg = { .msg_iov = iov };
		ssize_t n;

		if (o->written < hlen) {
			iov[0].iov_base = (uint8_t *)&o->hdr + o->written;
			iov[0].iov_len = hlen - o->written;
			iov[1].iov_base = (void *)o->data;
			iov[1].iov_len = o->hdr.length;
			msg.msg_iovlen = o->hdr.length ? 2 : 1;
		} else {
			iov[0].iov_base = (void *)(o->data + (o->written - hlen));
			iov[0].iov_len = total - o->written;
			msg.msg_iovlen = 1;
		}
		n = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			if (!c->want_out) {
				c->want_out = true;
				return conn_events(s, c);
			}
			return 0;
		}
		if (n < 0)
			return -errno;	/* the client went away: not the server's failure */
		o->written += (size_t)n;
		if (o->written < total)
			continue;
		list_del(&o->node);
		if (o->counted)
			c->pending--;
		free(o);
	}
	/* Drained: no EPOLLOUT; reading again once half the backlog is answered. */
	paused = c->paused && c->pending >= SERVER_PENDING_MAX / 2;
	if (c->want_out || paused != c->paused) {
		c->want_out = false;
		c->paused = paused;
		return conn_events(s, c);
	}
	return 0;
}

/*
 * conn_write, and c closed if it fails: a write the client refused, or an
 * EPOLL_CTL_MOD that failed (which would leave c stalled, its replies
 * unsent, until the client's own timeout). 0, or -errno (c closed); the
 * server goes on with its other connections either way.
 */
int ukvm_conn_flush(struct server *s, struct conn *c)
{
	int ret = conn_write(s, c);

	if (ret)
		ukvm_conn_close(s, c);
	return ret;
}

/* A reply queued on c (not yet written): 0 and *out, or -ENOMEM. */
static int conn_reply(struct conn *c, const struct ukvm_remote_request *req, int32_t status,
		      uint32_t length, const uint8_t *data, struct out **out)
{
	struct out *o = calloc(1, sizeof(*o));

	*out = o;
	if (!o)
		return -ENOMEM;
	o->hdr.offset = req->offset;
	o->hdr.length = length;
	o->hdr.status = status;
	o->hdr.flags = req->flags;
	o->data = data;
	list_add_tail(&c->outs, &o->node);
	return 0;
}

/* ---- the model's replies ---- */

/* Hands the model the clock: each reply whose link time ended goes to its connection. */
int ukvm_conn_deliver(struct server *s, uint64_t now)
{
	struct ukvm_model_req *r;
	int ret = 0;

	while (!ret && ukvm_model_step(&s->model, now, &r) > 0) {
		struct conn *c = r->owner;
		struct out *o;

		if (c) {	/* else its connection closed while it was on the link */
			list_del(&r->in_owner);
			ret = conn_reply(c, &r->req, 0, r->req.length, s->map + r->req.offset, &o);
			if (!ret) {
				o->counted = true;
				ukvm_conn_flush(s, c);
			}
		}
		free(r);
	}
	return ret;
}

/* ---- requests off the wire ---- */

static int conn_request(struct server *s, struct conn *c, const struct ukvm_remote_request *req,
			uint64_t now)
{
	struct ukvm_model_req *r;
	struct out *o;
	int32_t status = ukvm_wire_request_check(req, s->size);
	int ret;

	if (status == UKVM_WIRE_STATS) {
		s->stats.stats_requests++;
		ret = conn_reply(c, req, 0, sizeof(o->stats), NULL, &o);
		if (ret)
			return ret;
		o->hdr.offset = 0;
		o->stats = s->stats;
		o->data = (const uint8_t *)&o->stats;
		return 0;
	}
	if (status) {
		s->stats.errors++;
		return conn_reply(c, req, status, 0, NULL, &o);
	}
	ret = ukvm_model_arrive(&s->model, req, c, now, &r);
	if (ret)
		return ret;
	list_add_tail(&c->requests, &r->in_owner);
	c->pending++;
	return 0;
}

int ukvm_conn_read(struct server *s, struct conn *c)
{
	const size_t rec = sizeof(struct ukvm_remote_request);
	size_t i, whole;
	ssize_t n;
	int ret;

	for (;;) {
		n = read(c->fd, c->in + c->in_got, sizeof(c->in) - c->in_got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			break;
		if (n <= 0) {		/* EOF, or ECONNRESET: the client is gone */
			ukvm_conn_close(s, c);
			return 0;
		}
		c->in_got += (size_t)n;
		whole = c->in_got / rec * rec;
		for (i = 0; i < whole; i += rec) {
			struct ukvm_remote_request req;

			memcpy(&req, c->in + i, rec);
			ret = conn_request(s, c, &req, ukvm_now_ns());
			if (ret)
				return ret;
		}
		memmove(c->in, c->in + whole, c->in_got - whole);
		c->in_got -= whole;
		if (c->pending >= SERVER_PENDING_MAX) {
			c->paused = true;
			ret = conn_events(s, c);
			if (ret)
				return ret;
			break;
		}
	}
	/* STATS and error replies go at once. */
	if (!c->dead && !list_empty(&c->outs))
		ukvm_conn_flush(s, c);
	return 0;
}

/* ---- the handshake ---- */

/* Closes c, counted and logged: a peer that did not prove it may connect. */
void ukvm_conn_refuse(struct server *s, struct conn *c, const char *why)
{
	s->stats.refused++;
	fprintf(stderr, "uffdkvm page server: refused %s: %s\n", c->peer, why);
	ukvm_conn_close(s, c);
}

/* A handshake record written whole on a socket that has room (the first bytes each way). */
int ukvm_conn_send_record(struct conn *c, const void *rec, size_t len)
{
	ssize_t n;

	do
		n = send(c->fd, rec, len, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return (size_t)n == len ? 0 : -EAGAIN;
}

/* The auth record's bytes as they come; then checked, and c welcomed or refused. */
void ukvm_conn_handshake(struct server *s, struct conn *c)
{
	struct ukvm_remote_welcome welcome;
	ssize_t n;
	int ret;

	while (c->hs_got < sizeof(c->hs)) {
		n = read(c->fd, c->hs + c->hs_got, sizeof(c->hs) - c->hs_got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n <= 0) {
			ukvm_conn_refuse(s, c, c->hs_got ? "closed in the middle of its handshake" :
				    "closed without a handshake (no key?)");
			return;
		}
		c->hs_got += (size_t)n;
	}
	ret = ukvm_auth_answer_check(&s->key, &c->hello, c->hs, sizeof(c->hs));
	if (ret == -EPROTO || ret == -EACCES) {
		/* Told why, so that a client with the wrong key can say so; then closed. */
		ukvm_auth_welcome_make(&s->key, &c->hello, NULL, ret, &welcome);
		ukvm_conn_send_record(c, &welcome, sizeof(welcome));
		ukvm_conn_refuse(s, c, ret == -EACCES ? "wrong key (its HMAC is not this server's key's)"
			    : "not a uffdkvm handshake (no auth record)");
		return;
	}
	if (!ret)
		ret = ukvm_auth_welcome_make(&s->key, &c->hello,
					     (const struct ukvm_remote_auth *)c->hs, 0, &welcome);
	if (!ret)
		ret = ukvm_conn_send_record(c, &welcome, sizeof(welcome));
	explicit_bzero(&welcome, sizeof(welcome));
	if (ret) {
		ukvm_conn_refuse(s, c, "the handshake failed on the server's side");
		return;
	}
	c->ready = true;
	s->handshakes--;
}

/*
 * The new connection c's peer, named for the log; a Unix socket's checked
 * by uid (the server's own, or root). 0, or -errno with c refused and the
 * reason logged (-EACCES: another uid).
 */
int ukvm_conn_peer(struct server *s, struct conn *c, const struct sockaddr_storage *sa,
		   socklen_t len)
{
	struct ukvm_remote_address addr = { .len = len };
	struct ucred cred;
	socklen_t clen = sizeof(cred);

	memcpy(&addr.sa, sa, sizeof(addr.sa));
	if (sa->ss_family != AF_UNIX) {
		if (ukvm_remote_address_format(&addr, c->peer, sizeof(c->peer)))
			snprintf(c->peer, sizeof(c->peer), "a peer of family %d", sa->ss_family);
		return 0;
	}
	if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen)) {
		int ret = -errno;
		char why[96];

		snprintf(c->peer, sizeof(c->peer), "a Unix socket peer");
		snprintf(why, sizeof(why), "its uid is unknown: getsockopt(SO_PEERCRED): %s",
			 strerror(-ret));
		ukvm_conn_refuse(s, c, why);
		return ret;
	}
	snprintf(c->peer, sizeof(c->peer), "Unix socket peer pid %d uid %u", (int)cred.pid,
		 (unsigned)cred.uid);
	if (cred.uid != geteuid() && cred.uid != 0) {
		ukvm_conn_refuse(s, c, "its uid is neither this server's nor root's");
		return -EACCES;
	}
	return 0;
}
