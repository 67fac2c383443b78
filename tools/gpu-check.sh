#!/usr/bin/env bash
# gpu-check.sh — what runs on the GPU machine: `tools/gpu-check.sh SUITE...` (default: build unit model).
# Logs go to $OUT (default out/gpu-check): env.txt, then <suite>.log per suite, a summary on stdout.
# `ONLY=regex` runs only the steps whose name matches it whole (`ONLY='test_zero|zero3_host' ...`).
# tools/gpu-par.sh runs several suite lists at once, one GPU each.
#
# Correctness (each step's output says PASS/FAIL; mutant steps say "caught" or "must fail"; the planted
# bugs of include/qt_mutant.h run from the mutant build, build-mutants/, carried by tools/gpu-pack.sh):
#   build        make CUDA_ARCH=90a all
#   unit         the op table (every kernel against the CPU), test_kernels, test_quant, test_fp8_model,
#                test_sft, test_comm_gpu (ranks sharing the GPU); the mutant kernel builds that must fail
#                (MUTANT_BUILD=1 builds the AdamW one; carried ones run as they are)
#   model        transformers comparison (CPU and GPU; packed documents too), test_train (training, resume, data parallel with
#                ranks sharing the GPU), LoRA, QLoRA, auto's LoRA plans and DPO (test_lora, test_lora_fp8, test_qlora,
#                test_plan_lora, test_dpo, test_dpo_ref, test_lora_peft.py on cuda), the export loaded by transformers
#   memory       one GPU, ranks sharing it: test_zero, test_offload, test_recompute (each part), test_stores,
#                test_plan (the plan against the device: cap, arena, attention workspace)
#   multi        several GPUs, one rank per GPU, the probe's transport then host staging: test_comm_gpu,
#                test_zero, offloaded ranks, recompute and training groups, 2 emulated nodes, a failing rank of 4
#   reliability  test_reliability's GPU tests (signals, kills, NaN stop, state written in place), the
#                checkpoint stall at 0.5B (RELIABILITY_BIG=1: 7B too, ~230 GB of disk)
#   python       the binding built against this machine's python3, its CPU and GPU tests
# Measurements (the tables of bench/RESULTS.md, by section; pick rows with ONLY):
#   bench        one GPU: GEMM and kernel benches (2-4), LLM.Q's setting and the larger configs (1),
#                recompute costs (5), LoRA / QLoRA speed and packed documents (15), the families (14), capped plans,
#                plans under a second process's hold (tools/gpu_hold.py) and held-out plans (6), offload (7), pin_bench,
#                python step overhead, tokenizer
#   scale        several GPUs: collectives against NCCL (10), 0.5B/7B scaling (8), data-parallel options
#                at one micro-batch (8), host-transport grid for the cost model, the emulated consumer box (9)
#   perf         build-base/train_bench (the previous commit, carried) against this one, alternated row by
#                row at LLM.Q's setting (0.5B, 1.5B, shipped 7B and 14B fp8); then each LLM.Q row's ceiling as
#                shipped (section 2: a breakdown step per row, tools/step_ceiling.py) and the 7B fp8 plan against 8 x 64
# Data: tinyshakespeare from $QT_DATA_DIR (default ../shared/data, or out/data when carried).
set -uo pipefail
cd "$(dirname "$0")/.."
# The GPU machine's system cuDNN (9.14) is older than the headers we build against (9.19); python3's
# nvidia-cudnn wheel has 9.19. Binaries link cuDNN with a RUNPATH, so this wins whatever path was baked in.
cudnn_lib=$(bash tools/prereqs.sh cudnn-wheel)
if [ -d "$cudnn_lib" ]; then export LD_LIBRARY_PATH=$cudnn_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; fi
OUT=${OUT:-out/gpu-check}
mkdir -p "$OUT"
# the carried binaries (tools/gpu-pack.sh: build/ and the mutant build's build-mutants/) in place; a warm
# device machine keeps the last call's, and a newer make here wins (cp -u)
if [ -f build/dev/bins.tar.xz ]; then t=$(mktemp -d) && tar -C "$t" -xJf build/dev/bins.tar.xz && cp -a -u "$t"/. . && rm -rf "$t"; fi
mut=build-mutants/tests
suites=${*:-build unit model}
export QT_DATA_DIR=${QT_DATA_DIR:-$( [ -f ../shared/data/tinyshakespeare.txt ] && echo ../shared/data || echo out/data )}
export PYTHONUNBUFFERED=1
has() { case " $suites " in *" $1 "*) return 0;; esac; return 1; }
for s in $suites; do
    case " build unit model memory multi reliability python bench scale perf " in *" $s "*) ;;
        *) echo "gpu-check.sh: unknown suite '$s' (build unit model memory multi reliability python bench scale perf)"; exit 2;; esac
done
# ONLY (an extended regex): run only the steps whose name matches it whole
step() { local name=$1 limit=$2; shift 2; [ -z "${ONLY:-}" ] || [[ $name =~ ^($ONLY)$ ]] || return 0; echo "== $name ($(date +%T))"; timeout "$limit" "$@"; echo "== $name: exit $?"; }
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
tb=build/bench/train_bench
set -f # the memory.recompute / memory.offload values below are YAML lists, not globs

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
    echo "commit ${QT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
} > "$OUT/env.txt" 2>&1

# Keys shared by the measurements. llmq: LLM.Q's setting on one GPU (its runs keep AdamW's moments in bf16;
# fp32 master weights and gradients kept). one: one 16 x 1024 micro-batch per optimizer step. auto_keys:
# every planner key handed to memory.plan: auto (CUDA graphs off: streamed weights refuse them). h100_keys:
# an H100's memory (79 GiB) and a 128 GiB host, LLM.Q's precision. box_llmq: LLM.Q's precision on ranks.
moments="--set precision.opt_m_dtype=bf16 --set precision.opt_v_dtype=bf16"
llmq="--warmup 1 --steps 3 $moments --set parallel.gpus=1"
one="--steps 10 --set data.micro_batch=16 --set data.grad_accum=1 --set parallel.gpus=1"
mm_bf16="--set precision.matmul_dtype=bf16 --set precision.grad_dtype=bf16"
mm_fp8="--set precision.matmul_dtype=e4m3 --set precision.grad_dtype=e4m3"
auto_keys="--set memory.plan=auto --set perf.cuda_graphs=false --set parallel.gpus=1"
for k in data.micro_batch memory.recompute memory.offload_optimizer memory.lmhead_chunks memory.offload \
    precision.grad_accum_dtype precision.master_dtype; do auto_keys="$auto_keys --set $k=auto"; done
h100_keys="--set perf.cuda_graphs=false --set parallel.gpus=1 --set memory.gpu_limit_gib=79 \
    --set memory.host_limit_gib=120 --set precision.master_dtype=bf16 --set precision.grad_accum_dtype=bf16 \
    --set precision.opt_m_dtype=bf16 --set precision.opt_v_dtype=bf16"
llmq_keys="--set memory.plan=auto $h100_keys"
for k in data.micro_batch memory.recompute memory.offload_optimizer memory.lmhead_chunks memory.offload; do
    llmq_keys="$llmq_keys --set $k=auto"; done
box_llmq="--set precision.master_dtype=bf16 --set precision.grad_accum_dtype=bf16 --set parallel.gather_dtype=e4m3 --set perf.matmul_autotune=false"
# The Python extension built against this machine's python3 headers and linked with the carried
# build/libqtrain.so (the GPU machine lacks libyaml's headers, so make's prereqs check stops there).
pybuild() {
    local inc suf
    inc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    suf=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
    mkdir -p build/python/qtrain && cp src/python/qtrain/*.py src/python/qtrain/*.pyi src/python/qtrain/py.typed build/python/qtrain/ &&
        cc -std=c11 -O2 -fPIC -D_GNU_SOURCE -Iinclude -I"$inc" -I/usr/local/cuda/include -c src/python/qtrain/_qtrain.c \
            -o build/python/_qtrain.o &&
        cc -shared build/python/_qtrain.o -Lbuild -l:libqtrain.so -Wl,-rpath,"$PWD/build" -o "build/python/qtrain/_qtrain$suf"
}
rname() { local n=${1//[\[\]]/}; n=${n//,/_}; echo "${n:-none}"; } # [ffn,norm] -> ffn_norm, [] -> none
ok='^(PASS|FAIL|SKIP|TIMEOUT|NOT RUN|==)|bitwise|caught|differ|DIFFER|MUTANT|must fail|rror'

if has build; then step build 600 make -j16 CUDA_ARCH=90a all > "$OUT/build.log" 2>&1; tail -3 "$OUT/build.log"; fi

if has unit; then
    { for t in test_ops_gpu test_kernels test_quant test_fp8_model test_sft test_comm_gpu test_internode; do
          QT_LOG_DIR=$OUT step "$t" 300 "build/tests/$t"
      done
      # the AdamW stochastic rounding hashed on the state index instead of the element: the cut test must FAIL
      # (MUTANT_BUILD=1 builds it here, minutes of nvcc; a carried build-mutant/ runs as it is)
      if [ "${MUTANT_BUILD:-0}" = 1 ]; then
          step mutant_sr_build 900 make -j16 CUDA_ARCH=90a BUILD=build-mutant EXTRA_NVFLAGS=-DQT_MUTANT_SR_STATE_INDEX \
              build-mutant/tests/test_kernels
      fi
      if [ -x build-mutant/tests/test_kernels ]; then
          QT_TEST_ONLY=bf16_master step mutant_sr_must_fail 300 build-mutant/tests/test_kernels; fi
      # carried mutant builds of the SwiGLU backward (bf16 rounding left out; the product in another order)
      if [ -x build/tests/test_kernels_mut_swiglu_round ]; then
          QT_TEST_ONLY=swiglu_bwd_quant step mutant_swiglu_round_must_fail 120 build/tests/test_kernels_mut_swiglu_round; fi
      if [ -x build/tests/test_kernels_mut_swiglu_h ]; then
          QT_TEST_ONLY=swiglu_bwd_h step mutant_swiglu_h_must_fail 120 build/tests/test_kernels_mut_swiglu_h; fi
    } 2>&1 | tee "$OUT/unit.log" | grep -E "$ok|final eval|worst cos"
fi

if has model; then
    { step hf_compare 300 env QT_DEVICES=cpu,cuda python3 tests/test_hf_compare.py
      step hf_docs 300 env QT_DEVICES=cpu,cuda BUILD=build python3 tests/test_hf_docs.py
      step docs_cli 600 env BUILD=build python3 tests/test_docs_cli.py
      step test_train 900 build/tests/test_train
      # adapters: LoRA over a bf16 base, QLoRA's NF4 base, auto's LoRA plans, DPO (LoRA and full fine-tuning), PEFT
      for t in test_lora test_lora_fp8 test_qlora test_plan_lora test_dpo test_dpo_ref; do step "$t" 600 "build/tests/$t"; done
      if [ -d $mut ]; then # the e4m3 dgrad without the adapters' dx; a streamed base's wrong layer, a borrowing
          # rank's wrong layer; a resume of the trained base tensors without their moments
          step mut_lora_fp8 300 $mut/test_lora_fp8
          step mut_qlora_stream 300 env QT_TEST_ONLY=stream $mut/test_qlora
          step mut_qlora_share 300 env QT_TEST_ONLY=share $mut/test_qlora
          step mut_lora_trainable 300 env QT_TEST_ONLY=mutant $mut/test_lora
      fi
      step lora_peft 600 env QT_DEVICES=cuda BUILD=build python3 tests/test_lora_peft.py
      # the export carries the run's tokenizer: a byte-level BPE trained here, a short CPU run, then
      # transformers' AutoTokenizer and AutoModelForCausalLM load the export folder
      d=$OUT/sft_export; rm -rf "$d" && mkdir -p "$d/tok"
      python3 - "$QT_DATA_DIR/tinyshakespeare.txt" "$d/tok" <<'PY'
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train([sys.argv[1]], trainers.BpeTrainer(vocab_size=512, special_tokens=["<|endoftext|>"],
                                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save(sys.argv[2] + "/tokenizer.json")
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
           "model_max_length": 64}, open(sys.argv[2] + "/tokenizer_config.json", "w"))
print("tokenizer: vocab", tok.get_vocab_size())
PY
      python3 tools/tokenize --tokenizer "$d/tok/tokenizer.json" "$QT_DATA_DIR/tinyshakespeare.txt" --out "$d/data" --quiet
      step sft_export_train 300 build/qtrain configs/tiny-cpu.yaml --set device=cpu --set model.vocab_size=512 \
          --set "data.train=$d/data/train_*.bin" --set "data.eval=$d/data/eval_*.bin" --set data.tokenizer=$d/tok \
          --set optim.steps=30 --set eval.every=30 --set checkpoint.dir=$d/ck --set log.file=
      step sft_export_load 300 python3 - "$d/ck/export" <<'PY'
import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
t = AutoTokenizer.from_pretrained(sys.argv[1])
m = AutoModelForCausalLM.from_pretrained(sys.argv[1])
ids = t("To be, or not to be", return_tensors="pt").input_ids
print("AutoTokenizer", type(t).__name__, "vocab", len(t), "eos", t.eos_token, "| AutoModelForCausalLM",
      type(m).__name__, "| ids", ids[0].tolist()[:8], "| loss", float(m(ids, labels=ids).loss))
PY
    } 2>&1 | tee "$OUT/model.log" | grep -E "$ok|eval [0-9]|worst|Auto"
fi

# One GPU, data-parallel ranks sharing it: every bitwise test of the memory features at one commit.
# test_recompute runs one part per step (each part bitwise against none in bf16/fp8, graphs, 2 ranks; the
# plan = the arena, the measured peak within its margin); the mutant build's tests catch every planted bug
# of ZeRO, the offloads, recompute and the fp8 weight cache. Then the bitwise
# comparisons at the shapes of MEMORY_SHAPES (qt_test_data.h; default gqa64: Qwen2.5-0.5B's 14/2 heads at seq
# 1024; gqa128: Qwen2.5-7B's 28/4; llama: a held-out 16/4; qwen3: q/k norms, head_dim 128; swa: a window of 128;
# gemma: Gemma-3-like, sandwich norms, local/global layers, soft-cap).
if has memory; then
    { step test_zero 1500 build/tests/test_zero
      step test_offload 1800 build/tests/test_offload
      for part in bf16 fp8 dp_offload plan_matches; do
          step test_recompute_$part 540 env QT_TEST_ONLY=$part build/tests/test_recompute
      done
      if [ -d $mut ]; then
          step mut_zero 1500 env QT_TEST_ONLY=mutants $mut/test_zero
          step mut_offload 1500 env QT_TEST_ONLY=mutants $mut/test_offload
          step mut_recompute 900 env QT_TEST_ONLY=mutant $mut/test_recompute
          step mut_recompute_shared_ln 900 env QT_TEST_ONLY=fp8_shared_inputs $mut/test_recompute
          step mut_kernels_streamed 300 env QT_TEST_ONLY=adamw_offload_streamed $mut/test_kernels
          step mut_train_ckpt 900 env QT_TEST_ONLY=bf16_master_ckpt_bytes $mut/test_train
      fi
      step test_stores 120 build/tests/test_stores
      step test_plan 600 build/tests/test_plan
      # the bitwise comparisons again at real attention shapes (qt_test_data.h), one case per process, LANES
      # (default 16) at once, BITWISE_BUDGET seconds per shape (tools/bitwise_lanes.py; logs in $OUT/lanes)
      for shape in ${MEMORY_SHAPES:-gqa64}; do
          step bitwise_$shape $(( ${BITWISE_BUDGET:-1500} + 60 )) python3 tools/bitwise_lanes.py --shape "$shape" \
              --lanes "${LANES:-16}" --budget "${BITWISE_BUDGET:-1500}" --log "$OUT/lanes"
      done
      # and on packed documents (shards with starts, attention and positions per document)
      step test_recompute_docs 300 env QT_TEST_DOCS=1 QT_TEST_ONLY=bf16 build/tests/test_recompute
      step test_zero_docs 900 env QT_TEST_DOCS=1 QT_TEST_ONLY=equals build/tests/test_zero
      step test_offload_docs 900 env QT_TEST_DOCS=1 QT_TEST_ONLY=gradients_bitwise build/tests/test_offload
    } 2>&1 | tee "$OUT/memory.log" | grep -E "$ok|plan .*peak|saving"
fi

# Several GPUs, one rank per GPU where the tests' rank counts allow (qt_t_ranks), with the probe's
# transport (peer over NVLink) and again with host staging (QT_TEST_COMM=host, a test hook).
if has multi; then
    { nvidia-smi topo -m
      step test_comm_gpu 300 build/tests/test_comm_gpu
      step test_zero_probe 1200 build/tests/test_zero
      for t in zero2_equals_zero1 zero3_equals_zero2 e4m3_gathers; do
          step ${t}_host 400 env QT_TEST_COMM=host QT_TEST_ONLY=$t build/tests/test_zero
      done
      for comm in probe host; do
          c=""; [ "$comm" = host ] && c="QT_TEST_COMM=host"
          step offload_ranks_$comm 400 env $c QT_TEST_ONLY=offload_ranks build/tests/test_offload
          step recompute_dp_$comm 600 env $c QT_TEST_ONLY=dp_offload build/tests/test_recompute
          step train_dp_$comm 600 env $c QT_TEST_ONLY=data_parallel build/tests/test_train
      done
      # two emulated nodes (processes on disjoint GPUs, NCCL over the loopback) against one process (test_nodes_train.py)
      [ "$ngpu" -ge 2 ] && step nodes_train 600 env BUILD=build python3 tests/test_nodes_train.py
      if [ "$ngpu" -ge 4 ]; then # a failure injected into rank 3 of 4 before step 3 stops all with its message
          printf 'data: {train: "%s/fail/train_*.bin", seq_len: 64, micro_batch: 2}\nmodel: {vocab_size: 256, hidden_size: 128, num_layers: 2, num_heads: 2, num_kv_heads: 1, intermediate_size: 256, max_seq_len: 64}\noptim: {steps: 6, warmup: 1}\ncheckpoint: {dir: "%s/fail_ckpt"}\ndevice: cuda\nparallel: {gpus: 4}\n' "$OUT" "$OUT" > "$OUT/fail4.yaml"
          python3 tools/tokenize --byte-level "$QT_DATA_DIR/tinyshakespeare.txt" --out "$OUT/fail" > /dev/null
          start=$(date +%s); step fail_rank3_of_4 120 build/tests/tool_train_fault "$OUT/fail4.yaml" 3 3
          echo "stopped after $(( $(date +%s) - start )) s"
      fi
    } 2>&1 | tee "$OUT/multi.log" | grep -E "$ok|GPU[0-9]|rank 3|stopped"
fi

# test_reliability's GPU tests (SIGINTs at random times and a bit-exact resume, 50 SIGKILLs, a NaN update
# stopping the run, the offloaded state written in place), test_determinism (the shipped configs' shapes
# trained twice and across --stop-after / SIGINT + resume give the same bits; the mutant caught), then the checkpoint stall (training paused per
# checkpoint plus the offloaded optimizer's waits for the writer) at 0.5B for the state on the GPU, offloaded
# and copied, offloaded and written in place; a checkpoint every 4 steps on byte-level shards.
if has reliability; then
    d=$OUT/ckpt_stall; rm -rf "$d" && mkdir -p "$d"
    python3 tools/tokenize --byte-level "$QT_DATA_DIR/tinyshakespeare.txt" --out "$d/data" --eval-frac 0.05 > /dev/null
    common="--set data.train=$d/data/train_*.bin --set eval.every=0 --set data.micro_batch=16 --set data.grad_accum=1
            --set optim.steps=16 --set optim.warmup=2 --set checkpoint.every=4 --set log.every=4 --set parallel.gpus=1"
    # per checkpoint: "paused X s" at the save, "waited Y s" when its write ends: the stall is X + Y
    stalls() { grep -oE 'training paused [0-9.]+ s|optimizer waited [0-9.]+ s' "$1" |
               awk '{v=$(NF-1); if ($1=="training") p[++n]=v; else w[++m]=v}
                    END {for (i=1;i<=n;i++) printf "stall per checkpoint %d: %.3f s (paused %.3f + optimizer waited %.3f)\n", i, p[i]+w[i], p[i], w[i]}'; }
    { QT_TEST_ONLY=_gpu step test_reliability 1200 build/tests/test_reliability
      step test_determinism 900 build/tests/test_determinism
      if [ -d $mut ]; then # the planted bugs: NaN not counted, the writer not waited for, attention nondeterministic
          step mut_nonfinite 600 env QT_TEST_ONLY=nonfinite_unchecked_mutant $mut/test_reliability
          step mut_ckpt_unguarded 600 env QT_TEST_ONLY=offloaded_state_written_in_place $mut/test_reliability
          step mut_determinism 900 env QT_TEST_ONLY=mutant $mut/test_determinism
      fi
      step kernels_bench_adamw 300 build/bench/kernels_bench adamw
      for om in false:auto true:copy true:in_place; do
          o=${om%%:*} m=${om#*:} r=${om/:/_}
          step stall_0.5b_bf16_offload_$r 600 /usr/bin/time -v build/qtrain configs/qwen2.5-0.5b-bf16.yaml $common \
              --set memory.offload_optimizer=$o --set checkpoint.offloaded=$m --set checkpoint.dir=$d/ck_0.5b_$r \
              --set log.file=$d/0.5b_$r.jsonl > "$d/0.5b_$r.out" 2>&1
          cat "$d/0.5b_$r.out"; stalls "$d/0.5b_$r.out"; rm -rf "$d/ck_0.5b_$r"
      done
      if [ "${RELIABILITY_BIG:-0}" = 1 ]; then # 7B fp8 offloaded, a checkpoint every 2 steps: two 106 GB files
          avail=$(df -BG --output=avail "$d" | tail -1 | tr -dc 0-9)
          if [ "${avail:-0}" -lt 230 ]; then
              echo "== stall_7b_fp8_offload: skipped: ${avail} GB free under $d, two 7B checkpoints need ~230 GB"
          else
              step stall_7b_fp8_offload 1500 /usr/bin/time -v build/qtrain configs/qwen2.5-7b-fp8.yaml $common \
                  --set data.micro_batch=8 --set data.grad_accum=16 --set optim.steps=6 --set checkpoint.every=2 \
                  --set checkpoint.keep=1 --set log.every=1 --set checkpoint.dir=$d/ck_7b --set log.file=$d/7b.jsonl > "$d/7b.out" 2>&1
              cat "$d/7b.out"; stalls "$d/7b.out"; rm -rf "$d/ck_7b"
          fi
      fi
    } 2>&1 | tee "$OUT/reliability.log" |
        grep -E "$ok|SIGINTs|SIGKILLs|mutant|checkpoints, training|paused|saved|stall per|snapshot:|adamw_fp32|Maximum resident"
fi

if has python; then
    { step python_build 600 bash -c "$(declare -f pybuild); pybuild"
      step python_cpu 900 env PYTHONPATH=build/python python3 tests/test_python.py
      step python_gpu 1500 env PYTHONPATH=build/python python3 tests/test_python_gpu.py
    } > "$OUT/python.log" 2>&1; grep -E '^(PASS|FAIL|SKIP|==)|RESULT|rror' "$OUT/python.log" | head -60
fi

# One GPU. Step names are the rows of bench/RESULTS.md; each run prints a RESULT line.
if has bench; then
    b7="configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 1"
    { # GEMM ceilings and memory-bound kernels (sections 3, 4)
      step gemm_bench 300 build/bench/gemm_bench
      for c in q7b q14b; do step gemm_$c 300 build/bench/gemm_bench $c; done
      for c in q7b q14b; do step gemm_real_$c 300 build/bench/gemm_bench $c-down real; done
      step kernels_bench 200 build/bench/kernels_bench
      step quant_bench 200 build/bench/quant_bench
      step quant_bench_swiglu 120 build/bench/quant_bench swiglu
      # LLM.Q's setting, the configs as shipped (section 1)
      step llmq_0.5b_bf16 300 $tb configs/qwen2.5-0.5b-bf16.yaml $llmq
      step llmq_0.5b_fp8 300 $tb configs/qwen2.5-0.5b-fp8.yaml $llmq
      step llmq_1.5b_bf16 300 $tb configs/qwen2.5-1.5b-fp8.yaml $llmq $mm_bf16
      step llmq_1.5b_fp8 300 $tb configs/qwen2.5-1.5b-fp8.yaml $llmq
      step llmq_3b_bf16 400 $tb configs/qwen2.5-3b-bf16.yaml $llmq
      step llmq_7b_fp8 600 $tb configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 2 $moments --set parallel.gpus=1
      step llmq_14b_fp8 600 $tb configs/qwen2.5-14b-fp8.yaml --warmup 1 --steps 1 $moments --set parallel.gpus=1
      for m in 7b 14b; do for dt in fp8 bf16; do # an H100's memory, LLM.Q's precision
          mm=""; [ "$dt" = bf16 ] && mm=$mm_bf16
          step h100_llmq_${m}_$dt 600 $tb configs/qwen2.5-$m-fp8.yaml --warmup 1 --steps 1 $llmq_keys $mm
      done; done
      # against PyTorch at one 16 x 1024 micro-batch per step
      step one_0.5b_bf16 300 $tb configs/qwen2.5-0.5b-bf16.yaml $one
      step one_0.5b_fp8 300 $tb configs/qwen2.5-0.5b-fp8.yaml $one
      step torch_eager 300 python3 bench/torch_baseline.py --model qwen2.5-0.5b --micro-batch 16
      step torch_compile 300 python3 bench/torch_baseline.py --model qwen2.5-0.5b --micro-batch 16 --compile
      # recompute at equal micro-batch (section 5): each set, then none and [swiglu, norm] alternated
      for r in "[]" "[swiglu]" "[norm]" "[ffn]" "[ffn,norm]" "[block]"; do
          step "rc_1.5b_fp8_$(rname "$r")" 240 $tb configs/qwen2.5-1.5b-fp8.yaml $one --set "memory.recompute=$r"
      done
      k7="--set memory.plan=manual $h100_keys --set data.grad_accum=16 --set memory.offload_optimizer=true --set data.micro_batch=8 --set memory.fp8_weight_cache=all"
      for rep in 1 2 3; do for r in "[]" "[swiglu,norm]"; do
          step "rc_ab_1.5b_fp8_${rep}_$(rname "$r")" 240 $tb configs/qwen2.5-1.5b-fp8.yaml $one --set "memory.recompute=$r"
          step "rc_ab_1.5b_bf16_${rep}_$(rname "$r")" 240 $tb configs/qwen2.5-1.5b-fp8.yaml $one $mm_bf16 --set "memory.recompute=$r"
          [ "$rep" = 3 ] || step "rc_ab_7b_fp8_${rep}_$(rname "$r")" 200 $tb configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 2 $k7 --set "memory.recompute=$r"
      done; done
      # LoRA and QLoRA against full fine-tuning at 7B, a bf16 base, 65,536 tokens per step (section 15)
      lo="configs/qwen2.5-7b-bf16.yaml --warmup 1 --steps 3 --set data.grad_accum=8"
      step lora_7b_full 300 $tb $lo
      step lora_7b_r16 300 $tb $lo --set lora.rank=16
      step lora_7b_qlora_24 300 $tb $lo --set lora.rank=16 --set lora.base_dtype=nf4 --set memory.gpu_limit_gib=24
      f8="configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 5 --set data.grad_accum=8"
      step lora_7b_fp8_full 300 $tb $f8
      step lora_7b_fp8_r16 300 $tb $f8 --set lora.rank=16
      step lora_70b_qlora_24 400 $tb configs/llama-3.1-70b-qlora-24gb.yaml --warmup 1 --steps 2
      # packed documents against causal attention (section 15): lengths log-normal around 400 tokens
      step docs_7b_fp8_causal 300 $tb $f8
      step docs_7b_fp8_document 300 $tb $f8 --docs 400
      # the families at LLM.Q's precision, grad_accum 8 (section 14), the 7B fp8 config as the reference
      for m in qwen2.5-7b-fp8 qwen3-8b-fp8 llama-3.1-8b-fp8 gemma-3-4b-fp8 gemma-3-12b-fp8; do
          step "family_$m" 400 $tb configs/$m.yaml --warmup 1 --steps 3 --set data.grad_accum=8
      done
      # a second process holding all but N GiB, no memory.gpu_limit_gib: auto plans under the free memory (section 6)
      held() { local gib=$1 name=$2; shift 2; rm -f "$OUT/hold_ready"; python3 tools/gpu_hold.py "$gib" "$OUT/hold_ready" & local hp=$!
               for i in $(seq 60); do [ -f "$OUT/hold_ready" ] && break; sleep 1; done; cat "$OUT/hold_ready" 2>/dev/null
               step "$name" 600 "$@"; kill $hp; wait $hp 2>/dev/null; }
      held 24 held_7b_fp8_24 $tb configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 1
      held 16 held_7b_fp8_16 $tb configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 1
      held 24 held_70b_qlora_24 $tb configs/llama-3.1-70b-qlora-24gb.yaml --warmup 1 --steps 2 --set memory.gpu_limit_gib=0
      # one GPU held to a cap, every planner key auto, and hand-picked plans (section 6)
      hand="--set parallel.gpus=1 --set perf.cuda_graphs=false --set memory.offload=[weights,gradients,master,m,v,residual]
            --set precision.master_dtype=bf16 --set precision.grad_accum_dtype=bf16 --set data.micro_batch=8 --set data.grad_accum=8
            --set memory.recompute=[block] --set memory.fp8_weight_cache=none --set memory.lmhead_chunks=4"
      step capped_7b_24_g16 600 $tb $b7 $auto_keys --set precision.grad_accum_dtype=bf16 --set memory.gpu_limit_gib=24
      step capped_14b_24_host120 600 $tb configs/qwen2.5-14b-fp8.yaml --warmup 1 --steps 1 --set data.micro_batch=16 \
          --set data.grad_accum=32 $auto_keys --set memory.gpu_limit_gib=24 --set memory.host_limit_gib=120
      step capped_7b_16_auto 600 $tb $b7 --set data.micro_batch=8 --set data.grad_accum=8 $auto_keys --set memory.gpu_limit_gib=16
      step capped_7b_16_auto_bf16 600 $tb $b7 --set data.micro_batch=8 --set data.grad_accum=8 $auto_keys \
          --set precision.master_dtype=bf16 --set precision.grad_accum_dtype=bf16 --set memory.gpu_limit_gib=16
      step capped_7b_16_hand 600 $tb $b7 $hand --set memory.gpu_limit_gib=16
      step capped_7b_12_auto 600 $tb $b7 --set data.micro_batch=4 --set data.grad_accum=4 $auto_keys --set memory.gpu_limit_gib=12
      step capped_7b_80_auto 600 $tb $b7 $auto_keys --set memory.gpu_limit_gib=80
      step capped_7b_80_config 600 $tb $b7 --set parallel.gpus=1 --set memory.gpu_limit_gib=80
      # held-out plans for the cost model (tests/test_plan cost_held_out)
      g3="$tb configs/qwen2.5-3b-bf16.yaml --warmup 1 --steps 2 --set parallel.gpus=1 --set data.grad_accum=8"
      g7="$tb configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 2 --set parallel.gpus=1 --set perf.cuda_graphs=false"
      step held_3b_none_opt_mb8 300 $g3 --set data.micro_batch=8 --set "memory.recompute=[]" --set memory.offload_optimizer=true
      step held_3b_swiglunorm_mb16 300 $g3 --set data.micro_batch=16 --set "memory.recompute=[swiglu,norm]" --set memory.offload_optimizer=false
      step held_3b_block_lm4_mb32 300 $g3 --set data.micro_batch=32 --set data.grad_accum=4 --set "memory.recompute=[block]" --set memory.lmhead_chunks=4
      step held_7b_ffnnorm_mb16 400 $g7 --set data.micro_batch=16 --set data.grad_accum=16 --set "memory.recompute=[ffn,norm]"
      step held_7b_qkvatt_mb4 400 $g7 --set data.micro_batch=4 --set data.grad_accum=32 --set "memory.recompute=[qkv,att,ffn,norm]"
      for dt in fp8 bf16; do
          mm=""; [ "$dt" = bf16 ] && mm=$mm_bf16
          step held_14b_$dt 600 $tb configs/qwen2.5-14b-fp8.yaml --warmup 1 --steps 1 $auto_keys $mm \
              --set memory.gpu_limit_gib=79 --set memory.host_limit_gib=120
      done
      # offload (section 7): the optimizer state, where AdamW reads it, streamed weights, residuals
      for m in 0.5b 1.5b; do for o in false true; do
          mm=""; [ "$m" = 1.5b ] && mm=$mm_bf16
          c=configs/qwen2.5-$m-fp8.yaml; [ "$m" = 0.5b ] && c=configs/qwen2.5-0.5b-bf16.yaml
          step offload_opt_${o}_${m}_bf16 300 $tb $c $llmq $mm --set memory.offload_optimizer=$o
      done; done
      hb="$tb configs/qwen2.5-1.5b-fp8.yaml --warmup 1 --steps 3 --set parallel.gpus=1 --set memory.offload_optimizer=true"
      step ha_slots_pinned 300 $hb
      step ha_zerocopy_pinned 300 $hb --set memory.zero_copy=true
      step ha_slots_wc 300 $hb --set memory.host_alloc=write_combined
      step ha_zerocopy_wc 300 $hb --set memory.zero_copy=true --set memory.host_alloc=write_combined
      w="$tb configs/qwen2.5-1.5b-fp8.yaml --warmup 1 --steps 3 --set parallel.gpus=1 --set perf.cuda_graphs=false --set data.micro_batch=8
         --set data.grad_accum=8 --set memory.offload_optimizer=false --set memory.fp8_weight_cache=none"
      step offload_w_none 300 $w --set "memory.offload=[]"
      step offload_w_weights 400 $w --set "memory.offload=[weights]"
      step offload_w_quants 400 $w --set "memory.offload=[weights,quants]"
      for r in "[block]" "[ffn,norm]"; do for o in false true; do
          step "or_1.5b_$(rname "$r")_$o" 240 $tb configs/qwen2.5-1.5b-fp8.yaml $one --set "memory.recompute=$r" --set memory.offload_residual=$o
      done; done
      step pin_bench 300 build/bench/pin_bench --gib "${PIN_GIB:-32}" --ranks "${PIN_RANKS:-4}"
      step python_overhead 1500 bash -c "$(declare -f pybuild); pybuild && PYTHONPATH=build/python:tests python3 -c \
          'import sys, qt_test, test_python_gpu as t; sys.exit(qt_test.run_tests(vars(t), only=(\"test_overhead_0_5b\",)))'"
      step tokenize_bench 900 python3 bench/tokenize_bench.py --source "$QT_DATA_DIR/tinyshakespeare.txt"
    } 2>&1 | tee "$OUT/bench.log" | grep -E '^(==|FAIL)|RESULT|tokens/s|chosen|NOTE|rror|x [0-9]' | head -300
fi

# Several GPUs (all visible ones unless a step says). SCALE_MODELS (default "0.5b 7b"); BOX_MODELS (default
# "7b 14b 32b"), BOX_GPUS (4), BOX_SEQS (sequences per rank and step, 128), BOX_BINS (train_bench names
# under build/bench to run one after the other, e.g. "train_bench_main train_bench" for an A/B).
if has scale; then
    { step comm_bench 600 env BENCH_OUT="$OUT/comm" BUILD=build bash bench/run.sh
      for m in ${SCALE_MODELS:-0.5b 7b}; do
          s="$tb configs/qwen2.5-$m-fp8.yaml --warmup 1 --steps 3"; acc=16
          [ "$m" = 7b ] && s="$tb configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 1 --set memory.host_limit_gib=400" && acc=64
          for n in 1 2 4; do
              [ "$n" -le "$ngpu" ] || continue
              for z in 1 2 3; do for comm in auto host; do
                  [ "$n" -gt 1 ] || { [ "$z" = 1 ] && [ "$comm" = auto ]; } || continue
                  z3=""; [ "$z" = 3 ] && z3="--set perf.cuda_graphs=false" # ZeRO-3 runs without CUDA graphs
                  step scale_${m}_${n}gpu_zero${z}_$comm 600 $s --set parallel.gpus=$n --set parallel.zero=$z \
                      --set data.grad_accum=$((acc / n)) --set parallel.comm=$comm $z3
              done; done
          done
      done
      # one 16 x 1024 micro-batch per GPU per step, where the sums weigh most: overlap and bf16 sums
      small="--steps 10 --set data.micro_batch=16 --set data.grad_accum=1"
      step dp_small_1gpu 300 $tb configs/qwen2.5-0.5b-bf16.yaml $small --set parallel.gpus=1
      for comm in auto host; do
          for ov in false true; do
              step dp_small_${comm}_overlap_$ov 300 $tb configs/qwen2.5-0.5b-bf16.yaml $small --set parallel.comm=$comm --set parallel.overlap_comm=$ov
          done
          step dp_small_${comm}_bf16_sums 300 $tb configs/qwen2.5-0.5b-bf16.yaml $small --set parallel.comm=$comm --set parallel.reduce_dtype=bf16
      done
      for o in false true; do # 3B with the optimizer state sharded and offloaded
          step dp_offload_3b_$o 400 $tb configs/qwen2.5-3b-bf16.yaml --warmup 1 --steps 3 $moments --set memory.offload_optimizer=$o
      done
      # host transport with ZeRO-3 / ZeRO-2, the ranks' offloaded pieces or not, bf16 sums or not, no cap: the
      # rows a shared-host-bandwidth term of the cost model is to be fitted on (the box runs then hold it out)
      if [ "$ngpu" -ge 4 ]; then
          g="--set parallel.gpus=4 --set parallel.comm=host --set perf.cuda_graphs=false --set memory.fp8_weight_cache=none"
          g15="$tb configs/qwen2.5-1.5b-fp8.yaml --warmup 2 --steps 4 $g --set data.micro_batch=16 --set data.grad_accum=2 --set memory.offload_optimizer=false --set memory.recompute=[]"
          g7="$tb configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 2 $g --set data.micro_batch=8 --set data.grad_accum=4 --set memory.recompute=[block] --set parallel.zero=3"
          step hostgrid_1.5b_z3 300 $g15 --set parallel.zero=3
          step hostgrid_1.5b_z3_w 300 $g15 --set parallel.zero=3 --set "memory.offload=[weights]"
          step hostgrid_1.5b_z3_wg 300 $g15 --set parallel.zero=3 --set "memory.offload=[weights,gradients]"
          step hostgrid_1.5b_z3_wg_bf16sums 300 $g15 --set parallel.zero=3 --set "memory.offload=[weights,gradients]" --set parallel.reduce_dtype=bf16
          step hostgrid_1.5b_z2_g 300 $g15 --set parallel.zero=2 --set "memory.offload=[gradients]"
          step hostgrid_7b_z3 400 $g7
          step hostgrid_7b_z3_wg 400 $g7 --set "memory.offload=[weights,gradients,master,m,v]"
      fi
      # the emulated consumer box: BOX_GPUS cards held to 24 GiB, host transport, every planner key auto,
      # LLM.Q's precision, one timed step with its breakdown; --plan first (a model that does not fit is
      # refused with the plan's message)
      bg=${BOX_GPUS:-4}
      box="--set parallel.gpus=$bg --set parallel.comm=host --set memory.gpu_limit_gib=24 --set memory.plan=auto --set perf.cuda_graphs=false"
      for k in data.micro_batch memory.recompute memory.offload_optimizer memory.lmhead_chunks memory.offload precision.grad_accum_dtype \
          precision.master_dtype parallel.zero; do box="$box --set $k=auto"; done
      if [ "$ngpu" -ge "$bg" ]; then
          for b in ${BOX_BINS:-train_bench}; do for m in ${BOX_MODELS:-7b 14b 32b}; do
              mb=$(sed -n 's/^ *micro_batch: *\([0-9]*\).*/\1/p' configs/qwen2.5-$m-fp8.yaml)
              ga="--set data.grad_accum=$((${BOX_SEQS:-128} / mb))"
              step box_plan_$m 120 build/qtrain --plan configs/qwen2.5-$m-fp8.yaml $box $ga $box_llmq --gpu-mem 24
              step box_${b}_$m 600 /usr/bin/time -v build/bench/$b configs/qwen2.5-$m-fp8.yaml --warmup 1 --steps 1 \
                  --breakdown-steps 1 $box $ga $box_llmq
          done; done
      fi
    } 2>&1 | tee "$OUT/scale.log" | grep -E '^(==|FAIL)|RESULT|tokens/s|chosen|fits|does not fit|Maximum resident|rror|comm section'
fi

# A refactor must stay within noise: the previous commit's train_bench (build-base/train_bench, carried)
# and this one alternated per row in one run on one device, at LLM.Q's setting; then where a step goes.
if has perf; then
    { for row in "0.5b_bf16 configs/qwen2.5-0.5b-bf16.yaml $llmq" "0.5b_fp8 configs/qwen2.5-0.5b-fp8.yaml $llmq" \
                 "1.5b_bf16 configs/qwen2.5-1.5b-fp8.yaml $llmq $mm_bf16" "1.5b_fp8 configs/qwen2.5-1.5b-fp8.yaml $llmq" \
                 "7b_fp8 configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 2 --set parallel.gpus=1" \
                 "14b_fp8 configs/qwen2.5-14b-fp8.yaml --warmup 1 --steps 1 --set parallel.gpus=1"; do
          set -- $row; name=$1; shift
          for b in base new; do
              bin=$tb; [ $b = base ] && bin=build-base/train_bench
              step compare_${name}_$b 600 $bin "$@"
          done
      done
      # each row's ceiling (bench/RESULTS.md section 2): the configs as shipped, one more step with a CUDA event
      # around every op (a log per row), then tools/step_ceiling.py: the matmuls' share and rate, the other ops
      big="--warmup 1 --steps 1 $moments --set parallel.gpus=1"
      for row in "0.5b_bf16 configs/qwen2.5-0.5b-bf16.yaml $llmq" "0.5b_fp8 configs/qwen2.5-0.5b-fp8.yaml $llmq" \
                 "1.5b_bf16 configs/qwen2.5-1.5b-fp8.yaml $llmq $mm_bf16" "1.5b_fp8 configs/qwen2.5-1.5b-fp8.yaml $llmq" \
                 "3b_bf16 configs/qwen2.5-3b-bf16.yaml $llmq" "3b_fp8 configs/qwen2.5-3b-bf16.yaml $llmq $mm_fp8" \
                 "7b_bf16 configs/qwen2.5-7b-bf16.yaml $big" "7b_fp8 configs/qwen2.5-7b-fp8.yaml $big" \
                 "14b_bf16 configs/qwen2.5-14b-fp8.yaml $big $mm_bf16" "14b_fp8 configs/qwen2.5-14b-fp8.yaml $big"; do
          set -- $row; name=$1; shift
          step ceil_$name 600 bash -c '"${@:2}" > "$1" 2>&1' _ "$OUT/ceil_$name.log" $tb "$@" --breakdown-steps 1
      done
      logs=$(find "$OUT" -maxdepth 1 -name 'ceil_*.log' | sort)
      [ -n "$logs" ] && python3 tools/step_ceiling.py $logs
      # the shipped 7B fp8 plan against mb 8 x 64 with the LM head in 16 chunks of 512 rows (auto's pick without QT_PLAN_LM_ROWS)
      lm16="--set data.micro_batch=8 --set data.grad_accum=64 --set memory.recompute=[swiglu,norm] --set memory.lmhead_chunks=16
            --set memory.offload_optimizer=false --set memory.offload_residual=true --set memory.fp8_weight_cache=all
            --set memory.attn_bwd_chunks=4"
      for rep in 1 2; do
          step plan_7b_fp8_shipped_$rep 600 $tb configs/qwen2.5-7b-fp8.yaml $big
          step plan_7b_fp8_lm16_$rep 600 $tb configs/qwen2.5-7b-fp8.yaml $big $lm16
      done
    } 2>&1 | tee "$OUT/perf.log" | grep -E '^(==|FAIL)|RESULT|tokens/s|rror|ceiling'
fi
