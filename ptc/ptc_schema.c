/*
 * ptc_schema.c - schema.json: parse, validate, expand {L} templates.
 *
 * DESIGN
 * The file lists tensor templates; a name containing "{L}" stands for one
 * tensor per layer 0..num_layers-1. The parsed schema holds the expanded
 * tensors in file order (a template's layers consecutively), each knowing
 * its template index (`source`) so messages can point back into the file.
 * Validation is complete here: a schema that parses is one every layout can
 * slice (TP-degree limits are checked by ptc_layout_init, which knows tp).
 * The PTC_MAX_* limits are checked before anything is expanded: the number
 * of tensors and files from the template counts, name lengths on each
 * template's longest expansion (its last layer has the most digits).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptc/ptc_i.h"

static const char *const schema_keys[] = {"model",   "num_layers",  "states",
					  "tensors", "description", NULL};
static const char *const tensor_keys[] = {"name", "dtype", "shape", "split", "place", "tied", NULL};
static const char *const split_keys[] = {"dim", "chunks", "pad_multiple", "unit", NULL};
static const char *const state_keys[] = {"dtype", NULL};

void ptc_schema_free(struct ptc_schema *s)
{
	if (!s)
		return;
	for (int i = 0; i < s->ntensors; i++) {
		free(s->tensors[i].name);
		free(s->tensors[i].chunks);
	}
	for (int i = 0; i < s->nstates; i++)
		free(s->states[i].name);
	free(s->tensors);
	free(s->tie_first);
	free(s->tie_next);
	free(s->by_layer);
	free(s->layer_off);
	free(s->states);
	free(s->model);
	free(s);
}

int ptc_schema_find(const struct ptc_schema *s, const char *name)
{
	for (int i = 0; i < s->ntensors; i++)
		if (strcmp(s->tensors[i].name, name) == 0)
			return i;
	return -1;
}

int ptc_schema_find_state(const struct ptc_schema *s, const char *name)
{
	for (int i = 0; i < s->nstates; i++)
		if (strcmp(s->states[i].name, name) == 0)
			return i;
	return -1;
}

enum ptc_dtype ptc_schema_dtype(const struct ptc_schema *s, int st, int t)
{
	return s->states[st].has_dtype ? s->states[st].dtype : s->tensors[t].dtype;
}

/* @s for a message: whole when short, else its first and last 20 bytes
 * (the end of an expanded name holds the layer). @buf holds ABBREV bytes. */
#define ABBREV 48
static const char *abbrev(const char *s, char *buf)
{
	size_t n = strlen(s);

	if (n <= 43)
		snprintf(buf, ABBREV, "%s", s);
	else
		snprintf(buf, ABBREV, "%.20s...%s", s, s + n - 20);
	return buf;
}

/* Bytes of the longest component of @path, @ext added to the last one. */
static size_t longest_component(const char *path, const char *ext)
{
	size_t max = 0;

	for (const char *p = path;; p++) {
		size_t n = strcspn(p, "/");
		size_t len = n + (p[n] ? 0 : strlen(ext));
		if (len > max)
			max = len;
		p += n;
		if (!*p)
			return max;
	}
}

/* Checks the file of tensor @name (expanded, from tensors[@source]) against
 * PTC_MAX_NAME and, under the longest state of @s, PTC_MAX_PATH. */
static int check_name_length(const struct ptc_schema *s, const char *name, size_t source,
			     const char *file, struct ptc_error *err)
{
	size_t comp = longest_component(name, ".npy"), state = 0, path;
	char a[ABBREV], b[ABBREV];
	int longest = 0;

	if (comp > PTC_MAX_NAME)
		return ptc_errorf(err,
				  "%s: tensors[%zu].name \"%s\" has a component of %zu bytes "
				  "(\".npy\" included), more than the limit %d",
				  file, source, abbrev(name, a), comp, PTC_MAX_NAME);
	for (int i = 0; i < s->nstates; i++) {
		if (strlen(s->states[i].name) > state) {
			state = strlen(s->states[i].name);
			longest = i;
		}
	}
	path = state + 1 + strlen(name) + strlen(".npy");
	if (path > PTC_MAX_PATH)
		return ptc_errorf(err,
				  "%s: tensors[%zu].name \"%s\" in state \"%s\" makes a path "
				  "\"<state>/<tensor>.npy\" of %zu bytes, more than the limit %d",
				  file, source, abbrev(name, a), abbrev(s->states[longest].name, b),
				  path, PTC_MAX_PATH);
	return 0;
}

static void shape_str(const struct ptc_tensor *t, char *buf, size_t n)
{
	size_t off = (size_t)snprintf(buf, n, "[");
	for (int i = 0; i < t->ndim && off < n; i++)
		off +=
		    (size_t)snprintf(buf + off, n - off, "%s%" PRId64, i ? ", " : "", t->shape[i]);
	if (off < n)
		snprintf(buf + off, n - off, "]");
}

static int parse_states(struct ptc_schema *s, const json_t *states, const char *file,
			struct ptc_error *err)
{
	const char *key;
	size_t key_len;
	json_t *v;

	if (!states) {
		s->states = calloc(1, sizeof(*s->states));
		if (!s->states || !(s->states[0].name = strdup("model")))
			return -ENOMEM;
		s->nstates = 1;
		return 0;
	}
	if (!json_is_object(states) || json_object_size(states) == 0)
		return ptc_errorf(err, "%s: \"states\" must be a non-empty object", file);
	if (json_object_size(states) > PTC_MAX_STATES)
		return ptc_errorf(err, "%s: \"states\" has %zu states, more than the limit %d",
				  file, json_object_size(states), PTC_MAX_STATES);
	s->states = calloc(json_object_size(states), sizeof(*s->states));
	if (!s->states)
		return -ENOMEM;
	json_object_keylen_foreach((json_t *)states, key, key_len, v)
	{
		struct ptc_state *st = &s->states[s->nstates];
		char where[300], shown[ABBREV];
		size_t comp;

		snprintf(where, sizeof(where), "states.\"%s\"", key);
		if (!ptc_path_valid(key, false) || key_len != strlen(key))
			return ptc_errorf(err, "%s: %s is not a valid path name", file, where);
		if ((comp = longest_component(key, "")) > PTC_MAX_NAME)
			return ptc_errorf(err,
					  "%s: states.\"%s\" has a component of %zu bytes, more "
					  "than the limit %d",
					  file, abbrev(key, shown), comp, PTC_MAX_NAME);
		if (strcmp(key, "data") == 0 || strncmp(key, "data/", 5) == 0)
			return ptc_errorf(err, "%s: %s is reserved for dataset views", file, where);
		if (!json_is_object(v))
			return ptc_errorf(err, "%s: %s must be an object", file, where);
		if (ptc_json_known(v, state_keys, file, where, err))
			return -EINVAL;
		json_t *dt = json_object_get(v, "dtype");
		if (dt) {
			if (!json_is_string(dt) ||
			    ptc_dtype_parse(json_string_value(dt), &st->dtype))
				return ptc_errorf(err, "%s: %s.dtype is not a known dtype", file,
						  where);
			st->has_dtype = 1;
		}
		for (int j = 0; j < s->nstates; j++) {
			size_t n = strlen(s->states[j].name), m = strlen(key);
			const char *a = n < m ? s->states[j].name : key;
			const char *b = n < m ? key : s->states[j].name;
			if (strncmp(a, b, strlen(a)) == 0 && b[strlen(a)] == '/')
				return ptc_errorf(err, "%s: %s and \"%s\" overlap as paths", file,
						  where, s->states[j].name);
		}
		if (!(st->name = strdup(key)))
			return -ENOMEM;
		s->nstates++;
	}
	return 0;
}

/* Parses "split" into @t (dim, chunks, pad_multiple, unit). */
static int parse_split(struct ptc_tensor *t, const json_t *split, const char *file,
		       const char *where, struct ptc_error *err)
{
	char w[96], shp[200];
	int64_t v;

	snprintf(w, sizeof(w), "%s.split", where);
	if (!json_is_object(split))
		return ptc_errorf(err, "%s: %s must be an object", file, w);
	if (ptc_json_known(split, split_keys, file, w, err))
		return -EINVAL;
	if (ptc_json_int(split, "dim", true, INT32_MIN, INT32_MAX, &v, file, w, err))
		return -EINVAL;
	shape_str(t, shp, sizeof(shp));
	if (v < 0 || v >= t->ndim)
		return ptc_errorf(err, "%s: %s.dim = %" PRId64 " is out of range for shape %s",
				  file, w, v, shp);
	t->split_dim = (int)v;
	int64_t n = t->shape[v];

	json_t *ch = json_object_get(split, "chunks");
	if (!ch || json_is_integer(ch)) {
		int64_t c = ch ? json_integer_value(ch) : 1;
		if (c < 1 || c > PTC_MAX_SEGS / 2 || n % c != 0)
			return ptc_errorf(err,
					  "%s: %s.chunks = %" PRId64 " does not divide dim %" PRId64
					  " of shape %s into at most %d equal chunks",
					  file, w, c, v, shp, PTC_MAX_SEGS / 2);
		t->nchunks = (int)c;
		if (!(t->chunks = calloc((size_t)c, sizeof(int64_t))))
			return -ENOMEM;
		for (int i = 0; i < c; i++)
			t->chunks[i] = n / c;
	} else if (json_is_array(ch)) {
		size_t c = json_array_size(ch);
		int64_t sum = 0;
		if (c < 1 || c > PTC_MAX_SEGS / 2)
			return ptc_errorf(err, "%s: %s.chunks must list 1 to %d sizes", file, w,
					  PTC_MAX_SEGS / 2);
		if (!(t->chunks = calloc(c, sizeof(int64_t))))
			return -ENOMEM;
		t->nchunks = (int)c;
		for (size_t i = 0; i < c; i++) {
			json_t *e = json_array_get(ch, i);
			if (!json_is_integer(e) || json_integer_value(e) < 1)
				return ptc_errorf(err,
						  "%s: %s.chunks[%zu] must be a positive integer",
						  file, w, i);
			t->chunks[i] = json_integer_value(e);
			if (t->chunks[i] > n)
				return ptc_errorf(err,
						  "%s: %s.chunks sum to more than dim %" PRId64
						  " of shape %s",
						  file, w, v, shp);
			sum += t->chunks[i];
		}
		if (sum != n)
			return ptc_errorf(err,
					  "%s: %s.chunks sum to %" PRId64 ", not dim %" PRId64
					  " of shape %s",
					  file, w, sum, v, shp);
	} else {
		return ptc_errorf(err, "%s: %s.chunks must be an integer or an array of sizes",
				  file, w);
	}

	int rc =
	    ptc_json_int(split, "pad_multiple", false, 1, 1 << 20, &t->pad_multiple, file, w, err);
	if (rc < 0)
		return rc;
	if (rc == 0 && t->nchunks > 1)
		return ptc_errorf(err, "%s: %s.pad_multiple cannot be combined with chunks", file,
				  w);
	/* "unit": rows that stay together on one TP rank (an attention head's
	 * rows of a fused QKV), so that a tp which would cut one is refused. */
	bool padded = rc == 0;
	if ((rc = ptc_json_int(split, "unit", false, 1, (int64_t)1 << 40, &t->unit, file, w, err)) <
	    0)
		return rc;
	if (rc == 1)
		t->unit = 1;
	else if (padded && t->unit > 1)
		return ptc_errorf(err, "%s: %s.unit cannot be combined with pad_multiple", file, w);
	for (int c = 0; c < t->nchunks; c++)
		if (t->chunks[c] % t->unit)
			return ptc_errorf(err,
					  "%s: %s.unit = %" PRId64 " does not divide the %" PRId64
					  " rows of chunk %d",
					  file, w, t->unit, t->chunks[c], c);
	return 0;
}

/* Parses template @i into @t (name still unexpanded). */
static int parse_tensor(struct ptc_tensor *t, const json_t *js, int i, const char *file,
			struct ptc_error *err)
{
	char where[64];
	json_t *v;

	snprintf(where, sizeof(where), "tensors[%d]", i);
	t->split_dim = -1;
	t->tied = -1;
	t->layer = -1;
	t->source = i;
	if (!json_is_object(js))
		return ptc_errorf(err, "%s: %s must be an object", file, where);
	if (ptc_json_known(js, tensor_keys, file, where, err))
		return -EINVAL;

	v = json_object_get(js, "name");
	if (!json_is_string(v))
		return ptc_errorf(err, "%s: %s.name must be a string", file, where);
	/* A NUL inside the string would cut the name short. */
	if (!ptc_path_valid(json_string_value(v), true) ||
	    json_string_length(v) != strlen(json_string_value(v)))
		return ptc_errorf(err, "%s: %s.name \"%s\" is not a valid tensor path", file, where,
				  json_string_value(v));
	if (!(t->name = strdup(json_string_value(v))))
		return -ENOMEM;

	v = json_object_get(js, "dtype");
	if (!json_is_string(v))
		return ptc_errorf(err, "%s: %s.dtype must be a string", file, where);
	if (ptc_dtype_parse(json_string_value(v), &t->dtype))
		return ptc_errorf(err, "%s: %s.dtype \"%s\" is not a known dtype", file, where,
				  json_string_value(v));

	v = json_object_get(js, "shape");
	if (!json_is_array(v))
		return ptc_errorf(err, "%s: %s.shape must be an array", file, where);
	if (json_array_size(v) > PTC_MAX_DIMS)
		return ptc_errorf(err, "%s: %s.shape has %zu dims, more than %d", file, where,
				  json_array_size(v), PTC_MAX_DIMS);
	t->ndim = (int)json_array_size(v);
	int64_t elems = 1;
	for (int d = 0; d < t->ndim; d++) {
		json_t *e = json_array_get(v, (size_t)d);
		if (!json_is_integer(e) || json_integer_value(e) < 1 ||
		    json_integer_value(e) > PTC_MAX_DIM_SIZE)
			return ptc_errorf(err, "%s: %s.shape[%d] must be an integer in [1, 2^40]",
					  file, where, d);
		t->shape[d] = json_integer_value(e);
		if (elems > PTC_MAX_DIM_SIZE / t->shape[d])
			return ptc_errorf(err, "%s: %s.shape has more than 2^40 elements", file,
					  where);
		elems *= t->shape[d];
	}

	v = json_object_get(js, "split");
	if (v && parse_split(t, v, file, where, err))
		return -EINVAL;

	bool templ = strstr(t->name, "{L}") != NULL;
	v = json_object_get(js, "place");
	if (!v) {
		t->place = templ ? PTC_PLACE_LAYER : PTC_PLACE_ALL;
	} else {
		const char *p = json_is_string(v) ? json_string_value(v) : "";
		if (templ)
			return ptc_errorf(err, "%s: %s.place cannot be set on a {L} tensor", file,
					  where);
		if (strcmp(p, "first") == 0)
			t->place = PTC_PLACE_FIRST;
		else if (strcmp(p, "last") == 0)
			t->place = PTC_PLACE_LAST;
		else if (strcmp(p, "all") == 0)
			t->place = PTC_PLACE_ALL;
		else
			return ptc_errorf(err,
					  "%s: %s.place must be \"first\", \"last\" or \"all\"",
					  file, where);
	}
	return 0;
}

/* Expands "{L}" in @name with @layer. */
static char *expand(const char *name, int layer)
{
	char num[16], *out, *o;
	size_t n = 0;

	snprintf(num, sizeof(num), "%d", layer);
	for (const char *p = name; *p; p++, n++)
		if (strncmp(p, "{L}", 3) == 0)
			n += strlen(num);
	if (!(out = o = malloc(n + 1)))
		return NULL;
	for (const char *p = name; *p;) {
		if (strncmp(p, "{L}", 3) == 0) {
			o = stpcpy(o, num);
			p += 3;
		} else {
			*o++ = *p++;
		}
	}
	*o = '\0';
	return out;
}

static int cmp_name(const void *a, const void *b)
{
	const struct ptc_tensor *const *x = a, *const *y = b;
	return strcmp((*x)->name, (*y)->name);
}

/* Checks names are unique and resolves "tied". */
static int link_tensors(struct ptc_schema *s, const json_t *arr, const char *file,
			struct ptc_error *err)
{
	struct ptc_tensor **sorted = malloc((size_t)s->ntensors * sizeof(*sorted));
	if (!sorted)
		return -ENOMEM;
	for (int i = 0; i < s->ntensors; i++)
		sorted[i] = &s->tensors[i];
	qsort(sorted, (size_t)s->ntensors, sizeof(*sorted), cmp_name);
	for (int i = 1; i < s->ntensors; i++) {
		if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
			int a = sorted[i - 1]->source, b = sorted[i]->source;
			ptc_errorf(err, "%s: tensors[%d] and tensors[%d] both name \"%s\"", file,
				   a < b ? a : b, a < b ? b : a, sorted[i]->name);
			free(sorted);
			return -EINVAL;
		}
	}
	/* "a" is the file "a.npy": no tensor may use "a.npy" as a directory. */
	for (int i = 0; i < s->ntensors; i++) {
		const char *name = s->tensors[i].name;
		char prefix[PTC_MAX_PATH + 1];

		for (const char *p = strchr(name, '/'); p; p = strchr(p + 1, '/')) {
			size_t n = (size_t)(p - name);
			if (n <= 4 || memcmp(p - 4, ".npy", 4) != 0 || n - 4 >= sizeof(prefix))
				continue;
			memcpy(prefix, name, n - 4);
			prefix[n - 4] = '\0';
			struct ptc_tensor key = {.name = prefix}, *kp = &key;
			struct ptc_tensor **hit =
			    bsearch(&kp, sorted, (size_t)s->ntensors, sizeof(*sorted), cmp_name);
			if (hit) {
				char a[ABBREV], b[ABBREV];
				ptc_errorf(
				    err,
				    "%s: tensors[%d].name \"%s\" and tensors[%d].name \"%s\" "
				    "overlap as paths (\"%s.npy\" is a file)",
				    file, s->tensors[i].source, abbrev(name, a), (*hit)->source,
				    abbrev((*hit)->name, b), b);
				free(sorted);
				return -EINVAL;
			}
		}
	}

	for (int i = 0; i < s->ntensors; i++) {
		struct ptc_tensor *t = &s->tensors[i];
		json_t *v = json_object_get(json_array_get(arr, (size_t)t->source), "tied");
		if (!v)
			continue;
		char where[64];
		snprintf(where, sizeof(where), "tensors[%d].tied", t->source);
		if (!json_is_string(v)) {
			free(sorted);
			return ptc_errorf(err, "%s: %s must be a tensor name", file, where);
		}
		struct ptc_tensor key = {.name = (char *)json_string_value(v)}, *kp = &key;
		struct ptc_tensor **hit =
		    bsearch(&kp, sorted, (size_t)s->ntensors, sizeof(*sorted), cmp_name);
		int rc = 0;
		if (t->place == PTC_PLACE_LAYER)
			rc = ptc_errorf(err, "%s: %s: a {L} tensor cannot be tied", file, where);
		else if (!hit)
			rc = ptc_errorf(err, "%s: %s = \"%s\" names no tensor", file, where,
					key.name);
		else if (*hit == t || (*hit)->tied >= 0 ||
			 json_object_get(json_array_get(arr, (size_t)(*hit)->source), "tied"))
			rc = ptc_errorf(err, "%s: %s = \"%s\" is itself tied", file, where,
					key.name);
		else if ((*hit)->dtype != t->dtype || (*hit)->ndim != t->ndim ||
			 memcmp((*hit)->shape, t->shape, sizeof(t->shape)) != 0 ||
			 (*hit)->split_dim != t->split_dim || (*hit)->nchunks != t->nchunks ||
			 (*hit)->pad_multiple != t->pad_multiple || (*hit)->unit != t->unit ||
			 ((*hit)->nchunks &&
			  memcmp((*hit)->chunks, t->chunks, (size_t)t->nchunks * sizeof(int64_t))))
			rc = ptc_errorf(err,
					"%s: %s = \"%s\" differs in dtype, shape or split from "
					"the tied tensor",
					file, where, key.name);
		else if (t->place != PTC_PLACE_LAST)
			rc = ptc_errorf(err, "%s: %s requires place \"last\"", file, where);
		if (rc) {
			free(sorted);
			return rc;
		}
		t->tied = (int)(*hit - s->tensors);
	}
	free(sorted);
	return 0;
}

/* Builds the tie and layer indexes of the schema (struct ptc_schema), in
 * time and memory linear in the tensors. 0 or -ENOMEM. */
static int index_tensors(struct ptc_schema *s)
{
	size_t n = (size_t)s->ntensors ? (size_t)s->ntensors : 1;
	int *last = malloc(n * sizeof(int));

	s->tie_first = malloc(n * sizeof(int));
	s->tie_next = malloc(n * sizeof(int));
	s->by_layer = malloc(n * sizeof(int));
	s->layer_off = calloc((size_t)s->num_layers + 2, sizeof(int));
	if (!last || !s->tie_first || !s->tie_next || !s->by_layer || !s->layer_off) {
		free(last);
		return -ENOMEM;
	}
	for (int i = 0; i < s->ntensors; i++)
		s->tie_first[i] = s->tie_next[i] = last[i] = -1;
	for (int j = 0; j < s->ntensors; j++) {
		int i = s->tensors[j].tied;
		if (i < 0)
			continue;
		if (last[i] < 0)
			s->tie_first[i] = j;
		else
			s->tie_next[last[i]] = j;
		last[i] = j;
	}
	free(last);
	/* A counting sort by layer; the tensors that are not {L} go last. */
	int *off = s->layer_off, L = s->num_layers;
	for (int i = 0; i < s->ntensors; i++) {
		const struct ptc_tensor *t = &s->tensors[i];
		off[(t->place == PTC_PLACE_LAYER ? t->layer : L) + 1]++;
	}
	for (int l = 0; l <= L; l++)
		off[l + 1] += off[l];
	for (int i = 0; i < s->ntensors; i++) {
		const struct ptc_tensor *t = &s->tensors[i];
		s->by_layer[off[t->place == PTC_PLACE_LAYER ? t->layer : L]++] = i;
	}
	for (int l = L; l > 0; l--) /* back to the starts */
		off[l] = off[l - 1];
	off[0] = 0;
	return 0;
}

int ptc_schema_parse(const json_t *root, const char *file, struct ptc_schema **out,
		     struct ptc_error *err)
{
	struct ptc_schema *s;
	int64_t layers = 0;
	int rc;

	*out = NULL;
	if (!json_is_object(root))
		return ptc_errorf(err, "%s: must be a JSON object", file);
	if (ptc_json_known(root, schema_keys, file, "", err))
		return -EINVAL;
	if (!(s = calloc(1, sizeof(*s))))
		return -ENOMEM;

	json_t *v = json_object_get(root, "model");
	if (v && !json_is_string(v)) {
		rc = ptc_errorf(err, "%s: \"model\" must be a string", file);
		goto err_free;
	}
	rc = -ENOMEM;
	if (!(s->model = strdup(v ? json_string_value(v) : "")))
		goto err_free;
	if ((rc = ptc_json_int(root, "num_layers", false, 0, PTC_MAX_LAYERS, &layers, file, "",
			       err)) < 0)
		goto err_free;
	s->num_layers = (int)layers;
	if ((rc = parse_states(s, json_object_get(root, "states"), file, err)))
		goto err_free;

	const json_t *arr = json_object_get(root, "tensors");
	if (!json_is_array(arr) || json_array_size(arr) == 0) {
		rc = ptc_errorf(err, "%s: \"tensors\" must be a non-empty array", file);
		goto err_free;
	}
	size_t cap = 0, templates = 0;
	for (size_t i = 0; i < json_array_size(arr); i++) {
		json_t *n = json_object_get(json_array_get(arr, i), "name");
		bool templ = json_is_string(n) && strstr(json_string_value(n), "{L}");
		templates += templ;
		cap += templ ? (size_t)layers : 1;
	}
	if (cap > PTC_MAX_TENSORS) {
		if (templates && layers)
			rc = ptc_errorf(err,
					"%s: \"num_layers\" = %" PRId64 " with %zu {L} tensors "
					"expands to %zu tensors, more than the limit %d",
					file, layers, templates, cap, PTC_MAX_TENSORS);
		else
			rc = ptc_errorf(err,
					"%s: \"tensors\" lists %zu tensors, more than the "
					"limit %d",
					file, cap, PTC_MAX_TENSORS);
		goto err_free;
	}
	if (cap * (size_t)s->nstates > PTC_MAX_FILES) {
		rc = ptc_errorf(err,
				"%s: %d states x %zu tensors = %zu files, more than the limit %d",
				file, s->nstates, cap, cap * (size_t)s->nstates, PTC_MAX_FILES);
		goto err_free;
	}
	rc = -ENOMEM;
	if (!(s->tensors = calloc(cap ? cap : 1, sizeof(*s->tensors))))
		goto err_free;

	for (size_t i = 0; i < json_array_size(arr); i++) {
		struct ptc_tensor tmpl = {0};
		if ((rc = parse_tensor(&tmpl, json_array_get(arr, i), (int)i, file, err))) {
			free(tmpl.name);
			free(tmpl.chunks);
			goto err_free;
		}
		if (tmpl.place != PTC_PLACE_LAYER) {
			s->tensors[s->ntensors++] = tmpl;
			if ((rc = check_name_length(s, tmpl.name, i, file, err)))
				goto err_free;
			continue;
		}
		if (layers == 0) {
			rc = ptc_errorf(
			    err, "%s: tensors[%zu].name uses {L} but \"num_layers\" is 0", file, i);
			free(tmpl.name);
			free(tmpl.chunks);
			goto err_free;
		}
		char *last = expand(tmpl.name, (int)layers - 1);
		rc = last ? check_name_length(s, last, i, file, err) : -ENOMEM;
		free(last);
		if (rc) {
			free(tmpl.name);
			free(tmpl.chunks);
			goto err_free;
		}
		for (int l = 0; l < layers; l++) {
			struct ptc_tensor *t = &s->tensors[s->ntensors];
			*t = tmpl;
			t->layer = l;
			t->name = expand(tmpl.name, l);
			t->chunks = NULL;
			if (t->name && tmpl.nchunks) {
				t->chunks = malloc((size_t)tmpl.nchunks * sizeof(int64_t));
				if (t->chunks)
					memcpy(t->chunks, tmpl.chunks,
					       (size_t)tmpl.nchunks * sizeof(int64_t));
			}
			if (t->name)
				s->ntensors++;
			if (!t->name || (tmpl.nchunks && !t->chunks)) {
				free(tmpl.name);
				free(tmpl.chunks);
				rc = -ENOMEM;
				goto err_free;
			}
		}
		free(tmpl.name);
		free(tmpl.chunks);
	}
	if ((rc = link_tensors(s, arr, file, err)) || (rc = index_tensors(s)))
		goto err_free;
	*out = s;
	return 0;

err_free:
	ptc_schema_free(s);
	return rc;
}

PTC_DEFINE_PARSE_TEXT(ptc_schema_parse_text, ptc_schema_parse, struct ptc_schema)
