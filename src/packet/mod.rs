//! A packet ring for encoded video: variable-length packets (H.264/H.265
//! access units) in a CPU shared-memory byte ring, with per-packet records,
//! keyframe join, overrun resync and codec parameters.
//!
//! * [`PacketPublisher`] / [`PacketSubscriber`]: the ring served over the
//!   same socket handshake as the frame ring (a sealed memfd and a
//!   subscriber table by `SCM_RIGHTS`, the connection as the lease,
//!   [`crate::Error::ProducerGone`] on close or crash, futex wakeups). One process
//!   can publish a camera's decoded frames on one socket and its encoded
//!   packets on another. A lossless subscriber (a recorder) never loses a
//!   packet after its first one: the writer waits for it, bounded, and
//!   evicts it past its lease (measured on the writer's own seq).
//! * [`PacketWriter`] / [`PacketReader`]: the same ring in-process, for
//!   callers that pass the memfd themselves; the reader waits by a bounded
//!   poll.
//!
//! See `examples/packet_producer.rs` and `examples/recorder.rs`.
//!
//! # Layout (`packet/layout.rs`)
//!
//! `PacketHeader` (info, `write_seq`, tail line, codec parameters), then
//! `record_count` `PacketRecord`s, then the data area of `data_bytes` bytes
//! (both powers of two). Byte positions are free-running `u64`; the byte at
//! position `p` lives at `data_offset + (p & (data_bytes - 1))`. The record of
//! seq `s` is `s & (record_count - 1)`.
//!
//! **Wraparound: a packet never wraps.** When a packet does not fit between
//! its start position and the end of the data area, the writer skips to the
//! next multiple of `data_bytes` (the skipped bytes are padding nobody
//! reads). So every packet is contiguous, and a borrow is one pointer range.
//! That is why `2 * max_packet <= data_bytes` is required.
//!
//! # Who writes what
//!
//! | field | writer | readers |
//! | --- | --- | --- |
//! | `info.*` | creator, once, before `layout_version` | validated once, copied |
//! | `seq.write_seq` | writer | readers (Acquire) |
//! | `tail.tail` | writer, before overwriting bytes | readers, after a copy |
//! | `tail.keyframe_seq` | writer | joining reader (Acquire) |
//! | `PacketRecord.seq` | writer | readers (Acquire, then re-check) |
//! | `PacketRecord.{offset, len, flags, pts, dts, codec, commit_ns}` | writer, between invalidate and commit | readers, between the two seq loads |
//! | data bytes | writer, after the tail store and invalidate | readers, between the two seq loads |
//! | `params.*` | writer, under `params.seq` | readers, between two loads of `params.seq` |
//!
//! # Orderings (each pair is labelled `SYNC: <name>` at both ends)
//!
//! * **packet-tail** and **packet-record** (the invalidate): before writing a
//!   packet at positions `[p, e)`, the writer raises `tail` to
//!   `e - data_bytes` (every byte below that is about to be overwritten),
//!   stores `seq | PACKET_WRITING` in the packet's record, and issues one
//!   `SeqCst` fence; then it writes the bytes and the record's meta and
//!   commits with `record.seq.store(seq, Release)`. A reader Acquire-loads the
//!   record's seq, reads the meta, copies the bytes, then issues an Acquire
//!   fence and reloads both the record seq and `tail`: the packet is intact
//!   iff the seq is unchanged and `offset >= tail`. If any byte it copied
//!   came from a later write, the writer's fence before that write
//!   synchronises with the reader's fence, so the reload sees the raised tail
//!   (or the invalidated record) and the copy is discarded ("validate after
//!   the copy"). A later packet at `[p', e')` overlaps ours at `[o, o + len)`
//!   in the ring only if `e' > o + data_bytes`, i.e. its tail `e' -
//!   data_bytes > o`.
//! * **packet-write-seq**: `write_seq.store(s, Release)` after the record
//!   commit; a reader that Acquire-loads `write_seq >= s` finds the record of
//!   `s` committed (or overwritten since).
//! * **packet-keyframe**: `keyframe_seq.store(s, Release)` after the record
//!   commit of keyframe `s`; a joining reader Acquire-loads it.
//! * **params-seq**: the same seqlock for the codec parameters: invalidate
//!   (`v | PACKET_WRITING`, SeqCst fence), words, commit `v` (Release);
//!   reader Acquire load, copy, Acquire fence, reload.
//!
//! # Reading
//!
//! A reader opened late starts at `keyframe_seq` (or waits for the first
//! keyframe). A lossless reader also publishes the seq it is done with in
//! its subscriber entry (`released_seq`, SYNC: release-cursor, Release
//! after the copy or the borrow's release); before a write the publisher
//! Acquire-loads it and does not recycle a record it still needs nor raise
//! `tail` past the first byte of the packet it reads next. A reader that finds its next packet overwritten returns
//! [`crate::Error::PacketOverrun`]; its next read resumes at the oldest intact
//! keyframe after the lost packet (or waits for the next one to come), and
//! [`Packet::skipped`] counts the packets never delivered in between.

pub mod annexb;
pub(crate) mod layout;
mod protocol;
mod publisher;
mod reader;
mod subscriber;
mod writer;

#[cfg(test)]
mod tests;

pub use crate::ring::WaitStrategy;
pub use layout::{PacketRingInfo, PACKET_DISCONTINUITY, PACKET_KEY, PARAMS_BYTES};
pub use publisher::{PacketPublisher, PacketPublisherConfig};
pub use reader::{Packet, PacketBorrow, PacketReader, PacketReaderStats};
pub use subscriber::{PacketSubscriber, PacketSubscriberOptions};
pub use writer::{PacketMeta, PacketRingConfig, PacketWriter, Placement};
