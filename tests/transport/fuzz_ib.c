/*
 * fuzz_ib.c -- libFuzzer harness for the verbs transport's parsers of what a peer sends on
 * a ready link: the header in front of every eager message and CTS (struct msg_hdr, with
 * its credit counts), the CTS that starts a rendezvous, the immediates of the RDMA writes
 * that end one, and the credit words the peer RDMA-writes. ib_p2p.c is included whole and
 * runs against a pretend device: its verbs (post_send, post_recv, poll_cq) are the
 * harness's, which keeps what was posted and completes it when the input says so. No
 * RDMA hardware or rdma-core library is needed, only its headers.
 *
 * Before the input a link of 1-3 QPs (byte 0) has an eager receive, a rendezvous receive,
 * an eager send and a rendezvous send posted. Then the input is events, each a byte (mod
 * 6) and its bytes:
 *
 *   0  a message in a receive slot, as many times as the event byte / 6 + 1: u16 byte_len,
 *      then up to 128 header bytes and the payload (the rest of the slot is what the last
 *      message left);
 *   1  an RDMA write's immediate: u32 (on QP 0's slot or another QP's immediate receive);
 *   2  a completion of the oldest work request posted, u8 status (0 = success);
 *   3  the peer's credit words: u32 per QP;
 *   4  a receive posted: u8 which tag, u8 which length (eager or rendezvous);
 *   5  a send posted, the same.
 *
 * Invariants: no write outside a posted buffer (guards after each), what the link keeps
 * for messages and CTSs that came before their receive or send stays within its bounds,
 * and a request that completes with success has the length it was posted with.
 *
 *   .ci/fuzz builds it with transport/ib/ib_common.c, ib_reg.c, ib_gdr.c and
 *   transport/skel.c (it needs <infiniband/verbs.h>: rdma-core's headers)
 *   ./fuzz_ib -max_total_time=60
 */
#include "transport/ib/ib_p2p.c"

#include <stdio.h>

#define CHECK(c)                         \
	do {                             \
		if (!(c))                \
			__builtin_trap(); \
	} while (0)

#define GUARD 64
#define BIG (1u << 20) /* a rendezvous length: over IB_EAGER_MAX */
#define MAX_WR 4096

/* ---- the pretend device -------------------------------------------------------------- */

static struct ibv_context dev;
static struct ibv_qp qps[IB_MAX_QPS];
static struct ibv_cq cq;
static struct ibv_mr mr = { .lkey = 1, .rkey = 2 };
static struct {
	uint64_t wr_id;
	uint32_t qp_num;
	bool recv;
} wrs[MAX_WR];
static int nwr;

static int fake_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	for (; wr != NULL; wr = wr->next) {
		if (nwr == MAX_WR) {
			*bad = wr;
			return ENOMEM;
		}
		wrs[nwr].wr_id = wr->wr_id;
		wrs[nwr].qp_num = qp->qp_num;
		wrs[nwr++].recv = false;
	}
	return 0;
}

static int fake_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	(void)qp;
	(void)wr;
	(void)bad;
	return 0; /* receives are completed by the input, not from this list */
}

static int fake_poll_cq(struct ibv_cq *c, int n, struct ibv_wc *wc)
{
	(void)c;
	(void)n;
	(void)wc;
	return 0;
}

static int fake_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
	(void)qp;
	(void)a;
	(void)mask;
	return 0;
}

static int fake_dereg_mr(struct ibv_mr *m)
{
	(void)m;
	__builtin_trap(); /* every buffer here comes with its registration */
}

static const char *fake_wc_status_str(enum ibv_wc_status s)
{
	(void)s;
	return "fake status";
}

static const struct ib_api api = { .modify_qp = fake_modify_qp, .dereg_mr = fake_dereg_mr,
	                           .wc_status_str = fake_wc_status_str };

/* ---- one link ------------------------------------------------------------------------ */

static tp_ctx ctx;
static uint8_t *slotmem;
static uint8_t *bigbuf; /* the rendezvous buffers, each BIG + GUARD */
static tp_mr bigmr;

static void setup(void)
{
	kerr err;

	klog_threshold = -1;
	dev.ops.post_send = fake_post_send;
	dev.ops.post_recv = fake_post_recv;
	dev.ops.poll_cq = fake_poll_cq;
	for (int q = 0; q < IB_MAX_QPS; q++) {
		qps[q].context = &dev;
		qps[q].qp_num = 100 + (uint32_t)q;
	}
	cq.context = &dev;
	CHECK(tp_skel_init(&ctx.sk, &err) == KHOR_SUCCESS);
	ctx.api = &api;
	ctx.rank = 0;
	ctx.size = 2;
	slotmem = malloc((size_t)(IB_SLOTS + IB_SEND_SLOTS) * IB_SLOT_BYTES + 64);
	bigbuf = malloc(4 * (size_t)(BIG + GUARD));
	CHECK(slotmem != NULL && bigbuf != NULL);
	bigmr.mr = &mr;
	bigmr.buf = bigbuf;
	bigmr.len = 4 * (size_t)(BIG + GUARD);
}

static void link_init(tp_link *l, int nqp)
{
	memset(l, 0, sizeof(*l));
	l->ctx = &ctx;
	l->peer = 1;
	l->fd = -1;
	l->state = LS_READY;
	snprintf(l->peer_addr, sizeof(l->peer_addr), "fuzzer");
	l->cq = &cq;
	l->nqp = nqp;
	l->max_wr_bytes = 1u << 18;
	l->mem = slotmem;
	l->mem_mr = &mr;
	klist_init(&l->recvs);
	klist_init(&l->sends_eager);
	klist_init(&l->sends_rdv);
	klist_init(&l->ctl_q);
	klist_init(&l->uq);
	for (int q = 0; q < nqp; q++) {
		l->qps[q].qp = &qps[q];
		l->qps[q].link = l;
		l->qps[q].idx = q;
		l->qps[q].peer_posted = q == 0 ? IB_SLOTS : IB_IMM_WQES;
	}
	for (int i = 0; i < IB_SLOTS; i++) {
		l->rslots[i] = (struct slot){ l, i, slotmem + (size_t)i * IB_SLOT_BYTES, NULL };
		l->qps[0].rx_posted++;
	}
	for (int i = 0; i < IB_SEND_SLOTS; i++) {
		l->sslots[i] = (struct slot){ l, i, slotmem + (size_t)(IB_SLOTS + i) * IB_SLOT_BYTES,
			                      l->sfree };
		l->sfree = &l->sslots[i];
	}
	static uint32_t credit_words[IB_MAX_QPS * 2];
	memset(credit_words, 0, sizeof(credit_words));
	l->credit_in = credit_words;
	l->credit_out = credit_words + IB_MAX_QPS;
	for (int q = 0; q < nqp; q++)
		l->credit_in[q] = l->qps[q].peer_posted;
	for (int q = 0; q < nqp; q++)
		l->qps[q].rx_told = l->qps[q].rx_posted;
}

/* The requests this input posted, with their buffers. */
#define MAX_REQS 64
static struct posted {
	tp_req *r;
	uint8_t *buf;
	size_t len;
	bool big, heap;
} reqs[MAX_REQS];
static int nreqs;

static const tp_tag tags[4] = { { 1, 1, 0, 7 }, { 1, 1, 1, 7 }, { 1, 2, 0, 7 }, { 2, 1, 0, 9 } };

static void post(tp_link *l, bool send, int t, int which)
{
	kerr err;
	tp_req *r = NULL;
	size_t len = which % 3 == 0 ? 64 : which % 3 == 1 ? 0 : BIG;
	bool big = len > IB_EAGER_MAX;
	uint8_t *buf;
	int nbig = 0;

	if (nreqs == MAX_REQS)
		return;
	for (int i = 0; i < nreqs; i++)
		nbig += reqs[i].big;
	if (big && nbig >= 4)
		return;
	if (big) {
		/* a free quarter of bigbuf */
		bool used[4] = { false };
		for (int i = 0; i < nreqs; i++)
			if (reqs[i].big)
				used[(reqs[i].buf - bigbuf) / (BIG + GUARD)] = true;
		int q = 0;
		while (used[q])
			q++;
		buf = bigbuf + (size_t)q * (BIG + GUARD);
	} else {
		buf = malloc(len + GUARD);
		CHECK(buf != NULL);
	}
	/* The guard (and a small buffer's bytes): a megabyte's contents don't matter. */
	memset(big ? buf + len : buf, send ? 0x11 : 0xa5, big ? GUARD : len + GUARD);
	khor_status st = send ? ib_isend_locked(l, buf, len, tags[t % 4], big ? &bigmr : NULL, &r,
	                                        &err)
	                      : ib_irecv_locked(l, buf, len, tags[t % 4], big ? &bigmr : NULL, &r,
	                                        &err);
	if (st != KHOR_SUCCESS) {
		if (!big)
			free(buf);
		return;
	}
	reqs[nreqs++] = (struct posted){ r, buf, len, big, !big };
}

/* The peer's message in receive slot s: byte_len, the bytes (header and payload). */
static void deliver(tp_link *l, const uint8_t *d, size_t n, size_t *off, int times)
{
	if (*off + 2 > n)
		return;
	uint16_t byte_len;
	memcpy(&byte_len, d + *off, 2);
	*off += 2;
	size_t at = *off;
	size_t take = n - *off < (size_t)byte_len ? n - *off : (size_t)byte_len;
	/* A slot that is posted (not held for an early message). */
	struct slot *s = NULL;
	for (int i = 0; i < IB_SLOTS && s == NULL; i++) {
		bool held = false;
		for (klist *k = l->uq.next; k != &l->uq; k = k->next)
			held |= KLIST_ENTRY(k, struct unexp, node)->held == &l->rslots[i];
		if (!held)
			s = &l->rslots[i];
	}
	if (s == NULL)
		return;
	*off += take;
	for (int t = 0; t < times && live(l); t++) {
		memcpy(s->mem, d + at, take);
		struct ibv_wc wc = { .wr_id = WR_ID(s, WR_RSLOT), .status = IBV_WC_SUCCESS,
			             .opcode = IBV_WC_RECV, .byte_len = byte_len, .qp_num = 100 };
		on_wc(l, &wc);
		if (klist_linked(&l->uq) && !klist_empty(&l->uq) &&
		    KLIST_ENTRY(l->uq.prev, struct unexp, node)->held == s)
			break; /* the slot is held now: the same bytes can't come in it again */
	}
}

static void immediate(tp_link *l, const uint8_t *d, size_t n, size_t *off)
{
	uint32_t imm;

	if (*off + 4 > n)
		return;
	memcpy(&imm, d + *off, 4);
	*off += 4;
	if (imm & 0x80000000u) {
		struct ibv_wc wc = { .wr_id = WR_ID(&l->rslots[0], WR_RSLOT), .status = IBV_WC_SUCCESS,
			             .opcode = IBV_WC_RECV_RDMA_WITH_IMM, .wc_flags = IBV_WC_WITH_IMM,
			             .imm_data = htonl(imm & 0x7fffffffu), .qp_num = 100 };
		on_wc(l, &wc);
	} else {
		int q = l->nqp > 1 ? 1 + (int)(imm % (uint32_t)(l->nqp - 1)) : 0;
		struct ibv_wc wc = { .wr_id = q > 0 ? WR_ID(&l->qps[q], WR_RIMM)
		                                    : WR_ID(&l->rslots[0], WR_RSLOT),
			             .status = IBV_WC_SUCCESS, .opcode = IBV_WC_RECV_RDMA_WITH_IMM,
			             .wc_flags = IBV_WC_WITH_IMM, .imm_data = htonl(imm),
			             .qp_num = 100 + (uint32_t)q };
		on_wc(l, &wc);
	}
}

static void complete_oldest(tp_link *l, enum ibv_wc_status st)
{
	if (nwr == 0)
		return;
	struct ibv_wc wc = { .wr_id = wrs[0].wr_id, .status = st, .qp_num = wrs[0].qp_num };
	memmove(wrs, wrs + 1, sizeof(wrs[0]) * (size_t)(nwr - 1));
	nwr--;
	on_wc(l, &wc);
}

static void check_link(const tp_link *l)
{
	size_t nu = 0, bytes = 0;

	for (klist *k = l->uq.next; k != &l->uq; k = k->next) {
		const struct unexp *u = KLIST_ENTRY(k, struct unexp, node);
		nu++;
		if (u->held == NULL)
			bytes += UNEXP_COST(u->hdr.len);
		CHECK(u->hdr.len <= IB_EAGER_MAX);
	}
	/* Copies aside, each with its record, within the bound; the rest hold their slots. */
	CHECK(bytes == l->ubytes && l->ubytes <= IB_UNEXPECTED_MAX);
	CHECK(nu <= IB_SLOTS + IB_UNEXPECTED_MAX / sizeof(struct unexp));
	CHECK(l->ncts_early >= 0 && l->ncts_early <= IB_CTS_EARLY_MAX);
	for (int q = 0; q < l->nqp; q++)
		CHECK(l->qps[q].sq_out >= 0);
}

/* Nothing was written past a posted buffer. */
static void check_guards(void)
{
	static uint8_t rx[GUARD], tx[GUARD];

	if (rx[0] == 0) {
		memset(rx, 0xa5, GUARD);
		memset(tx, 0x11, GUARD);
	}
	for (int i = 0; i < nreqs; i++)
		CHECK(memcmp(reqs[i].buf + reqs[i].len, reqs[i].r->is_send ? tx : rx, GUARD) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
	static tp_link l;
	size_t off = 1;

	if (slotmem == NULL)
		setup();
	if (n < 1 || n > 65536)
		return 0;
	link_init(&l, 1 + d[0] % 3);
	nreqs = nwr = 0;
	post(&l, false, 0, 0); /* eager receive, tag 0 */
	post(&l, false, 1, 2); /* rendezvous receive, tag 1 */
	post(&l, true, 2, 0);  /* eager send, tag 2 */
	post(&l, true, 3, 2);  /* rendezvous send, tag 3 */
	for (int ev = 0; off < n && ev < 4096; ev++) {
		uint8_t e = d[off++];
		switch (e % 6) {
		case 0:
			/* the same message e / 6 + 1 times: the peer repeating itself */
			deliver(&l, d, n, &off, e / 6 + 1);
			break;
		case 1:
			immediate(&l, d, n, &off);
			break;
		case 2:
			if (off < n)
				complete_oldest(&l, d[off++] == 0 ? IBV_WC_SUCCESS : IBV_WC_REM_ACCESS_ERR);
			break;
		case 3:
			for (int q = 0; q < l.nqp && off + 4 <= n; q++, off += 4)
				memcpy((void *)&l.credit_in[q], d + off, 4);
			ib_poll_link(&l);
			break;
		case 4:
		case 5:
			if (off + 2 <= n) {
				post(&l, e % 6 == 5, d[off], d[off + 1]);
				off += 2;
			}
			break;
		}
		check_link(&l);
	}
	check_guards();
	for (int i = 0; i < nreqs; i++)
		if (reqs[i].r->done && reqs[i].r->st == KHOR_SUCCESS)
			CHECK(reqs[i].r->len == reqs[i].len);
	/* The end: the link fails, its work requests flush, every request is let go. */
	ib_link_fail(&l, KHOR_ERR_REMOTE, "the fuzzer is done");
	while (nwr > 0)
		complete_oldest(&l, IBV_WC_WR_FLUSH_ERR);
	for (int i = 0; i < nreqs; i++) {
		CHECK(reqs[i].r->done);
		ib_req_release(reqs[i].r);
		if (reqs[i].heap)
			free(reqs[i].buf);
	}
	klist *k;
	while ((k = klist_first(&l.uq)) != NULL) {
		struct unexp *u = KLIST_ENTRY(k, struct unexp, node);
		klist_del(k);
		free(u->data);
		free(u);
	}
	free(l.cts_early);
	CHECK(l.pending == 0);
	return 0;
}
