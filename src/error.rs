//! The crate's one error type.

use std::io;
use std::path::PathBuf;

use crate::socket::msg;

/// Everything that can go wrong in `vramring`, as typed variants a caller can
/// match on. Messages say what happened and, where it helps, what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The peer speaks another version of the socket protocol.
    #[error("protocol version mismatch: {peer_role} speaks protocol {peer}, this build speaks {ours}; upgrade the older side")]
    VersionMismatch {
        /// "publisher" or "subscriber": whose version is `peer`.
        peer_role: &'static str,
        /// The peer's protocol version.
        peer: u32,
        /// This build's protocol version.
        ours: u32,
    },

    /// A shared-memory layout read from a peer failed validation.
    #[error("shared layout rejected: {0}")]
    LayoutMismatch(String),

    /// A socket message from a peer was malformed.
    #[error("malformed message from peer: {0}")]
    BadMessage(String),

    /// The publisher refused this subscriber.
    #[error("publisher refused the subscription: {reason} (code {code})")]
    Refused {
        /// Machine-readable reason code (see `proto/PROTOCOL.md`).
        code: u32,
        /// Human-readable reason sent by the publisher.
        reason: String,
    },

    /// The publisher went away (process exit, crash, or orderly close).
    #[error("the publisher is gone (epoch {epoch:#018x})")]
    ProducerGone {
        /// Epoch of the publisher instance that went away.
        epoch: u64,
    },

    /// This subscriber was evicted by the publisher.
    #[error("evicted by the publisher: {reason}")]
    Evicted {
        /// Why the publisher evicted us.
        reason: String,
    },

    /// A wait ran out of time.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(std::time::Duration, &'static str),

    /// The frame was overwritten by the producer while it was being read.
    #[error("frame {seq} was overwritten by the producer while being read")]
    Overrun {
        /// The sequence number that was overrun.
        seq: u64,
    },

    /// Under the lossless policy, a lossless subscriber still holds the slot
    /// the producer wants to reuse.
    #[error("lossless subscriber {index} ({name}) still holds frame {held_seq}; the producer waited {waited:?}")]
    LosslessBlocked {
        /// Subscriber table index of the slow reader.
        index: u32,
        /// Its name from its Hello.
        name: String,
        /// The sequence number it still holds.
        held_seq: u64,
        /// How long the producer waited.
        waited: std::time::Duration,
    },

    /// A live publisher already listens at the socket path.
    #[error("a publisher is already listening at {0}; refusing to replace a live socket")]
    AddressInUse(PathBuf),

    /// The ring configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// The operation needs a backend other than the one in use.
    #[error("{what} is not available on the {backend} backend")]
    WrongBackend {
        /// What was asked for.
        what: &'static str,
        /// The backend in use.
        backend: &'static str,
    },

    /// The CUDA backend is not usable on this machine.
    #[error("CUDA is not usable here: {0}")]
    CudaUnavailable(String),

    /// A CUDA driver call failed.
    #[error("CUDA driver call {call} failed with {code} ({name})")]
    Driver {
        /// The driver function, e.g. `cuMemCreate`.
        call: &'static str,
        /// The raw `CUresult`.
        code: u32,
        /// The driver's name for the code, and for codes that come from
        /// the deployment (MPS), what to do about it.
        name: String,
    },

    /// Not enough free device memory for the ring.
    #[error("not enough free device memory: the ring needs {needed} bytes, {free} are free")]
    OutOfDeviceMemory {
        /// Bytes the ring needs.
        needed: u64,
        /// Bytes free on the device.
        free: u64,
    },

    /// The GPU the publisher uses is not visible to this process.
    #[error(
        "the publisher's GPU {uuid} is not visible here; check CUDA_VISIBLE_DEVICES and the container's device list"
    )]
    DeviceNotVisible {
        /// UUID of the publisher's GPU.
        uuid: String,
    },

    /// The peer is not on the allow-list.
    #[error("peer uid {uid} gid {gid} is not allowed")]
    PermissionDenied {
        /// The peer's uid.
        uid: u32,
        /// The peer's gid.
        gid: u32,
    },

    /// The publisher's subscriber table is full.
    #[error("the publisher's subscriber table is full ({0} entries)")]
    TooManySubscribers(u32),

    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// A payload is larger than the ring allows.
    #[error("payload of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Size offered.
        len: usize,
        /// Largest size accepted.
        max: usize,
    },

    /// The object was closed already.
    #[error("already closed")]
    Closed,

    /// A device-memory watchdog is already running in this process.
    #[error("a device-memory watchdog is already running in this process; stop it before starting another")]
    WatchdogRunning,

    /// The hardware video decoder (NVDEC, `libnvcuvid`) cannot be used on
    /// this machine: the library is missing or lacks an entry point.
    #[error("the NVDEC hardware decoder is not usable here: {0}")]
    DecoderUnavailable(String),

    /// The hardware video decoder cannot decode this stream (codec, chroma
    /// format, bit depth or size beyond what this GPU's NVDEC supports, or a
    /// mid-stream format change).
    #[error("the NVDEC hardware decoder cannot decode this stream: {0}")]
    UnsupportedStream(String),

    /// A packet-ring reader fell behind and the packet it wanted was
    /// overwritten; its next read resumes at the next intact keyframe.
    #[error("packet {seq} was overwritten before it was read (the writer is at packet {newest}, overrun {overruns} times so far); the next read resumes at a keyframe")]
    PacketOverrun {
        /// The first packet that will not be delivered.
        seq: u64,
        /// The newest packet committed when the overrun was detected.
        newest: u64,
        /// Overruns of this reader so far, this one included.
        overruns: u64,
    },
}

/// Shorthand for `Result<T, vramring::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a publisher refused a subscriber: the reject codes of
/// `proto/PROTOCOL.md`, as [`Error::refusal`] reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// The two sides speak different protocol versions.
    Version,
    /// The peer's uid or gid is not on the publisher's allow-list.
    Permission,
    /// The subscriber table is full.
    Full,
    /// The subscriber cannot import this ring's memory backend.
    Backend,
    /// Lossless was asked of a ring whose policy is overwrite.
    Policy,
    /// The Hello was malformed.
    BadHello,
    /// The publisher is shutting down.
    Shutdown,
    /// Write access was asked for and not granted.
    WriteDenied,
    /// The socket serves the other kind of ring (frames or packets).
    Kind,
    /// Pull delivery is not granted to this peer; push delivery is.
    PullDenied,
    /// Lossless is refused to this peer's uid for a while: a lossless
    /// reader of that uid kept the producer waiting past the lease. It may
    /// connect without lossless, or retry after the time in the reason.
    LosslessBackoff,
}

impl Refusal {
    const CODES: [(u32, Refusal); 11] = [
        (msg::REJECT_VERSION, Refusal::Version),
        (msg::REJECT_PERMISSION, Refusal::Permission),
        (msg::REJECT_FULL, Refusal::Full),
        (msg::REJECT_BACKEND, Refusal::Backend),
        (msg::REJECT_POLICY, Refusal::Policy),
        (msg::REJECT_BAD_HELLO, Refusal::BadHello),
        (msg::REJECT_SHUTDOWN, Refusal::Shutdown),
        (msg::REJECT_WRITE_DENIED, Refusal::WriteDenied),
        (msg::REJECT_KIND, Refusal::Kind),
        (msg::REJECT_PULL_DENIED, Refusal::PullDenied),
        (msg::REJECT_LOSSLESS_BACKOFF, Refusal::LosslessBackoff),
    ];

    /// The refusal a wire reject code names; `None` for a code this build
    /// does not know.
    pub fn from_code(code: u32) -> Option<Refusal> {
        Self::CODES.iter().find(|(c, _)| *c == code).map(|(_, r)| *r)
    }

    /// The wire reject code.
    pub fn code(self) -> u32 {
        Self::CODES.iter().find(|(_, r)| *r == self).map_or(0, |(c, _)| *c)
    }
}

impl Error {
    /// Why the publisher refused, for an [`Error::Refused`] with a known
    /// code; `None` for every other error.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Error::Refused { code, .. } => Refusal::from_code(*code),
            _ => None,
        }
    }

    /// An [`Error::Io`] with context.
    pub fn io(context: impl Into<String>, source: impl Into<io::Error>) -> Self {
        Error::Io {
            context: context.into(),
            source: source.into(),
        }
    }
}

/// Attach context to OS errors.
pub(crate) trait IoContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<io::Error>> IoContext<T> for std::result::Result<T, E> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::Io {
            context: context(),
            source: e.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{msg, Error, Refusal};

    #[test]
    fn every_reject_code_reads_back_as_its_refusal() {
        for (code, r) in Refusal::CODES {
            assert_eq!(Refusal::from_code(code), Some(r));
            assert_eq!(r.code(), code);
        }
        assert_eq!(Refusal::from_code(0), None);
        let e = Error::Refused {
            code: msg::REJECT_PULL_DENIED,
            reason: String::new(),
        };
        assert_eq!(e.refusal(), Some(Refusal::PullDenied));
    }
}
