/* SPDX-License-Identifier: MIT */
/*
 * The source side of a live migration (migrate.h), as QEMU's migration
 * thread runs it, with the destination's memory a copy in this process:
 *
 *   pass 1     the guest populates its memory; every vCPU waits at its end
 *              while tracking is turned on (experiment/dirty.c)
 *   rounds     the vCPUs walk on; round 1 sends every page, each later one
 *              the pages the tracker found written during the round before
 *              (harvested and re-protected before they are read, so that a
 *              write after the read is the next round's). precopy goes on
 *              until what is still dirty would cross the link within
 *              downtime_target_ms, or max_rounds; hybrid for precopy_rounds;
 *              postcopy has none
 *   the stop   the gate closes after the pass the furthest vCPU is in
 *              (the others run on to it): the last vCPU to reach it is the
 *              stop (migration_stop_ns); the first ones wait there meanwhile. The final harvest;
 *              precopy sends what is dirty (the stop-copy), the others leave
 *              it for post-copy
 *   the check  every page the destination holds is compared with the
 *              source's, which no vCPU changes now: a tracker that lost a
 *              write fails the run here (-EPROTO), the page named
 *   the dump   the memory at the stop into migration_dump_path, for the
 *              destination's page source; then the vCPUs leave their gate
 *
 * auto_converge throttles the guest as QEMU's does: after a round whose
 * dirty set is over half of what it sent, the vCPUs give up
 * throttle_initial_percent of their time, then throttle_increment_percent
 * more after each such round, up to throttle_max_percent (QEMU waits for
 * two such rounds; here each one counts). While throttled the sender kicks
 * every vCPU each UKVM_THROTTLE_SLICE_NS, and a kicked vCPU sleeps its share
 * (kvm/vcpu.c). The rounds over, the throttle is lifted: the vCPUs run to
 * the stop at full speed.
 *
 * The link is a model: a page takes 4096 x 8 / link_bandwidth_mbps us of
 * it, the sender sleeps when it is ahead of the link, and a page arrives
 * link_latency_us after it left (the latency is added by the caller's
 * arithmetic, uffdkvm/migration/migrate.py: nothing here waits for an arrival).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/ctl.h"
#include "base/errors.h"
#include "base/util.h"
#include "experiment/dirty.h"
#include "experiment/migrate.h"
#include "experiment/state.h"
#include "kvm/vcpu.h"

#define BITS_WORDS(pages)	(((pages) + 63) / 64)
#define DUMP_CHUNK		(1ULL << 20)
#define ROUNDS_FIRST_CAP	16
/* The longest the sender sleeps for the link before it looks at cancel and the deadline. */
#define SEND_CHECK_NS		(10 * NSEC_PER_MSEC)

void ukvm_migrate_init(struct ukvm_migrate *m)
{
	memset(m, 0, sizeof(*m));
	atomic_init(&m->pages_sent, 0);
}

int ukvm_migrate_setup(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	struct ukvm_migrate *m = &exp->migrate;
	uint64_t words;
	uint32_t i;
	void *p;

	m->mode = exp->cfg.migration;
	if (m->mode == UKVM_MIGRATION_NONE)
		return 0;
	m->pages = exp->region_size / UKVM_PAGE_SIZE;
	words = BITS_WORDS(m->pages);
	p = mmap(NULL, exp->region_size, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return ukvm_err_set(err, UKVM_ERR_RUN, errno, "mmap(the destination's copy, "
				    "%llu bytes)", (unsigned long long)exp->region_size);
	m->image = p;
	m->held = calloc(words, sizeof(*m->held));
	m->todo = calloc(words, sizeof(*m->todo));
	m->cap_rounds = ROUNDS_FIRST_CAP;
	m->rounds = calloc(m->cap_rounds, sizeof(*m->rounds));
	if (!m->held || !m->todo || !m->rounds)
		return ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating the migration's page "
				    "maps (%llu pages)", (unsigned long long)m->pages);
	/* 4 KiB x 8 bits at mbps 10^6 bits/s, in ns */
	m->ns_per_page = exp->cfg.link_bandwidth_mbps ?
			 UKVM_PAGE_SIZE * 8 * 1000 / exp->cfg.link_bandwidth_mbps : 0;
	if (exp->cfg.link_bandwidth_mbps && !m->ns_per_page)
		m->ns_per_page = 1;
	/* Pass 1 populates; the sender opens the gate after it. */
	exp->ctl.passes_open = 1;
	for (i = 0; i < exp->cfg.vcpus; i++)
		exp->vcpus[i].gated = true;
	return 0;
}

/* Under ctl->lock: the highest pass any vCPU has reported ending. */
static uint64_t migrate_max_at_gate(struct ukvm_experiment *exp)
{
	uint64_t max = 0;
	uint32_t i;

	for (i = 0; i < exp->cfg.vcpus; i++)
		if (exp->vcpus[i].at_gate > max)
			max = exp->vcpus[i].at_gate;
	return max;
}

/*
 * Under ctl->lock: waits until every vCPU waits at the end of pass `pass`,
 * or all have finished their passes. 0, or -1: the run failed, was
 * cancelled or passed its deadline (recorded).
 */
static int migrate_wait_gate(struct ukvm_experiment *exp, uint64_t pass)
{
	struct ukvm_ctl *ctl = &exp->ctl;
	struct timespec ts;
	uint32_t i, waiting;

	for (;;) {
		if (ctl->failed)
			return -1;
		for (i = 0, waiting = 0; i < exp->cfg.vcpus; i++)
			waiting += exp->vcpus[i].at_gate >= pass;
		if (waiting == exp->cfg.vcpus || !ctl->vcpus_running)
			return 0;
		if (exp_past_deadline(exp)) {
			struct ukvm_error timeout = { 0 };

			ukvm_err_set(&timeout, UKVM_ERR_TIMEOUT, 0,
				     "the run did not finish within timeout_s=%.3f: %u of %u source "
				     "vCPUs had not reached the end of pass %llu to stop",
				     (double)exp->cfg.timeout_ns / NSEC_PER_SEC,
				     exp->cfg.vcpus - waiting, exp->cfg.vcpus,
				     (unsigned long long)pass);
			ukvm_ctl_fail_locked(ctl, &timeout);
			return -1;
		}
		ukvm_timespec(&ts, exp->deadline_ns ? exp->deadline_ns :
				   ukvm_deadline_after(NSEC_PER_SEC));
		pthread_cond_timedwait(&ctl->cond, &ctl->lock, &ts);
	}
}

/* Without the lock: has the run failed, been cancelled or passed its deadline? */
static int migrate_check(struct ukvm_experiment *exp, const char *doing, struct ukvm_error *err)
{
	if (exp_aborted(exp))
		return -ECANCELED;	/* the failure or the cancel is recorded */
	if (exp_past_deadline(exp))
		return ukvm_err_set(err, UKVM_ERR_TIMEOUT, 0, "the run did not finish within "
				    "timeout_s=%.3f: the migration was %s",
				    (double)exp->cfg.timeout_ns / NSEC_PER_SEC, doing);
	return 0;
}

/* auto_converge: every vCPU's throttle, from its next time slice. */
static void migrate_set_throttle(struct ukvm_experiment *exp, uint32_t percent)
{
	struct ukvm_migrate *m = &exp->migrate;
	uint32_t i;

	m->throttle_percent = percent;
	m->next_kick_ns = 0;
	for (i = 0; i < exp->cfg.vcpus; i++)
		atomic_store_explicit(&exp->vcpus[i].throttle_percent, percent,
				      memory_order_relaxed);
}

/* While throttled: a kick into every vCPU's sleep once a time slice (kvm/vcpu.c). */
static void migrate_throttle_tick(struct ukvm_experiment *exp, uint64_t now)
{
	struct ukvm_migrate *m = &exp->migrate;
	uint32_t i;

	if (!m->throttle_percent || now < m->next_kick_ns)
		return;
	for (i = 0; i < exp->cfg.vcpus; i++)
		ukvm_vcpu_kick(&exp->vcpus[i]);
	m->next_kick_ns = now + UKVM_THROTTLE_SLICE_NS;
}

/* After a round of `sent` pages that found `dirty`: QEMU's rule, its percentages. */
static void migrate_converge(struct ukvm_experiment *exp, uint64_t sent, uint64_t dirty)
{
	const struct ukvm_config *c = &exp->cfg;
	uint32_t p = exp->migrate.throttle_percent;

	if (!c->auto_converge || dirty * 2 <= sent)
		return;
	p = p ? p + c->throttle_increment_percent : c->throttle_initial_percent;
	migrate_set_throttle(exp, p < c->throttle_max_percent ? p : c->throttle_max_percent);
}

/*
 * Puts the pages of `set` on the link: each copied into the destination's
 * image and marked held, the sender paced to the link. Returns 0 with *sent
 * the pages, or -errno (err set, or -ECANCELED: the run's failure).
 */
static int migrate_send(struct ukvm_experiment *exp, const uint64_t *set, uint64_t *sent,
			struct ukvm_error *err)
{
	struct ukvm_migrate *m = &exp->migrate;
	uint64_t w, now = ukvm_now_ns(), n = 0;
	int ret;

	if (m->link_free_ns < now)
		m->link_free_ns = now;
	for (w = 0; w < BITS_WORDS(m->pages); w++) {
		uint64_t bits = set[w], k = 0;

		if (!bits)
			continue;
		while (bits) {
			uint64_t page = w * 64 + (uint64_t)__builtin_ctzll(bits);

			bits &= bits - 1;
			memcpy(m->image + page * UKVM_PAGE_SIZE, exp->mem.hva + page * UKVM_PAGE_SIZE,
			       UKVM_PAGE_SIZE);
			k++;
		}
		m->held[w] |= set[w];
		n += k;
		atomic_fetch_add_explicit(&m->pages_sent, k, memory_order_relaxed);
		m->link_free_ns += k * m->ns_per_page;
		/* Ahead of the link: wait for it in slices, so cancel and the deadline are seen. */
		for (;;) {
			ret = migrate_check(exp, "sending pages", err);
			if (ret)
				return ret;
			now = ukvm_now_ns();
			migrate_throttle_tick(exp, now);
			if (m->link_free_ns <= now)
				break;
			ukvm_sleep_ns(m->link_free_ns - now < SEND_CHECK_NS ? m->link_free_ns - now
									 : SEND_CHECK_NS);
		}
	}
	*sent = n;
	return migrate_check(exp, "sending pages", err);
}

/* A taken dirty set: no longer held at the destination (until sent again). */
static void migrate_unhold(struct ukvm_migrate *m, const uint64_t *set)
{
	uint64_t w;

	for (w = 0; w < BITS_WORDS(m->pages); w++)
		m->held[w] &= ~set[w];
}

/*
 * The tracker's pages since the last take into m->todo (*found of them
 * new there), no longer held at the destination. 0, or -errno.
 */
static int migrate_take(struct ukvm_experiment *exp, uint32_t round, uint64_t *found,
			uint64_t *ring_full_exits, struct ukvm_error *err)
{
	struct ukvm_migrate *m = &exp->migrate;
	int ret;

	ret = ukvm_dirty_take(exp, round, m->todo, found, ring_full_exits, err);
	if (ret)
		return ret;
#ifdef UKVM_TEST_HOOKS
	if (exp->cfg.inject == UKVM_INJECT_MIGRATE_BLIND_PAGE &&
	    exp->cfg.inject_after < m->pages) {
		uint64_t page = exp->cfg.inject_after, bit = 1ULL << (page % 64);

		*found -= !!(m->todo[page / 64] & bit);
		m->todo[page / 64] &= ~bit;
	}
#endif
	migrate_unhold(m, m->todo);
	return 0;
}

static struct ukvm_migration_round *migrate_new_round(struct ukvm_migrate *m,
						       struct ukvm_error *err)
{
	struct ukvm_migration_round *r;

	if (m->nr_rounds == m->cap_rounds) {
		r = realloc(m->rounds, 2 * m->cap_rounds * sizeof(*r));
		if (!r) {
			ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating migration round %u",
				     m->nr_rounds + 1);
			return NULL;
		}
		m->rounds = r;
		m->cap_rounds *= 2;
	}
	r = &m->rounds[m->nr_rounds++];
	memset(r, 0, sizeof(*r));
	r->round = m->nr_rounds;
	return r;
}

/* Would `pages` cross the link within downtime_target_ms? */
static bool migrate_fits(struct ukvm_experiment *exp, uint64_t pages)
{
	uint64_t ns = pages * exp->migrate.ns_per_page +
		      (uint64_t)exp->cfg.link_latency_us * NSEC_PER_USEC;

	return ns <= (uint64_t)exp->cfg.downtime_target_ms * NSEC_PER_MSEC;
}

/* The rounds, the vCPUs running. 0, or -errno. */
static int migrate_rounds(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	struct ukvm_migrate *m = &exp->migrate;
	uint64_t words = BITS_WORDS(m->pages), w, discard, t;
	uint64_t *set;
	int ret;

	if (m->mode == UKVM_MIGRATION_POSTCOPY)
		return 0;
	set = calloc(words, sizeof(*set));
	if (!set)
		return ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating a round's pages");
	/* Round 1 sends every page: protect them all first, and forget what came before. */
	for (w = 0; w < words; w++)
		set[w] = w == words - 1 && m->pages % 64 ? (1ULL << (m->pages % 64)) - 1 : ~0ULL;
	for (;;) {
		struct ukvm_migration_round *r = migrate_new_round(m, err);

		ret = r ? 0 : -ENOMEM;
		if (ret)
			break;
		r->start_ns = ukvm_now_ns();
		r->throttle_percent = m->throttle_percent;
		if (r->round == 1) {
			memset(m->todo, 0, words * sizeof(*m->todo));
			ret = ukvm_dirty_take(exp, 0, m->todo, &discard, &r->ring_full_exits,
					      err);
			memset(m->todo, 0, words * sizeof(*m->todo));
		}
		ret = ret ?: migrate_send(exp, set, &r->sent_pages, err);
		if (ret)
			break;
		m->precopy_pages += r->sent_pages;
		t = ukvm_now_ns();
		r->send_ns = t - r->start_ns;
		/* What the guest wrote during the round: no longer what the destination holds. */
		ret = migrate_take(exp, r->round, &r->dirty_pages, &r->ring_full_exits, err);
		r->harvest_ns = ukvm_now_ns() - t;
		if (ret)
			break;
		/* precopy: the rounds end on a dirty set that fits, or at max_rounds. */
		m->converged = m->mode == UKVM_MIGRATION_PRECOPY && migrate_fits(exp, r->dirty_pages);
		if (m->mode == UKVM_MIGRATION_PRECOPY &&
		    (m->converged || r->round >= exp->cfg.max_rounds))
			break;
		if (m->mode == UKVM_MIGRATION_HYBRID && r->round >= exp->cfg.precopy_rounds)
			break;
		migrate_converge(exp, r->sent_pages, r->dirty_pages);
		memcpy(set, m->todo, words * sizeof(*set));
		memset(m->todo, 0, words * sizeof(*m->todo));
	}
	migrate_set_throttle(exp, 0);	/* to the stop at full speed */
	free(set);
	return ret;
}

/*
 * Under ctl->lock: the gate closes after the pass the furthest vCPU is in,
 * and the last to reach it stops the source. 0, or -1 (recorded).
 */
static int migrate_stop(struct ukvm_experiment *exp)
{
	struct ukvm_migrate *m = &exp->migrate;
	struct ukvm_ctl *ctl = &exp->ctl;
	uint64_t pass, last = 0;
	uint32_t i;

	/*
	 * at_gate is set under the lock at every pass end, so no vCPU has begun
	 * a pass past max + 1 unseen: each one stops at the end of that one.
	 */
	pass = ctl->passes_open == 1 ? 1 : migrate_max_at_gate(exp) + 1;
	if (pass > exp->passes) {
		struct ukvm_error e = { 0 };

		ukvm_err_set(&e, UKVM_ERR_RUN, ERANGE, "migration: the source's guest ended its "
			     "%llu passes before the switch-over, so no pass was left to stop it in; "
			     "a faster link or more memory makes the rounds take fewer passes",
			     (unsigned long long)exp->passes);
		ukvm_ctl_fail_locked(ctl, &e);
		return -1;
	}
	ctl->passes_open = pass;
	pthread_cond_broadcast(&ctl->cond);
	if (migrate_wait_gate(exp, pass))
		return -1;
	for (i = 0; i < exp->cfg.vcpus; i++) {
		uint64_t end = exp->vcpus[i].pass_end_ns[pass - 1];

		if (end > last)
			last = end;
	}
	m->stop_ns = last;
	exp->passes = pass;	/* what every vCPU ran: verification's count */
	return 0;
}

/*
 * The vCPUs stopped: every page the destination holds must equal the
 * source's now (the tracker saw every write after its send). 0, or -EPROTO
 * naming the first page that does not.
 */
static int migrate_check_held(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	struct ukvm_migrate *m = &exp->migrate;
	uint64_t w, differ = 0, first = 0, held = 0, k = 0;

	for (w = 0; w < BITS_WORDS(m->pages); w++) {
		uint64_t bits = m->held[w];

		held += (uint64_t)__builtin_popcountll(bits);
		while (bits) {
			uint64_t page = w * 64 + (uint64_t)__builtin_ctzll(bits);

			bits &= bits - 1;
			if (memcmp(m->image + page * UKVM_PAGE_SIZE,
				   exp->mem.hva + page * UKVM_PAGE_SIZE, UKVM_PAGE_SIZE)) {
				if (!differ)
					first = page;
				differ++;
			}
		}
	}
	if (differ)
		return ukvm_err_set(err, UKVM_ERR_RUN, EPROTO, "migration: %llu of the %llu pages "
				    "the destination holds differ from the source's at the stop "
				    "(the first at gpa 0x%llx): dirty_tracking='%s' lost writes made "
				    "after the page was sent", (unsigned long long)differ,
				    (unsigned long long)held,
				    (unsigned long long)(exp->region_gpa + first * UKVM_PAGE_SIZE),
				    ukvm_dirty_tracking_name(exp->cfg.dirty_tracking));
	m->migrated = malloc((held ? held : 1) * sizeof(*m->migrated));
	if (!m->migrated)
		return ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "allocating the migrated pages' list");
	for (w = 0; w < BITS_WORDS(m->pages); w++) {
		uint64_t bits = m->held[w];

		while (bits) {
			m->migrated[k++] = (uint32_t)(w * 64 + (uint64_t)__builtin_ctzll(bits));
			bits &= bits - 1;
		}
	}
	m->nr_migrated = k;
	return 0;
}

/* The memory at the stop into migration_dump_path (made 0600: guest memory). */
static int migrate_dump(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	const char *path = exp->cfg.migration_dump_path;
	uint64_t off;
	int fd, ret = 0;

	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return ukvm_err_set(err, UKVM_ERR_CONFIG, errno, "migration_dump_path: open(%s)",
				    path);
	for (off = 0; off < exp->region_size && !ret; ) {
		uint64_t len = exp->region_size - off < DUMP_CHUNK ? exp->region_size - off
								   : DUMP_CHUNK;
		ssize_t n = pwrite(fd, exp->mem.hva + off, len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			ret = ukvm_err_set(err, UKVM_ERR_RUN, n < 0 ? errno : EIO,
					   "migration_dump_path: writing %s at %llu of %llu bytes",
					   path, (unsigned long long)off,
					   (unsigned long long)exp->region_size);
		else
			off += (uint64_t)n;
		if (!ret && off % (64 * DUMP_CHUNK) == 0)
			ret = migrate_check(exp, "writing the memory at the stop", err);
	}
	close(fd);
	return ret;
}

/* After the stop, without the lock. 0, or -errno. */
static int migrate_after_stop(struct ukvm_experiment *exp, struct ukvm_error *err)
{
	struct ukvm_migrate *m = &exp->migrate;
	uint64_t found = 0, full = 0;
	int ret = 0;

	if (exp->dirty.kind != UKVM_DIRTY_NONE && exp->dirty.logging) {
		ret = migrate_take(exp, m->nr_rounds + 1, &found, &full, err);
		/* Filled since the last round's harvest: that round's (postcopy has none). */
		if (m->nr_rounds)
			m->rounds[m->nr_rounds - 1].ring_full_exits += full;
		if (ret)
			return ret;
		if (m->mode == UKVM_MIGRATION_PRECOPY) {
			ret = migrate_send(exp, m->todo, &m->stopcopy_pages, err);
			if (ret)
				return ret;
		}
	}
	m->stopcopy_ns = ukvm_now_ns() - m->stop_ns;
	if (exp->dirty.kind != UKVM_DIRTY_NONE && exp->dirty.logging)
		ret = ukvm_dirty_disable(exp, err);
	return ret ?: migrate_check_held(exp, err) ?: migrate_dump(exp, err);
}

void ukvm_migrate_run(struct ukvm_experiment *exp)
{
	struct ukvm_migrate *m = &exp->migrate;
	struct ukvm_ctl *ctl = &exp->ctl;
	struct ukvm_error err = { 0 };
	int ret;

	if (migrate_wait_gate(exp, 1))
		return;
	pthread_mutex_unlock(&ctl->lock);
	ret = m->mode == UKVM_MIGRATION_POSTCOPY || exp->dirty.kind == UKVM_DIRTY_NONE ? 0 :
	      ukvm_dirty_enable(exp, &err);
	pthread_mutex_lock(&ctl->lock);
	if (ret)
		goto failed;
	m->start_ns = ukvm_now_ns();
	if (m->mode != UKVM_MIGRATION_POSTCOPY) {
		ctl->passes_open = UINT64_MAX;	/* the vCPUs walk on */
		pthread_cond_broadcast(&ctl->cond);
		pthread_mutex_unlock(&ctl->lock);
		ret = migrate_rounds(exp, &err);
		pthread_mutex_lock(&ctl->lock);
		if (ret)
			goto failed;
	}
	if (migrate_stop(exp))
		return;
	if (m->mode == UKVM_MIGRATION_POSTCOPY)
		m->start_ns = m->stop_ns;	/* no rounds: the migration starts at the stop */
	pthread_mutex_unlock(&ctl->lock);
	ret = migrate_after_stop(exp, &err);
	pthread_mutex_lock(&ctl->lock);
	if (ret)
		goto failed;
	ctl->passes_end = exp->passes;	/* the vCPUs leave their gate */
	pthread_cond_broadcast(&ctl->cond);
	return;
failed:
	if (ret != -ECANCELED)
		ukvm_ctl_fail_locked(ctl, &err);
}

void ukvm_migrate_collect(struct ukvm_migrate *m, struct ukvm_result *res)
{
	uint64_t w, todo = 0;

	if (m->mode == UKVM_MIGRATION_NONE)
		return;
	for (w = 0; w < BITS_WORDS(m->pages); w++)
		todo += (uint64_t)__builtin_popcountll(m->held[w]);
	res->migration_rounds = m->rounds;
	res->nr_migration_rounds = m->nr_rounds;
	res->migration_converged = m->converged;
	res->migration_start_ns = m->start_ns;
	res->migration_stop_ns = m->stop_ns;
	res->stopcopy_pages = m->stopcopy_pages;
	res->stopcopy_ns = m->stopcopy_ns;
	res->precopy_pages = m->precopy_pages;
	res->postcopy_pages = m->pages - todo;
	res->migrated_pages = m->migrated;
	res->nr_migrated_pages = m->nr_migrated;
	m->rounds = NULL;
	m->nr_rounds = 0;
	m->migrated = NULL;
	m->nr_migrated = 0;
}

void ukvm_migrate_destroy(struct ukvm_migrate *m)
{
	if (m->image)
		munmap(m->image, m->pages * UKVM_PAGE_SIZE);
	free(m->held);
	free(m->todo);
	free(m->rounds);
	free(m->migrated);
	ukvm_migrate_init(m);
}
