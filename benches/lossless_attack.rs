//! What lossless stallers cost a 30 fps lossless producer and its honest
//! readers (ADR 0024): the producer's publish rate and each honest reader's
//! delivered rate over one window, with no attack, under N lossless
//! connections that stall at once, and under a staller that reconnects
//! (lossless) on several connections each time one is evicted.
//!
//! Host backend, NV12 320×240, 8 slots, `Policy::Lossless`, the default
//! lease (1 s) and back-off (10 s, doubled per repeat). Honest readers: a
//! lossless sequential reader and a latest reader (threads of this
//! process, `Subscriber`s). Stallers: raw connections (Hello `LOSSLESS`,
//! then nothing: their cursor stays where it started) that wait for their
//! `Evicted`; the reconnecting one connects again at once, and 100 ms after
//! a refusal. The last row is the reconnecting staller against a
//! publisher without back-off, for comparison. Each scenario runs on a fresh publisher, `--rounds` times;
//! the table gives the median of each rate and its ratio to the median
//! rate with no attack.
//!
//! `cargo bench -p vramring-benches --bench lossless_attack -- [--window-s 30] [--rounds 3] [--stallers 8] [--connections 3] [--out FILE]`
//! (`--out`: JSON lines, one a round and scenario; a relative path is taken
//! from `benches/`, where cargo runs a bench).

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vramring::seam::socket::msg::{self, Hello, Msg};
use vramring::seam::socket::transport;
use vramring::{
    ClientOptions, Error as RingError, Format, FrameMeta, Mode, Policy, Publisher, RingConfig, ServeOptions,
    Subscriber, SubscriberOptions,
};
use vramring_benches::{median, output, R};

const FPS: f64 = 30.0;

/// A scenario: what attacks the ring during the window.
#[derive(Debug, Clone, Copy)]
enum Attack {
    None,
    /// This many lossless connections that stall at once.
    AtOnce(usize),
    /// A staller that reconnects on this many connections; with the
    /// publisher's back-off on (the default) or off.
    Reconnecting(usize, bool),
}

impl Attack {
    fn name(self) -> String {
        match self {
            Attack::None => "no attack".into(),
            Attack::AtOnce(n) => format!("{n} lossless stallers at once"),
            Attack::Reconnecting(n, true) => format!("a staller reconnecting on {n} connections"),
            Attack::Reconnecting(n, false) => format!("a staller reconnecting on {n} connections, back-off off"),
        }
    }
}

/// Rates over one window (frames per second).
#[derive(Debug, Clone, Copy, Default)]
struct Rates {
    producer: f64,
    lossless: f64,
    latest: f64,
    evictions: u64,
    refused: u64,
}

/// A raw lossless connection: Hello, Welcome (its descriptors dropped: the
/// cursor the publisher reads stays where it started), then silence.
/// `Err(code)` when refused.
fn stall_connect(socket: &Path) -> R<std::result::Result<OwnedFd, u32>> {
    let sock = transport::connect(socket)?;
    let hello = Msg::Hello(Hello {
        flags: msg::HELLO_LOSSLESS,
        backends: 1 << vramring::seam::layout::BACKEND_HOST,
        name: "staller".into(),
        device_uuid: [0; 16],
    });
    transport::send(sock.as_fd(), &hello.encode(), &[])?;
    let m = transport::recv(sock.as_fd(), Duration::from_secs(5))?.ok_or("no answer to Hello")?;
    match Msg::decode(&m.bytes)? {
        Msg::Welcome(_) => Ok(Ok(sock)),
        Msg::Reject(n) => Ok(Err(n.code)),
        other => Err(format!("unexpected answer {other:?}").into()),
    }
}

/// Waits on a staller's socket until the publisher closes it or `stop`.
fn until_closed(sock: &OwnedFd, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match transport::recv(sock.as_fd(), Duration::from_millis(50)) {
            Ok(None) => continue,
            _ => return,
        }
    }
}

/// A reader thread counting what it is delivered.
fn reader(socket: PathBuf, lossless: bool, count: Arc<AtomicU64>, stop: Arc<AtomicBool>) -> JoinHandle<R<()>> {
    std::thread::spawn(move || {
        let opts = SubscriberOptions::default()
            .name(if lossless { "honest-lossless" } else { "honest-latest" })
            .mode(if lossless { Mode::Sequential } else { Mode::Latest })
            .lossless(lossless)
            .connect_timeout(Duration::from_secs(5));
        let mut sub = Subscriber::connect(&socket, opts)?;
        while !stop.load(Ordering::Relaxed) {
            match sub.next(Duration::from_millis(200)) {
                // The copy is done when `next` returns: a lossless
                // reader has released the frame then.
                Ok(_) => {
                    count.fetch_add(1, Ordering::Relaxed);
                }
                Err(RingError::Timeout { .. }) => continue,
                Err(RingError::ProducerGone { .. }) => break,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    })
}

/// The attacker's threads, started at the window's start.
fn attack(socket: &Path, a: Attack, stop: &Arc<AtomicBool>) -> Vec<JoinHandle<R<u64>>> {
    match a {
        Attack::None => Vec::new(),
        Attack::AtOnce(n) => {
            let (socket, stop) = (socket.to_owned(), Arc::clone(stop));
            vec![std::thread::spawn(move || {
                let mut conns = Vec::new();
                for _ in 0..n {
                    if let Ok(s) = stall_connect(&socket)? {
                        conns.push(s);
                    }
                }
                for c in &conns {
                    until_closed(c, &stop);
                }
                Ok(0)
            })]
        }
        Attack::Reconnecting(n, _) => (0..n)
            .map(|_| {
                let (socket, stop) = (socket.to_owned(), Arc::clone(stop));
                std::thread::spawn(move || {
                    let mut refused = 0;
                    while !stop.load(Ordering::Relaxed) {
                        match stall_connect(&socket)? {
                            Ok(s) => until_closed(&s, &stop),
                            Err(_) => {
                                refused += 1;
                                std::thread::sleep(Duration::from_millis(100));
                            }
                        }
                    }
                    Ok(refused)
                })
            })
            .collect(),
    }
}

/// One scenario on a fresh publisher: warm-up, then `window` measured with
/// the attack running.
fn scenario(dir: &Path, k: usize, a: Attack, window: Duration) -> R<Rates> {
    let socket = dir.join(format!("lossless-attack-{k}.sock"));
    let cfg = RingConfig::new(Format::Nv12, 320, 240)
        .slots(8)
        .policy(Policy::Lossless)
        .backend(vramring::BackendChoice::Host);
    let cfg = match a {
        Attack::Reconnecting(_, false) => cfg.no_lossless_backoff(),
        _ => cfg,
    };
    let mut publisher = Publisher::create(&socket, cfg)?;
    let stop = Arc::new(AtomicBool::new(false));
    let (lossless, latest) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let readers = [
        reader(socket.clone(), true, Arc::clone(&lossless), Arc::clone(&stop)),
        reader(socket.clone(), false, Arc::clone(&latest), Arc::clone(&stop)),
    ];
    while publisher.stats().subscribers < 2 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let period = Duration::from_secs_f64(1.0 / FPS);
    let start = Instant::now();
    let warm = start + Duration::from_secs(1);
    let end = warm + window;
    let mut next_due = start;
    let mut published = 0u64;
    let mut at_window: Option<(u64, u64, u64)> = None;
    let mut attackers = Vec::new();
    let attack_stop = Arc::new(AtomicBool::new(false));
    while Instant::now() < end {
        if at_window.is_none() && Instant::now() >= warm {
            at_window = Some((
                published,
                lossless.load(Ordering::Relaxed),
                latest.load(Ordering::Relaxed),
            ));
            attackers = attack(&socket, a, &attack_stop);
        }
        let now = Instant::now();
        if next_due > now {
            std::thread::sleep(next_due - now);
        }
        next_due = (next_due + period).max(Instant::now() - period);
        let mut slot = match publisher.loan(Duration::from_millis(500)) {
            Ok(s) => s,
            Err(RingError::LosslessBlocked { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        slot.bytes_mut()?[..8].copy_from_slice(&published.to_le_bytes());
        slot.publish(FrameMeta::pts(published as i64))?;
        published += 1;
    }
    let (p0, l0, t0) = at_window.unwrap_or_default();
    let secs = window.as_secs_f64();
    let mut rates = Rates {
        producer: (published - p0) as f64 / secs,
        lossless: (lossless.load(Ordering::Relaxed) - l0) as f64 / secs,
        latest: (latest.load(Ordering::Relaxed) - t0) as f64 / secs,
        evictions: publisher.stats().evictions,
        refused: 0,
    };
    attack_stop.store(true, Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    publisher.close()?;
    for t in attackers {
        rates.refused += t.join().map_err(|_| "an attacker thread panicked")??;
    }
    for t in readers {
        t.join().map_err(|_| "a reader thread panicked")??;
    }
    Ok(rates)
}

fn main() -> R<()> {
    let args = output::args();
    let usage = "lossless_attack bench: a 30 fps lossless producer's and its honest readers' rates with no attack, \
                 under N lossless stallers at once and under a reconnecting staller (host backend)\n\
                 options: --window-s S (30) --rounds N (3) --stallers N (8) --connections N (3) --out FILE";
    if output::help(&args, usage) {
        return Ok(());
    }
    let num = |flag: &str, default: u64| -> R<u64> {
        Ok(match output::value_of(&args, flag) {
            Some(v) => v.parse()?,
            None => default,
        })
    };
    let window = Duration::from_secs(num("--window-s", 30)?);
    let rounds = num("--rounds", 3)?.max(1) as usize;
    let stallers = num("--stallers", 8)? as usize;
    let connections = num("--connections", 3)? as usize;
    let dir = std::env::temp_dir().join(format!("vramring-lossless-attack-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let scenarios = [
        Attack::None,
        Attack::AtOnce(stallers),
        Attack::Reconnecting(connections, true),
        Attack::Reconnecting(connections, false),
    ];
    let mut runs: Vec<Vec<Rates>> = vec![Vec::new(); scenarios.len()];
    let mut jsonl = String::new();
    let mut k = 0;
    for round in 0..rounds {
        for (s, &a) in scenarios.iter().enumerate() {
            let r = scenario(&dir, k, a, window)?;
            k += 1;
            eprintln!("round {round}: {}: {r:?}", a.name());
            jsonl += &format!(
                "{{\"round\":{round},\"scenario\":\"{}\",\"window_s\":{},\"producer_fps\":{},\"lossless_fps\":{},\"latest_fps\":{},\"evictions\":{},\"refused\":{}}}\n",
                a.name(),
                window.as_secs(),
                output::json_num(r.producer),
                output::json_num(r.lossless),
                output::json_num(r.latest),
                r.evictions,
                r.refused
            );
            runs[s].push(r);
        }
    }
    let med = |rs: &[Rates], f: fn(&Rates) -> f64| -> f64 {
        let mut v: Vec<f64> = rs.iter().map(f).collect();
        median(&mut v)
    };
    let base = [
        med(&runs[0], |r| r.producer),
        med(&runs[0], |r| r.lossless),
        med(&runs[0], |r| r.latest),
    ];
    let mut md = format!(
        "30 fps lossless producer, host backend, NV12 320×240, 8 slots, lease 1 s, back-off 10 s doubling; window {} s after 1 s of warm-up, median of {rounds} rounds (fps, and the ratio to no attack):\n\n",
        window.as_secs()
    );
    md += &output::table_header(
        "scenario | producer | honest lossless reader | honest latest reader | evictions (median)",
    );
    for (s, a) in scenarios.iter().enumerate() {
        let rates = [
            med(&runs[s], |r| r.producer),
            med(&runs[s], |r| r.lossless),
            med(&runs[s], |r| r.latest),
        ];
        let cells: Vec<String> = rates
            .iter()
            .zip(base)
            .map(|(r, b)| format!("{r:.1} ({:.0} %)", 100.0 * r / b))
            .collect();
        let evictions = med(&runs[s], |r| r.evictions as f64);
        md += &format!("| {} | {} | {evictions:.0} |\n", a.name(), cells.join(" | "));
    }
    print!("{md}");
    if let Some(out) = output::value_of(&args, "--out") {
        std::fs::write(out, &jsonl)?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
