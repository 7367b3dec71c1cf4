/* SPDX-License-Identifier: MIT */
/*
 * Copies out of a mapping of a file that someone else may truncate: a
 * page past the file's new end is an error (-EIO), never the process's
 * SIGBUS. The guard's handler is installed by the first hold and stays for
 * the life of the process, and any SIGBUS that is not a guarded copy's goes
 * on to the handler that was there before it.
 */
#ifndef UKVM_BASE_MAPGUARD_H
#define UKVM_BASE_MAPGUARD_H

#include <stddef.h>

/*
 * Takes a hold on the guard, installing its SIGBUS handler if no hold has
 * before: 0, or -errno (sigaction's). Each hold is released once.
 */
int ukvm_mapguard_hold(void);
/* Lets go of a hold. The handler stays: it is never uninstalled or installed twice. */
void ukvm_mapguard_release(void);
/*
 * len bytes from src, a mapping of a file, into dst, with a hold taken: 0,
 * or -EIO when the kernel had no file page for a byte of src (the file was
 * truncated or shrunk under the mapping). dst is left partly written.
 */
int ukvm_mapguard_copy(void *dst, const void *src, size_t len);

#endif
