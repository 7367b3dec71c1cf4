/* SPDX-License-Identifier: MIT */
/*
 * The page server (csrc/remote/server.c) in a forked child and its client
 * (csrc/remote/client.c) here: the bytes of the file, pipelining, refusals,
 * stats, and every way a fetch ends early: the stop fd (-ECANCELED), a
 * kick (EINTR: the fetch carries on), the deadline (-ETIMEDOUT), the server
 * killed (-ECONNRESET), all within bounds; a source whose time limit is
 * huge waits for its replies (its deadlines saturate instead of wrapping
 * around into the past). The server stops on SIGTERM and
 * on its stop fd closing, unlinks its socket, and (in the ASan build, where
 * the child exits through exit()) leaks nothing. No KVM needed.
 */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#undef NSEC_PER_MSEC	/* base/util.h has its own, the same */
#undef NSEC_PER_SEC
#undef ARRAY_SIZE
#include "base/util.h"
#include "remote/client.h"
#include "uffd/source.h"

#define SNAP_BYTES	(4 * MiB)

static char snap_path[64];
static uint8_t *snap;
/* A TCP server's key (every TCP server needs one), in a 0600 file. */
static char key_path[64];
static struct ukvm_remote_key key;

static bool make_key(void)
{
	static const char hex[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";
	struct ukvm_error err;
	int fd;

	ukt_temp_template(key_path, sizeof(key_path), "/tmp", "ukvm-remote-key");
	fd = mkstemp(key_path);	/* 0600 */

	if (fd < 0 || write(fd, hex, strlen(hex)) != (ssize_t)strlen(hex)) {
		if (fd >= 0)
			close(fd);
		return false;
	}
	close(fd);
	return ukvm_remote_key_load(key_path, "key_file", &key, &err) == 0;
}

static const struct ukvm_remote_key *key_for(const char *address)
{
	return strncmp(address, "tcp:", 4) ? NULL : &key;
}

struct server {
	pid_t pid;
	int stop_w;		/* the server's stop fd is the other end */
	char address[256];
	char sock_path[108];	/* sun_path's size */
};

static bool make_snapshot(void)
{
	uint64_t state = 42;
	int fd;

	ukt_temp_template(snap_path, sizeof(snap_path), "/tmp", "ukvm-remote-snap");
	fd = mkstemp(snap_path);

	if (fd < 0)
		return false;
	snap = malloc(SNAP_BYTES);
	for (uint64_t i = 0; snap && i < SNAP_BYTES; i += 8) {
		uint64_t v = ukvm_splitmix64(&state);

		memcpy(snap + i, &v, 8);
	}
	if (!snap || write(fd, snap, SNAP_BYTES) != (ssize_t)SNAP_BYTES) {
		close(fd);
		return false;
	}
	close(fd);
	return true;
}

/* Forks a server; its "ready" line gives the address. */
static bool server_start(struct server *s, bool tcp, uint64_t latency_ns, uint64_t mbps,
			 uint32_t cap)
{
	static unsigned seq;
	int ready[2], stop[2];
	memset(s, 0, sizeof(*s));
	if (pipe2(ready, O_CLOEXEC) || pipe2(stop, O_CLOEXEC))
		return false;
	/* Beside the snapshot: the directory the runner gave, or /tmp. */
	snprintf(s->sock_path, sizeof(s->sock_path), "%.*s/ukvm-remote-%d-%u.sock",
		 (int)(strrchr(snap_path, '/') - snap_path), snap_path, getpid(), seq++);
	fflush(stdout);
	fflush(stderr);
	s->pid = fork();
	if (s->pid == 0) {
		struct ukvm_pageserver_config cfg = {
			.snapshot_path = snap_path, .latency_ns = latency_ns,
			.bandwidth_mbps = mbps, .max_inflight = cap,
			.key_file = tcp ? key_path : NULL,
		};
		struct ukvm_error err;
		char listen[96];
		int ret;

		close(ready[0]);
		close(stop[1]);
		snprintf(listen, sizeof(listen), tcp ? "tcp:127.0.0.1:0" : "unix:%s", s->sock_path);
		cfg.listen = listen;
		ret = ukvm_pageserver_serve(&cfg, ready[1], stop[0], NULL, &err);
		if (ret)
			fprintf(stderr, "server: %s\n", err.message);
		free(snap);
		exit(ret ? 3 : 0);	/* exit(): LeakSanitizer looks at the server too */
	}
	close(ready[1]);
	close(stop[0]);
	s->stop_w = stop[1];
	return ukt_read_ready(ready[0], s->address, sizeof(s->address));
}

/* Waits (bounded) for the server to exit; its status, or -1 if it had to be killed. */
static int server_reap(struct server *s)
{
	uint64_t deadline = ukt_now_ns() + 10 * NSEC_PER_SEC;
	int status;

	if (s->stop_w >= 0)
		close(s->stop_w);
	s->stop_w = -1;
	while (waitpid(s->pid, &status, WNOHANG) == 0) {
		if (ukt_now_ns() > deadline) {
			kill(s->pid, SIGKILL);
			waitpid(s->pid, &status, 0);
			return -1;
		}
		ukt_sleep_ms(5);
	}
	return status;
}

static void server_stop(struct server *s)
{
	kill(s->pid, SIGTERM);
	CHECK_EQ(server_reap(s), 0);
}

static struct ukvm_remote_conn *connect_to(const struct server *s)
{
	struct ukvm_remote_conn *c = NULL;
	struct ukvm_error err;
	int ret = ukvm_remote_connect(s->address, key_for(s->address), &c, &err);

	CHECK(ret == 0, "connect(%s): %s", s->address, err.message);
	return c;
}

static uint64_t soon(uint64_t ms)
{
	return ukvm_now_ns() + ms * NSEC_PER_MSEC;
}

/* ---- helper threads: a stop fd written, a kick, a kill, after a while ---- */

struct later {
	pthread_t thread;
	unsigned ms;
	int efd;		/* written, if >= 0 */
	pthread_t kick;		/* sent SIGUSR1, if kick_it */
	bool kick_it;
	pid_t kill_pid;		/* sent SIGKILL, if > 0 */
};

static void *later_main(void *arg)
{
	struct later *l = arg;
	uint64_t one = 1;

	ukt_sleep_ms(l->ms);
	if (l->efd >= 0 && write(l->efd, &one, sizeof(one)) != sizeof(one))
		return NULL;
	if (l->kick_it)
		pthread_kill(l->kick, SIGUSR1);
	if (l->kill_pid > 0)
		kill(l->kill_pid, SIGKILL);
	return NULL;
}

static void on_usr1(int sig)
{
	(void)sig;
}

int main(void)
{
	static uint8_t buf[2 * MiB + PAGE];
	struct sigaction sa = { .sa_handler = on_usr1 };	/* no SA_RESTART: EINTR */
	struct server s;
	struct ukvm_remote_conn *c;
	struct ukvm_error err;
	uint64_t t0;
	int ret;

	ukt_program = "remote";
	setvbuf(stderr, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	sigaction(SIGUSR1, &sa, NULL);
	if (!make_snapshot() || !make_key()) {
		printf("remote: cannot write %s and %s\n", snap_path, key_path);
		return T_EXIT_FAIL;
	}

	/* Without libcrypto a TCP server is refused (auth.c tests that): Unix only. */
	for (int tcp = 0; tcp < 1 + ukvm_remote_auth_available(); tcp++) {
		UKT_CASE("%s: fetch gives the file's bytes", tcp ? "tcp" : "unix") {
			static const uint64_t cases[][2] = {
				{ 0, PAGE }, { PAGE, PAGE }, { 123, PAGE }, { 0, 2 * MiB },
				{ 2 * MiB, 2 * MiB }, { SNAP_BYTES - PAGE, PAGE }, { SNAP_BYTES - 1, 1 },
			};

			if (!server_start(&s, tcp, 0, 0, 0))
				break;
			c = connect_to(&s);
			for (size_t i = 0; c && i < ARRAY_SIZE(cases); i++) {
				memset(buf, 0xee, cases[i][1]);
				ret = ukvm_remote_fetch(c, cases[i][0], cases[i][1], i & 1, buf, -1,
							soon(10000));
				CHECK_EQ(ret, 0);
				CHECK(!memcmp(buf, snap + cases[i][0], cases[i][1]),
				      "bytes at %llu differ", (unsigned long long)cases[i][0]);
			}
			ukvm_remote_close(c);
			server_stop(&s);
		}
	}

	UKT_CASE("pipelined: send several, take the replies, match by offset") {
		struct ukvm_remote_reply reply;
		bool seen[8] = { false };

		if (!server_start(&s, false, 1000000, 0, 2))
			break;
		c = connect_to(&s);
		for (int i = 0; c && i < 8; i++)
			CHECK_EQ(ukvm_remote_send(c, (uint64_t)i * 3 * PAGE, PAGE, i == 7, -1,
						  soon(10000)), 0);
		CHECK_EQ(c ? ukvm_remote_outstanding(c) : 0, 8u);
		CHECK_EQ(c ? ukvm_remote_fetch(c, 0, PAGE, false, buf, -1, soon(1000)) : 0, -EBUSY);
		for (int i = 0; c && i < 8; i++) {
			ret = ukvm_remote_recv(c, &reply, buf, sizeof(buf), -1, soon(10000));
			CHECK_EQ(ret, 0);
			CHECK_EQ(reply.status, 0);
			CHECK_EQ(reply.length, (uint32_t)PAGE);
			CHECK(reply.offset % (3 * PAGE) == 0 && reply.offset / (3 * PAGE) < 8,
			      "reply offset %llu", (unsigned long long)reply.offset);
			if (ret || reply.offset / (3 * PAGE) >= 8)
				continue;
			CHECK(!seen[reply.offset / (3 * PAGE)], "offset %llu twice",
			      (unsigned long long)reply.offset);
			seen[reply.offset / (3 * PAGE)] = true;
			CHECK(!memcmp(buf, snap + reply.offset, PAGE), "bytes at %llu differ",
			      (unsigned long long)reply.offset);
		}
		CHECK_EQ(c ? ukvm_remote_outstanding(c) : 1, 0u);
		CHECK_EQ(c ? ukvm_remote_recv(c, &reply, buf, sizeof(buf), -1, soon(100)) : 0,
			 -EINVAL);
		ukvm_remote_close(c);
		server_stop(&s);
	}

	UKT_CASE("refusals and stats") {
		struct ukvm_remote_stats st = { 0 };

		if (!server_start(&s, false, 0, 0, 0))
			break;
		c = connect_to(&s);
		if (c) {
			CHECK_EQ(ukvm_remote_fetch(c, SNAP_BYTES - 100, PAGE, true, buf, -1, soon(5000)),
				 -ERANGE);
			CHECK_EQ(ukvm_remote_fetch(c, 0, 0, true, buf, -1, soon(5000)), -EINVAL);
			CHECK_EQ(ukvm_remote_fetch(c, 0, (uint64_t)UKVM_REMOTE_MAX_LENGTH + 1, true,
						   buf, -1, soon(5000)), -EINVAL);
			CHECK_EQ(ukvm_remote_fetch(c, PAGE, PAGE, true, buf, -1, soon(5000)), 0);
			CHECK_EQ(ukvm_remote_fetch(c, 2 * PAGE, 2 * PAGE, false, buf, -1, soon(5000)), 0);
			CHECK_EQ(ukvm_remote_stats(c, &st, -1, soon(5000)), 0);
		}
		CHECK_EQ(st.requests, 2u);
		CHECK_EQ(st.urgent, 1u);
		CHECK_EQ(st.background, 1u);
		CHECK_EQ(st.bytes, 3 * PAGE);
		CHECK_EQ(st.errors, 1u);
		CHECK_EQ(st.connections, 1u);
		ukvm_remote_close(c);
		server_stop(&s);
	}

	UKT_CASE("the stop fd cancels a waiting fetch, and spends the connection") {
		struct later l = { .ms = 100, .efd = eventfd(0, EFD_CLOEXEC) };

		if (!server_start(&s, false, 5 * NSEC_PER_SEC, 0, 0))
			break;
		c = connect_to(&s);
		pthread_create(&l.thread, NULL, later_main, &l);
		t0 = ukt_now_ns();
		CHECK_EQ(c ? ukvm_remote_fetch(c, 0, PAGE, true, buf, l.efd, soon(20000)) : 0,
			 -ECANCELED);
		CHECK_LT(ukt_now_ns() - t0, 2 * NSEC_PER_SEC);
		pthread_join(l.thread, NULL);
		CHECK_EQ(c ? ukvm_remote_fetch(c, 0, PAGE, true, buf, -1, soon(100)) : 0,
			 -ENOTCONN);
		close(l.efd);
		ukvm_remote_close(c);
		server_stop(&s);
	}

	UKT_CASE("a kick (EINTR) does not end a fetch") {
		struct later l = { .ms = 50, .efd = -1, .kick = pthread_self(), .kick_it = true };

		if (!server_start(&s, false, 300 * NSEC_PER_MSEC, 0, 0))
			break;
		c = connect_to(&s);
		pthread_create(&l.thread, NULL, later_main, &l);
		t0 = ukt_now_ns();
		CHECK_EQ(c ? ukvm_remote_fetch(c, PAGE, PAGE, true, buf, -1, soon(20000)) : 0, 0);
		CHECK_GE(ukt_now_ns() - t0, 300 * NSEC_PER_MSEC);
		CHECK(!memcmp(buf, snap + PAGE, PAGE), "bytes differ");
		pthread_join(l.thread, NULL);
		ukvm_remote_close(c);
		server_stop(&s);
	}

	UKT_CASE("the deadline ends a fetch: -ETIMEDOUT") {
		if (!server_start(&s, false, 5 * NSEC_PER_SEC, 0, 0))
			break;
		c = connect_to(&s);
		t0 = ukt_now_ns();
		CHECK_EQ(c ? ukvm_remote_fetch(c, 0, PAGE, true, buf, -1, soon(100)) : 0,
			 -ETIMEDOUT);
		CHECK_GE(ukt_now_ns() - t0, 100 * NSEC_PER_MSEC);
		CHECK_LT(ukt_now_ns() - t0, 2 * NSEC_PER_SEC);
		ukvm_remote_close(c);
		server_stop(&s);
	}

	UKT_CASE("a source with a huge time limit waits for its replies, not times out at once") {
		struct ukvm_source_conn conn;
		struct ukvm_source src;
		struct ukvm_config cfg;
		uint64_t off = 0, len = 0;

		if (!server_start(&s, false, 200 * NSEC_PER_MSEC, 0, 0))
			break;
		ukvm_config_init(&cfg);
		cfg.source = UKVM_SOURCE_REMOTE;
		snprintf(cfg.source_path, sizeof(cfg.source_path), "%s", snap_path);
		snprintf(cfg.source_address, sizeof(cfg.source_address), "%s", s.address);
		/* now + this wraps around to the past: every wait would end at once. */
		cfg.timeout_ns = UINT64_MAX - NSEC_PER_SEC;
		ukvm_source_init(&src);
		ret = ukvm_source_open(&src, &cfg, SNAP_BYTES, &err);
		CHECK(ret == 0, "source_open: %s", err.message);
		ret = ret ?: ukvm_source_conn_open(&conn, &src, false, -1, &err);
		CHECK(ret == 0, "conn_open: %s", err.message);
		if (!ret) {
			t0 = ukt_now_ns();
			CHECK_EQ(ukvm_source_fetch(&conn, PAGE, PAGE, 0, buf, true), 0);
			CHECK_GE(ukt_now_ns() - t0, 200 * NSEC_PER_MSEC);
			CHECK(!memcmp(buf, snap + PAGE, PAGE), "bytes differ");
			ukvm_source_conn_close(&conn);
			/* A connection of its own: the pipelined calls' deadlines, alone. */
			ret = ukvm_source_conn_open(&conn, &src, false, -1, &err);
			CHECK(ret == 0, "conn_open: %s", err.message);
		}
		if (!ret) {
			CHECK_EQ(ukvm_source_send(&conn, 3 * PAGE, PAGE), 0);
			CHECK_EQ(ukvm_source_recv(&conn, &off, &len, buf, sizeof(buf)), 0);
			CHECK_EQ(off, 3 * PAGE);
			CHECK_EQ(len, PAGE);
			CHECK(!memcmp(buf, snap + 3 * PAGE, PAGE), "bytes differ");
			ukvm_source_conn_close(&conn);
		}
		ukvm_source_close(&src);
		server_stop(&s);
	}

	UKT_CASE("the server killed mid-fetch: -ECONNRESET at once, and after") {
		struct later l = { .ms = 100, .efd = -1 };

		if (!server_start(&s, false, 5 * NSEC_PER_SEC, 0, 0))
			break;
		c = connect_to(&s);
		l.kill_pid = s.pid;
		pthread_create(&l.thread, NULL, later_main, &l);
		t0 = ukt_now_ns();
		ret = c ? ukvm_remote_fetch(c, 0, PAGE, true, buf, -1, soon(20000)) : 0;
		CHECK(ret == -ECONNRESET || ret == -EPIPE, "fetch returned %d", ret);
		CHECK_LT(ukt_now_ns() - t0, 2 * NSEC_PER_SEC);
		pthread_join(l.thread, NULL);
		ret = c ? ukvm_remote_fetch(c, 0, PAGE, true, buf, -1, soon(1000)) : 0;
		CHECK(ret == -ECONNRESET || ret == -EPIPE, "the next fetch returned %d", ret);
		ukvm_remote_close(c);
		ret = server_reap(&s);
		CHECK(WIFSIGNALED(ret) && WTERMSIG(ret) == SIGKILL, "status %d", ret);
		unlink(s.sock_path);	/* killed: it could not */
	}

	UKT_CASE("the server stops when its stop fd closes, and unlinks its socket") {
		struct stat st;

		if (!server_start(&s, false, 0, 0, 0))
			break;
		CHECK_EQ(stat(s.sock_path, &st), 0);
		CHECK_EQ(server_reap(&s), 0);	/* closes stop_w: the parent "died" */
		CHECK(stat(s.sock_path, &st) && errno == ENOENT, "%s is still there", s.sock_path);
		ret = ukvm_remote_connect(s.address, NULL, &c, &err);
		CHECK(ret == -ENOENT || ret == -ECONNREFUSED, "connect after the stop: %d", ret);
		CHECK(ret && strstr(err.message, s.address), "%s", err.message);
	}

	UKT_CASE("bad addresses are refused, naming the address") {
		static const char *const bad[] = { "unix:", "tcp:127.0.0.1", "tcp:x:99999", "udp:1",
						   "tcp::80" };

		for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
			ret = ukvm_remote_connect(bad[i], NULL, &c, &err);
			CHECK_EQ(ret, -EINVAL);
			CHECK(strstr(err.message, bad[i]) != NULL, "%s", err.message);
		}
	}

	UKT_CASE("limits past the schema's are refused before anything opens, naming the field") {
		static const struct {
			struct ukvm_pageserver_config cfg;
			const char *field;
		} bad[] = {
			{ { .latency_ns = (UKVM_MAX_REMOTE_LATENCY_US + 1) * 1000ULL }, "latency_us: " },
			{ { .bandwidth_mbps = UKVM_MAX_REMOTE_BANDWIDTH_MBPS + 1 }, "bandwidth_mbps: " },
			{ { .max_inflight = UKVM_MAX_INFLIGHT + 1 }, "max_inflight: " },
		};
		struct ukvm_pageserver_config at = {
			.latency_ns = UKVM_MAX_REMOTE_LATENCY_US * 1000ULL,
			.bandwidth_mbps = UKVM_MAX_REMOTE_BANDWIDTH_MBPS,
			.max_inflight = UKVM_MAX_INFLIGHT,
		};

		CHECK_EQ(ukvm_pageserver_check(&at, &err), 0);
		for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
			struct ukvm_pageserver_config cfg = bad[i].cfg;

			cfg.snapshot_path = snap_path;
			cfg.listen = "unix:/nonexistent-dir/s";
			ret = ukvm_pageserver_serve(&cfg, -1, -1, NULL, &err);
			CHECK_EQ(ret, -EINVAL);
			CHECK_EQ(err.kind, UKVM_ERR_CONFIG);
			CHECK(!strncmp(err.message, bad[i].field, strlen(bad[i].field)), "%s",
			      err.message);
		}
	}

	unlink(snap_path);
	unlink(key_path);
	free(snap);
	printf("%s: %u cases, %u checks failed, %u skipped\n", ukt_program, ukt_cases,
	       ukt_failures, ukt_skips);
	return ukt_failures ? T_EXIT_FAIL : T_EXIT_PASS;
}
