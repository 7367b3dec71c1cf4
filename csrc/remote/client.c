/* SPDX-License-Identifier: MIT */
/* A page server's client (client.h). */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/util.h"
#include "remote/address.h"
#include "remote/auth.h"
#include "remote/client.h"
#include "remote/wire.h"

/* The longest single poll: a deadline of "never" still wakes up to look again. */
#define CLIENT_SLICE_NS		NSEC_PER_SEC

struct ukvm_remote_conn {
	int fd;
	char address[UKVM_REMOTE_ADDRESS_MAX];	/* for the _for calls' messages */
	int spent;		/* -errno every later call returns, 0 while usable */
	uint32_t outstanding;	/* requests sent whose replies are not yet taken */
};

/*
 * Waits until fd polls for events (or has an error: the next call on it
 * reports it). 0, -ECANCELED (stop_fd readable, looked at first: the run
 * is stopping) or -ETIMEDOUT.
 */
static int client_wait(int fd, short events, int stop_fd, uint64_t deadline_ns)
{
	struct pollfd p[2] = { { .fd = fd, .events = events }, { .fd = stop_fd, .events = POLLIN } };
	nfds_t n = stop_fd >= 0 ? 2 : 1;

	for (;;) {
		uint64_t now = ukvm_now_ns(), left;
		struct timespec ts;
		int ret;

		if (now >= deadline_ns)
			return -ETIMEDOUT;
		left = deadline_ns - now;
		if (left > CLIENT_SLICE_NS)
			left = CLIENT_SLICE_NS;
		ts.tv_sec = (time_t)(left / NSEC_PER_SEC);
		ts.tv_nsec = (long)(left % NSEC_PER_SEC);
		ret = ppoll(p, n, &ts, NULL);
		if (ret < 0 && errno == EINTR)
			continue;	/* a kick: the stop fd says whether to stop */
		if (ret < 0)
			return -errno;
		if (n == 2 && p[1].revents)
			return -ECANCELED;
		if (p[0].revents)
			return 0;
	}
}

/* The error that spends c; a server gone stays itself, the rest are -ENOTCONN after. */
static int client_spend(struct ukvm_remote_conn *c, int ret)
{
	if (ret == -ECONNRESET || ret == -EPIPE)
		c->spent = ret;
	else
		c->spent = -ENOTCONN;
	return ret;
}

static int client_send_all(struct ukvm_remote_conn *c, const void *buf, size_t len, int stop_fd,
			   uint64_t deadline_ns)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		int ret;

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			ret = client_wait(c->fd, POLLOUT, stop_fd, deadline_ns);
			if (ret)
				return ret;
			continue;
		}
		if (n < 0)
			return errno == ENOTCONN ? -ECONNRESET : -errno;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int client_recv_all(struct ukvm_remote_conn *c, void *buf, size_t len, int stop_fd,
			   uint64_t deadline_ns)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = recv(c->fd, p, len, MSG_DONTWAIT);
		int ret;

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			ret = client_wait(c->fd, POLLIN, stop_fd, deadline_ns);
			if (ret)
				return ret;
			continue;
		}
		if (n == 0)
			return -ECONNRESET;	/* the server closed the connection */
		if (n < 0)
			return -errno;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int client_connect_wait(int fd, const struct ukvm_remote_address *addr)
{
	uint64_t deadline = ukvm_deadline_after(UKVM_REMOTE_CONNECT_TIMEOUT_NS);
	socklen_t len = sizeof(int);
	int ret, soerr = 0;

	for (;;) {
		if (!connect(fd, (const struct sockaddr *)&addr->sa, addr->len))
			return 0;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN && addr->sa.ss_family == AF_UNIX) {
			/* The listen backlog is full: wait for the server to accept. */
			if (ukvm_now_ns() >= deadline)
				return -ETIMEDOUT;
			ukvm_sleep_ns(NSEC_PER_MSEC);
			continue;
		}
		if (errno != EINPROGRESS)
			return -errno;
		ret = client_wait(fd, POLLOUT, -1, deadline);
		if (ret)
			return ret;
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len))
			return -errno;
		return -soerr;
	}
}

/*
 * The handshake (protocol.h) on c's new connection, key NULL or empty for
 * none, within the connect deadline. 0, or -errno with err naming the
 * address and what to do.
 */
static int client_handshake(struct ukvm_remote_conn *c, const struct ukvm_remote_key *key,
			    struct ukvm_error *err)
{
	uint64_t deadline = ukvm_deadline_after(UKVM_REMOTE_CONNECT_TIMEOUT_NS);
	bool keyed = key && key->len;
	struct ukvm_remote_welcome welcome;
	struct ukvm_remote_hello hello;
	struct ukvm_remote_auth auth;
	const char *why;
	int ret;

	ret = client_recv_all(c, &hello, sizeof(hello), -1, deadline);
	if (!ret)
		ret = ukvm_auth_hello_check(&hello, sizeof(hello), &hello);
	if (ret == -EPROTO)
		return ukvm_err_set(err, UKVM_ERR_RUN, EPROTO, "page server client: %s: what "
				    "answered is not a uffdkvm page server (no hello), or one of "
				    "another version", c->address);
	if (ret == -ECONNRESET || ret == -EPIPE)
		return ukvm_err_set(err, UKVM_ERR_RUN, ECONNRESET, "page server client: %s "
				    "closed the connection before its hello (a Unix socket's server "
				    "lets in only its own user and root)", c->address);
	if (ret)
		return ukvm_err_set(err, UKVM_ERR_RUN, -ret, "page server client: %s: its hello: "
				    "%s", c->address, ukvm_remote_strerror(ret));
	if ((hello.flags & UKVM_REMOTE_KEYED) && !keyed)
		return ukvm_err_set(err, UKVM_ERR_RUN, EACCES, "page server client: %s requires "
				    "a key and none was given: give the server's key file "
				    "(source_key_file, or PageClient's key_file)", c->address);
	if (!(hello.flags & UKVM_REMOTE_KEYED) && keyed)
		return ukvm_err_set(err, UKVM_ERR_RUN, EKEYREJECTED, "page server client: %s "
				    "holds no key, so it cannot prove it holds the one given: "
				    "refused (is it the server you meant?)", c->address);
	if (keyed && !ukvm_remote_auth_available())
		return ukvm_err_set(err, UKVM_ERR_HOST, EOPNOTSUPP, "page server client: %s "
				    "wants a key, and this build of uffdkvm has no libcrypto "
				    "(OpenSSL) to prove it: install libssl-dev and build it again",
				    c->address);
	ret = ukvm_auth_answer_make(key, &hello, &auth);
	if (!ret)
		ret = client_send_all(c, &auth, sizeof(auth), -1, deadline);
	if (!ret)
		ret = client_recv_all(c, &welcome, sizeof(welcome), -1, deadline);
	if (!ret)
		ret = ukvm_auth_welcome_check(key, &hello, &auth, &welcome, sizeof(welcome));
	explicit_bzero(&auth, sizeof(auth));
	if (!ret)
		return 0;
	why = ret == -EACCES ? "refused the key: it serves with another one (wrong key file?)" :
	      ret == -EKEYREJECTED ? "did not prove it holds the key: its answer is not the "
				     "key's (another server at that address?)" :
	      ret == -EPROTO ? "answered the handshake with something else" :
	      ret == -ECONNRESET || ret == -EPIPE ? "closed the connection during the handshake" :
	      ukvm_remote_strerror(ret);
	return ukvm_err_set(err, ret == -ETIMEDOUT ? UKVM_ERR_TIMEOUT : UKVM_ERR_RUN, -ret,
			    "page server client: %s %s", c->address, why);
}

int ukvm_remote_connect(const char *address, const struct ukvm_remote_key *key,
			struct ukvm_remote_conn **out, struct ukvm_error *err)
{
	struct ukvm_remote_address addr;
	struct ukvm_remote_conn *c = NULL;
	int one = 1, fd = -1, ret;

	memset(err, 0, sizeof(*err));
	*out = NULL;
	ret = ukvm_remote_address_parse(address, &addr, err);
	if (ret)
		return ret;
	fd = socket(addr.sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		ret = -errno;
		ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server client: socket");
		goto error;
	}
	ret = client_connect_wait(fd, &addr);
	if (ret) {
		char call[UKVM_REMOTE_ADDRESS_MAX + 64];

		snprintf(call, sizeof(call), "page server client: connect(\"%s\")", address);
		ukvm_err_set_hint(err, UKVM_ERR_RUN, -ret, call,
				  "Is the page server running and listening there?");
		goto error;
	}
	if (addr.sa.ss_family != AF_UNIX)
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	c = calloc(1, sizeof(*c));
	if (!c) {
		ret = -ENOMEM;
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "page server client: allocating");
		goto error;
	}
	c->fd = fd;
	fd = -1;
	snprintf(c->address, sizeof(c->address), "%s", address);
	ret = client_handshake(c, key, err);
	if (ret)
		goto error;
	*out = c;
	return 0;
error:
	if (fd >= 0)
		close(fd);
	ukvm_remote_close(c);
	return ret;
}

void ukvm_remote_close(struct ukvm_remote_conn *c)
{
	if (!c)
		return;
	close(c->fd);
	free(c);
}

uint32_t ukvm_remote_outstanding(const struct ukvm_remote_conn *c)
{
	return c->outstanding;
}

/* n requests (lengths checked first: -EINVAL sends none), in one write. */
static int client_request_many(struct ukvm_remote_conn *c, const struct ukvm_remote_range *ranges,
			       uint32_t n, uint32_t flags, int stop_fd, uint64_t deadline_ns)
{
	struct ukvm_remote_request one = { 0 }, *reqs = &one;
	uint32_t i;
	int ret;

	if (c->spent)
		return c->spent;
	for (i = 0; i < n && !(flags & UKVM_REMOTE_STATS); i++)
		if (!ranges[i].length || ranges[i].length > UKVM_REMOTE_MAX_LENGTH)
			return -EINVAL;
	if (n > 1) {
		reqs = calloc(n, sizeof(*reqs));
		if (!reqs)
			return -ENOMEM;
	}
	for (i = 0; i < n; i++)
		reqs[i] = (struct ukvm_remote_request){ .offset = ranges[i].offset,
							.length = (uint32_t)ranges[i].length,
							.flags = flags };
	ret = client_send_all(c, reqs, n * sizeof(*reqs), stop_fd, deadline_ns);
	if (reqs != &one)
		free(reqs);
	if (ret)
		return client_spend(c, ret);
	c->outstanding += n;
	return 0;
}

static int client_request(struct ukvm_remote_conn *c, uint64_t offset, uint64_t len,
			  uint32_t flags, int stop_fd, uint64_t deadline_ns)
{
	struct ukvm_remote_range range = { .offset = offset, .length = len };

	return client_request_many(c, &range, 1, flags, stop_fd, deadline_ns);
}

/* The next reply's header, checked for what any reply must hold. */
static int client_header(struct ukvm_remote_conn *c, struct ukvm_remote_reply *reply,
			 int stop_fd, uint64_t deadline_ns)
{
	int ret = client_recv_all(c, reply, sizeof(*reply), stop_fd, deadline_ns);

	if (!ret)
		ret = ukvm_wire_reply_check(reply);
	return ret ? client_spend(c, ret) : 0;
}

int ukvm_remote_send(struct ukvm_remote_conn *c, uint64_t offset, uint64_t len, bool urgent,
		     int stop_fd, uint64_t deadline_ns)
{
	return client_request(c, offset, len, urgent ? UKVM_REMOTE_URGENT : 0, stop_fd,
			      deadline_ns);
}

int ukvm_remote_recv(struct ukvm_remote_conn *c, struct ukvm_remote_reply *reply, void *dst,
		     uint64_t dst_len, int stop_fd, uint64_t deadline_ns)
{
	int ret;

	if (c->spent)
		return c->spent;
	if (!c->outstanding)
		return -EINVAL;
	ret = client_header(c, reply, stop_fd, deadline_ns);
	if (ret)
		return ret;
	ret = ukvm_wire_reply_pipelined(reply, dst_len);
	if (ret)
		return client_spend(c, ret);
	ret = client_recv_all(c, dst, reply->length, stop_fd, deadline_ns);
	if (ret)
		return client_spend(c, ret);
	c->outstanding--;
	return 0;
}

int ukvm_remote_fetch(struct ukvm_remote_conn *c, uint64_t offset, uint64_t len, bool urgent,
		      void *dst, int stop_fd, uint64_t deadline_ns)
{
	struct ukvm_remote_request req = { .offset = offset, .length = (uint32_t)len,
					   .flags = urgent ? UKVM_REMOTE_URGENT : 0 };
	struct ukvm_remote_reply reply;
	int ret;

	if (c->spent)
		return c->spent;
	if (c->outstanding)
		return -EBUSY;
	ret = client_request(c, offset, len, req.flags, stop_fd, deadline_ns);
	if (!ret)
		ret = client_header(c, &reply, stop_fd, deadline_ns);
	if (ret)
		return ret;
	if (ukvm_wire_reply_answers(&reply, &req))
		return client_spend(c, -EPROTO);
	if (!reply.status)
		ret = client_recv_all(c, dst, len, stop_fd, deadline_ns);
	if (ret)
		return client_spend(c, ret);
	c->outstanding--;
	return reply.status;
}

int ukvm_remote_stats(struct ukvm_remote_conn *c, struct ukvm_remote_stats *stats, int stop_fd,
		      uint64_t deadline_ns)
{
	const struct ukvm_remote_request req = { .flags = UKVM_REMOTE_STATS };
	struct ukvm_remote_reply reply;
	int ret;

	if (c->spent)
		return c->spent;
	if (c->outstanding)
		return -EBUSY;
	ret = client_request(c, 0, 0, req.flags, stop_fd, deadline_ns);
	if (!ret)
		ret = client_header(c, &reply, stop_fd, deadline_ns);
	if (ret)
		return ret;
	if (ukvm_wire_reply_answers(&reply, &req))
		return client_spend(c, -EPROTO);
	ret = client_recv_all(c, stats, sizeof(*stats), stop_fd, deadline_ns);
	if (ret)
		return client_spend(c, ret);
	c->outstanding--;
	return 0;
}

const char *ukvm_remote_strerror(int ret)
{
	switch (ret) {
	case 0:			return "done";
	case -ECANCELED:	return "cancelled: the run is stopping";
	case -ETIMEDOUT:	return "no reply before the deadline";
	case -ECONNRESET:
	case -EPIPE:		return "page server closed the connection";
	case -EPROTO:		return "a reply that does not answer the request";
	case -EINVAL:		return "a length of 0 or above the maximum";
	case -EBUSY:		return "pipelined replies still to take";
	case -ERANGE:		return "the range ends past the snapshot's end";
	case -ENOTCONN:		return "the connection was given up after an earlier error";
	default:		return "the page server connection failed";
	}
}

/* ---- the calls with a timeout (ukvm.h), for the binding ---- */

/* ret (not 0) with err naming what failed: "page server client: <what> from <address>: ...". */
static int client_fail(const struct ukvm_remote_conn *c, int ret, struct ukvm_error *err,
		       const char *what)
{
	return ukvm_err_set(err, ret == -ETIMEDOUT ? UKVM_ERR_TIMEOUT : UKVM_ERR_RUN, -ret,
			    "page server client: %s from %s: %s", what, c->address,
			    ukvm_remote_strerror(ret));
}

int ukvm_remote_fetch_for(struct ukvm_remote_conn *c, uint64_t offset, uint64_t len,
			  bool urgent, void *dst, uint64_t timeout_ns, struct ukvm_error *err)
{
	int ret;

	memset(err, 0, sizeof(*err));
	ret = ukvm_remote_fetch(c, offset, len, urgent, dst, -1, ukvm_deadline_after(timeout_ns));
	if (ret) {
		char what[96];

		snprintf(what, sizeof(what), "fetch of %llu bytes at %llu",
			 (unsigned long long)len, (unsigned long long)offset);
		return client_fail(c, ret, err, what);
	}
	return 0;
}

int ukvm_remote_send_for(struct ukvm_remote_conn *c, const struct ukvm_remote_range *ranges,
			 uint32_t n, bool urgent, uint64_t timeout_ns, struct ukvm_error *err)
{
	int ret;

	memset(err, 0, sizeof(*err));
	ret = client_request_many(c, ranges, n, urgent ? UKVM_REMOTE_URGENT : 0, -1,
				  ukvm_deadline_after(timeout_ns));
	if (ret) {
		char what[96];

		snprintf(what, sizeof(what), "%u request%s (the first of %llu bytes at %llu)", n,
			 n == 1 ? "" : "s", n ? (unsigned long long)ranges[0].length : 0ULL,
			 n ? (unsigned long long)ranges[0].offset : 0ULL);
		return client_fail(c, ret, err, what);
	}
	return 0;
}

int ukvm_remote_recv_for(struct ukvm_remote_conn *c, struct ukvm_remote_answer *answer,
			 void *dst, uint64_t dst_len, uint64_t timeout_ns,
			 struct ukvm_error *err)
{
	struct ukvm_remote_reply reply;
	int ret;

	memset(err, 0, sizeof(*err));
	if (!c->spent && !c->outstanding)
		return ukvm_err_set(err, UKVM_ERR_RUN, EINVAL, "page server client: a reply from "
				    "%s with no request outstanding", c->address);
	ret = ukvm_remote_recv(c, &reply, dst, dst_len, -1, ukvm_deadline_after(timeout_ns));
	if (ret)
		return client_fail(c, ret, err, "a reply");
	answer->offset = reply.offset;
	answer->length = reply.length;
	answer->urgent = reply.flags & UKVM_REMOTE_URGENT;
	answer->status = reply.status;
	return 0;
}

int ukvm_remote_stats_for(struct ukvm_remote_conn *c, struct ukvm_remote_stats *stats,
			  uint64_t timeout_ns, struct ukvm_error *err)
{
	int ret;

	memset(err, 0, sizeof(*err));
	ret = ukvm_remote_stats(c, stats, -1, ukvm_deadline_after(timeout_ns));
	return ret ? client_fail(c, ret, err, "the counters (STATS)") : 0;
}
