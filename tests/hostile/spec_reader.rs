//! A reader written from `proto/PROTOCOL.md` alone (no vramring client
//! code): the §12 wait loop, step by step, on the raw mappings, parked on
//! the doorbell of its own client region, with the lease decided as §15.1
//! says (the socket first, then the entry), run by [`READERS`] threads at
//! once, each on its own connection. It only follows the ring (Latest: it
//! remembers the newest seq) and reports how its last wait ended:
//! `producer-gone` or `evicted`.
//!
//! When the spec's close or eviction steps change, this file changes with
//! them; the offsets come from `layout`.

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use vramring::seam::socket::msg::Msg;
use vramring::seam::socket::transport;

use super::attacks::{join, Report};
use super::layout::{self, Role};
use super::map::Map;

/// Readers (threads, each its own connection).
pub const READERS: usize = 8;
const SPIN: Duration = Duration::from_micros(50);
const SLICE: Duration = Duration::from_millis(20);
const PREEMPTED: Duration = Duration::from_millis(30);

#[derive(Debug, PartialEq, Eq)]
enum Wait {
    Seq(u64),
    ProducerGone,
    Evicted,
    TimedOut,
}

fn futex_wait(word: &AtomicU32, val: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT (shared: no FUTEX_PRIVATE_FLAG) on a live, aligned
    // u32 of a shared mapping, with a valid relative timeout; it only reads
    // the word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            val,
            &ts as *const libc::timespec,
        )
    };
}

/// One reader: connect, then wait for frames until the ring ends; returns
/// how it ended.
fn reader(socket: &Path, k: usize, budget: Duration) -> String {
    let c = join(socket, 0, &format!("spec-reader-{k}"));
    let ctl = c.control();
    let own = Own::new(&c);
    let g = || ctl.read64(layout::CTRL_GLOBAL_SEQ).unwrap_or(0);
    let end = Instant::now() + budget;
    let mut after = g();
    loop {
        let deadline = (Instant::now() + Duration::from_secs(2)).min(end);
        match wait(&c, &ctl, &own, after, deadline, &g) {
            Wait::Seq(s) => after = s,
            Wait::ProducerGone => return "producer-gone".into(),
            Wait::Evicted => return "evicted".into(),
            Wait::TimedOut if Instant::now() >= end => return "timeout".into(),
            Wait::TimedOut => {}
        }
    }
}

/// What a v2 reader maps of its own: the publisher's table read-only (its
/// entry tells whether the lease holds) and its client region read-write
/// (cursor, `parked`, doorbell).
struct Own {
    table: Map,
    client: Map,
    entry: usize,
    generation: u32,
}

impl Own {
    fn new(c: &super::attacks::Conn) -> Own {
        let table_fd = c.fds.get(Role::Table).expect("a subscriber table");
        let table = Map::new(table_fd, layout::size_of_fd(table_fd), false).expect("mapping the table read-only");
        let client_fd = c.fds.get(Role::Client).expect("a client region");
        let client = Map::new(client_fd, layout::CLIENT_BYTES, true).expect("mapping the client region");
        let entry = layout::entry_offset(&table, c.welcome.index).expect("own entry");
        Own {
            table,
            client,
            entry,
            generation: c.welcome.generation,
        }
    }

    /// §15.1: the entry is `ACTIVE` with our generation.
    fn ours(&self) -> bool {
        self.table.read32(self.entry + layout::ENTRY_STATE) == Some(layout::STATE_ACTIVE)
            && self.table.read32(self.entry + layout::ENTRY_GENERATION) == Some(self.generation)
    }

    /// §15.1, when the entry is not ours or the socket is readable: the
    /// socket first, then the entry. `None`: the lease holds.
    fn decide(&self, c: &super::attacks::Conn) -> Option<Wait> {
        while transport::readable(c.sock.as_fd(), Duration::ZERO).unwrap_or(true) {
            match transport::recv(c.sock.as_fd(), Duration::ZERO) {
                Ok(Some(m)) => match Msg::decode(&m.bytes) {
                    Ok(Msg::Evicted(_)) => return Some(Wait::Evicted),
                    Ok(Msg::Bye) => return Some(Wait::ProducerGone),
                    _ => {}
                },
                Ok(None) => break,
                Err(_) => return Some(Wait::ProducerGone),
            }
        }
        (!self.ours()).then_some(Wait::Evicted)
    }
}

fn wait(c: &super::attacks::Conn, ctl: &Map, own: &Own, after: u64, deadline: Instant, g: &dyn Fn() -> u64) -> Wait {
    let doorbell: &AtomicU32 = own.client.u32(layout::CLIENT_DOORBELL).expect("doorbell");
    let parked: &AtomicU32 = own.client.u32(layout::CLIENT_PARKED).expect("parked");
    // 1.
    let s = g();
    if s > after {
        return Wait::Seq(s);
    }
    // 2.
    let spin_end = (Instant::now() + SPIN).min(deadline);
    while Instant::now() < spin_end {
        let s = g();
        if s > after {
            return Wait::Seq(s);
        }
        std::hint::spin_loop();
    }
    loop {
        // 3a.
        if ctl.read32(layout::CTRL_PRODUCER_STATE) == Some(layout::PRODUCER_CLOSED) {
            let s = g();
            return if s > after { Wait::Seq(s) } else { Wait::ProducerGone };
        }
        // 3b.
        let now = Instant::now();
        if now >= deadline {
            return Wait::TimedOut;
        }
        // 3c.
        parked.store(1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::SeqCst);
        // 3d.
        let bell = doorbell.load(Ordering::Acquire);
        let s = g();
        if s > after {
            parked.store(0, Ordering::Relaxed);
            return Wait::Seq(s);
        }
        // 3e.
        futex_wait(doorbell, bell, (deadline - now).min(SLICE));
        // 3f.
        parked.store(0, Ordering::Relaxed);
        let s = g();
        if s > after {
            return Wait::Seq(s);
        }
        // A reader may be preempted between any two steps; this one is, for
        // a while, between 3f and 3g (so the outcome does not hang on a race
        // with the publisher's close).
        std::thread::sleep(PREEMPTED);
        // 3g: the lease, decided as §15.1 says.
        if !own.ours() || transport::readable(c.sock.as_fd(), Duration::ZERO).unwrap_or(true) {
            if let Some(end) = own.decide(c) {
                return end;
            }
        }
    }
}

/// A lossless Sequential reader per §11 (pull, copy, validate after the
/// copy, release): reads one frame, holds until the publisher has evicted
/// it while frames keep coming (past the lease; the test says when, `hold`
/// at most), then reads again for a second. Records what its first read after the hold returned and how
/// many frames it delivered (and released into its entry) after that.
pub fn lossless(socket: &Path, hold: Duration, rep: &mut Report) {
    use vramring::seam::socket::msg;
    let c = join(socket, msg::HELLO_LOSSLESS | msg::HELLO_SEQUENTIAL, "spec-lossless");
    let ctl = c.control();
    let own = Own::new(&c);
    let pool_fd = c.fds.get(Role::Pool).expect("a pool");
    let pool = Map::new(pool_fd, layout::size_of_fd(pool_fd), false).expect("mapping the pool read-only");
    let (_, released_off) = layout::OWN_RELEASED;
    let g = || ctl.read64(layout::CTRL_GLOBAL_SEQ).unwrap_or(0);
    let slot_count = u64::from(ctl.read32(layout::CTRL_SLOT_COUNT).expect("slot_count")).max(1);
    let slots_off = ctl.read64(layout::CTRL_SLOTS_OFFSET).expect("slots_offset") as usize;
    let stride = ctl.read64(layout::CTRL_SLOT_STRIDE).expect("slot_stride") as usize;
    let frame = ctl.read64(layout::CTRL_FRAME_BYTES).expect("frame_bytes") as usize;
    // §4.2: a lossless reader starts at the cursor the publisher set.
    let mut last = own.client.read64(released_off).unwrap_or(0);
    let mut torn = 0u64;
    // One read; `Ok(seq)` delivered, `Err(end)` otherwise.
    let mut read = |last: &mut u64| -> Result<u64, &'static str> {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            // §11 step 0: the lease, at the start of every read.
            if !own.ours() {
                match own.decide(&c) {
                    Some(Wait::ProducerGone) => return Err("producer-gone"),
                    Some(_) => return Err("evicted"),
                    None => {}
                }
            }
            match wait(&c, &ctl, &own, *last, deadline, &g) {
                Wait::Seq(_) => {}
                Wait::ProducerGone => return Err("producer-gone"),
                Wait::Evicted => return Err("evicted"),
                Wait::TimedOut => return Err("timeout"),
            }
            let seq = *last + 1;
            let slot = slots_off + ((seq & (slot_count - 1)) as usize) * layout::SLOT_DESC_BYTES;
            let v = ctl.read64(slot).unwrap_or(0);
            if v & layout::SEQ_WRITING != 0 || v > seq {
                // 3: overwritten before we started (Sequential): dropped.
                *last = seq;
                continue;
            }
            if v < seq {
                continue;
            }
            let bytes = pool.copy_out(((seq & (slot_count - 1)) as usize) * stride, frame);
            std::sync::atomic::fence(Ordering::Acquire);
            if ctl.read64(slot).unwrap_or(0) != seq {
                // 6: overrun.
                *last = seq;
                continue;
            }
            if vramring_testkit::pattern::verify(&bytes, seq).is_err() {
                torn += 1;
            }
            // 7: deliver and release.
            *last = seq;
            own.client.write64(released_off, seq);
            return Ok(seq);
        }
    };
    let first = read(&mut last);
    rep.put("first", format!("{first:?}").replace(' ', "_"));
    super::attacks::hold_until_evicted(hold);
    let mut first_after = String::new();
    let mut after = 0u64;
    let end = Instant::now() + Duration::from_millis(1000);
    while Instant::now() < end {
        let r = read(&mut last);
        if first_after.is_empty() {
            first_after = match r {
                Ok(_) => "frame".into(),
                Err(e) => e.into(),
            };
        }
        match r {
            Ok(_) => after += 1,
            Err(_) => break,
        }
    }
    rep.put("first_read_after_hold", first_after);
    rep.put("frames_after_hold", after);
    rep.put("torn", torn);
}

/// Runs the readers until the ring ends (or `budget` passes).
pub fn run(socket: &Path, budget: Duration, rep: &mut Report) {
    let ends: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..READERS)
            .map(|k| s.spawn(move || reader(socket, k, budget)))
            .collect();
        hs.into_iter().map(|h| h.join().expect("spec reader thread")).collect()
    });
    for (k, e) in ends.iter().enumerate() {
        rep.put(&format!("reader{k}"), e);
    }
    let gone = ends.iter().filter(|e| *e == "producer-gone").count();
    rep.put("producer_gone", gone);
    rep.put("evicted", ends.iter().filter(|e| *e == "evicted").count());
}
