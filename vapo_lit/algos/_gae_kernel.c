/* Reverse GAE sweep over rows [0, B) (single-threaded: the caller splits rows over threads; an
 * OpenMP runtime here would fight the one bundled with torch for the cores).
 *
 * Semantics (see advantage.py): positions with mask == 0 are skipped as if cut out of the row; the
 * value after the last valid token is bootstrap[b] (0 = terminal). Two carries share one TD
 * residual: carry_a with lambda_a (actor advantages), carry_c with lambda_c (critic advantages,
 * written as returns = A + V). Accumulation is in double. Rows with an invalid mask value or a
 * nonzero reward on a masked position report the first offending column in bad[b] (else -1).
 *
 * Rows are swept LANES at a time, interleaved: each row's recursion is a chain of dependent
 * multiply-adds, so walking several independent rows together keeps the FPU busy instead of
 * waiting on one chain's latency.
 */
#include <stdint.h>

#define LANES 4

#define DEFINE_GAE(NAME, REAL)                                                              \
static inline void NAME##_step(const REAL *rr, const REAL *vv, const REAL *mm, REAL *aa,    \
                               REAL *rc, int64_t t, double gamma, double ka, double kc,     \
                               double *ca, double *cc, double *next_v, int64_t *first_bad)  \
{                                                                                           \
    const double mk = (double)mm[t];                                                        \
    if (mk == 0.0) {                                                                        \
        if (rr[t] != 0) *first_bad = t;                                                     \
        aa[t] = 0; rc[t] = 0;                                                               \
        return;                                                                             \
    }                                                                                       \
    if (mk != 1.0) *first_bad = t;                                                          \
    const double vt = (double)vv[t];                                                        \
    const double d = (double)rr[t] + gamma * *next_v - vt;                                  \
    *ca = d + ka * *ca;                                                                     \
    *cc = d + kc * *cc;                                                                     \
    aa[t] = (REAL)*ca;                                                                      \
    rc[t] = (REAL)(*cc + vt);                                                               \
    *next_v = vt;                                                                           \
}                                                                                           \
                                                                                            \
void NAME(const REAL *r, const REAL *v, const REAL *m, const REAL *boot,                    \
          const REAL *lam_a, const REAL *lam_c, REAL *adv_a, REAL *ret_c, int64_t *bad,     \
          int64_t B, int64_t T, double gamma)                                               \
{                                                                                           \
    for (int64_t b0 = 0; b0 < B; b0 += LANES) {                                             \
        const int n = (int)(B - b0 < LANES ? B - b0 : LANES);                               \
        double ka[LANES], kc[LANES], ca[LANES], cc[LANES], nv[LANES];                       \
        int64_t fb[LANES];                                                                  \
        for (int j = 0; j < n; ++j) {                                                       \
            const int64_t b = b0 + j;                                                       \
            ka[j] = gamma * (double)lam_a[b];                                               \
            kc[j] = gamma * (double)(lam_c ? lam_c[b] : lam_a[b]);                          \
            ca[j] = 0.0; cc[j] = 0.0; fb[j] = -1;                                           \
            nv[j] = boot ? (double)boot[b] : 0.0;                                           \
        }                                                                                   \
        for (int64_t t = T - 1; t >= 0; --t)                                                \
            for (int j = 0; j < n; ++j) {                                                   \
                const int64_t o = (b0 + j) * T;                                             \
                NAME##_step(r + o, v + o, m + o, adv_a + o, ret_c + o, t, gamma, ka[j],     \
                            kc[j], &ca[j], &cc[j], &nv[j], &fb[j]);                         \
            }                                                                               \
        for (int j = 0; j < n; ++j) bad[b0 + j] = fb[j];                                    \
    }                                                                                       \
}

DEFINE_GAE(vapo_gae_f32, float)
DEFINE_GAE(vapo_gae_f64, double)
