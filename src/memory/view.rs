//! The public face of CUDA memory and streams: a frame's, a borrow's or a
//! loaned slot's device bytes as a typed view that lives no longer than
//! what owns them, and the stream a producer enqueued its writes on.

use std::marker::PhantomData;

use cudarc::driver::sys::{CUdeviceptr, CUstream};

/// Read-only CUDA device memory of a frame or a borrow: `len` bytes at a
/// device address in this process's context for the ring's GPU (its
/// primary context), valid while the frame or borrow `'a` is.
///
/// Pass [`DeviceView::as_raw`] to the driver or to a kernel; a view never
/// outlives its owner, so the address it hands out is the owner's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceView<'a> {
    ptr: CUdeviceptr,
    len: u64,
    _owner: PhantomData<&'a ()>,
}

impl<'a> DeviceView<'a> {
    pub(crate) fn new(ptr: CUdeviceptr, len: u64) -> Self {
        DeviceView {
            ptr,
            len,
            _owner: PhantomData,
        }
    }

    /// The device address of the first byte.
    pub fn as_raw(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Bytes in the view.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the view holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `len` bytes from `offset` on, or `None` where they are not all
    /// in this view.
    pub fn range(&self, offset: u64, len: u64) -> Option<DeviceView<'a>> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then(|| DeviceView::new(self.ptr + offset, len))
    }
}

/// Writable CUDA device memory of a loaned slot: `len` bytes in the ring's
/// context, valid while the loan `'a` is. Write it on a [`Stream`] and
/// commit with [`SlotMut::publish_cuda`](crate::SlotMut::publish_cuda).
#[derive(Debug, PartialEq, Eq)]
pub struct DeviceViewMut<'a> {
    ptr: CUdeviceptr,
    len: u64,
    _owner: PhantomData<&'a mut ()>,
}

impl DeviceViewMut<'_> {
    pub(crate) fn new(ptr: CUdeviceptr, len: u64) -> Self {
        DeviceViewMut {
            ptr,
            len,
            _owner: PhantomData,
        }
    }

    /// The device address of the first byte.
    pub fn as_raw(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Bytes in the view.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the view holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `len` bytes from `offset` on, or `None` where they are not all
    /// in this view.
    pub fn range_mut(&mut self, offset: u64, len: u64) -> Option<DeviceViewMut<'_>> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then(|| DeviceViewMut::new(self.ptr + offset, len))
    }
}

/// A CUDA stream of the ring's context (its GPU's primary context), on
/// which a producer enqueued its writes to a slot, valid for `'a`.
///
/// Made from a `cudarc` stream (`Stream::from(&stream)`: cudarc's contexts
/// are the primary ones), from a raw `CUstream` ([`Stream::from_raw`]), or
/// [`Stream::LEGACY_DEFAULT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stream<'a> {
    raw: CUstream,
    _life: PhantomData<&'a ()>,
}

impl Stream<'static> {
    /// The context's legacy default stream (the null stream).
    pub const LEGACY_DEFAULT: Stream<'static> = Stream {
        raw: std::ptr::null_mut(),
        _life: PhantomData,
    };
}

impl Stream<'_> {
    /// A stream from its raw handle.
    ///
    /// # Safety
    /// `raw` is null or a stream that stays valid for the lifetime the
    /// caller gives the result.
    pub unsafe fn from_raw(raw: CUstream) -> Self {
        Stream {
            raw,
            _life: PhantomData,
        }
    }

    /// The raw handle.
    pub fn as_raw(&self) -> CUstream {
        self.raw
    }
}

impl<'a> From<&'a cudarc::driver::CudaStream> for Stream<'a> {
    fn from(s: &'a cudarc::driver::CudaStream) -> Self {
        Stream {
            raw: s.cu_stream(),
            _life: PhantomData,
        }
    }
}

// SAFETY: a stream handle may be used from any thread; the driver
// serialises work on it.
unsafe impl Send for Stream<'_> {}
// SAFETY: as above; `Stream` is a copyable handle with no interior state.
unsafe impl Sync for Stream<'_> {}

#[cfg(test)]
mod tests {
    use super::{DeviceView, DeviceViewMut, Stream};

    #[test]
    fn a_stream_hands_back_the_handle_it_was_made_from() {
        assert!(Stream::LEGACY_DEFAULT.as_raw().is_null());
        let raw = std::ptr::dangling_mut();
        // SAFETY: the handle is only compared, never given to the driver.
        let s = unsafe { Stream::from_raw(raw) };
        assert_eq!(s.as_raw(), raw);
    }

    #[test]
    fn a_range_outside_its_view_is_none() {
        let v = DeviceView::new(0x1000, 64);
        assert_eq!(v.range(16, 48).map(|r| (r.as_raw(), r.len())), Some((0x1010, 48)));
        assert!(v.range(16, 49).is_none());
        assert!(v.range(u64::MAX, 2).is_none());
        let mut m = DeviceViewMut::new(0x2000, 8);
        assert_eq!(m.range_mut(8, 0).map(|r| r.as_raw()), Some(0x2008));
        assert!(m.range_mut(4, 5).is_none());
    }
}
