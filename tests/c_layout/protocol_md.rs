//! The C code of PROTOCOL.md: Appendix A's test pattern and Appendix B's
//! frame reader, run against a real Rust publisher.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use vramring::seam::layout;
use vramring::seam::socket::msg::{self, Hello, Msg};
use vramring::seam::socket::transport;
use vramring::Format;

use super::packet_reader::protocol_md_packets;
use super::push_claims::{protocol_md_push, protocol_md_push_queue};
use super::{doc_c_block, Checks};

/// The C code PROTOCOL.md shows compiles against the header, and its test
/// pattern computes the same words as `vramring_testkit::pattern`.
pub(super) fn protocol_md_code(c: &mut Checks) {
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

/// Appendix B's reader, compiled into the C program, reads a lossless
/// Sequential subscription of a real host publisher: the test does the
/// handshake, the C program inherits the Welcome's descriptors and the
/// socket, and the publisher writes more frames than it has slots (so it
/// waits on the C reader's cursor in its client region, and wakes it through
/// its own doorbell), then closes. The reader must deliver every frame intact
/// and in order, keep its counters in its client region, and end with
/// "producer gone", not "evicted", after the orderly close.
pub(super) fn appendix_b_runs_against_a_rust_publisher(exe: &Path, dir: &Path) {
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
