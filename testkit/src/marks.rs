//! A tracing layer that records the publish's stage marks (TRACE events of
//! target `vramring::publish`) with the time each came: which stages a
//! commit passed (`tests/stream_commit.rs`) and where a slow publish spent
//! its time (`tests/gpu_commit.rs`).

use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The marks recorded since the last take.
#[derive(Clone, Default)]
pub struct StageMarks(Arc<Mutex<Vec<(Instant, String)>>>);

/// Sends this thread's events of `target` at `level` and above to `layer`
/// until the guard drops.
pub(crate) fn on_this_thread<L>(layer: L, target: &str, level: tracing::Level) -> tracing::subscriber::DefaultGuard
where
    L: tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync + 'static,
{
    use tracing_subscriber::layer::SubscriberExt;
    // A second dispatch alive for the whole process. While exactly one is
    // registered, tracing-core takes a cold callsite's interest from the
    // default of the thread that hits it first (tokio-rs/tracing#3611): a
    // callsite first hit by another test's thread, which records nothing,
    // would stay disabled for this thread's subscriber too.
    static SECOND: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
    SECOND.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
    let filter = tracing_subscriber::filter::Targets::new().with_target(target, level);
    let layer = tracing_subscriber::Layer::with_filter(layer, filter);
    let guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    tracing::callsite::rebuild_interest_cache();
    guard
}

/// A stage mark's words: the event's message, or its callsite's name.
pub fn message(e: &tracing::Event<'_>) -> String {
    struct Message(Option<String>);
    impl tracing::field::Visit for Message {
        fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
            if f.name() == "message" {
                self.0 = Some(format!("{v:?}"));
            }
        }
    }
    let mut m = Message(None);
    e.record(&mut m);
    m.0.unwrap_or_else(|| e.metadata().name().to_owned())
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for StageMarks {
    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if e.metadata().target() == "vramring::publish" {
            let t = Instant::now();
            self.0.lock().expect("marks").push((t, message(e)));
        }
    }
}

impl StageMarks {
    /// Records the marks of this thread's publishes until the guard drops.
    #[allow(dead_code)]
    pub fn on_this_thread() -> (StageMarks, tracing::subscriber::DefaultGuard) {
        let marks = StageMarks::default();
        let guard = on_this_thread(marks.clone(), "vramring::publish", tracing::Level::TRACE);
        (marks, guard)
    }

    /// The marks since the last take, with their times.
    fn drain(&self) -> Vec<(Instant, String)> {
        std::mem::take(&mut *self.0.lock().expect("marks"))
    }

    /// The stages since the last take, in order.
    #[allow(dead_code)]
    pub fn take_stages(&self) -> Vec<String> {
        self.drain().into_iter().map(|(_, m)| m).collect()
    }

    /// The stages since the last take, as "stage +µs" (each after the one
    /// before it, the first after `start`).
    #[allow(dead_code)]
    pub fn take_timed(&self, start: Instant) -> String {
        let mut last = start;
        self.drain()
            .into_iter()
            .map(|(t, m)| {
                let d = t.saturating_duration_since(last);
                last = t;
                format!("{m} +{:.1}", d.as_secs_f64() * 1e6)
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}
