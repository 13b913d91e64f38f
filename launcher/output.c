/*
 * output.c -- the ranks' output. Ranks never interleave inside a line: each write is whole
 * lines with their "[rank] " prefix, and a line too long for the buffer is cut, never lost.
 * A rank on another host is fed from its helper's frames into the same buffers, so the
 * prefix and --output-filename work alike for every host.
 */
#include "output.h"

#include "base/err.h"
#include "say.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Lines gathered into one writev; two iovecs each keeps us well under IOV_MAX (1024). */
#define WRITE_BATCH 256

/* Writes all of iov to our stdout or stderr; on EPIPE and the like drops it from then on. */
static void write_out(struct job *j, int which, struct iovec *iov, int cnt)
{
	int fd = which == OUT_STDOUT ? STDOUT_FILENO : STDERR_FILENO;

	/* Reader gone: keep the ranks running, as a shell pipeline would not. */
	if (!j->out_dead[which] && !frame_write_all(fd, iov, cnt))
		j->out_dead[which] = true;
}

/* Writes all of iov to a --output-filename file; a failed write is said once. */
static void write_file(struct rank *rk, struct stream *s, struct iovec *iov, int cnt)
{
	char ebuf[128];

	if (s->file < 0 || frame_write_all(s->file, iov, cnt))
		return;
	say("cannot write rank %d's %s file: %s; it goes to the terminal only", rk->id,
	    s->which == OUT_STDOUT ? "stdout" : "stderr", kerr_errno_str(errno, ebuf, sizeof(ebuf)));
	close(s->file);
	s->file = -1;
}

/*
 * Prints the complete lines in s->buf with the rank's prefix and keeps the rest. A full
 * buffer without a newline is printed as a line of its own (split, never lost); at EOF a
 * partial last line is printed with a newline added so the next prefix starts a line.
 * With --output-filename the same lines, unprefixed, go to the rank's file too.
 */
void output_emit(struct job *j, struct rank *rk, struct stream *s, bool eof)
{
	static const char nl = '\n';
	struct iovec iov[WRITE_BATCH * 3], fiov[WRITE_BATCH * 2];
	int cnt = 0, fcnt = 0;
	size_t pos = 0;

	if (s->buf == NULL)
		return; /* released: its stream ended long ago */
	for (;;) {
		char *line = s->buf + pos;
		size_t left = s->len - pos;
		char *end = memchr(line, '\n', left);
		size_t ll;
		bool add_nl = false;

		if (left == 0)
			break;
		if (end != NULL) {
			ll = (size_t)(end - line) + 1;
		} else if (left == LINE_BUF || eof) {
			ll = left;
			add_nl = true;
		} else {
			break;
		}
		if (rk->prefix_len > 0)
			iov[cnt++] = (struct iovec){ rk->prefix, rk->prefix_len };
		iov[cnt++] = (struct iovec){ line, ll };
		if (s->file >= 0)
			fiov[fcnt++] = (struct iovec){ line, ll };
		if (add_nl) {
			iov[cnt++] = (struct iovec){ (void *)&nl, 1 };
			if (s->file >= 0)
				fiov[fcnt++] = (struct iovec){ (void *)&nl, 1 };
		}
		pos += ll;
		if (cnt > (WRITE_BATCH - 1) * 3) {
			write_out(j, s->which, iov, cnt);
			write_file(rk, s, fiov, fcnt);
			cnt = fcnt = 0;
		}
	}
	if (cnt > 0)
		write_out(j, s->which, iov, cnt);
	if (fcnt > 0)
		write_file(rk, s, fiov, fcnt);
	if (pos > 0) {
		memmove(s->buf, s->buf + pos, s->len - pos);
		s->len -= pos;
	}
}

void output_close(struct job *j, struct rank *rk, struct stream *s)
{
	if (s->fd < 0)
		return;
	output_emit(j, rk, s, true);
	close(s->fd);
	s->fd = -1;
	j->nopen--;
}

void output_feed(struct job *j, struct rank *rk, struct stream *s, const char *p,
                 size_t n)
{
	while (n > 0 && s->buf != NULL) {
		size_t take = LINE_BUF - s->len < n ? LINE_BUF - s->len : n;

		memcpy(s->buf + s->len, p, take);
		s->len += take;
		p += take;
		n -= take;
		output_emit(j, rk, s, false);
	}
}

/*
 * One read per wakeup and stream, so a chatty rank cannot starve the others. The helper
 * sends what it read to khorrun as it is; an empty chunk says the stream ended.
 */
void output_read(struct job *j, struct rank *rk, struct stream *s)
{
	/* The helper keeps nothing back (s->len stays 0). */
	ssize_t n = read(s->fd, s->buf + s->len, LINE_BUF - s->len);

	if (j->helper) {
		uint8_t tag[5];

		frame_put_u32(tag, (uint32_t)rk->id);
		tag[4] = (uint8_t)s->which;

		if (n > 0) {
			frame_send('O', tag, sizeof(tag), s->buf, (size_t)n);
		} else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
			frame_send('O', tag, sizeof(tag), NULL, 0);
			close(s->fd);
			s->fd = -1;
			j->nopen--;
		}
		return;
	}
	if (n > 0) {
		s->len += (size_t)n;
		output_emit(j, rk, s, false);
	} else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
		output_close(j, rk, s);
	}
}

void output_free_ranks(struct job *j)
{
	for (int r = 0; r < j->nstarted; r++) {
		for (int k = 0; k < 2; k++) {
			if (j->ranks[r].out[k].fd >= 0)
				close(j->ranks[r].out[k].fd);
			if (j->ranks[r].out[k].file >= 0)
				close(j->ranks[r].out[k].file);
			free(j->ranks[r].out[k].buf);
		}
		free(j->ranks[r].worker);
	}
	free(j->ranks);
	j->ranks = NULL;
}

/*
 * The digits of the highest rank, as horovodrun pads its rank.N directories (gloo_run's
 * _pad_rank: rank.0-rank.9 for 10 ranks, rank.00-rank.10 for 11), so that they sort.
 */
static int rank_width(int np)
{
	int w = 1;

	for (int top = np - 1; top >= 10; top /= 10)
		w++;
	return w;
}

/*
 * Rank rk's line buffers, prefix and --output-filename files: DIR/rank.N/ (N zero-padded to
 * the width of the highest rank), or in an elastic
 * job DIR/HOST:SLOT/, appended to, since a worker started again in its slot keeps its name.
 */
bool output_init_rank(struct job *j, struct rank *rk)
{
	char ebuf[128];

	rk->pid = -1;
	for (int k = 0; k < 2; k++) {
		rk->out[k].fd = -1;
		rk->out[k].file = -1;
		rk->out[k].which = k;
	}
	if (!j->o.no_prefix && !j->helper) {
		if (rk->worker != NULL)
			rk->prefix_len = (size_t)snprintf(rk->prefix, sizeof(rk->prefix), "[%s] ",
			                                  rk->worker);
		else
			rk->prefix_len = (size_t)snprintf(rk->prefix, sizeof(rk->prefix), "[%d] ",
			                                  rk->id);
		if (rk->prefix_len >= sizeof(rk->prefix))
			rk->prefix_len = sizeof(rk->prefix) - 1;
	}
	for (int k = 0; k < 2; k++) {
		rk->out[k].buf = malloc(LINE_BUF);
		if (rk->out[k].buf == NULL) {
			say("out of memory for the ranks' output buffers");
			return false;
		}
	}
	if (j->o.output_dir != NULL && !j->helper) {
		char dir[PATH_MAX], file[PATH_MAX + 16];
		int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (rk->worker != NULL ? O_APPEND : O_TRUNC);

		if (rk->worker != NULL)
			snprintf(dir, sizeof(dir), "%s/%s", j->o.output_dir, rk->worker);
		else
			snprintf(dir, sizeof(dir), "%s/rank.%0*d", j->o.output_dir, rank_width(j->o.np),
			         rk->id);
		if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
			say("--output-filename: cannot make %s: %s", dir,
			    kerr_errno_str(errno, ebuf, sizeof(ebuf)));
			return false;
		}
		for (int k = 0; k < 2; k++) {
			snprintf(file, sizeof(file), "%s/%s", dir, k == 0 ? "stdout" : "stderr");
			rk->out[k].file = open(file, flags, 0644);
			if (rk->out[k].file < 0) {
				say("--output-filename: cannot open %s: %s", file,
				    kerr_errno_str(errno, ebuf, sizeof(ebuf)));
				return false;
			}
		}
	}
	return true;
}

void output_release_rank(struct rank *rk)
{
	for (int k = 0; k < 2; k++) {
		if (rk->out[k].fd >= 0 || rk->out[k].len > 0)
			continue;
		if (rk->out[k].file >= 0)
			close(rk->out[k].file);
		rk->out[k].file = -1;
		free(rk->out[k].buf);
		rk->out[k].buf = NULL;
	}
}

bool output_init_ranks(struct job *j)
{
	char ebuf[128];

	for (int r = 0; r < j->nstarted; r++) {
		for (int k = 0; k < 2; k++) {
			j->ranks[r].out[k].fd = -1;
			j->ranks[r].out[k].file = -1;
		}
	}
	if (j->o.output_dir != NULL && mkdir(j->o.output_dir, 0755) != 0 && errno != EEXIST) {
		say("--output-filename %s: %s", j->o.output_dir,
		    kerr_errno_str(errno, ebuf, sizeof(ebuf)));
		return false;
	}
	for (int r = 0; r < j->nstarted; r++) {
		if (!output_init_rank(j, &j->ranks[r]))
			return false;
	}
	return true;
}
