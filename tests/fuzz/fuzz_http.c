/*
 * fuzz_http.c - fuzzes the HTTP reply parser and judge (net/net_http_parse.c)
 * and the URL check (net_url_check).
 *
 * The input is a request line, then what a server sent:
 *
 *   range A-B | whole MAX        (anything else: range 0-99)
 *   header lines, each ending in LF or CR LF, up to an empty line; more
 *   header blocks follow while the next bytes start with "HTTP/" (100
 *   Continue, redirects)
 *   the body, fed in chunks of 1 to 97 bytes
 *
 * as libcurl hands them to net_http.c. Body bytes the parser keeps are
 * written into a buffer sized from the request alone (capped at the input
 * size), so keeping more than was asked is caught by AddressSanitizer. Every
 * line also goes through net_url_check. abort() when an invariant of
 * net_i.h or net.h breaks: statuses 0 or 100-999; numbers below 10^18;
 * Content-Range first <= last < total; kept bytes within the request;
 * accepted replies give all the bytes asked or those before the object's
 * end (none when it ends before them); failures say why.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "net/net.h"
#include "net/net_i.h"
#include "tests/fuzz/fuzz.h"

#define BELOW_1E18 1000000000000000000LL

/* A decimal of at most 18 digits at *@p (clamped at 10^18 - 1). */
static int64_t num(const char **p, const char *end)
{
	int64_t v = 0;

	while (*p < end && **p >= '0' && **p <= '9') {
		v = v > (BELOW_1E18 - 10) / 10 ? BELOW_1E18 - 1 : v * 10 + (**p - '0');
		(*p)++;
	}
	return v;
}

/* The request of line [@p, @end): *@a < 0 for a whole object. */
static void parse_ask(const char *p, const char *end, int64_t *a, int64_t *b, int64_t *max)
{
	*a = 0;
	*b = 99;
	*max = 100;
	if (end - p > 6 && !memcmp(p, "whole ", 6)) {
		p += 6;
		*a = *b = -1;
		*max = num(&p, end);
	} else if (end - p > 6 && !memcmp(p, "range ", 6)) {
		int64_t x, y;
		p += 6;
		x = num(&p, end);
		if (p < end && *p++ == '-' && (y = num(&p, end)) >= x) {
			*a = x;
			*b = y;
			*max = y - x + 1;
		}
	}
}

static void check_reply(const struct net_reply *r)
{
	CHECK(r->status == 0 || (r->status >= 100 && r->status <= 999));
	CHECK(r->have_clen ? r->clen >= 0 && r->clen < BELOW_1E18 : r->clen == -1);
	CHECK(!(r->have_cr && r->cr_unsat));
	if (r->have_cr) {
		CHECK(r->cr_first >= 0 && r->cr_first <= r->cr_last && r->cr_last < BELOW_1E18);
		CHECK(r->cr_total == -1 || (r->cr_total > r->cr_last && r->cr_total < BELOW_1E18));
	} else {
		CHECK(r->cr_first == -1 && r->cr_last == -1);
	}
	if (r->cr_unsat)
		CHECK(r->cr_total >= 0 && r->cr_total < BELOW_1E18);
	if (!r->have_cr && !r->cr_unsat)
		CHECK(r->cr_total == -1);
	CHECK(r->got >= 0 && r->got <= r->max);
}

/* net_url_check on line [@p, @p + @n): its verdict must hold. */
static void check_url(const char *p, size_t n)
{
	static char url[NET_MAX_URL + 64];
	struct ptc_error why;

	if (n >= sizeof(url))
		n = sizeof(url) - 1;
	memcpy(url, p, n);
	url[n] = 0;
	why.text[0] = 'x';
	why.code = 1;
	int rc = net_url_check(url, &why);
	CHECK(rc == 0 || rc == -EINVAL);
	CHECK(memchr(why.text, 0, sizeof(why.text)) != NULL);
	CHECK(why.code == rc);
	if (rc) {
		CHECK(why.text[0] != 0);
		return;
	}
	CHECK(why.text[0] == 0);
	CHECK(strlen(url) <= NET_MAX_URL);
	CHECK(!strncasecmp(url, "http://", 7) || !strncasecmp(url, "https://", 8));
	for (const char *s = url; *s; s++)
		CHECK((uint8_t)*s > 0x20 && (uint8_t)*s != 0x7f);
}

/* The end of the line at @p (past its LF), or @end. */
static const char *line_end(const char *p, const char *end)
{
	const char *nl = memchr(p, '\n', (size_t)(end - p));

	return nl ? nl + 1 : end;
}

static bool blank(const char *p, const char *e)
{
	return e - p == 0 || (e - p == 1 && p[0] == '\n') || (e - p == 2 && !memcmp(p, "\r\n", 2));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *p = (const char *)data, *end = p + size, *e;
	struct net_reply r;
	int64_t a, b, max, asked, got, sz;
	uint8_t *buf = NULL;
	struct ptc_error msg;
	int rc = 0;

	e = line_end(p, end);
	parse_ask(p, e, &a, &b, &max);
	check_url(p, (size_t)(e - p) - (e > p && e[-1] == '\n'));
	p = e;
	net_reply_init(&r, a, b, max);
	asked = a < 0 ? max : b - a + 1;
	CHECK(asked == r.max);
	check_reply(&r);

	/* Header blocks. */
	while (p < end) {
		for (; p < end; p = e) {
			e = line_end(p, end);
			check_url(p, (size_t)(e - p));
			if (blank(p, e)) {
				p = e;
				break;
			}
			msg.text[0] = 0;
			msg.code = 0;
			rc = net_reply_header(&r, p, (size_t)(e - p), &msg);
			CHECK(rc == 0 || rc == NET_HEADER_STATUS || rc == -EFBIG);
			CHECK((rc == NET_HEADER_STATUS) == (e - p >= 5 && !memcmp(p, "HTTP/", 5)));
			if (rc == NET_HEADER_STATUS)
				CHECK(r.got == 0);
			check_reply(&r);
			if (rc == -EFBIG) {
				CHECK(a < 0 && r.status == 200 && r.clen > max && msg.text[0]);
				CHECK(msg.code == rc);
				return 0; /* the transfer is aborted */
			}
		}
		if (end - p < 5 || memcmp(p, "HTTP/", 5))
			break;
	}

	/* The body, into a buffer sized from the request. */
	size_t cap = (uint64_t)asked < size ? (size_t)asked : size;
	if (!(buf = malloc(cap ? cap : 1)))
		return 0;
	for (uint32_t k = (uint32_t)size * 2654435761u; p < end;) {
		size_t n = 1 + (k = k * 1103515245u + 12345u) % 97;
		if (n > (size_t)(end - p))
			n = (size_t)(end - p);
		got = r.got;
		msg.text[0] = 0;
		msg.code = 0;
		rc = net_reply_body(&r, n, &msg);
		CHECK(rc == NET_BODY_KEEP || rc == NET_BODY_DROP || rc == -EIO || rc == -EFBIG);
		check_reply(&r);
		if (rc < 0) {
			CHECK(msg.text[0] && r.got == got);
			CHECK(msg.code == rc);
			CHECK(rc == -EFBIG ? a < 0 : a >= 0);
			free(buf);
			return 0; /* the transfer is aborted */
		}
		if (rc == NET_BODY_DROP) {
			CHECK(r.got == got);
		} else {
			CHECK(r.got == got + (int64_t)n);
			memcpy(buf + got, p, n); /* out of bounds past the request */
		}
		p += n;
	}
	free(buf);

	/* The verdict. */
	msg.text[0] = 0;
	msg.code = 0;
	enum net_verdict v = net_reply_end(&r, &sz, &msg);
	CHECK(v == NET_OK || v == NET_RETRY || v == NET_FATAL);
	if (v != NET_OK) {
		CHECK(msg.text[0] && sz == -1);
		CHECK(msg.code == -EIO);
		return 0;
	}
	CHECK(sz >= -1 && sz < BELOW_1E18);
	if (a < 0) {
		CHECK(r.status == 200 && sz == r.got && r.got <= max);
		CHECK(!r.have_clen || r.clen == r.got);
		return 0;
	}
	CHECK(r.status == 200 || r.status == 206 || r.status == 416);
	CHECK(r.got >= 0 && r.got <= asked);
	/* Fewer bytes only when the object ends first: where they end, or before @a. */
	if (r.got < asked)
		CHECK(sz >= 0 && (r.got ? a + r.got == sz : sz <= a));
	if (r.got)
		CHECK(sz == -1 || sz >= a + r.got);
	return 0;
}
