//! Messages the Rust encoder produced, decoded by the C program, and a live
//! publisher's Welcome against the header.

use std::fmt::Write as _;

use vramring::seam::layout;
use vramring::seam::socket::msg::{self, Attach, Hello, Msg, Notice, Welcome};
use vramring::seam::socket::transport;
use vramring::Format;

use super::{scratch_dir, Checks};

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

pub(super) fn messages(c: &mut Checks) {
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
pub(super) fn live_welcome(c: &mut Checks) {
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
