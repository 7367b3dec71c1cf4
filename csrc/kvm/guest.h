/* SPDX-License-Identifier: MIT */
/* The guest code of guest.S, as the host copies it into the VM (vm.c). */
#ifndef UKVM_KVM_GUEST_H
#define UKVM_KVM_GUEST_H

#include <stdint.h>

#include "kvm/guest_abi.h"

extern const uint8_t ukvm_guest_code_start[];
extern const uint8_t ukvm_guest_code_end[];
/* Where each exception vector's stub starts, from ukvm_guest_code_start. */
extern const uint64_t ukvm_guest_exception_offsets[32];

/*
 * The walk's accesses to the test region: where each instruction is (from
 * ukvm_guest_code_start) and whether it writes. At each the page's address
 * is in %rax.
 */
struct ukvm_guest_access_site {
	uint64_t offset;
	uint64_t write;
};
extern const struct ukvm_guest_access_site ukvm_guest_access_sites[UKVM_GUEST_ACCESS_SITES];

#endif
