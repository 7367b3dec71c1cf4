/* SPDX-License-Identifier: MIT */
/* The core's own guard on a config (config.c); defaults and names are in ukvm.h. */
#ifndef UKVM_EXPERIMENT_CONFIG_H
#define UKVM_EXPERIMENT_CONFIG_H

#include "ukvm.h"

/*
 * 0, or -EINVAL with a UKVM_ERR_CONFIG error naming the field; or, for a
 * sound config this build cannot run (wait io_uring without liburing),
 * -EOPNOTSUPP with a UKVM_ERR_HOST error that says so.
 */
int ukvm_config_validate(const struct ukvm_config *c, struct ukvm_error *err);

#endif
