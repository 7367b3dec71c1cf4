/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: page server addresses (csrc/remote/address.c), the strings
 * a user gives as source_address, PageServer(listen=...) or
 * `uffdkvm serve --listen`. The input is the string (up to its first NUL,
 * as a C caller passes it).
 *
 * Checked beyond the sanitizers: a refusal is -EINVAL with a message; what
 * parses formats back (into UKVM_REMOTE_ADDRESS_MAX bytes, as the server's
 * "ready" line does), and that string parses again to the same socket
 * address and formats to the same string.
 *
 * Host names go to getaddrinfo(): the target runs in a network namespace of
 * its own (made at start, as root or through a user namespace), where no
 * name server can be reached and a lookup fails at once instead of waiting
 * on the network; /etc/hosts still answers.
 */
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remote/address.h"

#define REQUIRE(cond, ...)							\
	do {									\
		if (!(cond)) {							\
			fprintf(stderr, "address: %s: ", #cond);		\
			fprintf(stderr, __VA_ARGS__);				\
			fputc('\n', stderr);					\
			abort();						\
		}								\
	} while (0)

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	if (unshare(CLONE_NEWNET) && unshare(CLONE_NEWUSER | CLONE_NEWNET))
		fprintf(stderr, "address: no network namespace of its own (%s): names that "
			"/etc/hosts does not have are looked up in DNS\n", strerror(errno));
	return 0;
}

static int parse(const char *s, struct ukvm_remote_address *addr)
{
	struct ukvm_error err;
	int ret;

	memset(&err, 0, sizeof(err));
	ret = ukvm_remote_address_parse(s, addr, &err);
	REQUIRE(!ret || (ret == -EINVAL && err.message[0]), "\"%s\": %d, \"%s\"", s, ret,
		err.message);
	return ret;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1), once[UKVM_REMOTE_ADDRESS_MAX], twice[UKVM_REMOTE_ADDRESS_MAX];
	struct ukvm_remote_address a, b;
	int ret;

	memcpy(s, data, size);
	s[size] = '\0';
	if (parse(s, &a))
		goto out;
	ret = ukvm_remote_address_format(&a, once, sizeof(once));
	REQUIRE(!ret, "\"%s\" parses, but does not format: %d", s, ret);
	REQUIRE(!parse(once, &b), "\"%s\" formats as \"%s\", which does not parse", s, once);
	REQUIRE(a.len == b.len && !memcmp(&a.sa, &b.sa, a.len),
		"\"%s\" formats as \"%s\", which parses to another socket address", s, once);
	ret = ukvm_remote_address_format(&b, twice, sizeof(twice));
	REQUIRE(!ret && !strcmp(once, twice), "\"%s\" formats as \"%s\", then as \"%s\"", s,
		once, twice);
out:
	free(s);
	return 0;
}
