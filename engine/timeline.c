/*
 * timeline.c -- the engine's timeline: Chrome trace-event JSON, which chrome://tracing and
 * Perfetto open.
 *
 * As in Horovod's, every tensor gets a lane of its own (a trace "process" named after it),
 * and on it the phases of each of its rounds: NEGOTIATE_<OP> (enqueue to response, with
 * an instant "rank R ready" for when the coordinator heard from each rank), QUEUE (response
 * to start), then the op (ALLREDUCE, ...: args algorithm, transport, bytes, tensors) and
 * inside it MEMCPY_IN_FUSION_BUFFER and MEMCPY_OUT_FUSION_BUFFER when fused. Lane 0 holds
 * CYCLE_START marks when asked for. Times are microseconds since the file was opened.
 *
 * The file is Chrome's trace-event array form, as Horovod writes it: "[" on the first line,
 * then one event per line, each followed by ",". Each line reaches the file whole (the
 * stream is line-buffered and an event is one line), so a process that dies without
 * khor_engine_stop (kill -9, a crash, a Python exception past shutdown) leaves a file that
 * chrome://tracing and Perfetto load: the format allows the "]" and the last event's ","
 * to be missing. The old {"traceEvents": [...]} object was invalid JSON then. Closing the
 * timeline overwrites the last "," with the "]", which makes the file strict JSON too.
 */
#include "timeline.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

struct timeline {
	FILE *f;
	int rank;
	bool mark_cycles;
	emap lanes;       /* tensor name -> lane (pid) */
	int next_lane;
	uint64_t t0;
};

static void put_json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s != '\0'; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

/* Ends an event's line: the stream is line-buffered, so this writes the line out. */
static void eol(struct timeline *t)
{
	fputs(",\n", t->f);
}

struct timeline *timeline_open(const char *path, int rank, bool mark_cycles, kerr *err)
{
	struct timeline *t = calloc(1, sizeof(*t));

	if (t == NULL) {
		kerr_set(err, KHOR_ERR_NO_MEMORY, "timeline: out of memory");
		return NULL;
	}
	t->f = fopen(path, "w");
	if (t->f == NULL) {
		char b[128];
		kerr_set(err, KHOR_ERR_SYSTEM, "timeline: cannot write '%s': %s", path,
		         kerr_errno_str(errno, b, sizeof(b)));
		free(t);
		return NULL;
	}
	t->rank = rank;
	t->mark_cycles = mark_cycles;
	t->next_lane = 1;
	t->t0 = kclock_ns();
	setvbuf(t->f, NULL, _IOLBF, 0);
	fputs("[\n", t->f);
	fprintf(t->f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":"
	        "\"khor engine, rank %d\"}}", rank);
	eol(t);
	return t;
}

void timeline_close(struct timeline *t)
{
	if (t == NULL)
		return;
	/* The file ends "},\n" (there is always the first event): "\n]\n" over the ",\n". */
	off_t end = ftello(t->f);
	if (end >= 2 && fseeko(t->f, end - 2, SEEK_SET) == 0)
		fputs("\n]\n", t->f);
	fclose(t->f);
	emap_free(&t->lanes);
	free(t);
}

bool timeline_on(struct khor_engine *e)
{
	return atomic_load_explicit(&e->tl_on, memory_order_relaxed);
}

static double us(const struct timeline *t, uint64_t ns)
{
	return ns >= t->t0 ? (double)(ns - t->t0) / 1000.0 : 0.0;
}

static int lane(struct timeline *t, const char *tensor)
{
	intptr_t v = (intptr_t)emap_get(&t->lanes, tensor);

	if (v != 0)
		return (int)v;
	int p = t->next_lane++;
	if (emap_put(&t->lanes, tensor, (void *)(intptr_t)p) != KHOR_SUCCESS)
		return 0;
	fprintf(t->f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":", p);
	put_json_str(t->f, tensor);
	fputs("}}", t->f);
	eol(t);
	fprintf(t->f, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"args\":"
	        "{\"sort_index\":%d}}", p, p);
	eol(t);
	return p;
}

/* One event on tensor's lane: ph "B" or "i" with a name, "E" without (name NULL). */
static void event(struct khor_engine *e, const char *tensor, const char *name, const char *ph,
                  uint64_t ns, const char *args_json)
{
	pthread_mutex_lock(&e->tl_mu);
	struct timeline *t = e->tl;
	if (t != NULL) {
		int p = lane(t, tensor);
		fputc('{', t->f);
		if (name != NULL) {
			fputs("\"name\":", t->f);
			put_json_str(t->f, name);
			fputc(',', t->f);
		}
		fprintf(t->f, "\"ph\":\"%s\",%s\"ts\":%.3f,\"pid\":%d,\"tid\":0", ph,
		        ph[0] == 'i' ? "\"s\":\"p\"," : "", us(t, ns), p);
		if (args_json != NULL)
			fprintf(t->f, ",\"args\":%s", args_json);
		fputc('}', t->f);
		eol(t);
	}
	pthread_mutex_unlock(&e->tl_mu);
}

void timeline_begin(struct khor_engine *e, const char *tensor, const char *phase, uint64_t ns,
                    const char *args_json)
{
	event(e, tensor, phase, "B", ns, args_json);
}

void timeline_end(struct khor_engine *e, const char *tensor, uint64_t ns)
{
	event(e, tensor, NULL, "E", ns, NULL);
}

void timeline_instant(struct khor_engine *e, const char *tensor, const char *what, uint64_t ns)
{
	event(e, tensor, what, "i", ns, NULL);
}

void timeline_cycle(struct khor_engine *e, int set, uint32_t cycle, uint64_t ns)
{
	pthread_mutex_lock(&e->tl_mu);
	struct timeline *t = e->tl;
	if (t != NULL && t->mark_cycles) {
		fprintf(t->f, "{\"name\":\"CYCLE_START\",\"ph\":\"i\",\"s\":\"g\",\"ts\":%.3f,\"pid\":0,"
		        "\"tid\":0,\"args\":{\"set\":%d,\"cycle\":%u}}", us(t, ns), set, cycle);
		eol(t);
	}
	pthread_mutex_unlock(&e->tl_mu);
}
