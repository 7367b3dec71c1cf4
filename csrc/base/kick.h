/* SPDX-License-Identifier: MIT */
/*
 * The kick: the private signal that interrupts KVM_RUN and read(2), and
 * the signal masks of the core's threads.
 */
#ifndef UKVM_BASE_KICK_H
#define UKVM_BASE_KICK_H

#include <signal.h>

#include "ukvm.h"

/* Installs the kick's handler once per process: 0, or -errno with err set. */
int ukvm_kick_init(struct ukvm_error *err);
/* The kick's signal number, for pthread_kill(). */
int ukvm_kick_signal(void);
/*
 * Called first by every thread the core starts: block all signals but the
 * kick and the synchronous ones (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP,
 * SIGSYS, SIGABRT), which must reach their handlers.
 */
void ukvm_kick_thread_init(void);
/* The controller's own mask, inherited by the threads it makes: the same, kick blocked too. */
void ukvm_kick_block_all(sigset_t *old);

#endif
