//! What a read hands out: a `Frame` (the subscriber's own proven copy, or
//! its push buffer) and a `Borrow` (the slot in place, checked on release).

use super::*;

/// A frame copied into the subscriber's own buffer. Valid until the next
/// call on the subscriber.
pub struct Frame<'s> {
    pub(super) sub: &'s Subscriber,
    pub(super) snap: SlotSnapshot,
    pub(super) skipped: u64,
    /// The push buffer holding the frame, or `None` when it was pulled into
    /// the subscriber's copy buffer.
    pub(super) push: Option<usize>,
}

impl std::fmt::Debug for Frame<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frame")
            .field("seq", &self.snap.seq)
            .field("pts", &self.snap.pts)
            .finish()
    }
}

impl Frame<'_> {
    /// The frame's seq.
    pub fn seq(&self) -> u64 {
        self.snap.seq
    }
    /// Presentation timestamp.
    pub fn pts(&self) -> i64 {
        self.snap.pts
    }
    /// Flags.
    pub fn flags(&self) -> u32 {
        self.snap.flags
    }
    /// `CLOCK_MONOTONIC` ns when the publisher committed the frame.
    pub fn commit_ns(&self) -> u64 {
        self.snap.commit_ns
    }
    /// Frames skipped between the previous delivered frame and this one.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }
    /// User metadata.
    pub fn user(&self) -> Vec<u8> {
        self.snap.user_bytes()
    }
    /// Format and plane layout; planes sit at the same offsets in the copy.
    pub fn geometry(&self) -> &Geometry {
        &self.sub.info.geometry
    }
    /// The ring's description (backend, device, geometry) of the publisher
    /// instance this frame came from.
    pub fn info(&self) -> &RingInfo {
        &self.sub.info
    }
    /// The copy, when it is host memory.
    pub fn host_bytes(&self) -> Option<&[u8]> {
        match self.push {
            Some(k) => self.sub.pool.push_host(k, self.len() as usize),
            None => self.sub.pool.dest_host(),
        }
    }
    /// The copy as device memory in the subscriber's own context, when the
    /// ring is a CUDA ring (`None` for host memory: see
    /// [`Frame::host_bytes`]).
    pub fn device(&self) -> Option<DeviceView<'_>> {
        let addr = match self.push {
            Some(k) => self.sub.pool.push_addr(k),
            None => self.sub.pool.dest_addr(),
        };
        (self.sub.backend() == BackendKind::Cuda).then(|| DeviceView::new(addr, self.len()))
    }
    /// Copies the frame (`len()` bytes, planes at the offsets of
    /// [`Frame::geometry`]) into host memory `dst`, whatever the backend:
    /// a `memcpy` for a host ring, a synchronous device-to-host copy in the
    /// subscriber's own CUDA context for a CUDA ring. It reads the
    /// subscriber's own copy of the frame (or its push buffer), never the
    /// ring, so the bytes are the whole frame [`Subscriber::next`] proved.
    ///
    /// # Errors
    /// [`Error::TooLarge`] when `dst` is shorter than the frame; backend
    /// errors ([`Error::Driver`]).
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use vramring::{Subscriber, SubscriberOptions};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut sub = Subscriber::connect("/run/vramring/cam0.sock", SubscriberOptions::default())?;
    /// let frame = sub.next(Duration::from_secs(1))?;
    /// let mut pixels = vec![0u8; frame.len() as usize];
    /// frame.copy_to_host(&mut pixels)?; // host or CUDA ring alike
    /// # Ok(()) }
    /// ```
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        let len = usize::try_from(self.len()).map_err(|_| Error::TooLarge {
            len: usize::MAX,
            max: dst.len(),
        })?;
        if dst.len() < len {
            return Err(Error::TooLarge { len, max: dst.len() });
        }
        let buf = match self.push {
            Some(k) => OwnBuffer::Push(k),
            None => OwnBuffer::Dest,
        };
        self.sub.pool.read_own(buf, &mut dst[..len])
    }
    /// Keeps this pushed frame past the next read, without a copy: the
    /// returned [`FrameHold`] reads the same bytes until it drops, however
    /// many frames the subscriber reads meanwhile, and even after the
    /// subscriber closed. For a push subscriber that reads a queue
    /// ([`Mode::Sequential`] or lossless); `None` for a pulled frame or a
    /// latest push reader's (whose three buffers cannot spare one).
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use vramring::{Delivery, Mode, Subscriber, SubscriberOptions};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let opts = SubscriberOptions::default().mode(Mode::Sequential).delivery(Delivery::Push);
    /// let mut sub = Subscriber::connect("/run/vramring/cam0.sock", opts)?;
    /// let kept = sub.next(Duration::from_secs(1))?.hold().expect("a queued push frame");
    /// let newer = sub.next(Duration::from_secs(1))?; // `kept` is still whole
    /// assert!(newer.seq() > kept.seq());
    /// # Ok(()) }
    /// ```
    pub fn hold(&self) -> Option<FrameHold> {
        let k = self.push?;
        if !self.sub.push_queued() {
            return None;
        }
        let backend = self.sub.backend();
        let addr = match backend {
            // Checked like `host_bytes`: the buffer has the frame's bytes.
            BackendKind::Host => self.host_bytes().map_or(0, |b| b.as_ptr() as u64),
            BackendKind::Cuda => self.sub.pool.push_addr(k),
        };
        let k = k % crate::layout::PUSH_MAX_BUFFERS;
        Some(FrameHold {
            holds: self.sub.holds.keep(k, self.snap.seq),
            k,
            seq: self.snap.seq,
            pts: self.snap.pts,
            addr,
            len: self.len(),
            backend,
        })
    }
    /// Whether the frame arrived by push delivery.
    pub fn pushed(&self) -> bool {
        self.push.is_some()
    }
    /// Bytes of the copy.
    pub fn len(&self) -> u64 {
        self.sub.info.geometry.frame_bytes
    }
    /// Whether the frame is empty (never: frames have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A frame read in place (zero copy). Call [`Borrow::release`] to learn
/// whether it stayed intact while you read it.
///
/// A pull subscriber reads the ring's slot; a push subscriber reads its
/// newest pushed buffer without holding it (the buffer it holds, if any,
/// stays held), so the publisher may rewrite it meanwhile, which `release`
/// then reports.
pub struct Borrow<'s> {
    pub(super) sub: &'s mut Subscriber,
    pub(super) snap: SlotSnapshot,
    pub(super) skipped: u64,
    pub(super) released: bool,
    /// The push buffer read in place, or `None` for the ring's slot.
    pub(super) push: Option<usize>,
}

impl std::fmt::Debug for Borrow<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Borrow").field("seq", &self.snap.seq).finish()
    }
}

impl Borrow<'_> {
    /// The frame's seq.
    pub fn seq(&self) -> u64 {
        self.snap.seq
    }
    /// Presentation timestamp.
    pub fn pts(&self) -> i64 {
        self.snap.pts
    }
    /// `CLOCK_MONOTONIC` ns of the commit.
    pub fn commit_ns(&self) -> u64 {
        self.snap.commit_ns
    }
    /// Flags.
    pub fn flags(&self) -> u32 {
        self.snap.flags
    }
    /// Frames skipped between the previous delivered frame and this one.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }
    /// User metadata (as [`Frame::user`]).
    pub fn user(&self) -> Vec<u8> {
        self.snap.user_bytes()
    }
    /// Format and plane layout of the slot.
    pub fn geometry(&self) -> &Geometry {
        &self.sub.info.geometry
    }
    /// The ring's description (backend, device, geometry) of the publisher
    /// instance this frame came from.
    pub fn info(&self) -> &RingInfo {
        &self.sub.info
    }
    fn addr(&self) -> u64 {
        match self.push {
            Some(k) => self.sub.pool.push_addr(k),
            None => self.sub.slot_addr(self.snap.seq),
        }
    }
    /// The slot in this process's mapping (for a push subscriber, the push
    /// buffer holding the frame) as device memory, when the ring is a CUDA
    /// ring. The publisher may overwrite it while it is read:
    /// [`Borrow::release`] says whether it did.
    pub fn device(&self) -> Option<DeviceView<'_>> {
        (self.sub.backend() == BackendKind::Cuda).then(|| DeviceView::new(self.addr(), self.len()))
    }
    /// The slot (or push buffer) in this process's mapping, when the ring is
    /// a host ring: shared memory the publisher may overwrite while it is
    /// read, so no `&[u8]` is made over it. Read it with volatile or
    /// byte-wise copies (as [`Borrow::copy_to`] does), then
    /// [`Borrow::release`] says whether it was overwritten.
    pub fn host_ptr(&self) -> Option<*const u8> {
        (self.sub.backend() == BackendKind::Host).then(|| self.addr() as *const u8)
    }
    /// Whether the frame is read from a push buffer.
    pub fn pushed(&self) -> bool {
        self.push.is_some()
    }
    /// Bytes of the frame.
    pub fn len(&self) -> u64 {
        self.sub.info.geometry.frame_bytes
    }
    /// Whether the frame is empty (never).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies the slot's bytes into `dst` (host backend). The copy may be
    /// torn if the producer overwrote the slot; [`Borrow::release`] says.
    ///
    /// # Errors
    /// [`Error::WrongBackend`] on a GPU ring; [`Error::TooLarge`] if `dst`
    /// is shorter than the frame.
    pub fn copy_to(&self, dst: &mut [u8]) -> Result<()> {
        if self.sub.pool.kind() != BackendKind::Host {
            return Err(Error::WrongBackend {
                what: "CPU reads of a borrowed slot",
                backend: self.sub.pool.kind().name(),
            });
        }
        let len = self.len() as usize;
        if dst.len() < len {
            return Err(Error::TooLarge { len, max: dst.len() });
        }
        // SAFETY: the slot lies inside the mapped pool (validated geometry:
        // slot_count * slot_stride <= pool_bytes == mapped bytes), or push
        // buffer `k < push_count` inside our push mapping (each buffer
        // holds frame_bytes rounded up); `dst` holds `len` bytes and is
        // private memory, so no overlap. Bytes may change under the copy;
        // `release` detects that.
        unsafe { std::ptr::copy_nonoverlapping(self.addr() as *const u8, dst.as_mut_ptr(), len) };
        Ok(())
    }
    /// Ends the borrow. `Ok(())` when the frame stayed intact the whole time.
    ///
    /// # Errors
    /// [`Error::Overrun`] when the producer began overwriting the slot.
    pub fn release(mut self) -> Result<()> {
        self.released = true;
        self.sub.finish_borrow(&self.snap, self.push, self.skipped)
    }
}

impl Drop for Borrow<'_> {
    fn drop(&mut self) {
        if !self.released {
            let _ = self.sub.finish_borrow(&self.snap, self.push, self.skipped);
        }
    }
}
