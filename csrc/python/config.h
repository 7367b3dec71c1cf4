/* SPDX-License-Identifier: MIT */
/*
 * The config side of the binding: a dict of every core field (the schema's
 * table, config_schema.h) into a struct ukvm_config, and back.
 */
#ifndef UKVM_PYTHON_CONFIG_H
#define UKVM_PYTHON_CONFIG_H

#include "python/common.h"

/*
 * cfg from dict, the argument of fn() (named in a TypeError for a non-dict):
 * 0, or -1 with KeyError (a missing or unknown key), TypeError or ValueError.
 */
int pyconfig_from_dict(PyObject *dict, const char *fn, struct ukvm_config *cfg);
/* Frees the lists pyconfig_from_dict() made. */
void pyconfig_free(struct ukvm_config *cfg);
/* Every core field of cfg, by the struct member's name: run()'s raw["config"]. */
PyObject *pyconfig_to_dict(const struct ukvm_config *cfg);

#endif
