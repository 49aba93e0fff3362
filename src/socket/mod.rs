//! The Unix `SOCK_SEQPACKET` handshake: messages ([`msg`]) and the socket
//! plumbing with `SCM_RIGHTS` and `SO_PEERCRED` ([`transport`]).
//!
//! Sequence: the subscriber connects and sends `Hello`; the publisher checks
//! the peer's credentials and the Hello, then answers `Welcome` with its
//! descriptors (control memfd and subscriber-table memfd, read-only; the
//! subscriber's own client-region memfd; the pool for a pull subscriber of a
//! frame ring) or `Reject`. The connection then stays open as the
//! subscriber's lease: EOF on either side means the other is gone. The
//! service and the lease that run this are in [`crate::ring`].

pub mod msg;
pub mod peer_fd;
pub mod transport;

pub use msg::{Attach, Hello, Msg, Notice, Welcome, PROTOCOL_VERSION};
pub use peer_fd::PeerFd;
pub use transport::AccessPolicy;
