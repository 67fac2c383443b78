/* qt_mutant.h — the planted bugs of the test build (`make MUTANTS=1`, -DQT_MUTANTS, build-mutants/), all of
 * this header inside #ifdef QT_MUTANTS: a release build sees none of it (tools/mutant_guard.py says how library
 * code uses it; tests/qt_test.h takes the names for its case tables). */
#ifndef QT_MUTANT_H
#define QT_MUTANT_H
#ifdef QT_MUTANTS

typedef enum {
    QT_MUT_NONE = 0,
    /* gradient slots (ZeRO-2, offloaded gradients: dp_sync.c) */
    QT_MUT_GRAD_SLOT_NO_WAIT,        /* the backward writes a shared gradient slot before its last user is done */
    QT_MUT_ZERO2_DESC_RANK_SUM,      /* ZeRO-2 sums each bucket in descending rank order (all-gather + adds) */
    QT_MUT_GRAD_SLOT_NOT_ZEROED,     /* offloaded gradients: a shared slot is not zeroed after its store to host */
    QT_MUT_ADAMW_NO_STORE_WAIT,      /* offloaded gradients: the norm and AdamW do not wait for the last stores */
    QT_MUT_GRAD_LOAD_NO_STORE_WAIT,  /* offloaded gradients: a shared slot's load does not wait for its store */
    QT_MUT_HOST_SHARD_ASSIGN,        /* host gradient shard: each micro-step's sum written (=), not added (+=) */
    /* weight slots (ZeRO-3, offloaded weights: weight_slots.c, dp_sync.c) */
    QT_MUT_WSLOT_NO_FREE_WAIT,       /* a weight slot is filled before its last reader ran */
    QT_MUT_WSLOT_NO_FILL_WAIT,       /* the model reads a shared weight slot without waiting for its fill */
    QT_MUT_Z3_STALE_FILL,            /* offloaded ZeRO-3 pieces: each slot filled from a copy of its first gather */
    /* parallel.gather_dtype e4m3 (dp_sync.c) */
    QT_MUT_E4M3_LOCAL_AMAX,          /* each rank quantizes its pieces with their own abs-max (no max over ranks) */
    QT_MUT_E4M3_CODES_ONCE,          /* the codes are made once (stale after the first AdamW) */
    QT_MUT_E4M3_PIECE_NOT_UP,        /* offloaded pieces: codes made in the scratch without copying the piece up */
    /* a host gradient shard (host_shard.c) */
    QT_MUT_SHARD_CHUNK_NOT_UP,       /* a chunk of a piece not cleared is added to without bringing it up first */
    QT_MUT_CLEARED_CHUNK_NOT_ZEROED, /* a cleared piece's chunks are neither brought up nor zeroed in their slots */
    QT_MUT_CLEARED_PIECE_NOT_ZEROED, /* a cleared piece is written or read without being zeroed first */
    QT_MUT_STAGE_REUSE_EARLY,        /* qt_chunk_pipe refills a slot without waiting for its way down */
    /* the offloaded optimizer's streamed weights and gradients (gpu_optim.c) */
    QT_MUT_OPT_W_NOT_DOWN,           /* the updated weights are not copied back down */
    QT_MUT_OPT_G_NOT_UP,             /* the gradients are not copied up */
    QT_MUT_OPT_UP_NO_STREAM_WAIT,    /* the copies up do not wait for the caller's stream (the gradients' writer) */
    /* activations (gpu_model.c, act_store.c) */
    QT_MUT_RECOMPUTE_STALE_H,        /* memory.recompute skips the SwiGLU output h's rebuild for layers 1.. */
    QT_MUT_RECOMPUTE_STALE_LN,       /* fp8 backward: a recomputed qkv / gate|up of layers 1.. reads ln1 / ln2 stale */
    QT_MUT_RESIDUAL_READ_NO_WAIT,    /* offload_residual: a fetched residual read before its copy finished */
    QT_MUT_RESIDUAL_REUSE_NO_WAIT,   /* offload_residual: a slot overwritten before its copy to host finished */
    /* fp8 weight cache none (gpu_fp8.c) */
    QT_MUT_FP8_WSLOT_STALE,          /* the backward reads layers 0..L-3's weight-quant slots unrequantized */
    QT_MUT_FP8_WCACHE_STALE_SCALE,   /* the weights' abs-max is taken only at creation */
    /* reliability (engine_gpu.c, train_ckpt.c, gpu_model.c) */
    QT_MUT_NONFINITE_UNCHECKED,      /* the GPU engines skip the per-step finiteness count of the updated weights */
    QT_MUT_CKPT_UNGUARDED,           /* the offloaded optimizer changes host state the checkpoint writer still reads */
    QT_MUT_ATTENTION_NONDET,         /* perf.deterministic does not reach the attention backward (cuDNN's default) */
    /* packed documents (docs.c) */
    QT_MUT_DOCS_BOUNDARY_IGNORED,    /* attention per document sees the keys of earlier documents (causal) */
    QT_MUT_DOCS_POS_NOT_RESTARTED,   /* RoPE positions run on across documents (t, not t - document start) */
    /* NF4 codec (nf4_ref.c) */
    QT_MUT_NF4_NIBBLE_SWAP,          /* the CPU quantizer packs value 2k in the low nibble, 2k+1 in the high one */
    QT_MUT_NF4_NO_OFFSET,            /* the CPU absmax dequantization leaves out the double quantization's offset */
    /* preference tuning (dpo.c, dpo_cpu.c) */
    QT_MUT_DPO_SWAPPED,              /* the chosen and rejected rows of each pair are read the other way round */
    QT_MUT_DPO_REF_ADAPTED,          /* the reference log-probs are taken with the adapters on (the policy's) */
    QT_MUT_DPO_REF_ROW,              /* the stored reference is read by the row's place in the micro-batch, not its data row */
    /* the NF4 frozen base (base_nf4.c) */
    QT_MUT_NF4_SLOT_STALE,           /* the slot of blocks 1.. is filled with the block before's weights (not refreshed) */
    /* the streamed frozen base (base_stream.c) */
    QT_MUT_BASE_STREAM_WRONG_LAYER,  /* blocks 1.. are copied up from the block before's host bytes */
    QT_MUT_BASE_SHARE_WRONG_LAYER,   /* a rank borrowing another's pinned base copies blocks 1.. from the block before's */
    /* LoRA with an fp8 backward (gpu_model.c) */
    QT_MUT_LORA_FP8_NO_BWD_X,        /* the adapters' data gradient is left out of dx after the base's e4m3 dgrad */
    /* lora.trainable's base tensors on the GPU (engine_gpu_lora.c) */
    QT_MUT_LORA_X_RESUME_MOMENTS,    /* a resume leaves the trained base tensors' AdamW moments at zero */
    /* ZeRO over the nodes (dp_sync.c) */
    QT_MUT_NODES_WEIGHTS_NOT_GATHERED, /* the updated bf16 world pieces are not all-gathered over the nodes */
    QT_MUT_NODES_NORM_MINE,          /* the norm adds this node's world pieces' sums only (no gather over the nodes) */
    QT_MUT_COUNT
} qt_mutant;

/* Makes m the planted bug in force (QT_MUT_NONE: none); src/core/test_hooks.c. */
void qt_mutant_set(qt_mutant m);
/* 1 when m is the planted bug in force: the library's query, inside #ifdef QT_MUTANTS only. */
int qt_mutant_on(qt_mutant m);

#endif
#endif
