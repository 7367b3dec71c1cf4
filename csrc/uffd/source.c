/* SPDX-License-Identifier: MIT */
/*
 * Where a resolved page's bytes come from.
 *
 *   synthetic  the fill of fill.h, stamped with the page's address: the
 *              buffer holds the template already (ukvm_source_prepare), so
 *              a fetch writes two words per 4 KiB.
 *   file       a snapshot file mapped onto the region byte for byte (region
 *              offset o is file offset o), read with pread(2) or copied out
 *              of a read-only MAP_SHARED mapping (under base/mapguard.h's
 *              SIGBUS guard: a page gone with a truncation is -EIO, as
 *              for pread). Its page cache is put in
 *              the state asked for before the vCPUs start: cold (written
 *              back with fdatasync, then dropped with POSIX_FADV_DONTNEED),
 *              or warm (read through once); mincore() on the mapping then
 *              counts what is cached, so a cold run can prove it was cold.
 *   remote     a page server process (remote/, uffdkvm/pages/server.py) that
 *              serves such a file over a socket, with its own latency and
 *              bandwidth model: each installing thread has a connection
 *              of its own, and a fault's request is marked urgent. The
 *              file itself is mapped here too, read-only and never
 *              fetched from: verification compares every page with it.
 *
 * A fetch touches only its conn and the source's read-only state, so any
 * thread with a conn of its own may fetch at any time.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/mapguard.h"
#include "base/util.h"
#include "remote/client.h"
#include "uffd/fill.h"
#include "uffd/source.h"

#define WARM_CHUNK	(2ULL << 20)	/* bytes per pread(2) while warming the cache */

void ukvm_source_init(struct ukvm_source *src)
{
	memset(src, 0, sizeof(*src));
	src->fd = -1;
}

/* How many pages of the mapping are in the page cache now (mincore). */
static int source_count_cached(struct ukvm_source *src, uint64_t *cached, struct ukvm_error *err)
{
	uint64_t i, pages = ALIGN_UP(src->size, UKVM_PAGE_SIZE) / UKVM_PAGE_SIZE, n = 0;
	unsigned char *vec = malloc(pages ?: 1);

	if (!vec)
		return ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating mincore()'s vector");
	if (mincore((void *)src->map, src->size, vec)) {
		int ret = ukvm_err_set(err, UKVM_ERR_HOST, errno, "mincore(source_path %s)",
				       src->path);

		free(vec);
		return ret;
	}
	for (i = 0; i < pages; i++)
		n += vec[i] & 1;
	free(vec);
	*cached = n;
	return 0;
}

/* source_cache warm: every byte the run may fetch read once, into the page cache. */
static int source_warm(struct ukvm_source *src, struct ukvm_error *err)
{
	uint8_t *buf = malloc(WARM_CHUNK);
	uint64_t off = 0;
	int ret = 0;

	if (!buf)
		return ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM,
				    "allocating a buffer to warm the source");
	while (off < src->size) {
		uint64_t want = src->size - off < WARM_CHUNK ? src->size - off : WARM_CHUNK;
		ssize_t n = pread(src->fd, buf, want, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			ret = n < 0 ? -errno : -EIO;
			ukvm_err_set(err, UKVM_ERR_RUN, -ret, "pread(source_path %s at %llu)%s",
				     src->path, (unsigned long long)off,
				     n ? "" : ": the file ended early (was it truncated?)");
			break;
		}
		off += (uint64_t)n;
	}
	free(buf);
	return ret;
}

/*
 * source_cache cold: the file's pages written back and dropped. Only clean,
 * unmapped pages can go; a file on tmpfs has nowhere to drop them to.
 */
static int source_drop(struct ukvm_source *src, struct ukvm_error *err)
{
	int ret, tries;

	if (fdatasync(src->fd))
		return ukvm_err_set(err, UKVM_ERR_HOST, errno, "fdatasync(source_path %s)",
				    src->path);
	/* Twice: pages still in a CPU's LRU batch the first time go the second. */
	for (tries = 0; tries < 2; tries++) {
		ret = posix_fadvise(src->fd, 0, (off_t)src->size, POSIX_FADV_DONTNEED);
		if (ret)
			return ukvm_err_set(err, UKVM_ERR_HOST, ret, "posix_fadvise(source_path %s, "
					    "POSIX_FADV_DONTNEED)", src->path);
	}
	return 0;
}

static int source_open_file(struct ukvm_source *src, const struct ukvm_config *cfg,
			    uint64_t size, struct ukvm_error *err)
{
	struct stat st;
	void *map;
	int ret;

	if (!cfg->source_path[0] ||
	    strnlen(cfg->source_path, UKVM_SOURCE_PATH_MAX) == UKVM_SOURCE_PATH_MAX) {
		ukvm_err_set(err, UKVM_ERR_CONFIG, 0, "source_path: source file needs the path of "
			     "a snapshot file (write one with uffdkvm.make_snapshot(path, size))");
		return -EINVAL;
	}
	memcpy(src->path, cfg->source_path, sizeof(src->path));
	src->read = cfg->source_read;
	src->size = size;
	src->fd = open(src->path, O_RDONLY | O_CLOEXEC);
	if (src->fd < 0) {
		ret = errno;
		if (ret == ENOENT || ret == ENOTDIR) {
			ukvm_err_set(err, UKVM_ERR_CONFIG, ret, "source_path: %s does not exist; "
				     "write a snapshot there first with uffdkvm.make_snapshot(path, "
				     "%llu)", src->path, (unsigned long long)size);
			return -EINVAL;
		}
		return ukvm_err_set(err, UKVM_ERR_HOST, ret, "open(source_path %s)", src->path);
	}
	if (fstat(src->fd, &st))
		return ukvm_err_set(err, UKVM_ERR_HOST, errno, "fstat(source_path %s)", src->path);
	if (!S_ISREG(st.st_mode)) {
		ukvm_err_set(err, UKVM_ERR_CONFIG, 0, "source_path: %s is not a regular file; "
			     "give a snapshot file (uffdkvm.make_snapshot(path, %llu) writes one)",
			     src->path, (unsigned long long)size);
		return -EINVAL;
	}
	if ((uint64_t)st.st_size < size) {
		ukvm_err_set(err, UKVM_ERR_CONFIG, 0, "source_path: %s is %llu bytes, smaller "
			     "than the test region (%llu bytes), which it maps onto byte for "
			     "byte; write a large enough one with uffdkvm.make_snapshot(path, "
			     "%llu)", src->path, (unsigned long long)st.st_size,
			     (unsigned long long)size, (unsigned long long)size);
		return -EINVAL;
	}
	src->st_dev = st.st_dev;
	src->st_ino = st.st_ino;
	src->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
	src->ctime_ns = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
	/* remote: the server reads the file; it is mapped here for verification only. */
	ret = cfg->source != UKVM_SOURCE_FILE ? 0 :
	      cfg->source_cache == UKVM_SOURCE_CACHE_COLD ? source_drop(src, err) :
	      source_warm(src, err);
	if (ret)
		return ret;
	/* After the drop: pages a mapping holds could not have been dropped. */
	map = mmap(NULL, size, PROT_READ, MAP_SHARED, src->fd, 0);
	if (map == MAP_FAILED)
		return ukvm_err_set(err, UKVM_ERR_HOST, errno, "mmap(source_path %s, %llu bytes)",
				    src->path, (unsigned long long)size);
	src->map = map;
	/* Verification reads the mapping in every mode: guarded from here on. */
	ret = ukvm_mapguard_hold();
	if (ret)
		return ukvm_err_set(err, UKVM_ERR_HOST, -ret, "sigaction(SIGBUS), to guard the "
				    "copies from source_path %s", src->path);
	src->guarded = true;
	ret = source_count_cached(src, &src->cached_pages_at_start, err);
	if (ret)
		return ret;
	if (cfg->source_cache == UKVM_SOURCE_CACHE_COLD && src->cached_pages_at_start) {
		ukvm_err_set(err, UKVM_ERR_HOST, 0, "source_cache cold: %llu of %llu pages of "
			     "source_path %s stayed in the page cache after fdatasync and "
			     "POSIX_FADV_DONTNEED (a file on tmpfs has nowhere to drop them to, and "
			     "pages another process maps stay); put the snapshot on a disk "
			     "filesystem, or use source_cache warm",
			     (unsigned long long)src->cached_pages_at_start,
			     (unsigned long long)(ALIGN_UP(size, UKVM_PAGE_SIZE) / UKVM_PAGE_SIZE),
			     src->path);
		return -EOPNOTSUPP;
	}
	return 0;
}

int ukvm_source_open(struct ukvm_source *src, const struct ukvm_config *cfg, uint64_t size,
		     struct ukvm_error *err)
{
	ukvm_source_init(src);
	src->kind = cfg->source;
#ifdef UKVM_TEST_HOOKS
	src->wrong_offset = cfg->inject == UKVM_INJECT_SOURCE_WRONG_OFFSET;
	src->wrong_offset_at = cfg->inject_after * UKVM_PAGE_SIZE;
	src->wrong_unit = ukvm_backing_page_size(cfg->backing);
#endif
	switch (cfg->source) {
	case UKVM_SOURCE_SYNTHETIC:
		src->size = size;
		return 0;
	case UKVM_SOURCE_FILE:
		return source_open_file(src, cfg, size, err);
	default:
		memcpy(src->address, cfg->source_address, sizeof(src->address));
		src->wait_ns = cfg->timeout_ns > UKVM_SOURCE_REMOTE_WAIT_NS ? cfg->timeout_ns :
			       UKVM_SOURCE_REMOTE_WAIT_NS;
		if (cfg->source_key_file[0]) {
			int ret = ukvm_remote_key_load(cfg->source_key_file, "source_key_file",
						       &src->key, err);

			if (ret)
				return ret;
		}
		/* No local copy: the server's bytes cannot be checked (collect says so). */
		if (!cfg->source_path[0]) {
			src->size = size;
			return 0;
		}
		return source_open_file(src, cfg, size, err);
	}
}

void ukvm_source_close(struct ukvm_source *src)
{
	if (src->map)
		munmap((void *)src->map, src->size);
	if (src->guarded)
		ukvm_mapguard_release();
	if (src->fd >= 0)
		close(src->fd);
	ukvm_source_init(src);
}

const struct ukvm_source *ukvm_source_synthetic(void)
{
	static const struct ukvm_source synthetic = {
		.kind = UKVM_SOURCE_SYNTHETIC, .size = UINT64_MAX, .fd = -1,
	};

	return &synthetic;
}

int ukvm_source_conn_open(struct ukvm_source_conn *conn, const struct ukvm_source *src,
			  bool timed, int stop_fd, struct ukvm_error *err)
{
	memset(conn, 0, sizeof(*conn));
	conn->source = src;
	conn->timed = timed && src->kind != UKVM_SOURCE_SYNTHETIC;
	conn->stop_fd = stop_fd;
	if (src->kind != UKVM_SOURCE_REMOTE)
		return 0;
	return ukvm_remote_connect(src->address, &src->key, &conn->remote, err);
}

void ukvm_source_conn_close(struct ukvm_source_conn *conn)
{
	if (conn->remote)
		ukvm_remote_close(conn->remote);
	conn->remote = NULL;
	conn->source = NULL;
}

int ukvm_source_check(const struct ukvm_source *src, bool *modified, struct ukvm_error *err)
{
	struct stat st, now;
	bool gone;

	*modified = false;
	if (src->fd < 0)
		return 0;
	if (fstat(src->fd, &st))
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "fstat(source_path %s)", src->path);
	if ((uint64_t)st.st_size < src->size)
		return ukvm_err_set(err, UKVM_ERR_RUN, EIO, "source_path %s is %llu bytes now, "
				    "shorter than the test region (%llu bytes) it held when the run "
				    "began: it was truncated during the run", src->path,
				    (unsigned long long)st.st_size, (unsigned long long)src->size);
	gone = stat(src->path, &now) != 0;
	if (gone && errno != ENOENT && errno != ENOTDIR)
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "stat(source_path %s)", src->path);
	if (gone || now.st_dev != src->st_dev || now.st_ino != src->st_ino)
		return ukvm_err_set(err, UKVM_ERR_RUN, ESTALE, "source_path %s %s during the run: "
				    "the run read the file it opened, to its end, but the path "
				    "now names %s, so the result would name bytes it does not "
				    "hold; run again with the file as it is", src->path,
				    gone ? "was removed" : "was replaced",
				    gone ? "nothing" : "another file");
	*modified = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec != src->mtime_ns ||
		    (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec != src->ctime_ns;
	return 0;
}

const char *ukvm_source_strerror(const struct ukvm_source *src, int ret)
{
	if (src->kind == UKVM_SOURCE_REMOTE)
		return ukvm_remote_strerror(ret);
	return ret == -EIO ? "the file ended early: was it truncated during the run?" :
	       ret == -ERANGE ? "past the end of the source" : "";
}

void ukvm_source_prepare(const struct ukvm_source *src, uint8_t *dst, uint64_t len)
{
	if (src->kind == UKVM_SOURCE_SYNTHETIC)
		ukvm_fill_template(dst, len);
}

/* file: len bytes at off by pread(2), whole: 0 or -errno (-EIO at the file's end). */
static int source_pread(const struct ukvm_source *src, uint64_t off, uint64_t len, uint8_t *dst)
{
	uint64_t done = 0;

	while (done < len) {
		ssize_t n = pread(src->fd, dst + done, len - done, (off_t)(off + done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO;
		done += (uint64_t)n;
	}
	return 0;
}

#ifdef UKVM_TEST_HOOKS
/*
 * UKVM_INJECT_SOURCE_WRONG_OFFSET: in the bytes fetched for region_off, len
 * (into dst), the page (of the backing's size) that holds the chosen byte
 * gets the source's next page (its first, at the end): what reading that
 * page from the wrong place would bring, and that page alone, however many
 * pages the fetch asked for. File and remote sources keep the file's
 * mapping; the synthetic one has no bytes to misplace.
 */
static void source_wrong_page(const struct ukvm_source *src, uint64_t region_off,
			      uint64_t len, uint8_t *dst)
{
	uint64_t unit = src->wrong_unit, page, from;

	if (!src->wrong_offset || !src->map || src->wrong_offset_at < region_off ||
	    src->wrong_offset_at - region_off >= len)
		return;
	page = src->wrong_offset_at / unit * unit;
	from = page + unit < src->size ? page + unit : 0;
	(void)ukvm_mapguard_copy(dst + (page - region_off), src->map + from, unit);
}
#endif

int ukvm_source_fetch(struct ukvm_source_conn *conn, uint64_t region_off, uint64_t len,
		      uint64_t gpa, uint8_t *dst, bool urgent)
{
	const struct ukvm_source *src = conn->source;
	uint64_t t0 = conn->timed ? ukvm_now_ns() : 0;
	int ret = 0;

	if (region_off > src->size || len > src->size - region_off)
		return -ERANGE;
	switch (src->kind) {
	case UKVM_SOURCE_SYNTHETIC:
		ukvm_fill_stamp(dst, len, gpa);
		break;
	case UKVM_SOURCE_FILE:
		if (src->read == UKVM_SOURCE_READ_MMAP)
			ret = ukvm_mapguard_copy(dst, src->map + region_off, len);
		else
			ret = source_pread(src, region_off, len, dst);
		break;
	default:
		ret = ukvm_remote_fetch(conn->remote, region_off, len, urgent, dst, conn->stop_fd,
					ukvm_deadline_after(conn->source->wait_ns));
		break;
	}
	if (ret)
		return ret;
#ifdef UKVM_TEST_HOOKS
	source_wrong_page(src, region_off, len, dst);
#endif
	conn->bytes += len;
	if (conn->timed)
		conn->ns += ukvm_now_ns() - t0;
	return 0;
}

bool ukvm_source_pipelined(const struct ukvm_source_conn *conn)
{
	return conn->source->kind == UKVM_SOURCE_REMOTE && conn->remote;
}

int ukvm_source_send(struct ukvm_source_conn *conn, uint64_t region_off, uint64_t len)
{
	const struct ukvm_source *src = conn->source;

	if (!ukvm_source_pipelined(conn))
		return -EOPNOTSUPP;
	if (region_off > src->size || len > src->size - region_off)
		return -ERANGE;
	return ukvm_remote_send(conn->remote, region_off, len, false, conn->stop_fd,
				ukvm_deadline_after(conn->source->wait_ns));
}

int ukvm_source_recv(struct ukvm_source_conn *conn, uint64_t *region_off, uint64_t *len,
		     uint8_t *dst, uint64_t dst_len)
{
	struct ukvm_remote_reply reply;
	uint64_t t0 = conn->timed ? ukvm_now_ns() : 0;
	int ret;

	if (!ukvm_source_pipelined(conn))
		return -EOPNOTSUPP;
	/* The wait counts from here: a reply may have been in flight for long already. */
	ret = ukvm_remote_recv(conn->remote, &reply, dst, dst_len, conn->stop_fd,
			       ukvm_deadline_after(conn->source->wait_ns));
	if (ret)
		return ret;
	if (reply.status)
		return reply.status;	/* the server refused it (-ERANGE: past the end) */
	*region_off = reply.offset;
	*len = reply.length;
#ifdef UKVM_TEST_HOOKS
	source_wrong_page(conn->source, reply.offset, reply.length, dst);
#endif
	conn->bytes += reply.length;
	if (conn->timed)
		conn->ns += ukvm_now_ns() - t0;
	return 0;
}
