/* plan_report.c — `qtrain --plan`: the run's memory plan and the cost model's step, printed (qt_planner.h). */
#include <stdio.h>

#include "qt_config.h"
#include "qt_engine.h"
#include "qt_plan_auto.h"
#include "qt_planner.h"

int qt_plan_report(const qt_config *cfg, const qt_probe *pr, double gpu_gib, double host_gib, char *err, size_t errlen) {
    qt_layout L;
    qt_weight_src src;
    static qt_run_plan rp;
    if (qt_model_layout(cfg, &L, &src, err, errlen)) return -1;
    int rc = qt_plan_run(&L, cfg, -1, 1, &rp, err, errlen);
    if (rc) {
        qt_layout_free(&L);
        return -1;
    }
    /* the budgets: --gpu-mem / --host-mem, else what a run would plan for (qt_plan_gpu_budget, qt_plan_host_limit) */
    char gw[192], hw[128];
    size_t gb = gpu_gib > 0 ? qt_mem_gib(gpu_gib) : rp.ranks ? qt_plan_gpu_budget(cfg, pr, gw, sizeof gw) : 0;
    size_t hb = host_gib > 0 ? qt_mem_gib(host_gib) : qt_plan_host_limit(cfg, hw, sizeof hw);
    if (gpu_gib > 0) snprintf(gw, sizeof gw, "--gpu-mem %g", gpu_gib);
    if (host_gib > 0) snprintf(hw, sizeof hw, "--host-mem %g", host_gib);
    printf("qtrain --plan %s: %zu parameters, micro-batch %d x %d, grad_accum %d, %s\n", cfg->path, L.n_params,
           cfg->data.micro_batch, cfg->data.seq_len, cfg->data.grad_accum,
           rp.ranks ? "GPU" : "CPU engine (device: cpu)");
    if (rp.ranks && gpu_gib <= 0) printf("  GPU budget %.2f GiB per GPU: %s\n", gb / 1073741824.0, gw);
    if (host_gib <= 0) printf("  host budget %.2f GiB: %s\n", hb / 1073741824.0, hw);
    qt_plan_print(&rp);
    char e2[1024];
    int gpu_no = qt_plan_check(&rp, gb, gw, 0, "", err, errlen) != 0;
    int host_no = qt_plan_check(&rp, 0, "", hb, hw, gpu_no ? e2 : err, gpu_no ? sizeof e2 : errlen) != 0;
    printf("  %-30s %10.1f MiB  %s: %s\n", "GPU per device", rp.gpu_bytes / 1048576.0, !rp.ranks ? "-" : gw,
           !rp.ranks ? "no GPU used" : gpu_no ? "does not fit" : "fits");
    printf("  %-30s %10.1f MiB  %s: %s\n", "host", rp.host_bytes / 1048576.0, hb ? hw : "no budget (MemAvailable unread)",
           host_no ? "does not fit" : "fits");
    if (rp.ranks) { /* the cost model's step (memory.plan: auto ranks plans by it) */
        qt_plan_cost k = qt_plan_auto_cost_parts(&L, cfg, pr);
        double t = qt_plan_auto_cost(&L, cfg, pr), tok = (double)cfg->data.micro_batch * cfg->data.seq_len * cfg->data.grad_accum;
        printf("  predicted on %s: %.0f tokens/s, %.2f s per step: compute %.2f s; beside it %.1f GB over PCIe (%.2f s); "
               "serial %.1f GB (%.2f s with the rest)\n", pr->gpu, tok * rp.ranks / t, t, k.compute, k.pcie_micro_bytes * 1e-9,
               k.pcie_micro, k.pcie_once_bytes * 1e-9, k.once);
    }
    rc = gpu_no || host_no;
    qt_layout_free(&L);
    return rc;
}
