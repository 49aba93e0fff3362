//! The real inputs of a camera: an Annex-B file played at a frame rate
//! (looped, as a camera stand-in) and a packet ring (`vramring::packet`).
//! Neither needs a GPU; the supervision tests use both.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vramring::packet::{annexb, PacketSubscriber, PacketSubscriberOptions, PACKET_DISCONTINUITY};
use vramring::{ClientOptions, Error};

use super::config::CodecName;
use super::supervisor::{InputError, Read, Source, Unit};

/// How long one read waits for a packet before it says [`Read::Idle`].
pub const POLL: Duration = Duration::from_millis(100);

/// An Annex-B file split into access units, handed out at `fps`.
pub struct FileSource {
    units: Vec<(Vec<u8>, bool)>,
    next: usize,
    looped: bool,
    period: Option<Duration>,
    due: Instant,
    /// The pass just ended: the next read says so once.
    pass_ended: bool,
}

impl FileSource {
    /// Reads and splits the file.
    ///
    /// # Errors
    /// [`InputError::Gone`] when it cannot be read or holds no access unit
    /// with a keyframe.
    pub fn open(path: &Path, codec: CodecName, looped: bool, fps: f64) -> Result<FileSource, InputError> {
        let stream =
            std::fs::read(path).map_err(|e| InputError::Gone(format!("cannot read {}: {e}", path.display())))?;
        let units: Vec<(Vec<u8>, bool)> = match codec {
            CodecName::H264 => annexb::access_units(&stream)
                .into_iter()
                .map(|au| (au.bytes.to_vec(), au.key))
                .collect(),
            CodecName::Hevc => hevc_access_units(&stream),
        };
        if !units.iter().any(|u| u.1) {
            return Err(InputError::Gone(format!(
                "{} holds no {} keyframe in Annex-B form",
                path.display(),
                codec.name()
            )));
        }
        Ok(FileSource {
            units,
            next: 0,
            looped,
            period: (fps > 0.0).then(|| Duration::from_secs_f64(1.0 / fps)),
            due: Instant::now(),
            pass_ended: false,
        })
    }
}

impl Source for FileSource {
    fn read(&mut self, buf: &mut Vec<u8>) -> Result<Read, InputError> {
        if self.pass_ended {
            self.pass_ended = false;
            return Ok(Read::EndOfStream);
        }
        if self.next == self.units.len() {
            if !self.looped {
                return Ok(Read::Finished);
            }
            self.next = 0;
        }
        if let Some(p) = self.period {
            let now = Instant::now();
            if self.due > now {
                let wait = self.due - now;
                if wait > POLL {
                    std::thread::sleep(POLL);
                    return Ok(Read::Paced);
                }
                std::thread::sleep(wait);
            } else if now - self.due > p * 8 {
                // Far behind (the decoder was held up): pace from now
                // rather than burst.
                self.due = now;
            }
            self.due += p;
        }
        let k = self.next;
        let (bytes, key) = &self.units[k];
        buf.clear();
        buf.extend_from_slice(bytes);
        self.next += 1;
        if self.next == self.units.len() && self.looped {
            self.pass_ended = true;
        }
        Ok(Read::Unit(Unit {
            len: bytes.len(),
            pts: k as i64,
            key: *key,
            discontinuity: false,
        }))
    }
}

/// Splits an H.265 Annex-B stream into access units (H.265 §7.4.2.4.4): a
/// new one starts, once the current one holds a VCL unit, at a VPS, SPS,
/// PPS, AUD, prefix SEI or reserved 41–44/48–55 unit, or at a slice whose
/// `first_slice_segment_in_pic_flag` is set. Keyframes hold an IRAP slice
/// (types 16–23).
pub fn hevc_access_units(stream: &[u8]) -> Vec<(Vec<u8>, bool)> {
    let mut aus = Vec::new();
    let mut cur = 0usize;
    let (mut has_vcl, mut key) = (false, false);
    for (start, end) in annexb::nal_units(stream) {
        let Some(p) = annexb::nal_payload(&stream[start..end]) else {
            continue;
        };
        if p.len() < 2 {
            continue;
        }
        let t = (p[0] >> 1) & 0x3f;
        let vcl = t < 32;
        let first_slice = vcl && p.len() >= 3 && p[2] & 0x80 != 0;
        let new_au = has_vcl && (matches!(t, 32..=35 | 39 | 41..=44 | 48..=55) || first_slice);
        if new_au && start > cur {
            aus.push((stream[cur..start].to_vec(), key));
            cur = start;
            has_vcl = false;
            key = false;
        }
        if vcl {
            has_vcl = true;
            key |= (16..=23).contains(&t);
        }
    }
    if cur < stream.len() {
        aus.push((stream[cur..].to_vec(), key));
    }
    aus
}

/// A packet ring's reader. After it joins (at the ring's newest keyframe)
/// and after an overrun, the ring's codec parameters go in front of the
/// next keyframe, for cameras that do not repeat them.
pub struct PacketSource {
    socket: PathBuf,
    sub: PacketSubscriber,
    packet: Vec<u8>,
    params: Vec<u8>,
    need_params: bool,
}

impl PacketSource {
    /// Connects as subscriber `name` (shown by `vramring top`).
    ///
    /// # Errors
    /// [`InputError::Gone`]: nothing serves the socket (yet).
    pub fn open(socket: &Path, name: &str) -> Result<PacketSource, InputError> {
        let mut opts = PacketSubscriberOptions::new().name(name.to_owned());
        opts.client.connect_timeout = Duration::from_secs(2);
        let sub = PacketSubscriber::connect(socket, opts)
            .map_err(|e| InputError::Gone(format!("cannot connect to {}: {e}", socket.display())))?;
        Ok(PacketSource {
            socket: socket.to_owned(),
            sub,
            packet: Vec::new(),
            params: Vec::new(),
            need_params: true,
        })
    }
}

impl Source for PacketSource {
    fn read(&mut self, buf: &mut Vec<u8>) -> Result<Read, InputError> {
        let p = match self.sub.next_copy(&mut self.packet, POLL) {
            Ok(p) => p,
            Err(Error::Timeout(..)) => return Ok(Read::Idle),
            Err(e @ Error::PacketOverrun { .. }) => {
                self.need_params = true;
                return Err(InputError::Resync(format!("the reader was overrun ({e})")));
            }
            Err(e) => return Err(InputError::Gone(format!("packet ring {}: {e}", self.socket.display()))),
        };
        let key = p.is_key();
        buf.clear();
        if self.need_params && key {
            self.sub
                .codec_params(&mut self.params)
                .map_err(|e| InputError::Gone(format!("packet ring {}: {e}", self.socket.display())))?;
            buf.extend_from_slice(&self.params);
            self.need_params = false;
        }
        buf.extend_from_slice(&self.packet[..p.len]);
        Ok(Read::Unit(Unit {
            len: buf.len(),
            pts: p.pts,
            key,
            discontinuity: p.flags & PACKET_DISCONTINUITY != 0 || p.skipped > 0,
        }))
    }
}
