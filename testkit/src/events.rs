//! The library's tracing events on one thread, as text: for a test that
//! proves an outcome the library only logs (a worker joined at close, not
//! left running).

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

/// Events of targets under `vramring`, DEBUG and above, each as its message
/// followed by ` field=value` for every other field.
#[derive(Clone, Default)]
pub struct Events(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Events {
    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Text(String, String);
        impl tracing::field::Visit for Text {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                } else {
                    let _ = write!(self.1, " {}={v:?}", f.name());
                }
            }
        }
        let mut t = Text(String::new(), String::new());
        e.record(&mut t);
        self.0.lock().expect("events").push(t.0 + &t.1);
    }
}

impl Events {
    /// Records this thread's events until the guard drops.
    pub fn on_this_thread() -> (Events, tracing::subscriber::DefaultGuard) {
        let events = Events::default();
        let guard = crate::marks::on_this_thread(events.clone(), "vramring", tracing::Level::DEBUG);
        (events, guard)
    }

    /// The events since the last take.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().expect("events"))
    }
}

/// Closes `p` under the hang guard and checks that the close joined its
/// socket service: `close` joins it for a bounded time, then leaves it
/// running and logs `outcome=TimedOut`, returning `Ok` either way.
pub fn close_joining_the_service(mut p: vramring::Publisher) {
    let events = crate::hang::ends("close", move || {
        let (events, _guard) = Events::on_this_thread();
        p.close().expect("close");
        events.take()
    });
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("socket service stopped") && e.contains("outcome=Joined")),
        "the service was not joined at close: {events:?}"
    );
}
