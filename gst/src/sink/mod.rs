//! `vramringsink`: publishes raw video on a vramring frame ring.
//!
//! Input is `video/x-raw` in system memory, in every format a ring holds
//! (`video::FORMATS`). Each buffer is copied plane by plane, row by row,
//! into a loaned slot (honouring the buffer's strides and the slot's 512-byte
//! pitches) and published with the buffer's PTS as the frame's pts and a
//! trailer of stream facts in its user bytes (`trailer.rs`). A caps change
//! recreates the ring at the same path; subscribers that reconnect follow.
//!
//! **Only system memory is implemented.** `memory:CUDAMemory` input (a
//! device-to-device copy into the loaned slot on the element's CUDA
//! stream, then `SlotMut::publish_cuda`) needs the gstreamer-cuda bindings
//! and a GPU; the element is shaped for it (the ring is made in `set_caps`,
//! where the caps' memory feature would choose a CUDA ring, and the copy is
//! one function per memory kind), but it is not built here.

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
    /// CUDA device memory: needs memory:CUDAMemory input, not implemented.
    #[enum_value(
        name = "CUDA device memory (needs memory:CUDAMemory input: not implemented in this build)",
        nick = "cuda"
    )]
    Cuda,
    /// The backend that fits the input: host memory for system memory.
    #[default]
    #[enum_value(
        name = "Auto: the backend that fits the input memory (host for system memory)",
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
