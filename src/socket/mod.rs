//! The Unix `SOCK_SEQPACKET` handshake: messages ([`msg`]) and the socket
//! plumbing with `SCM_RIGHTS` and `SO_PEERCRED` ([`transport`]).
//!
//! Sequence: the subscriber connects and sends `Hello`; the publisher checks
//! the peer's credentials and the Hello, then answers `Welcome` with three
//! descriptors (control memfd, subscriber-table memfd, pool) or `Reject`.
//! The connection then stays open as the subscriber's lease: EOF on either
//! side means the other is gone.

pub(crate) mod client;
pub mod msg;
pub(crate) mod service;
pub mod transport;

pub use msg::{Attach, Hello, Msg, Notice, Welcome, PROTOCOL_VERSION};
pub use transport::AccessPolicy;
