/* SPDX-License-Identifier: MIT */
/*
 * The page server's keys and handshake (csrc/remote/auth.c, protocol.h):
 * key files (format, mode, owner), each handshake record made and checked
 * as bytes (the right key, a wrong one, none, truncated, a reply to another
 * connection's nonce, one side's mac sent back as the other's), and a
 * forked server (server.c) that refuses and counts a wrong key, no key, a
 * bad record and a silent client, whose deadline stalls nobody else. A
 * build without libcrypto (UFFDKVM_NO_LIBCRYPTO=1 make) refuses TCP and
 * keys instead. No KVM needed.
 */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#undef NSEC_PER_MSEC	/* base/util.h has its own, the same */
#undef NSEC_PER_SEC
#undef ARRAY_SIZE
#include "base/util.h"
#include "remote/address.h"
#include "remote/auth.h"
#include "remote/client.h"

static const char hex_a[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";
static const char hex_b[] = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100\n";
static char dir[64];
static char snap_path[128], key_a[128], key_b[128], key_loose[128];

static bool write_file(const char *path, const void *data, size_t len, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	bool ok = fd >= 0 && write(fd, data, len) == (ssize_t)len;

	if (fd >= 0)
		close(fd);
	return ok && chmod(path, mode) == 0;
}

static bool setup_files(void)
{
	static uint8_t snap[64 * 1024];

	ukt_temp_template(dir, sizeof(dir), "/tmp", "ukvm-auth");
	if (!mkdtemp(dir))
		return false;
	for (size_t i = 0; i < sizeof(snap); i++)
		snap[i] = (uint8_t)(i * 7 + 1);
	snprintf(snap_path, sizeof(snap_path), "%s/snap", dir);
	snprintf(key_a, sizeof(key_a), "%s/a.key", dir);
	snprintf(key_b, sizeof(key_b), "%s/b.key", dir);
	snprintf(key_loose, sizeof(key_loose), "%s/loose.key", dir);
	return write_file(snap_path, snap, sizeof(snap), 0600) &&
	       write_file(key_a, hex_a, strlen(hex_a), 0600) &&
	       write_file(key_b, hex_b, strlen(hex_b), 0600) &&
	       write_file(key_loose, hex_a, strlen(hex_a), 0644);
}

static struct ukvm_remote_key load(const char *path)
{
	struct ukvm_remote_key key;
	struct ukvm_error err;

	CHECK_EQ(ukvm_remote_key_load(path, "key_file", &key, &err), 0);
	return key;
}

/*
 * getsockopt(SO_PEERCRED) fails with ENOTCONN while this is set (in the
 * forked server: set before the fork); every other call is the real one.
 * The program's own definition comes before libc's (and the sanitizers').
 */
static volatile int fail_peercred;

int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	static int (*real)(int, int, int, void *, socklen_t *);

	if (fail_peercred && level == SOL_SOCKET && name == SO_PEERCRED) {
		errno = ENOTCONN;
		return -1;
	}
	if (!real)
		*(void **)&real = dlsym(RTLD_NEXT, "getsockopt");
	if (!real) {
		errno = ENOSYS;
		return -1;
	}
	return real(fd, level, name, val, len);
}

struct server {
	pid_t pid;
	int stop_w, err_r;	/* its stop fd's other end; its stderr */
	char address[256];
};

/* Forks a server on listen with key_file (or NULL); its "ready" line gives the address. */
static bool server_start(struct server *s, const char *listen, const char *key_file,
			 uint64_t handshake_ns)
{
	int ready[2], stop[2], errp[2];
	memset(s, 0, sizeof(*s));
	if (pipe2(ready, O_CLOEXEC) || pipe2(stop, O_CLOEXEC) || pipe2(errp, O_CLOEXEC))
		return false;
	fflush(stdout);
	fflush(stderr);
	s->pid = fork();
	if (s->pid == 0) {
		struct ukvm_pageserver_config cfg = {
			.snapshot_path = snap_path, .listen = listen, .key_file = key_file,
			.handshake_timeout_ns = handshake_ns,
		};
		struct ukvm_error err;
		int ret;

		dup2(errp[1], 2);
		close(ready[0]);
		close(stop[1]);
		ret = ukvm_pageserver_serve(&cfg, ready[1], stop[0], NULL, &err);
		if (ret)
			fprintf(stderr, "server: %s\n", err.message);
		exit(ret ? 3 : 0);	/* exit(): LeakSanitizer looks at the server too */
	}
	close(ready[1]);
	close(stop[0]);
	close(errp[1]);
	s->stop_w = stop[1];
	s->err_r = errp[0];
	return ukt_read_ready(ready[0], s->address, sizeof(s->address));
}

/* Stops the server; its status, and what it wrote on stderr into log. */
static int server_stop(struct server *s, char *log, size_t len)
{
	size_t got = 0;
	ssize_t n;
	int status;

	close(s->stop_w);
	waitpid(s->pid, &status, 0);
	while (got + 1 < len && (n = read(s->err_r, log + got, len - 1 - got)) > 0)
		got += (size_t)n;
	log[got] = '\0';
	close(s->err_r);
	return status;
}

/* A raw TCP connection to s (no handshake): the fd, or -1. */
static int raw_connect(const struct server *s)
{
	struct ukvm_remote_address addr;
	struct ukvm_error err;
	int fd;

	if (ukvm_remote_address_parse(s->address, &addr, &err))
		return -1;
	fd = socket(addr.sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&addr.sa, addr.len)) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* Everything fd gives until EOF or timeout_ms; bytes read, or -1 on timeout. */
static ssize_t read_until_eof(int fd, uint8_t *buf, size_t len, int timeout_ms)
{
	size_t got = 0;

	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t n;

		if (poll(&p, 1, timeout_ms) <= 0)
			return -1;
		n = read(fd, buf + got, len - got);
		if (n <= 0)
			return (ssize_t)got;
		got += (size_t)n;
		if (got == len)
			return (ssize_t)got;
	}
}

static uint64_t refused_now(const struct server *s, const struct ukvm_remote_key *key)
{
	struct ukvm_remote_stats st = { 0 };
	struct ukvm_remote_conn *c = NULL;
	struct ukvm_error err;

	if (!CHECK(ukvm_remote_connect(s->address, key, &c, &err) == 0, "%s", err.message))
		return UINT64_MAX;
	CHECK_EQ(ukvm_remote_stats_for(c, &st, 10 * NSEC_PER_SEC, &err), 0);
	ukvm_remote_close(c);
	return st.refused;
}

static void test_keys(void)
{
	struct ukvm_remote_key key;
	struct ukvm_error err;
	char path[160];
	int ret;

	UKT_CASE("key text: 64 to 128 hex digits, whitespace after them, nothing else") {
		char long_hex[140];

		CHECK_EQ(ukvm_auth_key_parse(hex_a, strlen(hex_a), &key), 0);
		CHECK_EQ(key.len, 32);
		CHECK_EQ(key.bytes[0], 0x00);
		CHECK_EQ(key.bytes[1], 0x11);
		CHECK_EQ(key.bytes[31], 0xff);
		CHECK_EQ(ukvm_auth_key_parse(hex_a, 63, &key), -EINVAL);	/* odd */
		CHECK_EQ(ukvm_auth_key_parse(hex_a, 62, &key), -EINVAL);	/* 31 bytes */
		CHECK_EQ(key.len, 0);
		CHECK_EQ(ukvm_auth_key_parse("secret-password-secret-password-secret-password-"
					     "secret-password!", 64, &key), -EINVAL);
		CHECK_EQ(ukvm_auth_key_parse(hex_a, 0, &key), -EINVAL);
		memset(long_hex, 'a', sizeof(long_hex));
		CHECK_EQ(ukvm_auth_key_parse(long_hex, 128, &key), 0);
		CHECK_EQ(key.len, 64);
		CHECK_EQ(ukvm_auth_key_parse(long_hex, 130, &key), -EINVAL);
		CHECK_EQ(ukvm_auth_key_parse("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff x",
					     66, &key), -EINVAL);
	}

	UKT_CASE("key file: 0600 of its owner loads; 0644, a directory, a missing file are refused") {
		key = load(key_a);
		CHECK_EQ(key.len, 32);
		ret = ukvm_remote_key_load(key_loose, "source_key_file", &key, &err);
		CHECK_EQ(ret, -EPERM);
		CHECK_EQ(err.kind, UKVM_ERR_CONFIG);
		CHECK(!strncmp(err.message, "source_key_file: ", 17), "%s", err.message);
		CHECK(strstr(err.message, "mode 0644") && strstr(err.message, "chmod 600"), "%s",
		      err.message);
		CHECK_EQ(key.len, 0);
		ret = ukvm_remote_key_load(dir, "key_file", &key, &err);
		CHECK_EQ(ret, -EINVAL);
		CHECK(strstr(err.message, "not a regular file") != NULL, "%s", err.message);
		snprintf(path, sizeof(path), "%s/missing.key", dir);
		ret = ukvm_remote_key_load(path, "key_file", &key, &err);
		CHECK_EQ(ret, -ENOENT);
		CHECK(strstr(err.message, "--new-key") != NULL, "%s", err.message);
		snprintf(path, sizeof(path), "%s/short.key", dir);
		CHECK(write_file(path, "abcd\n", 5, 0600));
		ret = ukvm_remote_key_load(path, "key_file", &key, &err);
		CHECK_EQ(ret, -EINVAL);
		CHECK(strstr(err.message, "hex digits") != NULL, "%s", err.message);
		unlink(path);
	}

	/* Only root can give a file away; without it the case is not one of this run's. */
	if (geteuid() == 0) UKT_CASE("key file of another user is refused (chown to 65534)") {
		snprintf(path, sizeof(path), "%s/theirs.key", dir);
		CHECK(write_file(path, hex_a, strlen(hex_a), 0600));
		CHECK_EQ(chown(path, 65534, 65534), 0);
		ret = ukvm_remote_key_load(path, "key_file", &key, &err);
		CHECK_EQ(ret, -EPERM);
		CHECK(strstr(err.message, "uid 65534") != NULL, "%s", err.message);
		unlink(path);
	}
}

static void test_records(void)
{
	struct ukvm_remote_key a, b;
	struct ukvm_remote_hello hello, hello2, got;
	struct ukvm_remote_auth auth, auth2;
	struct ukvm_remote_welcome welcome;
	uint8_t bytes[sizeof(auth)];

	a = load(key_a);
	b = load(key_b);

	UKT_CASE("hello: fresh nonces, checked for magic, version, flags and length") {
		CHECK_EQ(ukvm_auth_hello_make(&hello, true), 0);
		CHECK_EQ(ukvm_auth_hello_make(&hello2, true), 0);
		CHECK(memcmp(hello.nonce, hello2.nonce, sizeof(hello.nonce)), "the same nonce twice");
		CHECK_EQ(ukvm_auth_hello_check(&hello, sizeof(hello), &got), 0);
		CHECK_EQ(got.flags, UKVM_REMOTE_KEYED);
		CHECK_EQ(ukvm_auth_hello_check(&hello, sizeof(hello) - 1, &got), -EPROTO);
		got = hello;
		got.magic ^= 1;
		CHECK_EQ(ukvm_auth_hello_check(&got, sizeof(got), &got), -EPROTO);
		got = hello;
		got.version = 2;
		CHECK_EQ(ukvm_auth_hello_check(&got, sizeof(got), &got), -EPROTO);
		got = hello;
		got.flags = 0x80;
		CHECK_EQ(ukvm_auth_hello_check(&got, sizeof(got), &got), -EPROTO);
	}

	if (!ukvm_remote_auth_available()) {
		UKT_CASE("without libcrypto no mac is made: a keyed handshake cannot pass") {
			CHECK_EQ(ukvm_auth_hello_make(&hello, true), 0);
			CHECK_EQ(ukvm_auth_answer_make(&a, &hello, &auth), -EOPNOTSUPP);
			CHECK(ukvm_auth_answer_check(&a, &hello, &auth, sizeof(auth)) != 0);
		}
		return;
	}

	UKT_CASE("the same key both sides: the client's mac and the server's proof pass") {
		CHECK_EQ(ukvm_auth_hello_make(&hello, true), 0);
		CHECK_EQ(ukvm_auth_answer_make(&a, &hello, &auth), 0);
		CHECK_EQ(ukvm_auth_answer_check(&a, &hello, &auth, sizeof(auth)), 0);
		CHECK_EQ(ukvm_auth_welcome_make(&a, &hello, &auth, 0, &welcome), 0);
		CHECK_EQ(ukvm_auth_welcome_check(&a, &hello, &auth, &welcome, sizeof(welcome)), 0);
		/* No key bytes on the wire: neither record holds the key. */
		CHECK(!memmem(&auth, sizeof(auth), a.bytes, 8) &&
		      !memmem(&welcome, sizeof(welcome), a.bytes, 8), "the key went on the wire");
	}

	UKT_CASE("a wrong key, a flipped bit, a short record, another nonce: refused") {
		CHECK_EQ(ukvm_auth_hello_make(&hello, true), 0);
		CHECK_EQ(ukvm_auth_answer_make(&b, &hello, &auth), 0);
		CHECK_EQ(ukvm_auth_answer_check(&a, &hello, &auth, sizeof(auth)), -EACCES);
		CHECK_EQ(ukvm_auth_answer_make(&a, &hello, &auth), 0);
		for (size_t bit = 0; bit < 8 * sizeof(auth); bit += 13) {
			memcpy(bytes, &auth, sizeof(auth));
			bytes[bit / 8] ^= (uint8_t)(1u << (bit % 8));
			CHECK(ukvm_auth_answer_check(&a, &hello, bytes, sizeof(bytes)) != 0,
			      "bit %zu flipped passed", bit);
		}
		CHECK_EQ(ukvm_auth_answer_check(&a, &hello, &auth, sizeof(auth) - 1), -EPROTO);
		CHECK_EQ(ukvm_auth_answer_check(&a, &hello, &auth, 16), -EPROTO);
		/* Replayed: an answer recorded from one connection, on the next. */
		CHECK_EQ(ukvm_auth_hello_make(&hello2, true), 0);
		CHECK_EQ(ukvm_auth_answer_check(&a, &hello2, &auth, sizeof(auth)), -EACCES);
		/* A keyless answer (mac zero) to a keyed hello. */
		CHECK_EQ(ukvm_auth_answer_make(NULL, &hello, &auth2), -EACCES);
		memset(auth2.mac, 0, sizeof(auth2.mac));
		CHECK_EQ(ukvm_auth_answer_check(&a, &hello, &auth2, sizeof(auth2)), -EACCES);
	}

	UKT_CASE("the client refuses a server that cannot prove the key, or reflects its mac") {
		CHECK_EQ(ukvm_auth_hello_make(&hello, true), 0);
		CHECK_EQ(ukvm_auth_answer_make(&a, &hello, &auth), 0);
		CHECK_EQ(ukvm_auth_welcome_make(&b, &hello, &auth, 0, &welcome), 0);
		CHECK_EQ(ukvm_auth_welcome_check(&a, &hello, &auth, &welcome, sizeof(welcome)),
			 -EKEYREJECTED);
		memset(&welcome, 0, sizeof(welcome));
		welcome.magic = UKVM_REMOTE_MAGIC;
		memcpy(welcome.mac, auth.mac, sizeof(welcome.mac));	/* the client's own mac */
		CHECK_EQ(ukvm_auth_welcome_check(&a, &hello, &auth, &welcome, sizeof(welcome)),
			 -EKEYREJECTED);
		CHECK_EQ(ukvm_auth_welcome_make(&a, &hello, &auth, -EACCES, &welcome), 0);
		CHECK_EQ(ukvm_auth_welcome_check(&a, &hello, &auth, &welcome, sizeof(welcome)),
			 -EACCES);
		CHECK_EQ(ukvm_auth_welcome_check(&a, &hello, &auth, &welcome, 39), -EPROTO);
		/* A keyless server, to a client that holds a key. */
		CHECK_EQ(ukvm_auth_hello_make(&hello2, false), 0);
		CHECK_EQ(ukvm_auth_answer_make(&a, &hello2, &auth2), 0);
		CHECK_EQ(ukvm_auth_welcome_make(NULL, &hello2, &auth2, 0, &welcome), 0);
		CHECK_EQ(ukvm_auth_welcome_check(&a, &hello2, &auth2, &welcome, sizeof(welcome)),
			 -EKEYREJECTED);
		CHECK_EQ(ukvm_auth_welcome_check(NULL, &hello2, &auth2, &welcome, sizeof(welcome)),
			 0);
	}
}

static void test_server(void)
{
	struct ukvm_remote_key a, b;
	struct ukvm_remote_conn *c = NULL;
	struct ukvm_error err;
	struct server s;
	static uint8_t buf[8192];
	char log[8192];
	int ret;

	a = load(key_a);
	b = load(key_b);

	UKT_CASE("a TCP server without a key, or beyond loopback without one, is refused") {
		static const char *const listens[] = { "tcp:127.0.0.1:0", "tcp:0.0.0.0:0" };

		for (size_t i = 0; i < ARRAY_SIZE(listens); i++) {
			struct ukvm_pageserver_config cfg = {
				.snapshot_path = snap_path, .listen = listens[i],
			};

			ret = ukvm_pageserver_serve(&cfg, -1, -1, NULL, &err);
			CHECK(ret != 0, "%s served without a key", listens[i]);
			if (!ukvm_remote_auth_available()) {
				CHECK(strstr(err.message, "libcrypto") != NULL, "%s", err.message);
				continue;
			}
			CHECK_EQ(ret, -EACCES);
			CHECK(strstr(err.message, i ? "beyond loopback" : "needs a key") != NULL,
			      "%s", err.message);
		}
	}

	if (!ukvm_remote_auth_available()) {
		UKT_CASE("without libcrypto a key file is refused, naming libcrypto") {
			struct ukvm_pageserver_config cfg = {
				.snapshot_path = snap_path, .listen = "tcp:127.0.0.1:0",
				.key_file = key_a,
			};

			ret = ukvm_pageserver_serve(&cfg, -1, -1, NULL, &err);
			CHECK_EQ(ret, -EOPNOTSUPP);
			CHECK(strstr(err.message, "libcrypto") != NULL, "%s", err.message);
		}
		return;
	}

	UKT_CASE("tcp: the key's holder is served; no key, a wrong key, garbage are refused") {
		int fd;

		if (!server_start(&s, "tcp:127.0.0.1:0", key_a, 0))
			break;
		ret = ukvm_remote_connect(s.address, &a, &c, &err);
		CHECK(ret == 0, "%s", err.message);
		if (!ret) {
			CHECK_EQ(ukvm_remote_fetch_for(c, 0, 4096, true, buf, NSEC_PER_SEC * 10, &err),
				 0);
			CHECK_EQ(buf[1], 8);
			ukvm_remote_close(c);
		}
		ret = ukvm_remote_connect(s.address, &b, &c, &err);
		CHECK_EQ(ret, -EACCES);
		CHECK(strstr(err.message, s.address) && strstr(err.message, "refused the key"),
		      "%s", err.message);
		ret = ukvm_remote_connect(s.address, NULL, &c, &err);
		CHECK_EQ(ret, -EACCES);
		CHECK(strstr(err.message, s.address) && strstr(err.message, "requires a key"),
		      "%s", err.message);
		/* A client that skips the handshake: a request record, then 56 bytes more. */
		fd = raw_connect(&s);
		if (CHECK(fd >= 0)) {
			struct ukvm_remote_request req = { .offset = 0, .length = 4096,
							   .flags = UKVM_REMOTE_URGENT };
			uint8_t junk[56] = { 0 };
			ssize_t n;

			CHECK_EQ(write(fd, &req, sizeof(req)), sizeof(req));
			CHECK_EQ(write(fd, junk, sizeof(junk)), sizeof(junk));
			n = read_until_eof(fd, buf, sizeof(buf), 10000);
			/* The hello and a refusal, then the end: not one byte of the file. */
			CHECK_EQ(n, sizeof(struct ukvm_remote_hello) +
				 sizeof(struct ukvm_remote_welcome));
			CHECK_EQ(((struct ukvm_remote_welcome *)(buf + 40))->status, -EPROTO);
			close(fd);
		}
		CHECK_EQ(refused_now(&s, &a), 3);
		CHECK(WIFEXITED(server_stop(&s, log, sizeof(log))));
		CHECK(strstr(log, "refused tcp:127.0.0.1:") && strstr(log, "wrong key") &&
		      strstr(log, "not a uffdkvm handshake") && strstr(log, "closed without"),
		      "%s", log);
	}

	UKT_CASE("a silent client is closed at its deadline, and stalls nobody meanwhile") {
		uint64_t t0;
		ssize_t n;
		int fd;

		if (!server_start(&s, "tcp:127.0.0.1:0", key_a, 1500 * NSEC_PER_MSEC))
			break;
		fd = raw_connect(&s);
		t0 = ukvm_now_ns();
		/* Another client, while the silent one holds its connection. */
		ret = ukvm_remote_connect(s.address, &a, &c, &err);
		CHECK(ret == 0, "%s", err.message);
		if (!ret) {
			CHECK_EQ(ukvm_remote_fetch_for(c, 4096, 4096, true, buf, 10 * NSEC_PER_SEC,
						       &err), 0);
			ukvm_remote_close(c);
		}
		CHECK_LT(ukvm_now_ns() - t0, 1000 * NSEC_PER_MSEC);
		n = read_until_eof(fd, buf, sizeof(buf), 10000);
		CHECK_EQ(n, sizeof(struct ukvm_remote_hello));	/* the hello, then closed */
		CHECK_GE(ukvm_now_ns() - t0, 1400 * NSEC_PER_MSEC);
		CHECK_LT(ukvm_now_ns() - t0, 4000 * NSEC_PER_MSEC);
		close(fd);
		CHECK_EQ(refused_now(&s, &a), 1);
		CHECK(WIFEXITED(server_stop(&s, log, sizeof(log))));
		CHECK(strstr(log, "no handshake before its deadline") != NULL, "%s", log);
	}

	UKT_CASE("a Unix peer whose uid cannot be read is refused, logged with the reason") {
		char listen[160];
		ssize_t n;
		int fd;

		snprintf(listen, sizeof(listen), "unix:%s/peercred.sock", dir);
		fail_peercred = 1;
		ret = server_start(&s, listen, NULL, 0);
		fail_peercred = 0;
		if (!ret)
			break;
		fd = raw_connect(&s);
		CHECK(fd >= 0);
		n = fd >= 0 ? read_until_eof(fd, buf, sizeof(buf), 10000) : -1;
		CHECK_EQ(n, 0);		/* closed before the hello */
		if (fd >= 0)
			close(fd);
		CHECK(WIFEXITED(server_stop(&s, log, sizeof(log))));
		CHECK(strstr(log, "getsockopt(SO_PEERCRED)") != NULL, "%s", log);
		CHECK(strstr(log, "Transport endpoint is not connected") != NULL, "%s", log);
		CHECK(strstr(log, "neither this server's nor root's") == NULL, "%s", log);
	}

	UKT_CASE("a keyless Unix server: a client with a key refuses it") {
		char listen[160];

		snprintf(listen, sizeof(listen), "unix:%s/sock", dir);
		if (!server_start(&s, listen, NULL, 0))
			break;
		ret = ukvm_remote_connect(s.address, &a, &c, &err);
		CHECK_EQ(ret, -EKEYREJECTED);
		CHECK(strstr(err.message, "holds no key") != NULL, "%s", err.message);
		ret = ukvm_remote_connect(s.address, NULL, &c, &err);
		CHECK(ret == 0, "%s", err.message);
		if (!ret)
			ukvm_remote_close(c);
		CHECK(WIFEXITED(server_stop(&s, log, sizeof(log))));
	}
}

int main(void)
{
	char cmd[200];

	ukt_program = "auth";
	setvbuf(stderr, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	if (!setup_files()) {
		printf("auth: cannot write the files under %s\n", dir);
		return T_EXIT_FAIL;
	}
	printf("auth: built %s libcrypto\n", ukvm_remote_auth_available() ? "with" : "without");
	test_keys();
	test_records();
	test_server();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd))
		fprintf(stderr, "auth: could not remove %s\n", dir);
	printf("%s: %u cases, %u checks failed, %u skipped\n", ukt_program, ukt_cases,
	       ukt_failures, ukt_skips);
	return ukt_failures ? T_EXIT_FAIL : T_EXIT_PASS;
}
