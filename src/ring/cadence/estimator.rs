//! The cadence estimator: learns the publisher's frame interval and plans each
//! wait's spin window, in pure arithmetic over nanosecond timestamps.

use super::samples::Samples;

/// Intervals kept to estimate the cadence.
const INTERVALS: usize = 32;
/// Recent commits kept to place the publisher's grid. Few: the interval's
/// own error is carried forward once per frame of age.
const GRID: usize = 8;
/// Intervals needed before the estimate is trusted.
const MIN_INTERVALS: usize = 8;
/// Samples kept for each error distribution (overshoot, early, late, seen):
/// about 5 s at 25 fps.
const SAMPLES: usize = 128;
/// The share of each of those distributions that the window covers (the
/// margin and tolerance are built from their `COVER` quantiles): all of it,
/// the largest of the last [`SAMPLES`], so that a frame falls outside one of
/// them only about once in 129, the chance that a new sample exceeds the
/// largest of 128 (ADR 0012).
const COVER: f64 = 1.0;
/// Shortest interval followed (2 kHz); faster sources are spun for by the
/// plain strategy's spin anyway.
const MIN_INTERVAL_NS: u64 = 500_000;
/// Longest interval followed (1 fps); slower sources park.
const MAX_INTERVAL_NS: u64 = 1_000_000_000;
/// A delivered frame may skip at most this many seqs and still yield an
/// interval (a Latest reader skips some); a larger jump resets.
const MAX_SEQ_STEP: u64 = 4;
/// A commit time later than our own clock by more than this is nonsense.
const FUTURE_SLOP_NS: u64 = 1_000_000;
/// Windows missed in a row before the lock is dropped.
const MAX_MISSES: u32 = 3;
/// Bounds of the margin before the expected frame.
const MARGIN_MIN_NS: u64 = 30_000;
const MARGIN_MAX_NS: u64 = 2_000_000;
/// Bounds of the tolerance after it.
const TOLERANCE_MIN_NS: u64 = 20_000;
const TOLERANCE_MAX_NS: u64 = 1_000_000;
/// Assumed timer overshoot before one is measured.
const DEFAULT_OVERSHOOT_NS: u64 = 100_000;
/// Added to both ends for what the percentiles do not see.
const SLACK_NS: u64 = 15_000;
/// Default CPU budget: the share of the interval that the margin, and
/// separately the tolerance, may span, in parts per ten thousand (150 =
/// 1.5 %). A frame that comes on time costs the margin; a late one the
/// margin and its lateness.
const DEFAULT_BUDGET_BP: u64 = 150;
/// How much of what the overshoot and early-commit samples ask for the
/// margin covers, in percent: half as much again as their largest, because
/// a timer's overshoot has a long tail that even the largest of the recent
/// samples understates, at a CPU cost of about half the samples' sum per
/// frame, since every frame spins through the margin (ADR 0012).
const MARGIN_PERCENT: u64 = 150;
/// How many times what the late samples (commit lateness and the spread of
/// when frames show up) ask for the tolerance covers: generously, since only
/// frames that come late spin through it (ADR 0012).
const LATE_FACTOR: u64 = 2;

/// How far one way of predicting the next commit was off: how much earlier
/// and how much later than predicted frames were committed.
#[derive(Debug, Clone)]
struct Errors {
    early: Samples<SAMPLES>,
    late: Samples<SAMPLES>,
}

impl Errors {
    const fn new() -> Self {
        Errors {
            early: Samples::new(),
            late: Samples::new(),
        }
    }
    fn push(&mut self, expected: u64, commit_ns: u64) {
        if commit_ns >= expected {
            self.late.push(commit_ns - expected);
        } else {
            self.early.push(expected - commit_ns);
        }
    }
    fn clear(&mut self) {
        self.early.clear();
        self.late.clear();
    }
    /// The window this prediction needs (the covered quantile, `COVER`, of
    /// its early and of its late errors, added), once it has been tried on
    /// enough frames.
    fn width(&self) -> Option<u64> {
        (self.early.len() + self.late.len() >= MIN_INTERVALS).then(|| {
            let q = |s: &Samples<SAMPLES>| s.quantile(COVER).unwrap_or(0);
            q(&self.early).saturating_add(q(&self.late))
        })
    }
}

/// The window planned for one wait, in `CLOCK_MONOTONIC` ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Park until here, then spin.
    pub from_ns: u64,
    /// When the frame is expected.
    pub expected_ns: u64,
    /// Stop spinning here and park as usual.
    pub until_ns: u64,
}

/// What the estimator knows about the stream now (for tests, logs and
/// benches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CadenceState {
    /// The locked interval in ns, `None` while unlocked.
    pub interval_ns: Option<u64>,
    /// The current margin before the expected commit, ns.
    pub margin_ns: u64,
    /// The current tolerance after it, ns.
    pub tolerance_ns: u64,
    /// Windows planned so far.
    pub windows: u64,
    /// Frames caught spinning inside their window.
    pub hits: u64,
    /// Windows that ended without their frame (it came later, or never).
    pub misses: u64,
    /// Frames that came before their window's spin began (woken through
    /// the doorbell, or by a timer that fired late).
    pub early: u64,
    /// The timer overshoot the window covers (how late a park meant to
    /// end at a window's start returned: the largest recent sample), ns; 0
    /// before one is measured.
    pub overshoot_ns: u64,
    /// How early and how late than predicted the window covers frames
    /// being committed (the largest recent errors of the prediction in
    /// use), ns.
    pub early_ns: u64,
    /// See `early_ns`.
    pub late_ns: u64,
    /// Whether the next commit is predicted from the publisher's grid (the
    /// earliest of the recent commits carried forward) rather than from
    /// its last commit: whichever has needed the narrower window lately.
    pub grid: bool,
}

/// The cadence estimator and timing policy (see the [module docs](super)).
#[derive(Debug, Clone)]
pub struct Cadence {
    /// Share of the interval the spin window may take, in basis points.
    budget_bp: u64,
    /// Newest `(seq, commit_ns)` observed.
    last: Option<(u64, u64)>,
    intervals: Samples<INTERVALS>,
    /// Locked interval (0: unlocked).
    interval: u64,
    /// The newest `(seq, commit_ns)` observed, to place the grid.
    recent: Samples<GRID, (u64, u64)>,
    /// The errors of predicting each commit as the last one plus the
    /// interval (right for a source that sleeps an interval after each
    /// frame: its lateness carries over).
    by_last: Errors,
    /// The errors of predicting it from the publisher's grid: the earliest
    /// of the recent commits carried forward by the interval (right for a
    /// source paced by a clock, a camera or an absolute timer: a late frame
    /// does not make the next one late, and predicting from it would make
    /// the next one look early).
    by_grid: Errors,
    /// Whether `by_grid` has needed the narrower window lately (decided
    /// when the errors change, read on every plan).
    use_grid: bool,
    /// How late the park's timer woke us after the window's start.
    overshoot: Samples<SAMPLES>,
    /// From a frame's commit to the moment a spinning wait saw it, or, for
    /// a frame that came after its window, to its delivery. Those above a
    /// frame that came before its window (delivered sooner after its
    /// commit than they say frames show up) are forgotten.
    seen: Samples<SAMPLES>,
    /// The last wait ended before its window was due to open.
    before_window: bool,
    /// The window of the wait in progress and whether it has been judged.
    pending: Option<Window>,
    /// When the last wait that ended in its window saw the seq move.
    caught_ns: Option<u64>,
    /// Windows missed in a row.
    missed_in_row: u32,
    /// An observation not yet learnt from ([`Cadence::observe_deferred`]).
    deferred: Option<(u64, u64, u64)>,
    windows: u64,
    hits: u64,
    misses: u64,
    early: u64,
}

impl Default for Cadence {
    fn default() -> Self {
        Self::new()
    }
}

impl Cadence {
    /// An unlocked estimator with the default CPU budget (1.5 % of the
    /// interval spent spinning, at most).
    pub const fn new() -> Self {
        Cadence {
            budget_bp: DEFAULT_BUDGET_BP,
            last: None,
            intervals: Samples::new(),
            interval: 0,
            recent: Samples::filled((0, 0)),
            by_last: Errors::new(),
            by_grid: Errors::new(),
            use_grid: false,
            overshoot: Samples::new(),
            seen: Samples::new(),
            before_window: false,
            pending: None,
            caught_ns: None,
            missed_in_row: 0,
            deferred: None,
            windows: 0,
            hits: 0,
            misses: 0,
            early: 0,
        }
    }

    /// The estimator's view now.
    pub fn state(&self) -> CadenceState {
        CadenceState {
            interval_ns: (self.interval != 0).then_some(self.interval),
            margin_ns: self.margin(),
            tolerance_ns: self.tolerance(),
            windows: self.windows,
            hits: self.hits,
            misses: self.misses,
            early: self.early,
            overshoot_ns: self.overshoot.quantile(COVER).unwrap_or(0),
            early_ns: self.errors().early.quantile(COVER).unwrap_or(0),
            late_ns: self.errors().late.quantile(COVER).unwrap_or(0),
            grid: self.use_grid,
        }
    }

    /// Decides again, after the errors changed, whether the grid predicts
    /// better than the last commit: it has needed a narrower window over
    /// the recent frames.
    fn choose_prediction(&mut self) {
        self.use_grid = matches!((self.by_grid.width(), self.by_last.width()), (Some(g), Some(l)) if g < l);
    }

    /// The errors of the prediction in use.
    fn errors(&self) -> &Errors {
        if self.use_grid {
            &self.by_grid
        } else {
            &self.by_last
        }
    }

    /// Where the publisher's grid puts the commit of `seq`: the earliest of
    /// the recent commits, each carried forward by the interval. `None`
    /// while unlocked or with no recent commit before `seq`.
    fn grid_expect(&self, seq: u64) -> Option<u64> {
        if self.interval == 0 {
            return None;
        }
        self.recent
            .values()
            .iter()
            .filter_map(|&(s, c)| {
                let k = seq.checked_sub(s).filter(|&k| k > 0)?;
                c.checked_add(self.interval.checked_mul(k)?)
            })
            .min()
    }

    /// The commit of `seq` predicted the way that has worked best lately.
    fn expect(&self, seq: u64) -> Option<u64> {
        if self.use_grid {
            return self.grid_expect(seq);
        }
        let (last_seq, last_commit) = self.last?;
        last_commit.checked_add(self.interval.checked_mul(seq.checked_sub(last_seq)?)?)
    }

    /// The most the margin, and separately the tolerance, may span: the
    /// budget's share of the interval.
    fn cap(&self) -> u64 {
        self.interval.saturating_mul(self.budget_bp) / 10_000
    }

    /// The margin before and the tolerance after the expected frame: what
    /// the measurements ask for, each bounded, and each at most the CPU
    /// budget's share of the interval. The margin is spun through on every
    /// frame; the tolerance only as far as a frame is late (in full only
    /// when it does not come, and [`MAX_MISSES`] such windows in a row
    /// unlock), so it is `LATE_FACTOR` times what the late samples say: a
    /// window that ends before a late frame costs that frame a doorbell
    /// wake, slow on an idle vCPU, where spinning on costs only the CPU of
    /// that frame.
    fn bounds(&self) -> (u64, u64) {
        let over = self.overshoot.quantile(COVER).unwrap_or(DEFAULT_OVERSHOOT_NS);
        let errors = self.errors();
        let early = errors.early.quantile(COVER).unwrap_or(0);
        let margin = over.saturating_add(early).saturating_mul(MARGIN_PERCENT) / 100;
        let margin = margin.saturating_add(SLACK_NS).clamp(MARGIN_MIN_NS, MARGIN_MAX_NS);
        let late = errors.late.quantile(COVER).unwrap_or(0);
        let seen_spread = match (self.seen.quantile(COVER), self.seen.quantile(0.1)) {
            (Some(hi), Some(lo)) => hi.saturating_sub(lo),
            _ => 0,
        };
        let tolerance = late
            .saturating_add(seen_spread)
            .saturating_mul(LATE_FACTOR)
            .saturating_add(SLACK_NS)
            .clamp(TOLERANCE_MIN_NS, TOLERANCE_MAX_NS);
        let cap = self.cap();
        (
            margin.min(cap.max(MARGIN_MIN_NS)),
            tolerance.min(cap.max(TOLERANCE_MIN_NS)),
        )
    }

    fn margin(&self) -> u64 {
        self.bounds().0
    }

    fn tolerance(&self) -> u64 {
        self.bounds().1
    }

    /// Forgets the cadence (not the measured overshoot, which is the
    /// machine's, not the stream's).
    fn unlock(&mut self) {
        self.intervals.clear();
        self.interval = 0;
        self.recent.clear();
        self.by_last.clear();
        self.by_grid.clear();
        self.use_grid = false;
        self.missed_in_row = 0;
        self.pending = None;
    }

    /// As [`Cadence::observe`], but the work is done at the next
    /// [`Cadence::plan`] (or the next deferred observation): the subscriber
    /// hands the frame over first and learns from it while it waits.
    pub fn observe_deferred(&mut self, seq: u64, commit_ns: u64, now_ns: u64) {
        if let Some((s, c, n)) = self.deferred.replace((seq, commit_ns, now_ns)) {
            self.observe(s, c, n);
        }
    }

    /// When the frame after the last one observed should show up: its
    /// predicted commit plus how soon after its commit a frame typically
    /// shows up; `None` while unlocked.
    fn shows_up(&self) -> Option<u64> {
        let (last_seq, _) = self.last?;
        if self.interval == 0 {
            return None;
        }
        let seen = self.seen.quantile(0.1).unwrap_or(0);
        self.expect(last_seq.checked_add(1)?)?.checked_add(seen)
    }

    /// Learns from the observation [`Cadence::observe_deferred`] left, if
    /// any.
    fn learn_deferred(&mut self) {
        if let Some((s, c, n)) = self.deferred.take() {
            self.observe(s, c, n);
        }
    }

    /// When the next frame should show up (`CLOCK_MONOTONIC` ns), as the
    /// next [`Cadence::plan`] will expect it; `None` while unlocked. Learns
    /// from a deferred observation first, as `plan` does.
    fn due(&mut self) -> Option<u64> {
        self.learn_deferred();
        self.shows_up()
    }

    /// When a reader that takes up to `lead_ns` to prepare for the next
    /// frame should stop parking: `lead_ns` before the next window's spin
    /// would begin (the margin before the frame is due), so that its work
    /// is done before the window opens and a frame there is still caught
    /// spinning. `None` while unlocked.
    pub fn prepare_at(&mut self, lead_ns: u64) -> Option<u64> {
        let due = self.due()?;
        Some(due.saturating_sub(self.margin()).saturating_sub(lead_ns))
    }

    /// Plans the next wait at `now_ns`: the window to spin in, or `None`
    /// to wait as [`WaitStrategy::Park`](super::WaitStrategy::Park) does
    /// (unlocked, or the frame is overdue already).
    pub fn plan(&mut self, now_ns: u64) -> Option<Window> {
        self.learn_deferred();
        self.pending = None;
        self.caught_ns = None;
        self.before_window = false;
        let expected = self.shows_up()?;
        let (margin, tolerance) = self.bounds();
        let until = expected.checked_add(tolerance)?;
        if now_ns >= until {
            // Overdue: the stream paused or the reader is behind. Park; the
            // next frame's timestamps say whether the cadence still holds.
            return None;
        }
        let typical = self.overshoot.quantile(0.5).unwrap_or(DEFAULT_OVERSHOOT_NS);
        if typical.saturating_add(SLACK_NS) > margin {
            // The budget cannot cover even a typical timer wake (a fast
            // cadence, or a busy machine): the timer would fire after the
            // frame, so park instead. The assumed overshoot enters the
            // samples, so that after a burst of late timers a window is
            // tried again.
            self.overshoot.push(DEFAULT_OVERSHOOT_NS);
            return None;
        }
        let w = Window {
            from_ns: expected.saturating_sub(margin).max(now_ns),
            expected_ns: expected,
            until_ns: until,
        };
        self.windows += 1;
        self.pending = Some(w);
        Some(w)
    }

    /// The park meant to end at the window's start returned `late_ns`
    /// after it.
    pub fn timer_woke(&mut self, late_ns: u64) {
        // Bounded so one descheduled moment cannot inflate the margin
        // past its cap for a whole window of samples.
        self.overshoot.push(late_ns.min(MARGIN_MAX_NS));
    }

    /// The wait planned by the last [`Cadence::plan`] ended at `now_ns`;
    /// `advanced` when the seq moved, `spun` when its window's spin began,
    /// `parked` when it parked on a timer set to the window's start.
    pub fn waited(&mut self, advanced: bool, spun: bool, parked: bool, now_ns: u64) {
        let Some(w) = self.pending.take() else {
            return;
        };
        if advanced && spun && now_ns <= w.until_ns {
            self.caught_ns = Some(now_ns);
            self.hits += 1;
            self.missed_in_row = 0;
        } else if now_ns > w.until_ns {
            // The window ended without the frame (it came later, or not
            // at all before the deadline).
            self.miss();
            if advanced {
                // It came later: when it was delivered also teaches how
                // long after its commit a frame shows up (an upper bound:
                // the doorbell's wake is in it). Learning only from the
                // frames a window caught, the window would never widen to
                // the ones it misses.
                self.caught_ns = Some(now_ns);
            }
        }
        // Advanced before the window's spin (an early frame, or a late
        // timer, woken through the doorbell: its timestamp teaches the
        // early errors), or stopped inside it (a short timeout, a socket
        // message): no miss.
        if advanced && !spun {
            self.early += 1;
            // It came before the window was even due to open: `observe`
            // checks, with the frame's commit time, whether the window was
            // placed late.
            self.before_window = now_ns < w.from_ns;
            if let Some(late) = now_ns.checked_sub(w.from_ns).filter(|_| parked) {
                // Woken by the doorbell after the window should have opened:
                // the park's timer had not fired yet, so it overshot by at
                // least this much (learning only from the timers that fired
                // before their frame, the margin would never grow to the
                // ones that did not). A wait that found its frame without
                // parking on that timer (it began late) says nothing of it.
                self.timer_woke(late);
            }
        }
    }

    fn miss(&mut self) {
        self.misses += 1;
        self.missed_in_row += 1;
        if self.missed_in_row >= MAX_MISSES {
            self.unlock();
        }
    }

    /// A frame or packet `seq` committed at `commit_ns` (the publisher's
    /// clock, untrusted) was delivered at `now_ns`. Never panics; nonsense
    /// unlocks.
    pub fn observe(&mut self, seq: u64, commit_ns: u64, now_ns: u64) {
        let caught = self.caught_ns.take();
        let before_window = std::mem::take(&mut self.before_window);
        if commit_ns == 0 || commit_ns > now_ns.saturating_add(FUTURE_SLOP_NS) {
            self.unlock();
            self.last = None;
            return;
        }
        let Some((last_seq, last_commit)) = self.last.replace((seq, commit_ns)) else {
            self.recent.push((seq, commit_ns));
            return;
        };
        if seq <= last_seq || commit_ns <= last_commit {
            // Backwards: a restarted or lying publisher.
            self.unlock();
            self.recent.push((seq, commit_ns));
            return;
        }
        let step = seq - last_seq;
        if step > MAX_SEQ_STEP {
            // A gap too wide to read an interval across (a pause, a slow
            // reader): learn the interval and the grid again from here.
            self.intervals.clear();
            self.interval = 0;
            self.recent.clear();
            self.recent.push((seq, commit_ns));
            return;
        }
        let delta = (commit_ns - last_commit) / step;
        if !(MIN_INTERVAL_NS..=MAX_INTERVAL_NS).contains(&delta) {
            self.unlock();
            self.recent.push((seq, commit_ns));
            return;
        }
        if self.interval != 0 {
            let by_last = last_commit.saturating_add(self.interval.saturating_mul(step));
            self.by_last.push(by_last, commit_ns);
            self.by_grid.push(self.grid_expect(seq).unwrap_or(by_last), commit_ns);
            self.choose_prediction();
            if let Some(c) = caught {
                self.seen.push(c.saturating_sub(commit_ns).min(TOLERANCE_MAX_NS));
            } else if before_window {
                // Delivered through the doorbell before its window was due
                // to open. If that is sooner after its commit than the
                // samples that placed the window say frames show up, they
                // are wrong (frames that came late, a slow start say), and
                // nothing else would correct them: every frame would come
                // before the window, and none would be seen spinning to
                // teach better. Those above it go. A frame that was early
                // because its commit was early changes nothing here.
                let shown = now_ns.saturating_sub(commit_ns);
                if self.seen.quantile(0.1).is_some_and(|q| q > shown) {
                    self.seen.retain_at_most(shown);
                }
            }
        }
        self.recent.push((seq, commit_ns));
        self.intervals.push(delta);
        self.relock();
    }

    /// Locks when the intervals agree (90 % of them within an eighth of
    /// their median), on the mean of those that do: the mean follows the
    /// publisher's grid where the median would pick one side of its jitter.
    fn relock(&mut self) {
        self.interval = 0;
        if self.intervals.len() < MIN_INTERVALS {
            return;
        }
        let Some(median) = self.intervals.quantile(0.5) else {
            return;
        };
        let near = median / 8;
        if self.intervals.spread(median, 0.9).unwrap_or(u64::MAX) > near {
            return;
        }
        let (mut sum, mut n) = (0u128, 0u128);
        for &d in self.intervals.values() {
            if d.abs_diff(median) <= near {
                sum += u128::from(d);
                n += 1;
            }
        }
        // The mean of values that fit in a u64 fits in a u64.
        self.interval = sum.checked_div(n).map_or(0, |m| m as u64);
    }
}

#[cfg(test)]
mod tests;
