/* SPDX-License-Identifier: MIT */
/*
 * KVM's binary statistics (KVM_GET_STATS_FD, Linux 5.14+): a header, a
 * descriptor per statistic (name, type, unit, size in u64s, offset) and a
 * data block that can be re-read with one pread() at any time. The core
 * snapshots it before a run and reports, after it, the scalar statistics:
 * cumulative ones as deltas, instant and peak ones as they stand.
 */
#include <errno.h>
#include <linux/kvm.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "base/errors.h"
#include "kvm/kvmstats.h"
#include "uapi_compat.h"

void ukvm_kvmstats_init(struct ukvm_kvmstats *s)
{
	memset(s, 0, sizeof(*s));
	s->fd = -1;
}

static int stats_pread(int fd, void *buf, size_t len, uint64_t off)
{
	ssize_t n = pread(fd, buf, len, (off_t)off);

	if (n < 0)
		return -errno;
	return (size_t)n == len ? 0 : -EIO;
}

int ukvm_kvmstats_open(struct ukvm_kvmstats *s, int kvm_obj_fd, const char *what,
		       struct ukvm_error *err)
{
	struct kvm_stats_header hdr;
	struct kvm_stats_desc *d;
	size_t desc_size;
	uint8_t *descs = NULL;
	uint32_t i, end;
	int ret;

	ukvm_kvmstats_init(s);
	s->fd = ioctl(kvm_obj_fd, KVM_GET_STATS_FD, NULL);
	if (s->fd < 0) {
		ret = -errno;
		ukvm_err_set(err, UKVM_ERR_HOST, -ret, "%s: KVM_GET_STATS_FD", what);
		return ret;
	}
	ret = stats_pread(s->fd, &hdr, sizeof(hdr), 0);
	if (ret)
		goto io_error;

	desc_size = sizeof(*d) + hdr.name_size;
	descs = malloc(desc_size * hdr.num_desc);
	s->names = calloc(hdr.num_desc, sizeof(*s->names));
	s->offsets = calloc(hdr.num_desc, sizeof(*s->offsets));
	s->sizes = calloc(hdr.num_desc, sizeof(*s->sizes));
	s->flags = calloc(hdr.num_desc, sizeof(*s->flags));
	if (!descs || !s->names || !s->offsets || !s->sizes || !s->flags) {
		ret = -ENOMEM;
		ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "%s: allocating KVM stats", what);
		goto error;
	}
	ret = stats_pread(s->fd, descs, desc_size * hdr.num_desc, hdr.desc_offset);
	if (ret)
		goto io_error;

	s->nr = hdr.num_desc;
	s->data_offset = hdr.data_offset;
	for (i = 0; i < hdr.num_desc; i++) {
		d = (struct kvm_stats_desc *)(descs + i * desc_size);
		s->names[i] = strndup(d->name, hdr.name_size);
		if (!s->names[i]) {
			ret = -ENOMEM;
			ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "%s: allocating KVM stats", what);
			goto error;
		}
		s->offsets[i] = d->offset / sizeof(uint64_t);
		s->sizes[i] = d->size;
		s->flags[i] = d->flags;
		end = s->offsets[i] + d->size;
		if (end > s->nr_values)
			s->nr_values = end;
	}
	free(descs);

	s->scalars = calloc(s->nr ?: 1, sizeof(*s->scalars));
	s->before = calloc(s->nr_values ?: 1, sizeof(*s->before));
	if (!s->scalars || !s->before) {
		ukvm_kvmstats_close(s);
		return ukvm_err_set(err, UKVM_ERR_RUN, ENOMEM, "%s: allocating KVM stats", what);
	}
	for (i = 0; i < s->nr; i++)
		if (s->sizes[i] == 1)
			s->scalars[s->nr_scalars++] = i;
	return 0;

io_error:
	ukvm_err_set(err, UKVM_ERR_HOST, -ret, "%s: pread(KVM stats fd, the header and "
		     "descriptors)", what);
error:
	free(descs);
	ukvm_kvmstats_close(s);
	return ret;
}

int ukvm_kvmstats_read(struct ukvm_kvmstats *s, uint64_t *values, struct ukvm_error *err)
{
	int ret = stats_pread(s->fd, values, s->nr_values * sizeof(uint64_t), s->data_offset);

	if (ret)
		ukvm_err_set(err, UKVM_ERR_RUN, -ret, "pread(KVM stats fd, the data)");
	return ret;
}

int ukvm_kvmstats_snapshot(struct ukvm_kvmstats *s)
{
	int ret;

	if (s->fd < 0)
		return -EBADF;
	ret = ukvm_kvmstats_read(s, s->before, NULL);
	s->have_before = ret == 0;
	return ret;
}

int ukvm_kvmstats_deltas(struct ukvm_kvmstats *s, uint64_t *out)
{
	uint64_t now[s->nr_values + 1];
	uint32_t i;
	int ret;

	if (s->fd < 0)
		return -EBADF;
	if (!s->have_before)
		return -ENODATA;
	ret = ukvm_kvmstats_read(s, now, NULL);
	if (ret)
		return ret;
	for (i = 0; i < s->nr_scalars; i++) {
		uint32_t d = s->scalars[i], off = s->offsets[d];

		if ((s->flags[d] & KVM_STATS_TYPE_MASK) == KVM_STATS_TYPE_CUMULATIVE)
			out[i] = now[off] - s->before[off];
		else
			out[i] = now[off];
	}
	return 0;
}

int ukvm_kvmstats_find(const struct ukvm_kvmstats *s, const char *name)
{
	uint32_t i;

	for (i = 0; i < s->nr_scalars; i++)
		if (!strcmp(s->names[s->scalars[i]], name))
			return (int)i;
	return -ENOENT;
}

char **ukvm_kvmstats_scalar_names(const struct ukvm_kvmstats *s)
{
	char **names = calloc(s->nr_scalars ?: 1, sizeof(*names));
	uint32_t i;

	for (i = 0; names && i < s->nr_scalars; i++) {
		names[i] = strdup(s->names[s->scalars[i]]);
		if (!names[i]) {
			ukvm_kvmstats_free_names(names, i);
			return NULL;
		}
	}
	return names;
}

void ukvm_kvmstats_free_names(char **names, uint32_t nr)
{
	uint32_t i;

	for (i = 0; names && i < nr; i++)
		free(names[i]);
	free(names);
}

void ukvm_kvmstats_close(struct ukvm_kvmstats *s)
{
	uint32_t i;

	if (s->fd >= 0)
		close(s->fd);
	for (i = 0; s->names && i < s->nr; i++)
		free(s->names[i]);
	free(s->names);
	free(s->offsets);
	free(s->sizes);
	free(s->flags);
	free(s->scalars);
	free(s->before);
	ukvm_kvmstats_init(s);
}
