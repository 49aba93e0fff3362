//! Exit codes and the sentence a person reads when a command fails.

use std::path::Path;

use vramring::{Error, Refusal};

/// The exit codes, as documented in `--help` and `docs/CLI.md`.
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// Runtime failure.
    pub const FAILURE: u8 = 1;
    /// Usage error (clap's own code).
    #[allow(dead_code)]
    pub const USAGE: u8 = 2;
    /// No socket, a stale socket, or the publisher went away.
    pub const NOT_FOUND: u8 = 3;
    /// Denied by the socket's file mode or the publisher's allow-list.
    pub const PERMISSION: u8 = 4;
    /// The publisher did not answer, or sent nothing, in time.
    pub const TIMEOUT: u8 = 5;
    /// `record` lost packets.
    pub const INCOMPLETE: u8 = 6;
}

/// A failed command: its exit code and an actionable sentence.
#[derive(Debug)]
pub struct CliError {
    /// One of [`exit`].
    pub code: u8,
    /// What went wrong and, where it helps, what to do.
    pub msg: String,
}

/// A command's result: its exit code.
pub type CliResult = Result<u8, CliError>;

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl CliError {
    /// A runtime failure.
    pub fn failure(msg: impl Into<String>) -> Self {
        CliError {
            code: exit::FAILURE,
            msg: msg.into(),
        }
    }
}

/// Short classification of a connection outcome, as `ls` and the JSON
/// output name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// Nothing at the path.
    NotFound,
    /// A socket nobody listens on.
    Stale,
    /// The publisher went away.
    Gone,
    /// File mode or allow-list.
    Denied,
    /// No answer in time.
    Timeout,
    /// Anything else.
    Error,
}

impl Problem {
    /// The word `ls` prints in its STATE column and JSON `status` field.
    pub fn name(self) -> &'static str {
        match self {
            Problem::NotFound => "missing",
            Problem::Stale => "stale",
            Problem::Gone => "gone",
            Problem::Denied => "denied",
            Problem::Timeout => "timeout",
            Problem::Error => "error",
        }
    }

    /// The exit code a command ends with for this problem.
    pub fn code(self) -> u8 {
        match self {
            Problem::NotFound | Problem::Stale | Problem::Gone => exit::NOT_FOUND,
            Problem::Denied => exit::PERMISSION,
            Problem::Timeout => exit::TIMEOUT,
            Problem::Error => exit::FAILURE,
        }
    }
}

/// Classifies a library error.
pub fn classify(e: &Error) -> Problem {
    match e {
        Error::Io { source, .. } => match source.kind() {
            std::io::ErrorKind::NotFound => Problem::NotFound,
            std::io::ErrorKind::ConnectionRefused => Problem::Stale,
            std::io::ErrorKind::PermissionDenied => Problem::Denied,
            _ => Problem::Error,
        },
        e if e.refusal() == Some(Refusal::Permission) => Problem::Denied,
        Error::PermissionDenied { .. } => Problem::Denied,
        Error::ProducerGone { .. } => Problem::Gone,
        Error::Timeout(..) => Problem::Timeout,
        _ => Problem::Error,
    }
}

/// The sentence for an error met while talking to the ring at `path`.
pub fn describe(path: &Path, e: &Error) -> String {
    let p = path.display();
    match classify(e) {
        Problem::NotFound => format!("no socket at {p}; check the path (ls lists the sockets of a directory)"),
        Problem::Stale => format!(
            "no publisher is listening at {p}: a stale socket left by a publisher that exited; \
             start the publisher again (it replaces the file)"
        ),
        Problem::Gone => format!("the publisher at {p} went away ({e})"),
        Problem::Denied => match e {
            Error::Refused { reason, .. } => format!(
                "the publisher at {p} refused this user ({reason}); ask for its allow-list \
                 (RingConfig::access) to include this uid or gid"
            ),
            _ => format!(
                "permission denied connecting to {p} (uid {}): connecting needs write permission on \
                 the socket file; run in the socket's group or widen the publisher's socket mode",
                rustix::process::getuid().as_raw()
            ),
        },
        Problem::Timeout => format!("{p}: {e}; the publisher accepted but did not answer in time"),
        Problem::Error => match e {
            Error::Refused { reason, .. } if e.refusal() == Some(Refusal::Kind) => {
                if reason.contains("serves a packet ring") {
                    format!("{p} serves a packet ring (encoded video), not frames: `vramring record` reads it")
                } else {
                    format!("{p} serves a frame ring (decoded frames), not packets: `vramring snapshot` reads it")
                }
            }
            _ => format!("{p}: {e}"),
        },
    }
}

/// The [`CliError`] for an error met while talking to the ring at `path`.
pub fn ring_error(path: &Path, e: &Error) -> CliError {
    CliError {
        code: classify(e).code(),
        msg: describe(path, e),
    }
}
