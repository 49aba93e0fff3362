//! Percentiles over samples, one definition for every bench.
//!
//! **Nearest rank on the (n − 1) scale**: the `p` quantile of `n` sorted
//! samples is the sample at index `round((n − 1) · p)` (ties rounded up),
//! never an interpolation between two samples. So p0 is the minimum, p1 the
//! maximum, and the median of an even count is the upper of the two middle
//! samples (`sorted[n / 2]`).

/// The index of the `p` quantile (0..=1) among `n` sorted samples (`n > 0`):
/// `round((n − 1) · p)`.
pub fn rank(n: usize, p: f64) -> usize {
    ((n.saturating_sub(1)) as f64 * p).round() as usize
}

/// The `p` quantile of `sorted` ([`rank`]); 0 when empty.
pub fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[rank(sorted.len(), p)]
}

/// [`pct`] of nanosecond samples, in microseconds; NaN when empty.
pub fn pct_us(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    pct(sorted, p) as f64 / 1000.0
}

/// The median of `v` ([`rank`] 0.5: the upper middle sample of an even
/// count), which it sorts; NaN when empty.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[rank(v.len(), 0.5)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_on_the_n_minus_1_scale() {
        let v: Vec<u64> = (1..=10).collect();
        assert_eq!(pct(&v, 0.0), 1);
        assert_eq!(pct(&v, 1.0), 10);
        // (10 − 1) · 0.5 = 4.5, rounded up: the upper middle sample.
        assert_eq!(pct(&v, 0.5), 6);
        // 9 · 0.99 = 8.91 → 9.
        assert_eq!(pct(&v, 0.99), 10);
        assert_eq!(pct(&[7], 0.99), 7);
        assert_eq!(pct(&[], 0.5), 0);
        assert!(pct_us(&[], 0.5).is_nan());
        assert_eq!(pct_us(&[1500, 2500, 3500], 0.5), 2.5);
    }

    #[test]
    fn the_median_is_the_sample_at_half_the_count() {
        // What the benches computed as `v[v.len() / 2]` before.
        for n in 1..50usize {
            let mut v: Vec<f64> = (0..n).rev().map(|x| x as f64).collect();
            assert_eq!(median(&mut v), (n / 2) as f64, "n {n}");
            assert_eq!(rank(n, 0.5), n / 2, "n {n}");
        }
        assert!(median(&mut []).is_nan());
    }

    #[test]
    fn the_rank_is_within_one_of_the_textbook_nearest_rank() {
        // ceil(p · n) − 1, what packet_race computed before: never more
        // than one rank away.
        for n in 1..400usize {
            for p in [0.5, 0.9, 0.99, 0.999, 1.0] {
                let textbook = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
                assert!(rank(n, p).abs_diff(textbook) <= 1, "n {n} p {p}");
            }
        }
    }
}
