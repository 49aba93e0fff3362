//! `vramring ls` and `vramring inspect`.

use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde_json::{json, Value};
use vramring::inspect::{InspectOptions, Inspector, RingDetail, RingStatus};

use crate::error::{classify, describe, exit, ring_error, CliError, CliResult};
use crate::render;

/// Arguments of `ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    /// Directories to list (or socket paths); default $VRAMRING_DIR, else /run/vramring.
    pub dirs: Vec<PathBuf>,
    /// Print one JSON array of objects.
    #[arg(long)]
    pub json: bool,
    /// How long each publisher may take to answer, in ms.
    #[arg(long, default_value_t = 1000)]
    pub timeout_ms: u64,
}

/// Arguments of `inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The ring's socket.
    pub socket: PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// How long the publisher may take to answer, in ms.
    #[arg(long, default_value_t = 1000)]
    pub timeout_ms: u64,
}

/// Connects as an ordinary subscriber named `vramring-cli`.
pub fn connect(path: &Path, timeout: Duration) -> vramring::Result<Inspector> {
    Inspector::connect(
        path,
        InspectOptions {
            name: crate::CLI_NAME.into(),
            timeout,
        },
    )
}

/// The socket files of `dir` (or `dir` itself when it is a socket), sorted.
///
/// # Errors
/// Exit code 3 when `dir` does not exist, 4 when it cannot be read.
pub fn find_sockets(dir: &Path) -> Result<Vec<PathBuf>, CliError> {
    let io_err = |e: std::io::Error| {
        let code = match e.kind() {
            std::io::ErrorKind::NotFound => exit::NOT_FOUND,
            std::io::ErrorKind::PermissionDenied => exit::PERMISSION,
            _ => exit::FAILURE,
        };
        CliError {
            code,
            msg: format!("cannot list {}: {e}", dir.display()),
        }
    };
    let meta = std::fs::metadata(dir).map_err(io_err)?;
    if meta.file_type().is_socket() {
        return Ok(vec![dir.to_owned()]);
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        if entry.file_type().is_ok_and(|t| t.is_socket()) {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// What probing one socket gave.
pub enum Probe {
    /// A live ring.
    Ok(Box<RingStatus>),
    /// Why not.
    Failed(vramring::Error),
}

/// Connects, copies the status, disconnects.
pub fn probe(path: &Path, timeout: Duration) -> Probe {
    match connect(path, timeout).and_then(|mut i| i.status()) {
        Ok(st) => Probe::Ok(Box::new(st)),
        Err(e) => Probe::Failed(e),
    }
}

fn ls_json(path: &Path, p: &Probe) -> Value {
    match p {
        Probe::Ok(st) => Value::Object(render::summary_json(st)),
        Probe::Failed(e) => json!({
            "path": path.display().to_string(),
            "status": classify(e).name(),
            "error": describe(path, e),
        }),
    }
}

fn ls_row(path: &Path, p: &Probe) -> [String; 10] {
    let name = path.display().to_string();
    match p {
        Probe::Ok(st) => {
            let (format, size, slots, backend, device) = match &st.detail {
                RingDetail::Frames(f) => {
                    let g = &f.info.geometry();
                    (
                        g.format.name().to_string(),
                        format!("{}x{}", g.width, g.height),
                        f.info.slot_count().to_string(),
                        f.backend_name().to_string(),
                        f.gpu_uuid().unwrap_or_else(|| "-".into()),
                    )
                }
                RingDetail::Packets(pk) => (
                    pk.codec_name(),
                    render::bytes(pk.info.data_bytes),
                    pk.info.record_count.to_string(),
                    "host".into(),
                    "-".into(),
                ),
            };
            [
                name,
                st.kind().name().into(),
                st.producer.state.name().into(),
                format,
                size,
                slots,
                backend,
                st.subscriber_count().to_string(),
                render::rate(st.recent_rate_hz()),
                device,
            ]
        }
        Probe::Failed(e) => {
            let dash = || "-".to_string();
            [
                name,
                dash(),
                classify(e).name().into(),
                dash(),
                dash(),
                dash(),
                dash(),
                dash(),
                dash(),
                dash(),
            ]
        }
    }
}

/// `vramring ls`.
pub fn run_ls(a: &LsArgs) -> CliResult {
    let dirs = if a.dirs.is_empty() {
        vec![crate::default_dir()]
    } else {
        a.dirs.clone()
    };
    let mut sockets = Vec::new();
    for d in &dirs {
        sockets.extend(find_sockets(d)?);
    }
    let timeout = Duration::from_millis(a.timeout_ms);
    // One thread per socket: a frozen publisher costs one timeout, not one each.
    let probes: Vec<Probe> = std::thread::scope(|s| {
        let handles: Vec<_> = sockets.iter().map(|p| s.spawn(move || probe(p, timeout))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Probe::Failed(vramring::Error::Config("probe thread panicked".into())))
            })
            .collect()
    });
    for (p, r) in sockets.iter().zip(&probes) {
        if let Probe::Failed(e) = r {
            tracing::info!("{}", describe(p, e));
        }
    }
    if a.json {
        let arr: Vec<Value> = sockets.iter().zip(&probes).map(|(p, r)| ls_json(p, r)).collect();
        crate::emit(&Value::Array(arr).to_string());
        return Ok(exit::OK);
    }
    if sockets.is_empty() {
        let names: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        crate::emit(&format!("no ring sockets in {}", names.join(", ")));
        return Ok(exit::OK);
    }
    let head = [
        "SOCKET", "KIND", "STATE", "FORMAT", "SIZE", "SLOTS", "BACKEND", "SUBS", "RATE", "DEVICE",
    ]
    .map(String::from);
    let rows: Vec<[String; 10]> = std::iter::once(head)
        .chain(sockets.iter().zip(&probes).map(|(p, r)| ls_row(p, r)))
        .collect();
    let mut widths = [0usize; 10];
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    for r in &rows {
        let cells: Vec<String> = r
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (c, w))| if i == 9 { c.clone() } else { format!("{c:<w$}") })
            .collect();
        if !crate::emit(cells.join("  ").trim_end()) {
            break;
        }
    }
    Ok(exit::OK)
}

/// `vramring inspect`.
pub fn run_inspect(a: &InspectArgs) -> CliResult {
    let timeout = Duration::from_millis(a.timeout_ms);
    let st = connect(&a.socket, timeout)
        .and_then(|mut i| i.status())
        .map_err(|e| ring_error(&a.socket, &e))?;
    if a.json {
        crate::emit(&render::full_json(&st).to_string());
    } else {
        for line in render::full_text(&st) {
            if !crate::emit(&line) {
                break;
            }
        }
    }
    Ok(exit::OK)
}
