/* SPDX-License-Identifier: MIT */
/*
 * The page server's state, shared by the loop (server.c) and its
 * connections (conn.c), which both take it from here: the server, each
 * connection, and each reply being written.
 */
#ifndef UKVM_REMOTE_SERVER_STATE_H
#define UKVM_REMOTE_SERVER_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "remote/address.h"
#include "remote/auth.h"
#include "remote/list.h"
#include "remote/model.h"
#include "remote/protocol.h"
#include "ukvm.h"

/* Requests read per read(2) at most. */
#define SERVER_READ_BATCH	256

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
	struct list requests;		/* its requests still in the model (in_owner) */
	struct list outs;		/* replies being written, in order */
	bool ready;			/* the handshake passed: what it sends are requests */
	uint64_t deadline_ns;		/* for the handshake */
	struct ukvm_remote_hello hello;	/* the one sent it */
	size_t hs_got;
	uint8_t hs[sizeof(struct ukvm_remote_auth)];
	char peer[UKVM_REMOTE_ADDRESS_MAX + 48];	/* for the log */
	size_t in_got;
	uint8_t in[SERVER_READ_BATCH * sizeof(struct ukvm_remote_request)];
};

struct server {
	const struct ukvm_pageserver_config *cfg;
	int epfd, lfd, tfd, sfd, stop_fd;
	const uint8_t *map;
	uint64_t size;
	struct ukvm_model model;
	struct list conns;
	struct ukvm_remote_stats stats;
	struct ukvm_remote_key key;	/* len 0: none (a Unix socket's, peers checked by uid) */
	uint64_t handshake_ns;
	uint32_t handshakes;		/* conns neither dead nor ready */
	bool listen_off;		/* out of fds: the listening socket not polled */
	uint64_t listen_retry_ns;	/* when it is polled again, if no conn closes */
	bool stop;
};

#endif
