/* SPDX-License-Identifier: MIT */
/*
 * The page server (ukvm.h: ukvm_pageserver_serve), run in a process of
 * its own: serves byte ranges of a snapshot file (protocol.h).
 *
 * The model of a remote source (latency, one link of a bandwidth,
 * max_inflight slots, URGENT ahead of background) is model.c's, without
 * sockets; this file runs the loop that feeds it the requests its
 * connections read and the clock, and writes each reply when the model
 * says its link time has ended. What one connection does (its handshake,
 * its requests, its replies) is conn.c's; the state the two share is
 * server_state.h.
 *
 * The loop: one thread, one epoll instance over the listening socket, the
 * connections, a timerfd for the model's next event, a signalfd for
 * SIGTERM/SIGINT and the stop fd (stdin). Each connection keeps a list of
 * its requests still in the model, so that a connection that closes takes
 * them out of it.
 *
 * A new connection starts with the handshake (protocol.h, auth.c): a Unix
 * socket's peer of another uid than the server's (or root) is closed at
 * once; the others get the hello and have until their deadline to send
 * the auth record, which is read in the same loop as every connection's
 * requests, so that a silent or slow client stalls nobody else. Until it
 * passes, nothing it sends is taken as a request. At most
 * SERVER_HANDSHAKES_MAX connections wait in their handshake, and fewer
 * when the fds run out: a new connection then closes the oldest, so that
 * connections without the key hold neither every fd nor a keyed client's
 * place until their deadlines (a client is closed so only if that many
 * connections, or as many as the fds left allow, arrive after it before its
 * auth record does). Out of fds with no handshake to close, the listening
 * socket is not polled (level-triggered, it would wake the loop at once,
 * forever) until a connection closes or SERVER_LISTEN_RETRY_NS pass. Every
 * refusal is counted (stats.refused) and logged on stderr, naming the peer.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
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
#include <sys/un.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/util.h"
#include "remote/address.h"
#include "remote/auth.h"
#include "remote/conn.h"
#include "remote/list.h"
#include "remote/model.h"
#include "remote/server_state.h"

/* The longest epoll wait: nothing in the loop waits unbounded. */
#define SERVER_WAIT_MS		1000
/* Timer slack for this thread: the model's waits are microseconds. */
#define SERVER_TIMER_SLACK_NS	1000
/* A new connection's handshake, at most, unless the config says otherwise. */
#define SERVER_HANDSHAKE_NS	(5 * NSEC_PER_SEC)
/*
 * Connections still in their handshake, at most: a new one past this
 * closes the oldest, so that connections without the key cannot hold
 * every fd (and keep a keyed client out) until their deadlines.
 */
#define SERVER_HANDSHAKES_MAX	64
/*
 * Connections accepted per turn of the loop, at most: the handshakes
 * already accepted are read between batches, so that a backlog of new
 * connections does not evict a client whose auth record is waiting.
 */
#define SERVER_ACCEPT_BATCH	16
/*
 * Out of fds with no handshake to close: the listening socket is polled
 * again when a connection closes, or after this long (the fds may be
 * another process's: ENFILE).
 */
#define SERVER_LISTEN_RETRY_NS	(100 * NSEC_PER_MSEC)

/* Tags for epoll's data: a struct conn pointer, or one of these. */
static int tag_listen, tag_timer, tag_signal, tag_stop;

/* Refuses the connections whose handshake is past its deadline. */
static void server_expire(struct server *s, uint64_t now)
{
	struct list *p;

	for (p = s->conns.next; p != &s->conns; p = p->next) {
		struct conn *c = list_entry(p, struct conn, node);

		if (!c->dead && !c->ready && now >= c->deadline_ns)
			ukvm_conn_refuse(s, c, "no handshake before its deadline");
	}
}

/* The earliest handshake deadline, or UINT64_MAX. */
static uint64_t server_next_deadline(const struct server *s)
{
	uint64_t next = UINT64_MAX;
	const struct list *p;

	for (p = s->conns.next; p != &s->conns; p = p->next) {
		const struct conn *c = list_entry(p, struct conn, node);

		if (!c->dead && !c->ready && c->deadline_ns < next)
			next = c->deadline_ns;
	}
	return next;
}

/* Closes the oldest connection still in its handshake; false if there is none. */
static bool server_evict(struct server *s, const char *why)
{
	struct list *p;

	for (p = s->conns.next; p != &s->conns; p = p->next) {
		struct conn *c = list_entry(p, struct conn, node);

		if (!c->dead && !c->ready) {
			ukvm_conn_refuse(s, c, why);
			return true;
		}
	}
	return false;
}

/* The listening socket polled or not: off while the server is out of fds. */
static int server_listen_events(struct server *s, bool on)
{
	struct epoll_event ev = { .events = on ? EPOLLIN : 0, .data.ptr = &tag_listen };

	if (epoll_ctl(s->epfd, EPOLL_CTL_MOD, s->lfd, &ev))
		return -errno;
	s->listen_off = !on;
	s->listen_retry_ns = on ? UINT64_MAX : ukvm_now_ns() + SERVER_LISTEN_RETRY_NS;
	return 0;
}

static int server_accept(struct server *s, struct ukvm_error *err)
{
	int batch;

	for (batch = 0; batch < SERVER_ACCEPT_BATCH; batch++) {
		struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP };
		struct sockaddr_storage peer;
		socklen_t peer_len = sizeof(peer);
		struct conn *c;
		int one = 1, fd = accept4(s->lfd, (struct sockaddr *)&peer, &peer_len,
					  SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0 && errno == EINTR)
			continue;
		if (fd < 0 && (errno == EAGAIN || errno == ECONNABORTED))
			return 0;
		if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
			struct pollfd pfd = { .fd = s->lfd, .events = POLLIN };
			int ret;

			/*
			 * accept4 takes the fd before it looks at the backlog: EMFILE
			 * also when no connection waits, and then nothing is closed.
			 */
			if (poll(&pfd, 1, 0) <= 0 || !(pfd.revents & POLLIN))
				return 0;
			/* An fd freed by the oldest handshake, else none until a conn closes. */
			if (server_evict(s, "closed for a newer connection: out of fds"))
				continue;
			/* Level-triggered: polled while it cannot accept, epoll_wait would spin. */
			ret = server_listen_events(s, false);
			if (ret)
				return ukvm_err_set(err, UKVM_ERR_RUN, -ret,
						    "page server: epoll_ctl(MOD listening socket)");
			return 0;
		}
		if (fd < 0) {
			return ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: accept4");
		}
		if (s->cfg->listen[0] == 't')
			setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		c = calloc(1, sizeof(*c));
		if (!c) {
			close(fd);
			return ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM,
					    "page server: a new connection's state");
		}
		c->fd = fd;
		list_init(&c->requests);
		list_init(&c->outs);
		ev.data.ptr = c;
		if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev)) {
			int ret = ukvm_err_set(err, UKVM_ERR_RUN, errno,
					       "page server: epoll_ctl(ADD connection)");

			close(fd);
			free(c);
			return ret;
		}
		if (s->handshakes >= SERVER_HANDSHAKES_MAX)
			server_evict(s, "closed for a newer connection: too many handshakes");
		list_add_tail(&s->conns, &c->node);
		s->handshakes++;
		s->stats.connections++;
		c->deadline_ns = ukvm_now_ns() + s->handshake_ns;
		if (ukvm_conn_peer(s, c, &peer, peer_len))
			continue;	/* refused, and logged why */
		if (ukvm_auth_hello_make(&c->hello, s->key.len != 0) ||
		    ukvm_conn_send_record(c, &c->hello, sizeof(c->hello)))
			ukvm_conn_refuse(s, c, "the hello could not be sent");
	}
	return 0;
}

/*
 * Frees the connections closed during this turn of the loop; and, if any
 * was, polls the listening socket again after running out of fds. 0, or
 * -errno.
 */
static int server_reap(struct server *s)
{
	struct list *p, *n;
	bool freed = false;

	for (p = s->conns.next; p != &s->conns; p = n) {
		struct conn *c = list_entry(p, struct conn, node);

		n = p->next;
		if (c->dead) {
			list_del(&c->node);
			free(c);
			freed = true;
		}
	}
	return freed && s->listen_off ? server_listen_events(s, true) : 0;
}

static int server_arm(struct server *s, struct ukvm_error *err)
{
	uint64_t next = ukvm_model_next_ns(&s->model), hs = server_next_deadline(s);
	struct itimerspec its = { 0 };

	if (hs < next)
		next = hs;
	if (s->listen_off && s->listen_retry_ns < next)
		next = s->listen_retry_ns;
	if (next != UINT64_MAX) {
		/* 0 would disarm the timer: an event already due fires at 1 ns. */
		next = next ? next : 1;
		its.it_value.tv_sec = (time_t)(next / NSEC_PER_SEC);
		its.it_value.tv_nsec = (long)(next % NSEC_PER_SEC);
	}
	if (timerfd_settime(s->tfd, TFD_TIMER_ABSTIME, &its, NULL)) {
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: timerfd_settime");
	}
	return 0;
}

static int server_loop(struct server *s, struct ukvm_error *err)
{
	struct epoll_event evs[64];
	int i, n, ret;

	while (!s->stop) {
		server_expire(s, ukvm_now_ns());
		ret = server_reap(s);
		if (!ret && s->listen_off && ukvm_now_ns() >= s->listen_retry_ns)
			ret = server_listen_events(s, true);
		if (!ret)
			ret = ukvm_conn_deliver(s, ukvm_now_ns());
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
			return ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: epoll_wait");
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
					return ukvm_err_set(err, UKVM_ERR_RUN, errno,
							    "page server: read(timerfd)");
				}
			} else if (tag == &tag_listen) {
				ret = server_accept(s, err);
				if (ret)
					return ret;
			} else if (!c->dead && !c->ready) {
				ukvm_conn_handshake(s, c);
			} else if (!c->dead) {
				if (evs[i].events & EPOLLOUT)
					ukvm_conn_flush(s, c);
				if (!c->dead && evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
					ret = ukvm_conn_read(s, c);
					if (ret) {
						ukvm_err_set(err, UKVM_ERR_RUN, -ret,
							     "page server: reading a request");
						return ret;
					}
				}
			}
		}
		ret = server_reap(s);
		if (ret)
			return ukvm_err_set(err, UKVM_ERR_RUN, -ret,
					    "page server: epoll_ctl(MOD listening socket)");
	}
	return 0;
}

/* ---- setup and teardown ---- */

static int server_add(struct server *s, int fd, void *tag, const char *what,
		      struct ukvm_error *err)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = tag };

	if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev)) {
		if (errno == EPERM)
			return ukvm_err_set(err, UKVM_ERR_CONFIG, EPERM, "page server: the stop fd "
					    "(%s) cannot be polled; give the server a pipe or a "
					    "terminal as its stdin", what);
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: epoll_ctl(ADD %s)",
				    what);
	}
	return 0;
}

static int server_open_snapshot(struct server *s, struct ukvm_error *err)
{
	struct stat st;
	void *map;
	int fd = open(s->cfg->snapshot_path, O_RDONLY | O_CLOEXEC), ret = 0;

	if (fd < 0) {
		return ukvm_err_set(err, UKVM_ERR_CONFIG, errno, "page server: open(\"%s\")",
			     s->cfg->snapshot_path);
	}
	if (fstat(fd, &st)) {
		ret = ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: fstat(\"%s\")",
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
			ret = ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: mmap(\"%s\")",
				     s->cfg->snapshot_path);
			goto out;
		}
		s->map = map;
	}
out:
	close(fd);	/* the mapping keeps the file */
	return ret;
}

static bool server_is_loopback(const struct ukvm_remote_address *addr)
{
	const struct sockaddr_in *in4 = (const struct sockaddr_in *)&addr->sa;
	const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&addr->sa;

	if (addr->sa.ss_family == AF_INET)
		return (ntohl(in4->sin_addr.s_addr) >> 24) == 127;
	return addr->sa.ss_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
}

static int server_listen(struct server *s, struct ukvm_remote_address *addr, bool *bound,
			 struct ukvm_error *err)
{
	int one = 1, ret;

	ret = ukvm_remote_address_parse(s->cfg->listen, addr, err);
	if (ret)
		return ret;
	if (addr->sa.ss_family != AF_UNIX && !ukvm_remote_auth_available())
		return ukvm_err_set(err, UKVM_ERR_HOST, EOPNOTSUPP, "page server %s: this build "
				    "of uffdkvm has no libcrypto (OpenSSL), so it cannot check keys, "
				    "and a TCP server serves only clients that prove they hold one: "
				    "use a Unix socket, or install libssl-dev (apt-get install "
				    "libssl-dev) and build it again", s->cfg->listen);
	if (addr->sa.ss_family != AF_UNIX && !s->key.len)
		return ukvm_err_set(err, UKVM_ERR_CONFIG, EACCES, "key_file: page server %s: %s",
				    s->cfg->listen, server_is_loopback(addr) ?
				    "a TCP server needs a key (any local user can connect to a "
				    "TCP port): give a key file" :
				    "listens beyond loopback, so it needs a key file that every "
				    "client must hold: give one (and tunnel the link: it is not "
				    "encrypted)");
	s->lfd = socket(addr->sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s->lfd < 0) {
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: socket");
	}
	if (addr->sa.ss_family != AF_UNIX)
		setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(s->lfd, (struct sockaddr *)&addr->sa, addr->len)) {
		return ukvm_err_set(err, UKVM_ERR_CONFIG, errno, "page server: bind(%s)",
				    s->cfg->listen);
	}
	*bound = addr->sa.ss_family == AF_UNIX;
	if (listen(s->lfd, 128)) {
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: listen(%s)",
				    s->cfg->listen);
	}
	addr->len = sizeof(addr->sa);
	if (addr->sa.ss_family != AF_UNIX &&
	    getsockname(s->lfd, (struct sockaddr *)&addr->sa, &addr->len)) {
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: getsockname");
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
			return ukvm_err_set(err, UKVM_ERR_RUN, errno,
					    "page server: writing the ready line");
		}
		done += (size_t)n;
	}
	return 0;
}

static void server_free_all(struct server *s)
{
	struct list *p, *n;

	for (p = s->conns.next; p != &s->conns; p = n) {
		n = p->next;
		ukvm_conn_close(s, list_entry(p, struct conn, node));
	}
	(void)server_reap(s);	/* the listening socket is not polled again */
	ukvm_model_free_all(&s->model);	/* the conns are gone: nothing else holds a request */
}

int ukvm_pageserver_check(const struct ukvm_pageserver_config *cfg, struct ukvm_error *err)
{
	memset(err, 0, sizeof(*err));
	if (cfg->latency_ns > UKVM_MAX_REMOTE_LATENCY_US * 1000ULL)
		return ukvm_err_set(err, UKVM_ERR_CONFIG, 0,
				    "latency_us: at most %llu microseconds, not %llu",
				    (unsigned long long)UKVM_MAX_REMOTE_LATENCY_US,
				    (unsigned long long)(cfg->latency_ns / 1000));
	if (cfg->bandwidth_mbps > UKVM_MAX_REMOTE_BANDWIDTH_MBPS)
		return ukvm_err_set(err, UKVM_ERR_CONFIG, 0,
				    "bandwidth_mbps: at most %llu megabits per second (0: "
				    "unlimited), not %llu",
				    (unsigned long long)UKVM_MAX_REMOTE_BANDWIDTH_MBPS,
				    (unsigned long long)cfg->bandwidth_mbps);
	if (cfg->max_inflight > UKVM_MAX_INFLIGHT)
		return ukvm_err_set(err, UKVM_ERR_CONFIG, 0,
				    "max_inflight: at most %llu requests at once (0: no cap), not %llu",
				    (unsigned long long)UKVM_MAX_INFLIGHT,
				    (unsigned long long)cfg->max_inflight);
	return 0;
}

int ukvm_pageserver_serve(const struct ukvm_pageserver_config *cfg, int ready_fd, int stop_fd,
			  struct ukvm_remote_stats *stats, struct ukvm_error *err)
{
	struct server s = { .cfg = cfg, .epfd = -1, .lfd = -1, .tfd = -1, .sfd = -1 };
	struct ukvm_remote_address addr;
	sigset_t mask, old_mask;
	bool bound = false, masked = false;
	int old_slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
	int ret;

	ret = ukvm_pageserver_check(cfg, err);
	if (ret)
		return ret;
	list_init(&s.conns);
	s.handshake_ns = cfg->handshake_timeout_ns ? cfg->handshake_timeout_ns :
			 SERVER_HANDSHAKE_NS;
	if (cfg->key_file && !ukvm_remote_auth_available())
		return ukvm_err_set(err, UKVM_ERR_HOST, EOPNOTSUPP, "key_file: this build of "
				    "uffdkvm has no libcrypto (OpenSSL), so it cannot check keys; "
				    "install libssl-dev (apt-get install libssl-dev) and build it "
				    "again");
	if (cfg->key_file) {
		ret = ukvm_remote_key_load(cfg->key_file, "key_file", &s.key, err);
		if (ret)
			return ret;
	}
	ukvm_model_init(&s.model, cfg->latency_ns, cfg->bandwidth_mbps, cfg->max_inflight,
			&s.stats);
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
	/* Each checked at once: a later call would overwrite the failed one's errno. */
	s.sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	if (s.sfd < 0) {
		ret = ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: signalfd");
		goto out;
	}
	s.epfd = epoll_create1(EPOLL_CLOEXEC);
	if (s.epfd < 0) {
		ret = ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: epoll_create1");
		goto out;
	}
	s.tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (s.tfd < 0) {
		ret = ukvm_err_set(err, UKVM_ERR_RUN, errno, "page server: timerfd_create");
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
	explicit_bzero(&s.key, sizeof(s.key));
	if (old_slack > 0)
		prctl(PR_SET_TIMERSLACK, old_slack, 0, 0, 0);
	return ret;
}
