/* SPDX-License-Identifier: MIT */
/*
 * Page server addresses as strings, both ways: "unix:/path/to/socket" and
 * "tcp:HOST:PORT" (HOST a name or a numeric address, IPv6 in brackets:
 * "tcp:[::1]:4000", a link-local one with its interface, "tcp:[fe80::1%2]:4000";
 * PORT 0 asks the kernel for a free one when binding).
 */
#ifndef UKVM_REMOTE_ADDRESS_H
#define UKVM_REMOTE_ADDRESS_H

#include <sys/socket.h>

#include "ukvm.h"

/* The longest address string format() writes, with its NUL. */
#define UKVM_REMOTE_ADDRESS_MAX	128

struct ukvm_remote_address {
	struct sockaddr_storage sa;
	socklen_t len;
};

/* address into addr; -EINVAL with err naming what is wrong in the string. */
int ukvm_remote_address_parse(const char *address, struct ukvm_remote_address *addr,
			      struct ukvm_error *err);
/* addr as a string parse() takes back, into buf (UKVM_REMOTE_ADDRESS_MAX). */
int ukvm_remote_address_format(const struct ukvm_remote_address *addr, char *buf,
			       size_t size);

#endif
