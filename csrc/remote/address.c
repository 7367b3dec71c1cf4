/* SPDX-License-Identifier: MIT */
/* Page server addresses as strings (address.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "base/errors.h"
#include "remote/address.h"

static int address_unix(const char *address, const char *path,
			struct ukvm_remote_address *addr, struct ukvm_error *err)
{
	struct sockaddr_un *un = (struct sockaddr_un *)&addr->sa;
	size_t n = strlen(path);

	if (n == 0 || n >= sizeof(un->sun_path)) {
		ukvm_err_set(err, UKVM_ERR_CONFIG, 0,
			     "page server address \"%s\": the socket path must have 1 to %zu "
			     "bytes (a Unix socket's limit); use a shorter path", address,
			     sizeof(un->sun_path) - 1);
		return -EINVAL;
	}
	un->sun_family = AF_UNIX;
	memcpy(un->sun_path, path, n + 1);
	addr->len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
	return 0;
}

static int address_tcp(const char *address, const char *hostport,
		       struct ukvm_remote_address *addr, struct ukvm_error *err)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *found = NULL;
	char host[UKVM_REMOTE_ADDRESS_MAX];
	const char *port, *colon = strrchr(hostport, ':');
	size_t n;
	char *end;
	long p;
	int ret;

	if (!colon)
		goto bad;
	port = colon + 1;
	n = (size_t)(colon - hostport);
	if (n >= 2 && hostport[0] == '[' && hostport[n - 1] == ']') {
		hostport++;	/* [v6]:port */
		n -= 2;
	}
	if (n == 0 || n >= sizeof(host))
		goto bad;
	memcpy(host, hostport, n);
	host[n] = '\0';
	errno = 0;
	p = strtol(port, &end, 10);
	if (!*port || *end || errno || p < 0 || p > 65535)
		goto bad;
	ret = getaddrinfo(host, port, &hints, &found);
	if (ret || !found) {
		ukvm_err_set(err, UKVM_ERR_CONFIG, 0, "page server address \"%s\": "
			     "getaddrinfo(\"%s\"): %s", address, host,
			     ret ? gai_strerror(ret) : "no address");
		if (found)
			freeaddrinfo(found);
		return -EINVAL;
	}
	memcpy(&addr->sa, found->ai_addr, found->ai_addrlen);
	addr->len = found->ai_addrlen;
	freeaddrinfo(found);
	return 0;
bad:
	ukvm_err_set(err, UKVM_ERR_CONFIG, 0, "page server address \"%s\": expected "
		     "tcp:HOST:PORT (PORT 0..65535, an IPv6 HOST in brackets)", address);
	return -EINVAL;
}

int ukvm_remote_address_parse(const char *address, struct ukvm_remote_address *addr,
			      struct ukvm_error *err)
{
	memset(addr, 0, sizeof(*addr));
	if (!address)
		address = "";
	if (!strncmp(address, "unix:", 5))
		return address_unix(address, address + 5, addr, err);
	if (!strncmp(address, "tcp:", 4))
		return address_tcp(address, address + 4, addr, err);
	ukvm_err_set(err, UKVM_ERR_CONFIG, 0, "page server address \"%s\": expected "
		     "\"unix:/path\" or \"tcp:HOST:PORT\"", address);
	return -EINVAL;
}

int ukvm_remote_address_format(const struct ukvm_remote_address *addr, char *buf,
			       size_t size)
{
	const struct sockaddr_in *in4 = (const struct sockaddr_in *)&addr->sa;
	const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&addr->sa;
	const struct sockaddr_un *un = (const struct sockaddr_un *)&addr->sa;
	char host[INET6_ADDRSTRLEN];
	int n;

	switch (addr->sa.ss_family) {
	case AF_UNIX:
		n = snprintf(buf, size, "unix:%.*s", (int)sizeof(un->sun_path), un->sun_path);
		break;
	case AF_INET:
		inet_ntop(AF_INET, &in4->sin_addr, host, sizeof(host));
		n = snprintf(buf, size, "tcp:%s:%u", host, ntohs(in4->sin_port));
		break;
	case AF_INET6:
		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		/* A link-local address names its interface: by number, which parses anywhere. */
		if (in6->sin6_scope_id)
			n = snprintf(buf, size, "tcp:[%s%%%u]:%u", host, in6->sin6_scope_id,
				     ntohs(in6->sin6_port));
		else
			n = snprintf(buf, size, "tcp:[%s]:%u", host, ntohs(in6->sin6_port));
		break;
	default:
		return -EAFNOSUPPORT;
	}
	return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}
