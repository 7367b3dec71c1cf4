/* SPDX-License-Identifier: MIT */
/*
 * An intrusive doubly linked list, for the page server: the model's queues
 * (model.c) and the server's connections and their requests (server.c, conn.c).
 * A node alone is its own list (list_init), so list_del may run twice.
 */
#ifndef UKVM_REMOTE_LIST_H
#define UKVM_REMOTE_LIST_H

#include <stdbool.h>
#include <stddef.h>

struct list {
	struct list *prev, *next;
};

static inline void list_init(struct list *l) { l->prev = l->next = l; }
static inline bool list_empty(const struct list *l) { return l->next == l; }

static inline void list_add_tail(struct list *l, struct list *n)
{
	n->prev = l->prev;
	n->next = l;
	l->prev->next = n;
	l->prev = n;
}

static inline void list_del(struct list *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	list_init(n);
}

#define list_entry(p, type, member) ((type *)((char *)(p) - offsetof(type, member)))

#endif
