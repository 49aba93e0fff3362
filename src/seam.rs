//! Not part of the API: the internals that the workspace's other crates
//! reach (`vramring-testkit`'s fake driver and GPU test pattern, the Python
//! binding's DLPack export, the benches) and the crate's own tests use to
//! check the shared layout and the protocol steps. Hidden from the docs and
//! outside semver: nothing here is promised to a user.

/// The CUDA driver layer and the pool owners.
pub mod cuda {
    pub use crate::memory::cuda::*;
    pub use crate::memory::{
        ExportedPool, GateLine, ImportedPool, MappedTargets, OwnBuffer, PushWrite, QueuedCopies, RawCuStream,
        StreamCommit, StreamCommits,
    };
}

/// memfd regions and their seals.
pub mod shm {
    pub use crate::shm::*;
}

/// The shared `#[repr(C)]` layout (mirrored by `proto/vramring.h`).
pub mod layout {
    pub use crate::layout::*;
}

/// Socket messages and descriptor passing (mirrored by `proto/PROTOCOL.md`).
pub mod socket {
    pub use crate::socket::*;
}

/// The frame ring's lock-free protocol steps, for the loom models.
pub mod protocol {
    pub use crate::frame::protocol::*;
}

/// The ring core's pieces the loom models and wait tests drive directly.
pub mod ring {
    pub use crate::ring::*;
}

/// A publisher whose socket service polls for `idle_tick` with nobody
/// connected: a test stretches it to prove that what the service must do
/// at once (a stop, an eviction) does not wait for the tick, without
/// timing it.
///
/// # Errors
/// As [`Publisher::create`](crate::Publisher::create).
pub fn publisher_with_idle_tick(
    path: impl AsRef<std::path::Path>,
    cfg: crate::RingConfig,
    idle_tick: std::time::Duration,
) -> crate::Result<crate::Publisher> {
    crate::Publisher::create_ticking(path.as_ref(), cfg, idle_tick)
}

/// Clocks and deadlines.
pub mod time {
    pub use crate::time::*;
}

/// Process exit coordination and the free-memory watchdog.
pub mod lifecycle {
    pub use crate::lifecycle::*;
}

/// The packet ring's shared layout.
pub mod packet_layout {
    pub use crate::packet::layout::*;
}

/// Frame geometry constants.
pub mod format {
    pub use crate::format::*;
}
