/* SPDX-License-Identifier: MIT */
/*
 * Writing a snapshot file: size bytes whose every 8-byte word is
 * ukvm_snapshot_word(seed, offset), written in chunks through one buffer.
 * A page installed at the wrong place, or from another source, then holds
 * words that differ from the file's at that offset.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/errors.h"
#include "uffd/snapshot.h"
#include "ukvm.h"

#define SNAPSHOT_CHUNK	(4ULL << 20)	/* bytes per write(2) */

uint64_t ukvm_snapshot_word(uint64_t seed, uint64_t off)
{
	/* splitmix64's finaliser over (seed, word index): cheap, and no two words alike. */
	uint64_t z = (off >> 3) * 0x9e3779b97f4a7c15ULL + (seed ^ 0x736e617073686f74ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Every byte of buf written at off: 0 or -errno. */
static int snapshot_write_all(int fd, const uint8_t *buf, uint64_t len)
{
	uint64_t done = 0;

	while (done < len) {
		ssize_t n = write(fd, buf + done, len - done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		done += (uint64_t)n;
	}
	return 0;
}

int ukvm_snapshot_write(const char *path, uint64_t size, uint64_t seed, struct ukvm_error *err)
{
	uint64_t *buf = NULL;
	uint64_t off = 0, i;
	int fd, ret = 0;

	memset(err, 0, sizeof(*err));
	if (!size || size % 8) {
		ukvm_err_set(err, UKVM_ERR_CONFIG, 0, "size: a snapshot is a whole number of "
			     "8-byte words, at least one; not %llu bytes", (unsigned long long)size);
		return -EINVAL;
	}
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		ret = -errno;
		ukvm_err_set(err, UKVM_ERR_HOST, -ret, "open(%s, O_CREAT)", path);
		return ret;
	}
	buf = malloc(SNAPSHOT_CHUNK);
	if (!buf) {
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating the snapshot's buffer");
		ret = -ENOMEM;
		goto out;
	}
	while (off < size) {
		uint64_t len = size - off < SNAPSHOT_CHUNK ? size - off : SNAPSHOT_CHUNK;

		for (i = 0; i < len / 8; i++)
			buf[i] = ukvm_snapshot_word(seed, off + i * 8);
		ret = snapshot_write_all(fd, (const uint8_t *)buf, len);
		if (ret) {
			ukvm_err_set(err, UKVM_ERR_HOST, -ret, "write(%s at %llu)", path,
				     (unsigned long long)off);
			goto out;
		}
		off += len;
	}
out:
	free(buf);
	if (close(fd) && !ret) {
		ret = -errno;
		ukvm_err_set(err, UKVM_ERR_HOST, -ret, "close(%s)", path);
	}
	return ret;
}
