/* SPDX-License-Identifier: MIT */
/*
 * Where a resolved page's bytes come from (source.c): the synthetic fill,
 * a snapshot file, or a page server (remote/client.h) serving one. One struct ukvm_source per
 * experiment, opened before the vCPUs start; each thread that installs
 * pages (a reader, a resolving vCPU, a prefetch pusher) holds a
 * struct ukvm_source_conn of its own and fetches through it, so that a
 * source with per-thread state (a socket to the page server) needs no lock
 * and the fetch counters are the thread's own.
 */
#ifndef UKVM_UFFD_SOURCE_H
#define UKVM_UFFD_SOURCE_H

#include <stdbool.h>
#include <stdint.h>

#include "ukvm.h"

struct ukvm_remote_conn;

struct ukvm_source {
	enum ukvm_source_kind kind;
	enum ukvm_source_read read;
	uint64_t size;			/* bytes of the region the source serves */
	int fd;				/* file: the snapshot, read-only, or -1 */
	const uint8_t *map;		/* file: a read-only MAP_SHARED mapping of size bytes */
	char path[UKVM_SOURCE_PATH_MAX];
	char address[UKVM_SOURCE_ADDRESS_MAX];	/* remote: the page server */
	struct ukvm_remote_key key;	/* remote: source_key_file's (len 0: none) */
	uint64_t wait_ns;		/* remote: the longest a fetch waits for its answer */
	uint64_t cached_pages_at_start;	/* file: page-cache pages of it when the run began */
	/* file: what fstat() said when it was opened, to tell a change after the run */
	uint64_t st_dev, st_ino;
	int64_t mtime_ns, ctime_ns;
	bool guarded;			/* file: holds the SIGBUS guard (base/mapguard.h) */
#ifdef UKVM_TEST_HOOKS
	uint64_t wrong_offset_at;	/* UKVM_INJECT_SOURCE_WRONG_OFFSET: that byte's page */
	uint64_t wrong_unit;		/* the pages fetched: the backing's page size */
	bool wrong_offset;
#endif
};

struct ukvm_source_conn {
	const struct ukvm_source *source;
	struct ukvm_remote_conn *remote;	/* remote: the thread's own connection */
	int stop_fd;			/* remote: readable once the thread must leave */
	bool timed;			/* count fetch time (stats full; not for synthetic) */
	uint64_t bytes;			/* fetched through this conn */
	uint64_t ns;			/* spent fetching, when timed */
};

/* Empty, closable state. */
void ukvm_source_init(struct ukvm_source *src);
/*
 * Opens the source cfg names for a region of size bytes: for a file, checks
 * it is there and large enough, maps it, and brings its page cache to
 * cfg->source_cache (cold: dropped, and checked with mincore(); warm: read
 * once). 0, or -errno with err set (UKVM_ERR_CONFIG naming source_path for
 * a missing or short file).
 */
int ukvm_source_open(struct ukvm_source *src, const struct ukvm_config *cfg, uint64_t size,
		     struct ukvm_error *err);
void ukvm_source_close(struct ukvm_source *src);
/* A synthetic source of any size, shared and read-only: for pools made without one. */
const struct ukvm_source *ukvm_source_synthetic(void);

/*
 * A thread's connection to src; timed: count the time fetches take. A
 * remote source connects to the page server here; a fetch through it
 * gives up with -ECANCELED once stop_fd (an eventfd the thread's stop
 * writes) is readable. 0, or -errno with err set.
 */
int ukvm_source_conn_open(struct ukvm_source_conn *conn, const struct ukvm_source *src,
			  bool timed, int stop_fd, struct ukvm_error *err);
void ukvm_source_conn_close(struct ukvm_source_conn *conn);
/*
 * Readies a buffer that fetches from src go into, len bytes: the synthetic fill
 * writes only the address words per fetch, so its buffers hold the rest
 * (the template) from here on; other sources write whole pages.
 */
void ukvm_source_prepare(const struct ukvm_source *src, uint8_t *dst, uint64_t len);
/*
 * The len bytes at region_off of the test region (the whole region, across
 * every uffd) into dst, which the thread has prepared; gpa is the guest
 * physical address of region_off, for the synthetic stamp. urgent: a fault
 * waits for it (a prefetch does not; a page server serves faults first).
 * 0, or -errno: -EIO, the file ended early (pread(2) found its end, or the
 * mapping had no page there: the guard turns that SIGBUS into -EIO); remote, those of
 * remote/client.h (-ECANCELED: the thread's stop; -ECONNRESET or -EPIPE:
 * the server went away; -ETIMEDOUT: no answer in src->wait_ns).
 */
int ukvm_source_fetch(struct ukvm_source_conn *conn, uint64_t region_off, uint64_t len,
		      uint64_t gpa, uint8_t *dst, bool urgent);

/*
 * Pipelined fetches, for a prefetcher that keeps several requests in
 * flight: only a remote source pipelines (a fetch from a file or the
 * synthetic fill costs no round trip: fetch those one at a time). send()
 * asks for len bytes at region_off (not urgent); recv() takes the next
 * reply whole into dst (dst_len at least the longest asked) and says which
 * range it answers in *region_off and *len: replies come in the order the
 * server serves them, so match them by region_off. Returns as for fetch;
 * -EOPNOTSUPP from a source that does not pipeline. A stop (-ECANCELED)
 * with requests still in flight spends the connection: close it.
 */
bool ukvm_source_pipelined(const struct ukvm_source_conn *conn);
int ukvm_source_send(struct ukvm_source_conn *conn, uint64_t region_off, uint64_t len);
int ukvm_source_recv(struct ukvm_source_conn *conn, uint64_t *region_off, uint64_t *len,
		     uint8_t *dst, uint64_t dst_len);

/*
 * remote: the longest a fetch waits for the server's answer, queueing
 * included: this, or the run's time limit when that is longer (a run that
 * asks for a slow server and gives it the time must not fail here first).
 */
#define UKVM_SOURCE_REMOTE_WAIT_NS	(60ULL * 1000 * 1000 * 1000)

/*
 * After the run, is the file still the one it read? 0, or -errno with err
 * set (UKVM_ERR_RUN, naming source_path): -EIO, it is shorter than the
 * region now (truncated during the run); -ESTALE, the path names another
 * file or none (replaced or removed: the run read the old one throughout,
 * but its result would name a file that does not hold those bytes).
 * *modified: written to since it was opened (its mtime or ctime moved),
 * for the message of a verification that finds pages other than it.
 * Nothing to check for the synthetic source.
 */
int ukvm_source_check(const struct ukvm_source *src, bool *modified, struct ukvm_error *err);

/* What a failed fetch's return means, for the run's error message. */
const char *ukvm_source_strerror(const struct ukvm_source *src, int ret);
#endif
