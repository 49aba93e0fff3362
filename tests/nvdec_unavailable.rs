//! Without `libnvcuvid` the decoder is a typed, actionable error, never a
//! panic: the library is pointed at a path that does not exist (the
//! `VRAMRING_NVCUVID` override), so this runs the same on CI and on a GPU
//! machine. One test per binary: the library is loaded once per process.

use vramring::nvdec::{available, Codec, Decoder, DecoderOptions};
use vramring::Error;

#[test]
fn a_missing_libnvcuvid_is_decoder_unavailable_naming_the_library() {
    std::env::set_var("VRAMRING_NVCUVID", "/nonexistent/libnvcuvid.so.1");
    assert!(!available(), "available() must be false without the library");
    match Decoder::new(DecoderOptions::new(Codec::H264)) {
        Err(Error::DecoderUnavailable(msg)) => {
            assert!(
                msg.contains("/nonexistent/libnvcuvid.so.1"),
                "message names the library: {msg}"
            );
            assert!(msg.contains("NVIDIA driver"), "message says where it comes from: {msg}");
        }
        Err(e) => panic!("expected DecoderUnavailable, got {e}"),
        Ok(_) => panic!("a decoder was made without its library"),
    }
}
