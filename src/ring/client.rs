//! What a subscriber of either ring kind asks of the publisher and how it
//! waits: the settings [`crate::SubscriberOptions`] and
//! [`crate::packet::PacketSubscriberOptions`] share, and their builders.

use std::time::Duration;

use super::cadence::WaitStrategy;

/// The subscriber settings both ring kinds share. Their builders come from
/// [`ClientOptions`].
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Name shown by the publisher, its subscriber table and the CLI.
    pub name: String,
    /// How long to wait for the publisher's Welcome.
    pub connect_timeout: Duration,
    /// Ask to be a lossless reader: the publisher (whose policy must be
    /// lossless) does not overwrite what this subscriber has not read, up
    /// to its lease.
    pub lossless: bool,
    /// How blocking reads wait: [`WaitStrategy::Cadence`] (the default)
    /// learns the publisher's interval and wakes just before each frame or
    /// packet is due, spinning only then; [`WaitStrategy::Park`] spins for
    /// `spin`, then parks on the futex; [`WaitStrategy::Spin`] busy-polls
    /// (one core). Cadence waits as Park does whenever the source is
    /// irregular or paused.
    pub wait: WaitStrategy,
    /// How long a blocking read spins before it parks on the futex, for
    /// [`WaitStrategy::Park`] and [`WaitStrategy::Cadence`] (whose window
    /// comes on top of it): a very long spin busy-polls.
    pub spin: Duration,
    /// Longest single park: between parks the publisher's liveness is
    /// checked, so this bounds how late a dead publisher is noticed.
    pub park_slice: Duration,
}

impl ClientConfig {
    /// The defaults, named `<prefix>-<pid>`: not lossless, the cadence wait
    /// with a 50 µs spin, 20 ms park slices, a 5 s handshake.
    pub(crate) fn named(prefix: &str) -> Self {
        ClientConfig {
            name: format!("{prefix}-{}", std::process::id()),
            connect_timeout: Duration::from_secs(5),
            lossless: false,
            wait: WaitStrategy::Cadence,
            spin: Duration::from_micros(50),
            park_slice: Duration::from_millis(20),
        }
    }
}

/// Builder methods for the shared subscriber settings, on both ring kinds'
/// options.
pub trait ClientOptions: Sized {
    /// The settings.
    fn client_mut(&mut self) -> &mut ClientConfig;

    /// Sets the name.
    fn name(mut self, n: impl Into<String>) -> Self {
        self.client_mut().name = n.into();
        self
    }
    /// Sets how long the handshake may take.
    fn connect_timeout(mut self, d: Duration) -> Self {
        self.client_mut().connect_timeout = d;
        self
    }
    /// Asks to be lossless.
    fn lossless(mut self, yes: bool) -> Self {
        self.client_mut().lossless = yes;
        self
    }
    /// Sets how blocking reads wait (see [`WaitStrategy`]).
    fn wait(mut self, w: WaitStrategy) -> Self {
        self.client_mut().wait = w;
        self
    }
    /// Sets the spin before parking (`Duration::ZERO`: park at once).
    fn spin(mut self, d: Duration) -> Self {
        self.client_mut().spin = d;
        self
    }
    /// Sets the longest single park.
    fn park_slice(mut self, d: Duration) -> Self {
        self.client_mut().park_slice = d;
        self
    }
}
