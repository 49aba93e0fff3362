//! GStreamer elements for vramring (`gst-inspect-1.0 vramring`):
//!
//! * `vramringsink` publishes raw video (`video/x-raw` in system memory on
//!   a host ring, `video/x-raw(memory:CUDAMemory)` on a CUDA ring) on a
//!   vramring frame ring ([`vramring::Publisher`]);
//! * `vramringsrc` subscribes to a frame ring ([`vramring::Subscriber`]) and
//!   outputs raw video as a live source (system memory, or
//!   `memory:CUDAMemory` from a CUDA ring where downstream takes it);
//! * `vramringpacketsink` / `vramringpacketsrc` carry H.264 / H.265 access
//!   units (`stream-format=byte-stream, alignment=au`) on a packet ring
//!   ([`vramring::packet`]).
//!
//! Built as `libgstvramring.so` (load it with `GST_PLUGIN_PATH`) and as an
//! rlib whose [`plugin_register_static`] registers the elements in a
//! process that links it (the tests). The elements use only the public API
//! of the `vramring` crate. See `gst/README.md` for properties and
//! pipelines, and `docs/adr/0025-gstreamer-plugin.md` for the design.

mod clock;
mod codec;
mod cuda;
mod element;
mod packetsink;
mod packetsource;
mod serve;
mod sink;
mod source;
mod trailer;
mod video;

pub use trailer::{FrameTrailer, TRAILER_BYTES, TRAILER_MAGIC, TRAILER_VERSION};

fn plugin_init(plugin: &gst::Plugin) -> Result<(), gst::glib::BoolError> {
    sink::register(plugin)?;
    source::register(plugin)?;
    packetsink::register(plugin)?;
    packetsource::register(plugin)?;
    Ok(())
}

gst::plugin_define!(
    vramring,
    env!("CARGO_PKG_DESCRIPTION"),
    plugin_init,
    env!("CARGO_PKG_VERSION"),
    "MIT/X11",
    "gst-plugin-vramring",
    "gst-plugin-vramring",
    "the vramring workspace, gst/"
);
