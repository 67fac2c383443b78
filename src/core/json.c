/* json.c — a recursive-descent JSON parser (RFC 8259) into a node tree; errors carry a byte offset.
 *
 * Strings are unescaped to UTF-8 (\uXXXX and surrogate pairs included); numbers go through strtod
 * after their syntax is checked. A key twice in one object is an error (JSON leaves it open: Python
 * keeps the last, others the first, so the file means different things to different readers). Nesting is limited to QT_JSON_DEPTH levels so hostile input
 * cannot exhaust the stack. */
#include "qt_json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QT_JSON_DEPTH 200

struct qt_json {
    qt_json_node *root;
};

typedef struct {
    const char *s;
    size_t n, i;
    char *err;
    size_t errlen;
    int failed;
} parser;

static void perr(parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void perr(parser *p, const char *fmt, ...) {
    if (p->failed) return;
    p->failed = 1;
    if (!p->err || !p->errlen) return;
    int k = snprintf(p->err, p->errlen, "offset %zu: ", p->i);
    if (k < 0 || (size_t)k >= p->errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err + k, p->errlen - k, fmt, ap);
    va_end(ap);
}

static void skip_ws(parser *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static void node_free(qt_json_node *x) {
    while (x) {
        qt_json_node *next = x->next;
        node_free(x->child);
        free(x->str);
        free(x->key);
        free(x);
        x = next;
    }
}

static int hex4(parser *p, unsigned *out) {
    if (p->n - p->i < 4) { perr(p, "truncated \\u escape"); return -1; }
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->s[p->i + k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else { p->i += k; perr(p, "expected a hex digit in \\u escape, got '%c'", c); return -1; }
    }
    p->i += 4;
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xc0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* One \uXXXX escape (p->i just past the 'u'), joining a surrogate pair; appends UTF-8 at o. */
static int unicode_escape(parser *p, char *o, size_t *len) {
    unsigned cp;
    if (hex4(p, &cp)) return -1;
    if (cp >= 0xdc00 && cp <= 0xdfff) { perr(p, "unpaired low surrogate \\u%04x", cp); return -1; }
    if (cp >= 0xd800 && cp <= 0xdbff) {
        unsigned lo;
        if (p->n - p->i < 2 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') {
            perr(p, "expected a low surrogate after \\u%04x", cp);
            return -1;
        }
        p->i += 2;
        if (hex4(p, &lo)) return -1;
        if (lo < 0xdc00 || lo > 0xdfff) { perr(p, "expected a low surrogate, got \\u%04x", lo); return -1; }
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
    }
    *len += put_utf8(o + *len, cp);
    return 0;
}

/* A string starting at the opening quote; returns a malloc'd unescaped copy. */
static char *parse_string(parser *p) {
    p->i++; /* the quote */
    size_t start = p->i, end = start;
    while (end < p->n && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
    if (end >= p->n) { p->i = start - 1; perr(p, "unterminated string"); return NULL; }
    char *o = malloc(end - start + 1); /* unescaping never lengthens the text */
    if (!o) { perr(p, "out of memory"); return NULL; }
    size_t len = 0;
    while (p->i < end) {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c < 0x20) { perr(p, "control character 0x%02x in string", c); free(o); return NULL; }
        if (c != '\\') { o[len++] = (char)c; p->i++; continue; }
        char e = p->s[p->i + 1];
        p->i += 2;
        switch (e) {
        case '"': o[len++] = '"'; break;
        case '\\': o[len++] = '\\'; break;
        case '/': o[len++] = '/'; break;
        case 'b': o[len++] = '\b'; break;
        case 'f': o[len++] = '\f'; break;
        case 'n': o[len++] = '\n'; break;
        case 'r': o[len++] = '\r'; break;
        case 't': o[len++] = '\t'; break;
        case 'u':
            if (unicode_escape(p, o, &len)) { free(o); return NULL; }
            break;
        default:
            p->i -= 2; /* point at the backslash */
            perr(p, "invalid escape '\\%c'", e);
            free(o);
            return NULL;
        }
    }
    p->i = end + 1;
    o[len] = 0;
    return o;
}

static int parse_number(parser *p, double *out) {
    size_t i = p->i;
    const char *s = p->s;
    if (i < p->n && s[i] == '-') i++;
    if (i < p->n && s[i] == '0') i++;
    else if (i < p->n && s[i] >= '1' && s[i] <= '9') while (i < p->n && s[i] >= '0' && s[i] <= '9') i++;
    else { perr(p, "expected a value"); return -1; }
    if (i < p->n && s[i] == '.') {
        i++;
        if (!(i < p->n && s[i] >= '0' && s[i] <= '9')) { p->i = i; perr(p, "expected a digit after '.'"); return -1; }
        while (i < p->n && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < p->n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < p->n && (s[i] == '+' || s[i] == '-')) i++;
        if (!(i < p->n && s[i] >= '0' && s[i] <= '9')) { p->i = i; perr(p, "expected a digit in the exponent"); return -1; }
        while (i < p->n && s[i] >= '0' && s[i] <= '9') i++;
    }
    char tmp[64], *big = NULL, *buf = tmp;
    size_t len = i - p->i;
    if (len >= sizeof tmp) { /* text is not NUL-terminated: copy before strtod */
        big = malloc(len + 1);
        if (!big) { perr(p, "out of memory"); return -1; }
        buf = big;
    }
    memcpy(buf, s + p->i, len);
    buf[len] = 0;
    *out = strtod(buf, NULL);
    free(big);
    p->i = i;
    return 0;
}

static qt_json_node *parse_value(parser *p, int depth);

static int literal(parser *p, const char *word) {
    size_t k = strlen(word);
    if (p->n - p->i >= k && memcmp(p->s + p->i, word, k) == 0) { p->i += k; return 1; }
    return 0;
}

/* Members of an object or elements of an array (p->i at the opening bracket). */
static int parse_container(parser *p, qt_json_node *x, int depth) {
    const int obj = x->type == QT_JSON_OBJ;
    const char close = obj ? '}' : ']';
    qt_json_node **tail = &x->child;
    p->i++;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == close) { p->i++; return 0; }
    for (;;) {
        char *key = NULL;
        if (obj) {
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != '"') { perr(p, "expected a member name string"); return -1; }
            if (!(key = parse_string(p))) return -1;
            for (const qt_json_node *c = x->child; c; c = c->next) /* readers differ on which one wins */
                if (strcmp(c->key, key) == 0) {
                    perr(p, "duplicate key \"%.200s\" in one object", key);
                    free(key);
                    return -1;
                }
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') { free(key); perr(p, "expected ':'"); return -1; }
            p->i++;
        }
        qt_json_node *v = parse_value(p, depth + 1);
        if (!v) { free(key); return -1; }
        v->key = key;
        *tail = v;
        tail = &v->next;
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') { p->i++; continue; }
        if (p->i < p->n && p->s[p->i] == close) { p->i++; return 0; }
        perr(p, "expected ',' or '%c'", close);
        return -1;
    }
}

static qt_json_node *parse_value(parser *p, int depth) {
    skip_ws(p);
    if (depth > QT_JSON_DEPTH) { perr(p, "nesting deeper than %d", QT_JSON_DEPTH); return NULL; }
    if (p->i >= p->n) { perr(p, "unexpected end of input, expected a value"); return NULL; }
    qt_json_node *x = calloc(1, sizeof *x);
    if (!x) { perr(p, "out of memory"); return NULL; }
    x->begin = p->i;
    char c = p->s[p->i];
    int bad = 0;
    if (c == '{' || c == '[') {
        x->type = c == '{' ? QT_JSON_OBJ : QT_JSON_ARR;
        bad = parse_container(p, x, depth);
    } else if (c == '"') {
        x->type = QT_JSON_STR;
        bad = !(x->str = parse_string(p));
    } else if (literal(p, "true")) { x->type = QT_JSON_BOOL; x->num = 1; }
    else if (literal(p, "false")) x->type = QT_JSON_BOOL;
    else if (literal(p, "null")) x->type = QT_JSON_NULL;
    else {
        x->type = QT_JSON_NUM;
        bad = parse_number(p, &x->num);
    }
    if (bad) { node_free(x); return NULL; }
    x->end = p->i;
    return x;
}

qt_json *qt_json_parse(const char *text, size_t n, char *err, size_t errlen) {
    parser p = {text, n, 0, err, errlen, 0};
    qt_json *j = calloc(1, sizeof *j);
    if (!j) { perr(&p, "out of memory"); return NULL; }
    j->root = parse_value(&p, 0);
    if (j->root) {
        skip_ws(&p);
        if (p.i < n) perr(&p, "unexpected '%c' after the document", text[p.i]);
    }
    if (p.failed) {
        qt_json_free(j);
        return NULL;
    }
    return j;
}

const qt_json_node *qt_json_root(const qt_json *j) { return j->root; }

const qt_json_node *qt_json_get(const qt_json_node *obj, const char *key) {
    if (!obj || obj->type != QT_JSON_OBJ) return NULL;
    for (const qt_json_node *c = obj->child; c; c = c->next)
        if (strcmp(c->key, key) == 0) return c;
    return NULL;
}

void qt_json_free(qt_json *j) {
    if (!j) return;
    node_free(j->root);
    free(j);
}
