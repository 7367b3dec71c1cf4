/* SPDX-License-Identifier: MIT */
/*
 * The page server (ukvm.h: ukvm_pageserver_serve), run in a process of
 * its own: serves byte ranges of a snapshot file (protocol.h).
 *
 * The model (all times CLOCK_MONOTONIC):
 * - a request takes an inflight slot when one is free (max_inflight, 0 = no
 *   cap); the rest wait in a queue, URGENT ones ahead of background ones,
 *   each kind first come first served;
 * - from taking its slot, a request is ready latency_ns later;
 * - ready replies go out over one modelled link: each occupies it
 *   length / bandwidth (bandwidth_mbps megabits per second, 0 = no limit),
 *   URGENT ones first among those ready; the reply is written to the
 *   socket when its link time ends, and its slot is freed then;
 * - queue time is what a request waited beyond its latency: for a slot,
 *   then for the link.
 * So a reply never leaves earlier than latency after its request arrived,
 * and n replies of b bytes take at least n * b / bandwidth.
 *
 * The loop: one thread, one epoll instance over
 * the listening socket, the connections, a timerfd for the model's next
 * event, a signalfd for SIGTERM/SIGINT and the stop fd (stdin).
 *
 * A request lives in exactly one of: a wait queue (no slot yet), a
 * started queue (slot taken, latency running), or the link; and in its
 * connection's list, so that a connection that closes takes its requests
 * out of the model. Both queues come in two kinds, urgent and background.
 * Since every started request gets the same latency, each started queue
 * is ordered by ready time, and its head is the next ready.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/util.h"
#include "remote/address.h"
#include "remote/protocol.h"

/* A connection with this many requests unanswered is not read until it drains. */
#define SERVER_PENDING_MAX	4096
/* Requests read per read(2) at most. */
#define SERVER_READ_BATCH	256
/* The longest epoll wait: nothing in the loop waits unbounded. */
#define SERVER_WAIT_MS		1000
/* Timer slack for this thread: the model's waits are microseconds. */
#define SERVER_TIMER_SLACK_NS	1000

enum { KIND_URGENT, KIND_BACKGROUND, KINDS };

struct list {
	struct list *prev, *next;
};

static void list_init(struct list *l) { l->prev = l->next = l; }
static bool list_empty(const struct list *l) { return l->next == l; }

static void list_add_tail(struct list *l, struct list *n)
{
	n->prev = l->prev;
	n->next = l;
	l->prev->next = n;
	l->prev = n;
}

static void list_del(struct list *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	list_init(n);
}

#define list_entry(p, type, member) ((type *)((char *)(p) - offsetof(type, member)))

struct conn;

struct request {
	struct list queue;		/* wait[kind] or started[kind]; alone on the link */
	struct list in_conn;		/* conn->requests */
	struct conn *conn;		/* NULL once the connection closed (on the link) */
	struct ukvm_remote_request req;
	int kind;
	uint64_t arrived_ns;
	uint64_t started_ns;		/* took its slot */
	uint64_t ready_ns;		/* started + latency */
};

/* A reply being written: header, then payload (from the mapping or stats). */
struct out {
	struct list node;
	struct ukvm_remote_reply hdr;
	const uint8_t *data;
	size_t written;			/* of header + payload */
	bool counted;			/* a request: conn->pending drops when written */
	struct ukvm_remote_stats stats;	/* a STATS reply's payload */
};

struct conn {
	struct list node;		/* server.conns */
	int fd;
	bool dead;			/* closed; freed at the end of the loop's turn */
	bool paused;			/* EPOLLIN off: too many pending */
	bool want_out;			/* EPOLLOUT on */
	uint32_t pending;		/* requests read, reply not yet written */
	struct list requests;		/* its requests still in the model */
	struct list outs;		/* replies being written, in order */
	size_t in_got;
	uint8_t in[SERVER_READ_BATCH * sizeof(struct ukvm_remote_request)];
};

struct server {
	const struct ukvm_pageserver_config *cfg;
	int epfd, lfd, tfd, sfd, stop_fd;
	const uint8_t *map;
	uint64_t size;
	struct list wait[KINDS], started[KINDS];
	uint32_t inflight;
	struct request *on_link;
	uint64_t link_end_ns;		/* when the link's current reply has gone */
	uint64_t link_free_ns;		/* end of the last reply on the link */
	struct list conns;
	struct ukvm_remote_stats stats;
	bool stop;
};

/* Tags for epoll's data: a struct conn pointer, or one of these. */
static int tag_listen, tag_timer, tag_signal, tag_stop;

/* ---- connections ---- */

static int conn_events(struct server *s, struct conn *c)
{
	struct epoll_event ev = {
		.events = (c->paused ? 0 : EPOLLIN) | (c->want_out ? EPOLLOUT : 0) | EPOLLRDHUP,
		.data.ptr = c,
	};

	return epoll_ctl(s->epfd, EPOLL_CTL_MOD, c->fd, &ev) ? -errno : 0;
}

static void conn_close(struct server *s, struct conn *c)
{
	struct list *p, *n;

	if (c->dead)
		return;
	c->dead = true;
	for (p = c->requests.next; p != &c->requests; p = n) {
		struct request *r = list_entry(p, struct request, in_conn);

		n = p->next;
		list_del(&r->in_conn);
		s->stats.dropped++;
		if (r == s->on_link) {
			r->conn = NULL;	/* its link time stays spent; the reply is dropped */
			continue;
		}
		if (r->started_ns)
			s->inflight--;
		list_del(&r->queue);
		free(r);
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

/* Writes what c's queue holds until the socket is full; 0, or -errno (c closed). */
static int conn_flush(struct server *s, struct conn *c)
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
		if (n < 0) {
			int ret = -errno;

			conn_close(s, c);
			return ret;	/* the client went away: not the server's failure */
		}
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

static struct out *conn_reply(struct conn *c, const struct ukvm_remote_request *req,
			      int32_t status, uint32_t length, const uint8_t *data)
{
	struct out *o = calloc(1, sizeof(*o));

	if (!o)
		return NULL;
	o->hdr.offset = req->offset;
	o->hdr.length = length;
	o->hdr.status = status;
	o->hdr.flags = req->flags;
	o->data = data;
	list_add_tail(&c->outs, &o->node);
	return o;
}

/* ---- the model ---- */

static uint64_t model_link_ns(const struct server *s, uint32_t length)
{
	/* length bytes at bandwidth_mbps megabits per second, in ns. */
	if (!s->cfg->bandwidth_mbps)
		return 0;
	return ((uint64_t)length * 8000 + s->cfg->bandwidth_mbps - 1) / s->cfg->bandwidth_mbps;
}

/* A request read from c: into the wait queue of its kind. */
static int model_arrive(struct server *s, struct conn *c, const struct ukvm_remote_request *req,
			uint64_t now)
{
	struct request *r = calloc(1, sizeof(*r));

	if (!r)
		return -ENOMEM;
	r->conn = c;
	r->req = *req;
	r->kind = (req->flags & UKVM_REMOTE_URGENT) ? KIND_URGENT : KIND_BACKGROUND;
	r->arrived_ns = now;
	list_add_tail(&s->wait[r->kind], &r->queue);
	list_add_tail(&c->requests, &r->in_conn);
	c->pending++;
	s->stats.requests++;
	if (r->kind == KIND_URGENT)
		s->stats.urgent++;
	else
		s->stats.background++;
	return 0;
}

/* The reply on the link has gone: to its connection's queue, its slot freed. */
static int model_link_done(struct server *s)
{
	struct request *r = s->on_link;
	struct conn *c = r->conn;
	int ret = 0;

	s->on_link = NULL;
	s->inflight--;
	if (c) {
		list_del(&r->in_conn);
		if (!conn_reply(c, &r->req, 0, r->req.length, s->map + r->req.offset))
			ret = -ENOMEM;
		else
			list_entry(c->outs.prev, struct out, node)->counted = true;
		if (!ret)
			conn_flush(s, c);
	}
	free(r);
	return ret;
}

static struct request *model_pop(struct list *q)
{
	struct request *r = list_entry(q->next, struct request, queue);

	list_del(&r->queue);
	return r;
}

/* Moves the model forward to now: completes, starts and links what it can. */
static int model_advance(struct server *s, uint64_t now)
{
	uint32_t cap = s->cfg->max_inflight;
	int ret, k;

	for (;;) {
		struct request *r = NULL;
		uint64_t start, queue;

		if (s->on_link && s->link_end_ns <= now) {
			ret = model_link_done(s);
			if (ret)
				return ret;
		}
		/* Free slots go to urgent requests first. */
		while (!cap || s->inflight < cap) {
			struct list *q = !list_empty(&s->wait[KIND_URGENT]) ? &s->wait[KIND_URGENT] :
					 &s->wait[KIND_BACKGROUND];

			if (list_empty(q))
				break;
			r = model_pop(q);
			r->started_ns = now;
			r->ready_ns = now + s->cfg->latency_ns;
			list_add_tail(&s->started[r->kind], &r->queue);
			s->inflight++;
		}
		if (s->on_link)
			return 0;
		r = NULL;
		for (k = 0; k < KINDS && !r; k++)
			if (!list_empty(&s->started[k]) &&
			    list_entry(s->started[k].next, struct request, queue)->ready_ns <= now)
				r = model_pop(&s->started[k]);
		if (!r)
			return 0;
		/*
		 * The link's own timeline, not the loop's wake-ups: a reply
		 * starts when it was ready or when the link freed, whichever
		 * is later, so a late wake-up does not slow the link down.
		 */
		start = r->ready_ns > s->link_free_ns ? r->ready_ns : s->link_free_ns;
		queue = (r->started_ns - r->arrived_ns) + (start - r->ready_ns);
		s->stats.queue_ns_total += queue;
		if (queue > s->stats.queue_ns_max)
			s->stats.queue_ns_max = queue;
		s->stats.served++;
		s->stats.bytes += r->req.length;
		s->link_free_ns = s->link_end_ns = start + model_link_ns(s, r->req.length);
		s->on_link = r;
	}
}

/* When the model next has something to do (UINT64_MAX: nothing until a request). */
static uint64_t model_next_ns(const struct server *s)
{
	uint64_t next = UINT64_MAX;
	int k;

	if (s->on_link)
		return s->link_end_ns;
	for (k = 0; k < KINDS; k++)
		if (!list_empty(&s->started[k])) {
			uint64_t t = list_entry(s->started[k].next, struct request, queue)->ready_ns;

			if (t < next)
				next = t;
		}
	return next;
}

/* ---- requests off the wire ---- */

static int server_request(struct server *s, struct conn *c, const struct ukvm_remote_request *req,
			  uint64_t now)
{
	struct out *o;
	int32_t status = 0;

	if (req->flags & UKVM_REMOTE_STATS) {
		s->stats.stats_requests++;
		o = conn_reply(c, req, 0, sizeof(o->stats), NULL);
		if (!o)
			return -ENOMEM;
		o->hdr.offset = 0;
		o->stats = s->stats;
		o->data = (const uint8_t *)&o->stats;
		return 0;
	}
	if (req->flags & ~UKVM_REMOTE_FLAGS || !req->length || req->length > UKVM_REMOTE_MAX_LENGTH)
		status = -EINVAL;
	else if (req->offset > s->size || req->length > s->size - req->offset)
		status = -ERANGE;
	if (status) {
		s->stats.errors++;
		return conn_reply(c, req, status, 0, NULL) ? 0 : -ENOMEM;
	}
	return model_arrive(s, c, req, now);
}

static int server_read(struct server *s, struct conn *c)
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
			conn_close(s, c);
			return 0;
		}
		c->in_got += (size_t)n;
		whole = c->in_got / rec * rec;
		for (i = 0; i < whole; i += rec) {
			struct ukvm_remote_request req;

			memcpy(&req, c->in + i, rec);
			ret = server_request(s, c, &req, ukvm_now_ns());
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
		conn_flush(s, c);
	return 0;
}

static int server_accept(struct server *s, struct ukvm_error *err)
{
	for (;;) {
		struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP };
		struct conn *c;
		int one = 1, fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0 && errno == EINTR)
			continue;
		if (fd < 0 && (errno == EAGAIN || errno == ECONNABORTED))
			return 0;
		if (fd < 0 && (errno == EMFILE || errno == ENFILE))
			return 0;	/* stays pending in the backlog until an fd frees */
		if (fd < 0) {
			ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: accept4");
			return -errno;
		}
		if (s->cfg->listen[0] == 't')
			setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		c = calloc(1, sizeof(*c));
		if (!c) {
			close(fd);
			return -ENOMEM;
		}
		c->fd = fd;
		list_init(&c->requests);
		list_init(&c->outs);
		ev.data.ptr = c;
		if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev)) {
			ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: epoll_ctl(ADD connection)");
			close(fd);
			free(c);
			return -errno;
		}
		list_add_tail(&s->conns, &c->node);
		s->stats.connections++;
	}
}

/* Frees the connections closed during this turn of the loop. */
static void server_reap(struct server *s)
{
	struct list *p, *n;

	for (p = s->conns.next; p != &s->conns; p = n) {
		struct conn *c = list_entry(p, struct conn, node);

		n = p->next;
		if (c->dead) {
			list_del(&c->node);
			free(c);
		}
	}
}

static int server_arm(struct server *s, struct ukvm_error *err)
{
	uint64_t next = model_next_ns(s);
	struct itimerspec its = { 0 };

	if (next != UINT64_MAX) {
		/* 0 would disarm the timer: an event already due fires at 1 ns. */
		next = next ? next : 1;
		its.it_value.tv_sec = (time_t)(next / NSEC_PER_SEC);
		its.it_value.tv_nsec = (long)(next % NSEC_PER_SEC);
	}
	if (timerfd_settime(s->tfd, TFD_TIMER_ABSTIME, &its, NULL)) {
		ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: timerfd_settime");
		return -errno;
	}
	return 0;
}

static int server_loop(struct server *s, struct ukvm_error *err)
{
	struct epoll_event evs[64];
	int i, n, ret;

	while (!s->stop) {
		ret = model_advance(s, ukvm_now_ns());
		if (!ret)
			ret = server_arm(s, err);
		if (ret) {
			ukvm_err_set(err, UKVM_ERR_RUN, -ret, "page server: serving");
			return ret;
		}
		n = epoll_wait(s->epfd, evs, ARRAY_SIZE(evs), SERVER_WAIT_MS);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: epoll_wait");
			return -errno;
		}
		for (i = 0; i < n && !s->stop; i++) {
			void *tag = evs[i].data.ptr;
			struct conn *c = tag;

			if (tag == &tag_signal) {
				struct signalfd_siginfo si;

				/* Taken, so that it is not delivered when the mask is restored. */
				while (read(s->sfd, &si, sizeof(si)) < 0 && errno == EINTR)
					;
				s->stop = true;
			} else if (tag == &tag_stop) {
				s->stop = true;
			} else if (tag == &tag_timer) {
				uint64_t expirations;

				if (read(s->tfd, &expirations, sizeof(expirations)) < 0 &&
				    errno != EAGAIN && errno != EINTR) {
					ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: read(timerfd)");
					return -errno;
				}
			} else if (tag == &tag_listen) {
				ret = server_accept(s, err);
				if (ret)
					return ret;
			} else if (!c->dead) {
				if (evs[i].events & EPOLLOUT)
					conn_flush(s, c);
				if (!c->dead && evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
					ret = server_read(s, c);
					if (ret) {
						ukvm_err_set(err, UKVM_ERR_RUN, -ret,
							     "page server: reading a request");
						return ret;
					}
				}
			}
		}
		server_reap(s);
	}
	return 0;
}

/* ---- setup and teardown ---- */

static int server_add(struct server *s, int fd, void *tag, const char *what,
		      struct ukvm_error *err)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = tag };

	if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev)) {
		int e = errno;

		if (e == EPERM)
			ukvm_err_set(err, UKVM_ERR_CONFIG, e, "page server: the stop fd (%s) "
				     "cannot be polled; give the server a pipe or a terminal "
				     "as its stdin", what);
		else
			ukvm_err_set(err, UKVM_ERR_RUN, e, "page server: epoll_ctl(ADD %s)", what);
		return -e;
	}
	return 0;
}

static int server_open_snapshot(struct server *s, struct ukvm_error *err)
{
	struct stat st;
	void *map;
	int fd = open(s->cfg->snapshot_path, O_RDONLY | O_CLOEXEC), ret = 0;

	if (fd < 0) {
		ukvm_err_set(err, UKVM_ERR_CONFIG, errno, "page server: open(\"%s\")",
			     s->cfg->snapshot_path);
		return -errno;
	}
	if (fstat(fd, &st)) {
		ret = -errno;
		ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: fstat(\"%s\")",
			     s->cfg->snapshot_path);
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		ret = -EINVAL;
		ukvm_err_set(err, UKVM_ERR_CONFIG, 0, "page server: \"%s\" is not a regular file",
			     s->cfg->snapshot_path);
		goto out;
	}
	s->size = (uint64_t)st.st_size;
	if (s->size) {
		map = mmap(NULL, s->size, PROT_READ, MAP_SHARED, fd, 0);
		if (map == MAP_FAILED) {
			ret = -errno;
			ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: mmap(\"%s\")",
				     s->cfg->snapshot_path);
			goto out;
		}
		s->map = map;
	}
out:
	close(fd);	/* the mapping keeps the file */
	return ret;
}

static int server_listen(struct server *s, struct ukvm_remote_address *addr, bool *bound,
			 struct ukvm_error *err)
{
	int one = 1, ret;

	ret = ukvm_remote_address_parse(s->cfg->listen, addr, err);
	if (ret)
		return ret;
	s->lfd = socket(addr->sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s->lfd < 0) {
		ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: socket");
		return -errno;
	}
	if (addr->sa.ss_family != AF_UNIX)
		setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(s->lfd, (struct sockaddr *)&addr->sa, addr->len)) {
		ukvm_err_set(err, UKVM_ERR_CONFIG, errno, "page server: bind(%s)", s->cfg->listen);
		return -errno;
	}
	*bound = addr->sa.ss_family == AF_UNIX;
	if (listen(s->lfd, 128)) {
		ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: listen(%s)", s->cfg->listen);
		return -errno;
	}
	addr->len = sizeof(addr->sa);
	if (addr->sa.ss_family != AF_UNIX &&
	    getsockname(s->lfd, (struct sockaddr *)&addr->sa, &addr->len)) {
		ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: getsockname");
		return -errno;
	}
	return 0;
}

static int server_ready(int fd, const struct ukvm_remote_address *addr, struct ukvm_error *err)
{
	char line[UKVM_REMOTE_ADDRESS_MAX + 16], name[UKVM_REMOTE_ADDRESS_MAX];
	size_t done = 0, len;
	ssize_t n;
	int ret = ukvm_remote_address_format(addr, name, sizeof(name));

	if (ret) {
		ukvm_err_set(err, UKVM_ERR_RUN, -ret, "page server: formatting its address");
		return ret;
	}
	len = (size_t)snprintf(line, sizeof(line), "ready %s\n", name);
	while (fd >= 0 && done < len) {
		n = write(fd, line + done, len - done);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: writing the ready line");
			return -errno;
		}
		done += (size_t)n;
	}
	return 0;
}

static void server_free_all(struct server *s)
{
	struct list *p, *n;
	int k;

	for (p = s->conns.next; p != &s->conns; p = n) {
		n = p->next;
		conn_close(s, list_entry(p, struct conn, node));
	}
	server_reap(s);
	free(s->on_link);	/* the conns are gone: nothing else holds a request */
	s->on_link = NULL;
	for (k = 0; k < KINDS; k++) {
		while (!list_empty(&s->wait[k]))
			free(model_pop(&s->wait[k]));
		while (!list_empty(&s->started[k]))
			free(model_pop(&s->started[k]));
	}
}

int ukvm_pageserver_serve(const struct ukvm_pageserver_config *cfg, int ready_fd, int stop_fd,
			  struct ukvm_remote_stats *stats, struct ukvm_error *err)
{
	struct server s = { .cfg = cfg, .epfd = -1, .lfd = -1, .tfd = -1, .sfd = -1 };
	struct ukvm_remote_address addr;
	sigset_t mask, old_mask;
	bool bound = false, masked = false;
	int old_slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
	int ret, k;

	memset(err, 0, sizeof(*err));
	list_init(&s.conns);
	for (k = 0; k < KINDS; k++) {
		list_init(&s.wait[k]);
		list_init(&s.started[k]);
	}
	ret = server_open_snapshot(&s, err);
	if (ret)
		goto out;
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	ret = -pthread_sigmask(SIG_BLOCK, &mask, &old_mask);
	if (ret) {
		ukvm_err_set(err, UKVM_ERR_RUN, -ret, "page server: pthread_sigmask");
		goto out;
	}
	masked = true;
	s.sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	s.epfd = epoll_create1(EPOLL_CLOEXEC);
	s.tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (s.sfd < 0 || s.epfd < 0 || s.tfd < 0) {
		ret = -errno;
		ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: %s",
			     s.sfd < 0 ? "signalfd" : s.epfd < 0 ? "epoll_create1" : "timerfd_create");
		goto out;
	}
	ret = server_listen(&s, &addr, &bound, err);
	if (!ret)
		ret = server_add(&s, s.lfd, &tag_listen, "listening socket", err);
	if (!ret)
		ret = server_add(&s, s.tfd, &tag_timer, "timerfd", err);
	if (!ret)
		ret = server_add(&s, s.sfd, &tag_signal, "signalfd", err);
	if (!ret && stop_fd >= 0)
		ret = server_add(&s, stop_fd, &tag_stop, "stdin", err);
	if (ret)
		goto out;
	prctl(PR_SET_TIMERSLACK, SERVER_TIMER_SLACK_NS, 0, 0, 0);
	ret = server_ready(ready_fd, &addr, err);
	if (!ret)
		ret = server_loop(&s, err);
out:
	if (stats)
		*stats = s.stats;
	server_free_all(&s);
	if (bound)
		unlink(((struct sockaddr_un *)&addr.sa)->sun_path);
	if (s.lfd >= 0)
		close(s.lfd);
	if (s.tfd >= 0)
		close(s.tfd);
	if (s.sfd >= 0) {
		struct signalfd_siginfo si;

		/*
		 * A SIGTERM that came with the stop fd's hang-up is still
		 * pending: take it, or restoring the mask would deliver it.
		 */
		while (read(s.sfd, &si, sizeof(si)) == sizeof(si))
			;
		close(s.sfd);
	}
	if (s.epfd >= 0)
		close(s.epfd);
	if (s.map)
		munmap((void *)s.map, s.size);
	if (masked)
		pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
	if (old_slack > 0)
		prctl(PR_SET_TIMERSLACK, old_slack, 0, 0, 0);
	return ret;
}
