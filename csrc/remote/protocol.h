/* SPDX-License-Identifier: MIT */
/*
 * The page server's wire protocol (server.c serves it, client.c speaks it).
 *
 * A stream socket (Unix or TCP) carries fixed-size little-endian records;
 * both ends are x86-64, so the structs below go on the wire as they are.
 *
 * Request, client to server, 16 bytes:
 *	offset	u64	first byte of the snapshot wanted
 *	length	u32	bytes wanted, 1..UKVM_REMOTE_MAX_LENGTH
 *	flags	u32	UKVM_REMOTE_URGENT: a fault waits for these bytes (served
 *			before every queued request without it: QEMU's post-copy
 *			sends faulted pages ahead of its background stream);
 *			without it the request is background (prefetch).
 *			UKVM_REMOTE_STATS: offset and length are ignored; the
 *			reply carries struct ukvm_remote_stats, at once (no
 *			latency, no link time, not counted as a request).
 *
 * Reply, server to client, 24 bytes, then `length` bytes of payload:
 *	offset	u64	the request's offset (0 for STATS)
 *	length	u32	payload bytes that follow: the request's length when
 *			status is 0, sizeof(struct ukvm_remote_stats) for
 *			STATS, 0 on error
 *	status	i32	0, or -errno: -EINVAL (length 0 or above the maximum,
 *			unknown flags), -ERANGE (the range ends past the
 *			snapshot's end)
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

#include "ukvm.h"	/* struct ukvm_remote_stats, a STATS reply's payload */

#define UKVM_REMOTE_URGENT	(1u << 0)
#define UKVM_REMOTE_STATS	(1u << 1)
#define UKVM_REMOTE_FLAGS	(UKVM_REMOTE_URGENT | UKVM_REMOTE_STATS)

/* 1 GiB: the largest page a guest can have, in one reply. */
#define UKVM_REMOTE_MAX_LENGTH	(1u << 30)

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

_Static_assert(sizeof(struct ukvm_remote_request) == 16, "request is 16 bytes on the wire");
_Static_assert(sizeof(struct ukvm_remote_reply) == 24, "reply header is 24 bytes on the wire");
_Static_assert(sizeof(struct ukvm_remote_stats) == 11 * 8, "stats are 11 u64 on the wire");

#endif
