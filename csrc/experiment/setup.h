/* SPDX-License-Identifier: MIT */
/* Building an experiment and taking it apart (setup.c). */
#ifndef UKVM_EXPERIMENT_SETUP_H
#define UKVM_EXPERIMENT_SETUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "experiment/state.h"
#include "ukvm.h"

/*
 * Before anything is built or sized from cfg->vcpus: does KVM allow that
 * many (KVM_CAP_MAX_VCPUS of /dev/kvm)? 0, or UKVM_ERR_CONFIG naming vcpus.
 */
int ukvm_setup_check_vcpus(const struct ukvm_config *cfg, struct ukvm_error *err);
/* The most fds a run (or probe) of cfg holds at once; why: what they are. */
uint64_t ukvm_setup_fds_needed(const struct ukvm_config *cfg, bool probe, char *why,
			       size_t why_len);
/* The threads a run of cfg starts, KVM's worker for the VM included; why: what they are. */
uint64_t ukvm_setup_threads_needed(const struct ukvm_config *cfg, char *why, size_t why_len);
/* Builds everything exp->cfg asks for (a probe: up to registering the uffds). */
int ukvm_setup_build(struct ukvm_experiment *exp, struct ukvm_error *err);
/* Releases everything (no thread may still run); with keep_memory, all but the region's memory. */
void ukvm_setup_teardown(struct ukvm_experiment *exp, bool keep_memory);

#endif
