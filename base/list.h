/*
 * list.h -- the one intrusive doubly linked list every layer uses.
 *
 * A list is a circular chain of `klist` nodes through a head that is itself a node, so
 * insert and unlink never test for the ends and an unlinked node can be unlinked again
 * (klist_del leaves it pointing at itself). The node lives inside the object; KLIST_ENTRY
 * gets the object back. Nothing here locks: the owner of the list says which lock guards it.
 *
 *     head <-> a <-> b <-> c <-> (head)
 */
#ifndef KHOR_BASE_LIST_H
#define KHOR_BASE_LIST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct klist {
	struct klist *next, *prev;
} klist;

#define KLIST_INIT(name) { &(name), &(name) }
#define KLIST_ENTRY(node, type, member) ((type *)(void *)((char *)(node) - offsetof(type, member)))

/* Every node of `head` in order; the body may unlink the current node (`n`). */
#define KLIST_FOREACH_SAFE(n, tmp, head)                                                   \
	for ((n) = (head)->next, (tmp) = (n)->next; (n) != (head); (n) = (tmp), (tmp) = (n)->next)

static inline void klist_init(klist *l)
{
	l->next = l->prev = l;
}

static inline bool klist_empty(const klist *head)
{
	return head->next == head;
}

/* True while `n` is on a list (klist_init'ed or klist_del'ed nodes are on none). */
static inline bool klist_linked(const klist *n)
{
	return n->next != n;
}

static inline void klist_insert_between(klist *n, klist *prev, klist *next)
{
	n->prev = prev;
	n->next = next;
	prev->next = n;
	next->prev = n;
}

static inline void klist_add_tail(klist *head, klist *n)
{
	klist_insert_between(n, head->prev, head);
}

static inline void klist_add_head(klist *head, klist *n)
{
	klist_insert_between(n, head, head->next);
}

/* Unlinks `n` from whatever list holds it; a node on no list is left as it is. */
static inline void klist_del(klist *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	klist_init(n);
}

/* Moves every node of `from` to the empty list `to`, in order; `from` is left empty. */
static inline void klist_move(klist *to, klist *from)
{
	klist_init(to);
	if (klist_empty(from))
		return;
	to->next = from->next;
	to->prev = from->prev;
	to->next->prev = to;
	to->prev->next = to;
	klist_init(from);
}

/* The first node, or NULL when the list is empty. */
static inline klist *klist_first(const klist *head)
{
	return head->next == head ? NULL : head->next;
}

#endif
