//! `vramring record`: a packet ring to a file, exactly as published.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;
use vramring::packet::{PacketSubscriber, PacketSubscriberOptions};
use vramring::ClientOptions;
use vramring::Error;

use crate::error::{exit, ring_error, CliError, CliResult};
use crate::term;

/// Arguments of `record`.
#[derive(Debug, Args)]
pub struct RecordArgs {
    /// The packet ring's socket.
    pub socket: PathBuf,
    /// File to write (Annex-B for an H.264/H.265 ring).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Stop after this many seconds (0: until the publisher is gone, or Ctrl-C).
    #[arg(long, default_value_t = 0.0)]
    pub seconds: f64,
    /// Stop after this many packets (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub max_packets: u64,
    /// Ask to be lossless: the publisher waits for this recorder (bounded
    /// by its write timeout, then evicts it), so no packet is lost. Off by
    /// default: an ordinary subscriber never slows the publisher.
    #[arg(long)]
    pub lossless: bool,
    /// Write the ring's codec parameters (SPS/PPS) before the first packet,
    /// for publishers that send them out of band only.
    #[arg(long)]
    pub with_params: bool,
    /// Give up when no packet comes for this long, in ms.
    #[arg(long, default_value_t = 10_000)]
    pub idle_ms: u64,
    /// How long the publisher may take to answer, in ms.
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `vramring record`.
pub fn run(a: &RecordArgs) -> CliResult {
    term::install_stop_handler();
    let opts = PacketSubscriberOptions::new()
        .lossless(a.lossless)
        .name(format!("{}:record", crate::CLI_NAME))
        .connect_timeout(Duration::from_millis(a.timeout_ms));
    let mut sub = PacketSubscriber::connect(&a.socket, opts).map_err(|e| ring_error(&a.socket, &e))?;
    let file = std::fs::File::create(&a.output)
        .map_err(|e| CliError::failure(format!("cannot create {}: {e}", a.output.display())))?;
    let mut out = std::io::BufWriter::new(file);
    let write_err = |e: std::io::Error| CliError::failure(format!("writing {}: {e}", a.output.display()));
    let start = Instant::now();
    let deadline = (a.seconds > 0.0).then(|| start + Duration::from_secs_f64(a.seconds));
    let idle = Duration::from_millis(a.idle_ms);
    let mut last_packet = Instant::now();
    let mut buf = Vec::new();
    let (mut packets, mut bytes, mut first_seq, mut last_seq, mut lost_events) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut params_bytes = 0usize;
    let end = loop {
        if term::stop_requested() {
            break "interrupted";
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break "seconds";
        }
        if a.max_packets != 0 && packets >= a.max_packets {
            break "max_packets";
        }
        // Short waits, so Ctrl-C and --seconds are honoured promptly.
        let mut slice = Duration::from_millis(100);
        if let Some(d) = deadline {
            slice = slice.min(
                d.saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1)),
            );
        }
        match sub.next_copy(&mut buf, slice) {
            Ok(p) => {
                if packets == 0 {
                    first_seq = p.seq;
                    if a.with_params {
                        let mut params = Vec::new();
                        sub.codec_params(&mut params).map_err(|e| ring_error(&a.socket, &e))?;
                        out.write_all(&params).map_err(write_err)?;
                        params_bytes = params.len();
                    }
                }
                out.write_all(&buf).map_err(write_err)?;
                packets += 1;
                bytes += buf.len() as u64;
                last_seq = p.seq;
                last_packet = Instant::now();
            }
            Err(Error::PacketOverrun { .. }) => lost_events += 1,
            Err(Error::ProducerGone { .. }) => break "producer_gone",
            Err(Error::Timeout(..)) => {
                if last_packet.elapsed() >= idle {
                    break "idle";
                }
            }
            Err(e) => {
                let _ = out.flush();
                return Err(ring_error(&a.socket, &e));
            }
        }
    };
    out.flush().map_err(write_err)?;
    let st = sub.stats();
    let lost = st.skipped;
    let overruns = st.overruns.max(lost_events);
    let seconds = start.elapsed().as_secs_f64();
    if a.json {
        crate::emit(
            &json!({
                "path": a.output.display().to_string(),
                "packets": packets,
                "bytes": bytes,
                "first_seq": first_seq,
                "last_seq": last_seq,
                "params_bytes": params_bytes,
                "skipped": lost,
                "overruns": overruns,
                "lossless": a.lossless,
                "seconds": seconds,
                "end": end,
            })
            .to_string(),
        );
    } else {
        crate::emit(&format!(
            "recorded {packets} packets ({bytes} bytes, seq {first_seq}..{last_seq}) to {} in {seconds:.1} s; \
             {lost} skipped, {overruns} overruns; ended: {end}",
            a.output.display()
        ));
    }
    if overruns > 0 {
        eprintln!(
            "vramring: {lost} packets were lost to {overruns} overruns (the recorder fell a whole ring behind); \
             the file resumes at a keyframe after each gap; --lossless makes the publisher wait instead"
        );
        return Ok(exit::INCOMPLETE);
    }
    if packets == 0 && end == "idle" {
        return Err(CliError {
            code: exit::TIMEOUT,
            msg: format!("no packet from {} within {} ms", a.socket.display(), a.idle_ms),
        });
    }
    Ok(exit::OK)
}
