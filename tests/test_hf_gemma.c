/* test_hf_gemma.c — Gemma 3's config.json: transformers 5's form (layer_types, rope_parameters per layer
 * type), the hub's older form (sliding_window_pattern, rope_local_base_freq, rope_scaling), the "gemma3"
 * multimodal file's text_config, the refusals, the export read back, and the multimodal tensor names. */
#include "qt_hf.h"
#include "qt_hf_gemma.h"
#include "qt_test.h"

#include <string.h>
#include <unistd.h>

static char g_path[256];

static int write_text(const char *text) {
    FILE *f = fopen(g_path, "wb");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

/* The sizes of Gemma-3-1B, a 12-layer cut (layer 5 and 11 global). */
#define SIZES "\"hidden_size\": 1152, \"intermediate_size\": 6912, \"num_hidden_layers\": 12, " \
              "\"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"head_dim\": 256, \"vocab_size\": 262144"
#define TYPES "\"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"sliding_attention\", " \
              "\"sliding_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\", " \
              "\"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"full_attention\"]"

static void test_read_forms(void) {
    char err[512];
    qt_model_cfg c;
    /* transformers 5 (Gemma3TextConfig.to_json_string) */
    QT_REQUIRE(write_text("{\"model_type\": \"gemma3_text\", " SIZES ", " TYPES ", \"sliding_window\": 512,"
                          " \"query_pre_attn_scalar\": 256, \"final_logit_softcapping\": null,"
                          " \"hidden_activation\": \"gelu_pytorch_tanh\", \"rope_parameters\": {\"full_attention\":"
                          " {\"factor\": 8.0, \"rope_theta\": 1000000.0, \"rope_type\": \"linear\"}, \"sliding_attention\":"
                          " {\"rope_theta\": 10000.0, \"rope_type\": \"default\"}}, \"max_position_embeddings\": 32768}") == 0,
               "write");
    QT_REQUIRE(qt_hf_read_config(g_path, &c, err, sizeof err) == 0, "read: %s", err);
    QT_EXPECT(c.arch == QT_ARCH_GEMMA3 && c.hidden_size == 1152 && c.num_layers == 12 && c.head_dim == 256 &&
                  c.num_kv_heads == 1 && c.tie_embeddings == 1 && c.qk_norm == 1 && c.sliding_window == 512 &&
                  c.window_pattern == 6 && c.rope_theta == 1e6f && c.rope_local_theta == 1e4f &&
                  c.rope.type == QT_ROPE_LINEAR && c.rope.factor == 8.0f && c.attn_scalar == 256.0f &&
                  c.logit_softcap == 0 && c.max_seq_len == 32768 && c.rms_norm_eps == 1e-6f,
              "fields: pattern %d, theta %g / %g, rope %d", c.window_pattern, c.rope_theta, c.rope_local_theta, c.rope.type);
    /* the hub's Gemma3ForConditionalGeneration: the older keys under text_config, a soft-cap */
    QT_REQUIRE(write_text("{\"model_type\": \"gemma3\", \"architectures\": [\"Gemma3ForConditionalGeneration\"],"
                          " \"vision_config\": {\"model_type\": \"siglip_vision_model\"}, \"text_config\": {\"model_type\":"
                          " \"gemma3_text\", " SIZES ", \"sliding_window\": 1024, \"sliding_window_pattern\": 6,"
                          " \"rope_theta\": 1000000.0, \"rope_local_base_freq\": 10000.0, \"rope_scaling\": {\"factor\":"
                          " 8.0, \"rope_type\": \"linear\"}, \"query_pre_attn_scalar\": 168, \"final_logit_softcapping\": 30.0,"
                          " \"tie_word_embeddings\": false}}") == 0, "write");
    QT_REQUIRE(qt_hf_read_config(g_path, &c, err, sizeof err) == 0, "read: %s", err);
    QT_EXPECT(c.arch == QT_ARCH_GEMMA3 && c.window_pattern == 6 && c.sliding_window == 1024 && c.rope_theta == 1e6f &&
                  c.rope_local_theta == 1e4f && c.rope.type == QT_ROPE_LINEAR && c.attn_scalar == 168.0f &&
                  c.logit_softcap == 30.0f && c.tie_embeddings == 0 && c.vocab_size == 262144,
              "text_config fields: pattern %d, scalar %g, cap %g", c.window_pattern, c.attn_scalar, c.logit_softcap);
    /* Gemma3TextConfig's defaults: theta 1e6 / 1e4, window 4096, pattern 6, scalar 256, head_dim 256 */
    QT_REQUIRE(write_text("{\"model_type\": \"gemma3_text\", \"hidden_size\": 64, \"intermediate_size\": 96,"
                          " \"num_hidden_layers\": 7, \"num_attention_heads\": 2, \"vocab_size\": 100}") == 0, "write");
    QT_REQUIRE(qt_hf_read_config(g_path, &c, err, sizeof err) == 0, "read: %s", err);
    QT_EXPECT(c.rope_theta == 1e6f && c.rope_local_theta == 1e4f && c.sliding_window == 4096 && c.window_pattern == 6 &&
                  c.attn_scalar == 256.0f && c.head_dim == 256 && c.tie_embeddings == 1 &&
                  qt_model_layer_window(&c, 5) == 0 && qt_model_layer_window(&c, 6) == 4096,
              "defaults: theta %g / %g, window %d, pattern %d", c.rope_theta, c.rope_local_theta, c.sliding_window,
              c.window_pattern);
}

static void test_refusals(void) {
    char err[512];
    qt_model_cfg c;
    struct { const char *json, *want; } bad[] = {
        {"{\"model_type\": \"gemma3_text\", " SIZES ", \"hidden_activation\": \"gelu\"}",
         "hidden_activation: expected \"gelu_pytorch_tanh\", got \"gelu\""},
        {"{\"model_type\": \"gemma3_text\", " SIZES ", \"use_bidirectional_attention\": true}",
         "use_bidirectional_attention: true (EmbeddingGemma) is not supported"},
        {"{\"model_type\": \"gemma3_text\", " SIZES ", \"attention_bias\": true}", "attention_bias: true is not supported"},
        {"{\"model_type\": \"gemma3\", " SIZES "}", "text_config: expected an object (model_type gemma3), got nothing"},
        {"{\"model_type\": \"gemma3_text\", \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 3,"
         " \"num_attention_heads\": 2, \"vocab_size\": 100, \"layer_types\": [\"full_attention\", \"sliding_attention\","
         " \"full_attention\"]}",
         "layer_types[1]: expected \"full_attention\" (full_attention on every layer i with (i + 1) % 1 == 0"},
        {"{\"model_type\": \"gemma3_text\", \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 3,"
         " \"num_attention_heads\": 2, \"vocab_size\": 100, \"layer_types\": [\"full_attention\"]}",
         "layer_types: expected 3 entries (num_hidden_layers), got 1"},
        {"{\"model_type\": \"gemma3_text\", " SIZES ", \"rope_parameters\": {\"full_attention\": {\"rope_type\": \"default\"},"
         " \"sliding_attention\": {\"rope_type\": \"linear\", \"factor\": 2.0}}}",
         "rope_parameters.sliding_attention.rope_type: expected \"default\""},
        {"{\"model_type\": \"gemma3_text\", " SIZES ", \"rope_parameters\": {\"full_attention\": {\"rope_type\": \"ntk\"}}}",
         "rope_parameters.full_attention.rope_type: expected"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        QT_REQUIRE(write_text(bad[i].json) == 0, "write");
        QT_EXPECT(qt_hf_read_config(g_path, &c, err, sizeof err) == -1 && strstr(err, bad[i].want) &&
                      strstr(err, g_path),
                  "case %zu: %s", i, err);
    }
}

/* qtrain's export reads back as the same model (every field, the soft-cap and a 27B-like scalar included). */
static void test_write_read(void) {
    char err[512];
    qt_model_cfg c = {.arch = QT_ARCH_GEMMA3, .vocab_size = 100, .hidden_size = 64, .num_layers = 8, .num_heads = 4,
                      .num_kv_heads = 2, .head_dim = 32, .intermediate_size = 96, .max_seq_len = 512,
                      .rope_theta = 1e6f, .rms_norm_eps = 1e-6f, .tie_embeddings = 1, .sliding_window = 16,
                      .window_pattern = 3, .rope_local_theta = 1e4f, .attn_scalar = 168.0f, .logit_softcap = 30.0f,
                      .rope = {.type = QT_ROPE_LINEAR, .factor = 8.0f}}, back;
    qt_model_cfg_finish(&c);
    QT_REQUIRE(qt_hf_write_config(g_path, &c, 1, err, sizeof err) == 0, "write: %s", err);
    QT_REQUIRE(qt_hf_read_config(g_path, &back, err, sizeof err) == 0, "read: %s", err);
    QT_EXPECT(memcmp(&c, &back, sizeof c) == 0, "read back differs: pattern %d/%d, scalar %g/%g, cap %g/%g",
              c.window_pattern, back.window_pattern, c.attn_scalar, back.attn_scalar, c.logit_softcap, back.logit_softcap);
}

static void test_text_names(void) {
    struct { const char *in, *out; int skip; } v[] = {
        {"language_model.model.layers.3.mlp.up_proj.weight", "model.layers.3.mlp.up_proj.weight", 0},
        {"model.language_model.norm.weight", "model.norm.weight", 0},
        {"language_model.lm_head.weight", "lm_head.weight", 0},
        {"model.embed_tokens.weight", "model.embed_tokens.weight", 0},
        {"vision_tower.vision_model.post_layernorm.weight", "", 1},
        {"multi_modal_projector.mm_input_projection_weight", "", 1},
        {"model.vision_tower.vision_model.embeddings.patch_embedding.bias", "", 1},
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        char out[128];
        int skip = -1;
        qt_hf_gemma_text_name(out, sizeof out, v[i].in, &skip);
        QT_EXPECT(skip == v[i].skip && (skip || !strcmp(out, v[i].out)), "%s -> %s (skip %d)", v[i].in, out, skip);
    }
}

int main(void) {
    snprintf(g_path, sizeof g_path, "/tmp/qt_test_hf_gemma_%d.json", (int)getpid());
    QT_RUN(test_read_forms);
    QT_RUN(test_refusals);
    QT_RUN(test_write_read);
    QT_RUN(test_text_names);
    unlink(g_path);
    return qt_test_end();
}
