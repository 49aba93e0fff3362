//! `vramring top`: every ring of a directory, refreshed in place.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};
use vramring::inspect::{Inspector, RingDetail, RingStatus, SubscriberRow};

use crate::error::{classify, describe, exit, CliResult};
use crate::{render, term};

/// Arguments of `top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// Directory of ring sockets (or one socket); default $VRAMRING_DIR, else /run/vramring.
    pub dir: Option<PathBuf>,
    /// Refresh period, in ms.
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u64,
    /// Stop after this many refreshes (0: until q, Ctrl-C or a signal).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
    /// Print one JSON object per refresh (implies line output).
    #[arg(long)]
    pub json: bool,
    /// Print lines even on a terminal.
    #[arg(long)]
    pub lines: bool,
    /// How long each publisher may take to answer, in ms.
    #[arg(long, default_value_t = 1000)]
    pub timeout_ms: u64,
}

/// One ring being watched.
struct Watched {
    inspector: Option<Inspector>,
    prev: Option<(Instant, RingStatus)>,
    /// Why there is no inspector now.
    problem: Option<(&'static str, String)>,
}

/// Rates of one refresh: the ring's and each subscriber's, per second.
struct Sample {
    path: PathBuf,
    status: Option<RingStatus>,
    ring_rate: Option<f64>,
    sub_rates: BTreeMap<(u32, u32), f64>,
    problem: Option<(&'static str, String)>,
}

fn per_sec(now: u64, before: u64, dt: f64) -> f64 {
    now.saturating_sub(before) as f64 / dt
}

impl Watched {
    fn sample(&mut self, path: &Path, timeout: Duration) -> Sample {
        if self.inspector.is_none() {
            match crate::ls::connect(path, timeout) {
                Ok(i) => {
                    self.inspector = Some(i);
                    self.problem = None;
                    self.prev = None;
                }
                Err(e) => self.problem = Some((classify(&e).name(), describe(path, &e))),
            }
        }
        let mut s = Sample {
            path: path.to_owned(),
            status: None,
            ring_rate: None,
            sub_rates: BTreeMap::new(),
            problem: self.problem.clone(),
        };
        let Some(ins) = self.inspector.as_mut() else {
            return s;
        };
        match ins.status() {
            Ok(st) => {
                let now = Instant::now();
                if let Some((t0, prev)) = &self.prev {
                    let dt = (now - *t0).as_secs_f64().max(1e-3);
                    if prev.epoch == st.epoch {
                        s.ring_rate = Some(per_sec(st.producer.published, prev.producer.published, dt));
                        for r in &st.subscribers {
                            if let Some(p) = prev
                                .subscribers
                                .iter()
                                .find(|p| p.index == r.index && p.generation == r.generation)
                            {
                                s.sub_rates
                                    .insert((r.index, r.generation), per_sec(r.delivered, p.delivered, dt));
                            }
                        }
                    }
                } else {
                    s.ring_rate = st.recent_rate_hz();
                }
                self.prev = Some((now, st.clone()));
                s.status = Some(st);
            }
            Err(e) => {
                // The publisher went away: try again at the next refresh.
                self.inspector = None;
                self.prev = None;
                self.problem = Some((classify(&e).name(), describe(path, &e)));
                s.problem = self.problem.clone();
            }
        }
        s
    }
}

fn sub_rate(s: &Sample, r: &SubscriberRow) -> Option<f64> {
    s.sub_rates.get(&(r.index, r.generation)).copied()
}

fn sample_json(s: &Sample) -> Value {
    match &s.status {
        Some(st) => {
            let mut m = render::summary_json(st);
            m.insert("rate_hz".into(), json!(s.ring_rate.map(render::round1)));
            let subs: Vec<Value> = st
                .subscribers
                .iter()
                .filter(|r| !r.is_self)
                .map(|r| {
                    let mut v = render::row_json(st, r);
                    v["rate_hz"] = json!(sub_rate(s, r).map(render::round1));
                    v
                })
                .collect();
            m.insert("subscriber_table".into(), Value::Array(subs));
            Value::Object(m)
        }
        None => {
            let (status, error) = s.problem.clone().unwrap_or(("error", String::new()));
            json!({"path": s.path.display().to_string(), "status": status, "error": error})
        }
    }
}

fn ring_headline(s: &Sample) -> String {
    let name = s.path.display();
    let Some(st) = &s.status else {
        let (status, _) = s.problem.clone().unwrap_or(("error", String::new()));
        return format!("{name}  {status}");
    };
    let what = match &st.detail {
        RingDetail::Frames(f) => {
            let g = &f.info.geometry();
            format!(
                "frames {} {}x{} {} slots {}",
                g.format.name(),
                g.width,
                g.height,
                f.info.slot_count(),
                f.backend_name()
            )
        }
        RingDetail::Packets(p) => format!(
            "packets {} {} records, keyframe {}",
            p.codec_name(),
            p.info.record_count,
            p.keyframe_seq
        ),
    };
    format!(
        "{name}  {what}  {}  published {}  {} /s  subs {}  evictions {}",
        st.producer.state.name(),
        st.producer.published,
        render::rate(s.ring_rate),
        st.subscriber_count(),
        st.producer.evictions
    )
}

fn screen(dir: &Path, interval: Duration, samples: &[Sample]) -> String {
    let mut o = String::new();
    let _ = write!(
        o,
        "vramring top: {} ({} rings), every {} ms; q or Ctrl-C quits\r\n\r\n",
        dir.display(),
        samples.len(),
        interval.as_millis()
    );
    if samples.is_empty() {
        o += "no ring sockets\r\n";
    }
    for s in samples {
        o += &ring_headline(s);
        o += "\r\n";
        if let Some(st) = &s.status {
            let mut shown = st.clone();
            shown.subscribers.retain(|r| !r.is_self);
            let rates = |r: &SubscriberRow| sub_rate(s, r);
            for line in render::table_text(&shown, Some(&rates)) {
                o += "  ";
                o += &line;
                o += "\r\n";
            }
        }
        o += "\r\n";
    }
    o
}

fn lines(samples: &[Sample]) -> Vec<String> {
    let t = crate::unix_ms();
    let mut out = Vec::new();
    for s in samples {
        out.push(format!("{t} {}", ring_headline(s)));
        if let Some(st) = &s.status {
            for r in st.subscribers.iter().filter(|r| !r.is_self) {
                out.push(format!(
                    "{t}   sub {} {} {} rate {} delivered {} dropped {} overruns {} lag {}",
                    r.index,
                    r.name,
                    r.mode_name(),
                    render::rate(sub_rate(s, r)),
                    r.delivered,
                    r.dropped,
                    r.overruns,
                    render::opt(r.lag(st.newest_seq()))
                ));
            }
        }
    }
    out
}

/// `vramring top`.
pub fn run(a: &TopArgs) -> CliResult {
    let dir = a.dir.clone().unwrap_or_else(crate::default_dir);
    let timeout = Duration::from_millis(a.timeout_ms);
    let interval = Duration::from_millis(a.interval_ms.max(50));
    term::install_stop_handler();
    let raw = if a.json || a.lines || !term::interactive() {
        None
    } else {
        term::RawTerminal::enter().ok()
    };
    let mut watched: BTreeMap<PathBuf, Watched> = BTreeMap::new();
    let mut refreshes = 0u64;
    loop {
        let sockets = crate::ls::find_sockets(&dir)?;
        watched.retain(|p, _| sockets.contains(p));
        let samples: Vec<Sample> = sockets
            .iter()
            .map(|p| {
                watched
                    .entry(p.clone())
                    .or_insert_with(|| Watched {
                        inspector: None,
                        prev: None,
                        problem: None,
                    })
                    .sample(p, timeout)
            })
            .collect();
        let ok = if raw.is_some() {
            print!("\x1b[H\x1b[2J{}", screen(&dir, interval, &samples));
            std::io::Write::flush(&mut std::io::stdout()).is_ok()
        } else if a.json {
            let obj = json!({
                "time_ms": crate::unix_ms(),
                "dir": dir.display().to_string(),
                "rings": samples.iter().map(sample_json).collect::<Vec<_>>(),
            });
            crate::emit(&obj.to_string())
        } else {
            lines(&samples).iter().all(|l| crate::emit(l))
        };
        refreshes += 1;
        if !ok || term::stop_requested() || (a.count != 0 && refreshes >= a.count) {
            break;
        }
        let due = crate::after(interval);
        while Instant::now() < due && !term::stop_requested() {
            let left = due
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(100));
            match &raw {
                Some(t) if t.quit_key(left) => term::request_stop(),
                Some(_) => {}
                None => std::thread::sleep(left),
            }
        }
        if term::stop_requested() {
            break;
        }
    }
    drop(raw);
    Ok(exit::OK)
}
