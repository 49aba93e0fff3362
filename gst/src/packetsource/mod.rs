//! `vramringpacketsrc`: a live source that subscribes to a vramring packet
//! ring and outputs its access units (`video/x-h264` or `video/x-h265`,
//! `stream-format=byte-stream, alignment=au`, from the ring's codec FourCC).
//!
//! The subscriber joins at the most recent keyframe (or waits for the
//! first); a reader that falls a whole ring behind resumes at the next
//! keyframe, and the packets it lost are posted as QoS and counted in
//! `stats`. With `insert-params` (the default) the first keyframe after a
//! join that carries no parameter sets gets the ring's codec parameters
//! prepended, so a decoder can start there. A publisher that goes away is
//! waited for (`timeout`), then end of stream.

use gst::glib;
use gst::prelude::*;

mod imp;

glib::wrapper! {
    pub struct VramringPacketSrc(ObjectSubclass<imp::VramringPacketSrc>) @extends gst_base::PushSrc, gst_base::BaseSrc, gst::Element, gst::Object;
}

pub fn register(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    gst::Element::register(
        Some(plugin),
        "vramringpacketsrc",
        gst::Rank::NONE,
        VramringPacketSrc::static_type(),
    )
}
