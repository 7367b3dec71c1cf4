/* SPDX-License-Identifier: MIT */
/* The records' checks (wire.h). */
#include <errno.h>

#include "remote/wire.h"

int ukvm_wire_request_check(const struct ukvm_remote_request *req, uint64_t size)
{
	if (req->flags & UKVM_REMOTE_STATS)
		return UKVM_WIRE_STATS;
	if (req->flags & ~UKVM_REMOTE_FLAGS || !req->length || req->length > UKVM_REMOTE_MAX_LENGTH)
		return -EINVAL;
	/* Written so that offset + length cannot wrap around. */
	if (req->offset > size || req->length > size - req->offset)
		return -ERANGE;
	return 0;
}

int ukvm_wire_reply_check(const struct ukvm_remote_reply *reply)
{
	/*
	 * Only the refusals protocol.h defines: a fetch returns the status as
	 * its own, and another -errno would mean something else to its caller
	 * (-ECANCELED: the run is stopping, and the fault is left unresolved).
	 */
	if ((reply->status && reply->status != -EINVAL && reply->status != -ERANGE) ||
	    reply->length > UKVM_REMOTE_MAX_LENGTH || reply->flags & ~UKVM_REMOTE_FLAGS ||
	    reply->reserved)
		return -EPROTO;
	/* A refusal has no payload; an answer has at least the one byte asked for. */
	if (reply->status ? reply->length != 0 : reply->length == 0)
		return -EPROTO;
	return 0;
}

int ukvm_wire_reply_answers(const struct ukvm_remote_reply *reply,
			    const struct ukvm_remote_request *req)
{
	if (reply->flags != req->flags)
		return -EPROTO;
	if (req->flags & UKVM_REMOTE_STATS)
		return reply->status || reply->length != sizeof(struct ukvm_remote_stats) ?
		       -EPROTO : 0;
	if (reply->offset != req->offset || (!reply->status && reply->length != req->length))
		return -EPROTO;
	return 0;
}

int ukvm_wire_reply_pipelined(const struct ukvm_remote_reply *reply, uint64_t dst_len)
{
	if (reply->flags & UKVM_REMOTE_STATS || reply->length > dst_len)
		return -EPROTO;
	return 0;
}
