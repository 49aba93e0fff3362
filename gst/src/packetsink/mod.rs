pub fn register(_p: &gst::Plugin) -> Result<(), gst::glib::BoolError> { Ok(()) }
