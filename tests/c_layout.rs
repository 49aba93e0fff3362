//! `proto/vramring.h` describes the same bytes as the Rust crate.
//!
//! The test generates a C program that includes the header and prints one
//! `label value` line per check (struct sizes and alignments, every field's
//! offset and size, constants, message records, and a decode of messages the
//! Rust encoder produced), compiles it with the system C compiler (`$CC`,
//! else `cc`), runs it, and compares every line with the value the Rust side
//! computes from `vramring::seam::layout`, `vramring::format`,
//! `vramring::seam::packet_layout` and `vramring::seam::socket::msg`. The C code in
//! `proto/PROTOCOL.md` is compiled too: its test-pattern functions are
//! checked against `vramring_testkit::pattern`, its push-delivery claim,
//! complete and take (section 16.5) against `vramring::seam::protocol::push`, and
//! its packet reader (section 17.12) is run on a packet ring the Rust writer
//! filled and checked against `vramring::packet::PacketReader`; its
//! Appendix B frame reader runs as a lossless subscriber of a real Rust
//! publisher (every frame intact, "producer gone" after the orderly close,
//! not "evicted"). A real host publisher's Welcomes are
//! checked too: descriptor counts, seals, read-only access modes and
//! `client_bytes` against the header, and a v1 Hello refused with
//! `VR_REJECT_VERSION`. Every version number PROTOCOL.md writes next to its
//! constant is the one the crate speaks. A missing C compiler is a failure,
//! never a skip.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::mem::{align_of, offset_of, size_of};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;

use vramring::packet::{Packet, PacketMeta, PacketReader, PacketRingConfig, PacketWriter};
use vramring::seam::format;
use vramring::seam::layout::{
    self, ClientLine, DoorbellLine, ProducerLine, RingHeader, SeqLine, SharedRingInfo, SlotDesc, SubEntry, SubsHeader,
};
use vramring::seam::packet_layout::{
    self as packet_layout, PacketHeader, PacketInfo, PacketRecord, PacketRingInfo, PacketSeqLine, PacketTailLine,
    ParamsArea,
};
use vramring::seam::protocol::push;
use vramring::seam::socket::msg::{self, Attach, Hello, Msg, Notice, Welcome};
use vramring::seam::socket::transport;
use vramring::{Error, Format};

/// One line the C program prints and the value Rust expects for it.
struct Check {
    label: String,
    c_expr: String,
    expected: u64,
}

#[derive(Default)]
struct Checks {
    list: Vec<Check>,
    /// Statements emitted into `main` before the checks (decode buffers).
    prelude: String,
    /// Top-level C code emitted before `main` (code taken from PROTOCOL.md).
    top: String,
}

impl Checks {
    fn push(&mut self, label: impl Into<String>, c_expr: impl Into<String>, expected: impl TryInto<u64>) {
        let label = label.into();
        let expected = expected
            .try_into()
            .unwrap_or_else(|_| panic!("{label}: expected value does not fit u64"));
        self.list.push(Check {
            label,
            c_expr: c_expr.into(),
            expected,
        });
    }

    /// A constant of the header: `label` is also the C expression.
    fn constant(&mut self, name: &str, expected: impl TryInto<u64>) {
        self.push(name, name, expected);
    }
}

/// Size of the field `f` selects, without a value of `T`.
fn field_size<T, F>(_f: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

/// Pushes the size and alignment of a shared struct, the offset and size of
/// every field (the list is proved complete by an exhaustive destructuring
/// pattern, so a field added in Rust fails to compile here until it is added
/// to the header and to this list), and a coverage check that the C struct
/// holds nothing but these fields and its explicit tail `_pad`.
macro_rules! shared_struct {
    ($checks:ident, $c:literal, $rust:ident, pad: $pad:literal, [$($f:ident),+ $(,)?]) => {{
        #[allow(dead_code, clippy::all)]
        fn every_field_is_listed(x: &$rust) {
            let $rust { $($f: _),+ } = x;
        }
        $checks.push($c, concat!("sizeof(", $c, ")"), size_of::<$rust>());
        $checks.push(concat!("alignof ", $c), concat!("_Alignof(", $c, ")"), align_of::<$rust>());
        $(
            $checks.push(
                concat!($c, ".", stringify!($f)),
                concat!("offsetof(", $c, ", ", stringify!($f), ")"),
                offset_of!($rust, $f),
            );
            $checks.push(
                concat!("sizeof ", $c, ".", stringify!($f)),
                concat!("sizeof(((", $c, " *)0)->", stringify!($f), ")"),
                field_size::<$rust, _>(|s| &s.$f),
            );
        )+
        let mut sum = String::from("0");
        $( sum.push_str(concat!(" + sizeof(((", $c, " *)0)->", stringify!($f), ")")); )+
        if $pad {
            sum.push_str(concat!(" + sizeof(((", $c, " *)0)->_pad)"));
        }
        $checks.push(concat!("coverage ", $c), sum, size_of::<$rust>());
    }};
}

fn shared_layout(c: &mut Checks) {
    shared_struct!(c, "vr_ring_info", SharedRingInfo, pad: false, [
        magic, layout_version, header_bytes, control_bytes, epoch, slot_count, slot_desc_bytes,
        slots_offset, backend, format, width, height, plane_count, policy, plane_offset,
        plane_pitch, plane_rows, plane_row_bytes, frame_bytes, slot_stride, pool_bytes,
        device_uuid, max_subscribers, ring_flags, created_realtime_ns,
    ]);
    shared_struct!(c, "vr_producer_line", ProducerLine, pad: true, [
        state, reserved0, heartbeat_ns, published, evictions, connects, disconnects,
    ]);
    shared_struct!(c, "vr_seq_line", SeqLine, pad: true, [global_seq, pending_seq]);
    shared_struct!(c, "vr_doorbell_line", DoorbellLine, pad: true, [reserved]);
    shared_struct!(c, "vr_ring_header", RingHeader, pad: false, [info, producer, seq, doorbell]);
    shared_struct!(c, "vr_slot_desc", SlotDesc, pad: false, [
        seq, pts, commit_ns, flags, user_len, reserved, user, reserved2,
    ]);
    shared_struct!(c, "vr_subs_header", SubsHeader, pad: false, [
        magic, layout_version, max_subscribers, epoch, entry_bytes, entries_offset, reserved,
    ]);
    shared_struct!(c, "vr_sub_entry", SubEntry, pad: false, [
        state, flags, generation, push_count, evict_code, reserved0, released_seq, delivered,
        dropped, overruns, heartbeat_ns, name, push_seq, reserved1,
    ]);
    shared_struct!(c, "vr_client_line", ClientLine, pad: false, [
        doorbell, parked, push_held, reserved0, released_seq, reading_seq, delivered, dropped,
        overruns, heartbeat_ns, reserved1,
    ]);
    c.push("VR_CLIENT_BYTES", "VR_CLIENT_BYTES", layout::CLIENT_BYTES);
    // The hot words, as a reader of another language addresses them.
    c.push(
        "vr_ring_header.seq.global_seq",
        "offsetof(vr_ring_header, seq.global_seq)",
        offset_of!(RingHeader, seq) + offset_of!(SeqLine, global_seq),
    );
    c.push(
        "vr_ring_header.doorbell.reserved",
        "offsetof(vr_ring_header, doorbell.reserved)",
        offset_of!(RingHeader, doorbell) + offset_of!(DoorbellLine, reserved),
    );
    c.push(
        "vr_ring_header.producer.state",
        "offsetof(vr_ring_header, producer.state)",
        offset_of!(RingHeader, producer) + offset_of!(ProducerLine, state),
    );
    c.push("VR_CONTROL_BYTES(8)", "VR_CONTROL_BYTES(8)", layout::control_bytes(8));
    c.push(
        "VR_CONTROL_BYTES(1024)",
        "VR_CONTROL_BYTES(1024)",
        layout::control_bytes(1024),
    );
    c.push("VR_SUBS_BYTES(64)", "VR_SUBS_BYTES(64)", layout::subs_bytes(64));
    c.push("VR_SUBS_BYTES(1)", "VR_SUBS_BYTES(1)", layout::subs_bytes(1));
}

fn packet_layout(c: &mut Checks) {
    shared_struct!(c, "vr_packet_info", PacketInfo, pad: false, [
        magic, layout_version, header_bytes, region_bytes, epoch, data_offset, data_bytes,
        records_offset, record_count, record_bytes, max_packet, codec, params_capacity, reserved0,
        reserved,
    ]);
    shared_struct!(c, "vr_packet_seq_line", PacketSeqLine, pad: true, [write_seq]);
    shared_struct!(c, "vr_packet_tail_line", PacketTailLine, pad: true, [tail, head, keyframe_seq]);
    shared_struct!(c, "vr_packet_params", ParamsArea, pad: false, [seq, len, reserved0, reserved, data]);
    shared_struct!(c, "vr_packet_header", PacketHeader, pad: false, [info, seq, tail, producer, doorbell, params]);
    shared_struct!(c, "vr_packet_record", PacketRecord, pad: false, [
        seq, offset, len, flags, pts, dts, codec, reserved0, commit_ns, reserved,
    ]);
    // The hot words, as a reader of another language addresses them.
    for (label, c_member, rust) in [
        (
            "write_seq",
            "seq.write_seq",
            offset_of!(PacketHeader, seq) + offset_of!(PacketSeqLine, write_seq),
        ),
        (
            "tail",
            "tail.tail",
            offset_of!(PacketHeader, tail) + offset_of!(PacketTailLine, tail),
        ),
        (
            "keyframe_seq",
            "tail.keyframe_seq",
            offset_of!(PacketHeader, tail) + offset_of!(PacketTailLine, keyframe_seq),
        ),
        (
            "producer.state",
            "producer.state",
            offset_of!(PacketHeader, producer) + offset_of!(ProducerLine, state),
        ),
        (
            "doorbell.reserved",
            "doorbell.reserved",
            offset_of!(PacketHeader, doorbell) + offset_of!(DoorbellLine, reserved),
        ),
        (
            "params.seq",
            "params.seq",
            offset_of!(PacketHeader, params) + offset_of!(ParamsArea, seq),
        ),
        (
            "params.data",
            "params.data",
            offset_of!(PacketHeader, params) + offset_of!(ParamsArea, data),
        ),
    ] {
        c.push(
            format!("vr_packet_header hot {label}"),
            format!("offsetof(vr_packet_header, {c_member})"),
            rust,
        );
    }
    // Region geometry, against the layout rule the Rust writer and
    // validator use.
    for (records, data) in [
        (2u32, 4096u64),
        (8, 4096),
        (64, 1 << 20),
        (1024, 8 << 20),
        (1 << 20, 1 << 32),
    ] {
        let info = PacketRingInfo::new(data, records, (data / 2) as u32, 0, 1).expect("a valid packet ring");
        c.push(
            format!("VR_PACKET_DATA_OFFSET({records})"),
            format!("VR_PACKET_DATA_OFFSET({records}u)"),
            info.data_offset,
        );
        c.push(
            format!("VR_PACKET_REGION_BYTES({records}, {data})"),
            format!("VR_PACKET_REGION_BYTES({records}u, UINT64_C({data}))"),
            info.region_bytes,
        );
        c.push(
            format!("records_offset({records})"),
            "sizeof(vr_packet_header)",
            info.records_offset,
        );
    }
}

fn constants(c: &mut Checks) {
    c.constant("VR_RING_MAGIC", layout::RING_MAGIC);
    c.constant("VR_SUBS_MAGIC", layout::SUBS_MAGIC);
    c.constant("VR_LAYOUT_VERSION", layout::LAYOUT_VERSION);
    // Layout v5 (issue 36: queued push, 16 push words per entry) and socket
    // protocol v4 (push for every read mode, `HELLO_PUSH_OK`) in both
    // languages: a stale header or a crate that moved on without the
    // header fails here.
    assert_eq!(layout::LAYOUT_VERSION, 5, "the Rust layout is version 5");
    assert_eq!(msg::PROTOCOL_VERSION, 4, "the Rust socket protocol is version 4");
    c.push("VR_LAYOUT_VERSION is 5", "VR_LAYOUT_VERSION == 5u", 1u32);
    c.push("VR_PROTOCOL_VERSION is 4", "VR_PROTOCOL_VERSION == 4u", 1u32);
    c.constant("VR_RING_GATE", layout::RING_GATE);
    c.constant("VR_RING_FLAGS_KNOWN", layout::RING_FLAGS_KNOWN);
    c.constant("VR_GATE_BYTES", layout::GATE_BYTES);
    c.constant("VR_MIN_SLOTS", layout::MIN_SLOTS);
    c.constant("VR_MAX_SLOTS", layout::MAX_SLOTS);
    c.constant("VR_DEFAULT_MAX_SUBSCRIBERS", layout::DEFAULT_MAX_SUBSCRIBERS);
    c.constant("VR_MAX_SUBSCRIBERS_LIMIT", layout::MAX_SUBSCRIBERS_LIMIT);
    c.constant("VR_USER_META_WORDS", layout::USER_META_WORDS);
    c.constant("VR_USER_META_BYTES", layout::USER_META_BYTES);
    c.constant("VR_NAME_BYTES", layout::NAME_BYTES);
    c.constant("VR_PUSH_BUFFERS", layout::PUSH_BUFFERS);
    c.constant("VR_PUSH_QUEUE_MIN", layout::PUSH_QUEUE_MIN);
    c.constant("VR_PUSH_MAX_BUFFERS", layout::PUSH_MAX_BUFFERS);
    c.constant("VR_SEQ_WRITING", layout::SEQ_WRITING);
    c.constant("VR_BACKEND_HOST", layout::BACKEND_HOST);
    c.constant("VR_BACKEND_CUDA", layout::BACKEND_CUDA);
    c.constant("VR_POLICY_OVERWRITE", layout::POLICY_OVERWRITE);
    c.constant("VR_POLICY_LOSSLESS", layout::POLICY_LOSSLESS);
    c.constant("VR_PRODUCER_INIT", layout::PRODUCER_INIT);
    c.constant("VR_PRODUCER_LIVE", layout::PRODUCER_LIVE);
    c.constant("VR_PRODUCER_CLOSED", layout::PRODUCER_CLOSED);
    c.constant("VR_SUB_FREE", layout::SUB_FREE);
    c.constant("VR_SUB_ACTIVE", layout::SUB_ACTIVE);
    c.constant("VR_SUB_EVICTED", layout::SUB_EVICTED);
    c.constant("VR_EVICT_LEASE", layout::EVICT_LEASE);
    c.constant("VR_EVICT_PUSH", layout::EVICT_PUSH);
    c.constant("VR_EVICT_PROTOCOL", layout::EVICT_PROTOCOL);
    c.constant("VR_SUBF_LOSSLESS", layout::SUBF_LOSSLESS);
    c.constant("VR_SUBF_SEQUENTIAL", layout::SUBF_SEQUENTIAL);
    c.constant("VR_SUBF_WRITE", layout::SUBF_WRITE);
    c.constant("VR_SUBF_PUSH", layout::SUBF_PUSH);
    c.constant("VR_FRAME_KEY", layout::FRAME_KEY);
    c.constant("VR_FRAME_DISCONTINUITY", layout::FRAME_DISCONTINUITY);

    c.constant("VR_PACKET_MAGIC", packet_layout::PACKET_MAGIC);
    c.constant("VR_PACKET_LAYOUT_VERSION", packet_layout::PACKET_LAYOUT_VERSION);
    c.constant("VR_PACKET_PARAMS_BYTES", packet_layout::PARAMS_BYTES);
    c.constant("VR_PACKET_PARAMS_WORDS", packet_layout::PARAMS_WORDS);
    c.constant("VR_PACKET_MIN_RECORDS", packet_layout::MIN_RECORDS);
    c.constant("VR_PACKET_MAX_RECORDS", packet_layout::MAX_RECORDS);
    c.constant("VR_PACKET_MIN_DATA_BYTES", packet_layout::MIN_DATA_BYTES);
    c.constant("VR_PACKET_MAX_DATA_BYTES", packet_layout::MAX_DATA_BYTES);
    c.constant("VR_PACKET_DATA_ALIGN", packet_layout::DATA_ALIGN);
    c.constant("VR_PACKET_KEY", packet_layout::PACKET_KEY);
    c.constant("VR_PACKET_DISCONTINUITY", packet_layout::PACKET_DISCONTINUITY);
    c.constant("VR_PACKET_WRITING", packet_layout::PACKET_WRITING);
    assert_eq!(packet_layout::PACKET_MAGIC.to_le_bytes(), *b"VRPACKET");

    c.constant("VR_PITCH_ALIGN", format::PITCH_ALIGN);
    c.constant("VR_PLANE_ALIGN", format::PLANE_ALIGN);
    c.constant("VR_SLOT_ALIGN", format::SLOT_ALIGN);
    c.constant("VR_MAX_PLANES", format::MAX_PLANES);
    c.constant("VR_MAX_DIMENSION", format::MAX_DIMENSION);
    c.constant("VR_MAX_RAW_BYTES", format::MAX_RAW_BYTES);
    c.constant("VR_FORMAT_RAW", Format::Raw.code());
    c.constant("VR_FORMAT_GRAY8", Format::Gray8.code());
    c.constant("VR_FORMAT_NV12", Format::Nv12.code());
    c.constant("VR_FORMAT_P010", Format::P010.code());
    c.constant("VR_FORMAT_RGB8", Format::Rgb8.code());
    c.constant("VR_FORMAT_RGBA8", Format::Rgba8.code());
    for code in 1..=6 {
        assert!(
            Format::from_code(code).is_some(),
            "format code {code} is documented in the header"
        );
    }
    assert_eq!(
        Format::from_code(7),
        None,
        "a format code was added: add it to proto/vramring.h and this test"
    );

    // The seals the publisher applies (src/shm.rs) and the subscriber requires.
    use rustix::fs::SealFlags as S;
    c.constant("VR_F_SEAL_SEAL", S::SEAL.bits());
    c.constant("VR_F_SEAL_SHRINK", S::SHRINK.bits());
    c.constant("VR_F_SEAL_GROW", S::GROW.bits());
    c.constant("VR_F_SEAL_FUTURE_WRITE", S::FUTURE_WRITE.bits());
    let read_only = (S::SHRINK | S::GROW | S::FUTURE_WRITE | S::SEAL).bits();
    let fixed_size = (S::SHRINK | S::GROW | S::SEAL).bits();
    c.constant("VR_READ_ONLY_SEALS", read_only);
    c.constant("VR_FIXED_SIZE_SEALS", fixed_size);
    c.constant("VR_CONTROL_SEALS", read_only);
    c.constant("VR_SUBS_SEALS", read_only);
    c.constant("VR_CLIENT_SEALS", fixed_size);
    c.constant("VR_HOST_POOL_SEALS", S::SHRINK.bits());
    // What the publisher requires of a host subscriber's push buffers
    // (`HostPool::attach_target`).
    c.constant("VR_PUSH_HOST_SEALS", S::SHRINK.bits());
    // What `PacketWriter` applies to the packet region and the subscriber
    // requires (`SEALS_READ_ONLY`), checked on a real region below too.
    c.constant(
        "VR_PACKET_RING_SEALS",
        (S::SHRINK | S::GROW | S::FUTURE_WRITE | S::SEAL).bits(),
    );

    c.constant("VR_PROTOCOL_VERSION", msg::PROTOCOL_VERSION);
    c.constant("VR_MSG_MAGIC", msg::MSG_MAGIC);
    c.constant("VR_HEADER_BYTES", msg::HEADER_BYTES);
    c.constant("VR_MAX_MSG_BYTES", msg::MAX_MSG_BYTES);
    c.constant("VR_MAX_FDS", transport::MAX_FDS);
    c.constant("VR_MSG_NAME_BYTES", msg::NAME_BYTES);
    c.constant("VR_REASON_BYTES", msg::REASON_BYTES);
    c.constant("VR_KIND_HELLO", msg::KIND_HELLO);
    c.constant("VR_KIND_WELCOME", msg::KIND_WELCOME);
    c.constant("VR_KIND_REJECT", msg::KIND_REJECT);
    c.constant("VR_KIND_EVICTED", msg::KIND_EVICTED);
    c.constant("VR_KIND_BYE", msg::KIND_BYE);
    c.constant("VR_KIND_ATTACH", msg::KIND_ATTACH);
    c.constant("VR_HELLO_LOSSLESS", msg::HELLO_LOSSLESS);
    c.constant("VR_HELLO_SEQUENTIAL", msg::HELLO_SEQUENTIAL);
    c.constant("VR_HELLO_WRITE", msg::HELLO_WRITE);
    c.constant("VR_HELLO_PUSH", msg::HELLO_PUSH);
    c.constant("VR_HELLO_PACKETS", msg::HELLO_PACKETS);
    c.constant("VR_HELLO_PUSH_OK", msg::HELLO_PUSH_OK);
    c.push(
        "VR_BACKEND_BIT(VR_BACKEND_HOST)",
        "VR_BACKEND_BIT(VR_BACKEND_HOST)",
        1u32 << vramring::BackendKind::Host.code(),
    );
    c.push(
        "VR_BACKEND_BIT(VR_BACKEND_CUDA)",
        "VR_BACKEND_BIT(VR_BACKEND_CUDA)",
        1u32 << vramring::BackendKind::Cuda.code(),
    );
    c.constant("VR_REJECT_VERSION", msg::REJECT_VERSION);
    c.constant("VR_REJECT_PERMISSION", msg::REJECT_PERMISSION);
    c.constant("VR_REJECT_FULL", msg::REJECT_FULL);
    c.constant("VR_REJECT_BACKEND", msg::REJECT_BACKEND);
    c.constant("VR_REJECT_POLICY", msg::REJECT_POLICY);
    c.constant("VR_REJECT_BAD_HELLO", msg::REJECT_BAD_HELLO);
    c.constant("VR_REJECT_SHUTDOWN", msg::REJECT_SHUTDOWN);
    c.constant("VR_REJECT_WRITE_DENIED", msg::REJECT_WRITE_DENIED);
    c.constant("VR_REJECT_KIND", msg::REJECT_KIND);
    c.constant("VR_REJECT_PULL_DENIED", msg::REJECT_PULL_DENIED);
    c.constant("VR_REJECT_LOSSLESS_BACKOFF", msg::REJECT_LOSSLESS_BACKOFF);
    c.push("VR_EVICT_LEASE (msg)", "VR_EVICT_LEASE", msg::EVICT_LEASE);
    c.constant("VR_EVICT_ATTACH", msg::EVICT_ATTACH);
    c.push("VR_EVICT_PROTOCOL (msg)", "VR_EVICT_PROTOCOL", msg::EVICT_PROTOCOL);
    c.constant("VR_MAX_GRANULARITY", vramring::seam::cuda::MAX_GRANULARITY);

    // Every message kind is in the header: a new `Msg` variant fails to
    // compile here, a new kind code fails to decode below.
    fn every_kind_is_listed(m: &Msg) -> u32 {
        match m {
            Msg::Hello(_) => msg::KIND_HELLO,
            Msg::Welcome(_) => msg::KIND_WELCOME,
            Msg::Reject(_) => msg::KIND_REJECT,
            Msg::Evicted(_) => msg::KIND_EVICTED,
            Msg::Bye => msg::KIND_BYE,
            Msg::Attach(_) => msg::KIND_ATTACH,
        }
    }
    assert_eq!(every_kind_is_listed(&Msg::Bye), msg::KIND_BYE);
    let mut unknown = Msg::Bye.encode();
    unknown[8..12].copy_from_slice(&7u32.to_le_bytes());
    assert!(
        Msg::decode(&unknown).is_err(),
        "message kind 7 decodes: add it to proto/vramring.h, PROTOCOL.md and this test"
    );
}

/// Where `needle` first occurs in `hay`.
fn find(hay: &[u8], needle: &[u8], what: &str) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("the encoded message does not contain the marker of {what}"))
}

/// Emits `static const unsigned char <name>[] = {..};` and a `memcpy` into a
/// `<ty>` variable `<name>_m` into the prelude.
fn embed(c: &mut Checks, name: &str, ty: &str, bytes: &[u8]) {
    let list: Vec<String> = bytes.iter().map(|b| format!("0x{b:02x}")).collect();
    let _ = writeln!(
        c.prelude,
        "    static const unsigned char {name}[] = {{{}}};",
        list.join(",")
    );
    let _ = writeln!(c.prelude, "    {ty} {name}_m;");
    let _ = writeln!(
        c.prelude,
        "    if (sizeof {name} != sizeof {name}_m) {{ printf(\"{name}: %zu bytes encoded, sizeof({ty}) %zu\\n\", sizeof {name}, sizeof {name}_m); return 1; }}"
    );
    let _ = writeln!(c.prelude, "    memcpy(&{name}_m, {name}, sizeof {name}_m);");
}

/// Checks the header words of an encoded message and of its C record.
fn message_header(c: &mut Checks, name: &str, ty: &str, label: &str, bytes: &[u8], kind: u32) {
    let word = |k: usize| u32::from_le_bytes(bytes[k..k + 4].try_into().unwrap());
    assert_eq!(word(0), msg::MSG_MAGIC, "{name}: magic at byte 0");
    assert_eq!(word(4), msg::PROTOCOL_VERSION, "{name}: version at byte 4");
    assert_eq!(word(8), kind, "{name}: kind at byte 8");
    assert_eq!(
        word(12) as usize,
        bytes.len() - msg::HEADER_BYTES,
        "{name}: body length at byte 12"
    );
    c.push(label, format!("sizeof({ty})"), bytes.len());
    for (f, off, v) in [
        ("magic", 0, word(0)),
        ("version", 4, word(4)),
        ("kind", 8, word(8)),
        ("body_len", 12, word(12)),
    ] {
        c.push(format!("{label}.hdr.{f}"), format!("offsetof({ty}, hdr.{f})"), off);
        c.push(format!("decode {name}.hdr.{f}"), format!("{name}_m.hdr.{f}"), v);
    }
}

fn messages(c: &mut Checks) {
    c.push("vr_msg_header", "sizeof(vr_msg_header)", msg::HEADER_BYTES);
    c.push("vr_msg_header.magic", "offsetof(vr_msg_header, magic)", 0);
    c.push("vr_msg_header.version", "offsetof(vr_msg_header, version)", 4);
    c.push("vr_msg_header.kind", "offsetof(vr_msg_header, kind)", 8);
    c.push("vr_msg_header.body_len", "offsetof(vr_msg_header, body_len)", 12);

    // Bye: a bare header.
    let bye = Msg::Bye.encode();
    assert_eq!(bye.len(), msg::HEADER_BYTES);
    embed(c, "bye", "vr_msg_header", &bye);
    c.push("decode bye.kind", "bye_m.kind", msg::KIND_BYE);
    c.push("decode bye.body_len", "bye_m.body_len", 0);
    c.push("VR_BYE_BODY_BYTES", "VR_BYE_BODY_BYTES", bye.len() - msg::HEADER_BYTES);

    // Hello, with a distinct marker in every field.
    let uuid: [u8; 16] = std::array::from_fn(|i| 0xd0 + i as u8);
    let name = "hello-name-marker";
    let hello = Hello {
        flags: 0xa1a2_a3a4,
        backends: 0xb1b2_b3b4,
        name: name.into(),
        device_uuid: uuid,
    };
    let b = Msg::Hello(hello.clone()).encode();
    embed(c, "hello", "vr_hello", &b);
    message_header(c, "hello", "vr_hello", "vr_hello", &b, msg::KIND_HELLO);
    c.push(
        "VR_HELLO_BODY_BYTES",
        "VR_HELLO_BODY_BYTES",
        b.len() - msg::HEADER_BYTES,
    );
    let f_flags = find(&b, &hello.flags.to_le_bytes(), "hello.flags");
    let f_backends = find(&b, &hello.backends.to_le_bytes(), "hello.backends");
    let f_name = find(&b, name.as_bytes(), "hello.name");
    let f_uuid = find(&b, &uuid, "hello.device_uuid");
    let f_reserved = f_uuid + uuid.len();
    for (f, off, size) in [
        ("flags", f_flags, 4),
        ("backends", f_backends, 4),
        ("name", f_name, msg::NAME_BYTES),
        ("device_uuid", f_uuid, 16),
        ("reserved", f_reserved, b.len() - f_reserved),
    ] {
        c.push(format!("vr_hello.{f}"), format!("offsetof(vr_hello, {f})"), off);
        c.push(
            format!("sizeof vr_hello.{f}"),
            format!("sizeof(((vr_hello *)0)->{f})"),
            size,
        );
    }
    assert!(
        b[f_name + name.len()..f_uuid].iter().all(|&x| x == 0),
        "hello name is NUL-padded"
    );
    assert!(b[f_reserved..].iter().all(|&x| x == 0), "hello reserved bytes are zero");
    c.push("decode hello.flags", "hello_m.flags", hello.flags);
    c.push("decode hello.backends", "hello_m.backends", hello.backends);
    c.push("decode hello.name[0]", "hello_m.name[0]", name.as_bytes()[0]);
    c.push("decode hello.name[len]", format!("hello_m.name[{}]", name.len()), 0u8);
    c.push("decode hello.device_uuid[15]", "hello_m.device_uuid[15]", uuid[15]);

    // Welcome.
    let uuid: [u8; 16] = std::array::from_fn(|i| 0x40 + i as u8);
    let w = Welcome {
        index: 0xa1a2_a3a4,
        generation: 0xb1b2_b3b4,
        epoch: 0xc1c2_c3c4_c5c6_c7c8,
        backend: 0xd1d2_d3d4,
        granted: 0xe1e2_e3e4,
        control_bytes: 0x1112_1314_1516_1718,
        subs_bytes: 0x2122_2324_2526_2728,
        pool_bytes: 0x3132_3334_3536_3738,
        device_uuid: uuid,
        client_bytes: 0x4142_4344_4546_4748,
    };
    let b = Msg::Welcome(w).encode();
    embed(c, "welcome", "vr_welcome", &b);
    message_header(c, "welcome", "vr_welcome", "vr_welcome", &b, msg::KIND_WELCOME);
    c.push(
        "VR_WELCOME_BODY_BYTES",
        "VR_WELCOME_BODY_BYTES",
        b.len() - msg::HEADER_BYTES,
    );
    let f_uuid = find(&b, &uuid, "welcome.device_uuid");
    let f_reserved = find(&b, &w.client_bytes.to_le_bytes(), "client_bytes") + 8;
    let scalar = [
        (
            "index",
            find(&b, &w.index.to_le_bytes(), "index"),
            4usize,
            u64::from(w.index),
        ),
        (
            "generation",
            find(&b, &w.generation.to_le_bytes(), "generation"),
            4,
            u64::from(w.generation),
        ),
        ("epoch", find(&b, &w.epoch.to_le_bytes(), "epoch"), 8, w.epoch),
        (
            "backend",
            find(&b, &w.backend.to_le_bytes(), "backend"),
            4,
            u64::from(w.backend),
        ),
        (
            "granted",
            find(&b, &w.granted.to_le_bytes(), "granted"),
            4,
            u64::from(w.granted),
        ),
        (
            "control_bytes",
            find(&b, &w.control_bytes.to_le_bytes(), "control_bytes"),
            8,
            w.control_bytes,
        ),
        (
            "subs_bytes",
            find(&b, &w.subs_bytes.to_le_bytes(), "subs_bytes"),
            8,
            w.subs_bytes,
        ),
        (
            "pool_bytes",
            find(&b, &w.pool_bytes.to_le_bytes(), "pool_bytes"),
            8,
            w.pool_bytes,
        ),
        (
            "client_bytes",
            find(&b, &w.client_bytes.to_le_bytes(), "client_bytes"),
            8,
            w.client_bytes,
        ),
    ];
    for (f, off, size, v) in scalar {
        c.push(format!("vr_welcome.{f}"), format!("offsetof(vr_welcome, {f})"), off);
        c.push(
            format!("sizeof vr_welcome.{f}"),
            format!("sizeof(((vr_welcome *)0)->{f})"),
            size,
        );
        c.push(format!("decode welcome.{f}"), format!("welcome_m.{f}"), v);
    }
    for (f, off, size) in [
        ("device_uuid", f_uuid, 16),
        ("reserved", f_reserved, b.len() - f_reserved),
    ] {
        c.push(format!("vr_welcome.{f}"), format!("offsetof(vr_welcome, {f})"), off);
        c.push(
            format!("sizeof vr_welcome.{f}"),
            format!("sizeof(((vr_welcome *)0)->{f})"),
            size,
        );
    }
    assert!(
        b[f_reserved..].iter().all(|&x| x == 0),
        "welcome reserved bytes are zero"
    );
    c.push("decode welcome.device_uuid[0]", "welcome_m.device_uuid[0]", uuid[0]);

    // Reject and Evicted share one record.
    let reason = "reason-marker";
    for (name, kind, m) in [
        (
            "reject",
            msg::KIND_REJECT,
            Msg::Reject(Notice {
                code: 0xa1a2_a3a4,
                reason: reason.into(),
            }),
        ),
        (
            "evicted",
            msg::KIND_EVICTED,
            Msg::Evicted(Notice {
                code: 0xa1a2_a3a4,
                reason: reason.into(),
            }),
        ),
    ] {
        let b = m.encode();
        embed(c, name, "vr_notice", &b);
        message_header(c, name, "vr_notice", &format!("vr_notice({name})"), &b, kind);
        let f_code = find(&b, &0xa1a2_a3a4u32.to_le_bytes(), "notice.code");
        let f_reason = find(&b, reason.as_bytes(), "notice.reason");
        for (f, off, size) in [
            ("code", f_code, 4),
            ("reserved", f_code + 4, f_reason - f_code - 4),
            ("reason", f_reason, b.len() - f_reason),
        ] {
            c.push(
                format!("vr_notice({name}).{f}"),
                format!("offsetof(vr_notice, {f})"),
                off,
            );
            c.push(
                format!("sizeof vr_notice({name}).{f}"),
                format!("sizeof(((vr_notice *)0)->{f})"),
                size,
            );
        }
        assert_eq!(b.len() - f_reason, msg::REASON_BYTES);
        c.push(format!("decode {name}.code"), format!("{name}_m.code"), 0xa1a2_a3a4u32);
        c.push(
            format!("decode {name}.reason[0]"),
            format!("{name}_m.reason[0]"),
            reason.as_bytes()[0],
        );
        c.push(
            format!("VR_NOTICE_BODY_BYTES({name})"),
            "VR_NOTICE_BODY_BYTES",
            b.len() - msg::HEADER_BYTES,
        );
    }
    // Attach, with a distinct marker in every field.
    let a = Attach {
        count: 0xa1a2_a3a4,
        stride: 0xb1b2_b3b4_b5b6_b7b8,
        bytes: 0xc1c2_c3c4_c5c6_c7c8,
    };
    let b = Msg::Attach(a).encode();
    embed(c, "attach", "vr_attach", &b);
    message_header(c, "attach", "vr_attach", "vr_attach", &b, msg::KIND_ATTACH);
    c.push(
        "VR_ATTACH_BODY_BYTES",
        "VR_ATTACH_BODY_BYTES",
        b.len() - msg::HEADER_BYTES,
    );
    let f_count = find(&b, &a.count.to_le_bytes(), "attach.count");
    let f_stride = find(&b, &a.stride.to_le_bytes(), "attach.stride");
    let f_bytes = find(&b, &a.bytes.to_le_bytes(), "attach.bytes");
    assert_eq!(f_bytes + 8, b.len(), "attach.bytes ends the record");
    for (f, off, size, v) in [
        ("count", f_count, 4usize, u64::from(a.count)),
        ("reserved", f_count + 4, f_stride - f_count - 4, 0),
        ("stride", f_stride, 8, a.stride),
        ("bytes", f_bytes, 8, a.bytes),
    ] {
        c.push(format!("vr_attach.{f}"), format!("offsetof(vr_attach, {f})"), off);
        c.push(
            format!("sizeof vr_attach.{f}"),
            format!("sizeof(((vr_attach *)0)->{f})"),
            size,
        );
        c.push(format!("decode attach.{f}"), format!("attach_m.{f}"), v);
    }
    assert!(
        b[f_count + 4..f_stride].iter().all(|&x| x == 0),
        "attach reserved bytes are zero"
    );
    // The Rust decoder reads back every field.
    assert_eq!(Msg::decode(&b).unwrap(), Msg::Attach(a));

    // Every record fits one datagram.
    c.push("vr_notice fits", "sizeof(vr_notice) <= VR_MAX_MSG_BYTES", 1);
    c.push("vr_attach fits", "sizeof(vr_attach) <= VR_MAX_MSG_BYTES", 1);
}

/// Whether a shared writable mapping of one page of `fd` is refused.
fn refuses_shared_write(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};
    // SAFETY: a fresh mapping at an address the kernel picks; it aliases no
    // Rust object and is unmapped at once without being touched.
    unsafe {
        match mmap(
            std::ptr::null_mut(),
            4096,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            fd,
            0,
        ) {
            Ok(p) => {
                let _ = munmap(p, 4096);
                false
            }
            Err(_) => true,
        }
    }
}

/// The descriptors a real v2 Welcome carries are what the header says: a
/// pull subscriber gets control, table, client region and pool, a push
/// subscriber the first three; their seals are the header's, the shared
/// regions (and, without a write grant, the pool) are read-only at the
/// open-file level, the client region is read-write and `VR_CLIENT_BYTES`
/// long; a v1 Hello is refused with `VR_REJECT_VERSION`.
fn live_welcome(c: &mut Checks) {
    use std::os::fd::AsFd;
    use vramring::{BackendChoice, Publisher, RingConfig};
    let dir = scratch_dir();
    let path = dir.join("live.sock");
    let _ = std::fs::remove_file(&path);
    let publisher = Publisher::create(
        &path,
        RingConfig::new(Format::Gray8, 64, 16).backend(BackendChoice::Host),
    )
    .expect("a host publisher");
    let hello = |flags: u32| Hello {
        flags,
        backends: 1 << layout::BACKEND_HOST,
        name: "c-layout".into(),
        device_uuid: [0; 16],
    };
    let ask = |bytes: &[u8]| {
        let sock = transport::connect(&path).expect("connecting to the publisher");
        transport::send(sock.as_fd(), bytes, &[]).expect("sending a Hello");
        let got = transport::recv(sock.as_fd(), std::time::Duration::from_secs(5))
            .expect("receiving the answer")
            .expect("an answer within 5 s");
        (sock, got)
    };
    for (name, flags, fds) in [("pull", 0, 4usize), ("push", msg::HELLO_PUSH, 3)] {
        let (_sock, got) = ask(&Msg::Hello(hello(flags)).encode());
        let Ok(Msg::Welcome(w)) = Msg::decode(&got.bytes) else {
            panic!("{name}: expected a Welcome");
        };
        assert_eq!(got.fds.len(), fds, "{name}: descriptors in the Welcome");
        c.push(format!("live {name} client_bytes"), "VR_CLIENT_BYTES", w.client_bytes);
        let regions = [
            ("control", "VR_CONTROL_SEALS", w.control_bytes, true),
            ("subs", "VR_SUBS_SEALS", w.subs_bytes, true),
            ("client", "VR_CLIENT_SEALS", w.client_bytes, false),
            ("pool", "VR_READ_ONLY_SEALS", w.pool_bytes, true),
        ];
        for (k, fd) in got.fds.iter().enumerate() {
            let (what, seals, bytes, read_only) = regions[k];
            let got_seals = rustix::fs::fcntl_get_seals(fd).expect("F_GET_SEALS").bits();
            c.push(format!("live {name} fd{k} {what} seals"), seals, got_seals);
            let size = rustix::fs::fstat(fd).expect("fstat").st_size as u64;
            assert!(
                size >= bytes,
                "{name}: fd {k} ({what}) holds {size} bytes, the Welcome says {bytes}"
            );
            let mode = rustix::fs::fcntl_getfl(fd).expect("F_GETFL").bits() & 3;
            assert_eq!(
                mode,
                if read_only { 0 } else { 2 },
                "{name}: fd {k} ({what}) access mode"
            );
            assert_eq!(
                refuses_shared_write(fd.as_fd()),
                read_only,
                "{name}: fd {k} ({what}) PROT_WRITE mapping"
            );
        }
    }
    // A v1 peer is refused in words.
    let mut v1 = Msg::Hello(hello(0)).encode();
    v1[4..8].copy_from_slice(&1u32.to_le_bytes());
    let (_sock, got) = ask(&v1);
    let Ok(Msg::Reject(n)) = Msg::decode(&got.bytes) else {
        panic!("a v1 Hello must get a Reject");
    };
    c.push("live v1 hello reject code", "VR_REJECT_VERSION", n.code);
    drop(publisher);
}

/// The first fenced C block after the heading `heading` in PROTOCOL.md.
fn doc_c_block(md: &str, heading: &str) -> String {
    let at = md
        .find(heading)
        .unwrap_or_else(|| panic!("PROTOCOL.md has no heading {heading:?}"));
    let rest = &md[at..];
    let start = rest
        .find("```c\n")
        .unwrap_or_else(|| panic!("no C block after {heading:?}"))
        + 5;
    let len = rest[start..].find("\n```").expect("unterminated C block");
    rest[start..start + len].to_owned()
}

/// The C code PROTOCOL.md shows compiles against the header, and its test
/// pattern computes the same words as `vramring_testkit::pattern`.
fn protocol_md_code(c: &mut Checks) {
    let md_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/PROTOCOL.md");
    let md = std::fs::read_to_string(&md_path).expect("reading proto/PROTOCOL.md");
    protocol_md_push(c, &md);
    protocol_md_push_queue(c, &md);
    protocol_md_packets(c, &md);

    let pattern = doc_c_block(&md, "## Appendix A");
    let _ = writeln!(c.top, "/* PROTOCOL.md, Appendix A */\n{pattern}\n");
    for (seq, i) in [(0u64, 4u32), (1, 4), (7, 100), (0x1_0000_0007, 5), (u64::MAX, 12345)] {
        c.push(
            format!("appendix-a word({seq:#x},{i})"),
            format!("word(UINT64_C({seq:#x}), {i}u)"),
            vramring_testkit::pattern::word(seq, i),
        );
    }
    c.push(
        "appendix-a mix32(0xdeadbeef)",
        "mix32(0xdeadbeefu)",
        vramring_testkit::pattern::mix32(0xdead_beef),
    );

    // Appendix B, after the two functions it names: `use_frame` checks the
    // Appendix A pattern, `socket_event` reads the socket. It is run by
    // `appendix_b_runs_against_a_rust_publisher` (the program's `b` mode).
    let reader = doc_c_block(&md, "## Appendix B");
    let _ = writeln!(
        c.top,
        "/* PROTOCOL.md, Appendix B */\n{APPENDIX_B_STUBS}\n{reader}\n{APPENDIX_B_RUNNER}\n"
    );
}

/// What Appendix B's reader calls: a frame check against the Appendix A
/// pattern, and the socket read of section 12 step 3g.
const APPENDIX_B_STUBS: &str = r#"
static uint64_t ab_len, ab_good, ab_bad, ab_last;
enum { AB_GONE = 1, AB_EVICTED = 2 }; /* Appendix B's VR_READ_GONE, VR_READ_EVICTED */
static uint32_t ab_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void use_frame(const void *b, uint64_t seq, int64_t pts) {
    const unsigned char *p = b;
    uint32_t n = (uint32_t)(ab_len / 4), sum = 0;
    int ok = n >= 4;
    for (uint32_t i = 4; ok && i < n; i++) {
        uint32_t x = ab_le32(p + 4 * i);
        ok = x == word(seq, i);
        sum += x;
    }
    ok = ok && ab_le32(p) == (uint32_t)seq && ab_le32(p + 4) == (uint32_t)(seq >> 32) &&
         ab_le32(p + 8) == sum && ab_le32(p + 12) == n && pts == (int64_t)seq;
    if (ok) ab_good++; else ab_bad++;
    ab_last = seq;
    /* A slow consumer: the publisher's close lands while frames are left to
     * drain, so the reader finds its entry freed at a lease check. */
    struct timespec pause = {0, 2 * 1000 * 1000};
    nanosleep(&pause, NULL);
}
/* Gone: the publisher said Bye, or the connection ended; evicted: an
 * Evicted notice; 0: nothing, or another message. */
static int socket_event(int sock) {
    unsigned char m[VR_MAX_MSG_BYTES + 1];
    ssize_t r = recv(sock, m, sizeof m, MSG_DONTWAIT);
    if (r == 0) return AB_GONE;
    if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : AB_GONE;
    if (r < (ssize_t)VR_HEADER_BYTES) return 0;
    uint32_t kind = ab_le32(m + 8);
    return kind == VR_KIND_BYE ? AB_GONE : kind == VR_KIND_EVICTED ? AB_EVICTED : 0;
}
"#;

/// The `b` mode of the C program: maps the descriptors of a Welcome it
/// inherited and runs Appendix B's reader until it returns.
const APPENDIX_B_RUNNER: &str = r#"
static int run_appendix_b(char **argv) {
    int fd[5];
    for (int k = 0; k < 5; k++) fd[k] = atoi(argv[2 + k]);
    uint64_t ctl_bytes = strtoull(argv[7], NULL, 10), subs_bytes = strtoull(argv[8], NULL, 10);
    uint64_t pool_bytes = strtoull(argv[9], NULL, 10);
    uint32_t index = (uint32_t)strtoul(argv[10], NULL, 10), generation = (uint32_t)strtoul(argv[11], NULL, 10);
    void *ctl = mmap(NULL, ctl_bytes, PROT_READ, MAP_SHARED, fd[0], 0);
    void *subs = mmap(NULL, subs_bytes, PROT_READ, MAP_SHARED, fd[1], 0);
    void *client = mmap(NULL, VR_CLIENT_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd[2], 0);
    void *pool = mmap(NULL, pool_bytes, PROT_READ, MAP_SHARED, fd[3], 0);
    if (ctl == MAP_FAILED || subs == MAP_FAILED || client == MAP_FAILED || pool == MAP_FAILED) {
        printf("mmap failed\n");
        return 1;
    }
    const vr_ring_header *h = ctl;
    vr_ring_info I;
    if (__atomic_load_n(&h->info.layout_version, __ATOMIC_ACQUIRE) != VR_LAYOUT_VERSION) return 1;
    memcpy(&I, &h->info, sizeof I); /* immutable once ready; the Rust side validated it */
    const vr_sub_entry *e = (const vr_sub_entry *)((const char *)subs + sizeof(vr_subs_header)) + index;
    vr_client_line *cl = client;
    uint64_t last = __atomic_load_n(&cl->released_seq, __ATOMIC_RELAXED);
    unsigned char *buf = malloc(I.frame_bytes);
    ab_len = I.frame_bytes;
    int rc = vr_read_frames(ctl, &I, e, cl, generation, pool, fd[4], 1, 1, last, buf);
    printf("rc %d good %llu bad %llu last %llu delivered %llu dropped %llu overruns %llu start %llu\n", rc,
           (unsigned long long)ab_good, (unsigned long long)ab_bad, (unsigned long long)ab_last,
           (unsigned long long)cl->delivered, (unsigned long long)cl->dropped,
           (unsigned long long)cl->overruns, (unsigned long long)last);
    free(buf);
    return 0;
}
"#;

/// FNV-1a of a packet's bytes; the C program computes the same.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What one read of a packet reader returned.
enum Step {
    Got(Packet, u64),
    Overrun(u64),
    Nothing,
}

/// Reads until there is nothing left, recording every result.
fn drain(r: &mut PacketReader) -> Vec<Step> {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    loop {
        assert!(out.len() < 64, "a packet reader that never runs dry");
        match r.try_next_copy(&mut buf) {
            Ok(Some(p)) => out.push(Step::Got(p, fnv(&buf))),
            Ok(None) => {
                out.push(Step::Nothing);
                return out;
            }
            Err(Error::PacketOverrun { seq, .. }) => out.push(Step::Overrun(seq)),
            Err(e) => panic!("packet reader: {e}"),
        }
    }
}

/// Emits a C reader named `name` over `pkt_ring`, started by `init` (C
/// statements), that makes `steps.len()` reads, and checks each against
/// the Rust reader's.
fn c_packet_reader(c: &mut Checks, name: &str, init: &str, steps: &[Step]) {
    let n = steps.len();
    let _ = writeln!(
        c.prelude,
        "    vr_packet_reader {name}; memset(&{name}, 0, sizeof {name});\n\
         \x20   memcpy(&{name}.I, pkt_ring, sizeof {name}.I); {name}.ring = pkt_ring;\n\
         \x20   {init}\n\
         \x20   int {name}_st[{n}]; vr_packet_meta {name}_m[{n}]; uint64_t {name}_h[{n}];\n\
         \x20   for (int i = 0; i < {n}; i++) {{\n\
         \x20       memset(&{name}_m[i], 0, sizeof {name}_m[i]);\n\
         \x20       {name}_st[i] = vr_packet_next(&{name}, pkt_buf, &{name}_m[i]);\n\
         \x20       {name}_h[i] = {name}_st[i] == VR_PKT_OK ? pkt_fnv(pkt_buf, {name}_m[i].len) : 0;\n\
         \x20   }}\n\
         \x20   (void){name}_h;"
    );
    for (i, step) in steps.iter().enumerate() {
        let label = format!("packet reader {name} read {i}");
        let m = format!("{name}_m[{i}]");
        match step {
            Step::Got(p, hash) => {
                c.push(format!("{label} status"), format!("{name}_st[{i}]"), 1u32);
                c.push(format!("{label} seq"), format!("{m}.seq"), p.seq);
                c.push(format!("{label} len"), format!("{m}.len"), p.len);
                c.push(format!("{label} flags"), format!("{m}.flags"), p.flags);
                c.push(format!("{label} codec"), format!("{m}.codec"), p.codec);
                c.push(format!("{label} pts"), format!("(uint64_t){m}.pts"), p.pts as u64);
                c.push(format!("{label} dts"), format!("(uint64_t){m}.dts"), p.dts as u64);
                c.push(format!("{label} commit_ns"), format!("{m}.commit_ns"), p.commit_ns);
                c.push(format!("{label} skipped"), format!("{m}.skipped"), p.skipped);
                c.push(format!("{label} bytes"), format!("{name}_h[{i}]"), *hash);
            }
            Step::Overrun(seq) => {
                c.push(format!("{label} status"), format!("{name}_st[{i}]"), 2u32);
                c.push(format!("{label} seq"), format!("{m}.seq"), *seq);
            }
            Step::Nothing => c.push(format!("{label} status"), format!("{name}_st[{i}]"), 0u32),
        }
    }
}

/// Writes packet `i` of the test stream: lengths that make the writer pad
/// twice and lose keyframe 13's bytes while its record survives.
fn write_test_packet(w: &mut PacketWriter, i: u64) {
    let len = 200 + (i as usize * 397) % 600;
    let data: Vec<u8> = (0..len).map(|k| (i as usize * 31 + k * 7) as u8).collect();
    let mut flags = if i % 4 == 1 { packet_layout::PACKET_KEY } else { 0 };
    if i == 10 {
        flags |= packet_layout::PACKET_DISCONTINUITY;
    }
    let pts = i as i64 * 1000 - 5000;
    let meta = PacketMeta {
        pts,
        dts: pts - 1,
        flags,
        codec: if i == 7 { u32::from_le_bytes(*b"H265") } else { 0 },
    };
    assert_eq!(w.write(&data, meta).unwrap(), i);
}

/// The packet reader of PROTOCOL.md section 17.12 compiles, and on a ring
/// the Rust writer filled it reads what `PacketReader` reads: join at the
/// newest keyframe, overrun by a recycled record and by a raised tail,
/// resync at the oldest intact keyframe, the lossless cursor, and the codec
/// parameters.
fn protocol_md_packets(c: &mut Checks, md: &str) {
    let code = doc_c_block(md, "### 17.12 A packet reader in C");
    let _ = writeln!(c.top, "/* PROTOCOL.md, section 17.12 */\n{code}\n");

    let cfg = PacketRingConfig::new(4096, 8, 2048).codec(u32::from_le_bytes(*b"H264"));
    let mut w = PacketWriter::create("c-layout-packets", cfg).expect("creating a packet ring");
    w.set_codec_params(&[0x5a; 100]).unwrap();
    // Opened before any packet: waits for the first keyframe.
    let mut early = PacketReader::open(w.fd()).unwrap();
    write_test_packet(&mut w, 1);
    // Joins at keyframe 1 and reads it at once; loses 2 to a recycled record.
    let mut mid = PacketReader::open(w.fd()).unwrap();
    let mut buf = Vec::new();
    assert_eq!(mid.try_next_copy(&mut buf).unwrap().map(|p| p.seq), Some(1));
    for i in 2..=14 {
        write_test_packet(&mut w, i);
    }
    // Joins at keyframe 13, whose bytes (not its record) are lost by the end.
    let mut behind = PacketReader::open(w.fd()).unwrap();
    for i in 15..=20 {
        write_test_packet(&mut w, i);
    }
    let params: Vec<u8> = (0..37u8).map(|b| b.wrapping_mul(29) ^ 0xa5).collect();
    assert_eq!(w.set_codec_params(&params).unwrap(), 2);
    // Joins at the newest keyframe, 17.
    let mut joined = PacketReader::open(w.fd()).unwrap();

    // The region as the readers see it now; the writer writes no more.
    let info = *w.info();
    let file = std::fs::File::from(w.fd().try_clone_to_owned().unwrap());
    let mut region = vec![0u8; info.region_bytes as usize];
    file.read_exact_at(&mut region, 0).expect("reading the packet region");
    let seals = rustix::fs::fcntl_get_seals(&file).unwrap();
    c.push("packet region seals", "VR_PACKET_RING_SEALS", seals.bits());
    let word = |at: usize| u64::from_le_bytes(region[at..at + 8].try_into().unwrap());
    let tail = word(offset_of!(PacketHeader, tail) + offset_of!(PacketTailLine, tail));
    let rec13 = info.record_at(13);
    assert_eq!(word(rec13), 13, "record 13 survives");
    assert!(word(rec13 + 8) < tail, "keyframe 13's bytes are lost");

    let list: Vec<String> = region.iter().map(u8::to_string).collect();
    let _ = writeln!(
        c.top,
        "static VR_ALIGN128 unsigned char pkt_ring[{}] = {{{}}};\n\
         static unsigned char pkt_buf[{}];\n\
         static uint64_t pkt_fnv(const unsigned char *b, uint32_t n) {{\n\
         \x20   uint64_t h = UINT64_C(0xcbf29ce484222325);\n\
         \x20   for (uint32_t k = 0; k < n; k++) h = (h ^ b[k]) * UINT64_C(0x100000001b3);\n\
         \x20   return h;\n\
         }}\n",
        region.len(),
        list.join(","),
        info.max_packet
    );

    let steps = drain(&mut joined);
    assert!(matches!(steps[0], Step::Got(ref p, _) if p.seq == 17));
    c_packet_reader(c, "pk_joined", "vr_packet_join(&pk_joined);", &steps);
    let steps = drain(&mut early);
    assert!(
        matches!(steps[0], Step::Got(ref p, _) if p.seq == 17),
        "resync skips keyframe 13"
    );
    c_packet_reader(c, "pk_early", "pk_early.resync = 1; pk_early.after = 0;", &steps);
    let steps = drain(&mut mid);
    assert!(matches!(steps[0], Step::Overrun(2)));
    assert!(matches!(steps[1], Step::Got(ref p, _) if p.seq == 17 && p.skipped == 15));
    c_packet_reader(
        c,
        "pk_mid",
        "pk_mid.next = 2; pk_mid.last = 1; pk_mid.delivered = 1;",
        &steps,
    );
    let steps = drain(&mut behind);
    assert!(matches!(steps[0], Step::Overrun(13)));
    c_packet_reader(c, "pk_behind", "pk_behind.next = 13;", &steps);
    let stats = behind.stats();
    c.push(
        "packet reader pk_behind delivered",
        "pk_behind.delivered",
        stats.delivered,
    );
    c.push("packet reader pk_behind skipped", "pk_behind.skipped", stats.skipped);
    c.push("packet reader pk_behind overruns", "pk_behind.overruns", stats.overruns);

    // Lossless cursors (section 17.10), in the reader's own client region. From the
    // lossless start (keyframe_seq - 1 = 16) it reads 17..=20 and is done
    // with 20; from a cursor past the newest keyframe it resyncs, finds no
    // keyframe after 18, and is done with everything written (20).
    let lossless_steps = drain(&mut PacketReader::open(w.fd()).unwrap());
    for (name, start, steps) in [
        ("pk_lossless", 16u64, lossless_steps),
        ("pk_lossless_resync", 18, vec![Step::Nothing]),
    ] {
        let _ = writeln!(
            c.prelude,
            "    vr_client_line {name}_e; memset(&{name}_e, 0, sizeof {name}_e); {name}_e.released_seq = {start}u;"
        );
        let init = format!("{name}.cl = &{name}_e; {name}.lossless = 1; vr_packet_join(&{name});");
        c_packet_reader(c, name, &init, &steps);
        c.push(
            format!("{name} released_seq"),
            format!("{name}_e.released_seq"),
            w.seq(),
        );
        let delivered = steps.iter().filter(|s| matches!(s, Step::Got(..))).count();
        c.push(format!("{name} delivered"), format!("{name}_e.delivered"), delivered);
        c.push(format!("{name} dropped"), format!("{name}_e.dropped"), 0u32);
        c.push(format!("{name} overruns"), format!("{name}_e.overruns"), 0u32);
    }

    // Codec parameters: version 2, shorter than version 1 (whose tail words
    // stay behind in the area).
    let mut got = Vec::new();
    let version = joined.codec_params(&mut got).unwrap();
    assert_eq!((version, got.as_slice()), (2, params.as_slice()));
    let _ = writeln!(
        c.prelude,
        "    unsigned char pkp[VR_PACKET_PARAMS_BYTES]; uint32_t pkp_len = 0; uint64_t pkp_version = 0;\n\
         \x20   int pkp_rc = vr_packet_params_read((const vr_packet_header *)pkt_ring, pkp, &pkp_len, &pkp_version);"
    );
    c.push("packet params rc", "pkp_rc", 0u32);
    c.push("packet params version", "pkp_version", version);
    c.push("packet params len", "pkp_len", got.len());
    c.push("packet params bytes", "pkt_fnv(pkp, pkp_len)", fnv(&got));
}

/// A zeroed subscriber-table entry with these push words, and a zeroed
/// client region with this hold.
fn push_entry(push_seq: &[u64], held: u32) -> (Box<SubEntry>, Box<ClientLine>) {
    // SAFETY: `SubEntry` is made of atomic integers only, for which all-zero
    // bytes are a valid value.
    let e: Box<SubEntry> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: as above, for `ClientLine`.
    let cl: Box<ClientLine> = Box::new(unsafe { std::mem::zeroed() });
    for (w, &v) in e.push_seq.iter().zip(push_seq) {
        w.store(v, Ordering::Relaxed);
    }
    cl.push_held.store(held, Ordering::Relaxed);
    (e, cl)
}

/// Emits C statements that build a `vr_sub_entry` named `name` with these
/// push words and a `vr_client_line` named `<name>_c` with this hold.
fn c_push_entry(c: &mut Checks, name: &str, push_seq: &[u64], held: u32) {
    let _ = writeln!(
        c.prelude,
        "    vr_sub_entry {name}; memset(&{name}, 0, sizeof {name});\n\
         \x20   vr_client_line {name}_c; memset(&{name}_c, 0, sizeof {name}_c); {name}_c.push_held = {held}u;"
    );
    for (k, v) in push_seq.iter().enumerate() {
        let _ = writeln!(c.prelude, "    {name}.push_seq[{k}] = UINT64_C({v:#x});");
    }
}

/// The push-delivery C code of PROTOCOL.md section 16.5 compiles, and its
/// claim, complete and take do what `vramring::seam::protocol::push` does.
fn protocol_md_push(c: &mut Checks, md: &str) {
    let code = doc_c_block(md, "### 16.5 The claim and hold protocol");
    let _ = writeln!(c.top, "/* PROTOCOL.md, section 16.5 */\n{code}\n");
    let w = layout::SEQ_WRITING;

    // Claim, then complete: (push_seq, held, newest, seq).
    let claims: [([u64; 3], u32, Option<usize>, u64); 6] = [
        ([0, 0, 0], 0, None, 1),
        ([5, 6, 7], 0, Some(0), 8),
        ([5, 6, 7], 2, Some(0), 8),
        ([5, 6, 7], 3, Some(1), 8),
        ([5, 6, 7], 1, None, 8),
        ([5, 6 | w, 7], 3, Some(0), 9),
    ];
    for (n, (seqs, held, newest, seq)) in claims.into_iter().enumerate() {
        let (e, cl) = push_entry(&seqs, held);
        let k = push::claim_buffer(&e, &cl, newest, seq);
        let name = format!("claim{n}");
        c_push_entry(c, &name, &seqs, held);
        let newest_c = newest.map_or(-1, |k| k as i64);
        let _ = writeln!(
            c.prelude,
            "    int {name}_k = vr_push_claim(&{name}, &{name}_c, {newest_c}, UINT64_C({seq:#x}));"
        );
        // The words right after the claim, before the C code completes it.
        let _ = writeln!(
            c.prelude,
            "    uint64_t {name}_claimed[VR_PUSH_BUFFERS]; memcpy({name}_claimed, {name}.push_seq, sizeof {name}_claimed);"
        );
        c.push(
            format!("push claim #{n} k+1"),
            format!("{name}_k + 1"),
            k.map_or(0, |k| k + 1),
        );
        for j in 0..layout::PUSH_BUFFERS {
            c.push(
                format!("push claim #{n} push_seq[{j}]"),
                format!("{name}_claimed[{j}]"),
                e.push_seq[j].load(Ordering::Relaxed),
            );
        }
        if let Some(k) = k {
            push::complete_buffer(&e, k, seq);
            let _ = writeln!(
                c.prelude,
                "    vr_push_complete(&{name}, {name}_k, UINT64_C({seq:#x}));"
            );
            c.push(
                format!("push complete #{n} push_seq[{k}]"),
                format!("{name}.push_seq[{k}]"),
                e.push_seq[k].load(Ordering::Relaxed),
            );
        }
    }
    let (e, cl) = push_entry(&[5, 6, 7], 3);
    assert_eq!(
        push::claim_buffer(&e, &cl, Some(0), 8),
        Some(1),
        "with 3 buffers, one is neither newest nor held"
    );

    // Take: (push_seq, held, after, upto: the global_seq loaded before).
    let m = u64::MAX;
    let takes: [([u64; 3], u32, u64, u64); 10] = [
        ([0, 0, 0], 0, 0, m),
        ([5, 7 | w, 6], 0, 4, m),
        ([5, 7, 6], 2, 7, m),
        ([9, 8, 10 | w], 0, 0, m),
        ([3, 4, 5], 1, 4, m),
        ([4, 4, 2], 0, 1, m),
        ([1 | w, 2 | w, 3 | w], 3, 0, m),
        // Frame 7's push word is visible, its commit has not landed: the
        // newest committed one (6) is taken, 7 waits.
        ([5, 7, 6], 0, 4, 6),
        // Nothing committed past `after`: nothing taken.
        ([5, 7, 6], 0, 6, 6),
        ([8, 7, 9], 2, 6, 7),
    ];
    for (n, (seqs, held, after, upto)) in takes.into_iter().enumerate() {
        let (e, cl) = push_entry(&seqs, held);
        let got = push::take_newest(&e, &cl, after, upto);
        // The cases with an `upto`: only committed frames are taken.
        let want = match n {
            7 => Some(Some((2, 6))),
            8 => Some(None),
            9 => Some(Some((1, 7))),
            _ => None,
        };
        if let Some(want) = want {
            assert_eq!(got, want, "take #{n}: {seqs:?} after {after} upto {upto}");
        }
        let name = format!("take{n}");
        c_push_entry(c, &name, &seqs, held);
        let _ = writeln!(
            c.prelude,
            "    uint64_t {name}_seq = 0; int {name}_k = vr_push_take(&{name}, &{name}_c, UINT64_C({after:#x}), UINT64_C({upto:#x}), &{name}_seq);"
        );
        c.push(
            format!("push take #{n} k+1"),
            format!("{name}_k + 1"),
            got.map_or(0, |(k, _)| k + 1),
        );
        c.push(
            format!("push take #{n} seq"),
            format!("{name}_seq"),
            got.map_or(0, |(_, s)| s),
        );
        c.push(
            format!("push take #{n} push_held"),
            format!("{name}_c.push_held"),
            cl.push_held.load(Ordering::Relaxed),
        );
    }
}

/// A queued-claim case: (push_seq, held, count, skip, seq, the k it must pick).
type QueuedClaim<'a> = (&'a [u64], u32, usize, u32, u64, Option<usize>);

/// The queued-push C code of PROTOCOL.md section 16.8 compiles, and its
/// claim and oldest-first take do what `claim_queued` and `take` do.
fn protocol_md_push_queue(c: &mut Checks, md: &str) {
    let code = doc_c_block(md, "### 16.8 Queued push: sequential and lossless readers");
    let _ = writeln!(c.top, "/* PROTOCOL.md, section 16.8 */\n{code}\n");
    let w = layout::SEQ_WRITING;
    let claims: [QueuedClaim<'_>; 9] = [
        // Empty buffers: the first.
        (&[0, 0, 0, 0], 0, 4, 0, 1, Some(0)),
        // Nothing held: only an empty one, even if others are old.
        (&[3, 4, 0, 5], 0, 4, 0, 6, Some(2)),
        (&[3, 4, 5], 0, 3, 0, 6, None),
        // Held frame 5 (buffer 2): 3 and 4 are read; the oldest goes.
        (&[3, 4, 5, 6], 3, 4, 0, 7, Some(0)),
        // ... unless it is in flight.
        (&[3, 4, 5, 6], 3, 4, 1, 7, Some(1)),
        // Held frame 3: the newer ones are unread, so none is free.
        (&[3, 4, 5], 1, 3, 0, 6, None),
        // A failed copy is free; the held one never.
        (&[5 | w, 6, 7], 2, 3, 0, 8, Some(0)),
        // A hold out of range counts as none.
        (&[3, 4, 0], 9, 3, 0, 5, Some(2)),
        // A buffer past `count` is never touched.
        (&[3, 4, 5, 0], 3, 3, 0, 6, Some(0)),
    ];
    for (n, (seqs, held, count, skip, seq, want)) in claims.into_iter().enumerate() {
        let (e, cl) = push_entry(seqs, held);
        let k = push::claim_queued(&e, &cl, count, skip, seq);
        assert_eq!(k, want, "queued claim #{n}: {seqs:?} held {held}");
        let name = format!("qclaim{n}");
        c_push_entry(c, &name, seqs, held);
        let _ = writeln!(
            c.prelude,
            "    int {name}_k = vr_push_claim_queued(&{name}, &{name}_c, {count}u, {skip}u, UINT64_C({seq:#x}));"
        );
        c.push(
            format!("queued claim #{n} k+1"),
            format!("{name}_k + 1"),
            k.map_or(0, |k| k + 1),
        );
        for j in 0..seqs.len() {
            c.push(
                format!("queued claim #{n} push_seq[{j}]"),
                format!("{name}.push_seq[{j}]"),
                e.push_seq[j].load(Ordering::Relaxed),
            );
        }
    }
    // Take, oldest first: (push_seq, count, after, upto).
    let m = u64::MAX;
    let takes: [(&[u64], usize, u64, u64); 6] = [
        (&[0, 0, 0], 3, 0, m),
        (&[7, 5, 6], 3, 4, m),
        (&[7, 5, 6], 3, 5, m),
        (&[7, 5 | w, 6], 3, 4, m),
        (&[7, 5, 6], 3, 4, 4),
        (&[9, 8, 0, 3], 3, 7, m),
    ];
    for (n, (seqs, count, after, upto)) in takes.into_iter().enumerate() {
        let (e, cl) = push_entry(seqs, 0);
        let got = push::take(&e, &cl, push::Order::Oldest, count, after, upto);
        let name = format!("qtake{n}");
        c_push_entry(c, &name, seqs, 0);
        let _ = writeln!(
            c.prelude,
            "    uint64_t {name}_seq = 0; int {name}_k = vr_push_take_oldest(&{name}, &{name}_c, {count}u, UINT64_C({after:#x}), UINT64_C({upto:#x}), &{name}_seq);"
        );
        c.push(
            format!("queued take #{n} k+1"),
            format!("{name}_k + 1"),
            got.map_or(0, |(k, _)| k + 1),
        );
        c.push(
            format!("queued take #{n} seq"),
            format!("{name}_seq"),
            got.map_or(0, |(_, s)| s),
        );
        c.push(
            format!("queued take #{n} push_held"),
            format!("{name}_c.push_held"),
            cl.push_held.load(Ordering::Relaxed),
        );
    }
    let (e, cl) = push_entry(&[7, 5, 6], 0);
    assert_eq!(
        push::take(&e, &cl, push::Order::Oldest, 3, 4, m),
        Some((1, 5)),
        "the oldest frame past `after` comes first"
    );
}

fn c_program(c: &Checks) -> String {
    let mut s = String::new();
    // _GNU_SOURCE: Appendix B calls syscall(SYS_futex) and clock_gettime.
    s.push_str(
        "#define _GNU_SOURCE\n#include <errno.h>\n#include <stdio.h>\n#include <stddef.h>\n#include <stdlib.h>\n\
         #include <string.h>\n#include <sys/mman.h>\n#include <sys/socket.h>\n#include <time.h>\n#include \"vramring.h\"\n\n",
    );
    s.push_str(&c.top);
    s.push_str("int main(int argc, char **argv) {\n    if (argc == 12 && strcmp(argv[1], \"b\") == 0) return run_appendix_b(argv);\n");
    s.push_str(&c.prelude);
    for k in &c.list {
        let _ = writeln!(
            s,
            "    printf(\"%s %llu\\n\", \"{}\", (unsigned long long)({}));",
            k.label, k.c_expr
        );
    }
    s.push_str("    return 0;\n}\n");
    s
}

/// The C compiler: `$CC` (which may carry flags), else `cc`.
fn compiler() -> (String, Vec<String>) {
    let cc = std::env::var("CC")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "cc".into());
    let mut words = cc.split_whitespace().map(str::to_owned);
    let prog = words.next().unwrap_or_else(|| "cc".into());
    (prog, words.collect())
}

fn compile_and_run(dir: &Path, source: &str) -> String {
    let src = dir.join("c_layout.c");
    let exe = dir.join("c_layout");
    std::fs::write(&src, source).expect("writing the C program");
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
    let (cc, cc_args) = compiler();
    let out = Command::new(&cc)
        .args(&cc_args)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-O0", "-I"])
        .arg(&proto)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "no C compiler: running `{cc}` failed ({e}). This test checks proto/vramring.h against the \
                 Rust layout and needs one: install gcc or clang, or set CC"
            )
        });
    assert!(
        out.status.success(),
        "`{cc}` could not compile a program including proto/vramring.h ({}):\n{}\n(program: {})",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        src.display()
    );
    let run = Command::new(&exe).output().expect("running the compiled C program");
    assert!(
        run.status.success(),
        "the C program failed ({}):\n{}{}",
        run.status,
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8(run.stdout).expect("C program output is UTF-8")
}

fn scratch_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("c_layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("creating a scratch directory");
    dir
}

/// Appendix B's reader, compiled into the C program, reads a lossless
/// Sequential subscription of a real host publisher: the test does the
/// handshake, the C program inherits the Welcome's descriptors and the
/// socket, and the publisher writes more frames than it has slots (so it
/// waits on the C reader's cursor in its client region, and wakes it through
/// its own doorbell), then closes. The reader must deliver every frame intact
/// and in order, keep its counters in its client region, and end with
/// "producer gone", not "evicted", after the orderly close.
fn appendix_b_runs_against_a_rust_publisher(exe: &Path, dir: &Path) {
    use std::os::fd::{AsFd, AsRawFd};
    use std::time::{Duration, Instant};
    use vramring::{BackendChoice, FrameMeta, Policy, Publisher, RingConfig, ServeOptions};
    const FRAMES: u64 = 40;
    let path = dir.join("appendix-b.sock");
    // A lease no start-up of the C reader on a busy machine comes near: it
    // must end "producer gone", never "evicted".
    let mut p = Publisher::create(
        &path,
        RingConfig::new(Format::Gray8, 64, 16)
            .slots(4)
            .policy(Policy::Lossless)
            .backend(BackendChoice::Host)
            .lossless_lease(Duration::from_secs(60)),
    )
    .expect("a lossless host publisher");
    let sock = transport::connect(&path).expect("connecting");
    let hello = Hello {
        flags: msg::HELLO_LOSSLESS | msg::HELLO_SEQUENTIAL,
        backends: 1 << layout::BACKEND_HOST,
        name: "appendix-b".into(),
        device_uuid: [0; 16],
    };
    transport::send(sock.as_fd(), &Msg::Hello(hello).encode(), &[]).unwrap();
    let got = transport::recv(sock.as_fd(), Duration::from_secs(5))
        .unwrap()
        .expect("a Welcome");
    let Ok(Msg::Welcome(w)) = Msg::decode(&got.bytes) else {
        panic!("expected a Welcome");
    };
    assert_eq!(got.fds.len(), 4);
    let mut args = vec!["b".to_string()];
    for fd in got.fds.iter().map(|f| f.as_fd()).chain([sock.as_fd()]) {
        // The child inherits these five descriptors.
        rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty()).unwrap();
        args.push(fd.as_raw_fd().to_string());
    }
    for v in [
        w.control_bytes,
        w.subs_bytes,
        w.pool_bytes,
        u64::from(w.index),
        u64::from(w.generation),
    ] {
        args.push(v.to_string());
    }
    let mut child = Command::new(exe)
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("starting the C reader");
    for _ in 0..FRAMES {
        let mut slot = p
            .loan(Duration::from_secs(30))
            .expect("a loan (the C reader releases its frames)");
        let seq = slot.seq();
        vramring_testkit::pattern::fill(slot.bytes_mut().unwrap(), seq);
        slot.publish(FrameMeta::pts(seq as i64)).unwrap();
    }
    p.close().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("Appendix B's reader did not return within 10 s of the publisher's close");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the C reader failed: {text}");
    assert_eq!(
        text.trim(),
        format!("rc 1 good {FRAMES} bad 0 last {FRAMES} delivered {FRAMES} dropped 0 overruns 0 start 0"),
        "Appendix B's reader: rc 1 is producer gone (2 would be evicted)"
    );
    drop(sock);
}

#[test]
fn c_header_matches_the_rust_layout_and_messages() {
    let mut checks = Checks::default();
    shared_layout(&mut checks);
    packet_layout(&mut checks);
    constants(&mut checks);
    messages(&mut checks);
    live_welcome(&mut checks);
    protocol_md_code(&mut checks);

    let dir = scratch_dir();
    let output = compile_and_run(&dir, &c_program(&checks));

    let mut got: BTreeMap<&str, &str> = BTreeMap::new();
    for line in output.lines() {
        let (label, value) = line.rsplit_once(' ').unwrap_or((line, ""));
        assert!(got.insert(label, value).is_none(), "duplicate label {label:?}");
    }
    let mut failures = Vec::new();
    for k in &checks.list {
        match got.remove(k.label.as_str()) {
            None => failures.push(format!("{}: missing from the C program's output", k.label)),
            Some(v) if v.parse::<u64>().ok() != Some(k.expected) => failures.push(format!(
                "{}: C says {v}, Rust says {}   [{}]",
                k.label, k.expected, k.c_expr
            )),
            Some(_) => {}
        }
    }
    for (label, v) in got {
        failures.push(format!("{label}: printed by the C program ({v}) but not checked"));
    }
    assert!(
        failures.is_empty(),
        "proto/vramring.h or proto/PROTOCOL.md disagrees with the Rust crate in {} of {} checks:\n  {}",
        failures.len(),
        checks.list.len(),
        failures.join("\n  ")
    );
    appendix_b_runs_against_a_rust_publisher(&dir.join("c_layout"), &dir);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{} layout, constant and message checks agree", checks.list.len());
}

/// Every place PROTOCOL.md writes a version number next to its constant,
/// as "`VR_LAYOUT_VERSION` (4)" or "**4** (`VR_LAYOUT_VERSION`)", names the
/// number this build speaks: a reader who takes the number from the text
/// must not be refused by the crate.
#[test]
fn protocol_md_names_the_version_numbers_this_build_speaks() {
    let md_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/PROTOCOL.md");
    let md = std::fs::read_to_string(&md_path).expect("reading proto/PROTOCOL.md");
    // Line breaks as spaces (same offsets), for a phrase wrapped in the text.
    let flat = md.replace('\n', " ");
    let digits = |s: &str| s.chars().take_while(char::is_ascii_digit).collect::<String>();
    for (name, ours) in [
        ("VR_PROTOCOL_VERSION", msg::PROTOCOL_VERSION),
        ("VR_LAYOUT_VERSION", layout::LAYOUT_VERSION),
        ("VR_PACKET_LAYOUT_VERSION", packet_layout::PACKET_LAYOUT_VERSION),
    ] {
        let mut named = Vec::new();
        let after = format!("`{name}` (");
        for (at, _) in flat.match_indices(&after) {
            named.push((at, digits(&flat[at + after.len()..])));
        }
        let before = format!("** (`{name}`)");
        for (at, _) in flat.match_indices(&before) {
            let head = &flat[..at];
            let start = head.trim_end_matches(|c: char| c.is_ascii_digit()).len();
            named.push((at, head[start..].to_owned()));
        }
        assert!(!named.is_empty(), "PROTOCOL.md never names {name} with its number");
        for (at, n) in named {
            let line = md[..at].lines().count().max(1);
            assert_eq!(
                n,
                ours.to_string(),
                "PROTOCOL.md line {line} gives {name} as {n:?}; this build speaks {ours}"
            );
        }
    }
}
