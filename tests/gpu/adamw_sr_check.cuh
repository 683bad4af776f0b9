/*
 * adamw_sr_check.cuh — test_ops.cu's checks of the multi-tensor AdamW and
 * of Adafactor on bf16 master weights (stochastic rounding,
 * kernels/sround.h) against the CPU ops, in a file of their own so that
 * test_ops.cu stays readable.
 * Included by test_ops.cu after op_check.cuh (its helpers and counters).
 */
#ifndef M6_ADAMW_SR_CHECK_CUH
#define M6_ADAMW_SR_CHECK_CUH

/* The cuda op's bf16 master weights gpb against the CPU op's p (n of
 * them, from p0): equal but for at most 1 in 1,000 (on a GPU, where nvcc
 * may fuse multiply-adds; none under the emulation), and then by one bf16
 * ulp of the larger (2^-7 relative) at most; more than half moved. */
static void sr_weights_check_(const char *op, const float *gpb,
                              const float *p, const float *p0, size_t n)
{
    size_t differ = 0, far = 0, moved = 0;
    for (size_t i = 0; i < n; i++) {
        moved += gpb[i] != p0[i];
        if (gpb[i] == p[i])
            continue;
        differ++;
        far += fabsf(gpb[i] - p[i]) > fmaxf(fabsf(gpb[i]), fabsf(p[i])) / 128;
    }
#ifdef __CUDACC__
    size_t allowed = n / 1000;
#else
    size_t allowed = 0;
#endif
    char what[96];
    printf("  %zu of %zu weights differ from the CPU op's (allowed %zu), "
           "%zu moved\n", differ, n, allowed, moved);
    snprintf(what, sizeof what, "%s sr weights = CPU op's", op);
    check_true_(what, differ <= allowed && !far);
    snprintf(what, sizeof what, "%s sr weights moved", op);
    check_true_(what, moved > n / 2);
}

/* Multi-tensor AdamW on bf16 master weights (tensors with an sr_key:
 * params are the masters, no fp32 copy) against the CPU op
 * (adamw_update_spans with the same keys) on the same inputs: weights and
 * gradients bf16 values, two regions at steps 3 and 7, clipping firing.
 * The stochastic rounding's bits are sround.h's on both sides, so the
 * rounding decisions are the same wherever the fp32 value before rounding
 * is: on the emulation (the CPU's arithmetic) every weight bit for bit.
 * On a GPU nvcc may fuse a multiply-add, which moves that value by an fp32
 * ulp or so and flips a decision with probability ~2^-16 per ulp: there a
 * weight may differ by one bf16 ulp, in at most 1 of 1000 elements. The
 * device-args launch (what a CUDA graph replays) gives the same bits as
 * the by-value one; padding between tensors stays as it was. */
static void test_adamw_sr_(void)
{
    const size_t sizes[] = {37, 1025, 2053, 4099, 1};
    const int regions[] = {0, 0, 1, 1, 1};
    const int nt = 5, GAP = 3;
    size_t off[5], n = GAP;
    for (int k = 0; k < nt; k++) {
        off[k] = n;
        n += sizes[k] + GAP;
    }
    printf("adamw_multi, bf16 masters with stochastic rounding (%zu "
           "elements)\n", n);
    float *p0 = hrand_(n, -1, 1), *gr = hrand_(n, -0.5f, 0.5f);
    float *m0 = hrand_(n, -0.1f, 0.1f), *v0 = hrand_(n, 0, 0.01f);
    float *p = hcopy_(p0, n), *m = hcopy_(m0, n), *v = hcopy_(v0, n);
    long t[2] = {3, 7};
    adamw_tensor_cuda ts[5];
    adamw_span sp[5];
    double ssq = 0;
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    for (int k = 0; k < nt; k++) {
        uint64_t key = sr_span_key(11, regions[k] - 1, off[k]);
        ts[k] = (adamw_tensor_cuda){off[k], sizes[k], k != 1, regions[k],
                                    key};
        sp[k] = (adamw_span){p + off[k], gr + off[k], m + off[k], v + off[k],
                             sizes[k], k != 1 ? wd : 0.0f, t[regions[k]],
                             key};
        for (size_t i = 0; i < sizes[k]; i++)
            ssq += (double)gr[off[k] + i] * gr[off[k] + i];
    }
    float sumsq = (float)ssq, norm = sqrtf(sumsq), max_norm = norm * 0.5f;
    adamw_update_spans(sp, nt, lr, b1, b2, eps, max_norm / norm);
    adamw_multi_plan *plan = adamw_multi_plan_create(ts, nt, 2);
    check_true_("plan made", plan != NULL);
    if (!plan)
        return;
    bf16 *d_g = dbf_(gr, n), *d_pb = dbf_(p0, n);
    float *d_ssq = dcopy_(&sumsq, 1), *d_m = dcopy_(m0, n), *d_v = dcopy_(v0, n);
    adamw_multi_cuda(plan, NULL, d_pb, d_g, d_m, d_v, t, lr, b1, b2, eps, wd,
                     d_ssq, max_norm, st);
    float *gpb = hbf_(d_pb, n), *gm = hcopy_dev_(d_m, n);
    float *gv = hcopy_dev_(d_v, n);
    sr_weights_check_("adamw", gpb, p, p0, n);
    check_("adamw sr m", gm, m, NULL, n, TOL_F32);
    check_("adamw sr v", gv, v, NULL, n, TOL_F32);
    int gaps = 1;
    for (int k = 0; k <= nt; k++) {
        size_t g0 = k ? off[k - 1] + sizes[k - 1] : 0;
        for (size_t i = g0; i < g0 + GAP; i++)
            gaps &= gpb[i] == p0[i] && gm[i] == m0[i] && gv[i] == v0[i];
    }
    check_true_("adamw sr padding untouched", gaps);

    /* the device-args launch: the same bits */
    bf16 *q_pb = dbf_(p0, n);
    float *q_m = dcopy_(m0, n), *q_v = dcopy_(v0, n);
    size_t na = adamw_multi_args_floats(plan);
    float *args = (float *)malloc(na * sizeof(float));
    adamw_multi_args_fill(plan, args, t, lr, b1, b2, eps, wd, max_norm);
    float *d_args = dcopy_(args, na);
    adamw_multi_dev_cuda(plan, NULL, q_pb, d_g, q_m, q_v, d_args, d_ssq, st);
    float *qpb = hbf_(q_pb, n), *qm = hcopy_dev_(q_m, n);
    check_true_("adamw sr device args = by value, bit for bit",
                !memcmp(qpb, gpb, n * sizeof(float)) &&
                !memcmp(qm, gm, n * sizeof(float)));
    adamw_multi_plan_destroy(plan);
    free(p0); free(gr); free(m0); free(v0); free(p); free(m); free(v);
    free(gpb); free(gm); free(gv); free(args); free(qpb); free(qm);
    cudaFree(d_g); cudaFree(d_pb); cudaFree(d_ssq); cudaFree(d_m);
    cudaFree(d_v); cudaFree(q_pb); cudaFree(q_m); cudaFree(q_v);
    cudaFree(d_args);
}

/* bf16 masters, every update below bf16's resolution (tests/unit/
 * test_masters.c's case on the device): N weights at 1.0 (ulp 2^-7),
 * gradient 0.5 throughout, K AdamW steps of lr 2e-4, each an fp32 step of
 * about lr, under a tenth of 1.0's half ulp (round-to-nearest keeps every
 * weight at 1.0). The mean weight must have moved by the fp32 steps' sum
 * (computed here in double) within 5 sd of the rounding's noise. */
static void test_adamw_sr_small_(void)
{
    const size_t N = 256 * 1024;
    const int K = 40;
    const float lr = 2e-4f, g0 = 0.5f, eps = 1e-8f;
    printf("adamw_multi, bf16 masters, updates below bf16's resolution "
           "(N=%zu, %d steps)\n", N, K);
    float *ones = (float *)malloc(N * sizeof(float));
    float *gs = (float *)malloc(N * sizeof(float));
    for (size_t i = 0; i < N; i++) {
        ones[i] = 1.0f;
        gs[i] = g0;
    }
    bf16 *d_pb = dbf_(ones, N), *d_g = dbf_(gs, N);
    float *d_m, *d_v;
    CUDA_CHECK(cudaMalloc(&d_m, N * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_v, N * sizeof(float)));
    CUDA_CHECK(cudaMemset(d_m, 0, N * sizeof(float)));
    CUDA_CHECK(cudaMemset(d_v, 0, N * sizeof(float)));
    adamw_tensor_cuda ts = {0, N, 0, 0, sr_span_key(42, 0, 0)};
    adamw_multi_plan *plan = adamw_multi_plan_create(&ts, 1, 1);
    check_true_("plan made", plan != NULL);
    if (!plan)
        return;
    double want = 0.0;
    for (long t = 1; t <= K; t++) {
        adamw_multi_cuda(plan, NULL, d_pb, d_g, d_m, d_v, &t, lr, 0.9f,
                         0.999f, eps, 0.0f, NULL, 0.0f, st);
        want += lr * g0 / (g0 + eps);
    }
    float *gp = hbf_(d_pb, N);
    double sum = 0.0;
    for (size_t i = 0; i < N; i++)
        sum += 1.0 - gp[i];
    double moved = sum / (double)N, ulp = 0.0078125;
    double sd = sqrt((double)K) * ulp / 2.0 / sqrt((double)N);
    printf("  moved %.6g on average, fp32 sum %.6g, 5 sd %.3g\n", moved,
           want, 5 * sd);
    check_true_("every step below a tenth of half an ulp",
                lr < 0.1 * ulp / 2.0);
    check_true_("adamw sr moves the mean as fp32 would",
                fabs(moved - want) <= 5.0 * sd);
    adamw_multi_plan_destroy(plan);
    free(ones); free(gs); free(gp);
    cudaFree(d_pb); cudaFree(d_g); cudaFree(d_m); cudaFree(d_v);
}

/* Adafactor on bf16 master weights (adafactor_update_cuda with an sr_key
 * and master NULL) against the CPU op (adafactor_update_spans with the
 * same key) on the same inputs: a rows x cols matrix (cols 0: a vector)
 * at step t = 3, no first moment, gradient scale 0.5, clipping at d = 1,
 * with and without the relative step (scale_parameter, RMS of the bf16
 * masters). The same rule for the weights as test_adamw_sr_: bit for bit
 * on the emulation, one bf16 ulp in at most 1 of 1000 on a GPU. */
static void test_adafactor_sr_case_(int rows, int cols, int scale_parameter)
{
    size_t n = (size_t)rows * (cols ? cols : 1), nc = cols ? cols : 1;
    const long t = 3;
    const float lr = 1e-2f, wd = 0.1f, half = 0.5f;
    printf("adafactor %dx%d, bf16 masters, scale_parameter %d\n", rows, cols,
           scale_parameter);
    float *p0 = hrand_(n, -1, 1), *gr = hrand_(n, -0.5f, 0.5f);
    float *r0 = hrand_(rows, 0.01f, 0.1f), *c0 = hrand_(nc, 0.01f, 0.1f);
    float *p = hcopy_(p0, n), *r = hcopy_(r0, rows), *c = hcopy_(c0, nc);
    uint64_t key = sr_span_key(5, 2, 640);
    adafactor_span sp = {p, gr, NULL, r, cols ? c : NULL, rows, cols, wd, t,
                         key};
    adafactor_hparams h = {lr, 0.0f, 0.8f, 1.0f, 1e-30f, 1e-3f,
                           scale_parameter, half};
    check_true_("adafactor sr cpu op ran",
                adafactor_update_spans(&sp, 1, &h) == 0);
    float *d_r = dcopy_(r0, rows), *d_c = dcopy_(c0, nc);
    float *d_sc = dcopy_(&half, 1);
    bf16 *d_g = dbf_(gr, n), *d_pb = dbf_(p0, n);
    double *d_scr = dnan_<double>(adafactor_scratch_doubles(n));
    adafactor_tensor_step_cuda x = {NULL, d_pb, d_g, NULL, d_r,
                                    cols ? d_c : NULL, rows, cols,
                                    adafactor_beta2(t, 0.8f), wd, key, t};
    adafactor_hparams_cuda hc = {lr, 0.0f, 1.0f, 1e-30f, 1e-3f,
                                 scale_parameter};
    adafactor_update_cuda(&x, &hc, d_sc, d_scr, st);
    float *gpb = hbf_(d_pb, n);
    sr_weights_check_("adafactor", gpb, p, p0, n);
    free(p0); free(gr); free(r0); free(c0); free(p); free(r); free(c);
    free(gpb);
    cudaFree(d_r); cudaFree(d_c); cudaFree(d_sc); cudaFree(d_g);
    cudaFree(d_pb); cudaFree(d_scr);
}

static void test_adafactor_sr_(void)
{
    test_adafactor_sr_case_(300, 70, 0);
    test_adafactor_sr_case_(300, 70, 1);
    test_adafactor_sr_case_(5003, 0, 0);
}

#endif /* M6_ADAMW_SR_CHECK_CUH */
