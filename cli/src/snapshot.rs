//! `vramring snapshot`: frames through the normal subscriber path, as PNG.

use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;
use vramring::ClientOptions;
use vramring::{Error, Mode, Subscriber, SubscriberOptions};

use crate::convert::{self, Matrix, MatrixArg, RangeArg};
use crate::error::{exit, ring_error, CliError, CliResult};
use crate::term;

/// Arguments of `snapshot`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// The frame ring's socket.
    pub socket: PathBuf,
    /// PNG to write. `{n}` (frame number from 1) and `{seq}` are replaced;
    /// with --count above 1 and neither present, `-0001`, `-0002`, ... go
    /// before the extension.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Frames to grab.
    #[arg(long, default_value_t = 1)]
    pub count: u64,
    /// Milliseconds between grabs (0: the next new frame each time).
    #[arg(long, default_value_t = 0)]
    pub every: u64,
    /// YUV → RGB matrix (auto: BT.709 for 720 rows or more, else BT.601).
    #[arg(long, value_enum, default_value_t = MatrixArg::Auto)]
    pub matrix: MatrixArg,
    /// YUV range.
    #[arg(long, value_enum, default_value_t = RangeArg::Limited)]
    pub range: RangeArg,
    /// How long to wait for the publisher and for each frame, in ms.
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
    /// Print one JSON object per PNG written.
    #[arg(long)]
    pub json: bool,
}

/// The path of frame `n` (from 1) of `count`.
pub fn output_path(template: &Path, n: u64, count: u64, seq: u64) -> PathBuf {
    let t = template.to_string_lossy();
    if t.contains("{n}") || t.contains("{seq}") {
        return PathBuf::from(t.replace("{n}", &format!("{n:04}")).replace("{seq}", &seq.to_string()));
    }
    if count <= 1 {
        return template.to_owned();
    }
    let stem = template
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match template.extension() {
        Some(ext) => format!("{stem}-{n:04}.{}", ext.to_string_lossy()),
        None => format!("{stem}-{n:04}"),
    };
    template.with_file_name(name)
}

fn write_png(path: &Path, img: &convert::Image, text: &[(&str, String)]) -> Result<(), String> {
    let file = std::fs::File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    let mut enc = png::Encoder::new(BufWriter::new(file), img.width, img.height);
    enc.set_color(match img.channels {
        1 => png::ColorType::Grayscale,
        4 => png::ColorType::Rgba,
        _ => png::ColorType::Rgb,
    });
    enc.set_depth(png::BitDepth::Eight);
    for (k, v) in text {
        enc.add_text_chunk((*k).to_string(), v.clone())
            .map_err(|e| format!("PNG text chunk {k}: {e}"))?;
    }
    let mut w = enc
        .write_header()
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    w.write_image_data(&img.data)
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    w.finish().map_err(|e| format!("writing {}: {e}", path.display()))
}

/// `vramring snapshot`.
pub fn run(a: &SnapshotArgs) -> CliResult {
    term::install_stop_handler();
    let timeout = Duration::from_millis(a.timeout_ms);
    let mut opts = SubscriberOptions::default()
        .name(format!("{}:snapshot", crate::CLI_NAME))
        .mode(Mode::Latest);
    opts.client.connect_timeout = timeout;
    let mut sub = Subscriber::connect(&a.socket, opts).map_err(|e| ring_error(&a.socket, &e))?;
    let g = *sub.geometry();
    let matrix = Matrix::resolve(a.matrix, g.height);
    let mut host = vec![0u8; g.frame_bytes as usize];
    let start = Instant::now();
    for n in 1..=a.count.max(1) {
        if term::stop_requested() {
            break;
        }
        if a.every > 0 && n > 1 {
            let due = start + Duration::from_millis(a.every * (n - 1));
            while Instant::now() < due && !term::stop_requested() {
                std::thread::sleep(
                    due.saturating_duration_since(Instant::now())
                        .min(Duration::from_millis(50)),
                );
            }
        }
        let frame = sub.next(timeout).map_err(|e| match e {
            Error::Timeout(..) => CliError {
                code: exit::TIMEOUT,
                msg: format!(
                    "no frame from {} within {} ms (the publisher is not publishing)",
                    a.socket.display(),
                    a.timeout_ms
                ),
            },
            e => ring_error(&a.socket, &e),
        })?;
        // A host ring's copy is host memory already; a CUDA ring's is in
        // this process's own device buffer: one device-to-host copy.
        frame.copy_to_host(&mut host).map_err(|e| ring_error(&a.socket, &e))?;
        let (seq, pts) = (frame.seq(), frame.pts());
        let pushed = frame.pushed();
        let img = convert::to_image(&g, &host, matrix, a.range).map_err(CliError::failure)?;
        let path = output_path(&a.output, n, a.count, seq);
        let text = [
            ("vramring:socket", a.socket.display().to_string()),
            ("vramring:seq", seq.to_string()),
            ("vramring:pts", pts.to_string()),
            ("vramring:format", g.format.name().to_string()),
            (
                "vramring:matrix",
                if img.converted {
                    format!("{} {}", matrix.name(), a.range.name())
                } else {
                    "none".into()
                },
            ),
        ];
        write_png(&path, &img, &text).map_err(CliError::failure)?;
        let line = if a.json {
            json!({
                "path": path.display().to_string(),
                "seq": seq,
                "pts": pts,
                "format": g.format.name(),
                "width": g.width,
                "height": g.height,
                "backend": sub.backend().name(),
                "pushed": pushed,
                "matrix": img.converted.then(|| matrix.name()),
                "range": img.converted.then(|| a.range.name()),
            })
            .to_string()
        } else {
            let conv = if img.converted {
                format!(" → RGB ({} {} range)", matrix.name(), a.range.name())
            } else {
                String::new()
            };
            format!(
                "wrote {} (frame {seq}, pts {pts}, {} {}x{}{conv}, {} ring)",
                path.display(),
                g.format.name(),
                g.width,
                g.height,
                sub.backend().name()
            )
        };
        crate::emit(&line);
    }
    Ok(exit::OK)
}
