/* SPDX-License-Identifier: MIT */
/* KVM's binary statistics (KVM_GET_STATS_FD) of a VM or a vCPU. */
#ifndef UKVM_KVM_KVMSTATS_H
#define UKVM_KVM_KVMSTATS_H

#include <stdbool.h>
#include <stdint.h>

#include "ukvm.h"

struct ukvm_kvmstats {
	int fd;
	uint32_t nr;			/* descriptors */
	char **names;
	uint32_t *offsets;		/* of each value, in u64s from data_offset */
	uint32_t *sizes;		/* u64s per value (histograms have several) */
	uint32_t *flags;
	uint64_t data_offset;
	uint32_t nr_values;
	uint32_t nr_scalars;		/* statistics of one value... */
	uint32_t *scalars;		/* ...and their descriptor indexes */
	uint64_t *before;		/* the snapshot, nr_values long */
	bool have_before;
};

void ukvm_kvmstats_init(struct ukvm_kvmstats *s);
int ukvm_kvmstats_open(struct ukvm_kvmstats *s, int kvm_obj_fd, const char *what,
		       struct ukvm_error *err);
/* Every value (nr_values of them) now: 0 or -errno (err, if given, set). */
int ukvm_kvmstats_read(struct ukvm_kvmstats *s, uint64_t *values, struct ukvm_error *err);
/* Takes the snapshot the deltas count from: 0, -EBADF (not open) or the read's -errno. */
int ukvm_kvmstats_snapshot(struct ukvm_kvmstats *s);
/*
 * The scalar statistics (nr_scalars of them) relative to the snapshot: 0,
 * -EBADF (not open), -ENODATA (no snapshot) or the read's -errno.
 */
int ukvm_kvmstats_deltas(struct ukvm_kvmstats *s, uint64_t *out);
/* Index of a scalar statistic by name, or -ENOENT. */
int ukvm_kvmstats_find(const struct ukvm_kvmstats *s, const char *name);
/* A strdup'd copy of the scalar statistics' names, for a result; NULL if out of memory. */
char **ukvm_kvmstats_scalar_names(const struct ukvm_kvmstats *s);
/* Frees names from ukvm_kvmstats_scalar_names() (a result's, say). */
void ukvm_kvmstats_free_names(char **names, uint32_t nr);
void ukvm_kvmstats_close(struct ukvm_kvmstats *s);

#endif
