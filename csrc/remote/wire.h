/* SPDX-License-Identifier: MIT */
/*
 * The records' checks (protocol.h), as pure functions: no socket, no
 * state, no allocation. conn.c checks each request it reads with them,
 * client.c each reply; tests/fuzz/ feeds them whatever a fuzzer makes.
 */
#ifndef UKVM_REMOTE_WIRE_H
#define UKVM_REMOTE_WIRE_H

#include <stdint.h>

#include "remote/protocol.h"

/* ukvm_wire_request_check()'s return for a STATS request. */
#define UKVM_WIRE_STATS	1

/*
 * A request off the wire against a snapshot of size bytes: 0 (a range to
 * serve: length 1..UKVM_REMOTE_MAX_LENGTH, offset + length within size,
 * without overflow), UKVM_WIRE_STATS (the STATS flag: offset and length
 * are ignored), or the status its reply carries: -EINVAL (unknown flags,
 * length 0 or above the maximum), -ERANGE (past the end).
 */
int ukvm_wire_request_check(const struct ukvm_remote_request *req, uint64_t size);

/*
 * What any reply must hold, whatever it answers: a status of 0, -EINVAL or
 * -ERANGE (protocol.h's refusals), a payload with status 0
 * (1..UKVM_REMOTE_MAX_LENGTH bytes: no request asks for 0) and none with a
 * refusal, known flags, reserved 0. 0 or -EPROTO.
 */
int ukvm_wire_reply_check(const struct ukvm_remote_reply *reply);

/*
 * A reply (already through ukvm_wire_reply_check) against the one request
 * it must answer: a range's reply carries its offset and flags and, with
 * status 0, its length; a STATS reply has status 0, the STATS flag and
 * sizeof(struct ukvm_remote_stats) bytes. 0 or -EPROTO.
 */
int ukvm_wire_reply_answers(const struct ukvm_remote_reply *reply,
			    const struct ukvm_remote_request *req);

/*
 * A reply (already through ukvm_wire_reply_check) to one of several
 * pipelined range requests, taken into a buffer of dst_len bytes: not a
 * STATS reply, its payload no longer than dst_len. 0 or -EPROTO.
 */
int ukvm_wire_reply_pipelined(const struct ukvm_remote_reply *reply, uint64_t dst_len);

#endif
