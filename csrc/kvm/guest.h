/* SPDX-License-Identifier: MIT */
/* The guest code of guest.S, as the host copies it into the VM (vm.c). */
#ifndef UKVM_KVM_GUEST_H
#define UKVM_KVM_GUEST_H

#include <stdint.h>

extern const uint8_t ukvm_guest_code_start[];
extern const uint8_t ukvm_guest_code_end[];
/* Where each exception vector's stub starts, from ukvm_guest_code_start. */
extern const uint64_t ukvm_guest_exception_offsets[32];

#endif
