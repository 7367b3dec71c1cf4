/* SPDX-License-Identifier: MIT */
/*
 * Latency histograms (struct ukvm_hist, ukvm.h): cheap enough to keep one
 * per thread on the hot path.
 */
#ifndef UKVM_BASE_HIST_H
#define UKVM_BASE_HIST_H

#include <stdint.h>

#include "ukvm.h"

/* The bucket v falls in. */
unsigned ukvm_hist_bucket(uint64_t v);
void ukvm_hist_add(struct ukvm_hist *h, uint64_t v);
/* h gets every value of x too. */
void ukvm_hist_merge(struct ukvm_hist *h, const struct ukvm_hist *x);

#endif
