/* SPDX-License-Identifier: MIT */
/* The core's own guard on a config (config.c); defaults and names are in ukvm.h. */
#ifndef UKVM_EXPERIMENT_CONFIG_H
#define UKVM_EXPERIMENT_CONFIG_H

#include "ukvm.h"

/*
 * 0, or -EINVAL with a UKVM_ERR_CONFIG error whose message starts with the
 * field's name (ukvm.h declares it too: the binding calls it alone).
 */
int ukvm_config_validate(const struct ukvm_config *c, struct ukvm_error *err);

#endif
