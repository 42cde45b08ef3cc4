/* Reverse GAE sweep over rows [0, B), one row at a time (single-threaded: the caller splits rows
 * over threads; an OpenMP runtime here would fight the one bundled with torch for the cores).
 *
 * Semantics (see advantage.py): positions with mask == 0 are skipped as if cut out of the row; the
 * value after the last valid token is bootstrap[b] (0 = terminal). Two carries share one TD
 * residual: carry_a with lambda_a (actor advantages), carry_c with lambda_c (critic advantages,
 * written as returns = A + V). Accumulation is in double. Rows with an invalid mask value or a
 * nonzero reward on a masked position report the first offending column in bad[b] (else -1).
 */
#include <stdint.h>

#define DEFINE_GAE(NAME, REAL)                                                              \
void NAME(const REAL *r, const REAL *v, const REAL *m, const REAL *boot,                    \
          const REAL *lam_a, const REAL *lam_c, REAL *adv_a, REAL *ret_c, int64_t *bad,     \
          int64_t B, int64_t T, double gamma)                                               \
{                                                                                           \
    for (int64_t b = 0; b < B; ++b) {                                                       \
        const REAL *rr = r + b * T, *vv = v + b * T, *mm = m + b * T;                       \
        REAL *aa = adv_a + b * T, *rc = ret_c + b * T;                                      \
        const double ka = gamma * (double)lam_a[b];                                         \
        const double kc = gamma * (double)(lam_c ? lam_c[b] : lam_a[b]);                    \
        double ca = 0.0, cc = 0.0;                                                          \
        double next_v = boot ? (double)boot[b] : 0.0;                                       \
        int64_t first_bad = -1;                                                             \
        for (int64_t t = T - 1; t >= 0; --t) {                                              \
            const double mk = (double)mm[t];                                                \
            if (mk == 0.0) {                                                                \
                if (rr[t] != 0) first_bad = t;                                              \
                aa[t] = 0; rc[t] = 0;                                                       \
                continue;                                                                   \
            }                                                                               \
            if (mk != 1.0) first_bad = t;                                                   \
            const double vt = (double)vv[t];                                                \
            const double d = (double)rr[t] + gamma * next_v - vt;                           \
            ca = d + ka * ca;                                                               \
            cc = d + kc * cc;                                                               \
            aa[t] = (REAL)ca;                                                               \
            rc[t] = (REAL)(cc + vt);                                                        \
            next_v = vt;                                                                    \
        }                                                                                   \
        bad[b] = first_bad;                                                                 \
    }                                                                                       \
}

DEFINE_GAE(vapo_gae_f32, float)
DEFINE_GAE(vapo_gae_f64, double)
