//! Socket messages: fixed-size little-endian records, one per
//! `SOCK_SEQPACKET` datagram. Byte layouts are in `proto/PROTOCOL.md` and
//! `proto/vramring.h`.
//!
//! Every message starts with a 16-byte [`MsgHeader`]. A receiver checks the
//! magic, the body length against the datagram, and the version before it
//! reads the body; everything from a peer is untrusted.

use crate::error::{Error, Result};

/// Version of the socket protocol. A change to any message bumps it.
pub const PROTOCOL_VERSION: u32 = 4;
/// Magic of every message: the bytes `VRSK`.
pub const MSG_MAGIC: u32 = u32::from_le_bytes(*b"VRSK");
/// Bytes of the message header.
pub const HEADER_BYTES: usize = 16;
/// Largest datagram either side sends or accepts.
pub const MAX_MSG_BYTES: usize = 256;

/// `kind`: subscriber → publisher, first message.
pub const KIND_HELLO: u32 = 1;
/// `kind`: publisher → subscriber, with 4 descriptors (frame ring, pull),
/// or 3 (frame ring, push; packet ring).
pub const KIND_WELCOME: u32 = 2;
/// `kind`: publisher → subscriber, then the publisher closes.
pub const KIND_REJECT: u32 = 3;
/// `kind`: publisher → subscriber, then the publisher closes.
pub const KIND_EVICTED: u32 = 4;
/// `kind`: either side, orderly goodbye.
pub const KIND_BYE: u32 = 5;
/// `kind`: subscriber → publisher after a Welcome granting push delivery,
/// with 1 descriptor (the subscriber's buffers).
pub const KIND_ATTACH: u32 = 6;

/// Hello / Welcome flag: lossless.
pub const HELLO_LOSSLESS: u32 = 1;
/// Hello / Welcome flag: sequential reader.
pub const HELLO_SEQUENTIAL: u32 = 2;
/// Hello / Welcome flag: write access to the pool wanted / granted.
pub const HELLO_WRITE: u32 = 4;
/// Hello / Welcome flag: push delivery wanted / granted.
pub const HELLO_PUSH: u32 = 8;
/// Hello / Welcome flag: the subscriber wants a packet ring (encoded
/// packets), not a frame ring. A publisher of the other kind refuses it
/// with [`REJECT_KIND`].
pub const HELLO_PACKETS: u32 = 16;
/// Hello flag: push delivery is acceptable where pull is not granted (the
/// default subscriber's automatic choice). Never in a Welcome's `granted`:
/// the publisher grants [`HELLO_PUSH`] instead, or pull.
pub const HELLO_PUSH_OK: u32 = 32;

/// Reject / evict code: protocol version mismatch.
pub const REJECT_VERSION: u32 = 1;
/// Reject code: peer credentials not on the allow-list.
pub const REJECT_PERMISSION: u32 = 2;
/// Reject code: subscriber table full.
pub const REJECT_FULL: u32 = 3;
/// Reject code: the subscriber cannot import this ring's backend.
pub const REJECT_BACKEND: u32 = 4;
/// Reject code: lossless asked of a publisher whose policy is overwrite.
pub const REJECT_POLICY: u32 = 5;
/// Reject code: malformed Hello.
pub const REJECT_BAD_HELLO: u32 = 6;
/// Reject code: the publisher is shutting down.
pub const REJECT_SHUTDOWN: u32 = 7;
/// Reject code: write access asked for and not granted.
pub const REJECT_WRITE_DENIED: u32 = 8;
/// Reject code: the socket serves the other kind of ring (frames vs
/// packets).
pub const REJECT_KIND: u32 = 9;
/// Reject code: pull delivery (the pool's descriptor) is not granted to
/// this peer; ask for push delivery.
pub const REJECT_PULL_DENIED: u32 = 10;
/// Reject code: lossless asked by a uid whose lossless reader was evicted
/// for the lease not long ago; it may connect without lossless, or ask
/// again once the back-off in the reason has passed.
pub const REJECT_LOSSLESS_BACKOFF: u32 = 11;
/// Evict code: the subscriber's push buffers could not be attached.
pub const EVICT_ATTACH: u32 = crate::layout::EVICT_PUSH;
/// Evict code: the subscriber broke the protocol (an unexpected message,
/// a second Attach, buffers that do not fit the ring).
pub const EVICT_PROTOCOL: u32 = crate::layout::EVICT_PROTOCOL;
/// Evict code: a lossless subscriber held a frame past its lease.
pub const EVICT_LEASE: u32 = crate::layout::EVICT_LEASE;

/// Bytes of a subscriber name.
pub const NAME_BYTES: usize = 32;
/// Bytes of a reason text.
pub const REASON_BYTES: usize = 120;

/// The header of every message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgHeader {
    /// [`MSG_MAGIC`].
    pub magic: u32,
    /// The sender's [`PROTOCOL_VERSION`].
    pub version: u32,
    /// `KIND_*`.
    pub kind: u32,
    /// Bytes after the header.
    pub body_len: u32,
}

/// Subscriber → publisher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// `HELLO_*` flags.
    pub flags: u32,
    /// Bit `1 << BACKEND_*` for each backend the subscriber can import.
    pub backends: u32,
    /// Name for logs and inspection (UTF-8, at most 32 bytes, no control
    /// characters: a Hello with one does not decode).
    pub name: String,
    /// UUID of the GPU the subscriber uses, zero when none or any.
    pub device_uuid: [u8; 16],
}

/// Publisher → subscriber, sent with the control memfd, the subscriber-table
/// memfd (both read-only and sealed), the subscriber's own client-region
/// memfd and, for a pull subscriber of a frame ring, the pool descriptor,
/// in that order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Welcome {
    /// The subscriber's table index.
    pub index: u32,
    /// The entry's generation.
    pub generation: u32,
    /// Publisher instance.
    pub epoch: u64,
    /// `BACKEND_*`.
    pub backend: u32,
    /// `HELLO_*` flags granted.
    pub granted: u32,
    /// Bytes of the control region.
    pub control_bytes: u64,
    /// Bytes of the subscriber table.
    pub subs_bytes: u64,
    /// Bytes of the pool.
    pub pool_bytes: u64,
    /// GPU UUID of the pool (zero for host).
    pub device_uuid: [u8; 16],
    /// Bytes of the subscriber's own client region.
    pub client_bytes: u64,
}

/// Subscriber → publisher: the subscriber's own buffers for push delivery,
/// sent with one descriptor (a memfd for the host backend, a VMM allocation
/// exported as a POSIX file descriptor for CUDA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attach {
    /// Buffers in the allocation ([`crate::layout::PUSH_BUFFERS`]).
    pub count: u32,
    /// Bytes between buffers.
    pub stride: u64,
    /// Bytes of the allocation.
    pub bytes: u64,
}

/// Reject or Evicted: a code and a reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// `REJECT_*` or `EVICT_*`.
    pub code: u32,
    /// Human-readable reason (at most 120 bytes).
    pub reason: String,
}

/// A decoded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// First message of a subscriber.
    Hello(Hello),
    /// The publisher's answer.
    Welcome(Welcome),
    /// Refusal.
    Reject(Notice),
    /// Eviction.
    Evicted(Notice),
    /// Goodbye.
    Bye,
    /// Push buffers.
    Attach(Attach),
}

const HELLO_BODY: usize = 96;
const WELCOME_BODY: usize = 96;
const NOTICE_BODY: usize = 128;
const ATTACH_BODY: usize = 24;

struct W(Vec<u8>);
impl W {
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8], width: usize) -> &mut Self {
        let n = b.len().min(width);
        self.0.extend_from_slice(&b[..n]);
        self.0.resize(self.0.len() + width - n, 0);
        self
    }
}

struct R<'a>(&'a [u8]);
impl R<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

/// Truncates `s` to `max` bytes at a char boundary.
fn clip(s: &str, max: usize) -> &str {
    let mut n = s.len().min(max);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    &s[..n]
}

fn text(b: &[u8]) -> Result<String> {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    std::str::from_utf8(&b[..end])
        .map(str::to_owned)
        .map_err(|_| Error::BadMessage("text field is not UTF-8".into()))
}

/// A subscriber name: [`text`] without control characters, which every
/// table reader (`vramring ls`, `inspect`, `top`) would otherwise print to
/// its terminal.
fn subscriber_name(b: &[u8]) -> Result<String> {
    let name = text(b)?;
    if let Some((at, c)) = name.char_indices().find(|(_, c)| c.is_control()) {
        return Err(Error::BadMessage(format!(
            "subscriber name has control character U+{:04X} at byte {at}; use printable characters",
            u32::from(c)
        )));
    }
    Ok(name)
}

impl Msg {
    /// The message's `KIND_*`.
    pub fn kind(&self) -> u32 {
        match self {
            Msg::Hello(_) => KIND_HELLO,
            Msg::Welcome(_) => KIND_WELCOME,
            Msg::Reject(_) => KIND_REJECT,
            Msg::Evicted(_) => KIND_EVICTED,
            Msg::Bye => KIND_BYE,
            Msg::Attach(_) => KIND_ATTACH,
        }
    }

    /// Encodes the message with this build's protocol version.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = W(Vec::with_capacity(128));
        match self {
            Msg::Hello(h) => {
                body.u32(h.flags)
                    .u32(h.backends)
                    .bytes(clip(&h.name, NAME_BYTES).as_bytes(), NAME_BYTES);
                body.bytes(&h.device_uuid, 16).bytes(&[], HELLO_BODY - 56);
            }
            Msg::Welcome(w) => {
                body.u32(w.index)
                    .u32(w.generation)
                    .u64(w.epoch)
                    .u32(w.backend)
                    .u32(w.granted);
                body.u64(w.control_bytes)
                    .u64(w.subs_bytes)
                    .u64(w.pool_bytes)
                    .bytes(&w.device_uuid, 16)
                    .u64(w.client_bytes);
                body.bytes(&[], WELCOME_BODY - 72);
            }
            Msg::Reject(n) | Msg::Evicted(n) => {
                body.u32(n.code)
                    .u32(0)
                    .bytes(clip(&n.reason, REASON_BYTES).as_bytes(), REASON_BYTES);
            }
            Msg::Bye => {}
            Msg::Attach(a) => {
                body.u32(a.count).u32(0).u64(a.stride).u64(a.bytes);
            }
        }
        let mut out = W(Vec::with_capacity(HEADER_BYTES + body.0.len()));
        out.u32(MSG_MAGIC)
            .u32(PROTOCOL_VERSION)
            .u32(self.kind())
            .u32(body.0.len() as u32);
        out.0.extend_from_slice(&body.0);
        out.0
    }

    /// Decodes the header of a datagram from an untrusted peer.
    ///
    /// # Errors
    /// [`Error::BadMessage`] when the datagram is short, the magic is wrong
    /// or the body length disagrees with the datagram.
    pub fn header(buf: &[u8]) -> Result<MsgHeader> {
        if buf.len() < HEADER_BYTES || buf.len() > MAX_MSG_BYTES {
            return Err(Error::BadMessage(format!("datagram of {} bytes", buf.len())));
        }
        let mut r = R(buf);
        let h = MsgHeader {
            magic: r.u32(),
            version: r.u32(),
            kind: r.u32(),
            body_len: r.u32(),
        };
        if h.magic != MSG_MAGIC {
            return Err(Error::BadMessage(format!("magic {:#010x}", h.magic)));
        }
        if h.body_len as usize != buf.len() - HEADER_BYTES {
            return Err(Error::BadMessage(format!(
                "header says {} body bytes, datagram has {}",
                h.body_len,
                buf.len() - HEADER_BYTES
            )));
        }
        Ok(h)
    }

    /// Decodes a whole datagram. Reject messages decode whatever the
    /// sender's version (their layout is fixed across versions); every other
    /// kind must carry [`PROTOCOL_VERSION`].
    ///
    /// # Errors
    /// [`Error::BadMessage`] for any malformed input, [`Error::VersionMismatch`]
    /// for another protocol version.
    pub fn decode(buf: &[u8]) -> Result<Msg> {
        let h = Msg::header(buf)?;
        let body = &buf[HEADER_BYTES..];
        let want = |n: usize| {
            if body.len() == n {
                Ok(())
            } else {
                Err(Error::BadMessage(format!(
                    "kind {} body of {} bytes, expected {n}",
                    h.kind,
                    body.len()
                )))
            }
        };
        if h.version != PROTOCOL_VERSION && h.kind != KIND_REJECT {
            return Err(Error::VersionMismatch {
                peer_role: "peer",
                peer: h.version,
                ours: PROTOCOL_VERSION,
            });
        }
        let mut r = R(body);
        Ok(match h.kind {
            KIND_HELLO => {
                want(HELLO_BODY)?;
                let flags = r.u32();
                let backends = r.u32();
                let name = subscriber_name(&r.take::<NAME_BYTES>())?;
                let device_uuid = r.take::<16>();
                Msg::Hello(Hello {
                    flags,
                    backends,
                    name,
                    device_uuid,
                })
            }
            KIND_WELCOME => {
                want(WELCOME_BODY)?;
                Msg::Welcome(Welcome {
                    index: r.u32(),
                    generation: r.u32(),
                    epoch: r.u64(),
                    backend: r.u32(),
                    granted: r.u32(),
                    control_bytes: r.u64(),
                    subs_bytes: r.u64(),
                    pool_bytes: r.u64(),
                    device_uuid: r.take::<16>(),
                    client_bytes: r.u64(),
                })
            }
            KIND_REJECT | KIND_EVICTED => {
                want(NOTICE_BODY)?;
                let code = r.u32();
                let _reserved = r.u32();
                let reason = String::from_utf8_lossy(&r.take::<REASON_BYTES>())
                    .trim_end_matches('\0')
                    .to_owned();
                let n = Notice { code, reason };
                if h.kind == KIND_REJECT {
                    Msg::Reject(n)
                } else {
                    Msg::Evicted(n)
                }
            }
            KIND_BYE => {
                want(0)?;
                Msg::Bye
            }
            KIND_ATTACH => {
                want(ATTACH_BODY)?;
                let count = r.u32();
                let _reserved = r.u32();
                Msg::Attach(Attach {
                    count,
                    stride: r.u64(),
                    bytes: r.u64(),
                })
            }
            k => return Err(Error::BadMessage(format!("unknown message kind {k}"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_message_round_trips() {
        let msgs = [
            Msg::Hello(Hello {
                flags: 3,
                backends: 6,
                name: "detector-1".into(),
                device_uuid: [7; 16],
            }),
            Msg::Welcome(Welcome {
                index: 5,
                generation: 9,
                epoch: 0xdead_beef,
                backend: 2,
                granted: 1,
                control_bytes: 4096,
                subs_bytes: 8448,
                pool_bytes: 1 << 21,
                device_uuid: [1; 16],
                client_bytes: 128,
            }),
            Msg::Reject(Notice {
                code: REJECT_FULL,
                reason: "full".into(),
            }),
            Msg::Evicted(Notice {
                code: EVICT_LEASE,
                reason: "slow".into(),
            }),
            Msg::Bye,
            Msg::Attach(Attach {
                count: 3,
                stride: 4 << 20,
                bytes: 12 << 20,
            }),
        ];
        for m in msgs {
            assert_eq!(Msg::decode(&m.encode()).unwrap(), m);
        }
    }

    #[test]
    fn a_reject_from_another_version_still_decodes() {
        let mut b = Msg::Reject(Notice {
            code: REJECT_VERSION,
            reason: "old".into(),
        })
        .encode();
        b[4..8].copy_from_slice(&99u32.to_le_bytes());
        assert!(matches!(Msg::decode(&b), Ok(Msg::Reject(_))));
        let mut h = Msg::Bye.encode();
        h[4..8].copy_from_slice(&99u32.to_le_bytes());
        assert!(matches!(Msg::decode(&h), Err(Error::VersionMismatch { peer: 99, .. })));
    }

    #[test]
    fn long_names_are_clipped_at_a_char_boundary() {
        let name = "é".repeat(40);
        let m = Msg::Hello(Hello {
            flags: 0,
            backends: 0,
            name,
            device_uuid: [0; 16],
        });
        let Msg::Hello(h) = Msg::decode(&m.encode()).unwrap() else {
            panic!()
        };
        assert_eq!(h.name.len(), 32);
    }

    proptest! {
        #[test]
        fn random_datagrams_give_typed_errors_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            match Msg::decode(&bytes) {
                Ok(_) | Err(Error::BadMessage(_)) | Err(Error::VersionMismatch { .. }) => {}
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }

        #[test]
        fn mutated_valid_messages_give_typed_errors_never_panics(pos in 0usize..112, val in any::<u8>(), kind in 0usize..3) {
            let m = match kind {
                0 => Msg::Hello(Hello { flags: 1, backends: 2, name: "x".into(), device_uuid: [0; 16] }),
                1 => Msg::Welcome(Welcome { index: 1, generation: 1, epoch: 1, backend: 1, granted: 0, control_bytes: 1, subs_bytes: 1, pool_bytes: 1, device_uuid: [0; 16], client_bytes: 128 }),
                _ => Msg::Reject(Notice { code: 1, reason: "r".into() }),
            };
            let mut b = m.encode();
            let p = pos % b.len();
            b[p] = val;
            let _ = Msg::decode(&b);
        }
    }
}
