//! The fixed rings of recent samples the cadence estimator keeps, and their
//! quantiles.

/// A fixed ring of the newest `N` samples.
#[derive(Debug, Clone)]
pub(super) struct Samples<const N: usize, T = u64> {
    v: [T; N],
    len: usize,
    next: usize,
}

impl<const N: usize, T: Copy> Samples<N, T> {
    pub(super) const fn filled(zero: T) -> Self {
        Samples {
            v: [zero; N],
            len: 0,
            next: 0,
        }
    }
    pub(super) fn push(&mut self, x: T) {
        self.v[self.next] = x;
        self.next = (self.next + 1) % N;
        self.len = (self.len + 1).min(N);
    }
    pub(super) fn clear(&mut self) {
        self.len = 0;
        self.next = 0;
    }
    pub(super) fn len(&self) -> usize {
        self.len
    }
    pub(super) fn values(&self) -> &[T] {
        &self.v[..self.len]
    }
}

impl<const N: usize> Samples<N> {
    pub(super) const fn new() -> Self {
        Samples::filled(0)
    }
    /// The `p` quantile (0.0..=1.0, nearest rank), or `None` when empty.
    pub(super) fn quantile(&self, p: f64) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let mut s = [0u64; N];
        s[..self.len].copy_from_slice(&self.v[..self.len]);
        let s = &mut s[..self.len];
        let k = ((self.len - 1) as f64 * p.clamp(0.0, 1.0)).round() as usize;
        if k >= s.len() {
            return None;
        }
        Some(*s.select_nth_unstable(k).1)
    }
    /// Drops the samples above `max`, keeping the rest in age order.
    pub(super) fn retain_at_most(&mut self, max: u64) {
        let (old, start) = (self.clone(), if self.len < N { 0 } else { self.next });
        self.clear();
        for i in 0..old.len {
            let x = old.v[(start + i) % N];
            if x <= max {
                self.push(x);
            }
        }
    }
    /// The `p` quantile of `|x − center|`.
    pub(super) fn spread(&self, center: u64, p: f64) -> Option<u64> {
        let mut d = Samples::<N>::new();
        for &x in &self.v[..self.len] {
            d.push(x.abs_diff(center));
        }
        d.quantile(p)
    }
}
