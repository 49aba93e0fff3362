//! What every element of the plugin declares the same way: its metadata
//! and its one always-present pad.

/// The element's metadata (long name, classification, description), with
/// the plugin's author.
pub(crate) fn metadata(long_name: &str, classification: &str, description: &str) -> gst::subclass::ElementMetadata {
    gst::subclass::ElementMetadata::new(long_name, classification, description, "vramring developers")
}

/// The element's one pad, always present: `name`, `direction`, `caps`.
pub(crate) fn one_pad(name: &str, direction: gst::PadDirection, caps: &gst::Caps) -> Vec<gst::PadTemplate> {
    vec![gst::PadTemplate::new(name, direction, gst::PadPresence::Always, caps).expect("a static pad template")]
}
