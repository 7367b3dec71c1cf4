/* SPDX-License-Identifier: MIT */
/*
 * The page server's handshake (protocol.h: hello, auth, welcome) and its
 * keys: making each record, and checking one received, as pure functions of
 * the bytes and the key (the nonces come from getrandom, the macs from
 * libcrypto's HMAC-SHA256, compared with CRYPTO_memcmp), so that they can
 * be tested and fuzzed without sockets. libcrypto is loaded at run time
 * (dlopen of the soname the headers name). Built without its headers
 * (UKVM_HAVE_LIBCRYPTO undefined), or where the library does not load,
 * every call that needs a mac returns -EOPNOTSUPP: then only keyless Unix
 * sockets are served.
 *
 * Checks return 0, -EPROTO (not the record the handshake expects: its
 * length, magic, version or flags), -EACCES (the mac is not the key's, or
 * the server refused) or -EOPNOTSUPP.
 */
#ifndef UKVM_REMOTE_AUTH_H
#define UKVM_REMOTE_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "remote/protocol.h"
#include "ukvm.h"

/* The key's bytes from the text of a key file (hex digits, whitespace after them). */
int ukvm_auth_key_parse(const char *text, size_t len, struct ukvm_remote_key *key);

/* The server's hello, a fresh nonce in it; keyed: it holds a key. */
int ukvm_auth_hello_make(struct ukvm_remote_hello *hello, bool keyed);
/* The client: what it received as a hello, into *hello. */
int ukvm_auth_hello_check(const void *buf, size_t len, struct ukvm_remote_hello *hello);

/* The client's auth for hello (key NULL or empty: the hello must not be keyed). */
int ukvm_auth_answer_make(const struct ukvm_remote_key *key, const struct ukvm_remote_hello *hello,
			  struct ukvm_remote_auth *auth);
/* The server: a received auth against the hello it sent (key NULL: none held). */
int ukvm_auth_answer_check(const struct ukvm_remote_key *key,
			   const struct ukvm_remote_hello *hello, const void *buf, size_t len);

/* The server's welcome: status 0 with its mac, or a refusal (-EACCES, -EPROTO) without. */
int ukvm_auth_welcome_make(const struct ukvm_remote_key *key,
			   const struct ukvm_remote_hello *hello,
			   const struct ukvm_remote_auth *auth, int32_t status,
			   struct ukvm_remote_welcome *welcome);
/*
 * The client: a received welcome. 0; -EACCES when the server refused;
 * -EKEYREJECTED when it accepted but its mac is not the key's (it does not
 * hold the key); -EPROTO.
 */
int ukvm_auth_welcome_check(const struct ukvm_remote_key *key,
			    const struct ukvm_remote_hello *hello,
			    const struct ukvm_remote_auth *auth, const void *buf, size_t len);

#endif
