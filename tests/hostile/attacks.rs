//! The attacker: a child process (this test binary, re-executed with
//! `HOSTILE_ATTACK` set) that connects like any subscriber with the raw
//! handshake and then does, with what it received, the one thing its attack
//! names. Everything it tried and what the kernel answered goes into its
//! result file (`key value` lines), which the test reads: a refusal by the
//! kernel is recorded, not fatal, so both "refused" and "did no harm" end in
//! the test's health checks.

#![allow(dead_code)]

use std::fmt::Write as _;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{FallocateFlags, MemfdFlags, SealFlags};
use vramring::seam::socket::msg::{self, Attach, Hello, Msg, Welcome};
use vramring::seam::socket::transport;
use vramring::ClientOptions;

use super::layout::{self, Fds, Role};
use super::map::Map;

/// Environment: which attack.
pub const ATTACK: &str = "HOSTILE_ATTACK";
/// Environment: the publisher's socket.
pub const SOCK: &str = "HOSTILE_SOCK";
/// Environment: where the result goes.
pub const RESULT: &str = "HOSTILE_RESULT";
/// Environment: how long the attack lasts, in ms.
pub const MILLIS: &str = "HOSTILE_MS";
/// Environment: a file the test creates once the publisher has evicted the
/// attacker (for attackers that hold until then).
pub const GO: &str = "HOSTILE_GO";

/// Sleeps until the test says the publisher has evicted this attacker (the
/// file named by [`GO`] exists), at most `max`.
pub fn hold_until_evicted(max: Duration) {
    let go = std::env::var_os(GO).map(PathBuf::from);
    let end = Instant::now() + max;
    while Instant::now() < end && !go.as_ref().is_some_and(|g| g.exists()) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What the attacker writes for the test.
#[derive(Default)]
pub struct Report(String);

impl Report {
    /// Records `key value`.
    pub fn put(&mut self, k: &str, v: impl std::fmt::Display) {
        let _ = writeln!(self.0, "{k} {v}");
    }
    /// Records the outcome of a syscall: `ok` or the errno's name.
    pub fn sys<T>(&mut self, k: &str, r: &Result<T, rustix::io::Errno>) {
        match r {
            Ok(_) => self.put(k, "ok"),
            Err(e) => self.put(k, format!("refused:{e}")),
        }
    }
    fn save(&self, path: &Path) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, &self.0).expect("writing the attacker's result");
        std::fs::rename(&tmp, path).expect("publishing the attacker's result");
    }
}

/// A raw connection: the socket, the Welcome, its descriptors by role.
pub struct Conn {
    pub sock: OwnedFd,
    pub welcome: Welcome,
    pub fds: Fds,
}

/// Connects and says Hello with `flags`; panics unless welcomed.
pub fn join(socket: &Path, flags: u32, name: &str) -> Conn {
    let sock = transport::connect(socket).unwrap_or_else(|e| panic!("attacker connect: {e}"));
    let hello = Msg::Hello(Hello {
        flags,
        backends: layout::BACKENDS_HOST,
        name: name.into(),
        device_uuid: [0; 16],
    });
    transport::send(sock.as_fd(), &hello.encode(), &[]).expect("sending Hello");
    let m = transport::recv(sock.as_fd(), Duration::from_secs(5))
        .expect("receiving the Welcome")
        .expect("a Welcome within 5 s");
    match Msg::decode(&m.bytes).expect("decoding the Welcome") {
        Msg::Welcome(welcome) => Conn {
            sock,
            fds: Fds::new(
                m.fds
                    .into_iter()
                    .map(vramring::seam::socket::PeerFd::into_owned)
                    .collect(),
                welcome.pool_bytes,
            ),
            welcome,
        },
        other => panic!("attacker was not welcomed: {other:?}"),
    }
}

impl Conn {
    /// Maps the descriptor of `role` (whole file), recording the outcome
    /// under `key`.
    pub fn map(&self, role: Role, writable: bool, rep: &mut Report, key: &str) -> Option<Map> {
        let Some(fd) = self.fds.get(role) else {
            rep.put(key, "no-such-fd");
            return None;
        };
        let r = Map::new(fd, layout::size_of_fd(fd), writable);
        rep.sys(key, &r);
        r.ok()
    }
    /// The control region, read-only (every subscriber may read it).
    pub fn control(&self) -> Map {
        let fd = self.fds.get(Role::Control).expect("a control region in the Welcome");
        Map::new(fd, layout::size_of_fd(fd), false).expect("mapping the control region read-only")
    }
    /// Whether the publisher closed this connection (EOF, or a Reject /
    /// Evicted / Bye) within `wait`; records what it said.
    pub fn closed_by_publisher(&self, wait: Duration, rep: &mut Report) -> bool {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match transport::recv(self.sock.as_fd(), left) {
                Ok(None) => return false,
                Ok(Some(m)) => match Msg::decode(&m.bytes) {
                    Ok(Msg::Reject(n)) | Ok(Msg::Evicted(n)) => {
                        rep.put(
                            "publisher_said",
                            format!("code {} {}", n.code, n.reason.replace(' ', "_")),
                        );
                        return true;
                    }
                    Ok(Msg::Bye) => {
                        rep.put("publisher_said", "bye");
                        return true;
                    }
                    _ => continue,
                },
                Err(_) => {
                    rep.put("publisher_said", "eof");
                    return true;
                }
            }
        }
    }
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("attacker needs {k}"))
}

/// Entry of the attacker child.
pub fn run() {
    let attack = env(ATTACK);
    let socket = PathBuf::from(env(SOCK));
    let result = PathBuf::from(env(RESULT));
    let dur = Duration::from_millis(env(MILLIS).parse().expect("HOSTILE_MS"));
    let mut rep = Report::default();
    rep.put("attack", &attack);
    match attack.as_str() {
        "idle" => {
            let c = join(&socket, 0, "idle");
            std::thread::sleep(dur);
            drop(c);
        }
        "pool_write" => pool_write(&socket, dur, &mut rep),
        "push_seq" => push_seq(&socket, dur, &mut rep),
        "generation" => generation(&socket, dur, &mut rep),
        "lossless_flag" => lossless_flag(&socket, dur, &mut rep),
        "generation_flip" => generation_flip(&socket, dur, &mut rep),
        "ghost_entries" => ghost_entries(&socket, dur, &mut rep),
        "fd_syscalls" => fd_syscalls(&socket, dur, &mut rep),
        "attach_flood" => attach_flood(&socket, dur, &mut rep),
        "attach_giant" => attach_giant(&socket, dur, &mut rep),
        "attach_churn" => attach_churn(&socket, dur, &mut rep),
        "own_push_held" => own_push_held(&socket, dur, &mut rep),
        "cursor_games" => cursor_games(&socket, dur, &mut rep),
        "own_queue_games" => queue_games(&socket, msg::HELLO_SEQUENTIAL, layout::PUSH_MAX_BUFFERS, dur, &mut rep),
        "lossless_queue_stall" => queue_games(
            &socket,
            msg::HELLO_SEQUENTIAL | msg::HELLO_LOSSLESS,
            layout::PUSH_QUEUE_MIN,
            dur,
            &mut rep,
        ),
        "handshake_flood" => handshake_flood(&socket, dur, &mut rep),
        "message_flood" => message_flood(&socket, dur, &mut rep),
        "slow_lossless" => slow_lossless(&socket, dur, &mut rep),
        "packet_stall" => packet_stall(&socket, dur, &mut rep),
        "stall_together" => stall_together(&socket, dur, &mut rep),
        "stall_reconnect" => stall_reconnect(&socket, dur, &mut rep),
        "spec_reader" => super::spec_reader::run(&socket, dur, &mut rep),
        "spec_lossless" => super::spec_reader::lossless(&socket, dur, &mut rep),
        other => panic!("unknown attack {other:?}"),
    }
    rep.save(&result);
}

/// Connects and says Hello with `flags`: the connection if welcomed, the
/// Reject's code and reason if refused.
pub fn try_join(socket: &Path, flags: u32, name: &str) -> Result<Conn, (u32, String)> {
    let sock = transport::connect(socket).unwrap_or_else(|e| panic!("attacker connect: {e}"));
    let hello = Msg::Hello(Hello {
        flags,
        backends: layout::BACKENDS_HOST,
        name: name.into(),
        device_uuid: [0; 16],
    });
    transport::send(sock.as_fd(), &hello.encode(), &[]).expect("sending Hello");
    let m = transport::recv(sock.as_fd(), Duration::from_secs(5))
        .expect("receiving the answer to Hello")
        .expect("an answer within 5 s");
    match Msg::decode(&m.bytes).expect("decoding the answer to Hello") {
        Msg::Welcome(welcome) => Ok(Conn {
            sock,
            fds: Fds::new(
                m.fds
                    .into_iter()
                    .map(vramring::seam::socket::PeerFd::into_owned)
                    .collect(),
                welcome.pool_bytes,
            ),
            welcome,
        }),
        Msg::Reject(n) => Err((n.code, n.reason)),
        other => panic!("neither Welcome nor Reject: {other:?}"),
    }
}

/// Runs `f` every `period` until `dur` passes; returns the rounds.
fn every(dur: Duration, period: Duration, mut f: impl FnMut()) -> u64 {
    let end = Instant::now() + dur;
    let mut n = 0;
    while Instant::now() < end {
        f();
        n += 1;
        std::thread::sleep(period);
    }
    n
}

/// Indices of the table's ACTIVE entries other than `own`.
fn others(table: &Map, own: u32) -> Vec<usize> {
    (0..layout::entry_count(table))
        .filter(|&i| i != own)
        .filter_map(|i| layout::entry_offset(table, i))
        .filter(|&e| table.read32(e + layout::ENTRY_STATE) == Some(layout::STATE_ACTIVE))
        .collect()
}

/// Attack 1: Write the pool without a WRITE grant: a shared writable mapping of
/// every descriptor, scribbled on when it is the pool; `pwrite` too.
fn pool_write(socket: &Path, dur: Duration, rep: &mut Report) {
    let c = join(socket, 0, "attacker-pool");
    for (role, fd) in &c.fds.all {
        let r = Map::new(fd.as_fd(), layout::size_of_fd(fd.as_fd()), true);
        rep.sys(&format!("mmap_rw_{}", role.name()), &r);
    }
    let pool = c.map(Role::Pool, true, rep, "mmap_rw_pool_again");
    let pw = c
        .fds
        .get(Role::Pool)
        .map(|fd| rustix::io::pwrite(fd, &[0x5a; 4096], 0))
        .unwrap_or(Err(rustix::io::Errno::BADF));
    rep.sys("pwrite_pool", &pw);
    let mut byte = 0u8;
    let rounds = every(dur, Duration::from_micros(500), || {
        if let Some(p) = &pool {
            byte = byte.wrapping_add(1);
            p.scribble(byte, 61);
        }
    });
    rep.put("rounds", rounds);
}

/// Attack 2: Corrupt other readers' push delivery: label every buffer of every
/// other push reader with the next seq before it is published, so that at
/// the next publish two of its three buffers claim a frame they do not hold.
fn push_seq(socket: &Path, dur: Duration, rep: &mut Report) {
    let c = join(socket, 0, "attacker-pushseq");
    let ctl = c.control();
    let table = c.map(Role::Table, true, rep, "mmap_rw_table");
    let mut writes = 0u64;
    every(dur, Duration::from_micros(200), || {
        let Some(t) = &table else { return };
        let g = ctl.read64(layout::CTRL_GLOBAL_SEQ).unwrap_or(0);
        for e in others(t, c.welcome.index) {
            if t.read32(e + layout::ENTRY_PUSH_COUNT).unwrap_or(0) == 0 {
                continue;
            }
            for k in 0..layout::PUSH_BUFFERS as usize {
                let off = e + layout::ENTRY_PUSH_SEQ + 8 * k;
                if t.read64(off).unwrap_or(0) <= g {
                    t.write64(off, g + 1);
                    writes += 1;
                }
            }
        }
    });
    rep.put("writes", writes);
}

/// Attack 3: Kick every other subscriber: bump their entries' generation.
fn generation(socket: &Path, dur: Duration, rep: &mut Report) {
    let c = join(socket, 0, "attacker-gen");
    let table = c.map(Role::Table, true, rep, "mmap_rw_table");
    let mut writes = 0u64;
    every(dur, Duration::from_millis(50), || {
        let Some(t) = &table else { return };
        for e in others(t, c.welcome.index) {
            let g = t.read32(e + layout::ENTRY_GENERATION).unwrap_or(0);
            t.write32(e + layout::ENTRY_GENERATION, g.wrapping_add(1));
            writes += 1;
        }
    });
    rep.put("writes", writes);
}

/// Attack 4: Get honest readers evicted: mark them lossless.
fn lossless_flag(socket: &Path, dur: Duration, rep: &mut Report) {
    let c = join(socket, 0, "attacker-flag");
    let table = c.map(Role::Table, true, rep, "mmap_rw_table");
    let mut writes = 0u64;
    every(dur, Duration::from_millis(20), || {
        let Some(t) = &table else { return };
        for e in others(t, c.welcome.index) {
            let f = t.read32(e + layout::ENTRY_FLAGS).unwrap_or(0);
            if f & layout::FLAG_LOSSLESS == 0 {
                t.write32(e + layout::ENTRY_FLAGS, f | layout::FLAG_LOSSLESS);
                writes += 1;
            }
        }
    });
    rep.put("writes", writes);
}

/// Attack 5: A lossless reader that never releases and flips its own generation
/// back and forth, to stall the publisher without being evicted.
fn generation_flip(socket: &Path, dur: Duration, rep: &mut Report) {
    let c = join(socket, msg::HELLO_LOSSLESS, "attacker-flip");
    let table = c.map(Role::Table, true, rep, "mmap_rw_table");
    let own = table.as_ref().and_then(|t| layout::own_generation(t, c.welcome.index));
    let mut flips = 0u64;
    every(dur, Duration::from_micros(200), || {
        let (Some(t), Some(gen_off)) = (&table, own) else {
            return;
        };
        let g = c.welcome.generation;
        t.write32(gen_off, if flips % 2 == 0 { g.wrapping_add(1) } else { g });
        flips += 1;
    });
    rep.put("flips", flips);
    let closed = c.closed_by_publisher(Duration::ZERO, rep);
    rep.put("evicted_or_closed", closed);
}

/// Attack 6: Ghost entries: leave, then mark every free entry ACTIVE.
fn ghost_entries(socket: &Path, dur: Duration, rep: &mut Report) {
    let c = join(socket, 0, "attacker-ghost");
    let table = c.map(Role::Table, true, rep, "mmap_rw_table");
    let _ = transport::send(c.sock.as_fd(), &Msg::Bye.encode(), &[]);
    let Conn { sock, welcome, fds } = c;
    drop(sock);
    let Some(t) = table else {
        std::thread::sleep(dur);
        return;
    };
    let own = layout::entry_offset(&t, welcome.index).expect("own entry");
    let freed = super::wait_for(Duration::from_secs(2), || {
        t.read32(own + layout::ENTRY_STATE) == Some(layout::STATE_FREE)
    });
    rep.put("own_entry_freed", freed);
    let mut ghosts = 0u64;
    every(dur, Duration::from_millis(10), || {
        for i in 0..layout::entry_count(&t) {
            if let Some(e) = layout::entry_offset(&t, i) {
                if t.read32(e + layout::ENTRY_STATE) == Some(layout::STATE_FREE) {
                    t.write32(e + layout::ENTRY_STATE, layout::STATE_ACTIVE);
                    ghosts += 1;
                }
            }
        }
    });
    rep.put("ghosts", ghosts);
    drop(fds);
}

/// Attack 7: `fallocate(PUNCH_HOLE)`, `ftruncate` and `write` on every received
/// descriptor, the punch repeated through the attack.
fn fd_syscalls(socket: &Path, dur: Duration, rep: &mut Report) {
    let c = join(socket, 0, "attacker-fdsys");
    let punch = |fd: BorrowedFd<'_>| {
        rustix::fs::fallocate(
            fd,
            FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
            0,
            layout::size_of_fd(fd),
        )
    };
    for (role, fd) in &c.fds.all {
        let n = role.name();
        let size = layout::size_of_fd(fd.as_fd());
        rep.sys(&format!("punch_{n}"), &punch(fd.as_fd()));
        rep.sys(&format!("ftruncate_shrink_{n}"), &rustix::fs::ftruncate(fd, size / 2));
        rep.sys(&format!("ftruncate_grow_{n}"), &rustix::fs::ftruncate(fd, size * 2));
        rep.sys(&format!("pwrite_{n}"), &rustix::io::pwrite(fd, &[0xee; 64], 64));
    }
    let mut rounds = 0u64;
    every(dur, Duration::from_millis(5), || {
        for (_, fd) in &c.fds.all {
            let _ = punch(fd.as_fd());
        }
        rounds += 1;
    });
    rep.put("rounds", rounds);
}

/// A memfd of `bytes`, sealed against shrinking (as the publisher demands
/// of push buffers).
fn push_memfd(bytes: u64) -> OwnedFd {
    let fd = rustix::fs::memfd_create("attacker-push", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .expect("memfd_create");
    rustix::fs::ftruncate(&fd, bytes).expect("sizing a push memfd");
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).expect("sealing a push memfd");
    fd
}

fn push_stride(c: &Conn) -> u64 {
    let frame = c.control().read64(layout::CTRL_FRAME_BYTES).expect("frame_bytes");
    frame.next_multiple_of(layout::PUSH_STRIDE_ALIGN)
}

fn send_attach(c: &Conn, stride: u64, bytes: u64, fd: BorrowedFd<'_>) -> bool {
    send_attach_of(c, layout::PUSH_BUFFERS, stride, bytes, fd)
}

fn send_attach_of(c: &Conn, count: u32, stride: u64, bytes: u64, fd: BorrowedFd<'_>) -> bool {
    let a = Msg::Attach(Attach { count, stride, bytes });
    transport::send(c.sock.as_fd(), &a.encode(), &[fd]).is_ok()
}

/// Holds the connection until `end`, then records whether the publisher
/// closed it.
fn hold_until(c: &Conn, end: Instant, rep: &mut Report) {
    let closed = c.closed_by_publisher(end.saturating_duration_since(Instant::now()), rep);
    rep.put("closed_by_publisher", closed);
    std::thread::sleep(end.saturating_duration_since(Instant::now()));
}

/// Attack 8a: Attach flood: many well-formed push Attach messages, each with its
/// own buffers, on one connection.
fn attach_flood(socket: &Path, dur: Duration, rep: &mut Report) {
    const N: usize = 300;
    let end = Instant::now() + dur;
    let c = join(socket, msg::HELLO_PUSH, "attacker-attach");
    rep.put("push_granted", c.welcome.granted & msg::HELLO_PUSH != 0);
    let stride = push_stride(&c);
    let mut sent = 0;
    for _ in 0..N {
        let fd = push_memfd(stride * u64::from(layout::PUSH_BUFFERS));
        if !send_attach(&c, stride, stride * u64::from(layout::PUSH_BUFFERS), fd.as_fd()) {
            break;
        }
        sent += 1;
    }
    rep.put("attach_sent", sent);
    hold_until(&c, end, rep);
}

/// Attack 8b: Attach with a giant sparse `bytes` (1 TiB each), repeated.
fn attach_giant(socket: &Path, dur: Duration, rep: &mut Report) {
    const N: usize = 24;
    const GIANT: u64 = 1 << 40;
    let end = Instant::now() + dur;
    let c = join(socket, msg::HELLO_PUSH, "attacker-giant");
    rep.put("push_granted", c.welcome.granted & msg::HELLO_PUSH != 0);
    let stride = push_stride(&c);
    let fd = push_memfd(GIANT);
    let mut sent = 0;
    for _ in 0..N {
        if !send_attach(&c, stride, GIANT, fd.as_fd()) {
            break;
        }
        sent += 1;
    }
    rep.put("attach_sent", sent);
    hold_until(&c, end, rep);
}

/// The most Attaches the producer example's attach rate (its default
/// burst, then its default rate) lets through in `elapsed`, rounded up to
/// whole seconds, with one second more for the attack's start.
pub fn attach_churn_most(elapsed: Duration) -> u64 {
    let secs = elapsed.as_millis().div_ceil(1000) as u64 + 1;
    u64::from(vramring::seam::ring::DEFAULT_ATTACH_BURST)
        + u64::from(vramring::seam::ring::DEFAULT_ATTACHES_PER_SECOND) * secs
}

/// A push subscriber that comes and goes as fast as it can: joins, sends
/// one valid Attach (its buffers made once, sent again each time), waits up
/// to 20 ms for the publisher to take them (its entry's `push_count`),
/// leaves, and again; for at least `dur`, and until it has connected 10
/// times more than [`attach_churn_most`] of the time it took (30 s at
/// most). Counts the connections, how many were taken, and the time.
fn attach_churn(socket: &Path, dur: Duration, rep: &mut Report) {
    let start = Instant::now();
    let (mut connections, mut taken) = (0u64, 0u64);
    let mut buffers: Option<OwnedFd> = None;
    let more = |connections: u64| {
        let t = start.elapsed();
        t < Duration::from_secs(30) && (t < dur || connections < attach_churn_most(t) + 10)
    };
    while more(connections) {
        let c = join(socket, msg::HELLO_PUSH, "attacker-churn");
        let stride = push_stride(&c);
        let bytes = stride * u64::from(layout::PUSH_BUFFERS);
        let fd = buffers.get_or_insert_with(|| push_memfd(bytes));
        if !send_attach(&c, stride, bytes, fd.as_fd()) {
            break;
        }
        connections += 1;
        let table = c.map(Role::Table, false, rep, "mmap_table");
        let count =
            |t: &Map| layout::entry_offset(t, c.welcome.index).and_then(|e| t.read32(e + layout::ENTRY_PUSH_COUNT));
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(20) {
            if table.as_ref().and_then(count) == Some(layout::PUSH_BUFFERS) {
                taken += 1;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    rep.put("connections", connections);
    rep.put("taken", taken);
    rep.put("elapsed_ms", start.elapsed().as_millis());
}

/// Writes `value(n)` into the connection's own `push_held` word every
/// 200 µs until `end` (the n-th write), and reports how many it wrote.
fn scribble_push_held(c: &Conn, end: Instant, rep: &mut Report, value: impl Fn(u32) -> u32) {
    let (role, off) = layout::OWN_PUSH_HELD;
    let own = c.map(role, true, rep, "mmap_rw_own_region");
    let mut n = 0u32;
    every(
        end.saturating_duration_since(Instant::now()),
        Duration::from_micros(200),
        || {
            if let Some(m) = &own {
                m.write32(off, value(n));
                n += 1;
            }
        },
    );
    rep.put("writes", n);
}

/// A push reader that attaches honestly, then writes nonsense into the
/// word it owns (`push_held`: out of range, all ones) and never reads.
fn own_push_held(socket: &Path, dur: Duration, rep: &mut Report) {
    let end = Instant::now() + dur;
    let c = join(socket, msg::HELLO_PUSH, "attacker-held");
    let stride = push_stride(&c);
    let fd = push_memfd(stride * u64::from(layout::PUSH_BUFFERS));
    rep.put(
        "attach_sent",
        send_attach(&c, stride, stride * u64::from(layout::PUSH_BUFFERS), fd.as_fd()),
    );
    scribble_push_held(&c, end, rep, |n| [4, 0xffff_ffff, 1, 2, 3, 0x8000_0001][n as usize % 6]);
}

/// A queued push reader (`flags` with `HELLO_PUSH`: sequential, maybe
/// lossless) that attaches `count` buffers honestly, then writes nonsense
/// into its own `push_held` (out of range, each buffer in turn, none) and
/// never reads a frame.
fn queue_games(socket: &Path, flags: u32, count: u32, dur: Duration, rep: &mut Report) {
    let end = Instant::now() + dur;
    let c = join(socket, msg::HELLO_PUSH | flags, "attacker-queue");
    let stride = push_stride(&c);
    let bytes = stride * u64::from(count);
    let fd = push_memfd(bytes);
    rep.put("attach_sent", send_attach_of(&c, count, stride, bytes, fd.as_fd()));
    scribble_push_held(&c, end, rep, |n| {
        [0, count, count + 1, 0xffff_ffff, 1 + n % count][n as usize % 5]
    });
    hold_until(&c, end, rep);
}

/// A lossless reader that never reads and writes its own released seq:
/// far ahead of the ring, then back to zero, over and over.
fn cursor_games(socket: &Path, dur: Duration, rep: &mut Report) {
    let c = join(socket, msg::HELLO_LOSSLESS, "attacker-cursor");
    let ctl = c.control();
    let (role, rel) = layout::OWN_RELEASED;
    let own = c.map(role, true, rep, "mmap_rw_own_region");
    let mut n = 0u64;
    every(dur, Duration::from_micros(300), || {
        let Some(t) = &own else {
            return;
        };
        let g = ctl.read64(layout::CTRL_GLOBAL_SEQ).unwrap_or(0);
        let v = match n % 3 {
            0 => u64::MAX,
            1 => 0,
            _ => g + 1000,
        };
        t.write64(rel, v);
        n += 1;
    });
    rep.put("writes", n);
}

/// Many connections that never send Hello, held through the attack.
fn handshake_flood(socket: &Path, dur: Duration, rep: &mut Report) {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    const N: usize = 1500;
    let end = Instant::now() + dur;
    let addr = SocketAddrUnix::new(socket).expect("socket path");
    let mut held = Vec::new();
    let mut failed = 0u64;
    while held.len() < N && Instant::now() < end {
        let s = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            None,
        );
        let Ok(s) = s else {
            failed += 1;
            std::thread::sleep(Duration::from_millis(1));
            continue;
        };
        match rustix::net::connect(&s, &addr) {
            Ok(()) => held.push(s),
            Err(_) => {
                failed += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    rep.put("connections", held.len());
    rep.put("connect_failures", failed);
    std::thread::sleep(end.saturating_duration_since(Instant::now()));
}

/// Tens of thousands of well-formed but unexpected messages on one live
/// connection, each with a descriptor attached.
fn message_flood(socket: &Path, dur: Duration, rep: &mut Report) {
    let end = Instant::now() + dur;
    let c = join(socket, 0, "attacker-msgs");
    let junk = push_memfd(4096);
    let hello = Msg::Hello(Hello {
        flags: msg::HELLO_WRITE | msg::HELLO_LOSSLESS,
        backends: layout::BACKENDS_HOST,
        name: "again".into(),
        device_uuid: [0; 16],
    })
    .encode();
    let attach = Msg::Attach(Attach {
        count: layout::PUSH_BUFFERS,
        stride: 4096,
        bytes: 4096 * 3,
    })
    .encode();
    let msgs = [hello, attach];
    let mut sent = 0u64;
    let mut blocked = 0u64;
    let flood_end = Instant::now() + dur / 2;
    while Instant::now() < flood_end && sent < 50_000 {
        let m = &msgs[(sent % 2) as usize];
        match transport::send(c.sock.as_fd(), m, &[junk.as_fd()]) {
            Ok(()) => sent += 1,
            Err(_) => {
                blocked += 1;
                if c.closed_by_publisher(Duration::from_millis(1), rep) {
                    rep.put("closed_during_flood", true);
                    break;
                }
            }
        }
    }
    rep.put("sent", sent);
    rep.put("send_failures", blocked);
    hold_until(&c, end, rep);
}

/// An honest-looking lossless reader that holds one frame until it is
/// evicted (past its lease; the test says when, `dur` at most) while frames
/// keep coming, then reads again: its first read after that must say
/// Evicted.
fn slow_lossless(socket: &Path, dur: Duration, rep: &mut Report) {
    use vramring::{Error, Subscriber, SubscriberOptions};
    let mut sub = Subscriber::connect(
        socket,
        SubscriberOptions::default().name("slow-lossless").lossless(true),
    )
    .expect("slow reader connect");
    let first = sub
        .next(Duration::from_secs(5))
        .map(|f| f.seq())
        .expect("a first frame");
    rep.put("first_seq", first);
    // Holds nothing across the sleep except its cursor: the lossless
    // reader is "done with" only what it released, so the publisher waits.
    hold_until_evicted(dur);
    let mut after = 0u64;
    let mut first_result = String::new();
    let end = Instant::now() + Duration::from_millis(1000);
    while Instant::now() < end {
        let r = sub.next(Duration::from_millis(200));
        let what = match &r {
            Ok(_) => "frame".to_owned(),
            Err(Error::Evicted { .. }) => "evicted".to_owned(),
            Err(e) => format!("error:{}", e.to_string().replace(' ', "_")),
        };
        if first_result.is_empty() {
            first_result = what.clone();
        }
        match r {
            Ok(_) => after += 1,
            Err(_) => break,
        }
    }
    rep.put("first_read_after_hold", first_result);
    rep.put("frames_after_hold", after);
}

/// A lossless packet reader that reads a few packets, then stops reading
/// and keeps its connection through the attack.
fn packet_stall(socket: &Path, dur: Duration, rep: &mut Report) {
    use vramring::packet::{PacketSubscriber, PacketSubscriberOptions};
    // The socket file exists from the writer's bind on; until its listen
    // a connect is refused: try again for a while.
    let opts = PacketSubscriberOptions::new().lossless(true).name("stalled");
    let start = Instant::now();
    let mut sub = loop {
        match PacketSubscriber::connect(socket, opts.clone()) {
            Ok(s) => break s,
            Err(vramring::Error::Io { .. }) if start.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("stalled packet reader connect: {e}"),
        }
    };
    let mut buf = Vec::new();
    let mut got = 0;
    for _ in 0..5 {
        if sub.next_copy(&mut buf, Duration::from_secs(5)).is_ok() {
            got += 1;
        }
    }
    rep.put("read_before_stall", got);
    std::thread::sleep(dur);
    sub.close();
}

/// How many lossless stallers [`stall_together`] connects.
pub const STALLERS: usize = 6;
/// How many connections [`stall_reconnect`] keeps trying to hold.
pub const RECONNECTING: usize = 3;

/// Lossless connections that all hold the same frame, never releasing it:
/// each sets its cursor to one seq just ahead of where every one of them
/// started, so the producer waits for all of them on the frame after it.
fn hold_one_frame(conns: &[Conn], rep: &mut Report) -> Vec<Option<Map>> {
    let g = conns[0].control().read64(layout::CTRL_GLOBAL_SEQ).unwrap_or(0);
    // Every connection started at a seq <= g (they joined before this
    // read); the producer clamps the claim to what it has published.
    let target = g + 2;
    rep.put("held_after", target);
    let (role, rel) = layout::OWN_RELEASED;
    conns
        .iter()
        .map(|c| {
            let m = c.map(role, true, rep, "mmap_rw_own_region");
            if let Some(m) = &m {
                m.write64(rel, target);
            }
            m
        })
        .collect()
}

/// What the publisher said on `c` within `wait`: `Some(code)` of an
/// Evicted or Reject, `Some(0)` for Bye or EOF, `None` for nothing yet.
fn notice(c: &Conn, wait: Duration) -> Option<u32> {
    match transport::recv(c.sock.as_fd(), wait) {
        Ok(None) => None,
        Ok(Some(m)) => match Msg::decode(&m.bytes) {
            Ok(Msg::Evicted(n)) | Ok(Msg::Reject(n)) => Some(n.code),
            _ => Some(0),
        },
        Err(_) => Some(0),
    }
}

/// [`STALLERS`] lossless readers that stall on the same frame at once, held
/// until the publisher closes each (at most `dur`). Records how many were
/// evicted for the lease.
fn stall_together(socket: &Path, dur: Duration, rep: &mut Report) {
    let conns: Vec<Conn> = (0..STALLERS)
        .map(|k| join(socket, msg::HELLO_LOSSLESS, &format!("staller-{k}")))
        .collect();
    let _held = hold_one_frame(&conns, rep);
    let end = Instant::now() + dur;
    let (mut lease, mut other) = (0, 0);
    for c in &conns {
        match notice(c, end.saturating_duration_since(Instant::now())) {
            Some(msg::EVICT_LEASE) => lease += 1,
            _ => other += 1,
        }
    }
    rep.put("evicted_lease", lease);
    rep.put("ended_otherwise", other);
}

/// A lossless staller on [`RECONNECTING`] connections that connects again
/// (lossless) each time one is closed, for `dur` after its first eviction:
/// records what the publisher answered, then tries once without lossless.
fn stall_reconnect(socket: &Path, dur: Duration, rep: &mut Report) {
    let first: Vec<Conn> = (0..RECONNECTING)
        .map(|k| join(socket, msg::HELLO_LOSSLESS, &format!("reconnecting-{k}")))
        .collect();
    let mut held = hold_one_frame(&first, rep);
    let mut conns: Vec<Option<Conn>> = first.into_iter().map(Some).collect();
    let (mut evicted_lease, mut ended_otherwise, mut welcomed_again) = (0u64, 0u64, 0u64);
    let (mut refused_backoff, mut refused_other, mut attempts) = (0u64, 0u64, 0u64);
    let mut reason = String::new();
    // The whole attack is bounded: its first eviction within 20 s, then
    // `dur` of reconnecting.
    let mut end = Instant::now() + Duration::from_secs(20);
    let mut evicted_once = false;
    while Instant::now() < end {
        for (k, slot) in conns.iter_mut().enumerate() {
            if let Some(c) = slot {
                match notice(c, Duration::ZERO) {
                    None => continue,
                    Some(msg::EVICT_LEASE) => evicted_lease += 1,
                    Some(_) => ended_otherwise += 1,
                }
                *slot = None;
                held[k] = None;
                if !evicted_once {
                    evicted_once = true;
                    end = Instant::now() + dur;
                }
            }
            if !evicted_once {
                continue;
            }
            attempts += 1;
            match try_join(socket, msg::HELLO_LOSSLESS, &format!("reconnecting-{k}")) {
                // Welcomed again: it never releases anything (its cursor
                // stays where it started), so it stalls again.
                Ok(c) => {
                    welcomed_again += 1;
                    *slot = Some(c);
                }
                Err((msg::REJECT_LOSSLESS_BACKOFF, r)) => {
                    refused_backoff += 1;
                    reason = r;
                }
                Err((code, r)) => {
                    refused_other += 1;
                    reason = format!("code {code}: {r}");
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    rep.put("evicted_lease", evicted_lease);
    rep.put("ended_otherwise", ended_otherwise);
    rep.put("welcomed_again", welcomed_again);
    rep.put("refused_backoff", refused_backoff);
    rep.put("refused_other", refused_other);
    rep.put("attempts", attempts);
    rep.put("reason", reason.replace(' ', "_"));
    let lossy = match try_join(socket, 0, "reconnecting-lossy") {
        Ok(_) => "welcomed".to_owned(),
        Err((code, _)) => format!("refused:{code}"),
    };
    rep.put("lossy_join", lossy);
}
