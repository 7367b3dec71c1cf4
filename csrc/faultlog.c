/* SPDX-License-Identifier: MIT */
/*
 * From the readers' fault records (stats full) to what each vCPU went
 * through: how many faults it took, how long each kept it waiting, and how
 * long all vCPUs were blocked at once.
 *
 * Each record spans the reader reading the fault message to its resolving
 * ioctl returning, and names the faulting thread (UFFD_FEATURE_THREAD_ID),
 * which maps to a vCPU. A vCPU is blocked while one of its faults is
 * outstanding; the VM is blocked while every vCPU is (QEMU's
 * postcopy-blocktime). Both come from one sweep over the records' start
 * and end events in time order, after the run, off the hot path.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct tid_index {
	int32_t tid;
	int32_t index;
};

struct event {
	uint64_t t;
	int32_t vcpu;
	int32_t delta;	/* +1 a fault starts, -1 it ends */
};

static int cmp_tid(const void *a, const void *b)
{
	const struct tid_index *x = a, *y = b;

	return (x->tid > y->tid) - (x->tid < y->tid);
}

static int cmp_start(const void *a, const void *b)
{
	const struct ukvm_fault_record *x = a, *y = b;

	return (x->read_ns > y->read_ns) - (x->read_ns < y->read_ns);
}

/* By time; at the same instant an end before a start, so touching faults do not overlap. */
static int cmp_event(const void *a, const void *b)
{
	const struct event *x = a, *y = b;

	if (x->t != y->t)
		return (x->t > y->t) - (x->t < y->t);
	return x->delta - y->delta;
}

static int32_t vcpu_of(const struct tid_index *map, uint32_t n, int32_t tid)
{
	struct tid_index key = { .tid = tid };
	const struct tid_index *hit = bsearch(&key, map, n, sizeof(*map), cmp_tid);

	return hit ? hit->index : -1;
}

static void sweep(struct ukvm_faultlog *log, struct event *ev, uint64_t n)
{
	uint32_t *depth = calloc(log->nr_vcpus, sizeof(*depth));
	uint64_t *since = calloc(log->nr_vcpus, sizeof(*since));
	uint32_t blocked = 0;
	uint64_t i, last = 0;

	if (!depth || !since)
		goto out;
	for (i = 0; i < n; i++) {
		struct event *e = &ev[i];

		if (blocked == log->nr_vcpus && i)
			log->blocktime_ns += e->t - last;
		last = e->t;
		if (e->delta > 0) {
			if (depth[e->vcpu]++ == 0) {
				since[e->vcpu] = e->t;
				blocked++;
			}
		} else if (depth[e->vcpu] && --depth[e->vcpu] == 0) {
			log->vcpus[e->vcpu].blocked_ns += e->t - since[e->vcpu];
			blocked--;
		}
	}
out:
	free(depth);
	free(since);
}

int ukvm_faultlog_build(struct ukvm_faultlog *log, struct ukvm_pool *pools, uint32_t nr_pools)
{
	struct tid_index *map = NULL;
	struct event *ev = NULL;
	uint64_t n = 0, i, k = 0;
	uint32_t u, r;
	int ret = -ENOMEM;

	for (u = 0; u < nr_pools; u++)
		for (r = 0; pools[u].readers && r < pools[u].nr_readers; r++)
			n += pools[u].readers[r].nr_records;
	log->all = malloc((n ?: 1) * sizeof(*log->all));
	map = malloc((log->nr_vcpus ?: 1) * sizeof(*map));
	ev = malloc((2 * n ?: 1) * sizeof(*ev));
	if (!log->all || !map || !ev)
		goto out;

	for (u = 0; u < nr_pools; u++)
		for (r = 0; pools[u].readers && r < pools[u].nr_readers; r++) {
			struct ukvm_reader *rd = &pools[u].readers[r];

			if (!rd->nr_records)
				continue;	/* and records may be NULL */
			memcpy(log->all + k, rd->records, rd->nr_records * sizeof(*rd->records));
			k += rd->nr_records;
		}
	log->nr_all = n;
	qsort(log->all, n, sizeof(*log->all), cmp_start);

	for (i = 0; i < log->nr_vcpus; i++)
		map[i] = (struct tid_index){ .tid = log->tids[i], .index = (int32_t)i };
	qsort(map, log->nr_vcpus, sizeof(*map), cmp_tid);

	for (i = 0, k = 0; i < n; i++) {
		struct ukvm_fault_record *rec = &log->all[i];
		struct ukvm_vcpu_result *v;

		rec->vcpu = vcpu_of(map, log->nr_vcpus, rec->vcpu);
		if (rec->vcpu < 0)
			continue;	/* not a vCPU's fault (no THREAD_ID, say) */
		v = &log->vcpus[rec->vcpu];
		v->faults++;
		ukvm_hist_add(&v->service_latency, rec->resolved_ns - rec->read_ns);
		ev[k++] = (struct event){ rec->read_ns, rec->vcpu, +1 };
		ev[k++] = (struct event){ rec->resolved_ns, rec->vcpu, -1 };
	}
	qsort(ev, k, sizeof(*ev), cmp_event);
	sweep(log, ev, k);
	ret = 0;
out:
	free(map);
	free(ev);
	return ret;
}
