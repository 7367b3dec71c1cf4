/* SPDX-License-Identifier: MIT */
/*
 * A page server's client (protocol.h): one connection, used by one thread
 * at a time. ukvm.h declares connect, close and outstanding, and the calls
 * with a timeout that the binding uses; these are the readers' calls, with
 * a deadline and the stop fd. Every wait is a poll() on the socket and the
 * caller's stop fd, bounded by the caller's deadline and retried on EINTR
 * (readers are kicked with a signal to stop; the stop fd says whether to).
 *
 * Returns of fetch, send, recv and stats:
 *	0		done
 *	-ECANCELED	stop_fd became readable: the run is stopping
 *	-ETIMEDOUT	deadline_ns (CLOCK_MONOTONIC) passed
 *	-ECONNRESET, -EPIPE
 *			the server went away ("page server closed the connection")
 *	-EPROTO		a reply that does not answer the request, or that no
 *			request could have (a bad status, length or flags)
 *	-EINVAL		a length of 0 or above UKVM_REMOTE_MAX_LENGTH
 *	-EBUSY		fetch or stats with pipelined replies still to take
 *	-ERANGE		(fetch) the server's answer: the range ends past the
 *			snapshot; the connection stays usable
 * After -ECANCELED, -ETIMEDOUT or -EPROTO a reply may be half read: the
 * connection is spent, and every later call returns -ENOTCONN (after a
 * server-gone error, that error again). Close it; connect again if needed.
 */
#ifndef UKVM_REMOTE_CLIENT_H
#define UKVM_REMOTE_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include "remote/protocol.h"
#include "ukvm.h"

/* How long connect() waits for the server to accept, at most. */
#define UKVM_REMOTE_CONNECT_TIMEOUT_NS	(10ULL * 1000 * 1000 * 1000)

/* len bytes of the snapshot from offset into dst: one request, its reply. */
int ukvm_remote_fetch(struct ukvm_remote_conn *c, uint64_t offset, uint64_t len, bool urgent,
		      void *dst, int stop_fd, uint64_t deadline_ns);

/*
 * Pipelined, for a prefetcher: send() several requests, then recv() their
 * replies. A reply comes whole into dst (dst_len at least the longest
 * length asked), its header into *reply; reply->status < 0 is the server's
 * refusal of that request (no payload). Replies come in the order served
 * (protocol.h), so match them by reply->offset.
 */
int ukvm_remote_send(struct ukvm_remote_conn *c, uint64_t offset, uint64_t len, bool urgent,
		     int stop_fd, uint64_t deadline_ns);
int ukvm_remote_recv(struct ukvm_remote_conn *c, struct ukvm_remote_reply *reply, void *dst,
		     uint64_t dst_len, int stop_fd, uint64_t deadline_ns);

/*
 * What a return of the calls above means, for an error message: "page
 * server closed the connection" for -ECONNRESET and -EPIPE, and so on.
 */
const char *ukvm_remote_strerror(int ret);

/* The server's counters (a STATS request). */
int ukvm_remote_stats(struct ukvm_remote_conn *c, struct ukvm_remote_stats *stats, int stop_fd,
		      uint64_t deadline_ns);

#endif
