"""The README's "What fits where" rows: `qtrain --plan` of the shipped 1.5B/3B/7B/14B configs without their
memory keys and step shape (micro-batch free, 64 x 8 = 512 sequences per step), memory.plan: auto, at
12/16/24/48/80 GiB per GPU and 1 TiB of host, no GPU needed. Run from the repository root after `make`:
    python3 tools/fits_table.py [NAME ...] > /tmp/rows.md     (NAME: rows whose label contains it)
Predictions use the default (H100) rates; measured rows are in bench/RESULTS.md."""
import os, re, subprocess, tempfile
cfgs=[("1.5B fp8","configs/qwen2.5-1.5b-fp8.yaml"),("3B bf16","configs/qwen2.5-3b-bf16.yaml"),("7B fp8","configs/qwen2.5-7b-fp8.yaml"),("14B fp8","configs/qwen2.5-14b-fp8.yaml"),
      ("Mistral-7B fp8","configs/mistral-7b-v0.3-fp8.yaml"),("Llama-3.1-8B fp8","configs/llama-3.1-8b-fp8.yaml"),("Qwen3-8B fp8","configs/qwen3-8b-fp8.yaml"),("Qwen3-14B fp8","configs/qwen3-14b-fp8.yaml"),("Gemma-3-4B fp8","configs/gemma-3-4b-fp8.yaml")]
import sys
if len(sys.argv)>1: cfgs=[c for c in cfgs if any(a in c[0] for a in sys.argv[1:])]
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
for name,path in cfgs:
    p=strip(path); cells=[]
    for g in (12,16,24,48,80):
        r=subprocess.run(["build/qtrain","--plan",p,"--set","memory.plan=auto","--set","data.grad_accum=64","--set","perf.cuda_graphs=false","--gpu-mem",str(g),"--host-mem","1024"],capture_output=True,text=True)
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
