//! The shared structs, the packet ring's structs and the constants, as
//! `label value` checks of the C header.

use std::mem::{align_of, offset_of, size_of};

use vramring::seam::format;
use vramring::seam::layout::{
    self, ClientLine, DoorbellLine, ProducerLine, RingHeader, SeqLine, SharedRingInfo, SlotDesc, SubEntry, SubsHeader,
};
use vramring::seam::packet_layout::{
    self as packet_layout, PacketHeader, PacketInfo, PacketRecord, PacketRingInfo, PacketSeqLine, PacketTailLine,
    ParamsArea,
};
use vramring::seam::socket::msg::{self, Msg};
use vramring::seam::socket::transport;
use vramring::Format;

use super::Checks;

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

pub(super) fn shared_layout(c: &mut Checks) {
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

pub(super) fn packet_layout(c: &mut Checks) {
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

pub(super) fn constants(c: &mut Checks) {
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
