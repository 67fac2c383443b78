/* hf.c — Hugging Face config.json and safetensors export/import for the Qwen2/Llama/Mistral layout.
 *
 * safetensors: u64 little-endian header length N, N bytes of JSON {"name": {"dtype", "shape",
 * "data_offsets": [b, e]}, "__metadata__": {...}} padded with spaces to a multiple of 8, then the
 * data; offsets are relative to the data start. Export writes tensors in layout order (tied models
 * omit lm_head.weight); import accepts F32/BF16/F16 and sharded checkpoints through
 * model.safetensors.index.json. */
#include "qt_error.h"
#include "qt_hf.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qt_ckpt.h"
#include "qt_dtype.h"
#include "qt_hf_fields.h"
#include "qt_hf_gemma.h"
#include "qt_hf_rope.h"
#include "qt_json.h"

#define HF_MAX_HEADER (256u << 20)


/* Reads a whole (small) file; caller frees. */
static char *slurp(const char *path, size_t *n, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) { qt_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno)); return NULL; }
    struct stat st;
    char *buf = NULL;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && (buf = malloc((size_t)st.st_size + 1))) {
        *n = fread(buf, 1, (size_t)st.st_size, f);
        if (*n != (size_t)st.st_size) { free(buf); buf = NULL; }
    }
    fclose(f);
    if (!buf) qt_errf(err, errlen, "%s: cannot read", path);
    else buf[*n] = 0;
    return buf;
}

/* ---- config.json ---- */

/* Rejects configs whose maths we do not implement (other activations, MLP biases, experts, a vision tower). */
static int check_unsupported(const char *path, const qt_json_node *r, char *err, size_t errlen) {
    static const char *const moe[] = {"num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok",
                                      "moe_intermediate_size"};
    for (size_t i = 0; i < sizeof moe / sizeof *moe; i++) {
        const qt_json_node *e = qt_json_get(r, moe[i]);
        if (e && !(e->type == QT_JSON_NULL || (e->type == QT_JSON_NUM && e->num == 0)))
            return qt_errf(err, errlen, "%s: %s: a mixture-of-experts model is not supported (dense models only)", path,
                           moe[i]);
    }
    if (qt_json_get(r, "vision_config"))
        return qt_errf(err, errlen, "%s: vision_config: a vision tower is not supported (text models only; Gemma 3's "
                       "text part is read from its text_config)", path);
    const qt_json_node *x = qt_json_get(r, "hidden_act");
    if (x && (x->type != QT_JSON_STR || strcmp(x->str, "silu") != 0))
        return qt_errf(err, errlen, "%s: hidden_act: expected \"silu\", got %s%s", path, x->type == QT_JSON_STR ? x->str : "",
                    x->type == QT_JSON_STR ? "" : qt_hf_type_name(x));
    int flag = 0;
    if (qt_hf_get_bool(path, r, "mlp_bias", 0, &flag, err, errlen)) return -1;
    if (flag) return qt_errf(err, errlen, "%s: mlp_bias: MLP biases are not supported", path);
    return 0;
}

/* model_type in config.json of each arch (qt_arch's order). */
static const char *const arch_type[] = {"qwen2", "llama", "qwen3", "mistral", "gemma3_text"};
static const char *const arch_class[] = {"Qwen2ForCausalLM", "LlamaForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM",
                                         "Gemma3ForCausalLM"};
#define N_ARCH (int)(sizeof arch_type / sizeof *arch_type)

/* The arch whose model_type is mt, or -1. */
static int arch_of(const char *mt) {
    for (int i = 0; i < N_ARCH; i++)
        if (!strcmp(mt, arch_type[i])) return i;
    return -1;
}

/* sliding_window: absent -> def, null -> 0 (none), else an integer >= 1. */
static int get_window(const char *path, const qt_json_node *r, int def, int *out, char *err, size_t errlen) {
    const qt_json_node *x = qt_json_get(r, "sliding_window");
    if (x && x->type == QT_JSON_NULL) { *out = 0; return 0; }
    return qt_hf_get_int(path, r, "sliding_window", def, 1, 1 << 30, out, err, errlen);
}

/* Qwen2's layer_types (transformers writes it from max_window_layers): *from = the number of leading
 * "full_attention" layers, all after them "sliding_attention"; any other pattern is refused. */
static int read_layer_types(const char *path, const qt_json_node *lt, int layers, int *from, char *err, size_t errlen) {
    int n = 0, k = -1;
    if (lt->type != QT_JSON_ARR) return qt_errf(err, errlen, "%s: layer_types: expected an array, got %s", path, qt_hf_type_name(lt));
    for (const qt_json_node *x = lt->child; x; x = x->next, n++) {
        int full = x->type == QT_JSON_STR && !strcmp(x->str, "full_attention");
        int slide = x->type == QT_JSON_STR && !strcmp(x->str, "sliding_attention");
        if (!full && !slide)
            return qt_errf(err, errlen, "%s: layer_types[%d]: expected \"full_attention\" or \"sliding_attention\", got %s%s%s",
                           path, n, x->type == QT_JSON_STR ? "\"" : "", x->type == QT_JSON_STR ? x->str : qt_hf_type_name(x),
                           x->type == QT_JSON_STR ? "\"" : "");
        if (slide && k < 0) k = n;
        if (full && k >= 0)
            return qt_errf(err, errlen,
                           "%s: layer_types[%d]: expected \"sliding_attention\" (full_attention layers first, then "
                           "sliding_attention ones, as max_window_layers gives), got \"full_attention\" after the "
                           "sliding_attention layer %d", path, n, k);
    }
    if (n != layers)
        return qt_errf(err, errlen, "%s: layer_types: expected %d entries (num_hidden_layers), got %d", path, layers, n);
    *from = k < 0 ? n : k;
    return 0;
}

/* The sliding window as transformers reads it: Mistral windows every layer (sliding_window absent:
 * MistralConfig's 4096; null: none); Qwen2 only with use_sliding_window, the layers from
 * max_window_layers on (default 28) or as layer_types lists them; Llama has none. */
static int read_window(const char *path, const qt_json_node *r, qt_model_cfg *c, char *err, size_t errlen) {
    int use = 0;
    if (c->arch == QT_ARCH_MISTRAL) return get_window(path, r, 4096, &c->sliding_window, err, errlen);
    if (c->arch != QT_ARCH_QWEN2) return 0;
    if (qt_hf_get_bool(path, r, "use_sliding_window", 0, &use, err, errlen)) return -1;
    if (!use) return 0;
    if (get_window(path, r, 4096, &c->sliding_window, err, errlen) ||
        qt_hf_get_int(path, r, "max_window_layers", 28, 0, 1 << 30, &c->window_layers_from, err, errlen))
        return -1;
    const qt_json_node *lt = qt_json_get(r, "layer_types");
    if (lt && lt->type != QT_JSON_NULL && read_layer_types(path, lt, c->num_layers, &c->window_layers_from, err, errlen))
        return -1;
    if (!c->sliding_window) c->window_layers_from = 0; /* sliding_window null: no layer has a window */
    return 0;
}


int qt_hf_read_config(const char *path, qt_model_cfg *cfg, char *err, size_t errlen) {
    size_t n;
    char *text = slurp(path, &n, err, errlen);
    if (!text) return -1;
    char jerr[256];
    qt_json *j = qt_json_parse(text, n, jerr, sizeof jerr);
    free(text);
    if (!j) return qt_errf(err, errlen, "%s: invalid JSON: %s", path, jerr);
    const qt_json_node *r = qt_json_root(j), *mt = qt_json_get(r, "model_type");
    qt_model_cfg c;
    memset(&c, 0, sizeof c);
    int rc = -1;
    int gemma = mt && mt->type == QT_JSON_STR && (!strcmp(mt->str, "gemma3_text") || !strcmp(mt->str, "gemma3"));
    if (r->type != QT_JSON_OBJ) qt_errf(err, errlen, "%s: expected a JSON object, got %s", path, qt_hf_type_name(r));
    else if (gemma) rc = qt_hf_gemma_read_config(path, r, &c, err, errlen);
    else if (!mt || mt->type != QT_JSON_STR || arch_of(mt->str) < 0)
        qt_errf(err, errlen, "%s: model_type: expected \"qwen2\", \"llama\", \"qwen3\", \"mistral\", \"gemma3_text\" or "
                "\"gemma3\", got %s%s%s", path,
             mt && mt->type == QT_JSON_STR ? "\"" : "", mt && mt->type == QT_JSON_STR ? mt->str : qt_hf_type_name(mt),
             mt && mt->type == QT_JSON_STR ? "\"" : "");
    else if (!check_unsupported(path, r, err, errlen) && !qt_hf_read_sizes(path, r, &c, err, errlen) &&
             !qt_hf_read_rope(path, r, &c.rope, err, errlen)) {
        c.arch = (qt_arch)arch_of(mt->str);
        int bias = 0;
        rc = 0;
        if (c.arch == QT_ARCH_QWEN2) c.qkv_bias = 1; /* Qwen2 always carries q/k/v biases */
        else if (c.arch == QT_ARCH_MISTRAL) c.qkv_bias = 0; /* Mistral never does */
        else if (qt_hf_get_bool(path, r, "attention_bias", 0, &bias, err, errlen)) rc = -1;
        else if (bias) /* HF Llama's and Qwen3's attention_bias also puts a bias on o_proj, which we do not have */
            rc = qt_errf(err, errlen, "%s: attention_bias: true is not supported for %s (it adds an o_proj bias)", path,
                         mt->str);
        if (!rc) rc = read_window(path, r, &c, err, errlen);
    }
    qt_json_free(j);
    if (rc) return -1;
    qt_model_cfg_finish(&c);
    char verr[256];
    if (qt_model_cfg_validate(&c, verr, sizeof verr)) return qt_errf(err, errlen, "%s: %s", path, verr);
    *cfg = c;
    return 0;
}

/* Shortest %g text that reads back to the same float. */
static void fmt_float(char *out, size_t cap, float x) {
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(out, cap, "%.*g", prec, (double)x);
        if (strtof(out, NULL) == x) return;
    }
}

/* The family's own keys after the common ones: Qwen2's window switch and rule, Mistral's window, Llama's
 * mlp_bias. */
static void family_keys(char *out, size_t cap, const qt_model_cfg *c) {
    int qwen = c->arch == QT_ARCH_QWEN2 || c->arch == QT_ARCH_QWEN3; /* Qwen3's window keys are Qwen2's */
    if (qwen && c->sliding_window > 0)
        snprintf(out, cap, "  \"use_sliding_window\": true,\n  \"sliding_window\": %d,\n  \"max_window_layers\": %d,\n",
                 c->sliding_window, c->window_layers_from);
    else if (qwen)
        snprintf(out, cap, "  \"use_sliding_window\": false,\n");
    else if (c->arch == QT_ARCH_MISTRAL && c->sliding_window > 0)
        snprintf(out, cap, "  \"sliding_window\": %d,\n", c->sliding_window);
    else if (c->arch == QT_ARCH_MISTRAL)
        snprintf(out, cap, "  \"sliding_window\": null,\n");
    else
        snprintf(out, cap, "  \"mlp_bias\": false,\n");
}

static int write_text(const char *path, const char *buf, int k, char *err, size_t errlen);

int qt_hf_write_config(const char *path, const qt_model_cfg *c, int bf16, char *err, size_t errlen) {
    const int qwen = c->arch == QT_ARCH_QWEN2;
    char verr[256]; /* every number written must be one JSON can hold: no inf or nan */
    if (qt_model_cfg_validate(c, verr, sizeof verr)) return qt_errf(err, errlen, "%s: %s", path, verr);
    if (qwen && !c->qkv_bias) return qt_errf(err, errlen, "%s: a qwen2 model must have qkv_bias (use arch llama)", path);
    if (!qwen && c->qkv_bias)
        return qt_errf(err, errlen, "%s: a %s model with qkv_bias has no HF equivalent (use arch qwen2)", path,
                       arch_type[c->arch]);
    char buf[4096];
    int k;
    if (c->arch == QT_ARCH_GEMMA3) {
        char *g = malloc(128 * 1024); /* layer_types lists every layer */
        if (!g) return qt_errf(err, errlen, "%s: out of memory for the config text", path);
        k = qt_hf_gemma_config_json(g, 128 * 1024, c, bf16);
        int rc = k < 0 ? qt_errf(err, errlen, "%s: config text too long", path) : write_text(path, g, k, err, errlen);
        free(g);
        return rc;
    }
    if (c->qk_norm != (c->arch == QT_ARCH_QWEN3))
        return qt_errf(err, errlen, "%s: a %s model %s qk_norm has no HF equivalent (qk_norm is qwen3's)", path,
                       arch_type[c->arch], c->qk_norm ? "with" : "without");
    char eps[32], theta[32], rope[512], scaling[600] = "", fam[160];
    family_keys(fam, sizeof fam, c);
    if (qt_hf_rope_json(rope, sizeof rope, &c->rope) < 0) return qt_errf(err, errlen, "%s: rope parameters text too long", path);
    if (c->rope.type != QT_ROPE_DEFAULT) /* the hub's form (transformers 4); transformers 5 reads rope_parameters */
        snprintf(scaling, sizeof scaling, "  \"rope_scaling\": {%s},\n", rope);
    fmt_float(eps, sizeof eps, c->rms_norm_eps);
    fmt_float(theta, sizeof theta, c->rope_theta);
    const char *dt = bf16 ? "bfloat16" : "float32";
    int head_dim = c->head_dim ? c->head_dim : c->hidden_size / c->num_heads;
    k = snprintf(buf, sizeof buf,
        "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n  \"hidden_size\": %d,\n"
        "  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
        "  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n  \"vocab_size\": %d,\n"
        "  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %s,\n  \"rope_theta\": %s,\n"
        "%s  \"rope_parameters\": {\"rope_theta\": %s, %s},\n"
        "  \"tie_word_embeddings\": %s,\n  \"hidden_act\": \"silu\",\n  \"attention_bias\": %s,\n"
        "  \"attention_dropout\": 0.0,\n  \"initializer_range\": 0.02,\n  \"use_cache\": true,\n%s"
        "  \"torch_dtype\": \"%s\",\n  \"dtype\": \"%s\"\n}\n",
        arch_class[c->arch], arch_type[c->arch], c->hidden_size,
        c->intermediate_size, c->num_layers, c->num_heads, c->num_kv_heads, head_dim, c->vocab_size, c->max_seq_len,
        eps, theta, scaling, theta, rope, c->tie_embeddings ? "true" : "false", c->qkv_bias && !qwen ? "true" : "false",
        fam, dt, dt);
    if (k < 0 || (size_t)k >= sizeof buf) return qt_errf(err, errlen, "%s: config text too long", path);
    return write_text(path, buf, k, err, errlen);
}

/* Writes text[0:k] to path through a temporary file and an atomic rename. */
static int write_text(const char *path, const char *buf, int k, char *err, size_t errlen) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return qt_errf(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
    if (fwrite(buf, 1, (size_t)k, f) != (size_t)k) {
        int e = errno;
        fclose(f);
        unlink(tmp);
        return qt_errf(err, errlen, "%s: write failed: %s", tmp, strerror(e));
    }
    return qt_ckpt_commit_file(f, tmp, path, err, errlen);
}

/* ---- safetensors export ---- */

static int exported(const qt_layout *L, const qt_tensor *t) {
    return !(t->kind == QT_T_LM_HEAD && L->cfg.tie_embeddings);
}

/* The JSON header, padded with spaces to a multiple of 8; caller frees. */
static char *st_header(const qt_layout *L, int bf16, size_t *len) {
    size_t cap = 256 + (size_t)L->n_tensors * 256, k = 0, off = 0;
    char *h = malloc(cap);
    if (!h) return NULL;
    k += (size_t)snprintf(h + k, cap - k, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < L->n_tensors; i++) {
        const qt_tensor *t = &L->tensors[i];
        if (!exported(L, t)) continue;
        size_t bytes = t->numel * (bf16 ? 2 : 4);
        k += (size_t)snprintf(h + k, cap - k, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld", t->name, bf16 ? "BF16" : "F32",
                              (long long)t->shape[0]);
        if (t->ndim == 2) k += (size_t)snprintf(h + k, cap - k, ",%lld", (long long)t->shape[1]);
        k += (size_t)snprintf(h + k, cap - k, "],\"data_offsets\":[%zu,%zu]}", off, off + bytes);
        off += bytes;
    }
    k += (size_t)snprintf(h + k, cap - k, "}");
    while (k % 8) h[k++] = ' ';
    *len = k;
    return h;
}

static int write_tensors(FILE *f, const qt_layout *L, const float *w, int bf16) {
    enum { CHUNK = 1 << 16 };
    uint16_t *buf = bf16 ? malloc(CHUNK * sizeof *buf) : NULL;
    if (bf16 && !buf) return -1;
    int rc = 0;
    for (int i = 0; i < L->n_tensors && !rc; i++) {
        const qt_tensor *t = &L->tensors[i];
        if (!exported(L, t)) continue;
        const float *src = w + t->offset;
        if (!bf16) {
            rc = fwrite(src, 4, t->numel, f) != t->numel;
            continue;
        }
        for (size_t j = 0; j < t->numel && !rc; j += CHUNK) {
            size_t m = t->numel - j < CHUNK ? t->numel - j : CHUNK;
            for (size_t q = 0; q < m; q++) buf[q] = qt_f32_to_bf16(src[j + q]);
            rc = fwrite(buf, 2, m, f) != m;
        }
    }
    free(buf);
    return rc ? -1 : 0;
}

int qt_hf_export(const char *dir, const qt_layout *L, const float *w, int bf16, char *err, size_t errlen) {
    char path[4096], tmp[4200];
    if (qt_ckpt_mkdirs(dir, err, errlen)) return -1;
    if (snprintf(path, sizeof path, "%s/model.safetensors", dir) >= (int)sizeof path)
        return qt_errf(err, errlen, "%s: path too long", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    size_t hlen;
    char *h = st_header(L, bf16, &hlen);
    if (!h) return qt_errf(err, errlen, "%s: out of memory", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        free(h);
        return qt_errf(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
    }
    uint64_t n64 = hlen; /* little-endian host */
    int bad = fwrite(&n64, 8, 1, f) != 1 || fwrite(h, 1, hlen, f) != hlen || write_tensors(f, L, w, bf16);
    free(h);
    if (bad) {
        int e = errno;
        fclose(f);
        unlink(tmp);
        return qt_errf(err, errlen, "%s: write failed: %s", tmp, strerror(e));
    }
    if (qt_ckpt_commit_file(f, tmp, path, err, errlen)) return -1;
    snprintf(path, sizeof path, "%s/config.json", dir);
    return qt_hf_write_config(path, &L->cfg, bf16, err, errlen);
}

static const char *const tokenizer_files[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
    "vocab.json",     "merges.txt",            "tokenizer.model",         "added_tokens.json"};

int qt_hf_check_tokenizer(const char *src, char *err, size_t errlen) {
    char p[4096];
    for (int i = 0; i < 2; i++) { /* tokenizer.json or tokenizer_config.json */
        snprintf(p, sizeof p, "%s/%s", src, tokenizer_files[i]);
        if (access(p, R_OK) == 0) return 0;
    }
    return qt_errf(err, errlen, "data.tokenizer: %s holds no readable tokenizer.json or tokenizer_config.json", src);
}

int qt_hf_export_tokenizer(const char *dir, const char *src_path, int required, char *err, size_t errlen) {
    char from[4096], to[4096], tmp[4200], src[4096];
    int copied = 0;
    struct stat st;
    snprintf(src, sizeof src, "%s", src_path);
    char *slash = strrchr(src, '/');
    if (stat(src, &st) == 0 && S_ISREG(st.st_mode)) { /* a file (init.from's model.safetensors): its folder */
        if (slash) *slash = 0;
        else snprintf(src, sizeof src, ".");
    }
    if (required && qt_hf_check_tokenizer(src, err, errlen)) return -1;
    for (size_t i = 0; i < sizeof tokenizer_files / sizeof *tokenizer_files; i++) {
        snprintf(from, sizeof from, "%s/%s", src, tokenizer_files[i]);
        if (access(from, F_OK) != 0) continue;
        size_t n;
        char *buf = slurp(from, &n, err, errlen);
        if (!buf) return -1;
        snprintf(to, sizeof to, "%s/%s", dir, tokenizer_files[i]);
        snprintf(tmp, sizeof tmp, "%s.tmp", to);
        FILE *f = fopen(tmp, "wb");
        int bad = !f || fwrite(buf, 1, n, f) != n;
        free(buf);
        if (bad) {
            int e = errno;
            if (f) fclose(f), unlink(tmp);
            return qt_errf(err, errlen, "%s: cannot write: %s", tmp, strerror(e));
        }
        if (qt_ckpt_commit_file(f, tmp, to, err, errlen)) return -1;
        copied++;
    }
    return copied;
}

/* ---- safetensors import ---- */

static void shape_str(char *o, size_t cap, const int64_t *s, int nd) {
    if (nd == 1) snprintf(o, cap, "[%lld]", (long long)s[0]);
    else if (nd == 2) snprintf(o, cap, "[%lld, %lld]", (long long)s[0], (long long)s[1]);
    else snprintf(o, cap, "(%d dims)", nd);
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int read_at(FILE *f, void *dst, size_t bytes, long long off) {
    return fseeko(f, (off_t)off, SEEK_SET) == 0 && fread(dst, 1, bytes, f) == bytes ? 0 : -1;
}

/* Copies one tensor's data (dtype dt, at file offset `at`) into dst as fp32. */
static int load_tensor(FILE *f, const char *dt, long long at, float *dst, size_t numel) {
    if (strcmp(dt, "F32") == 0) return read_at(f, dst, numel * 4, at);
    enum { CHUNK = 1 << 16 };
    uint16_t *buf = malloc(CHUNK * 2);
    if (!buf) return -1;
    const int is_bf16 = strcmp(dt, "BF16") == 0;
    int rc = 0;
    for (size_t j = 0; j < numel && !rc; j += CHUNK) {
        size_t m = numel - j < CHUNK ? numel - j : CHUNK;
        rc = read_at(f, buf, m * 2, at + (long long)j * 2);
        for (size_t q = 0; q < m && !rc; q++) dst[j + q] = is_bf16 ? qt_bf16_to_f32(buf[q]) : qt_f16_to_f32(buf[q]);
    }
    free(buf);
    return rc;
}

/* Bytes per element of a safetensors dtype; 0 when unknown. */
static int st_dtype_size(const char *dt) {
    static const struct { const char *name; int size; } t[] = {
        {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
        {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(dt, t[i].name)) return t[i].size;
    return 0;
}

/* A JSON number that is an exact integer in [0, 2^53] (every such double is one). */
static int st_uint(const qt_json_node *x, uint64_t *out) {
    if (!x || x->type != QT_JSON_NUM || !(x->num >= 0) || x->num > 9007199254740992.0 || x->num != floor(x->num))
        return 0;
    *out = (uint64_t)x->num;
    return 1;
}

/* One header entry, checked on its own: dtype, shape, data_offsets. */
typedef struct {
    const qt_json_node *e;
    const qt_tensor *t;   /* the layout tensor it fills; NULL: skipped (tied lm_head, rotary buffers) */
    uint64_t begin, end;  /* data_offsets, relative to the data start */
} st_entry;

/* Checks entry e against the layout and the data size; fills *out. */
static int check_entry(const char *fp, const qt_layout *L, const qt_json_node *e, uint64_t data_bytes, st_entry *out,
                       char *err, size_t errlen) {
    const char *name = e->key;
    const qt_json_node *dt = qt_json_get(e, "dtype"), *sh = qt_json_get(e, "shape"), *of = qt_json_get(e, "data_offsets");
    char text[sizeof L->tensors->name + 32];
    const char *own = name; /* the layout's name: a Gemma 3 multimodal checkpoint's text names, vision skipped */
    int vision = 0;
    if (L->cfg.arch == QT_ARCH_GEMMA3) qt_hf_gemma_text_name(text, sizeof text, name, &vision), own = text;
    const qt_tensor *t = vision ? NULL : qt_layout_find(L, own);
    out->e = e;
    out->t = t;
    if (!t && !vision && !(strcmp(own, "lm_head.weight") == 0 && L->cfg.tie_embeddings) &&
        !ends_with(name, ".rotary_emb.inv_freq"))
        return qt_errf(err, errlen, "%s: %s: unexpected tensor (not in a %s model of this config)", fp, name,
                    arch_type[L->cfg.arch]);
    if (e->type != QT_JSON_OBJ || !dt || dt->type != QT_JSON_STR || !sh || sh->type != QT_JSON_ARR || !of ||
        of->type != QT_JSON_ARR)
        return qt_errf(err, errlen, "%s: %s: header entry needs dtype, shape and data_offsets", fp, name);
    int es = st_dtype_size(dt->str);
    if (t && strcmp(dt->str, "F32") && strcmp(dt->str, "BF16") && strcmp(dt->str, "F16"))
        return qt_errf(err, errlen, "%s: %s: expected dtype F32, BF16 or F16, got %.40s", fp, name, dt->str);
    if (!es) return qt_errf(err, errlen, "%s: %s: unknown dtype %.40s", fp, name, dt->str);
    /* The element count, saturating: a shape of huge dimensions is refused below, never wrapped. */
    int64_t s[2] = {0, 0};
    int nd = 0;
    uint64_t numel = 1;
    for (const qt_json_node *x = sh->child; x; x = x->next, nd++) {
        uint64_t d;
        if (nd >= 8 || !st_uint(x, &d))
            return qt_errf(err, errlen, "%s: %s: shape: expected at most 8 integers in [0, 2^53]", fp, name);
        if (nd < 2) s[nd] = (int64_t)d;
        if (__builtin_mul_overflow(numel, d, &numel)) numel = UINT64_MAX;
    }
    if (t) {
        char want[64], got[64];
        shape_str(want, sizeof want, t->shape, t->ndim);
        shape_str(got, sizeof got, s, nd);
        if (nd != t->ndim || s[0] != t->shape[0] || (nd == 2 && s[1] != t->shape[1]))
            return qt_errf(err, errlen, "%s: %s: expected shape %s, got %s", fp, name, want, got);
    }
    const qt_json_node *b = of->child, *en = b ? b->next : NULL;
    if (!b || !en || en->next || !st_uint(b, &out->begin) || !st_uint(en, &out->end) || out->end < out->begin)
        return qt_errf(err, errlen, "%s: %s: data_offsets: expected [begin, end], integers with begin <= end", fp, name);
    if (out->end > data_bytes)
        return qt_errf(err, errlen, "%s: %s: data_offsets [%llu, %llu] beyond the %llu data bytes (truncated file?)", fp,
                    name, (unsigned long long)out->begin, (unsigned long long)out->end, (unsigned long long)data_bytes);
    uint64_t bytes;
    if (__builtin_mul_overflow(numel, (uint64_t)es, &bytes) || out->end - out->begin != bytes)
        return qt_errf(err, errlen, "%s: %s: data_offsets span %llu bytes, expected %llu elements x %d bytes (%s)", fp,
                    name, (unsigned long long)(out->end - out->begin), (unsigned long long)numel, es, dt->str);
    return 0;
}

static int by_begin(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : x->end < y->end ? -1 : x->end > y->end;
}

/* The entries must tile the data exactly, as the safetensors format requires: sorted by offset,
 * each starts where the previous ended, the first at 0, the last at the end of the file. */
static int check_tiling(const char *fp, st_entry *v, int n, uint64_t data_bytes, char *err, size_t errlen) {
    qsort(v, (size_t)n, sizeof *v, by_begin);
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        if (v[i].begin < at)
            return qt_errf(err, errlen, "%s: %s: data_offsets [%llu, %llu] overlap %s (which ends at %llu)", fp,
                           v[i].e->key, (unsigned long long)v[i].begin, (unsigned long long)v[i].end,
                           v[i - 1].e->key, (unsigned long long)at);
        if (v[i].begin > at)
            return qt_errf(err, errlen, "%s: %s: data_offsets start at %llu, expected %llu (a gap in the data)", fp,
                           v[i].e->key, (unsigned long long)v[i].begin, (unsigned long long)at);
        at = v[i].end;
    }
    if (at != data_bytes)
        return qt_errf(err, errlen, "%s: the tensors cover %llu of the %llu data bytes (trailing bytes)", fp,
                       (unsigned long long)at, (unsigned long long)data_bytes);
    return 0;
}

/* Header of an open safetensors file, parsed; sets *data_start and *data_bytes. */
static qt_json *st_open_header(FILE *f, const char *fp, long long *data_start, uint64_t *data_bytes,
                               char *err, size_t errlen) {
    struct stat st;
    uint64_t hlen = 0;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 8 || fread(&hlen, 8, 1, f) != 1) {
        qt_errf(err, errlen, "%s: too short for a safetensors file (or not a regular file)", fp);
        return NULL;
    }
    if (hlen > HF_MAX_HEADER || hlen > (uint64_t)st.st_size - 8) {
        qt_errf(err, errlen, "%s: header length %llu exceeds the file (%lld bytes; truncated or not safetensors)", fp,
             (unsigned long long)hlen, (long long)st.st_size);
        return NULL;
    }
    char *h = malloc(hlen + 1), jerr[256];
    if (!h || fread(h, 1, hlen, f) != hlen) {
        free(h);
        qt_errf(err, errlen, "%s: cannot read the %llu-byte header", fp, (unsigned long long)hlen);
        return NULL;
    }
    qt_json *j = qt_json_parse(h, hlen, jerr, sizeof jerr);
    free(h);
    if (!j) { qt_errf(err, errlen, "%s: header JSON: %s", fp, jerr); return NULL; }
    if (qt_json_root(j)->type != QT_JSON_OBJ) {
        qt_json_free(j);
        qt_errf(err, errlen, "%s: header JSON: expected an object", fp);
        return NULL;
    }
    *data_start = 8 + (long long)hlen;
    *data_bytes = (uint64_t)st.st_size - 8 - hlen;
    return j;
}

/* Checks a parsed header: every entry, then that they tile the data. *out (caller frees) lists the
 * entries; *n_out their count. */
static int st_check_header(const char *fp, const qt_layout *L, const qt_json *j, uint64_t data_bytes, st_entry **out,
                           int *n_out, char *err, size_t errlen) {
    int n = 0;
    for (const qt_json_node *e = qt_json_root(j)->child; e; e = e->next) n++;
    st_entry *v = calloc((size_t)n + 1, sizeof *v);
    if (!v) return qt_errf(err, errlen, "%s: out of memory for %d header entries", fp, n);
    int k = 0, rc = 0;
    for (const qt_json_node *e = qt_json_root(j)->child; e && !rc; e = e->next)
        if (strcmp(e->key, "__metadata__") != 0) rc = check_entry(fp, L, e, data_bytes, &v[k++], err, errlen);
    if (!rc) rc = check_tiling(fp, v, k, data_bytes, err, errlen);
    if (rc) { free(v); return -1; }
    *out = v;
    *n_out = k;
    return 0;
}

/* Loads every tensor of one file into w, marking seen[]; refuses NaN and Inf weights by name. */
/* The elements [lo, hi) of the flat parameter array that fp holds, into w (w[0] is element lo); every
 * tensor the header lists is checked and marked seen, only the overlapping pieces are read. */
typedef struct {
    size_t lo, hi;
    float *w;
} import_range;

static int import_file(const char *fp, const qt_layout *L, const import_range *r, unsigned char *seen, char *err,
                       size_t errlen) {
    FILE *f = fopen(fp, "rb");
    if (!f) return qt_errf(err, errlen, "%s: cannot open: %s", fp, strerror(errno));
    long long ds;
    uint64_t db;
    st_entry *v = NULL;
    int n = 0;
    qt_json *j = st_open_header(f, fp, &ds, &db, err, errlen);
    int rc = j ? st_check_header(fp, L, j, db, &v, &n, err, errlen) : -1;
    for (int i = 0; i < n && !rc; i++) {
        const qt_tensor *t = v[i].t;
        if (!t) continue;
        int idx = (int)(t - L->tensors);
        const char *dt = qt_json_get(v[i].e, "dtype")->str;
        size_t a = t->offset > r->lo ? t->offset : r->lo, e = t->offset + t->numel < r->hi ? t->offset + t->numel : r->hi;
        float *dst = r->w + (a - r->lo);
        if (seen[idx]) rc = qt_errf(err, errlen, "%s: %s: tensor appears twice", fp, t->name);
        else if (a < e && load_tensor(f, dt, ds + (long long)(v[i].begin + (a - t->offset) * st_dtype_size(dt)), dst, e - a))
            rc = qt_errf(err, errlen, "%s: %s: cannot read the tensor data", fp, t->name);
        for (size_t q = 0; a < e && q < e - a && !rc; q++)
            if (!isfinite(dst[q]))
                rc = qt_errf(err, errlen, "%s: %s: element %zu is %s: expected finite weights", fp, t->name,
                             q + (a - t->offset), isnan(dst[q]) ? "NaN" : "Inf");
        seen[idx] = 1;
    }
    free(v);
    qt_json_free(j);
    fclose(f);
    return rc;
}

/* A sharded checkpoint: imports every file named in index.json's weight_map (once each). */
static int import_sharded(const char *dir, const char *index, const qt_layout *L, const import_range *r,
                          unsigned char *seen, char *err, size_t errlen) {
    size_t n;
    char *text = slurp(index, &n, err, errlen), jerr[256];
    if (!text) return -1;
    qt_json *j = qt_json_parse(text, n, jerr, sizeof jerr);
    free(text);
    if (!j) return qt_errf(err, errlen, "%s: invalid JSON: %s", index, jerr);
    const qt_json_node *wm = qt_json_get(qt_json_root(j), "weight_map");
    int rc = wm && wm->type == QT_JSON_OBJ ? 0 : qt_errf(err, errlen, "%s: weight_map: expected an object", index);
    for (const qt_json_node *e = wm && !rc ? wm->child : NULL; e && !rc; e = e->next) {
        if (e->type != QT_JSON_STR || strchr(e->str, '/')) {
            rc = qt_errf(err, errlen, "%s: weight_map.%s: expected a file name", index, e->key);
            break;
        }
        int dup = 0; /* each shard once: skip a file name met earlier in the map */
        for (const qt_json_node *p = wm->child; p != e && !dup; p = p->next) dup = strcmp(p->str, e->str) == 0;
        if (dup) continue;
        char fp[4096];
        snprintf(fp, sizeof fp, "%s/%s", dir, e->str);
        rc = import_file(fp, L, r, seen, err, errlen);
    }
    qt_json_free(j);
    return rc;
}

/* What init.from names: a directory, a .safetensors file, or a model.safetensors.index.json. */
typedef enum { HF_DIR, HF_FILE, HF_INDEX } hf_source;

static hf_source source_kind(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0) return S_ISDIR(st.st_mode) ? HF_DIR : ends_with(path, ".json") ? HF_INDEX : HF_FILE;
    /* missing: the name says what was meant, so the error names the file that is missing */
    return ends_with(path, ".safetensors") ? HF_FILE : ends_with(path, ".json") ? HF_INDEX : HF_DIR;
}

/* The directory part of a file path ("." for a bare name). */
static void dir_of(const char *path, char *out, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, cap, ".");
    else snprintf(out, cap, "%.*s", slash == path ? 1 : (int)(slash - path), path);
}

int qt_hf_config_path(const char *from, char *out, size_t cap, char *err, size_t errlen) {
    char dir[4096];
    if (source_kind(from) == HF_DIR) snprintf(dir, sizeof dir, "%s", from);
    else dir_of(from, dir, sizeof dir);
    if (snprintf(out, cap, "%s/config.json", dir) >= (int)cap) return qt_errf(err, errlen, "%s: path too long", from);
    return 0;
}

int qt_hf_import_range(const char *path, const qt_layout *L, size_t lo, size_t n, float *w, char *err, size_t errlen) {
    unsigned char *seen = calloc((size_t)L->n_tensors + 1, 1);
    if (!seen) return qt_errf(err, errlen, "%s: out of memory", path);
    memset(w, 0, n * sizeof *w);
    import_range r = {lo, lo + n, w};
    char fp[4096], index[4096], dir[4096];
    struct stat st;
    int rc;
    hf_source kind = source_kind(path);
    snprintf(fp, sizeof fp, "%s/model.safetensors", path);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", path);
    snprintf(dir, sizeof dir, "%s", path);
    if (kind == HF_FILE) snprintf(fp, sizeof fp, "%s", path);
    if (kind == HF_INDEX) {
        snprintf(index, sizeof index, "%s", path);
        dir_of(path, dir, sizeof dir);
    }
    if (kind == HF_INDEX || (kind == HF_DIR && stat(fp, &st) != 0 && stat(index, &st) == 0))
        rc = import_sharded(dir, index, L, &r, seen, err, errlen);
    else rc = import_file(fp, L, &r, seen, err, errlen);
    for (int i = 0; i < L->n_tensors && !rc; i++) {
        const qt_tensor *t = &L->tensors[i];
        char want[64];
        shape_str(want, sizeof want, t->shape, t->ndim);
        if (!seen[i]) rc = qt_errf(err, errlen, "%s: %s: missing tensor (expected shape %s)", path, t->name, want);
    }
    free(seen);
    return rc;
}

int qt_hf_import(const char *path, const qt_layout *L, float *w, char *err, size_t errlen) {
    return qt_hf_import_range(path, L, 0, L->numel, w, err, errlen);
}
