/*
 * desc.c -- a request's descriptor: what every rank must agree on about a named request
 * (kind, op, root, scale factors, and per tensor its name, dtype and shape), in the bytes the
 * cycle's reports and responses carry, and all that a rank without the tensor (a joined
 * one) needs to take part.
 *
 *   u8 kind, u8 op, u16 n, i32 root, f64 prescale, f64 postscale, then per tensor: u16 name
 *   length, the name, u8 dtype, u8 ndim, i64 dims[ndim]
 *
 * Dim 0 of allgather and alltoall may differ between ranks.
 */
#include "desc.h"

#include "bbuf.h"

#include "base/dtype.h"

#include <stdlib.h>
#include <string.h>

khor_status desc_make(khor_handle *h, kerr *err)
{
	bbuf b = { 0 };

	bput_u8(&b, (uint8_t)h->kind);
	bput_u8(&b, (uint8_t)h->op);
	bput_u16(&b, (uint16_t)h->n);
	bput_i32(&b, h->root);
	bput_f64(&b, h->prescale);
	bput_f64(&b, h->postscale);
	for (int i = 0; i < h->n; i++) {
		size_t nl = strlen(h->t[i].name);
		bput_u16(&b, (uint16_t)nl);
		bput(&b, h->t[i].name, nl);
		bput_u8(&b, (uint8_t)h->t[i].dtype);
		bput_u8(&b, (uint8_t)h->t[i].ndim);
		for (int d = 0; d < h->t[i].ndim; d++)
			bput_u64(&b, (uint64_t)h->t[i].dims[d]);
	}
	if (b.oom) {
		free(b.p);
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "enqueue: out of memory");
	}
	h->desc = b.p;
	h->desc_len = b.len;
	return KHOR_SUCCESS;
}

void desc_free_tensors(eitem *it)
{
	for (int i = 0; i < it->n; i++)
		free(it->t[i].name);
	free(it->t);
	it->t = NULL;
}

/* Parses d into it (kind, op, ...; tensors with names and shapes, no buffers). */
khor_status desc_parse(const uint8_t *d, size_t len, eitem *it, kerr *err)
{
	brd r = { d, len, 0, false };

	memset(it, 0, sizeof(*it));
	it->kind = bget_u8(&r);
	it->op = (khor_op)bget_u8(&r);
	it->n = bget_u16(&r);
	it->root = bget_i32(&r);
	it->prescale = bget_f64(&r);
	it->postscale = bget_f64(&r);
	/* Bounded before allocating: each tensor takes at least 4 bytes (name length, dtype,
	 * ndim), so a short descriptor cannot ask for 65535 tensors' worth of memory. */
	if (r.bad || it->kind >= EK_KINDS || it->n < 1 || (size_t)it->n > (len - r.off) / 4)
		goto bad;
	it->t = calloc((size_t)it->n, sizeof(*it->t));
	if (it->t == NULL)
		return kerr_set(err, KHOR_ERR_NO_MEMORY, "negotiation: out of memory");
	for (int i = 0; i < it->n; i++) {
		etensor *t = &it->t[i];
		uint16_t nl = bget_u16(&r);
		if (r.bad || r.off + nl > len)
			goto bad_free;
		t->name = malloc((size_t)nl + 1);
		if (t->name == NULL) {
			desc_free_tensors(it);
			return kerr_set(err, KHOR_ERR_NO_MEMORY, "negotiation: out of memory");
		}
		memcpy(t->name, d + r.off, nl);
		t->name[nl] = '\0';
		r.off += nl;
		t->dtype = (khor_dtype)bget_u8(&r);
		t->ndim = bget_u8(&r);
		size_t esz = kdtype_size(t->dtype);
		if (t->ndim > ENG_MAX_DIMS || esz == 0)
			goto bad_free;
		t->count = 1;
		for (int k = 0; k < t->ndim; k++) {
			t->dims[k] = (int64_t)bget_u64(&r);
			/* In bytes too: the count sizes buffers. */
			if (t->dims[k] < 0 || (t->dims[k] > 0 &&
			                       t->count > SIZE_MAX / esz / (size_t)t->dims[k]))
				goto bad_free;
			t->count *= (size_t)t->dims[k];
		}
	}
	if (r.bad || r.off != len)
		goto bad_free;
	return KHOR_SUCCESS;
bad_free:
	desc_free_tensors(it);
bad:
	return kerr_set(err, KHOR_ERR_PROTOCOL, "negotiation: a malformed tensor descriptor");
}

/* The key (names joined by '\n') of a descriptor, malloc'd; NULL when malformed. */
char *desc_key(const uint8_t *d, size_t len)
{
	brd r = { d, len, 0, false };
	bbuf k = { 0 };

	bget_u8(&r);
	bget_u8(&r);
	uint16_t n = bget_u16(&r);
	r.off += 4 + 16;
	for (int i = 0; i < n && !r.bad; i++) {
		uint16_t nl = bget_u16(&r);
		if (r.off + nl > len) {
			r.bad = true;
			break;
		}
		if (i > 0)
			bput_u8(&k, '\n');
		bput(&k, d + r.off, nl);
		r.off += nl;
		bget_u8(&r);
		uint8_t nd = bget_u8(&r);
		r.off += 8u * nd;
	}
	bput_u8(&k, 0);
	if (r.bad || k.oom || r.off > len) {
		free(k.p);
		return NULL;
	}
	return (char *)k.p;
}
