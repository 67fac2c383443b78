#!/usr/bin/env bash
# gpu-check.sh — what we run on the GPU machine before calling GPU work done. Logs go to $OUT (default
# out/gpu-check); `ONLY=regex` runs only the steps whose name matches. Stages (each documented where it runs):
# - the default: build unit model bench llmq; compare (transformers); python, python_overhead.
# - memory features, one GPU (data-parallel ranks share it): resolve (test_zero + test_offload whole, then
#   recompute: every bitwise test of the memory features at one commit); recompute, fp8wcache, zero,
#   offload, offload_big, offload_weights, offload_ranks, quants, bf16master, dp_offload; pending26 (the
#   AdamW/op/comm/pinned tests + resolve: the suite of the last merged branch).
# - reliability, reliability_big; tokenize_bench, sft_export; plan (memory.gpu_limit_gib, the host plan,
#   qtrain --plan vs a real run); pin (cudaHostAlloc against qt_pinned).
# - several GPUs: dp, dpcomm, overlap; multi = multi_tests multi_scale multi_box (issue 28); multi20,
#   multi_zero3 (the ZeRO/offload tests with ranks on separate GPUs); scale7b; box_grid, box23, box_ab, box26
#   (the emulated 4 x 24 GiB box).
# - measurements behind bench/RESULTS.md, by session: pending_capped, capped_small, capped_14b, capped17
#   (16-17: one GPU held to 24/16/12 GiB); grid, grid2, auto_vs_hand, avh_bf16, h100_14b_{fp8,bf16}
#   (18-19: the planner against real runs); hostalloc_bench; pending20/fused22, pending22, rc_cost, rc_cost2,
#   rc7b, recompute_bench, offload_residual_bench (20-22: recompute costs and the fused SwiGLU backward);
#   h100_llmq_{7b,14b}_{fp8,bf16}, brk_{7b,14b}_fp8, gemm_big, gemm_real (20-21: H100-memory rows).
#   tools/gpu-check.sh unit model     # the op table (every kernel), AdamW/fp8 tests, then HF + training checks
# Data: tinyshakespeare from $QT_DATA_DIR (default ../shared/data, or out/data when carried).
set -uo pipefail
cd "$(dirname "$0")/.."
# The GPU machine's system cuDNN (9.14) is older than the headers we build against (9.19); python3's
# nvidia-cudnn wheel has 9.19. Binaries link cuDNN with a RUNPATH, so this wins whatever path was baked in.
cudnn_lib=$(bash tools/prereqs.sh cudnn-wheel)
if [ -d "$cudnn_lib" ]; then export LD_LIBRARY_PATH=$cudnn_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; fi
OUT=${OUT:-out/gpu-check}
mkdir -p "$OUT"
# the carried build/dev (tools/gpu-pack.sh) in place of older binaries (a warm device machine keeps the
# last call's; here a newer make wins)
if [ -d build/dev ]; then cp -a -u build/dev/. build/; fi
stages=${*:-build unit model bench llmq}
export QT_DATA_DIR=${QT_DATA_DIR:-$( [ -f ../shared/data/tinyshakespeare.txt ] && echo ../shared/data || echo out/data )}
export PYTHONUNBUFFERED=1
has() { case " $stages " in *" $1 "*) return 0;; esac; return 1; }
# ONLY (an extended regex): run only the steps whose name matches it whole
step() { local name=$1 limit=$2; shift 2; [ -z "${ONLY:-}" ] || [[ $name =~ ^($ONLY)$ ]] || return 0; echo "== $name ($(date +%T))"; timeout "$limit" "$@"; echo "== $name: exit $?"; }

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
    echo "commit ${QT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
} > "$OUT/env.txt" 2>&1

if has build; then step build 600 make -j16 CUDA_ARCH=90a all > "$OUT/build.log" 2>&1; tail -3 "$OUT/build.log"; fi
if has unit; then
    for t in test_ops_gpu test_kernels test_quant test_fp8_model test_sft; do
        QT_LOG_DIR=$OUT step "$t" 300 "build/tests/$t"
    done 2>&1 | tee "$OUT/unit.log" | grep -E '^(PASS|FAIL|SKIP|==)|final eval|worst cos'
fi
if has model; then
    { step hf_compare 300 env QT_DEVICES=cpu,cuda python3 tests/test_hf_compare.py
      step test_train 600 build/tests/test_train; } 2>&1 | tee "$OUT/model.log" | grep -E '^(PASS|FAIL|SKIP|==)|eval [0-9]|worst'
fi
# The Python binding: the extension built here by make against this machine's python3 (its headers;
# no pip, no network), imported from build/python. CPU tests, then the bf16/fp8 equalities with the
# CLI and the step overhead at 0.5B (RESULT line).
if has python || has python_overhead; then
    # the GPU machine lacks libyaml's headers (make's prereqs check stops there): the extension is compiled
    # against its python3's headers and linked with the carried build/libqtrain.so instead
    pybuild() {
        local inc suf
        inc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
        suf=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
        mkdir -p build/python/qtrain && cp src/python/qtrain/*.py src/python/qtrain/*.pyi src/python/qtrain/py.typed build/python/qtrain/ &&
            cc -std=c11 -O2 -fPIC -D_GNU_SOURCE -Iinclude -I"$inc" -I/usr/local/cuda/include -c src/python/qtrain/_qtrain.c \
                -o build/python/_qtrain.o &&
            cc -shared build/python/_qtrain.o -Lbuild -l:libqtrain.so -Wl,-rpath,"$PWD/build" -o "build/python/qtrain/_qtrain$suf"
    }
    if has python_overhead && ! has python; then # only the step-overhead figure at 0.5B
        { step python_build 600 bash -c "$(declare -f pybuild); pybuild"
          step python_overhead 900 env PYTHONPATH=build/python:tests python3 -c \
              "import sys, qt_test, test_python_gpu as t; sys.exit(qt_test.run_tests(vars(t), only=('test_overhead_0_5b',)))"
        } > "$OUT/python.log" 2>&1; grep -E '^(PASS|FAIL|SKIP|==)|RESULT|rror' "$OUT/python.log" | head -20
    else
    { step python_build 600 bash -c "$(declare -f pybuild); pybuild"
      step python_cpu 900 env PYTHONPATH=build/python python3 tests/test_python.py
      step python_gpu 1500 env PYTHONPATH=build/python python3 tests/test_python_gpu.py
    } > "$OUT/python.log" 2>&1; grep -E '^(PASS|FAIL|SKIP|==)|RESULT|rror' "$OUT/python.log" | head -60
    fi
fi
if has bench; then
    # one micro-batch of 16 x 1024 per optimizer step: the per-op breakdown and the older rows of RESULTS.md
    one="--set data.micro_batch=16 --set data.grad_accum=1 --set parallel.gpus=1"
    { step gemm_bench 300 build/bench/gemm_bench
      step kernels_bench 200 build/bench/kernels_bench
      step quant_bench 200 build/bench/quant_bench
      step train_bench_0.5b 300 build/bench/train_bench configs/qwen2.5-0.5b-bf16.yaml --steps 10 --breakdown $one
      step train_bench_0.5b_fp8 300 build/bench/train_bench configs/qwen2.5-0.5b-fp8.yaml --steps 10 --breakdown $one
      step torch_eager 300 python3 bench/torch_baseline.py --model qwen2.5-0.5b --micro-batch 16
      step torch_compile 300 python3 bench/torch_baseline.py --model qwen2.5-0.5b --micro-batch 16 --compile
    } 2>&1 | tee "$OUT/bench.log" | grep -E 'RESULT|tokens/s|==' | head -80
fi
# The configs as shipped: LLM.Q's published setting (524,288 tokens per optimizer step, CUDA graphs);
# LLM.Q's runs also keep AdamW's moments in bf16, so do we here (fp32 master weights and gradients kept).
if has llmq; then
    llmq="--warmup 1 --steps 3 --set precision.opt_m_dtype=bf16 --set precision.opt_v_dtype=bf16 --set parallel.gpus=1"
    { step llmq_0.5b_bf16 300 build/bench/train_bench configs/qwen2.5-0.5b-bf16.yaml $llmq
      step llmq_0.5b_fp8 300 build/bench/train_bench configs/qwen2.5-0.5b-fp8.yaml $llmq
      step llmq_1.5b_bf16 300 build/bench/train_bench configs/qwen2.5-1.5b-fp8.yaml $llmq \
          --set precision.matmul_dtype=bf16 --set precision.grad_dtype=bf16
      step llmq_1.5b_fp8 300 build/bench/train_bench configs/qwen2.5-1.5b-fp8.yaml $llmq
    } 2>&1 | tee "$OUT/llmq.log" | grep -E 'RESULT|tokens/s|==|rror|total \(one' | head -40
fi
# A build of the previous commit's train_bench (build-base/train_bench, carried) against this one at the
# llmq setting, alternating base/new per row in one run on one device: a refactor must stay within noise.
if has compare; then
    llmq="--warmup 1 --steps 3 --set precision.opt_m_dtype=bf16 --set precision.opt_v_dtype=bf16 --set parallel.gpus=1"
    { for row in "0.5b_bf16 configs/qwen2.5-0.5b-bf16.yaml" "0.5b_fp8 configs/qwen2.5-0.5b-fp8.yaml" \
                 "1.5b_bf16 configs/qwen2.5-1.5b-fp8.yaml --set precision.matmul_dtype=bf16 --set precision.grad_dtype=bf16" \
                 "1.5b_fp8 configs/qwen2.5-1.5b-fp8.yaml"; do
          set -- $row; name=$1; shift
          for b in base new; do
              bin=build/bench/train_bench; [ $b = base ] && bin=build-base/train_bench
              step compare_${name}_$b 300 $bin "$@" $llmq
          done
      done
    } 2>&1 | tee "$OUT/compare.log" | grep -E 'RESULT|tokens/s|==|rror' | head -60
fi
# precision.master_dtype / grad_accum_dtype bf16: the op-table rows (SR AdamW, bf16-accumulating kernels), the
# cut test (AdamW bitwise under every cut), then the mutant build (SR hashed on the state index: the cut test
# must FAIL), the training tests (bitwise pairs, resume, tinyshakespeare vs fp32 master, bf16 gradients), the
# 14B plan, and 14B on one GPU: bf16 matmuls at micro-batch 8 (fits: 73.8 GiB), and the fp8 config as shipped
# (refused with the plan's size until the fp8 weight quants are transient or offloaded). Host memory: the
# run's peak resident set (pinned pages included), printed by the python wrapper $peak (run under timeout).
if has bf16master; then
    b14="--warmup 1 --steps 3 --set parallel.gpus=1"
    peak='import resource, subprocess, sys
rc = subprocess.call(sys.argv[1:])
print("peak host memory (resident): %.1f GiB" % (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1048576))
sys.exit(rc)'
    { QT_TEST_ONLY=adamw step test_ops_gpu_adamw 300 build/tests/test_ops_gpu
      for k in embedding_bwd bias_bwd rmsnorm_bwd grad_norm matmul_wgrad matmul_fp8; do
          QT_TEST_ONLY=$k step test_ops_gpu_$k 300 build/tests/test_ops_gpu
      done
      QT_TEST_ONLY=bf16_master step test_kernels 300 build/tests/test_kernels
      step mutant_build 900 make -j16 CUDA_ARCH=90a BUILD=build-mutant EXTRA_NVFLAGS=-DQT_MUTANT_SR_STATE_INDEX \
          build-mutant/tests/test_kernels
      QT_TEST_ONLY=bf16_master step mutant_test_kernels_must_fail 300 build-mutant/tests/test_kernels
      QT_TEST_ONLY=bf16 step test_train 900 build/tests/test_train
      QT_TEST_ONLY=plan_14b step test_stores_14b_plan 60 build/tests/test_stores
      step bench_14b_bf16_mb8 600 python3 -c "$peak" build/bench/train_bench configs/qwen2.5-14b-fp8.yaml $b14 \
          --set precision.matmul_dtype=bf16 --set precision.grad_dtype=bf16 --set data.micro_batch=8 --set data.grad_accum=64
      step bench_14b_fp8_shipped 600 python3 -c "$peak" build/bench/train_bench configs/qwen2.5-14b-fp8.yaml $b14
    } 2>&1 | tee "$OUT/bf16master.log" | grep -E '^(PASS|FAIL|SKIP|==)|bitwise|differ|eval loss|tokens/s|rror|total \(one|peak host|fits|GiB'
fi
# memory.offload_optimizer: its tests, then the cost on one GPU — the optimizer step's time in the
# per-op breakdown (one 16 x 1024 micro-batch per step) and tokens/s at the llmq setting, off and on in
# one run. offload_big: the same at 1.5B, and 3B at LLM.Q's 16 x 32, which fits on 80 GB only offloaded.
if has offload; then
    llmq="--warmup 1 --steps 3 --set precision.opt_m_dtype=bf16 --set precision.opt_v_dtype=bf16 --set parallel.gpus=1"
    one="--steps 10 --breakdown --set data.micro_batch=16 --set data.grad_accum=1 --set parallel.gpus=1"
    { QT_TEST_ONLY=offload step test_kernels 300 build/tests/test_kernels
      step test_train 600 build/tests/test_train
      for o in false true; do
          step offload_${o}_0.5b_bf16_breakdown 300 build/bench/train_bench configs/qwen2.5-0.5b-bf16.yaml $one \
              --set memory.offload_optimizer=$o
          step offload_${o}_0.5b_bf16_llmq 300 build/bench/train_bench configs/qwen2.5-0.5b-bf16.yaml $llmq \
              --set memory.offload_optimizer=$o
      done
    } 2>&1 | tee "$OUT/offload.log" | grep -E '^(PASS|FAIL|SKIP|==)|bitwise|differ|optimizer: norm|tokens/s|rror'
fi
if has offload_big; then
    llmq="--warmup 1 --steps 3 --set precision.opt_m_dtype=bf16 --set precision.opt_v_dtype=bf16 --set parallel.gpus=1"
    { for o in false true; do
          step offload_${o}_1.5b_bf16_llmq 300 build/bench/train_bench configs/qwen2.5-1.5b-fp8.yaml $llmq \
              --set precision.matmul_dtype=bf16 --set precision.grad_dtype=bf16 --set memory.offload_optimizer=$o
      done
      step offload_3b_bf16_llmq 400 build/bench/train_bench configs/qwen2.5-3b-bf16.yaml $llmq
      step offload_false_3b_bf16_llmq 120 build/bench/train_bench configs/qwen2.5-3b-bf16.yaml $llmq \
          --set memory.offload_optimizer=false
    } 2>&1 | tee "$OUT/offload_big.log" | grep -E '==|tokens/s|rror|offloaded optimizer|total \(one'
fi
# The offloaded optimizer state with data parallel on every visible GPU (sharded: each GPU streams its
# 1/N of the state): test_train's 2-rank checks, then 3B at the llmq setting per GPU, off and on.
if has dp_offload; then
    llmq="--warmup 1 --steps 3 --set precision.opt_m_dtype=bf16 --set precision.opt_v_dtype=bf16"
    { QT_TEST_ONLY=data_parallel step test_train 600 build/tests/test_train
      for o in false true; do
          step dp_offload_${o}_3b_bf16_llmq 400 build/bench/train_bench configs/qwen2.5-3b-bf16.yaml $llmq \
              --set memory.offload_optimizer=$o
      done
    } 2>&1 | tee "$OUT/dp_offload.log" | grep -E '^(PASS|FAIL|SKIP|==)|bitwise|differ|tokens/s|rror|offloaded optimizer'
fi
# Data parallel on every visible GPU against one GPU, same setting as llmq (a step is then N x 524,288
# tokens), optimizer state sharded (the default) and replicated; test_train holds the multi-GPU checks
# (bit-exact resume, 2 ranks vs 1 GPU, checkpoints across GPU counts, a failing rank).
if has dp; then
    llmq="--warmup 1 --steps 3 --set precision.opt_m_dtype=bf16 --set precision.opt_v_dtype=bf16"
    { step test_train 600 build/tests/test_train
      for p in bf16 fp8; do
          step dp_0.5b_${p}_1gpu 300 build/bench/train_bench configs/qwen2.5-0.5b-$p.yaml $llmq --set parallel.gpus=1
          step dp_0.5b_${p}_all 300 build/bench/train_bench configs/qwen2.5-0.5b-$p.yaml $llmq
      done
      step dp_0.5b_fp8_all_replicated 300 build/bench/train_bench configs/qwen2.5-0.5b-fp8.yaml $llmq \
          --set parallel.shard_optimizer=false
      step dp_0.5b_fp8_all_host 300 build/bench/train_bench configs/qwen2.5-0.5b-fp8.yaml $llmq --set parallel.comm=host
      step dp_1.5b_fp8_all 300 build/bench/train_bench configs/qwen2.5-1.5b-fp8.yaml $llmq
    } 2>&1 | tee "$OUT/dp.log" | grep -E '^(PASS|FAIL|SKIP|==)|worst|tokens/s|rror' | head -60
fi
# Data parallel with one 16 x 1024 micro-batch per GPU per step, where summing the gradients is a large
# part of the step: gradients summed in fp32 vs bf16 (parallel.reduce_dtype), over peer copies and host.
if has dpcomm; then
    small="--steps 10 --set data.micro_batch=16 --set data.grad_accum=1"
    { for comm in peer host; do for rd in fp32 bf16; do
          step dpcomm_0.5b_bf16_${comm}_${rd} 300 build/bench/train_bench configs/qwen2.5-0.5b-bf16.yaml $small \
              --set parallel.comm=$comm --set parallel.reduce_dtype=$rd
      done; done
    } 2>&1 | tee "$OUT/dpcomm.log" | grep -E '==|tokens/s|rror' | head -40
fi
# The gradient sum overlapped with the backward and the weight all-gather with the next forward
# (parallel.overlap_comm) against one sum after the backward and one all-gather before the forward, in the
# same run: one 16 x 1024 micro-batch per GPU per step (the sum is a large part of the step), then the
# llmq setting (16 micro-batches of 32 x 1024 per GPU per step). comm auto: peer_load without overlap,
# peer copies with it (engine_dp.c).
if has overlap; then
    small="--steps 10 --set data.micro_batch=16 --set data.grad_accum=1"
    llmq="--warmup 1 --steps 3 --set precision.opt_m_dtype=bf16 --set precision.opt_v_dtype=bf16"
    { step overlap_small_0.5b_bf16_1gpu 300 build/bench/train_bench configs/qwen2.5-0.5b-bf16.yaml $small --set parallel.gpus=1
      for comm in auto host; do for ov in false true; do
          step overlap_small_0.5b_bf16_${comm}_${ov} 300 build/bench/train_bench configs/qwen2.5-0.5b-bf16.yaml $small \
              --set parallel.comm=$comm --set parallel.overlap_comm=$ov
      done; done
      for comm in auto host; do for ov in false true; do
          step overlap_llmq_0.5b_fp8_${comm}_${ov} 300 build/bench/train_bench configs/qwen2.5-0.5b-fp8.yaml $llmq \
              --set parallel.comm=$comm --set parallel.overlap_comm=$ov
      done; done
    } 2>&1 | tee "$OUT/overlap.log" | grep -E '==|tokens/s|rror' | head -40
fi
# Signals and kills on the GPU path (test_reliability's _gpu tests: SIGINTs at random times and a
# bit-exact resume, 50 SIGKILLs, a NaN update stopping the run on every GPU path, the offloaded state
# written where it lives and copied; the NaN count kernel's rows), then the checkpoint stall: training
# paused per checkpoint plus the offloaded optimizer's waits for the writer (target under 1 s at 0.5B;
# 0.5B offloaded in both checkpoint.offloaded modes, copy and in_place), the
# background write time and the peak host memory, on byte-level tinyshakespeare shards, a checkpoint
# every 4 steps. reliability_big: 7B fp8 offloaded at seq 1024 (micro-batch 8, the shipped plan), a
# checkpoint every 2 steps (target stall under 10 s); it needs ~230 GB of free disk (two 106 GB
# checkpoints while the second is written) and skips saying so otherwise.
if has reliability; then
    d=$OUT/ckpt_stall
    rm -rf "$d" && mkdir -p "$d"
    python3 tools/tokenize --byte-level "$QT_DATA_DIR/tinyshakespeare.txt" --out "$d/data" --eval-frac 0.05 > /dev/null
    common="--set data.train=$d/data/train_*.bin --set eval.every=0 --set data.micro_batch=16 --set data.grad_accum=1
            --set optim.steps=16 --set optim.warmup=2 --set checkpoint.every=4 --set log.every=4 --set parallel.gpus=1"
    # per checkpoint: "paused X s" at the save, "waited Y s" when its write ends: the stall is X + Y
    stalls() { grep -oE 'training paused [0-9.]+ s|optimizer waited [0-9.]+ s' "$1" |
               awk '{v=$(NF-1); if ($1=="training") p[++n]=v; else w[++m]=v}
                    END {for (i=1;i<=n;i++) printf "stall per checkpoint %d: %.3f s (paused %.3f + optimizer waited %.3f)\n", i, p[i]+w[i], p[i], w[i]}'; }
    { QT_TEST_ONLY=_gpu step test_reliability 1200 build/tests/test_reliability
      # AdamW at 0.5B parameters (it counts the NaN/Inf weights it writes: the per-step check)
      step kernels_bench_adamw 300 build/bench/kernels_bench adamw
      # device state; offloaded state copied at each checkpoint; offloaded state written where it lives
      for om in false:auto true:copy true:in_place; do
          o=${om%%:*} m=${om#*:} r=${om/:/_}
          step stall_0.5b_bf16_offload_$r 600 /usr/bin/time -v build/qtrain configs/qwen2.5-0.5b-bf16.yaml $common \
              --set memory.offload_optimizer=$o --set checkpoint.offloaded=$m --set checkpoint.dir=$d/ck_0.5b_$r \
              --set log.file=$d/0.5b_$r.jsonl > "$d/0.5b_$r.out" 2>&1
          cat "$d/0.5b_$r.out"; stalls "$d/0.5b_$r.out"
          rm -rf "$d/ck_0.5b_$r"
      done
      if has reliability_big; then
          avail=$(df -BG --output=avail "$d" | tail -1 | tr -dc 0-9)
          if [ "${avail:-0}" -lt 230 ]; then
              echo "== stall_7b_fp8_offload: skipped: ${avail} GB free under $d, two 7B checkpoints need ~230 GB"
          else
              step stall_7b_fp8_offload 1500 /usr/bin/time -v build/qtrain configs/qwen2.5-7b-fp8.yaml $common \
                  --set data.micro_batch=8 --set data.grad_accum=${QT_7B_ACCUM:-16} --set optim.steps=6 \
                  --set checkpoint.every=2 --set checkpoint.keep=1 --set log.every=1 \
                  --set checkpoint.dir=$d/ck_7b --set log.file=$d/7b.jsonl > "$d/7b.out" 2>&1
              cat "$d/7b.out"; stalls "$d/7b.out"
              rm -rf "$d/ck_7b"
          fi
      fi
    } 2>&1 | tee "$OUT/reliability.log" |
        grep -E '^(PASS|FAIL|SKIP|==)|SIGINTs|SIGKILLs|mutant|checkpoints, training|paused|saved|stall per|snapshot:|adamw_fp32|Maximum resident|rror'
fi
# tools/tokenize against HF tokenizers' own encode_batch on every core of this machine (300 MB corpus,
# 32k BPE; figures into tools/README.md).
if has tokenize_bench; then
    step tokenize_bench 900 python3 bench/tokenize_bench.py --source "$QT_DATA_DIR/tinyshakespeare.txt" 2>&1 | tee "$OUT/tokenize_bench.log" | tail -25
fi
# The export carries the run's tokenizer (data.tokenizer): a byte-level BPE trained here, shards made with
# it, a short CPU run, then transformers' AutoTokenizer and AutoModelForCausalLM load the export folder.
if has sft_export; then
    d=$OUT/sft_export
    rm -rf "$d" && mkdir -p "$d/tok"
    { python3 - "$QT_DATA_DIR/tinyshakespeare.txt" "$d/tok" <<'PY'
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
    } 2>&1 | tee "$OUT/sft_export.log" | grep -E '==|tokenizer|Auto|rror|exported|eval'
fi
# memory.recompute and memory.offload_residual: the bitwise tests (each part, block, ffn+norm, and
# offload_residual alone / with block / with ffn+norm against none over 20 steps; bf16, fp8, graphs, 2
# ranks on GPU 0, offloaded optimizer; the stale-buffer and the two residual-copy mutants must differ;
# the plan against the measured device memory), then the cost:
# 1.5B at one 16 x 1024 micro-batch per step for none, each part, ffn+norm and block (per-op breakdown),
# and 7B (configs/qwen2.5-7b-*.yaml: offloaded optimizer) at 8 micro-batches of 4 x 1024 per step for
# none, ffn+norm and block (RC7_SETS overrides), then the 7B configs as shipped (LLM.Q's 524,288 tokens
# per step). A set that does not fit is refused with the plan's size.
# The memory planner (issue 25): test_plan's GPU cases (peak device use under memory.gpu_limit_gib sampled
# with cudaMemGetInfo against the plan; a cap below the plan refused; --plan's rows = the real arena and
# pinned rows), then real configs held to 24 GiB: --plan's verdict, and a few steps with nvidia-smi's
# peak (it includes the CUDA context, about 0.5 GiB) beside tokens/s. 7B does not fit 24 GiB today: the
# refusal message is the expected outcome there.
if has plan; then
    capped() { # name config cap args...: --plan, then 3 steps with the GPU's peak memory sampled
        local name=$1 cfg=$2 cap=$3; shift 3
        step "plan_$name" 60 build/qtrain --plan "$cfg" --gpu-mem "$cap" --host-mem 120 "$@" | tail -4
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$OUT/smi_$name.txt" &
        local smi=$!
        step "run_$name" 600 build/bench/train_bench "$cfg" --warmup 1 --steps 3 --set parallel.gpus=1 \
            --set memory.gpu_limit_gib="$cap" "$@"
        kill "$smi"
        echo "peak GPU memory used (nvidia-smi, context included): $(sort -n "$OUT/smi_$name.txt" | tail -1) MiB"
    }
    { step test_plan 600 build/tests/test_plan
      capped 3b_bf16_24 configs/qwen2.5-3b-bf16.yaml 24 --set data.micro_batch=1 --set data.grad_accum=4 \
          --set memory.offload_optimizer=true --set memory.lmhead_chunks=4
      capped 7b_fp8_24 configs/qwen2.5-7b-fp8.yaml 24 --set data.micro_batch=1 --set data.grad_accum=4
    } 2>&1 | tee "$OUT/plan.log" | grep -E '^(PASS|FAIL|SKIP|==)|plan |peak|tokens/s|fits|needs|RESULT'
fi
# Issue 28 on a multi-GPU host; stages multi_tests, multi_scale, multi_box (multi = all three).
# multi_tests: how the GPUs are linked, the collectives and their bench, then the data-parallel bitwise
# tests (separate GPUs where there are enough, else ranks share GPU 0: test_zero goes to 4 ranks on 4
# GPUs, test_recompute's data-parallel groups take 4) with the probe's transport and again with host
# staging (QT_TEST_COMM, a test hook). multi_scale: tokens/s at LLM.Q's setting on 1, 2, 4 GPUs with
# ZeRO-1 and 2 (the step's tokens kept: grad_accum divided by N). multi_box: the emulated 4-card
# consumer box (24 GiB each, host transport, memory.plan: auto) for 7B, 14B, 32B, --plan first (a model
# that does not fit is refused with the plan's message), then a failure injected into rank 3 of 4
# before step 3 must stop all within seconds with rank 3's message.
if has multi; then stages="$stages multi_tests multi_scale multi_box"; fi
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
if has multi_tests; then
    { nvidia-smi topo -m
      step test_comm_gpu 300 build/tests/test_comm_gpu
      step comm_bench 300 build/bench/comm_bench --ranks "$ngpu" --iters 20 --max-mib 256 --label "${ngpu}xgpu" --tsv "$OUT/comm.tsv"
      step test_zero_multi 900 build/tests/test_zero
      step test_zero_multi_host 600 env QT_TEST_COMM=host QT_TEST_ONLY=zero2_equals_zero1 build/tests/test_zero
      step test_recompute_multi 600 env QT_TEST_ONLY=dp_offload build/tests/test_recompute
      step test_recompute_multi_host 600 env QT_TEST_COMM=host QT_TEST_ONLY=dp_offload build/tests/test_recompute
      step test_train_multi 600 env QT_TEST_ONLY=data_parallel build/tests/test_train
      step test_train_multi_host 600 env QT_TEST_COMM=host QT_TEST_ONLY=data_parallel build/tests/test_train
    } 2>&1 | tee "$OUT/multi_tests.log" | grep -E '^(PASS|FAIL|SKIP|==)|GPU[0-9]|bitwise|differ|rror'
fi
if has multi_scale; then
    scale_models=${SCALE_MODELS:-0.5b 7b} # SCALE_MODELS=0.5b: the small model only
    { for n in 1 2 4; do
          [ "$n" -le "$ngpu" ] && [[ " $scale_models " == *" 0.5b "* ]] || continue
          for z in 1 2 3; do
              [ "$n" -gt 1 ] || [ "$z" = 1 ] || continue
              z3=""; [ "$z" = 3 ] && z3="--set perf.cuda_graphs=false" # ZeRO-3 runs without CUDA graphs
              step scale_0.5b_fp8_${n}gpu_zero$z 300 build/bench/train_bench configs/qwen2.5-0.5b-fp8.yaml --warmup 1 --steps 3 \
                  --set parallel.gpus=$n --set parallel.zero=$z --set data.grad_accum=$((16 / n)) $z3
              [ "$n" -gt 1 ] && step scale_0.5b_fp8_${n}gpu_zero${z}_host 300 build/bench/train_bench configs/qwen2.5-0.5b-fp8.yaml \
                  --warmup 1 --steps 3 --set parallel.gpus=$n --set parallel.zero=$z --set data.grad_accum=$((16 / n)) --set parallel.comm=host $z3
          done
      done
      for n in 1 2 4; do
          [ "$n" -le "$ngpu" ] && [[ " $scale_models " == *" 7b "* ]] || continue
          for z in 1 2 3; do
              [ "$n" -gt 1 ] || [ "$z" = 1 ] || continue
              z3=""; [ "$z" = 3 ] && z3="--set perf.cuda_graphs=false"
              step scale_7b_fp8_${n}gpu_zero$z 600 build/bench/train_bench configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 1 \
                  --set parallel.gpus=$n --set parallel.zero=$z --set data.grad_accum=$((64 / n)) --set memory.host_limit_gib=400 $z3
          done
      done
    } 2>&1 | tee "$OUT/multi_scale.log" | grep -E '^(==|FAIL)|tokens/s|rror'
fi
# scale7b (issue 28 item 2's missing rows, bench/RESULTS.md section 6): 7B fp8 at LLM.Q's setting with ZeRO-3 on
# 2 and 4 GPUs over the probe's transport, and ZeRO-1/2/3 on 4 GPUs over host staging, against the one-GPU
# run of the same call (fraction of ideal = tokens/s / (N x it)). ~9 minutes on 4 GPUs.
if has scale7b && [ "$ngpu" -ge 2 ]; then
    s7="build/bench/train_bench configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 1 --set memory.host_limit_gib=400"
    nh=4; [ "$ngpu" -lt 4 ] && nh=$ngpu # the host-transport rows on 4 GPUs (2 where only 2 are lent)
    { step scale_7b_fp8_1gpu_zero1 600 $s7 --set parallel.gpus=1 --set parallel.zero=1 --set data.grad_accum=64
      for n in 2 4; do
          [ "$n" -le "$ngpu" ] || continue
          step scale_7b_fp8_${n}gpu_zero3 600 $s7 --set parallel.gpus=$n --set parallel.zero=3 --set data.grad_accum=$((64 / n)) \
              --set perf.cuda_graphs=false
      done
      for z in 3 1 2; do
          z3=""; [ "$z" = 3 ] && z3="--set perf.cuda_graphs=false"
          step scale_7b_fp8_${nh}gpu_zero${z}_host 600 $s7 --set parallel.gpus=$nh --set parallel.zero=$z --set data.grad_accum=$((64 / nh)) \
              --set parallel.comm=host $z3
      done
    } 2>&1 | tee "$OUT/scale7b.log" | grep -E '^(==|FAIL)|tokens/s|rror'
fi
box_gpus=${BOX_GPUS:-4} # BOX_GPUS=2: the same box with two cards (where only two GPUs are lent)
if has multi_box && [ "$ngpu" -ge "$box_gpus" ]; then
    # the shipped configs give their one-GPU plan's keys; auto hands them back to the planner
    box="--set parallel.gpus=$box_gpus --set parallel.comm=host --set memory.gpu_limit_gib=24 --set memory.plan=auto"
    for k in data.micro_batch memory.recompute memory.offload_optimizer memory.lmhead_chunks memory.offload precision.grad_accum_dtype \
        precision.master_dtype parallel.zero; do box="$box --set $k=auto"; done
    box="$box --set perf.cuda_graphs=false" # ZeRO-3 runs without CUDA graphs
    # BOX_STEPS="--warmup 0 --steps 1": 32B's step takes minutes, its start (447 GiB pinned) about six;
    # BOX_EXTRA: keys given after auto's (e.g. LLM.Q's bf16 master weights and gradients)
    { for m in ${BOX_MODELS:-7b 14b 32b}; do
          # 524,288 tokens per step over the 4 GPUs: grad_accum = 128 sequences / the config's micro-batch
          mb=$(sed -n 's/^ *micro_batch: *\([0-9]*\).*/\1/p' configs/qwen2.5-$m-fp8.yaml)
          ga="--set data.grad_accum=$((${BOX_SEQS:-128} / mb))" # BOX_SEQS: sequences per rank and step
          step box_plan_$m 120 build/qtrain --plan configs/qwen2.5-$m-fp8.yaml $box $ga ${BOX_EXTRA:-} --gpu-mem 24
          step box_$m 600 /usr/bin/time -v ${BOX_BENCH:-build/bench/train_bench} configs/qwen2.5-$m-fp8.yaml ${BOX_STEPS:---warmup 1 --steps 2} $box $ga ${BOX_EXTRA:-}
      done
      if [ "$box_gpus" = 4 ]; then # the injected failure: rank 3 of 4
          printf 'data: {train: "%s/fail/train_*.bin", seq_len: 64, micro_batch: 2}\nmodel: {vocab_size: 256, hidden_size: 128, num_layers: 2, num_heads: 2, num_kv_heads: 1, intermediate_size: 256, max_seq_len: 64}\noptim: {steps: 6, warmup: 1}\ncheckpoint: {dir: "%s/fail_ckpt"}\ndevice: cuda\nparallel: {gpus: 4}\n' "$OUT" "$OUT" > "$OUT/fail4.yaml"
          python3 tools/tokenize --byte-level "$QT_DATA_DIR/tinyshakespeare.txt" --out "$OUT/fail" > /dev/null
          start=$(date +%s); step fail_rank3_of_4 120 build/tests/tool_train_fault "$OUT/fail4.yaml" 3 3
          echo "stopped after $(( $(date +%s) - start )) s"
      fi
    } 2>&1 | tee "$OUT/multi_box.log" | grep -E '^(PASS|FAIL|SKIP|==)|tokens/s|rank 3|stopped|fits|does not fit|chosen|Maximum resident|rror'
fi
# box_ab (session 24): the box with BOX_GPUS cards (default 2), 64 sequences per rank and step, with one step's
# breakdown, for each train_bench of BOX_AB_BINS (names under build/bench: carry another tree's stripped
# train_bench in build/dev/bench as e.g. train_bench_main for an A/B) one after the other (the host holds
# one plan at a time), each model of BOX_AB_MODELS (14b), at LLM.Q's precision (bf16 master weights and
# gradients, e4m3 gathers; the 14B config's AdamW moments are bf16 as in LLM.Q's runs, the 7B config's fp32).
if has box_ab; then
    # autotune off: every binary runs the heuristic's GEMM algorithms, so the A/B compares the same sums (losses equal)
    llmq="--set precision.master_dtype=bf16 --set precision.grad_accum_dtype=bf16 --set parallel.gather_dtype=e4m3 --set perf.matmul_autotune=false"
    for b in ${BOX_AB_BINS:-train_bench}; do for m in ${BOX_AB_MODELS:-14b}; do
        BOX_GPUS=${BOX_GPUS:-2} BOX_SEQS=64 BOX_MODELS=$m BOX_BENCH=build/bench/$b BOX_STEPS="--warmup 1 --steps 1 --breakdown-steps 1" \
            BOX_EXTRA="$llmq" OUT="$OUT/box_ab_${b}_$m" bash "$0" multi_box
    done; done
fi
# box26 (4 GPUs, ~10 min): issue 28 item 3's rows again, the box at LLM.Q's setting (128 sequences per rank and
# step, 524,288 tokens) and precision (box_ab's keys, autotune off), one timed step with its breakdown each, 14B
# first (BOX26_MODELS: which); the failure injected into rank 3 of 4 after them.
if has box26; then
    llmq="--set precision.master_dtype=bf16 --set precision.grad_accum_dtype=bf16 --set parallel.gather_dtype=e4m3 --set perf.matmul_autotune=false"
    BOX_GPUS=4 BOX_SEQS=128 BOX_MODELS="${BOX26_MODELS:-14b 7b 32b}" BOX_STEPS="--warmup 1 --steps 1 --breakdown-steps 1" \
        BOX_EXTRA="$llmq" OUT="$OUT/box26" bash "$0" multi_box
fi
# pending26 (session 26's branch wip/box-next: box-overlap + the host gradient shard cleared by a mark +
# qt_pinned + AdamW counting the NaN/Inf weights it writes; passed and merged in session 27, RESULTS 17):
# the AdamW table (adamw_counts_nonfinite and the streamed/offloaded cases), the AdamW op against the CPU, test_comm_gpu (box-overlap's host pulls beside
# staged sums), qt_pinned's test, then the resolve stage. On 4 GPUs, one list per GPU:
#   tools/gpu-par.sh 'ONLY=test_kernels_adamw|test_ops_adamw|test_comm_gpu|pinned_alloc|test_recompute_.*|test_stores_7b_plan pending26' \
#     'ONLY=test_zero resolve' 'ONLY=test_offload resolve' 'ONLY=resume_offload|ckpt_bytes|ckpt_in_place|nonfinite|pin_bench resolve pin'
# then multi_zero3 (ranks on separate GPUs), then BOX_GPUS=4 BOX_AB_BINS="train_bench_main train_bench" box_ab.
if has pending26; then
    stages="$stages resolve"
    { step test_kernels_adamw 300 env QT_TEST_ONLY=adamw build/tests/test_kernels
      step test_ops_adamw 300 env QT_TEST_ONLY=adamw build/tests/test_ops_gpu
      step test_comm_gpu 300 build/tests/test_comm_gpu
      step pinned_alloc 120 env QT_TEST_ONLY=pinned_alloc build/tests/test_offload
    } 2>&1 | tee "$OUT/pending26.log" | grep -E '^(PASS|FAIL|SKIP|==)|bitwise|caught|counted|differ|DIFFER|MUTANT|exact|rror'
fi
# resolve: issues 23 and 24's GPU checks at one commit on one GPU (ranks share it), for the session that
# resolves them: recompute (each part, block + offload_residual, ffn + norm + offload_residual: bitwise over
# 20 steps in bf16 and fp8, graphs, 2 ranks; the stale-buffer mutant; plan = arena, peak within the margin)
# through the recompute stage below; then test_zero whole (ZeRO-2 = ZeRO-1, ZeRO-3 = ZeRO-2, e4m3 gathers,
# resume across levels, mutants, a rank failing mid-gather), test_offload whole (every offload item bitwise,
# resume, mutants, the ranks' pieces and shards), the offloaded state's checkpoints (resume bit-exact, the
# bytes of each kind, written in place, the NaN stop).
if has resolve; then
    stages="$stages recompute"
    { step test_zero 1200 build/tests/test_zero
      step test_offload 1200 build/tests/test_offload
      step resume_offload 300 env QT_TEST_ONLY=resume_bit_exact_offload build/tests/test_train
      step ckpt_bytes 600 env QT_TEST_ONLY=bf16_master_ckpt_bytes build/tests/test_train
      step ckpt_in_place 300 env QT_TEST_ONLY=offloaded_state_written_in_place_gpu build/tests/test_reliability
      step nonfinite 300 env QT_TEST_ONLY=nonfinite_update_stops_gpu build/tests/test_reliability
    } 2>&1 | tee "$OUT/resolve24.log" | grep -E '^(PASS|FAIL|SKIP|==)|bitwise|caught|differ|DIFFER|MUTANT|rror'
fi
# pin: how fast pinned host memory comes (the 14B box's start pinned ~210 GiB in ~3.8 min): cudaHostAlloc +
# memset as param_store.c does, against mmap + OpenMP first touch + cudaHostRegister, one thread and PIN_RANKS
# (4) at once, PIN_GIB (32) in all.
if has pin; then
    { step pin_bench 300 build/bench/pin_bench --gib "${PIN_GIB:-32}" --ranks "${PIN_RANKS:-4}"
    } 2>&1 | tee "$OUT/pin.log" | grep -E '^(==|SKIP)|x [0-9]|pin_bench|rror'
fi
if has recompute; then
    { for part in mutant bf16 fp8 dp_offload plan_matches; do # one test per step (QT_TEST_ONLY=part runs one alone)
          step test_recompute_$part 540 env QT_TEST_ONLY=$part build/tests/test_recompute
      done
      step test_stores_7b_plan 60 env QT_TEST_ONLY=plan_7b build/tests/test_stores
    } 2>&1 | tee "$OUT/recompute.log" | grep -E '^(PASS|FAIL|SKIP|==)|bitwise|differ|mutant|step [0-9]|plan .*peak|saving'
fi
# memory.fp8_weight_cache: the bitwise tests (none = all over 20 steps: fp8 eager and from graphs, persistent
# quants on and off, a bf16 backward, recompute block and ffn+norm, 2 ranks on GPU 0; the stale-slot and
# stale-scale mutants must differ), the plan rows, then the cost of quantizing at use (breakdown row "fp8
# quantize: weights"): 1.5B fp8 at one 16 x 1024 micro-batch per step and 7B fp8 at 8 micro-batches of
# 8 x 1024, all vs none. The 14B fp8 config itself (none) runs in the bf16master stage.
if has fp8wcache; then
    one="--steps 10 --breakdown --set data.micro_batch=16 --set data.grad_accum=1 --set parallel.gpus=1"
    b7="--warmup 1 --steps 3 --breakdown --set data.grad_accum=8 --set parallel.gpus=1 --set precision.opt_m_dtype=bf16 --set precision.opt_v_dtype=bf16"
    { QT_TEST_ONLY=fp8_weight_cache step test_recompute_fp8wc 900 build/tests/test_recompute
      QT_TEST_ONLY=plan_and_checks step test_fp8_model_plan 60 build/tests/test_fp8_model
      QT_TEST_ONLY=plan_14b step test_stores_14b_plan 60 build/tests/test_stores
      for wc in all none; do
          step wc_1.5b_fp8_$wc 300 build/bench/train_bench configs/qwen2.5-1.5b-fp8.yaml $one --set memory.fp8_weight_cache=$wc
      done
      for wc in all none; do
          step wc_7b_fp8_$wc 400 build/bench/train_bench configs/qwen2.5-7b-fp8.yaml $b7 --set memory.fp8_weight_cache=$wc
      done
    } 2>&1 | tee "$OUT/fp8wcache.log" | grep -E '^(PASS|FAIL|SKIP|==)|bitwise|differ|mutant|tokens/s|rror|fp8 quantize|fp8 weights|total|fits'
fi
if has recompute_bench; then
    set -f # the sets below are YAML lists, not globs
    one="--steps 10 --breakdown --set data.micro_batch=16 --set data.grad_accum=1 --set parallel.gpus=1"
    b7="--warmup 1 --steps 3 --set data.grad_accum=8 --set parallel.gpus=1 --set precision.opt_m_dtype=bf16 --set precision.opt_v_dtype=bf16"
    sets="[] [swiglu] [norm] [qkv] [att] [ffn] [ffn,norm] [block]"
    { for r in $sets; do
          step rc_1.5b_fp8_$r 300 build/bench/train_bench configs/qwen2.5-1.5b-fp8.yaml $one --set "memory.recompute=$r"
      done
      for p in fp8 bf16; do for r in ${RC7_SETS:-[] [ffn,norm] [block]}; do
          step rc_7b_${p}_mb4_$r 400 build/bench/train_bench configs/qwen2.5-7b-$p.yaml $b7 --set data.micro_batch=4 \
              --set "memory.recompute=$r"
      done; done
      step rc_7b_fp8_shipped 600 build/bench/train_bench configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 2 --set parallel.gpus=1 \
          --set precision.opt_m_dtype=bf16 --set precision.opt_v_dtype=bf16
      step rc_7b_bf16_shipped 600 build/bench/train_bench configs/qwen2.5-7b-bf16.yaml --warmup 1 --steps 2 --set parallel.gpus=1 \
          --set precision.opt_m_dtype=bf16 --set precision.opt_v_dtype=bf16
    } 2>&1 | tee "$OUT/recompute_bench.log" | grep -E '==|tokens/s|rror|memory.recompute|activations|total \(one'
fi
# memory.offload_residual: its cost at equal micro-batch (1.5B fp8, one 16 x 1024 micro-batch per step,
# with and without it, for block and ffn+norm: target under 2% over block alone) and what it buys: 7B fp8
# with ffn+norm + offload_residual at LLM.Q's setting (seq 1024, 524,288 tokens per step, optimizer
# offloaded, bf16 moments, graphs as shipped) at the largest micro-batch that fits (16, else 8): target
# >= 21,000 tokens/s (17,444 measured at [ffn,norm] micro-batch 8, 66.83 GiB). About 5 minutes on an H100.
# Writes $OUT/offload_residual_table.md: one row per run for bench/RESULTS.md.
if has offload_residual_bench; then
    set -f # the sets below are YAML lists, not globs
    tab="$OUT/offload_residual_table.md"
    { echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), commit ${QT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
      echo
      echo "| model | memory | micro-batch x accum | tokens/s | ms/step | GPU memory used (GiB) | plan (GiB) | host residuals (GiB) |"
      echo "|---|---|---|---|---|---|---|---|"; } > "$tab"
    # rrow MODEL MEMORY MB ACCUM LIMIT ARGS...: one train_bench run, one table row (exit 1 when it did not run)
    rrow() {
        local model=$1 mem=$2 mb=$3 acc=$4 limit=$5; shift 5
        local log="$OUT/or_${model}_$(tr -c 'a-z0-9' _ <<<"$mem")_mb$mb.log" res plan host
        step "or $model $mem mb $mb" "$limit" build/bench/train_bench "$@" --set data.micro_batch=$mb \
            --set data.grad_accum=$acc > "$log" 2>&1
        grep -E '==|tokens/s|rror|total \(one|offloaded residuals' "$log"
        res=$(grep -o 'RESULT .*' "$log" | tail -1)
        plan=$(awk '/arena total/ {printf "%.2f", $3 / 1024; exit}' "$log") # arena total N MiB (one allocation)
        host=$(awk '/offloaded residuals/ {printf "%.2f", $3 / 1024; exit}' "$log") # the plan prints twice
        if [ -z "$res" ]; then
            echo "| $model | $mem | $mb x $acc | did not run: $(grep -m1 -oE '(rror|needs)[^|]*' "$log" | cut -c1-80) | | | ${plan:--} | |" >> "$tab"
            return 1
        fi
        sed -E 's/.*"tokens_per_s":([0-9.]+).*"step_ms":([0-9.]+).*"mem_used_gib":([0-9.]+).*/\1 \2 \3/' <<<"$res" |
            { read -r tok ms gib; echo "| $model | $mem | $mb x $acc | $tok | $ms | $gib | ${plan:--} | ${host:-0} |" >> "$tab"; }
    }
    b15="configs/qwen2.5-1.5b-fp8.yaml --steps 10 --set parallel.gpus=1"
    b7="configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 2 --set parallel.gpus=1 --set precision.opt_m_dtype=bf16 --set precision.opt_v_dtype=bf16"
    {
      for r in [block] [ffn,norm]; do for o in false true; do
          rrow 1.5b "recompute=$r offload_residual=$o" 16 1 240 $b15 --set "memory.recompute=$r" --set memory.offload_residual=$o
      done; done
      for mb in 16 8; do
          [ "${OR_7B:-1}" = 1 ] || break # OR_7B=0: the 1.5B rows only
          rrow 7b "recompute=[ffn,norm] offload_residual=true" $mb $((512 / mb)) 420 $b7 --set "memory.recompute=[ffn,norm]" \
              --set memory.offload_residual=true && break
      done
      cat "$tab"
    } 2>&1 | tee "$OUT/offload_residual_bench.log"
fi
# memory.offload: [weights] / [gradients] (one GPU): test_offload (7B plan rows; offloaded = on the GPU
# bitwise over 20 steps at grad_accum 2, bf16/fp8/bf16 master/optimizer offloaded/recompute/tied/graphs;
# resume across; the slot mutants), then their cost at 1.5B fp8 (10 steps, no CUDA graphs anywhere)
# The capped runs of `pending` (issue 24/25 targets), apart: each is minutes. One GPU held to 24 GiB: 7B fp8
# with memory.plan: auto (every planner key auto) at LLM.Q's 524,288 tokens per step, and the hand-picked plan
# LLM.Q's 4090 row uses (bf16 gradients on the GPU, weights + optimizer + residuals offloaded, block recompute,
# micro-batch 8); at 16 and 12 GiB auto again on 64 and 16 sequences per step (a step of 512 takes many
# minutes there: tokens/s is per step either way, the optimizer's share larger). 14B at 24 GiB apart
# (capped_14b: HOST_LIMIT GiB of host, default 120; its plan needs more than a 128 GiB host).
auto_keys="--set memory.plan=auto --set perf.cuda_graphs=false --set parallel.gpus=1"
for k in data.micro_batch memory.recompute memory.offload_optimizer memory.lmhead_chunks memory.offload \
    precision.grad_accum_dtype precision.master_dtype; do auto_keys="$auto_keys --set $k=auto"; done
if has pending_capped; then
    hand="--set memory.offload=[weights,master,m,v,residual] --set precision.grad_accum_dtype=bf16
          --set precision.master_dtype=bf16 --set data.micro_batch=8 --set data.grad_accum=64 --set memory.recompute=[block]
          --set memory.fp8_weight_cache=none --set memory.lmhead_chunks=8 --set memory.attn_bwd_chunks=2
          --set parallel.gpus=1 --set perf.cuda_graphs=false"
    b7="build/bench/train_bench configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 1"
    { env QT_TEST_ONLY=attention_ws build/tests/test_plan
      step capped_7b_fp8_24_auto 600 $b7 $auto_keys --set memory.gpu_limit_gib=24
      step capped_7b_fp8_24_hand 600 $b7 $hand --set memory.gpu_limit_gib=24
    } 2>&1 | tee "$OUT/pending_capped.log" | grep -E '^(PASS|FAIL|SKIP|==)|H [0-9]|chosen|tokens/s|fit|GiB|rror'
fi
if has pending_capped || has capped_small; then
    b7="build/bench/train_bench configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 1"
    { step capped_7b_fp8_16_auto 600 $b7 --set data.micro_batch=8 --set data.grad_accum=8 $auto_keys --set memory.gpu_limit_gib=16
      step capped_7b_fp8_12_auto 600 $b7 --set data.micro_batch=4 --set data.grad_accum=4 $auto_keys --set memory.gpu_limit_gib=12
    } 2>&1 | tee "$OUT/capped_small.log" | grep -E '^(PASS|FAIL|SKIP|==)|chosen|tokens/s|fit|GiB|rror'
fi
# 14B on 64 sequences per step (a step of 512 is minutes at 24 GiB)
if has capped_14b; then
    { step capped_14b_fp8_24_auto 600 build/bench/train_bench configs/qwen2.5-14b-fp8.yaml --warmup 1 --steps 1 \
          --set data.micro_batch=16 --set data.grad_accum=4 $auto_keys \
          --set memory.gpu_limit_gib=24 --set memory.host_limit_gib=${HOST_LIMIT:-120}
    } 2>&1 | tee "$OUT/capped_14b.log" | grep -E '^(PASS|FAIL|SKIP|==)|chosen|tokens/s|fit|GiB|rror'
fi
# capped17 (session 17): 14B fp8 at 24 GiB within 120 GiB of host (every planner key auto), 7B at 24 GiB
# with bf16 gradients, one step each (ONLY=capped_7b_fp8_24_g16: the 7B row alone)
if has capped17; then
    b="build/bench/train_bench --warmup 1 --steps 1"
    { step capped_14b_fp8_24_host120 600 $b configs/qwen2.5-14b-fp8.yaml --set data.micro_batch=16 --set data.grad_accum=32 \
          $auto_keys --set memory.gpu_limit_gib=24 --set memory.host_limit_gib=120
      step capped_7b_fp8_24_g16 600 $b configs/qwen2.5-7b-fp8.yaml $auto_keys --set precision.grad_accum_dtype=bf16 \
          --set memory.gpu_limit_gib=24
    } 2>&1 | tee "$OUT/capped17.log" | grep -E '^(PASS|FAIL|SKIP|==)|chosen|tokens/s|fit|GiB|rror'
fi
# memory.zero_copy and memory.host_alloc (issue 24: "measure it"): 1.5B fp8 at LLM.Q's setting with the
# optimizer state offloaded, streamed through slots (the default) vs read in place by AdamW (zero copy),
# each with pinned and write-combined host memory; then 7B fp8 at 24 GiB with everything offloaded, pinned
# vs write-combined (the weights, gradients and residuals cross PCIe every micro-step there).
if has hostalloc_bench; then
    hb="build/bench/train_bench configs/qwen2.5-1.5b-fp8.yaml --warmup 1 --steps 3 --set parallel.gpus=1 --set memory.offload_optimizer=true"
    { step ha_1.5b_slots_pinned 300 $hb
      step ha_1.5b_zerocopy_pinned 300 $hb --set memory.zero_copy=true
      step ha_1.5b_slots_wc 300 $hb --set memory.host_alloc=write_combined
      step ha_1.5b_zerocopy_wc 300 $hb --set memory.zero_copy=true --set memory.host_alloc=write_combined
      h7="build/bench/train_bench configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 1 --set parallel.gpus=1 --set perf.cuda_graphs=false
          --set memory.offload=[weights,gradients,master,m,v,residual] --set data.micro_batch=32 --set data.grad_accum=16
          --set memory.recompute=[block] --set memory.fp8_weight_cache=none --set memory.lmhead_chunks=32 --set memory.gpu_limit_gib=24"
      step ha_7b_24gib_pinned 600 $h7
      step ha_7b_24gib_wc 600 $h7 --set memory.host_alloc=write_combined
    } 2>&1 | tee "$OUT/hostalloc_bench.log" | grep -E '^(==)|tokens/s|rror'
fi
# Issue 25's "auto within 5% of the best hand-picked plan" at 80 and 16 GiB (24 GiB: pending_capped): 7B fp8,
# auto with every planner key free vs the shipped config's own plan at 80 GiB (512 sequences per step),
# and vs LLM.Q's kind of plan (bf16 master and gradients, everything offloaded) at 16 GiB (64 sequences).
if has auto_vs_hand; then
    b7="build/bench/train_bench configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 1"
    caps=${AVH_CAPS:-80 16} # AVH_CAPS=16: the 16 GiB pair only
    { [[ " $caps " == *" 80 "* ]] && step avh_7b_80_auto 600 $b7 $auto_keys --set memory.gpu_limit_gib=80
      [[ " $caps " == *" 80 "* ]] && step avh_7b_80_config 600 $b7 --set parallel.gpus=1 --set memory.gpu_limit_gib=80
      [[ " $caps " == *" 16 "* ]] || exit 0
      step avh_7b_16_auto 600 $b7 --set data.micro_batch=8 --set data.grad_accum=8 $auto_keys --set memory.gpu_limit_gib=16
      step avh_7b_16_hand 600 $b7 --set parallel.gpus=1 --set perf.cuda_graphs=false --set memory.gpu_limit_gib=16 \
          --set "memory.offload=[weights,gradients,master,m,v,residual]" --set precision.master_dtype=bf16 \
          --set precision.grad_accum_dtype=bf16 --set data.micro_batch=8 --set data.grad_accum=8 \
          --set "memory.recompute=[block]" --set memory.fp8_weight_cache=none --set memory.lmhead_chunks=4
    } 2>&1 | tee "$OUT/auto_vs_hand.log" | grep -E '^(==)|chosen|tokens/s|fit|rror'
fi
# Issue 25's grid: plans left out of the cost model's fit (tests/test_plan cost_calibration), measured at
# 1.5B and 7B fp8 on 128 / 64 sequences per step, one GPU, no cap; predictions come from `qtrain --plan`
# with the same --set keys and this device's probe (printed by the first auto run, cached per machine).
if has grid; then
    g15="build/bench/train_bench configs/qwen2.5-1.5b-fp8.yaml --warmup 1 --steps 2 --set parallel.gpus=1 --set data.grad_accum=8"
    g7="build/bench/train_bench configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 2 --set parallel.gpus=1 --set perf.cuda_graphs=false"
    { step grid_1.5b_none_mb16 300 $g15 --set data.micro_batch=16 --set "memory.recompute=[]"
      step grid_1.5b_ffnnorm_mb16 300 $g15 --set data.micro_batch=16 --set "memory.recompute=[ffn,norm]"
      step grid_1.5b_block_mb16 300 $g15 --set data.micro_batch=16 --set "memory.recompute=[block]"
      step grid_1.5b_none_opt_mb16 300 $g15 --set data.micro_batch=16 --set "memory.recompute=[]" --set memory.offload_optimizer=true
      step grid_1.5b_block_res_mb32 300 $g15 --set data.micro_batch=32 --set data.grad_accum=4 --set "memory.recompute=[block]" \
          --set memory.offload_residual=true
      step grid_1.5b_none_mb8 300 $g15 --set data.micro_batch=8 --set data.grad_accum=16 --set "memory.recompute=[]"
      step grid_7b_ffnnorm_opt_mb8 400 $g7 --set data.micro_batch=8 --set data.grad_accum=8 --set "memory.recompute=[ffn,norm]"
      step grid_7b_block_res_mb16 400 $g7 --set data.micro_batch=16 --set data.grad_accum=4 --set "memory.recompute=[block]" \
          --set memory.offload_residual=true
      step grid_7b_swiglunorm_mb4 400 $g7 --set data.micro_batch=4 --set data.grad_accum=16 --set "memory.recompute=[swiglu,norm]"
    } 2>&1 | tee "$OUT/grid.log" | grep -E '^(==)|tokens/s|rror'
fi
# Session 19's last call. avh_bf16: auto at 16 GiB given LLM.Q's bf16 master and gradients (auto keeps fp32 ones
# while a plan with them fits: the 16 GiB pair of auto_vs_hand compares a lossless auto with a lossy hand
# plan). h100_14b_fp8 / _bf16: issue 24's 14B rows on an H100's memory (79 GiB cap) and a 128 GiB host
# (120 GiB limit), every planner key auto. multi_zero3: ZeRO-3 = ZeRO-2 and the ranks' offloads bitwise
# on separate GPUs (qt_t_ranks), with the probe's transport and with host staging.
if has avh_bf16; then
    { step avh_7b_16_auto_bf16 600 build/bench/train_bench configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 1 --set data.micro_batch=8 \
          --set data.grad_accum=8 $auto_keys --set precision.master_dtype=bf16 --set precision.grad_accum_dtype=bf16 \
          --set memory.gpu_limit_gib=16
    } 2>&1 | tee "$OUT/avh_bf16.log" | grep -E '^(==)|chosen|tokens/s|fit|rror'
fi
for dt in fp8 bf16; do
    has h100_14b_$dt || continue
    mm=""; [ "$dt" = bf16 ] && mm="--set precision.matmul_dtype=bf16 --set precision.grad_dtype=bf16"
    { step h100_14b_$dt 600 build/bench/train_bench configs/qwen2.5-14b-fp8.yaml --warmup 1 --steps 1 $auto_keys $mm \
          --set memory.gpu_limit_gib=79 --set memory.host_limit_gib=120
    } 2>&1 | tee "$OUT/h100_14b_$dt.log" | grep -E '^(==)|chosen|NOTE|tokens/s|fit|rror'
done
if has multi_zero3; then
    { for comm in probe host; do
          c=""; [ "$comm" = host ] && c="QT_TEST_COMM=host"
          step zero3_${comm} 300 env $c QT_TEST_ONLY=zero3_equals_zero2 build/tests/test_zero
          step offload_ranks_${comm} 300 env $c QT_TEST_ONLY=offload_ranks build/tests/test_offload
      done
    } 2>&1 | tee "$OUT/multi_zero3.log" | grep -E '^(PASS|FAIL|SKIP|==)|GPU[0-9]|bitwise|caught|differ|rror'
fi
# h100_llmq_<model>_<dt>: issue 23/24's rows on an H100's memory (79 GiB cap, 120 GiB host) with LLM.Q's
# precision (bf16 weights as master, bf16 gradients, bf16 AdamW moments), the planner choosing the
# micro-batch, recompute, offload and LM-head chunks.
h100_keys="--set perf.cuda_graphs=false --set parallel.gpus=1 --set memory.gpu_limit_gib=79 \
    --set memory.host_limit_gib=120 --set precision.master_dtype=bf16 --set precision.grad_accum_dtype=bf16 \
    --set precision.opt_m_dtype=bf16 --set precision.opt_v_dtype=bf16"
llmq_keys="--set memory.plan=auto $h100_keys"
for k in data.micro_batch memory.recompute memory.offload_optimizer memory.lmhead_chunks memory.offload; do
    llmq_keys="$llmq_keys --set $k=auto"
done
for m in 7b 14b; do for dt in fp8 bf16; do
    has h100_llmq_${m}_$dt || continue
    mm=""; [ "$dt" = bf16 ] && mm="--set precision.matmul_dtype=bf16 --set precision.grad_dtype=bf16"
    { step h100_llmq_${m}_$dt 600 build/bench/train_bench configs/qwen2.5-$m-fp8.yaml --warmup 1 --steps 1 $llmq_keys $mm
    } 2>&1 | tee "$OUT/h100_llmq_${m}_$dt.log" | grep -E '^(==)|chosen|NOTE|tokens/s|fit|rror'
done; done
# brk_<model>_fp8 (session 21, one GPU): where a step of issue 23/24's H100 rows goes, `--breakdown` (an event
# around every op, 3 steps) of the plan the planner chose there (section 10), at grad_accum 8 so it is short:
# the per-op times of 8 micro-steps and one optimizer step.
brk_keys="--set memory.plan=manual $h100_keys --set data.grad_accum=8 --set memory.offload_optimizer=true"
if has brk_7b_fp8; then
    { step brk_7b_fp8 400 build/bench/train_bench configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 1 --breakdown $brk_keys ${BRK_EXTRA:-} \
          --set data.micro_batch=8 --set "memory.recompute=[]" --set memory.fp8_weight_cache=all --set memory.lmhead_chunks=1
    } 2>&1 | tee "$OUT/brk_7b_fp8.log" | grep -E '^(==)|tokens/s|rror'
fi
if has brk_14b_fp8; then
    { step brk_14b_fp8 400 build/bench/train_bench configs/qwen2.5-14b-fp8.yaml --warmup 1 --steps 1 --breakdown $brk_keys ${BRK_EXTRA:-} \
          --set data.micro_batch=4 --set "memory.recompute=[swiglu,norm]" --set memory.offload_residual=true \
          --set memory.fp8_weight_cache=none --set memory.lmhead_chunks=1
    } 2>&1 | tee "$OUT/brk_14b_fp8.log" | grep -E '^(==)|tokens/s|rror'
fi
# multi20 (2 or 4 GPUs, one rank per GPU where the tests' rank counts allow): session 19/20's ZeRO features on
# separate GPUs: bf16 gradients with ZeRO-2 (= ZeRO-1) and ZeRO-3 (= ZeRO-2), e4m3 gathers (= bf16 gathers),
# the offloaded gradient shards' staging, the fp8 recompute with 2 ranks; the probe's transport, then host.
if has multi20; then
    { for comm in probe host; do
          c=""; [ "$comm" = host ] && c="QT_TEST_COMM=host"
          step zero2_${comm} 200 env $c QT_TEST_ONLY=zero2_equals_zero1 build/tests/test_zero
          step zero3_${comm} 200 env $c QT_TEST_ONLY=zero3_equals_zero2 build/tests/test_zero
          step e4m3_${comm} 120 env $c QT_TEST_ONLY=e4m3_gathers build/tests/test_zero
      done
      step offload_ranks_host 200 env QT_TEST_COMM=host QT_TEST_ONLY=offload_ranks build/tests/test_offload
      step recompute_dp 200 env QT_TEST_ONLY=dp_offload build/tests/test_recompute
    } 2>&1 | tee "$OUT/multi20.log" | grep -E '^(PASS|FAIL|SKIP|==)|GPU[0-9]|bitwise|caught|differ|rror'
fi
# quants (session 20, one GPU): memory.offload [weights, quants] (each layer's e4m3 codes copied up instead of
# its bf16 matrices) = nothing offloaded bitwise (fp8, recompute, everything offloaded, bf16 master), its
# mutants (codes made once, a slot read before its copy), ZeRO-3 + [weights, quants] (e4m3 gathers of the
# host pieces' codes) = ZeRO-3 on GPU 0's ranks.
if has quants; then
    { step offload_quants 300 env QT_TEST_ONLY=weights_bitwise build/tests/test_offload
      step offload_quants_mutants 200 env QT_TEST_ONLY=quants_mutants build/tests/test_offload
      step offload_quants_zero3 300 env QT_TEST_ONLY=weights_zero3 build/tests/test_offload
    } 2>&1 | tee "$OUT/quants.log" | grep -E '^(PASS|FAIL|SKIP|==)|bitwise|caught|differ|rror'
fi
# rc_cost: issue 23's cost rows at equal micro-batch, 1.5B fp8 16 x 1024 per optimizer step, 10 steps (section
# 1.4's setting).
if has rc_cost; then
    one="build/bench/train_bench configs/qwen2.5-1.5b-fp8.yaml --steps 10 --set data.micro_batch=16 --set data.grad_accum=1 --set parallel.gpus=1"
    { for r in "[]" "[swiglu]" "[norm]" "[swiglu,norm]" "[ffn]" "[ffn,norm]" "[block]"; do
          step "rc_1.5b_$r" 240 $one --set "memory.recompute=$r"
      done
    } 2>&1 | tee "$OUT/rc_cost.log" | grep -E '^(==)|tokens/s|rror'
fi
# fused22 (session 22): the fp8 swiglu recompute's SwiGLU backward that also writes down's e4m3 Xq^T, a
# kernel of its own (cuda/quant.cu swiglu_bwd_qt_kernel): its speed beside the plain backward (quant_bench
# swiglu; out/exp/swiglu_exp when carried: tile and unit variants, not in the repo), its op rows, bit for
# bit against the three kernels it replaces and the mutant build without the bf16 rounding (must fail),
# test_recompute's mutants and fp8 groups (the forward no longer writes a shared Xq^T), then rc_cost2.
# pending20 (session 20's checks of the same path) runs the same steps.
if has fused22 || has pending20; then
    { if [ -x out/exp/swiglu_exp ]; then step swiglu_exp 180 out/exp/swiglu_exp; fi
      step quant_bench_swiglu 120 build/bench/quant_bench swiglu
      step swiglu_ops 120 env QT_TEST_ONLY=swiglu build/tests/test_ops_gpu
      step swiglu_bwd_quant_t_bitwise 120 env QT_TEST_ONLY=swiglu_bwd_quant build/tests/test_kernels
      if [ -x build/tests/test_kernels_mut_swiglu_round ]; then
          step swiglu_bwd_quant_t_mutant 120 env QT_TEST_ONLY=swiglu_bwd_quant build/tests/test_kernels_mut_swiglu_round
      fi
      step test_stores 120 build/tests/test_stores
      step fp8_shared_inputs 300 env QT_TEST_ONLY=shared_inputs build/tests/test_recompute
      step recompute_mutants 540 env QT_TEST_ONLY=mutant build/tests/test_recompute
      step recompute_fp8 540 env QT_TEST_ONLY=recompute_fp8 build/tests/test_recompute
    } 2>&1 | tee "$OUT/fused22.log" | grep -E '^(PASS|FAIL|SKIP|==)|bitwise|differ|mutant|rror|GB/s|swiglu'
fi
# pending22 (seen passing in bench/RESULTS.md section 13): a bf16 backward with the SwiGLU recomputed
# makes h inside its SwiGLU backward (qt_swiglu_bwd_h, over dh in h's buffer; down's wgrad after it): op
# rows, bit for bit against swiglu fwd + bwd, the mutant build with the product in another order
# (build/tests/test_kernels_mut_swiglu_h when carried: must fail), test_recompute's mutants (bf16: dh left in
# h's buffer) and every group (bf16, fp8, fp8 with a bf16 backward, 2 ranks), then the bf16 cost at 1.5B
# (none and [swiglu, norm] alternated three times; session 22 measured -2.8% before this).
if has pending22; then
    { step swiglu_ops 120 env QT_TEST_ONLY=swiglu build/tests/test_ops_gpu
      step swiglu_bwd_h_bitwise 120 env QT_TEST_ONLY=swiglu_bwd_h build/tests/test_kernels
      if [ -x build/tests/test_kernels_mut_swiglu_h ]; then
          step swiglu_bwd_h_mutant 120 env QT_TEST_ONLY=swiglu_bwd_h build/tests/test_kernels_mut_swiglu_h
      fi
      step recompute_mutants 540 env QT_TEST_ONLY=mutant build/tests/test_recompute
      step recompute_bf16 540 env QT_TEST_ONLY=recompute_bf16 build/tests/test_recompute
      step recompute_fp8 540 env QT_TEST_ONLY=recompute_fp8 build/tests/test_recompute
      step recompute_dp 540 env QT_TEST_ONLY=recompute_dp build/tests/test_recompute
      one="build/bench/train_bench configs/qwen2.5-1.5b-fp8.yaml --steps 10 --set data.micro_batch=16 --set data.grad_accum=1 \
          --set parallel.gpus=1 --set precision.matmul_dtype=bf16 --set precision.grad_dtype=bf16"
      for rep in 1 2 3; do for r in "[]" "[swiglu,norm]"; do
          step "rc_bf16_${rep}_$r" 240 $one --set "memory.recompute=$r"
      done; done
    } 2>&1 | tee "$OUT/pending22.log" | grep -E '^(PASS|FAIL|SKIP|==)|bitwise|differ|mutant|tokens/s|rror'
fi
# box23 (4 GPUs, alone, ~9 minutes; session 24): the 14B box at LLM.Q's precision with its breakdown, then 7B
# as auto plans it
if has box23 && [ "$ngpu" -ge 4 ]; then
    llmq="--set precision.master_dtype=bf16 --set precision.grad_accum_dtype=bf16 --set parallel.gather_dtype=e4m3"
    BOX_MODELS=14b BOX_STEPS="--warmup 1 --steps 2 --breakdown" BOX_EXTRA="$llmq" OUT="$OUT/box23_14b" bash "$0" multi_box
    # 7B: auto now takes the pieces and gradient shards offloaded at mb 32 x 4 (--plan, H100 rates: 39,301
    # tokens/s predicted; section 13 ran auto's earlier plan, pieces on the GPU, mb 8 x 16: 37,206 measured)
    BOX_MODELS=7b BOX_EXTRA="$llmq" OUT="$OUT/box23_7b" bash "$0" multi_box
fi
# rc_cost2 (session 21): swiglu+norm against none at equal micro-batch again, 1.5B fp8 as rc_cost, the two
# alternated three times (each run a fresh process: rc_cost's "none" moved 3.5% between two calls), with the
# autotuner (median of the three) and with the heuristic's first algorithm (the same matmuls in both runs).
if has rc_cost2; then
    one="build/bench/train_bench configs/qwen2.5-1.5b-fp8.yaml --steps 10 --set data.micro_batch=16 --set data.grad_accum=1 --set parallel.gpus=1"
    { for rep in 1 2 3; do for r in "[]" "[swiglu,norm]"; do
          step "rc2_${rep}_$r" 240 $one --set "memory.recompute=$r"
      done; done
      for rep in 1 2; do for r in "[]" "[swiglu,norm]"; do
          step "rc2_heur0_${rep}_$r" 240 $one --set "memory.recompute=$r" --set perf.matmul_autotune=false
      done; done
    } 2>&1 | tee "$OUT/rc_cost2.log" | grep -E '^(==)|tokens/s|rror'
fi
# gemm_big (session 21): the 7B and 14B matmuls at their H100 plans' micro-steps (the breakdown's down
# forward ran at ~66% of gate|up's fp8 rate in both models).
if has gemm_big; then
    { step gemm_q7b 300 build/bench/gemm_bench q7b; step gemm_q14b 300 build/bench/gemm_bench q14b
    } 2>&1 | tee "$OUT/gemm_big.log" | grep -E '^(==)|fp8|rror'
fi
# gemm_real (session 21): the down projection's fp8 forward with training's value distributions (SwiGLU
# outputs and N(0,1) weights, amax-scaled) against gemm_big's random codes.
if has gemm_real; then
    { step gemm_real_q7b 300 build/bench/gemm_bench q7b-down real; step gemm_real_q14b 300 build/bench/gemm_bench q14b-down real
    } 2>&1 | tee "$OUT/gemm_real.log" | grep -E '^(==)|fp8|rror'
fi
# rc7b (session 21): swiglu+norm against none at 7B, equal micro-batch (8 x 1024, the H100 row's), LLM.Q's
# precision and the optimizer offloaded as in brk_7b_fp8, grad_accum 16 (the once-per-step optimizer and
# its weight upload dilute the cost by ~7%: said beside the figure), alternated twice.
if has rc7b; then
    k7="--set memory.plan=manual $h100_keys --set data.grad_accum=16 --set memory.offload_optimizer=true \
        --set data.micro_batch=8 --set memory.fp8_weight_cache=all"
    { for rep in 1 2; do for r in "[]" "[swiglu,norm]"; do
          step "rc7b_${rep}_$r" 200 build/bench/train_bench configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 2 $k7 --set "memory.recompute=$r"
      done; done
    } 2>&1 | tee "$OUT/rc7b.log" | grep -E '^(==)|tokens/s|rror'
fi
# box_grid (4 GPUs, alone; for the cost model's missing term): host transport with ZeRO-3 / ZeRO-2 and the
# ranks' offloaded pieces or not, bf16 sums or not: 1.5B fp8 (short steps, fast start) and 7B fp8, no
# GPU cap. The 4-GPU box runs were over-predicted by 27-42% with offloaded shards and under-predicted by
# 13.5% without (bench/RESULTS.md section 9): these rows are what a shared-host-bandwidth term is fitted on
# (and the box runs then hold it out).
if has box_grid && [ "$ngpu" -ge 4 ]; then
    g="--set parallel.gpus=4 --set parallel.comm=host --set perf.cuda_graphs=false --set memory.fp8_weight_cache=none"
    g15="build/bench/train_bench configs/qwen2.5-1.5b-fp8.yaml --warmup 2 --steps 4 $g --set data.micro_batch=16 --set data.grad_accum=2 --set memory.offload_optimizer=false --set memory.recompute=[]"
    g7="build/bench/train_bench configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 2 $g --set data.micro_batch=8 --set data.grad_accum=4 --set memory.recompute=[block] --set parallel.zero=3"
    { step bg_1.5b_z3 300 $g15 --set parallel.zero=3
      step bg_1.5b_z3_w 300 $g15 --set parallel.zero=3 --set "memory.offload=[weights]"
      step bg_1.5b_z3_wg 300 $g15 --set parallel.zero=3 --set "memory.offload=[weights,gradients]"
      step bg_1.5b_z3_wg_bf16sums 300 $g15 --set parallel.zero=3 --set "memory.offload=[weights,gradients]" --set parallel.reduce_dtype=bf16
      step bg_1.5b_z2_g 300 $g15 --set parallel.zero=2 --set "memory.offload=[gradients]"
      step bg_7b_z3 400 $g7
      step bg_7b_z3_wg 400 $g7 --set "memory.offload=[weights,gradients,master,m,v]"
    } 2>&1 | tee "$OUT/box_grid.log" | grep -E '^(==)|tokens/s|rror'
fi
# grid2: plans none of the cost model's constants were chosen on (session 18 fitted QT_PLAN_ELEM_BPS and
# QT_PLAN_DUPLEX on `grid`): 3B bf16 and 7B fp8 at other micro-batches and recompute sets, the optimizer
# offloaded or not, lm-head chunks; compare with `qtrain --plan` and the same keys (tests/test_plan
# cost_grid's helper, H200 rates) and report where it misses.
if has grid2; then
    g3="build/bench/train_bench configs/qwen2.5-3b-bf16.yaml --warmup 1 --steps 2 --set parallel.gpus=1 --set data.grad_accum=8"
    g7="build/bench/train_bench configs/qwen2.5-7b-fp8.yaml --warmup 1 --steps 2 --set parallel.gpus=1 --set perf.cuda_graphs=false"
    { step grid2_3b_none_opt_mb8 300 $g3 --set data.micro_batch=8 --set "memory.recompute=[]" --set memory.offload_optimizer=true
      step grid2_3b_swiglunorm_mb16 300 $g3 --set data.micro_batch=16 --set "memory.recompute=[swiglu,norm]" --set memory.offload_optimizer=false
      step grid2_3b_block_lm4_mb32 300 $g3 --set data.micro_batch=32 --set data.grad_accum=4 --set "memory.recompute=[block]" --set memory.lmhead_chunks=4
      step grid2_7b_ffnnorm_mb16 400 $g7 --set data.micro_batch=16 --set data.grad_accum=16 --set "memory.recompute=[ffn,norm]"
      step grid2_7b_qkvatt_mb4 400 $g7 --set data.micro_batch=4 --set data.grad_accum=32 --set "memory.recompute=[qkv,att,ffn,norm]"
    } 2>&1 | tee "$OUT/grid2.log" | grep -E '^(==)|tokens/s|rror'
fi
# memory.offload with ZeRO ranks (ranks sharing GPU 0 where there is one GPU): ZeRO-3 + [weights], ZeRO-2/3 +
# [gradients], ZeRO-3 + both = the same level without the offload, bitwise, on 2 and 3 ranks; mutants 7, 8, 2
if has offload_ranks; then
    { step offload_ranks 1500 env QT_TEST_ONLY=offload_ranks build/tests/test_offload
    } 2>&1 | tee "$OUT/offload_ranks.log" | grep -E '^(PASS|FAIL|SKIP|==)|bitwise|caught|differ|rror'
fi
if has offload_weights; then
    b15w="configs/qwen2.5-1.5b-fp8.yaml --steps 10 --set parallel.gpus=1 --set perf.cuda_graphs=false"
    { step test_offload 1800 build/tests/test_offload
      step offload_weights_1.5b_gpu 300 build/bench/train_bench $b15w
      step offload_weights_1.5b_host 400 build/bench/train_bench $b15w --set "memory.offload=[weights]"
      step offload_grads_1.5b_host 400 build/bench/train_bench $b15w --set "memory.offload=[gradients]"
      step offload_both_1.5b_host 400 build/bench/train_bench $b15w --set "memory.offload=[weights,gradients]"
    } 2>&1 | tee "$OUT/offload_weights.log" | grep -E '^(PASS|FAIL|SKIP|==)|bitwise|caught|differ|GiB|tokens/s|rror'
fi
# parallel.zero (ranks sharing one GPU, so the bits and the overheads, not scaling): test_zero (7B plan
# rows, ZeRO-2 = ZeRO-1 bitwise over 20 steps for 2 and 3 ranks, bf16/fp8, overlap, graphs; accumulation
# bound; resume across levels; mutants; a failing rank; ZeRO-3 = ZeRO-2 bitwise, its resume, mutants and a
# rank failing mid-gather), then 0.5B fp8 on 2 ranks of GPU 0 at ZeRO-1, 2 and 3 (3 without CUDA graphs,
# which it refuses): one 16 x 1024 micro-batch per rank per step, and LLM.Q's setting (ZeRO-2/3 sum every
# micro-step; ZeRO-3 gathers every layer twice per micro-step).
if has zero; then
    two="--set parallel.devices=[0,0] --set precision.opt_m_dtype=bf16 --set precision.opt_v_dtype=bf16"
    { step test_zero 1800 build/tests/test_zero
      for z in 1 2 3; do
          z3=""
          [ "$z" = 3 ] && z3="--set perf.cuda_graphs=false"
          step zero${z}_0.5b_fp8_2ranks_mb16 300 build/bench/train_bench configs/qwen2.5-0.5b-fp8.yaml --steps 10 $two \
              --set data.micro_batch=16 --set data.grad_accum=1 --set parallel.zero=$z $z3
          step zero${z}_0.5b_fp8_2ranks_llmq 400 build/bench/train_bench configs/qwen2.5-0.5b-fp8.yaml --warmup 1 --steps 3 \
              $two --set parallel.zero=$z $z3
      done
    } 2>&1 | tee "$OUT/zero.log" | grep -E '^(PASS|FAIL|SKIP|==)|bitwise|differ|within|GiB|resumed|exit status|tokens/s|rror|gradient'
fi
