/* SPDX-License-Identifier: MIT */
/*
 * The page server's wire protocol, defined here and nowhere else: server.c
 * serves it, client.c speaks it, and Python speaks it through client.c
 * (uffdkvm/pages/server.py's PageClient calls _core's remote_* functions).
 *
 * A stream socket (Unix or TCP) carries fixed-size little-endian records;
 * both ends are x86-64, so the structs below go on the wire as they are.
 *
 * The handshake comes first on every connection, before any request is
 * read (auth.c makes and checks its records; no key ever goes on the wire):
 *
 * Hello, server to client at accept, 40 bytes:
 *	magic	u32	UKVM_REMOTE_MAGIC
 *	version	u16	UKVM_REMOTE_VERSION
 *	flags	u16	UKVM_REMOTE_KEYED: the server holds a key, and wants
 *			the client to prove it holds the same one
 *	nonce	32 bytes, random (getrandom)
 *
 * Auth, client to server, 72 bytes:
 *	magic, version, flags (0), as the hello's
 *	nonce	32 bytes, the client's own, random
 *	mac	HMAC-SHA256(key, UKVM_REMOTE_LABEL_CLIENT || server nonce ||
 *		client nonce); zero when the server holds no key
 *
 * Welcome, server to client, 40 bytes:
 *	magic	u32	UKVM_REMOTE_MAGIC
 *	status	i32	0, or -EACCES (a wrong mac) or -EPROTO (no auth record),
 *			after which the server closes the connection
 *	mac	HMAC-SHA256(key, UKVM_REMOTE_LABEL_SERVER || client nonce ||
 *		server nonce): the server's proof that it holds the key (a
 *		different label and order, so that neither side's mac can be
 *		sent back as the other's); zero without a key or on refusal
 *
 * The server closes a connection whose auth record is not whole within its
 * handshake timeout (5 s), and a Unix socket's peer whose uid is neither
 * the server's nor root before the hello. A client that holds a key refuses
 * a server whose hello is not keyed or whose welcome's mac is wrong.
 * The nonces of both sides make every handshake's macs new: one recorded
 * from an earlier connection proves nothing on the next.
 *
 * Request, client to server, 16 bytes:
 *	offset	u64	first byte of the snapshot wanted
 *	length	u32	bytes wanted, 1..UKVM_REMOTE_MAX_LENGTH (ukvm.h: 1 GiB)
 *	flags	u32	UKVM_REMOTE_URGENT: a fault waits for these bytes (served
 *			before every queued request without it: QEMU's post-copy
 *			sends faulted pages ahead of its background stream);
 *			without it the request is background (prefetch).
 *			UKVM_REMOTE_STATS: offset and length are ignored; the
 *			reply carries struct ukvm_remote_stats (below), at once (no
 *			latency, no link time, not counted as a request).
 *
 * Reply, server to client, 24 bytes, then `length` bytes of payload:
 *	offset	u64	the request's offset (0 for STATS)
 *	length	u32	payload bytes that follow: the request's length when
 *			status is 0, sizeof(struct ukvm_remote_stats) for
 *			STATS, 0 on error
 *	status	i32	0, or -errno: -EINVAL (length 0 or above the maximum,
 *			unknown flags), -ERANGE (the range ends past the
 *			snapshot's end); the client takes no other
 *	flags	u32	the request's flags
 *	reserved u32	0
 *
 * Order: the server schedules all its connections' requests together
 * (server.c: the model), so one connection's replies come in the order
 * they were served, not always the order asked: an URGENT request sent
 * after background ones on the same connection can overtake them. The
 * reply's offset and flags say which request it answers.
 */
#ifndef UKVM_REMOTE_PROTOCOL_H
#define UKVM_REMOTE_PROTOCOL_H

#include <stdint.h>

#include <stddef.h>

/* struct ukvm_remote_stats (a STATS reply's payload) and UKVM_REMOTE_MAX_LENGTH */
#include "ukvm.h"

#define UKVM_REMOTE_URGENT	(1u << 0)
#define UKVM_REMOTE_STATS	(1u << 1)
#define UKVM_REMOTE_FLAGS	(UKVM_REMOTE_URGENT | UKVM_REMOTE_STATS)

struct ukvm_remote_request {
	uint64_t offset;
	uint32_t length;
	uint32_t flags;
};

struct ukvm_remote_reply {
	uint64_t offset;
	uint32_t length;
	int32_t status;
	uint32_t flags;
	uint32_t reserved;
};

#define UKVM_REMOTE_MAGIC	0x53504b55u	/* "UKPS" */
#define UKVM_REMOTE_VERSION	1
#define UKVM_REMOTE_KEYED	(1u << 0)
#define UKVM_REMOTE_NONCE_LEN	32
#define UKVM_REMOTE_MAC_LEN	32	/* SHA-256 */
#define UKVM_REMOTE_LABEL_CLIENT	"uffdkvm page server v1: client"
#define UKVM_REMOTE_LABEL_SERVER	"uffdkvm page server v1: server"

struct ukvm_remote_hello {
	uint32_t magic;
	uint16_t version;
	uint16_t flags;
	uint8_t nonce[UKVM_REMOTE_NONCE_LEN];
};

struct ukvm_remote_auth {
	uint32_t magic;
	uint16_t version;
	uint16_t flags;
	uint8_t nonce[UKVM_REMOTE_NONCE_LEN];
	uint8_t mac[UKVM_REMOTE_MAC_LEN];
};

struct ukvm_remote_welcome {
	uint32_t magic;
	int32_t status;
	uint8_t mac[UKVM_REMOTE_MAC_LEN];
};

_Static_assert(sizeof(struct ukvm_remote_hello) == 40, "hello is 40 bytes on the wire");
_Static_assert(sizeof(struct ukvm_remote_auth) == 72, "auth is 72 bytes on the wire");
_Static_assert(sizeof(struct ukvm_remote_welcome) == 40, "welcome is 40 bytes on the wire");
_Static_assert(sizeof(struct ukvm_remote_request) == 16, "request is 16 bytes on the wire");
_Static_assert(sizeof(struct ukvm_remote_reply) == 24, "reply header is 24 bytes on the wire");
/*
 * A STATS reply's payload is struct ukvm_remote_stats as it is: one u64
 * per counter of ukvm.h's list (UKVM_REMOTE_STATS_FIELDS), in its order.
 * The index of each counter, and the checks that the struct is exactly that:
 */
enum ukvm_remote_stat {
#define UKVM_REMOTE_STAT_INDEX(name, meaning) UKVM_REMOTE_STAT_##name,
	UKVM_REMOTE_STATS_FIELDS(UKVM_REMOTE_STAT_INDEX)
#undef UKVM_REMOTE_STAT_INDEX
	UKVM_REMOTE_STATS_COUNT
};

#define UKVM_REMOTE_STAT_AT(name, meaning) \
	_Static_assert(offsetof(struct ukvm_remote_stats, name) == \
		       8 * UKVM_REMOTE_STAT_##name, "stats: " #name " at its place on the wire");
UKVM_REMOTE_STATS_FIELDS(UKVM_REMOTE_STAT_AT)
#undef UKVM_REMOTE_STAT_AT
_Static_assert(sizeof(struct ukvm_remote_stats) == 8 * UKVM_REMOTE_STATS_COUNT,
	       "stats are one u64 per counter on the wire");

#endif
