//! `vramringpacketsink`: publishes H.264 / H.265 access units on a vramring
//! packet ring.
//!
//! Input is `video/x-h264` or `video/x-h265`, `stream-format=byte-stream,
//! alignment=au` (put `h264parse` / `h265parse` in front). Each buffer is
//! one packet: its PTS and DTS in nanoseconds (`-1`: none), keyframe when
//! the buffer has no DELTA_UNIT flag, discontinuity from DISCONT. The
//! parameter sets (SPS/PPS, and VPS for H.265) found in each keyframe
//! become the ring's codec parameters when they change, so a subscriber
//! that joins late can read them. The ring's codec is the FourCC `H264` or
//! `H265`; a caps change to the other codec recreates the ring.

use gst::glib;
use gst::prelude::*;

mod imp;

glib::wrapper! {
    pub struct VramringPacketSink(ObjectSubclass<imp::VramringPacketSink>) @extends gst_base::BaseSink, gst::Element, gst::Object;
}

pub fn register(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    gst::Element::register(
        Some(plugin),
        "vramringpacketsink",
        gst::Rank::NONE,
        VramringPacketSink::static_type(),
    )
}
