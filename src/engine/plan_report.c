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
    double g = gpu_gib > 0 ? gpu_gib : cfg->memory.gpu_limit_gib, h = host_gib > 0 ? host_gib : cfg->memory.host_limit_gib;
    char gw[64], hw[64];
    snprintf(gw, sizeof gw, "%s %g", gpu_gib > 0 ? "--gpu-mem" : "memory.gpu_limit_gib =", g);
    snprintf(hw, sizeof hw, "%s %g", host_gib > 0 ? "--host-mem" : "memory.host_limit_gib =", h);
    printf("qtrain --plan %s: %zu parameters, micro-batch %d x %d, grad_accum %d, %s\n", cfg->path, L.n_params,
           cfg->data.micro_batch, cfg->data.seq_len, cfg->data.grad_accum,
           rp.ranks ? "GPU" : "CPU engine (device: cpu)");
    qt_plan_print(&rp);
    char e2[1024];
    int gpu_no = qt_plan_check(&rp, qt_mem_gib(g), gw, 0, "", err, errlen) != 0;
    int host_no = qt_plan_check(&rp, 0, "", qt_mem_gib(h), hw, gpu_no ? e2 : err, gpu_no ? sizeof e2 : errlen) != 0;
    printf("  %-30s %10.1f MiB  %s: %s\n", "GPU per device", rp.gpu_bytes / 1048576.0, g > 0 ? gw : "no limit given",
           !rp.ranks ? "no GPU used" : gpu_no ? "does not fit" : "fits");
    printf("  %-30s %10.1f MiB  %s: %s\n", "host", rp.host_bytes / 1048576.0, h > 0 ? hw : "no limit given",
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
