/* SPDX-License-Identifier: MIT */
/*
 * The guest's access models beyond whole-region walks (access.c): a seeded
 * working set (touch_percent) and a Zipf hot/cold skew (access "zipf"). The
 * host computes each vCPU's access list (u32 page indices from the vCPU's
 * first page) into guest memory and the guest walks it (GUEST_PATTERN_LIST);
 * the same lists give the per-page visit counts verification checks.
 */
#ifndef UKVM_EXPERIMENT_ACCESS_H
#define UKVM_EXPERIMENT_ACCESS_H

#include <stdbool.h>
#include <stdint.h>

#include "ukvm.h"

/* Does cfg need access lists (anything but every page once per pass)? */
bool ukvm_access_listed(const struct ukvm_config *cfg);

/* Entries a vCPU's list can have, at most: its pages, or cfg->accesses. */
uint64_t ukvm_access_max_entries(const struct ukvm_config *cfg);

/* Is the page at gpa in the seeded working set (touch_percent)? */
bool ukvm_access_in_set(uint64_t gpa, uint32_t touch_percent, uint64_t touch_key);

/*
 * vCPU vcpu's list for one pass over its pages (pages of 4 KiB from
 * first_gpa): writes at most ukvm_access_max_entries() indices to list,
 * returns how many, and adds one to visits[k] for each access to page k.
 * Returns -ENOMEM (nothing written) if a scratch allocation fails.
 */
int64_t ukvm_access_build(const struct ukvm_config *cfg, uint32_t vcpu, uint64_t first_gpa,
			  uint64_t pages, uint64_t touch_key, uint32_t *list, uint32_t *visits);

#endif
