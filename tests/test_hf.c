/* test_hf.c — the JSON reader, HF config.json round trips and errors, safetensors export/import
 * round trips (fp32 bit-exact, bf16 = RNE-rounded, F16 input), import errors, and (when python3
 * with safetensors is present) a check that another reader accepts our file. */
#include "qt_engine.h"
#include "qt_ckpt.h"
#include "qt_dtype.h"
#include "qt_hf.h"
#include "qt_json.h"
#include "qt_test.h"
#include "qt_train.h"

#include <sys/stat.h>
#include <unistd.h>

static char g_root[256];

static void path_in(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", g_root, name); }

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

/* ---- JSON ---- */

static void test_json_values(void) {
    const char *t = " {\"a\": [1, -2.5e3, 0, 1e-6, true, false, null],\n \"s\": \"q\\\"b\\\\s\\/n\\n\\t\\u00e9\\ud83d\\ude00\","
                    " \"o\": {\"x\": {}}, \"e\": [] , \"z\": \"\"} ";
    char err[256];
    qt_json *j = qt_json_parse(t, strlen(t), err, sizeof err);
    QT_REQUIRE(j, "parse: %s", err);
    const qt_json_node *r = qt_json_root(j), *a = qt_json_get(r, "a"), *s = qt_json_get(r, "s");
    QT_REQUIRE(r->type == QT_JSON_OBJ && a && a->type == QT_JSON_ARR && s && s->type == QT_JSON_STR, "structure");
    const double want[4] = {1, -2500, 0, 1e-6};
    const qt_json_node *x = a->child;
    for (int i = 0; i < 4; i++, x = x->next) QT_REQUIRE(x && x->type == QT_JSON_NUM && x->num == want[i], "a[%d]", i);
    QT_EXPECT(x->type == QT_JSON_BOOL && x->num == 1 && x->next->type == QT_JSON_BOOL && x->next->num == 0, "bools");
    QT_EXPECT(x->next->next->type == QT_JSON_NULL && x->next->next->next == NULL, "null / end");
    /* é = C3 A9, U+1F600 = F0 9F 98 80 */
    QT_EXPECT(strcmp(s->str, "q\"b\\s/n\n\t\xc3\xa9\xf0\x9f\x98\x80") == 0, "string '%s'", s->str);
    const qt_json_node *o = qt_json_get(r, "o");
    QT_EXPECT(o && qt_json_get(o, "x") && qt_json_get(o, "x")->type == QT_JSON_OBJ && !qt_json_get(o, "x")->child, "nested");
    QT_EXPECT(qt_json_get(r, "e") && qt_json_get(r, "e")->child == NULL, "empty array");
    QT_EXPECT(qt_json_get(r, "z") && qt_json_get(r, "z")->str[0] == 0, "empty string");
    QT_EXPECT(qt_json_get(r, "missing") == NULL && qt_json_get(a, "a") == NULL, "absent member");
    QT_EXPECT(r->begin == 1 && t[r->end - 1] == '}', "root range [%zu, %zu)", r->begin, r->end);
    qt_json_free(j);
}

static void test_json_errors(void) {
    struct { const char *text, *want; } c[] = {
        {"{\"a\" 1}", "offset 5: expected ':'"},
        {"[1,]", "offset 3: expected a value"},
        {"\"abc", "offset 0: unterminated string"},
        {"{\"a\":1} x", "offset 8: unexpected 'x'"},
        {"01", "offset 1: unexpected '1'"},
        {"\"\\x\"", "offset 1: invalid escape"},
        {"[1.]", "offset 3: expected a digit"},
        {"\"\\ud800\"", "low surrogate"},
        {"\"\\u12g4\"", "hex digit"},
        {"[1 2]", "offset 3: expected ',' or ']'"},
        {"{1:2}", "offset 1: expected a member name"},
        {"", "offset 0: unexpected end"},
        {"tru", "offset 0: expected a value"},
        {"\"a\nb\"", "control character"},
    };
    char err[256];
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        err[0] = 0;
        qt_json *j = qt_json_parse(c[i].text, strlen(c[i].text), err, sizeof err);
        QT_EXPECT(j == NULL, "accepted '%s'", c[i].text);
        QT_EXPECT(strstr(err, c[i].want) != NULL, "'%s': message '%s', want '%s'", c[i].text, err, c[i].want);
        qt_json_free(j);
    }
    char deep[1001];
    memset(deep, '[', 1000);
    deep[1000] = 0;
    QT_EXPECT(qt_json_parse(deep, 1000, err, sizeof err) == NULL && strstr(err, "nesting"), "deep: %s", err);
    /* Not NUL-terminated: parsing stops at n. */
    qt_json *j = qt_json_parse("123456", 3, err, sizeof err);
    QT_EXPECT(j && qt_json_root(j)->num == 123, "prefix: %s", j ? "wrong value" : err);
    qt_json_free(j);
}

/* ---- config.json ---- */

static qt_model_cfg small_cfg(qt_arch arch, int tied) {
    qt_model_cfg c = {.arch = arch, .vocab_size = 131, .hidden_size = 48, .num_layers = 2, .num_heads = 6,
                      .num_kv_heads = 2, .head_dim = 8, .intermediate_size = 72, .max_seq_len = 512,
                      .rope_theta = 1000000.0f, .rms_norm_eps = 1e-6f, .tie_embeddings = tied,
                      .qkv_bias = arch == QT_ARCH_QWEN2};
    return c;
}

static void test_config_roundtrip(void) {
    char path[512], err[512];
    path_in(path, sizeof path, "config.json");
    for (int k = 0; k < 4; k++) {
        qt_model_cfg c = small_cfg(k & 1 ? QT_ARCH_LLAMA : QT_ARCH_QWEN2, k >> 1), back;
        if (k == 3) { c.rms_norm_eps = 1e-5f; c.rope_theta = 500000.0f; c.head_dim = 16; }
        QT_REQUIRE(qt_hf_write_config(path, &c, k & 1, err, sizeof err) == 0, "write %d: %s", k, err);
        memset(&back, 0x5a, sizeof back);
        QT_REQUIRE(qt_hf_read_config(path, &back, err, sizeof err) == 0, "read %d: %s", k, err);
        QT_EXPECT(memcmp(&c, &back, sizeof c) == 0, "case %d: differs (arch %d/%d C %d/%d eps %g/%g theta %g/%g tie %d/%d bias %d/%d)",
                  k, c.arch, back.arch, c.hidden_size, back.hidden_size, c.rms_norm_eps, back.rms_norm_eps, c.rope_theta,
                  back.rope_theta, c.tie_embeddings, back.tie_embeddings, c.qkv_bias, back.qkv_bias);
    }
    /* The written file carries the transformers names. */
    size_t n = 0;
    char text[4096];
    FILE *f = fopen(path, "rb");
    QT_REQUIRE(f, "reopen");
    n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    /* A value JSON cannot hold is refused rather than written as "inf". */
    qt_model_cfg bad = small_cfg(QT_ARCH_QWEN2, 0);
    bad.rope_theta = INFINITY;
    QT_EXPECT(qt_hf_write_config(path, &bad, 0, err, sizeof err) == -1 && strstr(err, "model.rope_theta"), "inf theta: %s", err);
    QT_EXPECT(strstr(text, "\"LlamaForCausalLM\"") && strstr(text, "\"rope_type\": \"default\"") &&
              strstr(text, "\"dtype\": \"bfloat16\"") && strstr(text, "\"rms_norm_eps\": 1e-05"), "%.600s", text);
}

static void test_config_read_hf(void) {
    char path[512], err[512];
    path_in(path, sizeof path, "hf_config.json");
    /* A Qwen2.5-0.5B-style config (transformers 4 names, rope_theta at top level). */
    QT_REQUIRE(write_text(path,
        "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0, \"bos_token_id\": 151643,\n"
        " \"eos_token_id\": 151643, \"hidden_act\": \"silu\", \"hidden_size\": 896, \"initializer_range\": 0.02,\n"
        " \"intermediate_size\": 4864, \"max_position_embeddings\": 32768, \"max_window_layers\": 24,\n"
        " \"model_type\": \"qwen2\", \"num_attention_heads\": 14, \"num_hidden_layers\": 24,\n"
        " \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000.0,\n"
        " \"sliding_window\": 32768, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\",\n"
        " \"transformers_version\": \"4.43.1\", \"use_cache\": true, \"use_sliding_window\": false,\n"
        " \"vocab_size\": 151936}\n") == 0, "write");
    qt_model_cfg c;
    QT_REQUIRE(qt_hf_read_config(path, &c, err, sizeof err) == 0, "read: %s", err);
    QT_EXPECT(c.arch == QT_ARCH_QWEN2 && c.hidden_size == 896 && c.num_layers == 24 && c.num_heads == 14 &&
              c.num_kv_heads == 2 && c.head_dim == 64 && c.intermediate_size == 4864 && c.vocab_size == 151936 &&
              c.max_seq_len == 32768 && c.rope_theta == 1e6f && c.rms_norm_eps == 1e-6f && c.tie_embeddings == 1 &&
              c.qkv_bias == 1, "fields");
    /* transformers 5: rope_theta only inside rope_parameters. */
    QT_REQUIRE(write_text(path,
        "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 4,"
        " \"intermediate_size\": 96, \"vocab_size\": 100, \"rope_parameters\": {\"rope_theta\": 50000.0,"
        " \"rope_type\": \"default\"}, \"dtype\": \"float32\"}") == 0, "write");
    QT_REQUIRE(qt_hf_read_config(path, &c, err, sizeof err) == 0, "read: %s", err);
    QT_EXPECT(c.arch == QT_ARCH_LLAMA && c.rope_theta == 50000.0f && c.num_kv_heads == 4 && c.qkv_bias == 0 &&
              c.tie_embeddings == 0, "v5 fields");
    struct { const char *text, *want; } bad[] = {
        {"{\"model_type\": \"gpt2\"}", "model_type: expected \"qwen2\", \"llama\", \"qwen3\", \"mistral\", \"gemma3_text\" or \"gemma3\", got \"gpt2\""},
        {"{\"model_type\": \"qwen2\", \"num_hidden_layers\": 1}", "hidden_size: missing"},
        {"{\"model_type\": \"qwen2\", \"hidden_size\": 64.5}", "hidden_size: expected an integer"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 4,"
         " \"intermediate_size\": 96, \"vocab_size\": 100, \"rope_scaling\": {\"rope_type\": \"llama3\"}}", "llama3"},
        {"{\"model_type\": \"llama\", \"hidden_act\": \"gelu\"}", "hidden_act"},
        {"{\"model_type\": \"qwen2\",}", "invalid JSON: offset"},
        /* a string where an integer belongs: no stray "0" after the type */
        {"{\"model_type\": \"qwen2\", \"hidden_size\": \"64\"}",
         "hidden_size: expected an integer in [1, 1073741824], got a string"},
        /* floats must survive the conversion to float: 1e300 used to become inf (and export wrote "inf") */
        {"{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 4,"
         " \"intermediate_size\": 96, \"vocab_size\": 100, \"rope_theta\": 1e300}",
         "rope_theta: expected a number > 0 within the 32-bit float range (1.4e-45 .. 3.4e38), got 1.0000000000000001e+300"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 4,"
         " \"intermediate_size\": 96, \"vocab_size\": 100, \"rms_norm_eps\": 1e-50}", "rms_norm_eps: expected a number > 0"},
        /* sizes: the divisibility check runs for HF configs too, and overflowing products are refused */
        {"{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 6,"
         " \"num_key_value_heads\": 2, \"intermediate_size\": 96, \"vocab_size\": 100}",
         "model.head_dim: unset, and hidden_size (64) is not a multiple of num_heads (6)"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 4, \"num_hidden_layers\": 1, \"num_attention_heads\": 1073741824,"
         " \"num_key_value_heads\": 1073741824, \"head_dim\": 1073741824, \"intermediate_size\": 4, \"vocab_size\": 4}",
         "expected at most 2^31 - 1 rows of the fused q|k|v matrix"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 65536, \"num_hidden_layers\": 4096, \"num_attention_heads\": 64,"
         " \"intermediate_size\": 1000000, \"vocab_size\": 1000000}", "parameters, expected at most 2^40"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        QT_REQUIRE(write_text(path, bad[i].text) == 0, "write");
        err[0] = 0;
        QT_EXPECT(qt_hf_read_config(path, &c, err, sizeof err) == -1, "accepted %s", bad[i].text);
        QT_EXPECT(strstr(err, bad[i].want) && strstr(err, path), "case %zu: '%s'", i, err);
    }
    /* The whole message: it used to read "got a string0". */
    char want[700];
    snprintf(want, sizeof want, "%s: hidden_size: expected an integer in [1, 1073741824], got a string", path);
    QT_REQUIRE(write_text(path, "{\"model_type\": \"qwen2\", \"hidden_size\": \"64\"}") == 0, "write");
    QT_EXPECT(qt_hf_read_config(path, &c, err, sizeof err) == -1 && !strcmp(err, want), "got %s", err);
}

/* RoPE scaling: every type survives write + read; the hub's Llama 3.1 and Qwen3 yarn spellings read;
 * an unknown type, a missing parameter and two dicts that disagree are refused naming the key. */
static void test_config_rope(void) {
    char path[512], err[512], text[4096];
    path_in(path, sizeof path, "rope_config.json");
    qt_rope_cfg cases[4] = {
        {.type = QT_ROPE_LINEAR, .factor = 4},
        {.type = QT_ROPE_DYNAMIC, .factor = 2.5f},
        {.type = QT_ROPE_YARN, .factor = 4, .original_max_pos = 128, .beta_fast = 16, .beta_slow = 2,
         .attention_factor = 1.25f, .truncate = 0},
        {.type = QT_ROPE_LLAMA3, .factor = 8, .original_max_pos = 64, .low_freq_factor = 1, .high_freq_factor = 4},
    };
    for (int k = 0; k < 4; k++) {
        qt_model_cfg c = small_cfg(QT_ARCH_LLAMA, 0), back;
        c.rope = cases[k];
        QT_REQUIRE(qt_hf_write_config(path, &c, 0, err, sizeof err) == 0, "write %d: %s", k, err);
        memset(&back, 0x5a, sizeof back);
        QT_REQUIRE(qt_hf_read_config(path, &back, err, sizeof err) == 0, "read %d: %s", k, err);
        QT_EXPECT(memcmp(&c, &back, sizeof c) == 0, "rope case %d: type %d/%d factor %g/%g orig %d/%d attn %g/%g trunc %d/%d",
                  k, c.rope.type, back.rope.type, c.rope.factor, back.rope.factor, c.rope.original_max_pos,
                  back.rope.original_max_pos, c.rope.attention_factor, back.rope.attention_factor, c.rope.truncate,
                  back.rope.truncate);
    }
    FILE *f = fopen(path, "rb");
    QT_REQUIRE(f, "reopen");
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    QT_EXPECT(strstr(text, "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"original_max_position_embeddings\": 64, "
                           "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0}") &&
              strstr(text, "\"rope_parameters\": {\"rope_theta\": 1e+06, \"rope_type\": \"llama3\", \"factor\": 8.0,"),
              "%.900s", text);
    /* Llama-3.1-8B's config.json (rope_scaling, transformers 4.43) */
    const char *l31 = "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 4,"
                      " \"intermediate_size\": 96, \"vocab_size\": 100, \"max_position_embeddings\": 131072,"
                      " \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
                      " \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0}";
    qt_model_cfg c;
    QT_REQUIRE(write_text(path, l31) == 0 && qt_hf_read_config(path, &c, err, sizeof err) == 0, "llama 3.1: %s", err);
    QT_EXPECT(c.rope.type == QT_ROPE_LLAMA3 && c.rope.factor == 8 && c.rope.low_freq_factor == 1 &&
              c.rope.high_freq_factor == 4 && c.rope.original_max_pos == 8192 && c.rope_theta == 5e5f, "llama 3.1 fields");
    /* Qwen3's long-context yarn in transformers 5's rope_parameters; original_max_position_embeddings
     * defaults to max_position_embeddings; mscale / mscale_all_dim give the attention factor */
    QT_REQUIRE(write_text(path, "{\"model_type\": \"qwen2\", \"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 4,"
                                " \"intermediate_size\": 96, \"vocab_size\": 100, \"max_position_embeddings\": 4096,"
                                " \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"rope_theta\": 1e6,"
                                " \"mscale\": 0.707, \"mscale_all_dim\": 1.0}}") == 0, "write");
    QT_REQUIRE(qt_hf_read_config(path, &c, err, sizeof err) == 0, "yarn: %s", err);
    double want = (0.1 * 0.707 * log(4.0) + 1) / (0.1 * log(4.0) + 1);
    QT_EXPECT(c.rope.type == QT_ROPE_YARN && c.rope.factor == 4 && c.rope.original_max_pos == 4096 && c.rope.truncate == 1 &&
              c.rope.attention_factor == (float)want && c.rope.beta_fast == 0, "yarn fields (attn %g, want %g)",
              c.rope.attention_factor, want);
    struct { const char *rope, *want; } bad[] = {
        {"\"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 2}",
         "rope_scaling.rope_type: expected \"default\", \"linear\", \"dynamic\", \"yarn\" or \"llama3\", got \"longrope\""},
        {"\"rope_parameters\": {\"type\": \"ntk\"}", "rope_parameters.type: expected"},
        {"\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1}",
         "rope_scaling.high_freq_factor: missing (rope_type llama3 needs"},
        {"\"rope_scaling\": {\"rope_type\": \"linear\"}", "rope_scaling.factor: missing (rope_type linear needs"},
        {"\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2}, \"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 4}",
         "rope_scaling (rope_type linear) and rope_parameters (rope_type linear) disagree"},
        {"\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2, \"partial_rotary_factor\": 0.5}",
         "rope_scaling.partial_rotary_factor: only 1"},
        {"\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, \"high_freq_factor\": 1}",
         "model.rope_high_freq_factor: expected a finite number > rope_low_freq_factor (4), got 1"},
        {"\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2, \"truncate\": 1}", "rope_scaling.truncate: expected true or false"},
        /* the other maths a config may ask for: experts, a vision tower */
        {"\"num_local_experts\": 8", "num_local_experts: a mixture-of-experts model is not supported"},
        {"\"num_experts\": 4, \"num_experts_per_tok\": 2", "num_experts: a mixture-of-experts model is not supported"},
        {"\"vision_config\": {\"model_type\": \"clip_vision_model\"}", "vision_config: a vision tower is not supported"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char doc[1024];
        snprintf(doc, sizeof doc, "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1, "
                 "\"num_attention_heads\": 4, \"intermediate_size\": 96, \"vocab_size\": 100, %s}", bad[i].rope);
        QT_REQUIRE(write_text(path, doc) == 0, "write");
        err[0] = 0;
        QT_EXPECT(qt_hf_read_config(path, &c, err, sizeof err) == -1, "accepted %s", doc);
        QT_EXPECT(strstr(err, bad[i].want) && strstr(err, path), "rope case %zu: '%s'", i, err);
    }
}

/* Sliding window: Mistral's and Qwen2's config keys read as transformers reads them, written back in
 * the family's own keys, and the patterns neither can say refused. */
static void test_config_window(void) {
    char path[512], err[512];
    path_in(path, sizeof path, "window.json");
    const char *shape = "\"hidden_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                        " \"intermediate_size\": 96, \"vocab_size\": 100, ";
    struct { const char *keys; qt_arch arch; int window, from, bias; } ok[] = {
        {"\"model_type\": \"mistral\", \"sliding_window\": 4096", QT_ARCH_MISTRAL, 4096, 0, 0}, /* v0.1 */
        {"\"model_type\": \"mistral\", \"sliding_window\": null", QT_ARCH_MISTRAL, 0, 0, 0},    /* v0.3 */
        {"\"model_type\": \"mistral\"", QT_ARCH_MISTRAL, 4096, 0, 0}, /* MistralConfig's default */
        {"\"model_type\": \"qwen2\", \"use_sliding_window\": false, \"sliding_window\": 32", QT_ARCH_QWEN2, 0, 0, 1},
        {"\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"sliding_window\": 32, \"max_window_layers\": 2",
         QT_ARCH_QWEN2, 32, 2, 1},
        {"\"model_type\": \"qwen2\", \"use_sliding_window\": true", QT_ARCH_QWEN2, 4096, 28, 1},
        {"\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"sliding_window\": 8, \"max_window_layers\": 2,"
         " \"layer_types\": [\"full_attention\", \"sliding_attention\", \"sliding_attention\", \"sliding_attention\"]",
         QT_ARCH_QWEN2, 8, 1, 1}, /* layer_types wins, as in transformers */
        {"\"model_type\": \"llama\", \"sliding_window\": 16", QT_ARCH_LLAMA, 0, 0, 0}, /* Llama ignores it */
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text, "{%s%s}", shape, ok[i].keys);
        QT_REQUIRE(write_text(path, text) == 0, "write");
        qt_model_cfg c, back;
        QT_REQUIRE(qt_hf_read_config(path, &c, err, sizeof err) == 0, "case %zu: %s", i, err);
        QT_EXPECT(c.arch == ok[i].arch && c.sliding_window == ok[i].window && c.window_layers_from == ok[i].from &&
                      c.qkv_bias == ok[i].bias,
                  "case %zu: arch %d window %d from %d bias %d", i, c.arch, c.sliding_window, c.window_layers_from, c.qkv_bias);
        QT_REQUIRE(qt_hf_write_config(path, &c, 0, err, sizeof err) == 0, "case %zu write: %s", i, err);
        memset(&back, 0x5a, sizeof back);
        QT_REQUIRE(qt_hf_read_config(path, &back, err, sizeof err) == 0, "case %zu read back: %s", i, err);
        QT_EXPECT(memcmp(&c, &back, sizeof c) == 0, "case %zu: differs after export (window %d/%d from %d/%d)", i,
                  c.sliding_window, back.sliding_window, c.window_layers_from, back.window_layers_from);
    }
    qt_model_cfg m = small_cfg(QT_ARCH_MISTRAL, 0);
    m.sliding_window = 4096;
    QT_REQUIRE(qt_hf_write_config(path, &m, 1, err, sizeof err) == 0, "%s", err);
    char text[4096];
    FILE *f = fopen(path, "rb");
    QT_REQUIRE(f, "reopen");
    text[fread(text, 1, sizeof text - 1, f)] = 0;
    fclose(f);
    QT_EXPECT(strstr(text, "\"MistralForCausalLM\"") && strstr(text, "\"model_type\": \"mistral\"") &&
                  strstr(text, "\"sliding_window\": 4096"), "%.800s", text);
    m.qkv_bias = 1;
    QT_EXPECT(qt_hf_write_config(path, &m, 0, err, sizeof err) == -1 && strstr(err, "a mistral model with qkv_bias"), "%s", err);
    struct { const char *keys, *want; } bad[] = {
        {"\"model_type\": \"mistral\", \"sliding_window\": 0", "sliding_window: expected an integer in [1, 1073741824], got 0"},
        {"\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"layer_types\": [\"sliding_attention\","
         " \"full_attention\", \"full_attention\", \"full_attention\"]",
         "layer_types[1]: expected \"sliding_attention\" (full_attention layers first"},
        {"\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"layer_types\": [\"chunked_attention\"]",
         "layer_types[0]: expected \"full_attention\" or \"sliding_attention\", got \"chunked_attention\""},
        {"\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"layer_types\": [\"full_attention\"]",
         "layer_types: expected 4 entries (num_hidden_layers), got 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char t[1024];
        snprintf(t, sizeof t, "{%s%s}", shape, bad[i].keys);
        QT_REQUIRE(write_text(path, t) == 0, "write");
        qt_model_cfg c;
        err[0] = 0;
        QT_EXPECT(qt_hf_read_config(path, &c, err, sizeof err) == -1 && strstr(err, bad[i].want) && strstr(err, path),
                  "bad case %zu: '%s'", i, err);
    }
}

/* ---- safetensors ---- */

static float *random_weights(const qt_layout *L, uint64_t seed) {
    float *w = malloc(L->numel * sizeof *w);
    if (w) qt_layout_init_weights(L, w, seed, 0.5f);
    /* Biases and norms get non-trivial values too, so every tensor's data is checked. */
    for (int i = 0; w && i < L->n_tensors; i++)
        if (L->tensors[i].ndim == 1)
            for (size_t j = 0; j < L->tensors[i].numel; j++) w[L->tensors[i].offset + j] = 0.001f * (float)(i * 31 + j) - 0.3f;
    return w;
}

static void test_export_import_roundtrip(void) {
    char dir[512], err[512];
    for (int k = 0; k < 8; k++) {
        int bf16 = k % 2, tied = (k / 2) % 2;
        qt_model_cfg c = small_cfg(k >= 6 ? QT_ARCH_QWEN3 : k >= 4 ? QT_ARCH_LLAMA : QT_ARCH_QWEN2, tied);
        if (c.arch == QT_ARCH_QWEN3) c.head_dim = 16; /* != 48 / 6; q_norm / k_norm [16] */
        qt_layout L;
        QT_REQUIRE(qt_layout_init(&L, &c, err, sizeof err) == 0, "layout: %s", err);
        float *w = random_weights(&L, 100 + k), *back = malloc(L.numel * sizeof *back);
        QT_REQUIRE(w && back, "oom");
        for (size_t i = 0; i < L.numel; i++) back[i] = NAN;
        snprintf(dir, sizeof dir, "%s/export%d/sub", g_root, k);
        QT_REQUIRE(qt_hf_export(dir, &L, w, bf16, err, sizeof err) == 0, "export %d: %s", k, err);
        QT_REQUIRE(qt_hf_import(dir, &L, back, err, sizeof err) == 0, "import %d: %s", k, err);
        long bad = -1;
        for (size_t i = 0; i < L.numel && bad < 0; i++) {
            float want = bf16 ? qt_bf16_to_f32(qt_f32_to_bf16(w[i])) : w[i];
            if (memcmp(&want, &back[i], 4) != 0) bad = (long)i;
        }
        QT_EXPECT(bad < 0, "case %d (bf16 %d tied %d): element %ld got %.9g want %.9g", k, bf16, tied, bad,
                  bad >= 0 ? back[bad] : 0, bad >= 0 ? w[bad] : 0);
        char cpath[600];
        qt_model_cfg back_cfg;
        snprintf(cpath, sizeof cpath, "%s/config.json", dir);
        QT_EXPECT(qt_hf_read_config(cpath, &back_cfg, err, sizeof err) == 0 && memcmp(&back_cfg, &L.cfg, sizeof c) == 0,
                  "case %d: config.json: %s", k, err);
        /* A tied model omits lm_head; an untied one carries it. File size = 8 + header + data. */
        char spath[600];
        snprintf(spath, sizeof spath, "%s/model.safetensors", dir);
        struct stat st;
        QT_REQUIRE(stat(spath, &st) == 0, "stat");
        size_t data = 0;
        for (int i = 0; i < L.n_tensors; i++) data += L.tensors[i].numel * (bf16 ? 2 : 4);
        QT_EXPECT((size_t)st.st_size > data && (size_t)st.st_size < data + 8192, "file %lld bytes for %zu data bytes",
                  (long long)st.st_size, data);
        free(w);
        free(back);
        qt_layout_free(&L);
    }
}

/* Writes a safetensors file for L by hand (independent of src/io/hf.c), every tensor as F16 (f16=1)
 * or F32, dropping `drop` and transposing `transpose` in the header. */
static int write_st(const char *path, const qt_layout *L, const float *w, int f16, const char *drop,
                    const char *transpose) {
    size_t cap = 1 << 16, k = 0, off = 0;
    char *h = malloc(cap);
    k += (size_t)snprintf(h, cap, "{");
    for (int i = 0; i < L->n_tensors; i++) {
        const qt_tensor *t = &L->tensors[i];
        if (drop && strcmp(t->name, drop) == 0) continue;
        int tr = transpose && strcmp(t->name, transpose) == 0 && t->ndim == 2;
        size_t bytes = t->numel * (f16 ? 2 : 4);
        k += (size_t)snprintf(h + k, cap - k, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld", k > 1 ? "," : "", t->name,
                              f16 ? "F16" : "F32", (long long)t->shape[tr ? 1 : 0]);
        if (t->ndim == 2) k += (size_t)snprintf(h + k, cap - k, ",%lld", (long long)t->shape[tr ? 0 : 1]);
        k += (size_t)snprintf(h + k, cap - k, "],\"data_offsets\":[%zu,%zu]}", off, off + bytes);
        off += bytes;
    }
    k += (size_t)snprintf(h + k, cap - k, "}");
    FILE *f = fopen(path, "wb");
    uint64_t n = k;
    fwrite(&n, 8, 1, f);
    fwrite(h, 1, k, f);
    for (int i = 0; i < L->n_tensors; i++) {
        const qt_tensor *t = &L->tensors[i];
        if (drop && strcmp(t->name, drop) == 0) continue;
        for (size_t j = 0; j < t->numel; j++) {
            float x = w[t->offset + j];
            if (!f16) { fwrite(&x, 4, 1, f); continue; }
            /* values are multiples of 2^-10 in [-2, 2]: exact in F16 */
            int e = 0;
            uint16_t hv = 0;
            float a = fabsf(x);
            if (a > 0) {
                float mnt = frexpf(a, &e); /* a = mnt * 2^e, mnt in [0.5, 1) */
                hv = (uint16_t)(((e - 1 + 15) << 10) | ((uint16_t)((mnt * 2 - 1) * 1024) & 0x3ff));
            }
            if (x < 0) hv |= 0x8000;
            fwrite(&hv, 2, 1, f);
        }
    }
    free(h);
    return fclose(f);
}

static void test_import_f16_and_tied_mix(void) {
    char path[512], err[512];
    path_in(path, sizeof path, "f16.safetensors");
    qt_model_cfg c = small_cfg(QT_ARCH_QWEN2, 0);
    qt_layout L, Lt;
    QT_REQUIRE(qt_layout_init(&L, &c, err, sizeof err) == 0, "layout: %s", err);
    float *w = calloc(L.numel, 4), *back = malloc(L.numel * 4);
    for (int i = 0; i < L.n_tensors; i++)
        for (size_t j = 0; j < L.tensors[i].numel; j++)
            w[L.tensors[i].offset + j] = (float)((int)((i * 977 + j * 131) % 2001) - 1000) / 1024.0f;
    QT_REQUIRE(write_st(path, &L, w, 1, NULL, NULL) == 0, "write");
    QT_REQUIRE(qt_hf_import(path, &L, back, err, sizeof err) == 0, "import f16: %s", err);
    QT_EXPECT(qt_t_close("f16", back, w, (long)L.numel, 0, 0), "f16 values");
    /* An untied file into a tied model: lm_head.weight is ignored. */
    c.tie_embeddings = 1;
    QT_REQUIRE(qt_layout_init(&Lt, &c, err, sizeof err) == 0, "layout: %s", err);
    QT_REQUIRE(write_st(path, &L, w, 0, NULL, NULL) == 0, "write");
    QT_EXPECT(qt_hf_import(path, &Lt, back, err, sizeof err) == 0, "untied into tied: %s", err);
    QT_EXPECT(back[Lt.final_norm] == w[L.final_norm], "final norm value");
    qt_layout_free(&Lt);
    free(w);
    free(back);
    qt_layout_free(&L);
}

/* path[512] = the test folder's name; the untied qwen2 small_cfg layout in *L, its random weights
 * (seed) in *w and an import buffer in *back; -1 with the test failure recorded when one of them
 * cannot be made. */
static int import_fixture(char *path, const char *name, qt_layout *L, float **w, float **back, uint64_t seed) {
    char err[512];
    path_in(path, 512, name);
    qt_model_cfg c = small_cfg(QT_ARCH_QWEN2, 0);
    QT_EXPECT(qt_layout_init(L, &c, err, sizeof err) == 0, "layout: %s", err);
    if (qt_t_failed) return -1;
    *w = random_weights(L, seed);
    *back = malloc(L->numel * 4);
    QT_EXPECT(*w && *back, "oom");
    return qt_t_failed ? -1 : 0;
}

static void test_import_errors(void) {
    char path[512], err[512];
    qt_layout L;
    float *w, *back;
    if (import_fixture(path, "bad.safetensors", &L, &w, &back, 9)) return;
    /* wrong shape */
    QT_REQUIRE(write_st(path, &L, w, 0, NULL, "model.layers.1.mlp.up_proj.weight") == 0, "write");
    err[0] = 0;
    QT_EXPECT(qt_hf_import(path, &L, back, err, sizeof err) == -1, "transposed accepted");
    QT_EXPECT(strstr(err, path) && strstr(err, "model.layers.1.mlp.up_proj.weight: expected shape [72, 48], got [48, 72]"),
              "shape message: %s", err);
    /* missing tensor, and an untied model without lm_head */
    const char *drops[2] = {"model.layers.0.self_attn.k_proj.bias", "lm_head.weight"};
    for (int i = 0; i < 2; i++) {
        QT_REQUIRE(write_st(path, &L, w, 0, drops[i], NULL) == 0, "write");
        err[0] = 0;
        QT_EXPECT(qt_hf_import(path, &L, back, err, sizeof err) == -1, "missing %s accepted", drops[i]);
        QT_EXPECT(strstr(err, drops[i]) && strstr(err, "missing"), "missing message: %s", err);
    }
    /* an extra, unknown tensor: a llama layout (no biases) reading a qwen2 file */
    qt_model_cfg cl = small_cfg(QT_ARCH_LLAMA, 0);
    qt_layout Ll;
    QT_REQUIRE(qt_layout_init(&Ll, &cl, err, sizeof err) == 0, "layout: %s", err);
    QT_REQUIRE(write_st(path, &L, w, 0, NULL, NULL) == 0, "write");
    QT_EXPECT(qt_hf_import(path, &Ll, back, err, sizeof err) == -1 && strstr(err, "q_proj.bias: unexpected"), "%s", err);
    qt_layout_free(&Ll);
    /* truncated data, truncated header */
    struct stat st;
    QT_REQUIRE(stat(path, &st) == 0, "stat");
    QT_REQUIRE(truncate(path, st.st_size - 3) == 0, "truncate");
    QT_EXPECT(qt_hf_import(path, &L, back, err, sizeof err) == -1 && strstr(err, "lm_head.weight") && strstr(err, "truncated"),
              "truncated data: %s", err);
    QT_REQUIRE(truncate(path, 100) == 0, "truncate");
    QT_EXPECT(qt_hf_import(path, &L, back, err, sizeof err) == -1 && strstr(err, "header length"), "truncated header: %s", err);
    /* bad header JSON */
    FILE *f = fopen(path, "wb");
    const char *hj = "{\"a\": [1, 2}   ";
    uint64_t n = strlen(hj);
    fwrite(&n, 8, 1, f);
    fwrite(hj, 1, n, f);
    fclose(f);
    QT_EXPECT(qt_hf_import(path, &L, back, err, sizeof err) == -1 && strstr(err, "header JSON: offset 11"), "bad JSON: %s", err);
    /* a missing file, a bad dtype */
    path_in(path, sizeof path, "no_such_dir");
    QT_EXPECT(qt_hf_import(path, &L, back, err, sizeof err) == -1 && strstr(err, "no_such_dir/model.safetensors"), "%s", err);
    free(w);
    free(back);
    qt_layout_free(&L);
}

static void test_import_sharded(void) {
    char dir[512], p[700], err[512];
    path_in(dir, sizeof dir, "sharded");
    QT_REQUIRE(qt_ckpt_mkdirs(dir, err, sizeof err) == 0, "%s", err);
    qt_model_cfg c = small_cfg(QT_ARCH_LLAMA, 1);
    qt_layout L;
    QT_REQUIRE(qt_layout_init(&L, &c, err, sizeof err) == 0, "layout: %s", err);
    float *w = random_weights(&L, 4), *back = malloc(L.numel * 4);
    /* shard 1: everything but the final norm; shard 2: the final norm only */
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    QT_REQUIRE(write_st(p, &L, w, 0, "model.norm.weight", NULL) == 0, "write");
    qt_layout one = L;
    one.tensors = (qt_tensor *)qt_layout_find(&L, "model.norm.weight");
    one.n_tensors = 1;
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    QT_REQUIRE(write_st(p, &one, w, 0, NULL, NULL) == 0, "write");
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    QT_REQUIRE(write_text(p, "{\"metadata\": {}, \"weight_map\": {\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","
                             " \"model.norm.weight\": \"model-00002-of-00002.safetensors\","
                             " \"model.layers.0.input_layernorm.weight\": \"model-00001-of-00002.safetensors\"}}") == 0, "w");
    QT_REQUIRE(qt_hf_import(dir, &L, back, err, sizeof err) == 0, "sharded: %s", err);
    QT_EXPECT(memcmp(w, back, L.numel * 4) == 0, "sharded values differ");
    /* init.from may name the index file itself */
    memset(back, 0, L.numel * 4);
    QT_EXPECT(qt_hf_import(p, &L, back, err, sizeof err) == 0 && memcmp(w, back, L.numel * 4) == 0, "index path: %s", err);
    free(w);
    free(back);
    qt_layout_free(&L);
}

/* Rewrites the safetensors file at path with the first `from` in its header replaced by `to` and
 * `extra` zero bytes appended to the data (the header length is recomputed). */
static int patch_st(const char *path, const char *from, const char *to, int extra) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1), *h = malloc((size_t)n + 4096);
    uint64_t hl = 0;
    int ok = b && h && fread(b, 1, (size_t)n, f) == (size_t)n;
    fclose(f);
    if (ok) memcpy(&hl, b, 8);
    char *hdr = ok ? strndup(b + 8, hl) : NULL, *at = hdr ? strstr(hdr, from) : NULL;
    if (at) {
        size_t k = (size_t)snprintf(h, (size_t)n + 4096, "%.*s%s%s", (int)(at - hdr), hdr, to, at + strlen(from));
        uint64_t nh = k;
        f = fopen(path, "wb");
        ok = f && fwrite(&nh, 8, 1, f) == 1 && fwrite(h, 1, k, f) == k &&
             fwrite(b + 8 + hl, 1, (size_t)n - 8 - hl, f) == (size_t)n - 8 - hl;
        for (int i = 0; ok && i < extra; i++) ok = fputc(0, f) != EOF;
        if (f && fclose(f)) ok = 0;
    }
    free(b);
    free(h);
    free(hdr);
    return at && ok ? 0 : -1;
}

/* A header must describe the data exactly (the safetensors rule): overlapping, fractional or gapped
 * data_offsets, trailing bytes, huge shapes and unknown dtypes are refused before any data is read;
 * so are NaN and Inf weights, by tensor name. */
static void test_import_header_and_values(void) {
    char path[512], err[512];
    qt_layout L;
    float *w, *back;
    if (import_fixture(path, "hdr.safetensors", &L, &w, &back, 5)) return;
    /* embed [131, 48] F32 = [0, 25152], then input_layernorm [48] = [25152, 25344] */
    struct { const char *from, *to; int extra; const char *want; } cases[] = {
        {"[25152,25344]", "[25148,25340]", 0,
         "model.layers.0.input_layernorm.weight: data_offsets [25148, 25340] overlap model.embed_tokens.weight"},
        {"[25152,25344]", "[25156,25348]", 0,
         "model.layers.0.input_layernorm.weight: data_offsets start at 25156, expected 25152 (a gap in the data)"},
        {"[0,25152]", "[0.5,25152.5]", 0, "model.embed_tokens.weight: data_offsets: expected [begin, end], integers"},
        {"[0,25152]", "[0,25152]", 8, "the tensors cover"},
        {"\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[48]", "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[1e300]", 0,
         "model.norm.weight: shape: expected at most 8 integers in [0, 2^53]"},
        {"{", "{\"m.rotary_emb.inv_freq\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]},", 0,
         "m.rotary_emb.inv_freq: data_offsets span 0 bytes"},
        {"{", "{\"m.rotary_emb.inv_freq\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,0]},", 0,
         "m.rotary_emb.inv_freq: shape: expected at most 8 integers"},
        {"{", "{\"m.rotary_emb.inv_freq\":{\"dtype\":\"Q4\",\"shape\":[0],\"data_offsets\":[0,0]},", 0,
         "m.rotary_emb.inv_freq: unknown dtype Q4"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        QT_REQUIRE(write_st(path, &L, w, 0, NULL, NULL) == 0, "write");
        QT_REQUIRE(patch_st(path, cases[i].from, cases[i].to, cases[i].extra) == 0, "patch %zu", i);
        err[0] = 0;
        QT_EXPECT(qt_hf_import(path, &L, back, err, sizeof err) == -1 && strstr(err, cases[i].want) && strstr(err, path),
                  "case %zu: %s", i, err);
    }
    /* A well-formed rotary buffer is skipped. */
    QT_REQUIRE(write_st(path, &L, w, 0, NULL, NULL) == 0, "write");
    QT_REQUIRE(patch_st(path, "{", "{\"m.rotary_emb.inv_freq\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},", 0) == 0,
               "patch");
    QT_EXPECT(qt_hf_import(path, &L, back, err, sizeof err) == 0, "empty rotary buffer: %s", err);
    /* NaN and Inf weights: an error naming the tensor, not a divergence blamed on the lr later. */
    const qt_tensor *t = qt_layout_find(&L, "model.layers.1.mlp.down_proj.weight");
    w[t->offset + 7] = NAN;
    QT_REQUIRE(write_st(path, &L, w, 0, NULL, NULL) == 0, "write");
    QT_EXPECT(qt_hf_import(path, &L, back, err, sizeof err) == -1 &&
                  strstr(err, "model.layers.1.mlp.down_proj.weight: element 7 is NaN: expected finite weights"),
              "NaN: %s", err);
    w[t->offset + 7] = -INFINITY;
    QT_REQUIRE(write_st(path, &L, w, 0, NULL, NULL) == 0, "write");
    QT_EXPECT(qt_hf_import(path, &L, back, err, sizeof err) == -1 && strstr(err, "down_proj.weight: element 7 is Inf"),
              "Inf: %s", err);
    free(w);
    free(back);
    qt_layout_free(&L);
}

/* init.from names the model directory or its model.safetensors: both find the config.json. */
static void test_init_from_paths(void) {
    char out[600], err[256], dir[512];
    path_in(dir, sizeof dir, "export0/sub");
    QT_EXPECT(qt_hf_config_path(dir, out, sizeof out, err, sizeof err) == 0 && strstr(out, "export0/sub/config.json") &&
                  !strstr(out, "//"),
              "dir: %s", out);
    strcat(dir, "/model.safetensors");
    QT_EXPECT(qt_hf_config_path(dir, out, sizeof out, err, sizeof err) == 0 && strstr(out, "export0/sub/config.json") &&
                  !strstr(out, "safetensors"),
              "file: %s", out);
    QT_EXPECT(qt_hf_config_path("model.safetensors", out, sizeof out, err, sizeof err) == 0 && !strcmp(out, "./config.json"),
              "bare file: %s", out);
    /* The trainer's setup from init.from = the folder and = its model.safetensors: the same model. */
    qt_model_cfg c = small_cfg(QT_ARCH_LLAMA, 1);
    qt_layout L, L2;
    QT_REQUIRE(qt_layout_init(&L, &c, err, sizeof err) == 0, "layout: %s", err);
    float *w = random_weights(&L, 77), *w1 = NULL, *w2 = NULL;
    path_in(dir, sizeof dir, "from_file");
    QT_REQUIRE(qt_hf_export(dir, &L, w, 0, err, sizeof err) == 0, "export: %s", err);
    static qt_config cfg;
    qt_config_defaults(&cfg);
    cfg.data.seq_len = 16;
    snprintf(cfg.init.from, sizeof cfg.init.from, "%s", dir);
    QT_REQUIRE(qt_model_setup(&cfg, &L2, &w1, err, sizeof err) == 0, "from the folder: %s", err);
    qt_layout_free(&L2);
    snprintf(cfg.init.from, sizeof cfg.init.from, "%s/model.safetensors", dir);
    QT_REQUIRE(qt_model_setup(&cfg, &L2, &w2, err, sizeof err) == 0, "from the file: %s", err);
    QT_EXPECT(L2.numel == L.numel && !memcmp(w1, w2, L.numel * 4) && !memcmp(w, w2, L.numel * 4), "weights differ");
    qt_layout_free(&L2);
    qt_layout_free(&L);
    free(w);
    free(w1);
    free(w2);
}

/* Another reader (the safetensors package) opens our fp32 export: names, shapes, dtypes, values. */
/* Qwen3: a Qwen3-4B config.json (head_dim 128 with hidden 2560 / 32 heads), the config keys transformers reads
 * back, and the combinations HF has no model for refused. */
static void test_qwen3(void) {
    char path[512], err[512];
    path_in(path, sizeof path, "qwen3_config.json");
    QT_REQUIRE(write_text(path,
        "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,\n"
        " \"bos_token_id\": 151643, \"eos_token_id\": 151645, \"head_dim\": 128, \"hidden_act\": \"silu\",\n"
        " \"hidden_size\": 2560, \"initializer_range\": 0.02, \"intermediate_size\": 9728,\n"
        " \"max_position_embeddings\": 40960, \"max_window_layers\": 36, \"model_type\": \"qwen3\",\n"
        " \"num_attention_heads\": 32, \"num_hidden_layers\": 36, \"num_key_value_heads\": 8,\n"
        " \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": null,\n"
        " \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.51.0\",\n"
        " \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}\n") == 0, "write");
    qt_model_cfg c;
    QT_REQUIRE(qt_hf_read_config(path, &c, err, sizeof err) == 0, "read: %s", err);
    QT_EXPECT(c.arch == QT_ARCH_QWEN3 && c.hidden_size == 2560 && c.num_heads == 32 && c.num_kv_heads == 8 &&
              c.head_dim == 128 && c.qk_norm == 1 && c.qkv_bias == 0 && c.tie_embeddings == 1 && c.rope_theta == 1e6f,
              "Qwen3-4B fields: arch %d head_dim %d qk_norm %d qkv_bias %d", c.arch, c.head_dim, c.qk_norm, c.qkv_bias);
    QT_REQUIRE(write_text(path, "{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"num_hidden_layers\": 1,"
                                " \"num_attention_heads\": 4, \"intermediate_size\": 96, \"vocab_size\": 100,"
                                " \"attention_bias\": true}") == 0, "write");
    QT_EXPECT(qt_hf_read_config(path, &c, err, sizeof err) == -1 && strstr(err, "attention_bias") && strstr(err, "qwen3"),
              "attention_bias: %s", err);
    /* the config transformers reads back (the tensors: test_export_import_roundtrip) */
    c = small_cfg(QT_ARCH_QWEN3, 0);
    c.head_dim = 16;
    qt_model_cfg_finish(&c);
    char text[4096];
    path_in(path, sizeof path, "qwen3_out.json");
    QT_REQUIRE(qt_hf_write_config(path, &c, 0, err, sizeof err) == 0, "write: %s", err);
    FILE *f = fopen(path, "rb");
    QT_REQUIRE(f, "reopen");
    text[fread(text, 1, sizeof text - 1, f)] = 0;
    fclose(f);
    QT_EXPECT(strstr(text, "\"Qwen3ForCausalLM\"") && strstr(text, "\"model_type\": \"qwen3\"") &&
              strstr(text, "\"head_dim\": 16") && strstr(text, "\"attention_bias\": false"), "%.900s", text);
    /* No HF model has q/k norms without qwen3's name, or qwen3 without them, or qwen3 with q/k/v biases only. */
    c = small_cfg(QT_ARCH_LLAMA, 0);
    c.qk_norm = 1;
    path_in(path, sizeof path, "qwen3_bad.json");
    QT_EXPECT(qt_hf_write_config(path, &c, 0, err, sizeof err) == -1 && strstr(err, "qk_norm"), "llama + qk_norm: %s", err);
    c = small_cfg(QT_ARCH_QWEN3, 0);
    QT_EXPECT(qt_hf_write_config(path, &c, 0, err, sizeof err) == -1 && strstr(err, "qk_norm"), "qwen3 without: %s", err);
    c.qk_norm = 1;
    c.qkv_bias = 1;
    QT_EXPECT(qt_hf_write_config(path, &c, 0, err, sizeof err) == -1 && strstr(err, "qkv_bias"), "qwen3 + bias: %s", err);
}

/* transformers loads a qwen3 export as Qwen3ForCausalLM with our q_norm / k_norm values. */
static void test_transformers_reads_qwen3_export(void) {
    if (system("python3 -c 'import torch, transformers' >/dev/null 2>&1") != 0)
        QT_SKIP("python3 with torch and transformers not available");
    char dir[512], cmd[2048], err[512];
    path_in(dir, sizeof dir, "qwen3_tf");
    qt_model_cfg c = small_cfg(QT_ARCH_QWEN3, 0);
    c.head_dim = 16;
    qt_layout L;
    QT_REQUIRE(qt_layout_init(&L, &c, err, sizeof err) == 0, "layout: %s", err);
    float *w = random_weights(&L, 91);
    QT_REQUIRE(qt_hf_export(dir, &L, w, 0, err, sizeof err) == 0, "export: %s", err);
    const qt_tensor *kn = qt_layout_find(&L, "model.layers.1.self_attn.k_norm.weight");
    snprintf(cmd, sizeof cmd,
             "python3 -c \"import torch, transformers as t; m = t.AutoModelForCausalLM.from_pretrained('%s'); "
             "assert type(m).__name__ == 'Qwen3ForCausalLM', type(m).__name__; "
             "k = m.model.layers[1].self_attn.k_norm.weight.detach(); "
             "assert k.shape == (16,) and k[0] == torch.tensor(%.9g) and k[15] == torch.tensor(%.9g), (k.shape, k); "
             "assert m.model.layers[0].self_attn.q_proj.weight.shape == (96, 48); print('ok')\"",
             dir, w[kn->offset], w[kn->offset + 15]);
    QT_EXPECT(system(cmd) == 0, "transformers rejected the qwen3 export (see output above)");
    free(w);
    qt_layout_free(&L);
}

static void test_python_reads_export(void) {
    if (system("python3 -c 'import safetensors.numpy, numpy' >/dev/null 2>&1") != 0)
        QT_SKIP("python3 with safetensors and numpy not available");
    char dir[512], py[600], err[512];
    path_in(dir, sizeof dir, "pyexport");
    qt_model_cfg c = small_cfg(QT_ARCH_QWEN2, 1);
    qt_layout L;
    QT_REQUIRE(qt_layout_init(&L, &c, err, sizeof err) == 0, "layout: %s", err);
    float *w = random_weights(&L, 77);
    QT_REQUIRE(qt_hf_export(dir, &L, w, 0, err, sizeof err) == 0, "export: %s", err);
    snprintf(py, sizeof py, "%s/check.py", g_root);
    FILE *f = fopen(py, "w");
    QT_REQUIRE(f, "script");
    fprintf(f, "import sys, numpy as np, safetensors.numpy as st\nd = st.load_file('%s/model.safetensors')\nwant = {\n", dir);
    for (int i = 0; i < L.n_tensors; i++) {
        const qt_tensor *t = &L.tensors[i];
        char shape[64];
        if (t->ndim == 2) snprintf(shape, sizeof shape, "(%lld, %lld)", (long long)t->shape[0], (long long)t->shape[1]);
        else snprintf(shape, sizeof shape, "(%lld,)", (long long)t->shape[0]);
        fprintf(f, " '%s': (%s, %.9g, %.9g),\n", t->name, shape, w[t->offset], w[t->offset + t->numel - 1]);
    }
    fprintf(f, "}\nassert set(d) == set(want), sorted(set(d) ^ set(want))\n"
               "for k, (shape, first, last) in want.items():\n"
               "    a = d[k]\n    assert a.dtype == np.float32 and a.shape == shape, (k, a.dtype, a.shape, shape)\n"
               "    assert a.flat[0] == np.float32(first) and a.flat[-1] == np.float32(last), (k, a.flat[0], first)\n"
               "print('ok', len(d))\n");
    fclose(f);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "python3 '%s'", py);
    QT_EXPECT(system(cmd) == 0, "python reader rejected the export (see output above)");
    free(w);
    qt_layout_free(&L);
}

int main(void) {
    snprintf(g_root, sizeof g_root, "/tmp/qt_test_hf_%d", (int)getpid());
    char err[256];
    if (qt_ckpt_mkdirs(g_root, err, sizeof err)) { printf("FAIL setup: %s\n", err); return 1; }
    QT_RUN(test_json_values);
    QT_RUN(test_json_errors);
    QT_RUN(test_config_roundtrip);
    QT_RUN(test_config_read_hf);
    QT_RUN(test_config_rope);
    QT_RUN(test_config_window);
    QT_RUN(test_export_import_roundtrip);
    QT_RUN(test_import_f16_and_tied_mix);
    QT_RUN(test_import_errors);
    QT_RUN(test_import_sharded);
    QT_RUN(test_import_header_and_values);
    QT_RUN(test_init_from_paths);
    QT_RUN(test_python_reads_export);
    QT_RUN(test_qwen3);
    QT_RUN(test_transformers_reads_qwen3_export);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    if (system(cmd) != 0) fprintf(stderr, "warning: cleanup of %s failed\n", g_root);
    return qt_test_end();
}
