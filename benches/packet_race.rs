//! Two-process packet latency race: vramring's packet ring against iceoryx2
//! (crates.io), measured in the same run, cells interleaved.
//!
//! # Running
//!
//! ```text
//! cargo bench --features bench-iceoryx2 --bench packet_race -- \
//!     [--samples N] [--samples-large N] [--warmup N] [--rounds R] [--sizes 1k,64k,1m] \
//!     [--modes busy,block] [--transports vramring,vramring-copy,iceoryx2] \
//!     [--period-us N] [--period-large-us N] [--cpus A,B] [--ring-factor F] [--out FILE]
//! ```
//!
//! Defaults: 20 000 samples per cell below 1 MiB, 5 000 at 1 MiB and above
//! (`--samples` alone also caps the large count), 1 000 warm-up messages,
//! 3 rounds, sizes 1 KiB, 64 KiB, 1 MiB, one message every 100 µs below
//! 1 MiB and every 1 ms from 1 MiB. `--cpus A,B` pins the publisher to CPU
//! A and the receiver to CPU B (nothing is pinned by default).
//! `--ring-factor F` (default 4, at least 2) sizes the vramring ring to
//! `F * size` bytes (see the caveats).
//!
//! Build notes: iceoryx2 0.10 builds from crates.io with no system packages
//! on Linux (its `bindgen` build dependency only runs for QNX; libclang is
//! not needed). The feature keeps it out of normal builds and CI.
//!
//! # What is measured
//!
//! One-way latency publish → receive between two processes (this binary
//! re-executes itself as the receiving child, one child per cell). The
//! publisher prepares a `size`-byte buffer, writes its seq into bytes 8..16
//! and `seq ^ MAGIC` into the last 8 bytes, stamps `CLOCK_MONOTONIC` ns into
//! bytes 0..8, and only then calls the transport, so every transport call
//! is inside the measured window:
//!
//! * vramring: `PacketPublisher::write(&buf, PACKET_KEY)` (reserve, memcpy of
//!   `size` bytes into the ring, commit, futex wake of parked readers);
//! * iceoryx2: `loan_slice_uninit(size)` + `write_from_slice(&buf)` (memcpy of
//!   `size` bytes into the loaned chunk) + `send()`, and in blocking mode
//!   `Notifier::notify()` on an Event service of the same name.
//!
//! The receiver reads the stamp out of the payload as soon as it holds it,
//! then takes `now`; latency is `now - stamp`. Then it checks the length,
//! the seq, the last 8 bytes and the stamp; failures are counted (`bad`)
//! and not sampled, as are seq gaps (`lost`).
//!
//! * `vramring` (headline): zero-copy borrow. Busy: `try_borrow()` in a spin
//!   loop; block: `borrow(timeout)` with `spin(Duration::ZERO)`, i.e. park on
//!   the futex at once. The borrow is then `release()`d, which validates that
//!   the bytes stayed intact (a failed release counts as bad).
//! * `vramring-copy`: copy-out, `try_next_copy` / `next_copy` into a private
//!   `Vec` (the stamp is read from the copy, so the copy is in the window).
//! * `iceoryx2`: zero-copy `Sample<[u8]>`. Busy: `Subscriber::receive()` in a
//!   spin loop. Block: a `WaitSet` with the Event service's `Listener`
//!   attached (`wait_and_process_once_with_timeout`); in the callback it
//!   receives every pending sample, then drains the listener, then receives
//!   again (receiving before draining favours iceoryx2's latency; draining
//!   first, as the upstream example does, would add a syscall).
//!
//! Modes: `busy`: both sides spin (publisher spins until its next send
//! time, receiver polls). `block`: the publisher sleeps between sends and
//! the receiver blocks in the transport's wait.
//!
//! # Fairness caveats
//!
//! * Both publishers memcpy `size` bytes from the same prepared buffer each
//!   send; vramring could fill in place (`write_with`) and iceoryx2 could
//!   write straight into the loan, neither is used here.
//! * The vramring ring is `max(F * size, 64 KiB)` bytes (power of two, `F`
//!   = `--ring-factor`, default 4), 64 records, so consecutive packets land
//!   on different memory (a 4 MiB footprint at 1 MiB); iceoryx2 (one
//!   publisher, one subscriber) hands out recently freed chunks of its data
//!   segment, which are more likely cache-hot. At 1 MiB the publisher's
//!   memcpy dominates, so this shows; `--ring-factor 2` shrinks the ring.
//! * Queue depth is matched: iceoryx2's subscriber buffer (safe overflow on)
//!   is set to what the vramring ring holds (by default 63 packets at 1 KiB,
//!   3 at 64 KiB and 1 MiB). When the receiver falls behind (a starved
//!   CPU), both deliver a backlog late or drop the oldest; with unequal
//!   depths one transport would report late deliveries where the other
//!   reports losses. Lost messages are the late ones, so a cell with many
//!   `lost` under-reports its tail: it is measuring the scheduler.
//! * vramring's publisher also runs a socket-service thread (idle in steady
//!   state); iceoryx2 has none.
//! * On a 2-core machine busy mode uses both cores fully; any other load
//!   shows up as tail latency. Rounds (`--rounds`) repeat every cell and the
//!   median of per-round p50s is reported next to the pooled percentiles.
//! * The stamp is taken before the transport call on the publisher and after
//!   the first read of the payload on the receiver, on `CLOCK_MONOTONIC`
//!   (comparable across processes; ~20-30 ns per read via vDSO).
//!
//! # Output
//!
//! A markdown table (µs; pooled over rounds) with `iceoryx2 / vramring`
//! ratios of p50 and p99 against the vramring borrow row of the same size
//! and mode, then one JSON object per (transport, size, mode) line on
//! stdout (and into `--out FILE` if given).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Stdio};
use std::time::Duration;

use iceoryx2::prelude::*;
use iceoryx2::waitset::WaitSetRunResult;
use vramring::packet::{
    PacketMeta, PacketPublisher, PacketPublisherConfig, PacketRingConfig, PacketSubscriber, PacketSubscriberOptions,
    PACKET_KEY,
};

use common::output::{by_key, json_num};
use common::{median, now_ns, pct_us, procs, read_samples, wait_until_ns, write_samples, R};
use vramring_benches as common;

/// XORed with the seq into the payload's last 8 bytes.
const MAGIC: u64 = 0x7061_636b_6574_7261;
/// Smallest payload: stamp, seq, tail.
const MIN_SIZE: usize = 24;
/// Sizes from this one up use the large sample count and period.
const LARGE: usize = 1 << 20;
/// Records of the vramring ring.
const RECORDS: u32 = 64;

/// Data bytes of the vramring ring for `size`-byte packets:
/// `factor * size` rounded up to a power of two, at least 64 KiB.
fn ring_bytes(size: usize, factor: u64) -> u64 {
    (factor * size as u64).next_power_of_two().max(64 << 10)
}

/// Packets the vramring ring holds at once (packets never wrap, so one
/// fewer than fit), used as iceoryx2's subscriber buffer so both queue the
/// same backlog when the receiver falls behind.
fn queue_depth(size: usize, factor: u64) -> usize {
    (ring_bytes(size, factor) as usize / size)
        .saturating_sub(1)
        .clamp(1, RECORDS as usize)
}

/// A receiver that sees nothing for this long gives up.
const IDLE: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// vramring packet ring, zero-copy borrow.
    Vramring,
    /// vramring packet ring, copy-out.
    VramringCopy,
    /// iceoryx2 publish-subscribe (ipc service), zero-copy sample.
    Iceoryx2,
}

impl Transport {
    const ALL: [Transport; 3] = [Transport::Vramring, Transport::Iceoryx2, Transport::VramringCopy];

    fn name(self) -> &'static str {
        match self {
            Transport::Vramring => "vramring",
            Transport::VramringCopy => "vramring-copy",
            Transport::Iceoryx2 => "iceoryx2",
        }
    }

    fn parse(s: &str) -> R<Self> {
        by_key(&Transport::ALL, Transport::name, s)
            .ok_or_else(|| format!("unknown transport {s:?} (vramring, vramring-copy, iceoryx2)").into())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Busy,
    Block,
}

impl Mode {
    const ALL: [Mode; 2] = [Mode::Busy, Mode::Block];

    fn name(self) -> &'static str {
        match self {
            Mode::Busy => "busy",
            Mode::Block => "block",
        }
    }

    fn parse(s: &str) -> R<Self> {
        by_key(&Mode::ALL, Mode::name, s).ok_or_else(|| format!("unknown mode {s:?} (busy, block)").into())
    }
}

/// `1k`, `64K`, `1m`, `1048576`.
fn parse_size(s: &str) -> R<usize> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    let n = num.parse::<usize>()? * mul;
    if n < MIN_SIZE {
        return Err(format!("size {s} is below the {MIN_SIZE}-byte minimum").into());
    }
    Ok(n)
}

fn size_label(n: usize) -> String {
    if n >= 1 << 20 && n % (1 << 20) == 0 {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n % (1 << 10) == 0 {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

fn pin_to(cpu: usize) -> R<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).map_err(|e| format!("pinning to CPU {cpu}: {e}"))?;
    Ok(())
}

// ---------------------------------------------------------------- payload

/// The publisher's prepared buffer: constant filler, seq and tail updated
/// per message, stamp last.
struct Payload {
    buf: Vec<u8>,
}

impl Payload {
    fn new(size: usize) -> Self {
        Payload {
            buf: (0..size).map(|i| (i as u8).wrapping_mul(31).wrapping_add(7)).collect(),
        }
    }

    /// Writes seq and tail, then the stamp; returns the buffer to send.
    fn stamp(&mut self, seq: u64) -> &[u8] {
        let n = self.buf.len();
        self.buf[8..16].copy_from_slice(&seq.to_le_bytes());
        self.buf[n - 8..].copy_from_slice(&(seq ^ MAGIC).to_le_bytes());
        self.buf[..8].copy_from_slice(&now_ns().to_le_bytes());
        &self.buf
    }
}

/// What the receiver saw in one payload.
struct Seen {
    latency_ns: u64,
    seq: u64,
    ok: bool,
}

/// Reads the stamp, takes `now`, then checks the rest.
///
/// # Safety
/// `p` must be valid for reads of `len` bytes for the duration of the call
/// (the bytes may change concurrently: they are read with unaligned raw
/// reads, never through a reference, and only used as plain integers).
unsafe fn inspect(p: *const u8, len: usize, size: usize) -> Seen {
    if len != size || len < MIN_SIZE {
        return Seen {
            latency_ns: 0,
            seq: u64::MAX,
            ok: false,
        };
    }
    // SAFETY: `len >= MIN_SIZE`, so offsets 0, 8 and `len - 8` each have 8
    // readable bytes (caller's contract); unaligned reads of plain integers.
    let (stamp, now, seq, tail) = unsafe {
        let stamp = u64::from_le(p.cast::<u64>().read_unaligned());
        let now = now_ns();
        let seq = u64::from_le(p.add(8).cast::<u64>().read_unaligned());
        let tail = u64::from_le(p.add(len - 8).cast::<u64>().read_unaligned());
        (stamp, now, seq, tail)
    };
    let ok = tail == seq ^ MAGIC && stamp != 0 && stamp <= now;
    Seen {
        latency_ns: now.saturating_sub(stamp),
        seq,
        ok,
    }
}

fn inspect_slice(b: &[u8], size: usize) -> Seen {
    // SAFETY: `b` is a live slice of `b.len()` bytes.
    unsafe { inspect(b.as_ptr(), b.len(), size) }
}

// ---------------------------------------------------------------- receiver (child)

struct ChildArgs {
    transport: Transport,
    mode: Mode,
    size: usize,
    warmup: u64,
    samples: u64,
    endpoint: String,
    result: PathBuf,
    cpu: Option<usize>,
}

impl ChildArgs {
    fn to_args(&self) -> Vec<String> {
        vec![
            "--child".into(),
            self.transport.name().into(),
            self.mode.name().into(),
            self.size.to_string(),
            self.warmup.to_string(),
            self.samples.to_string(),
            self.endpoint.clone(),
            self.result.display().to_string(),
            self.cpu.map_or("-".into(), |c| c.to_string()),
        ]
    }

    fn parse(a: &[String]) -> R<Self> {
        if a.len() != 8 {
            return Err(format!("--child takes 8 arguments, got {}", a.len()).into());
        }
        Ok(ChildArgs {
            transport: Transport::parse(&a[0])?,
            mode: Mode::parse(&a[1])?,
            size: a[2].parse()?,
            warmup: a[3].parse()?,
            samples: a[4].parse()?,
            endpoint: a[5].clone(),
            result: PathBuf::from(&a[6]),
            cpu: if a[7] == "-" { None } else { Some(a[7].parse()?) },
        })
    }

    fn total(&self) -> u64 {
        self.warmup + self.samples
    }
}

/// The receiver's tally.
struct Rx {
    warmup: u64,
    total: u64,
    lat: Vec<u64>,
    received: u64,
    bad: u64,
    lost: u64,
    /// Payloads the transport vouched for (copy validated, borrow released
    /// intact) whose bytes were wrong or out of order. Must be 0.
    torn: u64,
    next: u64,
    last_ns: u64,
    done: bool,
    /// Busy polls that found nothing.
    polls: u32,
}

impl Rx {
    fn new(a: &ChildArgs) -> Self {
        Rx {
            warmup: a.warmup,
            total: a.total(),
            lat: Vec::with_capacity(a.samples as usize),
            received: 0,
            bad: 0,
            lost: 0,
            torn: 0,
            next: 0,
            last_ns: now_ns(),
            done: false,
            polls: 0,
        }
    }

    /// Records one payload; `intact` is the transport's own verdict.
    fn got(&mut self, s: Seen, intact: bool) {
        self.last_ns = now_ns();
        if !intact {
            // Detected by the transport (a failed release): a lost payload.
            self.bad += 1;
            return;
        }
        if !s.ok || s.seq < self.next || s.seq >= self.total {
            // Delivered as whole but wrong: a torn or misordered payload.
            self.torn += 1;
            return;
        }
        self.received += 1;
        self.lost += s.seq - self.next;
        self.next = s.seq + 1;
        if s.seq >= self.warmup {
            self.lat.push(s.latency_ns);
        }
        if self.next == self.total {
            self.done = true;
        }
    }

    /// A transport error that loses a payload (overrun).
    fn failed(&mut self) {
        self.last_ns = now_ns();
        self.bad += 1;
    }

    /// A busy poll found nothing: spins, and every 4096 of them sees
    /// whether the sender went [`IDLE`].
    fn nothing(&mut self) {
        std::hint::spin_loop();
        self.polls = self.polls.wrapping_add(1);
        if self.polls % 4096 == 0 {
            self.idle();
        }
    }

    /// Nothing came for [`IDLE`]: give up.
    fn idle(&mut self) -> bool {
        if now_ns().saturating_sub(self.last_ns) > IDLE.as_nanos() as u64 {
            self.done = true;
        }
        self.done
    }

    fn finish(self, path: &Path) -> R<()> {
        write_samples(path, &self.lat)?;
        // Seqs never seen at the end count as lost too.
        let lost = self.lost + (self.total - self.next);
        let mut out = std::io::stdout().lock();
        writeln!(out, "done {} {} {} {}", self.received, self.bad, lost, self.torn)?;
        out.flush()?;
        Ok(())
    }
}

fn signal_ready() -> R<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    Ok(())
}

fn child_main(a: &ChildArgs) -> R<()> {
    if let Some(cpu) = a.cpu {
        pin_to(cpu)?;
    }
    match a.transport {
        Transport::Vramring | Transport::VramringCopy => child_vramring(a),
        Transport::Iceoryx2 => child_iceoryx2(a),
    }
}

fn child_vramring(a: &ChildArgs) -> R<()> {
    let mut opts = PacketSubscriberOptions::new().name("packet-race");
    if a.mode == Mode::Block {
        opts = opts.spin(Duration::ZERO);
    }
    let mut sub = PacketSubscriber::connect(&a.endpoint, opts)?;
    signal_ready()?;
    let mut rx = Rx::new(a);
    let mut buf = Vec::with_capacity(a.size);
    while !rx.done {
        match (a.transport, a.mode) {
            (Transport::Vramring, Mode::Busy) => match sub.try_borrow() {
                Ok(Some(b)) => {
                    // SAFETY: `as_ptr` is valid for `len` bytes while the
                    // borrow lives; `inspect` reads them with raw reads.
                    let s = unsafe { inspect(b.as_ptr(), b.len(), a.size) };
                    let intact = b.release().is_ok();
                    rx.got(s, intact);
                }
                Ok(None) => rx.nothing(),
                Err(vramring::Error::PacketOverrun { .. }) => rx.failed(),
                Err(e) => return Err(e.into()),
            },
            (Transport::Vramring, Mode::Block) => match sub.borrow(IDLE) {
                Ok(b) => {
                    // SAFETY: `as_ptr` is valid for `len` bytes while the
                    // borrow `b` lives (it is released after this line).
                    let s = unsafe { inspect(b.as_ptr(), b.len(), a.size) };
                    let intact = b.release().is_ok();
                    rx.got(s, intact);
                }
                Err(vramring::Error::Timeout(..)) => rx.done = true,
                Err(vramring::Error::PacketOverrun { .. }) => rx.failed(),
                Err(e) => return Err(e.into()),
            },
            (_, Mode::Busy) => match sub.try_next_copy(&mut buf) {
                Ok(Some(_)) => rx.got(inspect_slice(&buf, a.size), true),
                Ok(None) => rx.nothing(),
                Err(vramring::Error::PacketOverrun { .. }) => rx.failed(),
                Err(e) => return Err(e.into()),
            },
            (_, Mode::Block) => match sub.next_copy(&mut buf, IDLE) {
                Ok(_) => rx.got(inspect_slice(&buf, a.size), true),
                Err(vramring::Error::Timeout(..)) => rx.done = true,
                Err(vramring::Error::PacketOverrun { .. }) => rx.failed(),
                Err(e) => return Err(e.into()),
            },
        }
    }
    rx.finish(&a.result)
}

fn iox_name(endpoint: &str) -> R<ServiceName> {
    Ok(ServiceName::new(endpoint)?)
}

fn child_iceoryx2(a: &ChildArgs) -> R<()> {
    set_log_level(LogLevel::Error);
    let node = NodeBuilder::new().create::<ipc::Service>()?;
    let name = iox_name(&a.endpoint)?;
    let service = node.service_builder(&name).publish_subscribe::<[u8]>().open()?;
    let subscriber = service.subscriber_builder().create()?;
    let mut rx = Rx::new(a);
    match a.mode {
        Mode::Busy => {
            signal_ready()?;
            while !rx.done {
                match subscriber.receive()? {
                    Some(sample) => {
                        let s = inspect_slice(sample.payload(), a.size);
                        drop(sample);
                        rx.got(s, true);
                    }
                    None => rx.nothing(),
                }
            }
        }
        Mode::Block => {
            let event = node.service_builder(&name).event().open()?;
            let listener = event.listener_builder().create()?;
            let waitset = WaitSetBuilder::new().create::<ipc::Service>()?;
            let guard = waitset.attach_notification(&listener)?;
            signal_ready()?;
            let mut err: Option<Box<dyn std::error::Error + Send + Sync>> = None;
            while !rx.done && err.is_none() {
                let receive_all = |rx: &mut Rx| -> R<()> {
                    while let Some(sample) = subscriber.receive()? {
                        let s = inspect_slice(sample.payload(), a.size);
                        drop(sample);
                        rx.got(s, true);
                    }
                    Ok(())
                };
                let on_event = |id: WaitSetAttachmentId<ipc::Service>| {
                    if id.has_event_from(&guard) {
                        let r = receive_all(&mut rx)
                            .and_then(|()| listener.try_wait(|_| {}).map(drop).map_err(Into::into))
                            .and_then(|()| receive_all(&mut rx));
                        if let Err(e) = r {
                            err = Some(e);
                            return CallbackProgression::Stop;
                        }
                    }
                    CallbackProgression::Continue
                };
                match waitset.wait_and_process_once_with_timeout(on_event, IDLE)? {
                    WaitSetRunResult::AllEventsHandled | WaitSetRunResult::StopRequest => {}
                    WaitSetRunResult::Interrupt | WaitSetRunResult::TerminationRequest => break,
                }
                rx.idle();
            }
            if let Some(e) = err {
                return Err(e);
            }
        }
    }
    rx.finish(&a.result)
}

// ---------------------------------------------------------------- publisher (parent)

/// One transport's sending half.
trait Sender {
    fn send(&mut self, buf: &[u8]) -> R<()>;
}

struct VramringTx(PacketPublisher);

impl Sender for VramringTx {
    fn send(&mut self, buf: &[u8]) -> R<()> {
        let meta = PacketMeta {
            flags: PACKET_KEY,
            ..Default::default()
        };
        self.0.write(buf, meta)?;
        Ok(())
    }
}

struct IceoryxTx {
    publisher: iceoryx2::port::publisher::Publisher<ipc::Service, [u8], ()>,
    notifier: Option<iceoryx2::port::notifier::Notifier<ipc::Service>>,
}

impl Sender for IceoryxTx {
    fn send(&mut self, buf: &[u8]) -> R<()> {
        let sample = self.publisher.loan_slice_uninit(buf.len())?;
        sample.write_from_slice(buf).send()?;
        if let Some(n) = &self.notifier {
            n.notify()?;
        }
        Ok(())
    }
}

struct Opts {
    samples: u64,
    samples_large: u64,
    warmup: u64,
    rounds: usize,
    sizes: Vec<usize>,
    modes: Vec<Mode>,
    transports: Vec<Transport>,
    period_us: u64,
    period_large_us: u64,
    cpus: Option<(usize, usize)>,
    ring_factor: u64,
    out: Option<PathBuf>,
}

impl Opts {
    fn parse(args: &[String]) -> R<Self> {
        let mut o = Opts {
            samples: 20_000,
            samples_large: 5_000,
            warmup: 1_000,
            rounds: 3,
            sizes: vec![1 << 10, 64 << 10, 1 << 20],
            modes: Mode::ALL.to_vec(),
            transports: Transport::ALL.to_vec(),
            period_us: 100,
            period_large_us: 1_000,
            cpus: None,
            ring_factor: 4,
            out: None,
        };
        let mut large_set = false;
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut val = || it.next().ok_or_else(|| format!("{a} needs a value"));
            match a.as_str() {
                "--samples" => o.samples = val()?.parse()?,
                "--samples-large" => {
                    o.samples_large = val()?.parse()?;
                    large_set = true;
                }
                "--warmup" => o.warmup = val()?.parse()?,
                "--rounds" => o.rounds = val()?.parse()?,
                "--sizes" => o.sizes = val()?.split(',').map(parse_size).collect::<R<_>>()?,
                "--modes" => o.modes = val()?.split(',').map(Mode::parse).collect::<R<_>>()?,
                "--transports" => o.transports = val()?.split(',').map(Transport::parse).collect::<R<_>>()?,
                "--period-us" => o.period_us = val()?.parse()?,
                "--period-large-us" => o.period_large_us = val()?.parse()?,
                "--cpus" => {
                    let v = val()?;
                    let (a, b) = v.split_once(',').ok_or("--cpus takes A,B")?;
                    o.cpus = Some((a.parse()?, b.parse()?));
                }
                "--ring-factor" => o.ring_factor = val()?.parse()?,
                "--out" => o.out = Some(PathBuf::from(val()?)),
                "-h" | "--help" => {
                    println!(
                        "packet_race [--samples N] [--samples-large N] [--warmup N] [--rounds R] [--sizes 1k,64k,1m] \
                         [--modes busy,block] [--transports vramring,vramring-copy,iceoryx2] [--period-us N] \
                         [--period-large-us N] [--cpus A,B] [--ring-factor F] [--out FILE]"
                    );
                    std::process::exit(0);
                }
                other => return Err(format!("unknown argument {other:?} (try --help)").into()),
            }
        }
        if !large_set {
            o.samples_large = o.samples_large.min(o.samples);
        }
        if o.ring_factor < 2 {
            return Err("--ring-factor must be at least 2 (the ring needs 2 * max_packet)".into());
        }
        if o.rounds == 0 || o.samples == 0 || o.samples_large == 0 {
            return Err("--rounds and sample counts must be at least 1".into());
        }
        Ok(o)
    }

    fn samples_for(&self, size: usize) -> u64 {
        if size >= LARGE {
            self.samples_large
        } else {
            self.samples
        }
    }

    fn period_for(&self, size: usize) -> Duration {
        Duration::from_micros(if size >= LARGE {
            self.period_large_us
        } else {
            self.period_us
        })
    }
}

/// What one cell (one child) produced.
struct CellRun {
    lat: Vec<u64>,
    received: u64,
    bad: u64,
    lost: u64,
    torn: u64,
}

/// Sends `total` paced messages.
fn publish_loop(tx: &mut dyn Sender, size: usize, total: u64, period: Duration, mode: Mode) -> R<()> {
    let mut payload = Payload::new(size);
    let period_ns = period.as_nanos() as u64;
    // Let the child settle into its wait.
    std::thread::sleep(Duration::from_millis(20));
    let mut due = now_ns();
    for seq in 0..total {
        wait_until_ns(due, mode == Mode::Busy);
        tx.send(payload.stamp(seq))?;
        // Relative pacing: a late send never causes a burst.
        due = now_ns() + period_ns;
    }
    Ok(())
}

fn read_line(out: &mut BufReader<ChildStdout>) -> R<String> {
    let mut line = String::new();
    if out.read_line(&mut line)? == 0 {
        return Err("the receiver exited early".into());
    }
    Ok(line.trim().to_owned())
}

struct Spawned {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Spawned {
    fn start(a: &ChildArgs) -> R<Self> {
        let mut child = procs::self_command(a.to_args())?
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let out = BufReader::new(child.stdout.take().ok_or("no child stdout")?);
        let mut s = Spawned { child, out };
        match read_line(&mut s.out) {
            Ok(l) if l == "ready" => Ok(s),
            Ok(l) => Err(format!("receiver said {l:?} instead of ready").into()),
            Err(e) => {
                let _ = s.child.wait();
                Err(e)
            }
        }
    }

    fn finish(mut self, result: &Path) -> R<CellRun> {
        let line = read_line(&mut self.out);
        let status = self.child.wait()?;
        let line = line?;
        if !status.success() {
            return Err(format!("receiver failed: {status}").into());
        }
        let f: Vec<u64> = line
            .strip_prefix("done ")
            .ok_or_else(|| format!("receiver said {line:?}"))?
            .split(' ')
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        let [received, bad, lost, torn] = f[..] else {
            return Err(format!("receiver said {line:?}").into());
        };
        let lat = read_samples(result)?;
        let _ = std::fs::remove_file(result);
        Ok(CellRun {
            lat,
            received,
            bad,
            lost,
            torn,
        })
    }
}

fn run_cell(o: &Opts, dir: &Path, id: usize, t: Transport, mode: Mode, size: usize) -> R<CellRun> {
    let samples = o.samples_for(size);
    let pid = std::process::id();
    let result = dir.join(format!("cell-{id}.lat"));
    let mut a = ChildArgs {
        transport: t,
        mode,
        size,
        warmup: o.warmup,
        samples,
        endpoint: String::new(),
        result: result.clone(),
        cpu: o.cpus.map(|c| c.1),
    };
    let total = a.total();
    let period = o.period_for(size);
    match t {
        Transport::Vramring | Transport::VramringCopy => {
            let sock = dir.join(format!("cell-{id}.sock"));
            a.endpoint = sock.display().to_string();
            let ring = PacketRingConfig::new(ring_bytes(size, o.ring_factor), RECORDS, size as u32);
            let mut tx = VramringTx(PacketPublisher::create(&sock, PacketPublisherConfig::new(ring))?);
            let child = Spawned::start(&a)?;
            publish_loop(&mut tx, size, total, period, mode)?;
            let run = child.finish(&result);
            drop(tx);
            let _ = std::fs::remove_file(&sock);
            run
        }
        Transport::Iceoryx2 => {
            a.endpoint = format!("vramring-packet-race/{pid}/{id}");
            let name = iox_name(&a.endpoint)?;
            let node = NodeBuilder::new().create::<ipc::Service>()?;
            let service = node
                .service_builder(&name)
                .publish_subscribe::<[u8]>()
                .max_publishers(1)
                .max_subscribers(1)
                .history_size(0)
                .subscriber_max_buffer_size(queue_depth(size, o.ring_factor))
                .enable_safe_overflow(true)
                .create()?;
            let publisher = service
                .publisher_builder()
                .initial_max_slice_len(size)
                .allocation_strategy(AllocationStrategy::Static)
                .create()?;
            // The Event service lives as long as `_event` (and its notifier).
            let (_event, notifier) = match mode {
                Mode::Busy => (None, None),
                Mode::Block => {
                    let event = node
                        .service_builder(&name)
                        .event()
                        .max_notifiers(1)
                        .max_listeners(1)
                        .create()?;
                    let notifier = event.notifier_builder().create()?;
                    (Some(event), Some(notifier))
                }
            };
            let mut tx = IceoryxTx { publisher, notifier };
            let child = Spawned::start(&a)?;
            publish_loop(&mut tx, size, total, period, mode)?;
            child.finish(&result)
        }
    }
}

// ---------------------------------------------------------------- statistics and output

#[derive(Debug, Clone, Copy)]
struct Stats {
    n: usize,
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
    mean: f64,
}

fn stats(lat: &[u64]) -> Option<Stats> {
    if lat.is_empty() {
        return None;
    }
    let mut v = lat.to_vec();
    v.sort_unstable();
    Some(Stats {
        n: v.len(),
        p50: pct_us(&v, 0.50),
        p90: pct_us(&v, 0.90),
        p99: pct_us(&v, 0.99),
        max: pct_us(&v, 1.0),
        mean: v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64 / 1000.0,
    })
}

/// One (transport, size, mode) pooled over rounds.
struct Cell {
    t: Transport,
    size: usize,
    mode: Mode,
    lat: Vec<u64>,
    round_p50: Vec<f64>,
    received: u64,
    bad: u64,
    lost: u64,
    torn: u64,
    errors: Vec<String>,
}

impl Cell {
    fn stats(&self) -> Option<Stats> {
        stats(&self.lat)
    }

    fn round_median(&self) -> f64 {
        median(&mut self.round_p50.clone())
    }
}

fn f2(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}")
    } else {
        "-".into()
    }
}

/// p50 and p99 of `c` over those of the vramring borrow cell of the same
/// size and mode.
fn ratios(cells: &[Cell], c: &Cell) -> Option<(f64, f64)> {
    if c.t == Transport::Vramring {
        return None;
    }
    let base = cells
        .iter()
        .find(|b| b.t == Transport::Vramring && b.size == c.size && b.mode == c.mode)?
        .stats()?;
    let s = c.stats()?;
    Some((s.p50 / base.p50, s.p99 / base.p99))
}

fn report(o: &Opts, cells: &[Cell]) -> R<()> {
    println!();
    println!(
        "| transport | size | mode | samples | bad | lost | torn | p50 µs | p90 µs | p99 µs | max µs | mean µs | p50 median of {} rounds µs | vs vramring p50 | vs vramring p99 |",
        o.rounds
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for c in cells {
        let (r50, r99) = ratios(cells, c).map_or(("-".into(), "-".into()), |(a, b)| (f2(a), f2(b)));
        match c.stats() {
            Some(s) => println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                c.t.name(),
                size_label(c.size),
                c.mode.name(),
                s.n,
                c.bad,
                c.lost,
                c.torn,
                f2(s.p50),
                f2(s.p90),
                f2(s.p99),
                f2(s.max),
                f2(s.mean),
                f2(c.round_median()),
                r50,
                r99
            ),
            None => println!(
                "| {} | {} | {} | 0 | {} | {} | {} | - | - | - | - | - | - | - | - |",
                c.t.name(),
                size_label(c.size),
                c.mode.name(),
                c.bad,
                c.lost,
                c.torn
            ),
        }
    }
    let failures: u64 = cells.iter().map(|c| c.bad).sum();
    let lost: u64 = cells.iter().map(|c| c.lost).sum();
    println!();
    let torn: u64 = cells.iter().map(|c| c.torn).sum();
    println!(
        "payloads lost to an overrun the transport detected (bad): {failures}; seq gaps (lost): {lost}; \
         torn (delivered as whole but wrong, must be 0): {torn}"
    );
    for c in cells {
        for e in &c.errors {
            println!("error: {} {} {}: {e}", c.t.name(), size_label(c.size), c.mode.name());
        }
    }
    println!();
    let mut lines = String::new();
    for c in cells {
        let s = c.stats();
        let g = |f: fn(&Stats) -> f64| s.as_ref().map_or("null".into(), |s| json_num(f(s)));
        let (r50, r99) = ratios(cells, c).map_or(("null".into(), "null".into()), |(a, b)| (json_num(a), json_num(b)));
        let rounds: Vec<String> = c.round_p50.iter().map(|&x| json_num(x)).collect();
        lines.push_str(&format!(
            "{{\"bench\":\"packet_race\",\"transport\":\"{}\",\"size\":{},\"mode\":\"{}\",\"samples\":{},\"received\":{},\"bad\":{},\"lost\":{},\"torn\":{},\"p50_us\":{},\"p90_us\":{},\"p99_us\":{},\"max_us\":{},\"mean_us\":{},\"round_p50_us\":[{}],\"round_p50_median_us\":{},\"ratio_p50_vs_vramring\":{},\"ratio_p99_vs_vramring\":{},\"errors\":{}}}\n",
            c.t.name(),
            c.size,
            c.mode.name(),
            s.map_or(0, |s| s.n),
            c.received,
            c.bad,
            c.lost,
            c.torn,
            g(|s| s.p50),
            g(|s| s.p90),
            g(|s| s.p99),
            g(|s| s.max),
            g(|s| s.mean),
            rounds.join(","),
            json_num(c.round_median()),
            r50,
            r99,
            c.errors.len()
        ));
    }
    print!("{lines}");
    if let Some(path) = &o.out {
        std::fs::write(path, &lines)?;
    }
    Ok(())
}

fn main() -> R<()> {
    // `cargo bench` appends `--bench`.
    let args = common::output::args();
    if args.first().map(String::as_str) == Some("--child") {
        return child_main(&ChildArgs::parse(&args[1..])?);
    }
    let o = Opts::parse(&args)?;
    set_log_level(LogLevel::Error);
    // Counted before pinning (pinning leaves this process one CPU).
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    if let Some((cpu, _)) = o.cpus {
        pin_to(cpu)?;
    }
    eprintln!(
        "packet_race: {} cores, sizes {:?}, modes {:?}, transports {:?}, {} rounds, {} samples (<1 MiB) / {} (>=1 MiB), {} warm-up, period {} µs / {} µs, cpus {:?}",
        cores,
        o.sizes.iter().map(|&s| size_label(s)).collect::<Vec<_>>(),
        o.modes.iter().map(|m| m.name()).collect::<Vec<_>>(),
        o.transports.iter().map(|t| t.name()).collect::<Vec<_>>(),
        o.rounds,
        o.samples,
        o.samples_large,
        o.warmup,
        o.period_us,
        o.period_large_us,
        o.cpus
    );
    if cores < 2 {
        eprintln!("packet_race: fewer than 2 cores; busy mode will time-share one core");
    }
    let dir = std::env::temp_dir().join(format!("vramring-packet-race-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;

    // Table order: per size, per mode, transports in `Transport::ALL` order.
    let mut cells = Vec::new();
    for &size in &o.sizes {
        for &mode in &o.modes {
            for t in Transport::ALL {
                if o.transports.contains(&t) {
                    cells.push(Cell {
                        t,
                        size,
                        mode,
                        lat: Vec::new(),
                        round_p50: Vec::new(),
                        received: 0,
                        bad: 0,
                        lost: 0,
                        torn: 0,
                        errors: Vec::new(),
                    });
                }
            }
        }
    }
    let mut id = 0;
    for round in 0..o.rounds {
        for c in cells.iter_mut() {
            id += 1;
            match run_cell(&o, &dir, id, c.t, c.mode, c.size) {
                Ok(r) => {
                    let s = stats(&r.lat);
                    eprintln!(
                        "round {}/{}: {:>13} {:>7} {:>5}: n {:>6} bad {} lost {} p50 {} p99 {} µs",
                        round + 1,
                        o.rounds,
                        c.t.name(),
                        size_label(c.size),
                        c.mode.name(),
                        r.lat.len(),
                        r.bad,
                        r.lost,
                        s.map_or("-".into(), |s| f2(s.p50)),
                        s.map_or("-".into(), |s| f2(s.p99)),
                    );
                    if let Some(s) = s {
                        c.round_p50.push(s.p50);
                    }
                    c.lat.extend_from_slice(&r.lat);
                    c.received += r.received;
                    c.bad += r.bad;
                    c.torn += r.torn;
                    c.lost += r.lost;
                }
                Err(e) => {
                    eprintln!(
                        "round {}/{}: {} {} {}: error: {e}",
                        round + 1,
                        o.rounds,
                        c.t.name(),
                        size_label(c.size),
                        c.mode.name()
                    );
                    c.errors.push(e.to_string());
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    report(&o, &cells)?;
    let torn: u64 = cells.iter().map(|c| c.torn).sum();
    if torn > 0 {
        return Err(format!("{torn} payloads were delivered as whole but wrong").into());
    }
    Ok(())
}
