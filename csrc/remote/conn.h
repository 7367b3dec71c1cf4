/* SPDX-License-Identifier: MIT */
/*
 * A connection of the page server (conn.c): its handshake, its requests
 * and its replies. Each call that fails on the client's side closes the
 * connection (ukvm_conn_close) and the server goes on; -errno comes back
 * only where the server itself failed.
 */
#ifndef UKVM_REMOTE_CONN_H
#define UKVM_REMOTE_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "remote/server_state.h"

/* Out of the model and epoll, its fd closed, marked dead; freed by the loop (once). */
void ukvm_conn_close(struct server *s, struct conn *c);
/*
 * c's queued replies written until the socket is full; c closed if that
 * fails (a write the client refused, or an EPOLL_CTL_MOD). 0, or -errno (c
 * closed); the server goes on with its other connections either way.
 */
int ukvm_conn_flush(struct server *s, struct conn *c);
/*
 * Hands the model the clock: each reply whose link time ended goes to its
 * connection and is written. 0, or -ENOMEM.
 */
int ukvm_conn_deliver(struct server *s, uint64_t now);
/*
 * Reads c's requests, each into the model (or answered at once: STATS,
 * and refusals); at SERVER_PENDING_MAX unanswered, c is not read until it
 * drains. A client gone closes c. 0, or -errno: the server failed.
 */
int ukvm_conn_read(struct server *s, struct conn *c);
/* Closes c, counted and logged: a peer that did not prove it may connect. */
void ukvm_conn_refuse(struct server *s, struct conn *c, const char *why);
/* A handshake record written whole on a socket that has room (the first bytes each way). */
int ukvm_conn_send_record(struct conn *c, const void *rec, size_t len);
/* The auth record's bytes as they come; then checked, and c welcomed or refused. */
void ukvm_conn_handshake(struct server *s, struct conn *c);
/*
 * The new connection c's peer, named for the log; a Unix socket's checked
 * by uid (the server's own, or root). 0, or -errno with c refused and the
 * reason logged (-EACCES: another uid).
 */
int ukvm_conn_peer(struct server *s, struct conn *c, const struct sockaddr_storage *sa,
		   socklen_t len);

#endif
