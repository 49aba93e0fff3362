//! `vramringsrc`: a live source that subscribes to a vramring frame ring
//! and outputs raw video: in system memory, or from a CUDA ring in
//! GStreamer's CUDA memory where downstream takes it (ADR 0027, "The
//! source side").
//!
//! Caps come from the ring's geometry (format, width, height) and, when
//! the publisher is `vramringsink`, the framerate and pixel aspect ratio of
//! its trailer. Each frame the subscriber receives (copied and proven whole
//! by the library) is copied plane by plane into a buffer of GStreamer's
//! default layout. A publisher that goes away is followed to the next one
//! at the same path (the library's reconnect); new caps are sent when the
//! geometry changed, and the first buffer after the gap is DISCONT. Frames
//! the subscriber never received (gaps in sequential mode, frames a latest
//! reader skipped) are posted as QoS messages and counted in `stats`.

use gst::glib;
use gst::prelude::*;

mod imp;
mod kept;

/// Which frames the subscriber reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, glib::Enum, Default)]
#[repr(u32)]
#[enum_type(name = "GstVramringMode")]
pub enum ModeSetting {
    /// The newest frame at each read (skipped frames are dropped).
    #[default]
    #[enum_value(name = "Latest: the newest frame at each read", nick = "latest")]
    Latest,
    /// Every frame in order (gaps counted when the publisher laps us).
    #[enum_value(name = "Sequential: every frame in order, gaps counted", nick = "sequential")]
    Sequential,
}

/// How frames reach the subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq, glib::Enum, Default)]
#[repr(u32)]
#[enum_type(name = "GstVramringDelivery")]
pub enum DeliverySetting {
    /// Pull where the publisher hands this peer its pool, push where it
    /// does not (one handshake).
    #[default]
    #[enum_value(
        name = "Auto: pull, or push where the publisher refuses this peer its pool",
        nick = "auto"
    )]
    Auto,
    /// Copy each frame out of the mapped slot pool.
    #[enum_value(name = "Pull: copy each frame out of the slot pool", nick = "pull")]
    Pull,
    /// The publisher copies each frame into buffers this subscriber owns
    /// (any mode).
    #[enum_value(name = "Push: the publisher copies frames into our buffers", nick = "push")]
    Push,
}

/// How output buffers are timestamped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, glib::Enum, Default)]
#[repr(u32)]
#[enum_type(name = "GstVramringTimestampMode")]
pub enum TimestampMode {
    /// The frame's presentation instant (the publishing sink's running
    /// time, or the commit time of a frame from another publisher) on this
    /// pipeline's clock, minus its base time.
    #[default]
    #[enum_value(
        name = "Clock: the publisher's presentation instant on this pipeline's running time",
        nick = "clock"
    )]
    Clock,
    /// The frame's pts as published, read as nanoseconds.
    #[enum_value(name = "Pts: the frame's pts as published, in nanoseconds", nick = "pts")]
    Pts,
}

glib::wrapper! {
    pub struct VramringSrc(ObjectSubclass<imp::VramringSrc>) @extends gst_base::PushSrc, gst_base::BaseSrc, gst::Element, gst::Object;
}

pub fn register(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    gst::Element::register(Some(plugin), "vramringsrc", gst::Rank::NONE, VramringSrc::static_type())
}
