//! `vramringsink`: publishes raw video on a vramring frame ring.
//!
//! Input is `video/x-raw` in system memory or in GStreamer's CUDA memory
//! (`memory:CUDAMemory`, offered first), in every format a ring holds
//! (`video::FORMATS`). Each buffer is copied plane by plane into a loaned
//! slot (honouring the buffer's strides and the slot's 512-byte pitches):
//! row by row on the host into a host ring, or with 2-D device copies into
//! a CUDA ring, committed in stream order (`SlotMut::publish_cuda`, no
//! host wait; `cuda.rs` says which stream and context). Each frame carries
//! the buffer's PTS as its pts and a trailer of stream facts in its user
//! bytes (`trailer.rs`). A caps change recreates the ring at the same path;
//! subscribers that reconnect follow.

use gst::glib;
use gst::prelude::*;

mod imp;

/// What the producer does when a slot it wants to reuse is still held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, glib::Enum, Default)]
#[repr(u32)]
#[enum_type(name = "GstVramringPolicy")]
pub enum PolicySetting {
    /// Never wait: slow subscribers lose frames (live video).
    #[default]
    #[enum_value(name = "Overwrite: never wait, slow subscribers lose frames", nick = "overwrite")]
    Overwrite,
    /// Wait for lossless subscribers, evicting one past its lease.
    #[enum_value(
        name = "Lossless: wait for lossless subscribers (bounded by their lease)",
        nick = "lossless"
    )]
    Lossless,
}

/// Which memory the ring lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, glib::Enum, Default)]
#[repr(u32)]
#[enum_type(name = "GstVramringBackend")]
pub enum BackendSetting {
    /// Host shared memory.
    #[enum_value(name = "Host shared memory", nick = "host")]
    Host,
    /// CUDA device memory: needs memory:CUDAMemory input.
    #[enum_value(name = "CUDA device memory (needs memory:CUDAMemory input)", nick = "cuda")]
    Cuda,
    /// The backend that fits the input: host memory for system memory,
    /// CUDA memory for memory:CUDAMemory.
    #[default]
    #[enum_value(
        name = "Auto: the backend that fits the input memory (host for system memory, cuda for memory:CUDAMemory)",
        nick = "auto"
    )]
    Auto,
}

/// Who may receive the slot pool (pull delivery).
#[derive(Debug, Clone, Copy, PartialEq, Eq, glib::Enum, Default)]
#[repr(u32)]
#[enum_type(name = "GstVramringPullAccess")]
pub enum PullAccessSetting {
    /// Every subscriber may pull.
    #[default]
    #[enum_value(name = "Anyone may pull", nick = "anyone")]
    Anyone,
    /// Only the uids in pull-uids may pull; the others must ask for push.
    #[enum_value(name = "Only the uids in pull-uids may pull", nick = "uids")]
    Uids,
    /// Push delivery only.
    #[enum_value(name = "Nobody pulls: push delivery only", nick = "nobody")]
    Nobody,
}

glib::wrapper! {
    pub struct VramringSink(ObjectSubclass<imp::VramringSink>) @extends gst_base::BaseSink, gst::Element, gst::Object;
}

pub fn register(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    gst::Element::register(
        Some(plugin),
        "vramringsink",
        gst::Rank::NONE,
        VramringSink::static_type(),
    )
}
