/* SPDX-License-Identifier: MIT */
/*
 * userfaultfd: opening one (the syscall, else /dev/userfaultfd), the API
 * handshake, registration, and the resolving ioctls with their recoverable
 * errors (EEXIST: resolved already; EAGAIN: the mm changed under us, retry).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

/* EAGAIN means "try again"; this many in a row means something is wrong. */
#define UFFD_MAX_RETRIES	100000

static int uffd_open_raw(int flags, struct ukvm_error *err)
{
	int fd, dev, sys_errno, dev_errno;

	fd = (int)syscall(__NR_userfaultfd, flags);
	if (fd >= 0)
		return fd;
	sys_errno = errno;
	if (sys_errno == ENOSYS) {
		ukvm_err_set_hint(err, UKVM_ERR_HOST, sys_errno, "userfaultfd()",
				  "This kernel was built without CONFIG_USERFAULTFD");
		return -sys_errno;
	}

	/* /dev/userfaultfd (Linux 6.1+) grants userfaultfd by file permission. */
	dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	if (dev >= 0) {
		fd = ioctl(dev, USERFAULTFD_IOC_NEW, flags);
		dev_errno = errno;
		close(dev);
		if (fd >= 0)
			return fd;
	} else {
		dev_errno = errno;
	}

	if (sys_errno == EPERM)
		ukvm_err_set_hint(err, UKVM_ERR_HOST, sys_errno, "userfaultfd()",
				  "userfaultfd is not permitted: the syscall needs "
				  "CAP_SYS_PTRACE or sysctl vm.unprivileged_userfaultfd=1 "
				  "(KVM's faults are kernel-mode faults), and opening "
				  "/dev/userfaultfd failed too (%s). Run as root, give this "
				  "user read/write access to /dev/userfaultfd, or set "
				  "vm.unprivileged_userfaultfd=1", strerror(dev_errno));
	else
		ukvm_err_set(err, UKVM_ERR_HOST, sys_errno, "userfaultfd()");
	return -sys_errno;
}

static int uffd_api(int fd, uint64_t features, struct uffdio_api *api)
{
	memset(api, 0, sizeof(*api));
	api->api = UFFD_API;
	api->features = features;
	return ukvm_ioctl(fd, UFFDIO_API, api);
}

int ukvm_uffd_features(uint64_t *features, struct ukvm_error *err)
{
	struct uffdio_api api;
	int fd, ret = 0;

	fd = uffd_open_raw(O_CLOEXEC | O_NONBLOCK, err);
	if (fd < 0)
		return fd;
	if (uffd_api(fd, 0, &api)) {
		ret = -errno;
		ukvm_err_set(err, UKVM_ERR_HOST, -ret, "UFFDIO_API");
	} else {
		*features = api.features;
	}
	close(fd);
	return ret;
}

int ukvm_uffd_open(bool nonblock, uint64_t features, struct ukvm_error *err)
{
	struct uffdio_api api;
	int fd, e;

	fd = uffd_open_raw(O_CLOEXEC | (nonblock ? O_NONBLOCK : 0), err);
	if (fd < 0)
		return fd;
	if (uffd_api(fd, features, &api)) {
		e = errno;
		close(fd);
		ukvm_err_set(err, UKVM_ERR_HOST, e, "UFFDIO_API(features 0x%llx)",
			     (unsigned long long)features);
		return -e;
	}
	return fd;
}

int ukvm_uffd_register(int uffd, void *addr, uint64_t len, enum ukvm_uffd_mode mode,
		       enum ukvm_backing backing, struct ukvm_error *err)
{
	struct uffdio_register reg = {
		.range = { .start = (uint64_t)(uintptr_t)addr, .len = len },
		.mode = mode == UKVM_UFFD_MINOR ? UFFDIO_REGISTER_MODE_MINOR
						: UFFDIO_REGISTER_MODE_MISSING,
	};
	uint64_t needed = mode == UKVM_UFFD_MINOR ? 1ULL << _UFFDIO_CONTINUE
						  : 1ULL << _UFFDIO_COPY;
	const char *name = mode == UKVM_UFFD_MINOR ? "MINOR" : "MISSING";

	if (ukvm_ioctl(uffd, UFFDIO_REGISTER, &reg)) {
		int e = errno;

		if (e == EINVAL && backing == UKVM_BACKING_GUEST_MEMFD)
			ukvm_err_set_hint(err, UKVM_ERR_HOST, e, "UFFDIO_REGISTER(guest_memfd)",
					  "This kernel's userfaultfd cannot register guest_memfd "
					  "memory (uffd_mode %s); run guest_memfd with "
					  "uffd_mode=None, or use a kernel with userfaultfd "
					  "support for guest_memfd", name);
		else if (e == EINVAL)
			ukvm_err_set_hint(err, UKVM_ERR_HOST, e, "UFFDIO_REGISTER",
					  "This kernel cannot register %s memory in mode %s",
					  ukvm_backing_name(backing), name);
		else
			ukvm_err_set(err, UKVM_ERR_RUN, e,
				     "UFFDIO_REGISTER(mode %s, %llu bytes at %p)", name,
				     (unsigned long long)len, addr);
		return -e;
	}
	if ((reg.ioctls & needed) != needed) {
		ukvm_err_set(err, UKVM_ERR_HOST, 0,
			     "UFFDIO_REGISTER(mode %s): the kernel does not offer %s for "
			     "this memory", name,
			     mode == UKVM_UFFD_MINOR ? "UFFDIO_CONTINUE" : "UFFDIO_COPY");
		return -EOPNOTSUPP;
	}
	return 0;
}

/*
 * One try of a resolving ioctl over [addr, addr + len): returns 0 or an
 * errno, and sets *done to the bytes it resolved before failing (the
 * kernel reports partial progress in the ioctl's last field).
 */
typedef int (*resolve_try)(int uffd, uint64_t addr, uint64_t len, const uint8_t *src,
			   int64_t *done);

static int try_copy(int uffd, uint64_t addr, uint64_t len, const uint8_t *src, int64_t *done)
{
	struct uffdio_copy copy = {
		.dst = addr, .src = (uint64_t)(uintptr_t)src, .len = len, .mode = 0,
	};
	int ret = ioctl(uffd, UFFDIO_COPY, &copy) ? errno : 0;

	*done = copy.copy;
	return ret;
}

static int try_zeropage(int uffd, uint64_t addr, uint64_t len, const uint8_t *src,
			int64_t *done)
{
	struct uffdio_zeropage zero = { .range = { .start = addr, .len = len }, .mode = 0 };
	int ret = ioctl(uffd, UFFDIO_ZEROPAGE, &zero) ? errno : 0;

	(void)src;
	*done = zero.zeropage;
	return ret;
}

static int try_continue(int uffd, uint64_t addr, uint64_t len, const uint8_t *src,
			int64_t *done)
{
	struct uffdio_continue cont = { .range = { .start = addr, .len = len }, .mode = 0 };
	int ret = ioctl(uffd, UFFDIO_CONTINUE, &cont) ? errno : 0;

	(void)src;
	*done = cont.mapped;
	return ret;
}

/*
 * 0 resolved here, 1 resolved already (EEXIST: another reader won), or
 * -errno. EAGAIN (the mm changed under the ioctl) and EINTR are retried
 * from where the kernel got to, as VMMs do; endless EAGAIN is an error.
 */
static int resolve(resolve_try attempt, int uffd, uint64_t addr, const uint8_t *src,
		   uint64_t len)
{
	int tries, e;

	for (tries = 0; tries < UFFD_MAX_RETRIES; tries++) {
		int64_t done = 0;

		e = attempt(uffd, addr, len, src, &done);
		if (!e)
			return 0;
		if (e == EEXIST)
			return 1;
		if (e != EAGAIN && e != EINTR)
			return -e;
		if (done > 0) {
			addr += (uint64_t)done;
			if (src)
				src += done;
			len -= (uint64_t)done;
			if (!len)
				return 0;
		}
	}
	return -EAGAIN;
}

int ukvm_uffd_copy(int uffd, uint64_t dst, const void *src, uint64_t len)
{
	return resolve(try_copy, uffd, dst, src, len);
}

int ukvm_uffd_zeropage(int uffd, uint64_t addr, uint64_t len)
{
	return resolve(try_zeropage, uffd, addr, NULL, len);
}

int ukvm_uffd_continue(int uffd, uint64_t addr, uint64_t len)
{
	return resolve(try_continue, uffd, addr, NULL, len);
}
