/* SPDX-License-Identifier: MIT */
/*
 * Snapshot files: raw memory images whose words are a seeded function of
 * their offset (snapshot.c), for source file. ukvm.h declares the writer,
 * ukvm_snapshot_write().
 */
#ifndef UKVM_UFFD_SNAPSHOT_H
#define UKVM_UFFD_SNAPSHOT_H

#include <stdint.h>

/*
 * The 8-byte word at byte offset off (a multiple of 8) of a snapshot made
 * with seed: a 64-bit mix of both, so that every page differs from every
 * other (and from the synthetic fill), whatever the seed.
 */
uint64_t ukvm_snapshot_word(uint64_t seed, uint64_t off);

#endif
