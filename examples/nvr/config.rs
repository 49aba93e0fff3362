//! The multi-camera decoder's config file: TOML, one `[[camera]]` table per
//! camera, read into [`Config`] and checked before anything is opened.
//!
//! ```toml
//! [decoder]
//! socket_dir = "/run/vramring"   # every ring is made here: `vramring top /run/vramring`
//! device = 0                     # CUDA device of every decoder (and of every ring in GPU memory)
//! memory = "cuda"                # where the frame rings are: "cuda" (GPU memory) or "host"
//!
//! [[camera]]
//! name = "front"                 # the ring is front.sock in socket_dir
//! input = { file = "/data/clip1080.h264", loop = true, fps = 25 }
//! ring = { slots = 8, policy = "overwrite", pull = "nobody", max_subscribers = 16 }
//!
//! [[camera]]
//! name = "yard"
//! codec = "hevc"
//! input = { packets = "yard.packets.sock" }   # a packet ring, in socket_dir
//! ```
//!
//! Relative paths: a file input is relative to the config file's directory;
//! a packet socket and an output socket are relative to `socket_dir`.
//! Unknown keys are errors (a misspelt `slots` must not silently become the
//! default). Every error is a [`ConfigError`], a sentence that names the
//! file, the camera and the key; a program exits with
//! [`ConfigError::EXIT_CODE`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Why a config file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the camera config {path}: {source}")]
    Read {
        /// The config file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// Not TOML, or a key of the wrong type or name (the message has the
    /// line and column).
    #[error("{path} is not a valid camera config: {message}")]
    Syntax {
        /// The config file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// Well-formed, but a value is out of range or two cameras clash.
    #[error("{path}: {message}")]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// Which camera and key, and what to do.
        message: String,
    },
}

impl ConfigError {
    /// The exit status of a program that refused its config: 2, as for a
    /// bad command line.
    pub const EXIT_CODE: i32 = 2;
}

/// A codec a camera's input carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CodecName {
    /// H.264 / AVC.
    #[serde(alias = "avc", alias = "h.264")]
    H264,
    /// H.265 / HEVC.
    #[serde(alias = "h265", alias = "h.265")]
    Hevc,
}

impl CodecName {
    /// The name as written in the config.
    pub fn name(self) -> &'static str {
        match self {
            CodecName::H264 => "h264",
            CodecName::Hevc => "hevc",
        }
    }
}

/// The ring's policy towards lossless subscribers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyName {
    /// Never wait: slow readers lose frames.
    Overwrite,
    /// Wait (up to `loan_timeout_ms`) for lossless readers.
    Lossless,
}

/// Where every camera's frame ring lives (`[decoder] memory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FrameMemory {
    /// GPU memory of the decoder's device: one device-to-device copy per
    /// frame, readers get CUDA frames.
    #[default]
    Cuda,
    /// Host shared memory: each decoded picture is copied device-to-host
    /// into the loaned slot, and readers that want it on the GPU upload it
    /// themselves (how a host-memory NVR such as Frigate moves frames).
    Host,
}

impl FrameMemory {
    /// The name as written in the config.
    pub fn name(self) -> &'static str {
        match self {
            FrameMemory::Cuda => "cuda",
            FrameMemory::Host => "host",
        }
    }
}

/// Who may pull from the ring's pool (the others get push delivery).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullSetting {
    /// The library's default: on a CUDA ring, the decoder's own uid.
    Auto,
    /// Every subscriber.
    Anyone,
    /// Nobody: push delivery only (the safe setting for untrusted readers).
    Nobody,
    /// These uids.
    Uids(Vec<u32>),
}

/// Where a camera's access units come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// An Annex-B file, played at `fps` (0: as fast as the decoder goes),
    /// again from the start when `looped`.
    File {
        /// The file, resolved against the config file's directory.
        path: PathBuf,
        /// Play it again at its end.
        looped: bool,
        /// Access units per second.
        fps: f64,
    },
    /// A packet ring (`vramring::packet`) served at this socket.
    Packets {
        /// The socket, resolved against `socket_dir`.
        socket: PathBuf,
    },
}

impl Input {
    /// For logs and status lines.
    pub fn describe(&self) -> String {
        match self {
            Input::File { path, looped, .. } => {
                format!("file {}{}", path.display(), if *looped { " (looped)" } else { "" })
            }
            Input::Packets { socket } => format!("packets {}", socket.display()),
        }
    }
}

/// A camera's frame ring.
#[derive(Debug, Clone, PartialEq)]
pub struct RingSettings {
    /// Slots in the ring.
    pub slots: u32,
    /// Overwrite or lossless.
    pub policy: PolicyName,
    /// Who may pull.
    pub pull: PullSetting,
    /// Subscriber table entries.
    pub max_subscribers: u32,
    /// The socket file's mode.
    pub socket_mode: u32,
    /// How long a loan may wait for lossless readers before the frame is
    /// dropped (it is counted, and the camera goes on).
    pub loan_timeout: Duration,
}

/// One camera, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct CameraConfig {
    /// Unique; names the ring in logs and status lines.
    pub name: String,
    /// The codec of its input.
    pub codec: CodecName,
    /// Where its access units come from.
    pub input: Input,
    /// The frame ring's socket.
    pub output: PathBuf,
    /// The frame ring's settings.
    pub ring: RingSettings,
}

/// The decoder process's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The directory of every ring; `vramring top` on it lists them all.
    pub socket_dir: PathBuf,
    /// CUDA device ordinal of every decoder (and ring, in GPU memory).
    pub device: u32,
    /// Where the frame rings live.
    pub memory: FrameMemory,
    /// Status line period; 0: only at the end.
    pub report: Duration,
    /// A packet input with nothing for this long is reported stalled.
    pub stall: Duration,
    /// First wait before an input or decoder is tried again (doubles up to
    /// 16 times this).
    pub retry: Duration,
    /// NVDEC display delay in pictures.
    pub display_delay: u32,
    /// The cameras, in file order.
    pub cameras: Vec<CameraConfig>,
}

// ---------------------------------------------------------------------------
// The file as written
// ---------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    decoder: DecoderSection,
    #[serde(default)]
    camera: Vec<CameraSection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecoderSection {
    socket_dir: Option<PathBuf>,
    device: Option<u32>,
    memory: Option<FrameMemory>,
    report_ms: Option<u64>,
    stall_ms: Option<u64>,
    retry_ms: Option<u64>,
    display_delay: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CameraSection {
    name: String,
    input: InputSection,
    output: Option<PathBuf>,
    codec: Option<CodecName>,
    #[serde(default)]
    ring: RingSection,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputSection {
    file: Option<PathBuf>,
    packets: Option<PathBuf>,
    #[serde(rename = "loop")]
    looped: Option<bool>,
    fps: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RingSection {
    slots: Option<u32>,
    policy: Option<PolicyName>,
    pull: Option<PullSection>,
    max_subscribers: Option<u32>,
    socket_mode: Option<u32>,
    loan_timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PullSection {
    Name(String),
    Uids(Vec<u32>),
}

/// The run directory when the file names none: `$VRAMRING_DIR` (read by the
/// program and passed in), else `/run/vramring`, the directory `vramring ls`
/// and `top` look in by default.
pub const DEFAULT_SOCKET_DIR: &str = "/run/vramring";

/// Reads and checks the config at `path`. `default_dir` is the socket
/// directory when the file names none.
///
/// # Errors
/// [`ConfigError`]: the file cannot be read, is not TOML of this shape, or
/// has a value out of range or clashing with another camera's.
pub fn load(path: &Path, default_dir: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(&text, path, default_dir)
}

/// Checks `text` as the config file `path` (which only names it in errors
/// and anchors relative file inputs).
///
/// # Errors
/// As [`load`], less the read.
pub fn parse(text: &str, path: &Path, default_dir: &Path) -> Result<Config, ConfigError> {
    let file: FileConfig = toml::from_str(text).map_err(|e| ConfigError::Syntax {
        path: path.to_owned(),
        message: e.message().to_owned() + &span_note(text, e.span()),
    })?;
    let invalid = |message: String| ConfigError::Invalid {
        path: path.to_owned(),
        message,
    };
    let d = file.decoder;
    let socket_dir = d.socket_dir.unwrap_or_else(|| default_dir.to_owned());
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    if file.camera.is_empty() {
        return Err(invalid(
            "no camera: add at least one [[camera]] table with a name and an input".into(),
        ));
    }
    let retry_ms = d.retry_ms.unwrap_or(500);
    if retry_ms == 0 {
        return Err(invalid("[decoder] retry_ms must be at least 1".into()));
    }
    let mut cameras = Vec::with_capacity(file.camera.len());
    let mut names = BTreeSet::new();
    let mut outputs = BTreeSet::new();
    for c in file.camera {
        let cam = camera(c, &socket_dir, &base).map_err(invalid)?;
        if !names.insert(cam.name.clone()) {
            return Err(invalid(format!(
                "two cameras are named {:?}: names must be unique",
                cam.name
            )));
        }
        if !outputs.insert(cam.output.clone()) {
            return Err(invalid(format!(
                "camera {:?}: output {} is another camera's output too",
                cam.name,
                cam.output.display()
            )));
        }
        cameras.push(cam);
    }
    for cam in &cameras {
        if let Input::Packets { socket } = &cam.input {
            if outputs.contains(socket) {
                return Err(invalid(format!(
                    "camera {:?}: its packet input {} is a camera's output",
                    cam.name,
                    socket.display()
                )));
            }
        }
    }
    Ok(Config {
        socket_dir,
        device: d.device.unwrap_or(0),
        memory: d.memory.unwrap_or_default(),
        report: Duration::from_millis(d.report_ms.unwrap_or(1000)),
        stall: Duration::from_millis(d.stall_ms.unwrap_or(2000).max(1)),
        retry: Duration::from_millis(retry_ms),
        display_delay: d.display_delay.unwrap_or(1),
        cameras,
    })
}

/// ` (line L, column C: `the line`)` for a parse error's span.
fn span_note(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    let Some(span) = span else {
        return String::new();
    };
    let before = &text[..span.start.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    let text_of_line = text.lines().nth(line - 1).unwrap_or("").trim();
    let shown: String = text_of_line.chars().take(80).collect();
    format!(" (line {line}, column {column}: `{shown}`)")
}

fn camera(c: CameraSection, socket_dir: &Path, base: &Path) -> Result<CameraConfig, String> {
    let name = c.name;
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.'))
        || name.starts_with('.')
    {
        return Err(format!(
            "camera name {name:?} must be 1 to 64 letters, digits, '-', '_' or '.', not starting with '.'"
        ));
    }
    let at = |key: &str| format!("camera {name:?}: {key}");
    let input = match (c.input.file, c.input.packets) {
        (Some(file), None) => {
            let fps = c.input.fps.unwrap_or(30.0);
            if !fps.is_finite() || !(0.0..=1000.0).contains(&fps) {
                return Err(format!(
                    "{} = {fps} is out of range (0 to 1000; 0 plays as fast as the decoder goes)",
                    at("input.fps")
                ));
            }
            Input::File {
                path: base.join(file),
                looped: c.input.looped.unwrap_or(false),
                fps,
            }
        }
        (None, Some(socket)) => {
            if c.input.looped.is_some() || c.input.fps.is_some() {
                return Err(format!(
                    "{}: loop and fps are for a file input; a packet ring is paced by its publisher",
                    at("input")
                ));
            }
            Input::Packets {
                socket: socket_dir.join(socket),
            }
        }
        (Some(_), Some(_)) => {
            return Err(format!(
                "{}: give either file = \"...\" or packets = \"...\", not both",
                at("input")
            ))
        }
        (None, None) => {
            return Err(format!(
            "{}: give file = \"clip.h264\" (with loop = true for a camera stand-in) or packets = \"cam.packets.sock\"",
            at("input")
        ))
        }
    };
    let output = socket_dir.join(c.output.unwrap_or_else(|| PathBuf::from(format!("{name}.sock"))));
    let r = c.ring;
    let slots = r.slots.unwrap_or(8);
    if !(2..=256).contains(&slots) {
        return Err(format!("{} = {slots} is out of range (2 to 256)", at("ring.slots")));
    }
    let max_subscribers = r.max_subscribers.unwrap_or(16);
    if !(1..=1024).contains(&max_subscribers) {
        return Err(format!(
            "{} = {max_subscribers} is out of range (1 to 1024)",
            at("ring.max_subscribers")
        ));
    }
    let socket_mode = r.socket_mode.unwrap_or(0o660);
    if socket_mode > 0o777 {
        return Err(format!(
            "{} = {socket_mode:#o} is not a file mode (write it in octal: 0o660)",
            at("ring.socket_mode")
        ));
    }
    let pull = match r.pull {
        None => PullSetting::Auto,
        Some(PullSection::Uids(uids)) => PullSetting::Uids(uids),
        Some(PullSection::Name(n)) => match n.as_str() {
            "auto" => PullSetting::Auto,
            "anyone" => PullSetting::Anyone,
            "nobody" => PullSetting::Nobody,
            other => {
                return Err(format!(
                    "{} = {other:?}: use \"auto\", \"anyone\", \"nobody\" or a list of uids",
                    at("ring.pull")
                ))
            }
        },
    };
    Ok(CameraConfig {
        codec: c.codec.unwrap_or(CodecName::H264),
        input,
        output,
        ring: RingSettings {
            slots,
            policy: r.policy.unwrap_or(PolicyName::Overwrite),
            pull,
            max_subscribers,
            socket_mode,
            loan_timeout: Duration::from_millis(r.loan_timeout_ms.unwrap_or(1000)),
        },
        name,
    })
}
