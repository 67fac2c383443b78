/* config.c — loads a run's YAML file and `--set a.b=v` overrides into a qt_config, checks it, dumps it.
 *
 * The YAML is walked as libyaml events (so every key keeps its line:column); each scalar goes through
 * the key table in config_keys.c. Errors read "<file>:<line>:<col>: <key>: expected <what>, got ...". */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "qt_config.h"
#include "qt_dtype.h"
#include "qt_file.h"
#include "qt_plan.h"

#define MAX_KEYS 128
#define MAX_SECTIONS 32
#define KEY_MAX 256

/* Where a key's value came from: line > 0 for the file (1-based), ovr >= 0 for --set number ovr. */
typedef struct {
    int line, col, ovr;
} where;

typedef struct {
    qt_config *c;
    const char *name;                    /* file name for messages */
    const char *const *ovr;
    yaml_parser_t parser;
    yaml_event_t ev;                     /* the current event; deleted before the next is parsed */
    int have_ev;
    where at[MAX_KEYS];                  /* per key; line == 0 && ovr < 0: default */
    char sections[MAX_SECTIONS][KEY_MAX]; /* section mappings seen, for duplicates */
    where section_at[MAX_SECTIONS];
    int n_sections;
    int first_inline;                    /* key index of the first inline model key given, or -1 */
    char *err;
    size_t errlen;
} ctx;

static int key_index(const qt_config_key *k) {
    for (int i = 0; qt_config_key_at(i); i++)
        if (qt_config_key_at(i) == k) return i;
    return -1;
}

/* "<file>:<line>:<col>" or "--set <text>". */
static void where_text(const ctx *x, where w, char *buf, size_t cap) {
    if (w.ovr >= 0) snprintf(buf, cap, "--set %s", x->ovr[w.ovr]);
    else if (w.line > 0) snprintf(buf, cap, "%s:%d:%d", x->name, w.line, w.col);
    else snprintf(buf, cap, "%s", x->name);
}

static int fail(ctx *x, where w, const char *key, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(ctx *x, where w, const char *key, const char *fmt, ...) {
    char loc[KEY_MAX + 64];
    where_text(x, w, loc, sizeof loc);
    int n = snprintf(x->err, x->errlen, "%s: %s%s", loc, key ? key : "", key ? ": " : "");
    if (n >= 0 && (size_t)n < x->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(x->err + n, x->errlen - n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static where mark_at(yaml_mark_t m) { return (where){(int)m.line + 1, (int)m.column + 1, -1}; }

static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b), row[KEY_MAX + 1];
    if (la > KEY_MAX || lb > KEY_MAX) return (size_t)-1;
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* The known key (or section) closest to an unknown path, when it is close enough to be a typo or the
 * same leaf name under another section; NULL otherwise. Writes into buf. */
static const char *suggest(const char *path, char *buf, size_t cap) {
    const char *leaf = strrchr(path, '.') ? strrchr(path, '.') + 1 : path;
    size_t best = (size_t)-1;
    buf[0] = 0;
    for (int i = 0; qt_config_key_at(i); i++) {
        const char *p = qt_config_key_at(i)->path, *dot = strchr(p, '.');
        char sec[KEY_MAX];
        snprintf(sec, sizeof sec, "%.*s", dot ? (int)(dot - p) : 0, p);
        const char *cand[2] = {sec, p}; /* its section first: "opt" suggests "optim", not a key */
        for (int j = 0; j < 2; j++) {
            /* A key (dotted path) is never answered with a section: "optim.b" is not a typo of "optim". */
            if (!cand[j][0] || (j == 0 && strchr(path, '.'))) continue;
            size_t lp = strlen(path), lc = strlen(cand[j]);
            /* the distance is at least the length difference, and more than 3 is never suggested */
            size_t d = (lp > lc ? lp - lc : lc - lp) > 3 ? (size_t)-1 : edit_distance(path, cand[j]);
            if (j == 1 && !strcmp(dot ? dot + 1 : p, leaf) && d > 1) d = 1; /* right key, wrong section */
            if (strlen(leaf) >= 3 && !strncmp(cand[j], path, strlen(path)) && d > 1) d = 1; /* cut short */
            if (d < best) { best = d; snprintf(buf, cap, "%s", cand[j]); }
        }
    }
    /* Close means a few edits, and fewer than the typed leaf has letters: "optim.b" is not "optim.lr". */
    size_t allow = strlen(path) < 6 ? 1 : strlen(path) < 12 ? 2 : 3;
    return best <= allow && best < strlen(leaf) ? buf : NULL;
}

static int unknown_key(ctx *x, where w, const char *path) {
    char s[KEY_MAX];
    if (suggest(path, s, sizeof s))
        return fail(x, w, path, "expected a known key (did you mean \"%s\"?), got \"%s\"", s, path);
    return fail(x, w, path, "expected a known key (see configs/README.md), got \"%s\"", path);
}

/* 1 when path names a section: some key lives below it. */
static int is_section(const char *path) {
    size_t n = strlen(path);
    for (int i = 0; qt_config_key_at(i); i++) {
        const char *p = qt_config_key_at(i)->path;
        if (!strncmp(p, path, n) && p[n] == '.') return 1;
    }
    return 0;
}

/* A section given a value ("--set optim=3"): names the section's keys. */
static int section_value(ctx *x, where w, const char *path, const char *value) {
    char keys[2048] = "";
    size_t n = 0, pl = strlen(path);
    for (int i = 0; qt_config_key_at(i) && n < sizeof keys - 1; i++) {
        const char *p = qt_config_key_at(i)->path;
        if (!strncmp(p, path, pl) && p[pl] == '.')
            n += (size_t)snprintf(keys + n, sizeof keys - n, "%s%s", n ? ", " : "", p);
    }
    return fail(x, w, path, "expected a key of the section %s (%s), got the section itself = \"%.200s\"", path, keys, value);
}

/* Why a number that reads as one was refused though it may look in range: floats are 32-bit. */
static const char *float_range_note(const qt_config_key *k, const char *text) {
    if (k->type != QT_KEY_FLOAT) return "";
    char *end;
    double v = strtod(text, &end);
    if (!*text || *end || !isfinite(v)) return "";
    if (fabs(v) > FLT_MAX) return " (beyond the 32-bit float range, |x| <= 3.4e38)";
    if (v != 0 && (float)v == 0) return " (below the 32-bit float range: it rounds to 0)";
    return "";
}

/* The keys memory.plan: auto chooses (plan_auto.c's axes; test_plan checks the two agree). */
static const char *const plan_keys[] = {"data.micro_batch", "memory.recompute", "memory.offload_optimizer",
                                        "memory.lmhead_chunks", "memory.attn_bwd_chunks", "memory.offload_residual",
                                        "memory.fp8_weight_cache", "precision.master_dtype",
                                        "precision.grad_accum_dtype", "parallel.zero", "memory.offload", "perf.cuda_graphs"};

int qt_config_plan_key(const char *path) {
    for (size_t i = 0; i < sizeof plan_keys / sizeof plan_keys[0]; i++)
        if (!strcmp(plan_keys[i], path)) return 1;
    return 0;
}

/* Sets key k from a scalar's text, recording where; plain null scalars count as "" for strings. A
 * planner key given as the plain scalar auto keeps its value (the file's, else the default: micro_batch
 * x grad_accum stays the step's sequences) but counts as not given, so memory.plan: auto chooses it. */
static int apply(ctx *x, const qt_config_key *k, const char *text, int plain, where w) {
    int idx = key_index(k);
    if (plain && !strcmp(text, "auto") && qt_config_plan_key(k->path)) {
        x->at[idx] = w;
        if (idx < (int)sizeof x->c->given) x->c->given[idx] = 0;
        return 0;
    }
    if (k->type == QT_KEY_STRING && plain && (!strcmp(text, "~") || !strcasecmp(text, "null"))) text = "";
    if (qt_config_key_set(x->c, k, text)) {
        char what[200];
        qt_config_key_expect(k, what, sizeof what);
        return fail(x, w, k->path, "expected %s, got \"%.200s\"%s", what, text, float_range_note(k, text));
    }
    x->at[idx] = w;
    if (idx < (int)sizeof x->c->given) x->c->given[idx] = 1;
    if (k->model_inline) {
        x->c->model_inline = 1;
        if (x->first_inline < 0) x->first_inline = idx;
    }
    return 0;
}

static int next(ctx *x) {
    if (x->have_ev) yaml_event_delete(&x->ev);
    x->have_ev = 0;
    if (!yaml_parser_parse(&x->parser, &x->ev)) {
        yaml_parser_t *p = &x->parser;
        where w = mark_at(p->problem_mark);
        if (p->context)
            return fail(x, w, NULL, "YAML syntax error: %s %s that starts at line %d", p->problem, p->context,
                        (int)p->context_mark.line + 1);
        return fail(x, w, NULL, "YAML syntax error: %s", p->problem ? p->problem : "unreadable input");
    }
    x->have_ev = 1;
    return 0;
}

static const char *node_kind(const yaml_event_t *e) {
    return e->type == YAML_MAPPING_START_EVENT ? "a mapping"
           : e->type == YAML_SEQUENCE_START_EVENT ? "a sequence"
           : e->type == YAML_ALIAS_EVENT ? "an alias (quote values that start with '*')"
                                           : "something else";
}

static int section_seen(ctx *x, const char *path, where w) {
    for (int i = 0; i < x->n_sections; i++)
        if (!strcmp(x->sections[i], path))
            return fail(x, w, path, "expected each key once (first at line %d), got it again", x->section_at[i].line);
    if (x->n_sections < MAX_SECTIONS) {
        snprintf(x->sections[x->n_sections], KEY_MAX, "%s", path);
        x->section_at[x->n_sections++] = w;
    }
    return 0;
}

/* A list key's sequence (its SEQUENCE_START is the current event): the scalars joined with commas. */
static int read_list(ctx *x, const qt_config_key *k, where w) {
    char text[512] = "", what[200];
    size_t n = 0;
    qt_config_key_expect(k, what, sizeof what);
    for (;;) {
        if (next(x)) return -1;
        if (x->ev.type == YAML_SEQUENCE_END_EVENT) return apply(x, k, text, 1, w);
        if (x->ev.type != YAML_SCALAR_EVENT)
            return fail(x, w, k->path, "expected %s, got %s in the list", what, node_kind(&x->ev));
        const char *v = (const char *)x->ev.data.scalar.value;
        if (n + strlen(v) + 2 >= sizeof text) return fail(x, w, k->path, "expected %s, got a longer list", what);
        n += (size_t)snprintf(text + n, sizeof text - n, "%s%s", n ? "," : "", v);
    }
}

/* Reads the pairs of a mapping whose MAPPING_START is the current event; prefix = its dotted path. */
static int read_mapping(ctx *x, const char *prefix) {
    for (;;) {
        if (next(x)) return -1;
        if (x->ev.type == YAML_MAPPING_END_EVENT) return 0;
        where w = mark_at(x->ev.start_mark);
        if (x->ev.type != YAML_SCALAR_EVENT)
            return fail(x, w, prefix[0] ? prefix : NULL, "expected a key name, got %s", node_kind(&x->ev));
        char path[KEY_MAX];
        int n = snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", (const char *)x->ev.data.scalar.value);
        if (n < 0 || (size_t)n >= sizeof path) return fail(x, w, prefix, "expected a known key, got a %d-byte key", n);
        const qt_config_key *k = qt_config_key_find(path);
        int section = !k && is_section(path);
        if (!k && !section) return unknown_key(x, w, path);
        if (k && (x->at[key_index(k)].line > 0))
            return fail(x, w, path, "expected each key once (first at line %d), got it again", x->at[key_index(k)].line);
        if (next(x)) return -1;
        if (section) {
            if (x->ev.type != YAML_MAPPING_START_EVENT) {
                if (x->ev.type == YAML_SCALAR_EVENT)
                    return fail(x, w, path, "expected a mapping of %s.* keys, got \"%.200s\"", path,
                                (const char *)x->ev.data.scalar.value);
                return fail(x, w, path, "expected a mapping of %s.* keys, got %s", path, node_kind(&x->ev));
            }
            if (section_seen(x, path, w) || read_mapping(x, path)) return -1;
        } else if ((k->type == QT_KEY_INT_LIST || k->type == QT_KEY_NAME_LIST) && x->ev.type == YAML_SEQUENCE_START_EVENT) {
            if (read_list(x, k, w)) return -1;
        } else {
            char what[200];
            qt_config_key_expect(k, what, sizeof what);
            if (x->ev.type != YAML_SCALAR_EVENT) return fail(x, w, path, "expected %s, got %s", what, node_kind(&x->ev));
            if (apply(x, k, (const char *)x->ev.data.scalar.value,
                      x->ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE, w))
                return -1;
        }
    }
}

/* stream := STREAM_START [DOCUMENT_START (MAPPING | empty scalar) DOCUMENT_END] STREAM_END */
static int read_stream(ctx *x) {
    if (next(x)) return -1;                       /* STREAM_START */
    if (next(x)) return -1;
    if (x->ev.type == YAML_STREAM_END_EVENT) return 0; /* empty file: all defaults */
    if (next(x)) return -1;                       /* the root node */
    where w = mark_at(x->ev.start_mark);
    if (x->ev.type == YAML_MAPPING_START_EVENT) {
        if (read_mapping(x, "")) return -1;
    } else if (x->ev.type == YAML_SCALAR_EVENT) {
        const char *v = (const char *)x->ev.data.scalar.value;
        if (v[0] && strcmp(v, "~") && strcasecmp(v, "null"))
            return fail(x, w, NULL, "expected a mapping of config keys, got \"%.200s\"", v);
    } else
        return fail(x, w, NULL, "expected a mapping of config keys, got %s", node_kind(&x->ev));
    if (next(x)) return -1;                       /* DOCUMENT_END */
    if (next(x)) return -1;
    if (x->ev.type != YAML_STREAM_END_EVENT)
        return fail(x, mark_at(x->ev.start_mark), NULL, "expected one YAML document, got a second one");
    return 0;
}

/* Parses one --set value as a YAML scalar (so quoting works as in the file). */
static int apply_override(ctx *x, int i) {
    const char *s = x->ovr[i], *eq = strchr(s, '=');
    where w = {0, 0, i};
    if (!eq || eq == s) return fail(x, w, NULL, "expected key=value, got \"%s\"", s);
    char path[KEY_MAX];
    snprintf(path, sizeof path, "%.*s", (int)(eq - s) < KEY_MAX - 1 ? (int)(eq - s) : KEY_MAX - 1, s);
    const qt_config_key *k = qt_config_key_find(path);
    if (!k && is_section(path)) return section_value(x, w, path, eq + 1);
    if (!k) return unknown_key(x, w, path);
    if (k->type == QT_KEY_INT_LIST || k->type == QT_KEY_NAME_LIST) return apply(x, k, eq + 1, 1, w); /* "[0,0]", "0,0" */
    yaml_parser_t p;
    yaml_event_t e;
    if (!yaml_parser_initialize(&p)) return fail(x, w, path, "expected memory for the YAML parser, got none");
    yaml_parser_set_input_string(&p, (const unsigned char *)eq + 1, strlen(eq + 1));
    int rc = -1, done = 0;
    char what[200];
    qt_config_key_expect(k, what, sizeof what);
    while (!done) { /* skip to the first node: a scalar, another node, or the end of an empty value */
        if (!yaml_parser_parse(&p, &e)) {
            rc = fail(x, w, path, "expected %s, got \"%s\" (YAML: %s)", what, eq + 1, p.problem ? p.problem : "?");
            break;
        }
        if (e.type == YAML_SCALAR_EVENT) {
            rc = apply(x, k, (const char *)e.data.scalar.value, e.data.scalar.style == YAML_PLAIN_SCALAR_STYLE, w);
            done = 1;
        } else if (e.type == YAML_STREAM_END_EVENT) {
            rc = apply(x, k, "", 1, w);
            done = 1;
        } else if (e.type != YAML_STREAM_START_EVENT && e.type != YAML_DOCUMENT_START_EVENT) {
            rc = fail(x, w, path, "expected %s, got %s", what, node_kind(&e));
            done = 1;
        }
        yaml_event_delete(&e);
    }
    yaml_parser_delete(&p);
    return rc;
}

static where at_of(const ctx *x, const char *path) { return x->at[key_index(qt_config_key_find(path))]; }
static int given(where w) { return w.line > 0 || w.ovr >= 0; }

/* Where the key a qt_model_cfg_validate message starts with ("model.num_heads: ...") was given.
 * When that key was not given (a derived head_dim, the total size): num_heads, else the first
 * inline model key, else the file itself. */
static where model_key_at(const ctx *x, const char *msg) {
    char key[KEY_MAX];
    size_t n = strcspn(msg, ":");
    snprintf(key, sizeof key, "%.*s", (int)(n < KEY_MAX ? n : KEY_MAX - 1), msg);
    const qt_config_key *k = qt_config_key_find(key);
    if (k && given(x->at[key_index(k)])) return x->at[key_index(k)];
    if (given(at_of(x, "model.num_heads"))) return at_of(x, "model.num_heads");
    return x->first_inline >= 0 ? x->at[x->first_inline] : (where){0, 0, -1};
}

void qt_config_set_offload(qt_config *c, int items, int on) {
    if (!on) c->memory.offload &= ~items;
    else if (!(c->memory.offload & items)) c->memory.offload |= items;
    c->memory.offload_optimizer = (c->memory.offload & QT_OFF_OPTIMIZER) != 0;
    c->memory.offload_residual = (c->memory.offload & QT_OFF_RESIDUAL) != 0;
}

void qt_config_set_zero(qt_config *c, int zero) {
    c->parallel.zero = zero;
    c->parallel.shard_optimizer = zero >= 1;
}

/* A non-empty memory.offload list sets offload_optimizer / offload_residual; given too, they must agree. */
static int offload_agree(ctx *x) {
    qt_config *c = x->c;
    int off = c->memory.offload;
    static const struct { const char *key; size_t field; int bits; } older[] = {
        {"memory.offload_optimizer", offsetof(qt_config, memory.offload_optimizer), QT_OFF_OPTIMIZER},
        {"memory.offload_residual", offsetof(qt_config, memory.offload_residual), QT_OFF_RESIDUAL}};
    for (int i = 0; i < 2; i++) {
        int *f = (int *)((char *)c + older[i].field), want = (off & older[i].bits) != 0;
        where wo = at_of(x, older[i].key);
        if (given(wo) && *f != want)
            return fail(x, wo, older[i].key, "expected %s, as memory.offload says, got %s", want ? "true" : "false",
                        *f ? "true" : "false");
        *f = want;
    }
    return 0;
}

/* memory.offload against its older spellings (offload_optimizer: any of master, m, v; offload_residual): a
 * non-empty list sets them; given together they must agree. Then the older spellings become the list's items
 * (offload_optimizer alone: all of master, m, v), which is all the plan reads. */
static int offload_check(ctx *x) {
    qt_config *c = x->c;
    where wl = at_of(x, "memory.offload");
    if (given(wl) && c->memory.offload && offload_agree(x)) return -1; /* [] leaves the older keys as they are */
    int opt = c->memory.offload_optimizer, res = c->memory.offload_residual;
    qt_config_set_offload(c, QT_OFF_OPTIMIZER, opt);
    qt_config_set_offload(c, QT_OFF_RESIDUAL, res);
    return 0;
}

/* Checks that span keys: model source, the inline model's shape, schedule length, sequence length. */
static int cross_check(ctx *x) {
    qt_config *c = x->c;
    if (offload_check(x)) return -1;
    const qt_config_key *pk;
    for (int i = 0; !c->memory.plan && (pk = qt_config_key_at(i)); i++) /* a planner key still auto (no later --set value) */
        if (qt_config_plan_key(pk->path) && given(x->at[i]) && i < (int)sizeof c->given && !c->given[i])
            return fail(x, x->at[i], pk->path, "expected a value: auto leaves the key to memory.plan: auto, and memory.plan is manual");
    if ((c->hf_config[0] || c->init.from[0]) && c->model_inline) {
        const qt_config_key *k = qt_config_key_at(x->first_inline);
        char v[QT_KEY_TEXT_MAX];
        qt_config_key_format(c, k, v, sizeof v);
        return fail(x, x->at[x->first_inline], k->path, "expected no inline model keys when %s, got \"%s\"",
                    c->hf_config[0] ? "model.hf_config is set"
                                    : "init.from is set (its config.json defines the model)",
                    v);
    }
    if ((long)c->optim.warmup + c->optim.cooldown > c->optim.steps) {
        where ww = at_of(x, "optim.warmup"), wc = at_of(x, "optim.cooldown"), wst = at_of(x, "optim.steps");
        /* the key a --set changed is the one to blame, not the file's line it broke */
        int steps_set = wst.ovr >= 0 && ww.ovr < 0 && wc.ovr < 0;
        const char *key = steps_set ? "optim.steps" : given(ww) ? "optim.warmup" : given(wc) ? "optim.cooldown" : "optim.steps";
        int v = !strcmp(key, "optim.warmup") ? c->optim.warmup : !strcmp(key, "optim.cooldown") ? c->optim.cooldown
                                                                                               : c->optim.steps;
        if (!strcmp(key, "optim.steps"))
            return fail(x, at_of(x, key), key, "expected >= warmup + cooldown (%d), got \"%d\"",
                        c->optim.warmup + c->optim.cooldown, v);
        return fail(x, at_of(x, key), key, "expected warmup + cooldown <= steps (%d), got \"%d\"", c->optim.steps, v);
    }
    if (c->lora.rank > 0 && !c->lora.targets)
        return fail(x, at_of(x, "lora.targets"), "lora.targets", "expected at least one of q, k, v, o, gate, up, down "
                    "with lora.rank %d, got []", c->lora.rank);
    if (c->lora.base_nf4 && c->lora.rank <= 0)
        return fail(x, at_of(x, "lora.base_dtype"), "lora.base_dtype", "nf4 quantizes the frozen base of LoRA: expected "
                    "lora.rank > 0 with it, got rank %d (full fine-tuning trains the bf16 weights)", c->lora.rank);
    if (c->lora.base_nf4 && c->precision.matmul_dtype != QT_DT_BF16)
        return fail(x, at_of(x, "lora.base_dtype"), "lora.base_dtype", "nf4 feeds the block matmuls bf16 weights "
                    "dequantized per layer: expected precision.matmul_dtype bf16 with it, got %s",
                    qt_dtype_name(c->precision.matmul_dtype));
    if (c->objective == QT_OBJ_DPO && c->data.micro_batch % 2)
        return fail(x, at_of(x, "data.micro_batch"), "data.micro_batch", "expected an even count with objective: dpo "
                    "(a micro-batch holds pairs: the chosen and the rejected sequence of micro_batch / 2 pairs), got %d",
                    c->data.micro_batch);
    /* parallel.shard_optimizer is the older spelling of parallel.zero 0 / 1: alone it picks the level,
     * with zero it must agree; afterwards it says whether the optimizer state is sharded (zero >= 1). */
    where wz = at_of(x, "parallel.zero"), wso = at_of(x, "parallel.shard_optimizer");
    if (given(wso) && !given(wz)) c->parallel.zero = c->parallel.shard_optimizer ? 1 : 0;
    else if (given(wso) && given(wz) && c->parallel.shard_optimizer != (c->parallel.zero >= 1))
        return fail(x, wso, "parallel.shard_optimizer", "expected %s with parallel.zero: %d (ZeRO >= 1 shards the "
                    "optimizer state), got \"%s\"; give only parallel.zero", c->parallel.zero >= 1 ? "true" : "false",
                    c->parallel.zero, c->parallel.shard_optimizer ? "true" : "false");
    c->parallel.shard_optimizer = c->parallel.zero >= 1;
    qt_plan_fp8_cache_default(c);
    const char *zkey = NULL, *zwhy = qt_plan_refusal(c, &zkey);
    if (zwhy) return fail(x, given(at_of(x, zkey)) ? at_of(x, zkey) : c->parallel.zero >= 3 ? wz : at_of(x, "memory.offload"),
                          zkey, "%s", zwhy);
    if ((int64_t)c->data.micro_batch * c->data.seq_len > INT32_MAX) {
        where wm = at_of(x, "data.micro_batch");
        const char *key = given(wm) ? "data.micro_batch" : "data.seq_len";
        return fail(x, at_of(x, key), key, "expected micro_batch x seq_len <= 2^31 - 1 tokens, got %d x %d",
                    c->data.micro_batch, c->data.seq_len);
    }
    /* Only when this file defines the model: hf_config / init.from are resolved by the trainer. */
    if (c->hf_config[0] || c->init.from[0]) return 0;
    qt_model_cfg m = c->model;
    char msg[256];
    qt_model_cfg_finish(&m);
    if (qt_model_cfg_validate(&m, msg, sizeof msg)) {
        where w = model_key_at(x, msg);
        return fail(x, w, NULL, "%s", msg);
    }
    if (c->data.seq_len > c->model.max_seq_len) {
        where ws = at_of(x, "data.seq_len"), wm = at_of(x, "model.max_seq_len");
        const char *key = given(ws) && !(wm.ovr >= 0 && ws.ovr < 0) ? "data.seq_len" : "model.max_seq_len";
        if (!strcmp(key, "data.seq_len"))
            return fail(x, ws, key, "expected <= model.max_seq_len (%d), got \"%d\"", c->model.max_seq_len, c->data.seq_len);
        return fail(x, at_of(x, key), key, "expected >= data.seq_len (%d), got \"%d\"", c->data.seq_len,
                    c->model.max_seq_len);
    }
    return 0;
}

static const char *const derived_keys[] = {"checkpoint.dir", "log.file", "data.eval"};

int qt_config_derived_key(const char *path) {
    for (size_t i = 0; i < sizeof derived_keys / sizeof derived_keys[0]; i++)
        if (!strcmp(derived_keys[i], path)) return 1;
    return 0;
}

/* The run's paths not given: checkpoint.dir and log.file inside run.dir (when set); data.eval from
 * data.train's glob, its file name's leading "train" made "eval" (tools/tokenize's layout). */
static int derive_paths(ctx *x) {
    qt_config *c = x->c;
    int n = 0;
    if (c->run.dir[0] && !qt_config_given(c, "checkpoint.dir"))
        n = snprintf(c->checkpoint.dir, sizeof c->checkpoint.dir, "%s/ckpt", c->run.dir);
    if (n >= (int)sizeof c->checkpoint.dir) return fail(x, at_of(x, "run.dir"), "run.dir", "expected a shorter path, got %d bytes", n);
    if (c->run.dir[0] && !qt_config_given(c, "log.file"))
        n = snprintf(c->log.file, sizeof c->log.file, "%s/log.jsonl", c->run.dir);
    if (n >= (int)sizeof c->log.file) return fail(x, at_of(x, "run.dir"), "run.dir", "expected a shorter path, got %d bytes", n);
    const char *slash = strrchr(c->data.train, '/'), *name = slash ? slash + 1 : c->data.train;
    if (!qt_config_given(c, "data.eval") && !strncmp(name, "train", 5))
        snprintf(c->data.eval, sizeof c->data.eval, "%.*seval%s", (int)(name - c->data.train), c->data.train, name + 5);
    return 0;
}

/* The shared body of load and load_string: text == NULL reads the file at name. */
static int load(qt_config *c, const char *text, size_t len, FILE *f, const char *name,
                const char *const *overrides, int n_overrides, char *err, size_t errlen) {
    ctx x;
    memset(&x, 0, sizeof x);
    x.c = c;
    x.name = name;
    x.ovr = overrides;
    x.err = err;
    x.errlen = errlen;
    x.first_inline = -1;
    for (int i = 0; i < MAX_KEYS; i++) x.at[i].ovr = -1;
    if (err && errlen) err[0] = 0;
    qt_config_defaults(c);
    snprintf(c->path, sizeof c->path, "%s", name);
    if (qt_config_key_at(MAX_KEYS)) return fail(&x, (where){0, 0, -1}, NULL, "expected <= %d config keys", MAX_KEYS);
    if (!yaml_parser_initialize(&x.parser)) return fail(&x, (where){0, 0, -1}, NULL, "out of memory");
    if (f) yaml_parser_set_input_file(&x.parser, f);
    else yaml_parser_set_input_string(&x.parser, (const unsigned char *)text, len);
    int rc = read_stream(&x);
    if (x.have_ev) yaml_event_delete(&x.ev);
    yaml_parser_delete(&x.parser);
    for (int i = 0; i < n_overrides && !rc; i++) rc = apply_override(&x, i);
    if (!rc) rc = derive_paths(&x);
    if (!rc) rc = cross_check(&x);
    return rc;
}

int qt_config_load_string(qt_config *c, const char *yaml, const char *name, const char *const *overrides,
                          int n_overrides, char *err, size_t errlen) {
    return load(c, yaml, strlen(yaml), NULL, name ? name : "<string>", overrides, n_overrides, err, errlen);
}

int qt_config_load(qt_config *c, const char *path, const char *const *overrides, int n_overrides, char *err,
                   size_t errlen) {
    const char *why = NULL;
    int fd = qt_open_regular(path, &why);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        if (fd == -2) snprintf(err, errlen, "%s: expected a YAML file, got %s", path, why);
        else snprintf(err, errlen, "%s: expected a readable YAML file, got \"%s\"", path, why ? why : strerror(errno));
        return -1;
    }
    int rc = load(c, NULL, 0, f, path, overrides, n_overrides, err, errlen);
    fclose(f);
    return rc;
}

size_t qt_config_dump(const qt_config *c, char *buf, size_t cap) {
    size_t n = 0;
    char section[KEY_MAX] = "", val[QT_KEY_TEXT_MAX];
#define OUT(...) do { int w_ = snprintf(buf + (n < cap ? n : cap), n < cap ? cap - n : 0, __VA_ARGS__); \
                      if (w_ > 0) n += (size_t)w_; } while (0)
    OUT("# qtrain config: every key with its resolved value\n");
    for (int i = 0; qt_config_key_at(i); i++) {
        const qt_config_key *k = qt_config_key_at(i);
        const char *dot = strchr(k->path, '.');
        size_t sl = dot ? (size_t)(dot - k->path) : 0;
        if (dot && (strlen(section) != sl || strncmp(section, k->path, sl))) {
            snprintf(section, sizeof section, "%.*s", (int)sl, k->path);
            OUT("%s:\n", section);
        }
        qt_config_key_format(c, k, val, sizeof val);
        /* Inline model keys were not given, derived paths neither: comment them out so that reading back
         * keeps them unset (and derives the paths again). */
        const char *hash = (k->model_inline && !c->model_inline) ||
                                   (qt_config_derived_key(k->path) && !qt_config_given(c, k->path)) ? "# " : "";
        OUT("%s%s%s: %s\n", dot ? "  " : "", hash, dot ? dot + 1 : k->path, val);
    }
#undef OUT
    return n;
}
