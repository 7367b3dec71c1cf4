/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the page server client's reply parser (csrc/remote/client.c,
 * its checks csrc/remote/wire.c), over a real Unix socket, as a reader or
 * PageClient meets a server that answers garbage.
 *
 * The connection starts with the handshake (protocol.h), made right by the
 * server's side here (a thread: the client waits for its hello in connect)
 * without a key, as a Unix socket's server may run; the handshake's own
 * records are for a target of their own. Then the input is a script of
 * calls, and the server's side of the stream after its welcome:
 *	byte 0		bits 0-3: the number of calls less one (1..16);
 *			bit 4: the server closes its end (send then fails with
 *			EPIPE) instead of only shutting its writing side
 *	1 byte a call	bits 0-1: fetch, send, recv or stats; bit 2: urgent;
 *			bits 3-5: the offset, OFFSETS[]; bits 6-7: the length,
 *			LENGTHS[] (0 is refused before anything is sent)
 *	the rest	what the server sends (at most STREAM_MAX bytes), all of
 *			it written before the first call
 * So no call waits: the bytes are there, or the server is gone. The calls
 * share one connection, so what one leaves (requests outstanding, a reply
 * half read, the connection spent) is what the next one meets.
 *
 * Beyond the sanitizers (every buffer is exactly as long as the call is
 * told), each call must return what client.h says it may, a spent
 * connection must stay spent (-ENOTCONN after -EPROTO, the same error after
 * the server went away), the outstanding count must be the requests sent
 * less the replies taken, and a reply recv hands back must be one that
 * protocol.h allows.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/util.h"
#include "remote/auth.h"
#include "remote/client.h"

#define STREAM_MAX	(64 * 1024)	/* under a Unix socket's buffer: the write never blocks */
#define DST_LEN		4096		/* recv's buffer: the longest length of LENGTHS[] */

static const uint64_t OFFSETS[8] = {
	0, 4096, 8192, 1ULL << 21, 1ULL << 30, 12345, 1ULL << 40, UINT64_MAX - 4095,
};
static const uint64_t LENGTHS[4] = { 4096, 1, 100, 0 };

static int listen_fd = -1;
static struct sockaddr_un listen_at = { .sun_family = AF_UNIX };
static char address[sizeof(listen_at.sun_path) + 8], listen_dir[sizeof(listen_at.sun_path)];

#define REQUIRE(cond, ...)							\
	do {									\
		if (!(cond)) {							\
			fprintf(stderr, "client_reply: %s: ", #cond);		\
			fprintf(stderr, __VA_ARGS__);				\
			fputc('\n', stderr);					\
			abort();						\
		}								\
	} while (0)

static void remove_socket(void)
{
	unlink(listen_at.sun_path);
	rmdir(listen_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *tmp = getenv("TMPDIR");

	snprintf(listen_dir, sizeof(listen_dir), "%s/ukvm-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(listen_dir)) {
		perror("client_reply: mkdtemp");
		exit(1);
	}
	snprintf(listen_at.sun_path, sizeof(listen_at.sun_path), "%s/s", listen_dir);
	snprintf(address, sizeof(address), "unix:%s", listen_at.sun_path);
	listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&listen_at, sizeof(listen_at)) ||
	    listen(listen_fd, 4)) {
		perror("client_reply: the server's socket");
		exit(1);
	}
	atexit(remove_socket);
	return 0;
}

/* The server's side of one connection: the handshake, then the stream. */
struct server_side {
	const uint8_t *stream;
	size_t len;
	bool close_all;
	int fd;
};

static void write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		REQUIRE(n > 0, "write: %s", strerror(errno));
		p += n;
		len -= (size_t)n;
	}
}

static void *serve(void *arg)
{
	struct server_side *s = arg;
	struct ukvm_remote_hello hello;
	struct ukvm_remote_auth auth;
	struct ukvm_remote_welcome welcome;
	size_t got = 0;

	s->fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
	REQUIRE(s->fd >= 0, "accept4: %s", strerror(errno));
	REQUIRE(!ukvm_auth_hello_make(&hello, false), "hello");
	write_all(s->fd, &hello, sizeof(hello));
	while (got < sizeof(auth)) {
		ssize_t n = read(s->fd, (uint8_t *)&auth + got, sizeof(auth) - got);

		REQUIRE(n > 0, "reading the client's auth: %zd, %s", n, strerror(errno));
		got += (size_t)n;
	}
	REQUIRE(!ukvm_auth_answer_check(NULL, &hello, &auth, sizeof(auth)), "the client's auth");
	REQUIRE(!ukvm_auth_welcome_make(NULL, &hello, &auth, 0, &welcome), "welcome");
	write_all(s->fd, &welcome, sizeof(welcome));
	write_all(s->fd, s->stream, s->len);
	if (s->close_all) {
		close(s->fd);
		s->fd = -1;
	} else {
		shutdown(s->fd, SHUT_WR);
	}
	return NULL;
}

/*
 * Connects through ukvm_remote_connect() (as the readers do) to the
 * listening socket, whose side writes the handshake and the stream.
 */
static struct ukvm_remote_conn *connect_with(const uint8_t *stream, size_t len, bool close_all,
					     int *server_fd)
{
	struct server_side side = { .stream = stream, .len = len, .close_all = close_all };
	struct ukvm_remote_conn *c = NULL;
	struct ukvm_error err;
	pthread_t thread;
	int ret;

	REQUIRE(!pthread_create(&thread, NULL, serve, &side), "pthread_create");
	ret = ukvm_remote_connect(address, NULL, &c, &err);
	pthread_join(thread, NULL);
	REQUIRE(!ret, "connect: %s", err.message);
	*server_fd = side.fd;
	return c;
}

static bool one_of(int ret, const int *allowed, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (ret == allowed[i])
			return true;
	return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint32_t outstanding = 0;
	int spent = 0, server_fd, ncalls;
	struct ukvm_remote_conn *c;
	const uint8_t *script;
	uint64_t deadline;

	if (size < 1)
		return 0;
	ncalls = (data[0] & 15) + 1;
	if (size < 1 + (size_t)ncalls)
		return 0;
	script = data + 1;
	size -= 1 + (size_t)ncalls;
	c = connect_with(data + 1 + ncalls, size < STREAM_MAX ? size : STREAM_MAX, data[0] & 16,
			 &server_fd);
	/* Never reached: every byte is there or the server is gone. A hang is a finding. */
	deadline = ukvm_deadline_after(10 * NSEC_PER_SEC);

	for (int i = 0; i < ncalls; i++) {
		int call = script[i] & 3, ret;
		bool urgent = script[i] & 4;
		uint64_t offset = OFFSETS[(script[i] >> 3) & 7], len = LENGTHS[script[i] >> 6];

		if (call == 0) {	/* fetch */
			static const int ok[] = { 0, -EPROTO, -ECONNRESET, -EPIPE, -EINVAL, -EBUSY,
						  -ERANGE, -ENOTCONN };
			uint8_t *dst = malloc(len ? len : 1);

			ret = ukvm_remote_fetch(c, offset, len, urgent, dst, -1, deadline);
			free(dst);
			REQUIRE(one_of(ret, ok, ARRAY_SIZE(ok)), "fetch returned %d", ret);
			if (!spent && outstanding)
				REQUIRE(ret == -EBUSY, "fetch with %u outstanding: %d", outstanding,
					ret);
		} else if (call == 1) {	/* send */
			static const int ok[] = { 0, -EINVAL, -ECONNRESET, -EPIPE, -ENOTCONN };

			ret = ukvm_remote_send(c, offset, len, urgent, -1, deadline);
			REQUIRE(one_of(ret, ok, ARRAY_SIZE(ok)), "send returned %d", ret);
			if (!ret)
				outstanding++;
		} else if (call == 2) {	/* recv */
			static const int ok[] = { 0, -EINVAL, -EPROTO, -ECONNRESET, -EPIPE,
						  -ENOTCONN };
			struct ukvm_remote_reply reply;
			uint8_t *dst = malloc(DST_LEN);

			ret = ukvm_remote_recv(c, &reply, dst, DST_LEN, -1, deadline);
			free(dst);
			REQUIRE(one_of(ret, ok, ARRAY_SIZE(ok)), "recv returned %d", ret);
			if (!spent && !outstanding)
				REQUIRE(ret == -EINVAL, "recv with nothing outstanding: %d", ret);
			if (!ret) {
				outstanding--;
				/*
				 * protocol.h: a refusal is -EINVAL or -ERANGE, without a
				 * payload; an answer carries the bytes asked for, at least
				 * one. Which request it answers is the caller's to match.
				 */
				REQUIRE(reply.status == 0 || reply.status == -EINVAL ||
					reply.status == -ERANGE, "recv: a status the protocol "
					"has not: %d", reply.status);
				REQUIRE(reply.status ? !reply.length :
					reply.length >= 1 && reply.length <= DST_LEN,
					"recv: status %d with %u bytes", reply.status, reply.length);
				REQUIRE(!(reply.flags & ~UKVM_REMOTE_URGENT), "recv: flags 0x%x",
					reply.flags);
			}
		} else {		/* stats */
			static const int ok[] = { 0, -EPROTO, -ECONNRESET, -EPIPE, -EBUSY,
						  -ENOTCONN };
			struct ukvm_remote_stats stats;

			ret = ukvm_remote_stats(c, &stats, -1, deadline);
			REQUIRE(one_of(ret, ok, ARRAY_SIZE(ok)), "stats returned %d", ret);
			if (!spent && outstanding)
				REQUIRE(ret == -EBUSY, "stats with %u outstanding: %d", outstanding,
					ret);
		}
		if (spent)
			REQUIRE(ret == spent, "call %d on a spent connection: %d, not %d", call,
				ret, spent);
		else if (ret == -EPROTO)
			spent = -ENOTCONN;
		else if (ret == -ECONNRESET || ret == -EPIPE)
			spent = ret;
		if (!spent)
			REQUIRE(ukvm_remote_outstanding(c) == outstanding,
				"outstanding %u, but %u requests sent and not answered",
				ukvm_remote_outstanding(c), outstanding);
	}
	ukvm_remote_close(c);
	if (server_fd >= 0)
		close(server_fd);
	return 0;
}
