/*
 * net_http_parse.c - reads HTTP reply headers (status line, Content-Length,
 * Content-Range) and judges a reply against the request it answers.
 *
 * Everything here reads bytes a server chose: every number is 1 to
 * NET_MAX_DIGITS digits and checked before use, a malformed header counts
 * as absent, and the body bytes a reply may deliver are bounded by the
 * request (a range's length, a whole object's max), never by the reply.
 * The caller writes body bytes only after NET_BODY_KEEP, so its buffers
 * are sized from the request alone.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "net/net_i.h"

/* A decimal of 1 to NET_MAX_DIGITS digits at *@p, which moves past it. */
static bool parse_num(const char **p, const char *end, int64_t *out)
{
	int64_t v = 0;
	int n = 0;

	while (*p < end && **p >= '0' && **p <= '9') {
		if (++n > NET_MAX_DIGITS)
			return false;
		v = v * 10 + (**p - '0');
		(*p)++;
	}
	*out = v;
	return n > 0;
}

static const char *skip_ws(const char *p, const char *end)
{
	while (p < end && (*p == ' ' || *p == '\t'))
		p++;
	return p;
}

/* The value of header line [@p, @end) when its name is @name, else NULL. */
static const char *header_value(const char *p, const char *end, const char *name)
{
	size_t n = strlen(name);

	if ((size_t)(end - p) <= n || strncasecmp(p, name, n) || p[n] != ':')
		return NULL;
	return skip_ws(p + n + 1, end);
}

/* Content-Range: "bytes a-b/total", "bytes a-b/ *" or "bytes * /total" (no spaces). */
static void parse_content_range(struct net_reply *r, const char *p, const char *end)
{
	int64_t a, b, t = -1;

	if (end - p < 6 || strncasecmp(p, "bytes", 5) || (p[5] != ' ' && p[5] != '\t'))
		return;
	p = skip_ws(p + 5, end);
	if (p < end && *p == '*') {
		if (++p >= end || *p++ != '/' || !parse_num(&p, end, &t) || skip_ws(p, end) != end)
			return;
		r->have_cr = false;
		r->cr_unsat = true;
		r->cr_first = r->cr_last = -1;
		r->cr_total = t;
		return;
	}
	if (!parse_num(&p, end, &a) || p >= end || *p++ != '-')
		return;
	if (!parse_num(&p, end, &b) || p >= end || *p++ != '/')
		return;
	if (p < end && *p == '*')
		p++;
	else if (!parse_num(&p, end, &t))
		return;
	if (skip_ws(p, end) != end || b < a || (t >= 0 && b >= t))
		return;
	r->have_cr = true;
	r->cr_unsat = false;
	r->cr_first = a;
	r->cr_last = b;
	r->cr_total = t;
}

/* Forgets the reply, keeps the request. */
static void reply_reset(struct net_reply *r)
{
	r->status = 0;
	r->have_clen = r->have_cr = r->cr_unsat = false;
	r->clen = r->cr_first = r->cr_last = r->cr_total = -1;
	r->got = 0;
	r->have_sum = false;
	r->sum = 0;
}

void net_reply_init(struct net_reply *r, int64_t a, int64_t b, int64_t max)
{
	r->a = a;
	r->b = b;
	r->max = max;
	reply_reset(r);
}

int net_reply_header(struct net_reply *r, const char *line, size_t len, struct ptc_error *err)
{
	const char *p = line, *end = line + len, *v;
	int64_t n;

	while (end > p && (end[-1] == '\r' || end[-1] == '\n'))
		end--;
	if (end - p >= 5 && !memcmp(p, "HTTP/", 5)) {
		reply_reset(r);
		while (p < end && *p != ' ')
			p++;
		p = skip_ws(p, end);
		if (parse_num(&p, end, &n) && n >= 100 && n <= 999)
			r->status = (long)n;
		return NET_HEADER_STATUS;
	}
	if ((v = header_value(p, end, "content-length"))) {
		if (parse_num(&v, end, &n) && skip_ws(v, end) == end) {
			r->have_clen = true;
			r->clen = n;
		}
		if (r->a < 0 && r->status == 200 && r->have_clen && r->clen > r->max)
			return ptc_error_set(err, -EFBIG,
					     "holds %" PRId64 " bytes, more than %" PRId64, r->clen,
					     r->max);
	} else if ((v = header_value(p, end, "content-range"))) {
		parse_content_range(r, v, end);
	} else if ((v = header_value(p, end, NET_SUM_HEADER))) {
		uint64_t h = 0;
		const char *q = v;
		for (; q < end && q - v < 16 && isxdigit((unsigned char)*q); q++)
			h = h << 4 | (uint64_t)(isdigit((unsigned char)*q)
						    ? *q - '0'
						    : (tolower((unsigned char)*q) - 'a' + 10));
		if (q - v == 16 && skip_ws(q, end) == end) {
			r->have_sum = true;
			r->sum = h;
		}
	}
	return 0;
}

/* Whether a 206's Content-Range is within the bytes asked; else the reason in
 * @err (-EIO). */
static bool range_ok(const struct net_reply *r, struct ptc_error *err)
{
	if (!r->have_cr)
		ptc_error_set(err, -EIO, "HTTP 206 without a valid Content-Range");
	else if (r->cr_first != r->a || r->cr_last > r->b)
		ptc_error_set(err, -EIO,
			      "Content-Range bytes %" PRId64 "-%" PRId64 " for bytes %" PRId64
			      "-%" PRId64 " asked",
			      r->cr_first, r->cr_last, r->a, r->b);
	else
		return true;
	return false;
}

int net_reply_body(struct net_reply *r, size_t n, struct ptc_error *err)
{
	int64_t room; /* bytes the reply may still deliver, >= 0 */

	if (r->a < 0) {
		if (r->status != 200)
			return NET_BODY_DROP; /* an error page */
		if ((uint64_t)n > (uint64_t)(r->max - r->got))
			return ptc_error_set(err, -EFBIG, "holds more than %" PRId64 " bytes",
					     r->max);
	} else if (r->status == 206) {
		if (!range_ok(r, err))
			return -EIO;
		room = r->cr_last - r->a + 1 - r->got;
		if ((uint64_t)n > (uint64_t)room)
			return ptc_error_set(err, -EIO, "body longer than its Content-Range");
	} else if (r->status == 200) {
		/* The whole object: acceptable only if it is what was asked. */
		if (r->a != 0)
			return ptc_error_set(err, -EIO, "HTTP 200 to a range request");
		room = r->b - r->a + 1 - r->got;
		if ((uint64_t)n > (uint64_t)room)
			return ptc_error_set(err, -EIO,
					     "HTTP 200 with more than the %" PRId64 " bytes asked",
					     r->b - r->a + 1);
	} else {
		return NET_BODY_DROP; /* an error page */
	}
	r->got += (int64_t)n;
	return NET_BODY_KEEP;
}

bool net_status_retryable(long status)
{
	return status >= 500 || status == 408 || status == 429;
}

/* Judges the 206, 200 or 416 answering a range request into *@v; false for
 * other statuses. */
static bool end_range(const struct net_reply *r, enum net_verdict *v, int64_t *size,
		      struct ptc_error *err)
{
	*v = NET_RETRY;
	if (r->status == 206) {
		if (!range_ok(r, err))
			return true;
		if (r->got != r->cr_last - r->a + 1) {
			ptc_error_set(err, -EIO, "short body: %" PRId64 " of %" PRId64 " bytes",
				      r->got, r->cr_last - r->a + 1);
			return true;
		}
		int64_t want = r->b;
		if (r->cr_total >= 0 && r->cr_total - 1 < want)
			want = r->cr_total - 1;
		if (r->cr_last != want) {
			ptc_error_set(err, -EIO,
				      "Content-Range ends at byte %" PRId64 ", %" PRId64
				      " expected",
				      r->cr_last, want);
			return true;
		}
		*size = r->cr_total;
	} else if (r->status == 200) {
		if (r->a != 0) {
			ptc_error_set(err, -EIO, "HTTP 200 to a range request");
			return true;
		}
		if (!r->have_clen || r->got != r->clen) {
			ptc_error_set(err, -EIO, "HTTP 200 without a matching Content-Length");
			return true;
		}
		*size = r->got;
	} else if (r->status == 416 && r->cr_unsat && r->cr_total <= r->a) {
		/* Past the end: not a failure of the source, the size tells. A
		 * 416 that gives a size past the start contradicts itself. */
		*size = r->cr_total;
	} else {
		return false;
	}
	*v = NET_OK;
	return true;
}

enum net_verdict net_reply_end(const struct net_reply *r, int64_t *size, struct ptc_error *err)
{
	enum net_verdict v;

	*size = -1;
	if (r->a >= 0) {
		if (end_range(r, &v, size, err))
			return v;
	} else if (r->status == 200) {
		if (r->have_clen && r->got != r->clen) {
			ptc_error_set(err, -EIO, "short body: %" PRId64 " of %" PRId64 " bytes",
				      r->got, r->clen);
			return NET_RETRY;
		}
		*size = r->got;
		return NET_OK;
	}
	if (!r->status) {
		ptc_error_set(err, -EIO, "no HTTP status");
		return NET_RETRY;
	}
	ptc_error_set(err, -EIO, "HTTP %ld", r->status);
	return net_status_retryable(r->status) ? NET_RETRY : NET_FATAL;
}
