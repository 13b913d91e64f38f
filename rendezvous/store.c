/*
 * store.c -- the store_* wrappers every caller uses (see store.h). They put each key under
 * "<job id>/<generation>/" so two jobs sharing a store, or two generations of one elastic
 * job, never read each other's keys, and they check the full key against STORE_KEY_MAX
 * here so every backend sees only keys it accepts.
 */
#include "store.h"

#include <stdio.h>
#include <string.h>

/*
 * A valid prefix is empty or ends with '/'. A job id that cannot make one leaves this
 * marker instead, so every later operation fails loudly rather than running under a
 * truncated prefix that another job might share.
 */
#define STORE_PREFIX_INVALID "!"

static void make_prefix(char *out, size_t len, const char *job_id, int generation)
{
	int n;

	if (job_id == NULL || strchr(job_id, '/') != NULL) {
		strcpy(out, STORE_PREFIX_INVALID);
		return;
	}
	n = snprintf(out, len, "%s/%d/", job_id, generation);
	if (n < 0 || (size_t)n >= len)
		strcpy(out, STORE_PREFIX_INVALID);
}

void store_set_prefix(store *s, const char *job_id, int generation)
{
	make_prefix(s->prefix, sizeof(s->prefix), job_id, generation);
	make_prefix(s->job_prefix, sizeof(s->job_prefix), job_id, 0);
}

/* Builds prefix + key into full (STORE_KEY_MAX + 1 bytes) or explains why it cannot. */
static khor_status full_key(const char *prefix, const char *op, const char *key, char *full,
                            kerr *err)
{
	int n;

	if (strcmp(prefix, STORE_PREFIX_INVALID) == 0)
		return kerr_set(err, KHOR_ERR_INVALID_ARG,
		                "store %s '%s': the job id given to store_set_prefix cannot make a "
		                "key prefix: it must not contain '/', and '<job id>/<generation>/' "
		                "must fit in %zu characters",
		                op, key != NULL ? key : "(null)", (size_t)STORE_PREFIX_MAX - 1);
	if (key == NULL || *key == '\0')
		return kerr_set(err, KHOR_ERR_INVALID_ARG, "store %s: empty key", op);
	n = snprintf(full, STORE_KEY_MAX + 1, "%s%s", prefix, key);
	if (n < 0 || n > STORE_KEY_MAX)
		return kerr_set(err, KHOR_ERR_INVALID_ARG,
		                "store %s '%s%.64s...': the key is %d bytes with its prefix, over the "
		                "limit of %d",
		                op, prefix, key, n, STORE_KEY_MAX);
	return KHOR_SUCCESS;
}

void store_base_init(store *s, const struct store_ops *ops)
{
	s->ops = ops;
	pthread_mutex_init(&s->mu, NULL);
}

khor_status store_set(store *s, const char *key, const void *val, size_t len, kerr *err)
{
	char full[STORE_KEY_MAX + 1];
	khor_status st = full_key(s->prefix, "set", key, full, err);

	if (st != KHOR_SUCCESS)
		return st;
	pthread_mutex_lock(&s->mu);
	st = s->ops->set(s, full, val, len, err);
	pthread_mutex_unlock(&s->mu);
	return st;
}

khor_status store_get(store *s, const char *key, kdeadline dl, void **val_out, size_t *len_out,
                      kerr *err)
{
	char full[STORE_KEY_MAX + 1];
	khor_status st = full_key(s->prefix, "get", key, full, err);

	if (st != KHOR_SUCCESS)
		return st;
	for (;;) {
		int64_t left = kdeadline_left_ms(dl, STORE_WAIT_SLICE_MS + 1);
		bool last = left <= STORE_WAIT_SLICE_MS;
		pthread_mutex_lock(&s->mu);
		s->get_until = dl;
		st = s->ops->get(s, full, last ? dl : kdeadline_in_ms(STORE_WAIT_SLICE_MS), val_out,
		                 len_out, err);
		pthread_mutex_unlock(&s->mu);
		if (st != KHOR_ERR_TIMEOUT || last)
			return st;
	}
}

static khor_status add_full(store *s, const char *prefix, const char *key, int64_t delta,
                           int64_t *value_out, kerr *err)
{
	char full[STORE_KEY_MAX + 1];
	khor_status st = full_key(prefix, "add", key, full, err);

	if (st != KHOR_SUCCESS)
		return st;
	pthread_mutex_lock(&s->mu);
	st = s->ops->add(s, full, delta, value_out, err);
	pthread_mutex_unlock(&s->mu);
	return st;
}

khor_status store_add(store *s, const char *key, int64_t delta, int64_t *value_out, kerr *err)
{
	return add_full(s, s->prefix, key, delta, value_out, err);
}

khor_status store_add_job(store *s, const char *key, int64_t delta, int64_t *value_out,
                          kerr *err)
{
	return add_full(s, s->job_prefix, key, delta, value_out, err);
}

khor_status store_del(store *s, const char *key, kerr *err)
{
	char full[STORE_KEY_MAX + 1];
	khor_status st = full_key(s->prefix, "del", key, full, err);

	if (st != KHOR_SUCCESS)
		return st;
	pthread_mutex_lock(&s->mu);
	st = s->ops->del(s, full, err);
	pthread_mutex_unlock(&s->mu);
	return st;
}

void store_interrupt(store *s)
{
	/* Without mu: the call to be cut short holds it. */
	if (s != NULL && s->ops->interrupt != NULL)
		s->ops->interrupt(s);
}

void store_close(store *s)
{
	if (s != NULL) {
		pthread_mutex_destroy(&s->mu);
		s->ops->close(s);
	}
}
