"""The README's "What fits where" rows: `qtrain --plan` of the shipped 1.5B/3B/7B/14B configs without their
memory keys and step shape (micro-batch free, 64 x 8 = 512 sequences per step), memory.plan: auto, at
12/16/24/48/80 GiB per GPU and 1 TiB of host, no GPU needed. Run from the repository root after `make`:
    python3 tools/fits_table.py [--lora] [NAME ...] > /tmp/rows.md     (NAME: rows whose label contains it;
                                                                         --lora: the LoRA / QLoRA rows)
Predictions use the default (H100) rates; measured rows are in bench/RESULTS.md."""
import os, re, subprocess, tempfile
cfgs=[("1.5B fp8","configs/qwen2.5-1.5b-fp8.yaml"),("3B bf16","configs/qwen2.5-3b-bf16.yaml"),("7B fp8","configs/qwen2.5-7b-fp8.yaml"),("14B fp8","configs/qwen2.5-14b-fp8.yaml"),
      ("Mistral-7B fp8","configs/mistral-7b-v0.3-fp8.yaml"),("Llama-3.1-8B fp8","configs/llama-3.1-8b-fp8.yaml"),("Qwen3-8B fp8","configs/qwen3-8b-fp8.yaml"),("Qwen3-14B fp8","configs/qwen3-14b-fp8.yaml"),("Gemma-3-4B fp8","configs/gemma-3-4b-fp8.yaml"),("Gemma-3-12B fp8","configs/gemma-3-12b-fp8.yaml")]
# --lora: LoRA r16 (alpha 32, all linear layers) over the same configs, the base in bf16 or NF4 (QLoRA), bf16 matmuls
# and backward (NF4 needs them), one GPU; predicted with the LoRA step of src/plan/plan_lora.c
R16=["--set","lora.rank=16","--set","lora.alpha=32","--set","precision.matmul_dtype=bf16","--set","precision.grad_dtype=bf16"]
NF4=R16+["--set","lora.base_dtype=nf4"]
ONE=["--set","parallel.gpus=1","--set","parallel.zero=1","--set","parallel.gather_dtype=bf16"]
lora=[("Qwen2.5-7B LoRA (bf16 base)","configs/qwen2.5-7b-bf16.yaml",R16),("Qwen2.5-7B QLoRA","configs/qwen2.5-7b-bf16.yaml",NF4),
      ("Llama-3.1-8B LoRA (bf16 base)","configs/llama-3.1-8b-fp8.yaml",R16),("Llama-3.1-8B QLoRA","configs/llama-3.1-8b-fp8.yaml",NF4),
      ("Qwen3-8B QLoRA","configs/qwen3-8b-fp8.yaml",NF4),("Qwen2.5-14B QLoRA","configs/qwen2.5-14b-fp8.yaml",NF4),
      ("Qwen2.5-32B QLoRA","configs/qwen2.5-32b-fp8.yaml",NF4+ONE)]
import sys
args=sys.argv[1:]
if "--lora" in args: args.remove("--lora"); cfgs=lora
cfgs=[c if len(c)==3 else c+([],) for c in cfgs]
if args: cfgs=[c for c in cfgs if any(a in c[0] for a in args)]
def strip(path):
    out=[]; skip=False
    for line in open(path):
        if re.match(r'^memory:',line): skip=True; continue
        if skip and (line.startswith(' ') or line.strip()=='' ): 
            if line.strip()=='' : skip=False
            continue
        skip=False
        if re.match(r'^\s+(micro_batch|grad_accum):',line): continue
        out.append(line)
    p=os.path.join(tmp, path.split('/')[-1]); open(p,'w').write(''.join(out)); return p
tmp=tempfile.mkdtemp(prefix='qt_fits_')
rows=[]
for name,path,extra in cfgs:
    p=strip(path); cells=[]
    for g in (12,16,24,48,80):
        r=subprocess.run(["build/qtrain","--plan",p,"--set","memory.plan=auto","--set","data.grad_accum=64","--set","perf.cuda_graphs=false","--gpu-mem",str(g),"--host-mem","1024"]+extra,capture_output=True,text=True)
        m=re.search(r'chosen\s+micro_batch\s+(\d+) x grad_accum\s+\d+, recompute \[([^\]]*)\], offload_optimizer (\w+), offload_residual (\w+), fp8_weight_cache (\w+), lmhead_chunks\s+(\d+), attn_bwd_chunks (\d+), zero \d+(, [^:]*)?: ([\d.]+) GiB GPU, ([\d.]+) GiB host, (\d+) tokens/s', r.stdout)
        if not m: cells.append("no"); continue
        mb,rc,oo,orr,wc,lm,ab,off,gpu,host,tps=m.groups()
        parts=["mb "+mb,"["+(rc or "none")+"]"]
        if oo=="true": parts.append("offload")
        if orr=="true": parts.append("residual")
        if wc=="none": parts.append("wcache none")
        if lm!="1": parts.append("lm "+lm)
        if off:
            o=off.strip(", ").replace("cuda_graphs false, ","").replace("cuda_graphs false","").replace(" offloaded","")
            if o: parts.append("**"+o.replace(" and "," + ")+" offloaded**")
        n=re.search(r'NOTE: precision.master_dtype (\w+), precision.grad_accum_dtype (\w+)', r.stdout.split("chosen")[1].split("next")[0])
        lossy=[w for w,dt in zip(("master","gradients"),n.groups() if n else ()) if dt=="bf16"]
        note=" (bf16 %s)"%" and ".join(lossy) if lossy else ""
        rate="~%dk"%round(int(tps)/1000) if int(tps)>=1000 else "~%d"%(round(int(tps),-1))
        cells.append("%s: %s / %.0f GiB, %s tok/s%s"%(", ".join(parts),gpu,float(host),rate,note))
    rows.append("| %s | %s |"%(name," | ".join(cells)))
print("\n".join(rows))
