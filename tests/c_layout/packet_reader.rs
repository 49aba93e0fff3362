//! PROTOCOL.md's packet reader (section 17.12) on a packet ring the Rust
//! writer filled, step for step against `PacketReader`.

use std::fmt::Write as _;
use std::mem::offset_of;
use std::os::unix::fs::FileExt;

use vramring::packet::{Packet, PacketMeta, PacketReader, PacketRingConfig, PacketWriter};
use vramring::seam::packet_layout::{self as packet_layout, PacketHeader, PacketTailLine};
use vramring::Error;

use super::{doc_c_block, Checks};

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
pub(super) fn protocol_md_packets(c: &mut Checks, md: &str) {
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
