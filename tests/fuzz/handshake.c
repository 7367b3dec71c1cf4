/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the page server's handshake (protocol.h: hello, auth,
 * welcome) and key files, whose checks csrc/remote/auth.c makes pure
 * functions of the bytes and the key: what a client or server receives from
 * a peer that may be anyone.
 *
 * The input: byte 0 says which record the rest is (its value mod 6), as
 *	0	a key file's text (ukvm_auth_key_parse)
 *	1	a hello, as the client receives it
 *	2, 3	an auth, as a server with a key (2) or without (3) receives it
 *	4, 5	a welcome, as a client with a key (4) or without (5) receives it
 * The other side's records are fixed (a hello and an auth with set nonces,
 * and KEY), so that an input means the same on every run.
 *
 * Checked beyond the sanitizers: each check returns only what auth.h says;
 * a hello it takes holds exactly the bytes received; no auth or welcome is
 * taken against the key unless its mac is the key's (the one the matching
 * welcome_make computes from the same nonces; an auth taken is refused
 * with any bit of its mac changed); a key parses only from 64 to 128 hex digits.
 * With libcrypto missing (no <openssl/hmac.h> at build, or the library not
 * loading) the mac checks return -EOPNOTSUPP, which is checked as such.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remote/auth.h"

#define REQUIRE(cond, ...)							\
	do {									\
		if (!(cond)) {							\
			fprintf(stderr, "handshake: %s: ", #cond);		\
			fprintf(stderr, __VA_ARGS__);				\
			fputc('\n', stderr);					\
			abort();						\
		}								\
	} while (0)

static struct ukvm_remote_key KEY = { .len = 32 };
static struct ukvm_remote_hello hello_keyed, hello_keyless;
static struct ukvm_remote_auth auth_keyed, auth_keyless;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	for (uint32_t i = 0; i < KEY.len; i++)
		KEY.bytes[i] = (uint8_t)(i * 7 + 1);
	/* Fixed nonces: the records a server or client made, as _make makes them but for those. */
	hello_keyed = (struct ukvm_remote_hello){ .magic = UKVM_REMOTE_MAGIC,
						  .version = UKVM_REMOTE_VERSION,
						  .flags = UKVM_REMOTE_KEYED };
	memset(hello_keyed.nonce, 0xa5, sizeof(hello_keyed.nonce));
	hello_keyless = hello_keyed;
	hello_keyless.flags = 0;
	auth_keyed = (struct ukvm_remote_auth){ .magic = UKVM_REMOTE_MAGIC,
						.version = UKVM_REMOTE_VERSION };
	memset(auth_keyed.nonce, 0x3c, sizeof(auth_keyed.nonce));
	auth_keyless = auth_keyed;
	return 0;
}

static bool hex_key(const uint8_t *text, size_t len)
{
	size_t digits = 0;

	while (digits < len && strchr("0123456789abcdefABCDEF", text[digits]) && text[digits])
		digits++;
	return digits >= 2 * UKVM_REMOTE_KEY_MIN && digits <= 2 * UKVM_REMOTE_KEY_MAX &&
	       digits % 2 == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *buf = data + 1;
	size_t len = size ? size - 1 : 0;
	int kind, ret;

	if (!size)
		return 0;
	kind = data[0] % 6;
	if (kind == 0) {
		struct ukvm_remote_key key;

		ret = ukvm_auth_key_parse((const char *)buf, len, &key);
		REQUIRE(ret == 0 || ret == -EINVAL, "key_parse: %d", ret);
		if (!ret)
			REQUIRE(hex_key(buf, len) && key.len >= UKVM_REMOTE_KEY_MIN &&
				key.len <= UKVM_REMOTE_KEY_MAX, "a key of %u bytes from %zu of text",
				key.len, len);
	} else if (kind == 1) {
		struct ukvm_remote_hello hello;

		ret = ukvm_auth_hello_check(buf, len, &hello);
		REQUIRE(ret == 0 || ret == -EPROTO, "hello_check: %d", ret);
		if (!ret)
			REQUIRE(len == sizeof(hello) && !memcmp(&hello, buf, len) &&
				!(hello.flags & ~UKVM_REMOTE_KEYED), "a hello taken as another");
	} else if (kind == 2 || kind == 3) {
		const struct ukvm_remote_key *key = kind == 2 ? &KEY : NULL;
		const struct ukvm_remote_hello *hello = kind == 2 ? &hello_keyed : &hello_keyless;

		ret = ukvm_auth_answer_check(key, hello, buf, len);
		REQUIRE(ret == 0 || ret == -EPROTO || ret == -EACCES || ret == -EOPNOTSUPP,
			"answer_check: %d", ret);
		if (!ret)
			REQUIRE(len == sizeof(struct ukvm_remote_auth), "an auth of %zu bytes taken", len);
		if (!ret && key) {
			/* Taken against the key: with any bit of its mac changed, refused. */
			struct ukvm_remote_auth bent;

			memcpy(&bent, buf, sizeof(bent));
			bent.mac[data[0] % UKVM_REMOTE_MAC_LEN] ^= 1;
			REQUIRE(ukvm_auth_answer_check(key, hello, &bent, sizeof(bent)) == -EACCES,
				"an auth taken whatever its mac");
		}
	} else {
		const struct ukvm_remote_key *key = kind == 4 ? &KEY : NULL;
		const struct ukvm_remote_hello *hello = kind == 4 ? &hello_keyed : &hello_keyless;
		const struct ukvm_remote_auth *auth = kind == 4 ? &auth_keyed : &auth_keyless;
		struct ukvm_remote_welcome want;

		ret = ukvm_auth_welcome_check(key, hello, auth, buf, len);
		REQUIRE(ret == 0 || ret == -EPROTO || ret == -EACCES || ret == -EKEYREJECTED ||
			ret == -EOPNOTSUPP, "welcome_check: %d", ret);
		if (!ret) {
			REQUIRE(len == sizeof(want), "a welcome of %zu bytes taken", len);
			/* The one welcome the server with this key makes for these nonces. */
			REQUIRE(!ukvm_auth_welcome_make(key, hello, auth, 0, &want), "welcome_make");
			REQUIRE(!memcmp(&want, buf, sizeof(want)) || !key,
				"a welcome taken whose mac is not the key's");
		}
	}
	return 0;
}
